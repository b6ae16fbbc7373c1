"""``function``: your prompts and reward function as a task, without a subclass.

``--data FILE --eval-data FILE --reward MODULE:FUNCTION``: each response scored by ``fn(response, **row)``, returning
a number, ``(reward, correct)`` or a dict with ``"reward"`` (or ``"score"``) and other metrics. Chat prompts get the
policy's chat template (:func:`tokenbalance.run.examples.task_for`). One loader and check for our trainer, TRL and
verl; docs/tasks.md."""

from __future__ import annotations

import copy
import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from tokenbalance.checks import check_choice
from tokenbalance.tasks.base import BaseTask, ProgressFactory, ScoreError, ScoreResult, TaskExample
from tokenbalance.tasks.files import RowReader, read_rows
from tokenbalance.user_code import clip_text, first_line, load_function, normalized_spec, shown

FUNCTION_TASK = "function"
# data.template of the function task: how the prompt column becomes the prompt text
PROMPT_FORMATS: tuple[str, ...] = ("auto", "text", "chat")
# rows of each file the function is tried on (with an empty response) before any model work
CHECKED_ROWS = 4
CONTRACT = "a reward function returns a finite number, (number, correct) or a dict with 'reward' (docs/tasks.md)"

ChatRenderer = Callable[[list[dict[str, Any]]], str]


class RewardOutputError(ScoreError):
    """The reward function returned something that is not a reward; the message names the row, the function and the
    value."""


def normalized_reward_spec(spec: str, setting: str = "data.reward") -> str:
    """``spec`` checked, a ``FILE.py`` made absolute (:func:`tokenbalance.user_code.normalized_spec`)."""
    return normalized_spec(spec, setting)


def load_reward_function(reward: str | Callable[..., Any], setting: str = "data.reward") -> Callable[..., Any]:
    """The function named by ``"pkg.module:function"`` / ``"path/file.py:function"`` (a callable is returned as is):
    :func:`tokenbalance.user_code.load_function`, whose every failure is one ``ValueError`` line naming ``setting``,
    the module and the attribute."""
    return load_function(reward, setting)


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bools, numpy and 0-d torch scalars included)."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    if not isinstance(value, numbers.Real) and getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()
    return float(value) if isinstance(value, numbers.Real) else None


def _flag(value: Any) -> bool | None:
    number = _number(value)
    return None if number not in (0.0, 1.0) else number == 1.0


class RewardFunction:
    """A reward function ``fn(response, **row)`` with the check of what it returns.

    Args:
        reward: ``"pkg.module:function"``, ``"path/file.py:function"`` or the function itself.
        max_reward: the reward of a correct response (a returned ``correct`` must agree).
        prefix: how the caller's settings are named in messages: ``"data."``, ``"reward_kwargs."`` (verl), ``""``
            (TRL).

    Attributes:
        name: the spec, or the function's qualified name.
        required_columns: parameters without a default after the response (columns every row needs)."""

    def __init__(self, reward: str | Callable[..., Any], *, max_reward: float = 1.0, prefix: str = "data.") -> None:
        self.setting = f"{prefix}reward"
        self.max_reward_setting = f"{prefix}max_reward"
        self.function = load_reward_function(reward, self.setting)
        self.name = reward if isinstance(reward, str) else getattr(reward, "__qualname__", repr(reward))
        number = _number(max_reward)
        if number is None or not math.isfinite(number):
            raise ValueError(f"{self.max_reward_setting}: must be a finite number, got {shown(max_reward)}")
        self.max_reward = number
        self._signature()

    def _signature(self) -> None:
        """The response parameter, the column parameters and the required ones, from the signature."""
        P = inspect.Parameter
        self.response_parameter: str | None = None
        self.parameters: frozenset[str] = frozenset()
        self.takes_any_column = True
        self.required_columns: tuple[str, ...] = ()
        try:
            params = list(inspect.signature(self.function).parameters.values())
        except (TypeError, ValueError):  # no signature to read (some builtins): pass every column
            return
        if not params or params[0].kind in (P.KEYWORD_ONLY, P.VAR_KEYWORD):
            raise ValueError(
                f"{self.setting}={self.name!r}: the function takes no positional parameter; it is called as "
                "fn(response, **row)"
            )
        first, rest = params[0], params[1:]
        for param in rest:
            if param.kind is P.POSITIONAL_ONLY and param.default is P.empty:
                raise ValueError(
                    f"{self.setting}={self.name!r}: parameter {param.name!r} is positional-only; the row's "
                    "columns are passed by name (fn(response, **row))"
                )
        named = [p for p in rest if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]
        self.response_parameter = None if first.kind is P.VAR_POSITIONAL else first.name
        self.parameters = frozenset(p.name for p in named)
        self.takes_any_column = any(p.kind is P.VAR_KEYWORD for p in params)
        self.required_columns = tuple(p.name for p in named if p.default is P.empty)

    def columns_for(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments the function gets from ``row``."""
        return {
            key: value
            for key, value in row.items()
            if key != self.response_parameter and (self.takes_any_column or key in self.parameters)
        }

    def missing_columns(self, row: Mapping[str, Any]) -> list[str]:
        return [column for column in self.required_columns if column not in row]

    def score(self, response: str, row: Mapping[str, Any], where: str) -> ScoreResult:
        """``fn(response, **row)`` checked by :meth:`result` (``where`` names the row in messages). What the function
        raises is not caught: the caller says where it happened."""
        return self.result(self.function(response, **self.columns_for(row)), where, response)

    def result(self, value: Any, where: str, response: str = "") -> ScoreResult:
        """The :class:`ScoreResult` of what the function returned (module docstring): the reward, ``correct`` (0/1)
        when flagged, and the dict's other numbers as metrics. :class:`RewardOutputError` (one line: ``where``, the
        function, the value, the rule) otherwise."""

        def bad(problem: str) -> RewardOutputError:
            return RewardOutputError(
                f"{where}: {self.name} returned {shown(value)} for the response {clip_text(response)!r}; {problem}"
            )

        metrics: dict[str, float] = {}
        reward, flagged, correct = value, False, None
        if isinstance(value, Mapping):
            keys = [key for key in ("reward", "score") if key in value]
            if len(keys) != 1:
                raise bad("a dict needs one of 'reward' or 'score'")
            reward, flagged, correct = value[keys[0]], "correct" in value, value.get("correct")
            for key, item in value.items():
                if key in (keys[0], "correct"):
                    continue
                number = _number(item)
                if not isinstance(key, str) or number is None:
                    raise bad(f"its {key!r} is not a number (a dict's other keys are logged as metrics)")
                metrics[key] = number
        elif isinstance(value, (tuple, list)):
            if len(value) != 2:
                raise bad("a tuple is (reward, correct)")
            reward, flagged, correct = value[0], True, value[1]
        number = _number(reward)
        if number is None:
            raise bad(CONTRACT)
        if not math.isfinite(number):
            raise bad("the reward must be a finite number")
        if flagged:
            flag = _flag(correct)
            if flag is None:
                raise bad(f"correct must be true or false, got {shown(correct)}")
            if flag != (number == self.max_reward):
                raise bad(
                    f"correct={flag}, but a response is correct when its reward equals "
                    f"{self.max_reward_setting}={self.max_reward:g}; set {self.max_reward_setting}, or return the "
                    "reward alone"
                )
            metrics["correct"] = float(flag)
        return ScoreResult(number, metrics)


def _messages(value: Any) -> list[dict[str, Any]]:
    ok = isinstance(value, list) and bool(value)
    ok = ok and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    ok = ok and all(isinstance(m.get("content"), str) for m in value)
    if not ok:
        raise ValueError(f"expected text or chat messages [{{'role': ..., 'content': ...}}, ...], got {shown(value)}")
    return [dict(message) for message in value]


def _question(prompt: Any) -> str:
    """The text of a prompt: the text itself, or the content of the last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


class FunctionTask(BaseTask):
    """Rows of a file scored by a reward function (:class:`RewardFunction`; ``reward``, ``max_reward``, ``prefix`` as
    there) with prompts from ``prompt_column``; ``render_chat`` renders chat prompts (``None`` refuses them)."""

    name = FUNCTION_TASK
    templates = PROMPT_FORMATS

    def __init__(
        self,
        reward: str | Callable[..., Any],
        *,
        prompt_column: str = "prompt",
        max_reward: float = 1.0,
        render_chat: ChatRenderer | None = None,
        prefix: str = "data.",
    ) -> None:
        self.reward = RewardFunction(reward, max_reward=max_reward, prefix=prefix)
        self.max_reward = self.reward.max_reward
        self.prompt_column = prompt_column
        self.render_chat = render_chat

    def with_render_chat(self, render_chat: ChatRenderer) -> FunctionTask:
        """This task (its function not loaded again) rendering chat prompts with ``render_chat``."""
        task = copy.copy(self)
        task.render_chat = render_chat
        return task

    def read_examples(self, path: str, template: str | None = None) -> list[TaskExample]:
        """One example per row: the prompt rendered per ``template`` (``data.template``), the row itself as
        ``ground_truth`` (the function's columns), ``where`` (file and row) in ``extra``. Every row must have the
        prompt column and the function's required columns."""
        prompt_format = template or self.templates[0]
        check_choice("data.template", prompt_format, self.templates)
        return [self._example(reader, prompt_format) for reader in read_rows(path)]

    def _example(self, reader: RowReader, prompt_format: str) -> TaskExample:
        row = reader.row
        columns = ", ".join(map(str, row)) or "none"
        if not reader.has(self.prompt_column):
            raise reader.error(
                self.prompt_column, f"missing (the prompt: data.prompt_column); the row's columns: {columns}"
            )
        missing = self.reward.missing_columns(row)
        if missing:
            raise reader.error(
                missing[0], f"missing; {self.reward.name} takes it as a parameter; the row's columns: {columns}"
            )
        raw = row[self.prompt_column]
        try:
            prompt = self._prompt_text(raw, prompt_format)
        except ValueError as err:
            raise reader.error(self.prompt_column, str(err)) from None
        index, source = row.get("index"), row.get("data_source")
        return TaskExample(
            prompt=prompt,
            question=_question(raw),
            ground_truth=row,
            data_source=source if isinstance(source, str) and source else FUNCTION_TASK,
            index=index if isinstance(index, int) and not isinstance(index, bool) else reader.row_number,
            extra={"where": reader.where, "prompt": raw},
        )

    def _prompt_text(self, prompt: Any, prompt_format: str) -> str:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt")
            if prompt_format != "chat":
                return prompt
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = _messages(prompt)
            if prompt_format == "text":
                raise ValueError(
                    "chat messages, but data.template=text takes text; data.template=auto or chat renders them "
                    "with the policy's chat template"
                )
        if self.render_chat is None:
            raise ValueError(
                "chat messages are rendered with the policy's chat template, which the trainer reads from "
                "model.path before it reads the data (tokenbalance train / eval)"
            )
        try:
            text = self.render_chat(messages)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - a template error: reported in one line
            raise ValueError(f"cannot render the chat messages: {first_line(err)}") from None
        return str(text)

    def render_prompt(self, example: TaskExample, template: str) -> str:
        return self._prompt_text(example.extra.get("prompt", example.question), template)

    def score_row(self, response: str, row: Mapping[str, Any], where: str) -> ScoreResult:
        """The reward of ``response`` for a row of columns; ``where`` names the row in messages."""
        return self.reward.score(response, row, where)

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        """The reward of ``response``; what the function raises becomes one :class:`ScoreError` line naming the row
        (file, row, line), the function (``FILE.py:FUNCTION`` / ``MODULE:FUNCTION``) and the error."""
        where = example.extra.get("where") or f"{example.data_source}: row {example.index}"
        row = example.ground_truth if isinstance(example.ground_truth, Mapping) else {}
        try:
            return self.score_row(response, row, where)
        except ScoreError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's function: reported in one line
            raise ScoreError(
                f"{where}: {self.reward.setting}={self.reward.name} raised {first_line(err)} for the response "
                f"{clip_text(response)!r}; fix the reward function so that it returns a reward for any text"
            ) from err

    def score_without_prompt(self, response: str, ground_truth: Any, template: str) -> ScoreResult:
        row = ground_truth if isinstance(ground_truth, Mapping) else {"ground_truth": ground_truth}
        return self.score_row(response, row, "a row")

    def check_reward(self, examples: Iterable[TaskExample], rows: int = CHECKED_ROWS) -> None:
        """Score the empty response on the first ``rows`` examples: the function must return a reward
        (:meth:`RewardFunction.result`) and not raise. Cheap, before any model work."""
        for count, example in enumerate(examples):
            if count == rows:
                return
            where = example.extra.get("where") or f"{example.data_source}: row {example.index}"
            row = example.ground_truth if isinstance(example.ground_truth, Mapping) else {}
            try:
                self.score_row("", row, where)
            except RewardOutputError:
                raise
            except Exception as err:  # noqa: BLE001 - the user's function: reported in one line
                where = example.extra.get("where", example.index)
                raise ValueError(
                    f"{where}: {self.reward.name} raised {first_line(err)} for the empty response; a reward "
                    "function must score any text"
                ) from None

    def _no_generated(self, what: str) -> ValueError:
        return ValueError(
            f"task {FUNCTION_TASK!r} (data.reward) reads its examples from data.train_file / data.eval_file and "
            f"has no {what}; give your policy with --model, or a column of good responses with --target-column "
            "(the embedded policy is then built on your rows)"
        )

    def examples(self, *args: Any, **options: Any) -> list[TaskExample]:
        raise self._no_generated("generated examples")

    def sft_response(self, example: TaskExample, target: str) -> str:
        raise self._no_generated("SFT targets")

    def tokenizer_corpus(self, difficulties: Iterable[int], template: str) -> Iterator[str]:
        raise self._no_generated("tokenizer corpus")

    def write_data(self, options: Any, *, progress: ProgressFactory, log: Callable[[str], None]) -> None:
        raise self._no_generated("data files to write")


@functools.lru_cache(maxsize=16)
def cached_function_task(reward: str, max_reward: float = 1.0, prefix: str = "data.") -> FunctionTask:
    """One :class:`FunctionTask` per (reward, max reward) for callers that score one response per call (verl's reward
    manager), so the function is loaded once."""
    return FunctionTask(reward, max_reward=max_reward, prefix=prefix)
