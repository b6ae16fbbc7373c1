"""``arith``: generated multi-step integer arithmetic with ``\\boxed{}`` answers, and a reader for DeepScaleR-style
math parquet files.

Random expression trees over ``+ - * /`` with exact divisions (``Compute (14 - 5) * 3 + 12 / 4.``); example i depends
only on ``(seed, split, level, i)``. Scored by math-verify on the last ``\\boxed{}`` after ``</think>``, never
``eval``. docs/tasks.md ("Arithmetic", "Deliberate differences from the reference")."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenbalance.checks import check_range
from tokenbalance.tasks.arith_expr import Expr, evaluate_expression, render_expression
from tokenbalance.tasks.base import SFT_TARGETS, BaseTask, ProgressFactory, ScoreResult, TaskExample, drawn_choices
from tokenbalance.tasks.files import RowReader, read_rows, write_parquet_atomic

LEVELS = (1, 2, 3, 4, 5)
SPLITS = ("train", "test")
_SPLIT_CODES = {"train": 0, "test": 1}
DEFAULT_SEED = 0
DEFAULT_COUNTS = {"train": 1000, "test": 100}
DEFAULT_TIMEOUT_S = 5
MAX_ANSWER_CHARS = 200
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
# What each piece of a working is (tokenbalance.tasks.arith_cot): the result of an operation and the operator it
# applies (the working's decisions: a noisy teacher errs there), a number or operator copied from the expression
# before (where a drawn order shows), a drawn wording slot, and the fixed rest (spaces, punctuation, the box).
TOKEN_CLASSES = ("result", "operator", "copy", "wording", "format")
DECISION_CLASSES = ("result", "operator")


@dataclass(frozen=True)
class LevelSpec:
    """Shape of a level: ``operations`` binary operators, operand magnitudes up to ``max_operand``, the operator set,
    whether operands may be negative, and the bound on every intermediate value."""

    operations: int
    max_operand: int
    operators: str
    negatives: bool
    max_value: int


LEVEL_SPECS = {
    1: LevelSpec(operations=2, max_operand=20, operators="+-", negatives=False, max_value=100),
    2: LevelSpec(operations=3, max_operand=20, operators="+-*", negatives=False, max_value=1000),
    3: LevelSpec(operations=4, max_operand=50, operators="+-*/", negatives=False, max_value=5000),
    4: LevelSpec(operations=5, max_operand=100, operators="+-*/", negatives=True, max_value=20000),
    5: LevelSpec(operations=7, max_operand=100, operators="+-*/", negatives=True, max_value=100000),
}


@dataclass(frozen=True)
class ArithProblem:
    """One problem: ``question`` text, integer ``answer``, ``level``, ``split`` and ``index``."""

    question: str
    answer: int
    level: int
    split: str
    index: int
    tree: Expr = field(default=None, compare=False, repr=False)  # the expression (the working's input)


def _check_level(level: object) -> int:
    check_range("level", level, LEVELS[0], LEVELS[-1], integer=True)
    return level  # type: ignore[return-value]


def _check_split(split: object) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return str(split)


def _random_tree(rng: np.random.Generator, spec: LevelSpec, operations: int) -> Expr:
    if operations == 0:
        value = int(rng.integers(1, spec.max_operand + 1))
        if spec.negatives and rng.integers(0, 4) == 0:
            value = -value
        return value
    left_ops = int(rng.integers(0, operations))
    operator = spec.operators[int(rng.integers(0, len(spec.operators)))]
    return (
        operator,
        _random_tree(rng, spec, left_ops),
        _random_tree(rng, spec, operations - 1 - left_ops),
    )


def _acceptable(node: Expr, spec: LevelSpec) -> bool:
    """Every intermediate value is an integer within ``spec.max_value`` (so divisions are exact)."""
    try:
        value = evaluate_expression(node)
    except ZeroDivisionError:
        return False
    if value.denominator != 1 or abs(value) > spec.max_value:
        return False
    return isinstance(node, int) or (_acceptable(node[1], spec) and _acceptable(node[2], spec))


def generate_problem(level: int, split: str, index: int, seed: int = DEFAULT_SEED) -> ArithProblem:
    """Problem ``index`` of ``split`` at ``level``; depends only on ``(seed, split, level, index)``."""
    spec = LEVEL_SPECS[_check_level(level)]
    rng = np.random.default_rng([seed, _SPLIT_CODES[_check_split(split)], level, index])
    for _ in range(10_000):
        tree = _random_tree(rng, spec, spec.operations)
        if _acceptable(tree, spec):
            question = f"Compute {render_expression(tree)}."
            return ArithProblem(question, int(evaluate_expression(tree)), level, split, index, tree)
    raise ValueError(f"could not generate an arith problem for level {level}, index {index}")


def generate_problems(
    level: int, split: str, count: int | None = None, *, seed: int = DEFAULT_SEED, start_index: int = 0
) -> list[ArithProblem]:
    """``count`` problems (default: 1000 train / 100 test) from ``start_index``."""
    _check_level(level)
    total = DEFAULT_COUNTS[_check_split(split)] if count is None else count
    check_range("count", total, 1, integer=True)
    check_range("start_index", start_index, 0, integer=True)
    check_range("seed", seed, 0, integer=True)
    return [generate_problem(level, split, i, seed) for i in range(start_index, start_index + total)]


# -------------------------------------------------------------------------------------------- Templates
# --------------------------------------------------------------------------------------------

ARITH_TEMPLATES = {
    # No special tokens; "Assistant:" turn like the K&K plain template.
    "plain": "User: {question} " + INSTRUCTION + "\nAssistant:",
    # Qwen chat template baked in, as Logic-RL does for K&K.
    "qwen-instruct": (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{question} "
        + INSTRUCTION
        + "<|im_end|>\n<|im_start|>assistant\n"
    ),
    # The raw text of DeepScaleR's *_dsr prompts (no turns at all).
    "raw": "{question} " + INSTRUCTION,
}
ARITH_TEMPLATE_NAMES = tuple(ARITH_TEMPLATES)


def render_arith_prompt(question: str, template: str = "plain") -> str:
    """The prompt text for ``question`` under one of :data:`ARITH_TEMPLATE_NAMES`."""
    if template not in ARITH_TEMPLATES:
        raise ValueError(f"unknown template {template!r}; valid templates: {', '.join(ARITH_TEMPLATE_NAMES)}")
    return ARITH_TEMPLATES[template].replace("{question}", question)


# -------------------------------------------------------------------------------------------- Scoring
# --------------------------------------------------------------------------------------------


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (brace-matched), or None.

    ``\\boxed 5`` (no braces) and an unclosed box give None, as in the reference extractor."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    opening = text.index("{", start)
    depth = 0
    for position in range(opening, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[opening + 1 : position]
    return None


def strip_boxed(answer: str) -> str:
    """A gold answer without its ``\\boxed{}`` wrapper, if it has one."""
    content = last_boxed_content(answer)
    return content if content is not None and answer.strip().startswith(("\\boxed{", "\\fbox{")) else answer


def _gold_answers(ground_truth: Any) -> list[str]:
    answers = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    if not answers or not all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in answers):
        raise ValueError(
            f"ground_truth must be an answer string (or int) or a non-empty list of them, got {ground_truth!r}"
        )
    return [strip_boxed(str(a)) for a in answers]


def score_math(response: str, ground_truth: Any, *, timeout_s: int | None = DEFAULT_TIMEOUT_S) -> ScoreResult:
    """``ScoreResult`` (reward 1.0 or 0.0; metrics ``boxed``, ``parsed``, ``correct``) of the last ``\\boxed{}`` after
    ``</think>`` against ``ground_truth``. ``timeout_s`` (whole seconds) bounds parsing and each comparison; a
    time-out scores 0. Never raises for any response text."""
    if not isinstance(response, str):
        raise ValueError(f"response must be a string, got {type(response).__name__}")
    golds = _gold_answers(ground_truth)
    if timeout_s is not None:
        check_range("timeout_s", timeout_s, 1, integer=True)  # whole seconds (signal.alarm)
    tail = response.split("</think>", 1)[1] if "</think>" in response else response
    boxed = last_boxed_content(tail)
    metrics = {"boxed": float(boxed is not None), "parsed": 0.0, "correct": 0.0}
    if boxed is None or not boxed.strip() or len(boxed) > MAX_ANSWER_CHARS:
        return ScoreResult(0.0, metrics)

    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    on_main = threading.current_thread() is threading.main_thread() and os.name == "posix"
    limit = timeout_s if on_main else None
    config = [LatexExtractionConfig()]
    try:
        predicted = parse("\\boxed{" + boxed + "}", extraction_config=config, parsing_timeout=limit)
        if not predicted:
            return ScoreResult(0.0, metrics)
        # math-verify appends the raw string as a fallback; "parsed" means a sympy object came out.
        metrics["parsed"] = float(any(not isinstance(item, str) for item in predicted))
        for gold in golds:
            parsed_gold = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=limit)
            if parsed_gold and verify(parsed_gold, predicted, timeout_seconds=limit):
                metrics["correct"] = 1.0
                return ScoreResult(1.0, metrics)
    except (Exception, TimeoutException):  # time-outs, parser failures: nothing we can credit
        return ScoreResult(0.0, metrics)
    return ScoreResult(0.0, metrics)


# -------------------------------------------------------------------------------------------- Files: write generated
# sets and read DeepScaleR-style parquet
# --------------------------------------------------------------------------------------------


def arith_rows(problems: list[ArithProblem], template: str = "raw", data_source: str = "arith") -> list[dict[str, Any]]:
    """DeepScaleR-style rows (``data_source, prompt, ability, reward_model, extra_info``)."""
    return [
        {
            "data_source": data_source.replace("{n}", str(problem.level)),
            "prompt": [{"content": render_arith_prompt(problem.question, template), "role": "user"}],
            "ability": "math",
            "reward_model": {"ground_truth": str(problem.answer), "style": "rule"},
            "extra_info": {
                "index": row,
                "split": problem.split,
                "level": problem.level,
                "question": problem.question,
            },
        }
        for row, problem in enumerate(problems)
    ]


def write_arith_parquet(rows: list[dict[str, Any]], path: str | os.PathLike, *, replace: bool = False) -> Any:
    """Write :func:`arith_rows` output as parquet (same layout as the DeepScaleR files; an existing file only with
    ``replace``, and only one gen-data wrote: ``write_parquet_atomic``)."""
    import pyarrow as pa

    if not rows:
        raise ValueError("no rows to write")
    string = pa.string()
    schema = pa.schema(
        [
            ("data_source", string),
            ("prompt", pa.list_(pa.struct([("content", string), ("role", string)]))),
            ("ability", string),
            ("reward_model", pa.struct([("ground_truth", string), ("style", string)])),
            (
                "extra_info",
                pa.struct([("index", pa.int64()), ("split", string), ("level", pa.int64()), ("question", string)]),
            ),
        ]
    )
    return write_parquet_atomic(rows, path, schema, replace=replace)


def _math_example(reader: RowReader, default_source: str) -> TaskExample:
    messages = reader.get("prompt", list)
    if not messages or not isinstance(messages[-1], dict) or not isinstance(messages[-1].get("content"), str):
        raise reader.error("prompt", "expected a non-empty list of {'content': str, 'role': str} messages")
    prompt = messages[-1]["content"]
    gold = reader.get("reward_model.ground_truth", (str, int, list))
    try:
        _gold_answers(gold)
    except ValueError as err:
        raise reader.error("reward_model.ground_truth", str(err)) from None
    extra_info = reader.get("extra_info", dict, default=None) or {}
    question = extra_info.get("question") if isinstance(extra_info.get("question"), str) else prompt
    level = extra_info.get("level") if type(extra_info.get("level")) is int else 0
    index = extra_info.get("index") if type(extra_info.get("index")) is int else reader.row_number
    return TaskExample(
        prompt=prompt,
        question=str(question),
        ground_truth=list(gold) if isinstance(gold, list) else str(gold),
        data_source=reader.get("data_source", str, default=default_source),
        difficulty=int(level or 0),
        index=int(index if index is not None else reader.row_number),
        extra={"row": reader.row_number, "source_file": reader.path, "messages": messages},
    )


def read_math_examples(path: str | os.PathLike, data_source: str = "math") -> list[TaskExample]:
    """Task examples from a DeepScaleR-style parquet / JSON-lines file: ``prompt`` (chat messages; the last one's
    content is used as is), ``reward_model.ground_truth`` (answer or list of answers); optional ``data_source``,
    ``extra_info.{index, level, question}``."""
    readers = read_rows(path)
    if not readers:
        raise ValueError(f"{path}: the file has no rows")
    return [_math_example(reader, data_source) for reader in readers]


class ArithTask(BaseTask):
    """Generated arithmetic; ``difficulty`` is the level 1..5 (default 2); held-out, RL and SFT examples use seeds 0,
    1, 2."""

    name = "arith"
    templates = ARITH_TEMPLATE_NAMES  # plain (default), qwen-instruct, raw
    max_reward = 1.0

    def __init__(self, timeout_s: int | None = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def examples(
        self,
        split: str,
        *,
        difficulty: int | None = None,
        count: int | None = None,
        seed: int | None = None,
        template: str | None = None,
        start_index: int | None = None,
    ) -> list[TaskExample]:
        level = 2 if difficulty is None else difficulty
        chosen = template or self.templates[0]
        render_arith_prompt("", chosen)  # validate before generating
        problems = generate_problems(
            level,
            split,
            count,
            seed=DEFAULT_SEED if seed is None else seed,
            start_index=0 if start_index is None else start_index,
        )
        return [
            TaskExample(
                prompt=render_arith_prompt(p.question, chosen),
                question=p.question,
                ground_truth=str(p.answer),
                data_source="arith",
                difficulty=p.level,
                index=p.index,
                extra={"split": p.split, "tree": p.tree},
            )
            for p in problems
        ]

    def read_examples(self, path: str, template: str | None = None) -> list[TaskExample]:
        """DeepScaleR-style rows (:func:`read_math_examples`); prompts are used as stored."""
        return read_math_examples(path)

    def render_prompt(self, example: TaskExample, template: str) -> str:
        return render_arith_prompt(example.question, template)

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        return score_math(response, example.ground_truth, timeout_s=self.timeout_s)

    def difficulty_label(self, difficulty: int) -> str:
        return f"level {difficulty}"

    noisy_teacher = True  # sft_response takes error_rate (sft.error_rate)
    token_class_names = TOKEN_CLASSES
    decision_classes = DECISION_CLASSES

    def sft_response(self, example: TaskExample, target: str, *, error_rate: float = 0.0) -> str:
        """`` \\boxed{answer}`` (``answer``), or the working first (``cot``, ``cot_random``:
        :mod:`~tokenbalance.tasks.arith_cot`; generated examples only). ``error_rate`` > 0 (``cot`` only): a noisy
        teacher, each operation slipping with that probability (:class:`~tokenbalance.tasks.arith_cot.NoisyTeacher`,
        seeded by the example)."""
        if target not in SFT_TARGETS:
            raise ValueError(f"target: unknown value {target!r}; valid: {', '.join(map(repr, SFT_TARGETS))}")
        check_range("error_rate", error_rate, 0.0, 1.0)
        if target == "answer":
            if error_rate:
                raise ValueError(
                    "sft.error_rate applies to the working (sft.target=cot or cot_random), not to 'answer'"
                )
            answers = (
                example.ground_truth if isinstance(example.ground_truth, (list, tuple)) else [example.ground_truth]
            )
            return f" \\boxed{{{answers[0]}}}"
        tree = example.extra.get("tree")
        if tree is None:
            raise ValueError(
                f"example {example.index}: no expression to write the working of (generated examples have one)"
            )
        from tokenbalance.tasks.arith_cot import NoisyTeacher, working  # it builds on this module's expressions

        rng = drawn_choices(example) if target == "cot_random" else None
        errors = NoisyTeacher(error_rate, drawn_choices(example, "slips")) if error_rate else None
        return " " + working(tree, rng, errors)

    def text_classes(self, text: str) -> list[str]:
        """The class of each character of a working (:func:`tokenbalance.tasks.arith_cot.text_classes`)."""
        from tokenbalance.tasks.arith_cot import text_classes

        return text_classes(text)

    def tokenizer_corpus(self, difficulties: Iterable[int], template: str) -> Iterator[str]:
        """The prompts and boxed answers of the base corpus, and each example's drawn working, so that the working's
        words are tokens of the embedded tokenizer, not spelt out letter by letter."""
        for example in self.corpus_examples(difficulties, template):
            yield example.prompt
            yield self.sft_response(example, "answer")
            yield self.sft_response(example, "cot_random")

    def write_data(self, options: Any, *, progress: ProgressFactory, log: Callable[[str], None]) -> None:
        """``tokenbalance gen-data arith``: one DeepScaleR-style parquet file of one level."""
        if options.merge or options.per_level_source or options.people is not None:
            raise ValueError("--people, --merge and --per-level-source apply to kk only; arith takes --level")
        problems = generate_problems(
            2 if options.level is None else options.level,
            options.split,
            options.count,
            seed=DEFAULT_SEED if options.seed is None else options.seed,
            start_index=0 if options.start_index is None else options.start_index,
        )
        rows = arith_rows(problems, template=options.template or "raw", data_source=options.data_source or "arith")
        path = write_arith_parquet(rows, options.out, replace=getattr(options, "force", False))
        log(f"wrote {len(rows)} rows (arith level {problems[0].level}, {options.split}) to {path}")
