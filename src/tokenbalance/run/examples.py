"""Which examples a run trains, evaluates and warm-starts on, and their prompts' token ids: the task's disjoint
held-out, RL and SFT sources per difficulty (:meth:`~tokenbalance.tasks.base.Task.example_source`), or
``data.train_file`` / ``data.eval_file``; with ``data.reward`` the task is your function (:func:`task_for`, never
registered). Built once by :func:`tokenbalance.run.setup.prepare`; docs/tasks.md."""

from __future__ import annotations

from dataclasses import dataclass

from tokenbalance.config import EVAL_SET_USES, DataConfig, SFTConfig
from tokenbalance.tasks import get_task
from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.tasks.function import ChatRenderer, FunctionTask


def chat_renderer(tokenizer) -> ChatRenderer:
    """Chat messages -> prompt text with ``tokenizer``'s chat template (generation prompt added); a tokenizer without
    one refuses chat prompts, naming it."""
    if getattr(tokenizer, "chat_template", None):

        def render(messages: list[dict]) -> str:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        return render
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__

    def refuse(messages: list[dict]) -> str:
        raise ValueError(
            f"chat messages need a chat template, and the policy's tokenizer ({name}) has none; give text "
            "prompts (data.template=text)"
        )

    return refuse


def with_policy_template(task: Task, tokenizer) -> Task:
    """``task``, rendering chat prompts with ``tokenizer``'s template when it is your function's."""
    return task.with_render_chat(chat_renderer(tokenizer)) if isinstance(task, FunctionTask) else task


def task_for(data: DataConfig, tokenizer=None) -> Task:
    """The task ``data`` names: the registered ``data.task``, or with ``data.reward`` your function (imported now: not
    found, not callable, named), chat prompts rendered with ``tokenizer``'s template when given. The registry is never
    changed."""
    if data.reward is None:
        return get_task(data.task)
    task = FunctionTask(data.reward, prompt_column=data.prompt_column, max_reward=data.max_reward)
    return task if tokenizer is None else with_policy_template(task, tokenizer)


def _generated(task: Task, data: DataConfig, difficulties, use: str, count: int) -> list[TaskExample]:
    examples: list[TaskExample] = []
    for level in difficulties:
        source = task.example_source(use, level, count)
        examples += task.examples(
            source.split,
            difficulty=level,
            count=source.count,
            start_index=source.start_index,
            seed=source.seed,
            template=data.template,
        )
    return examples


def _from_file(task: Task, data: DataConfig, path: str) -> list[TaskExample]:
    examples = task.read_examples(path, template=data.template)
    if not examples:
        raise ValueError(
            f"{path}: the file holds no examples; point data.train_file / data.eval_file at a non-empty file"
        )
    return examples


def rl_examples(data: DataConfig, task: Task | None = None) -> list[TaskExample]:
    """The prompts RL trains on (``task``: default :func:`task_for`)."""
    task = task if task is not None else task_for(data)
    if data.train_file:
        return _from_file(task, data, data.train_file)
    return _generated(task, data, data.train_difficulties, "rl", data.rl_count)


def eval_examples(data: DataConfig, task: Task | None = None) -> list[TaskExample]:
    """The held-out examples (``data.eval_set``'s generator range, or ``data.eval_file``)."""
    task = task if task is not None else task_for(data)
    if data.eval_file:
        return _from_file(task, data, data.eval_file)
    return _generated(task, data, data.eval_difficulties, EVAL_SET_USES[data.eval_set], data.eval_count)


def sft_examples(data: DataConfig, count: int, task: Task | None = None) -> list[TaskExample]:
    return _generated(task if task is not None else task_for(data), data, data.train_difficulties, "sft", count)


def encode_prompts(tokenizer, examples, max_prompt_tokens: int) -> list[list[int]]:
    """Token ids of each prompt (no special tokens added: templates are already applied)."""
    if not examples:
        raise ValueError("no prompts: the dataset is empty; check data.train_difficulties / data.train_file")
    ids = tokenizer([e.prompt for e in examples], add_special_tokens=False)["input_ids"]
    for i, row in enumerate(ids):
        if len(row) > max_prompt_tokens:
            raise ValueError(
                f"prompt {i} (data_source {examples[i].data_source!r}, index {examples[i].index}) has "
                f"{len(row)} tokens, more than data.max_prompt_tokens={max_prompt_tokens}; raise the limit "
                "or use shorter prompts"
            )
    return ids


@dataclass(frozen=True)
class SFTPair:
    prompt: str
    response: str  # without the EOS token; it is appended as a token id


def sft_pairs(data: DataConfig, sft: SFTConfig, task: Task | None = None) -> list[SFTPair]:
    """The SFT warm start's prompt / response pairs: the task's SFT examples and its ``sft_response`` for
    ``sft.target``; with ``data.reward``, your rows (:func:`row_pairs`)."""
    if data.reward is not None:
        return row_pairs(data, rl_examples(data, task))
    task = task if task is not None else task_for(data)
    check_sft_target(task, sft)
    noisy = {"error_rate": sft.error_rate} if sft.error_rate else {}  # a task without a noisy teacher never sees it
    return [
        SFTPair(e.prompt, task.sft_response(e, sft.target, **noisy)) for e in sft_examples(data, sft.train_count, task)
    ]


def check_sft_target(task: Task, sft: SFTConfig) -> None:
    """``sft.error_rate`` only where the task writes a noisy teacher's working (arith) and the target is a working;
    one line naming the setting otherwise."""
    if not sft.error_rate:
        return
    if not getattr(task, "noisy_teacher", False):
        raise ValueError(f"sft.error_rate={sft.error_rate}: task {task.name!r} has no noisy teacher (arith has)")
    if sft.target == "answer":
        raise ValueError(
            f"sft.error_rate={sft.error_rate}: a noisy teacher slips in the working; set sft.target=cot or cot_random"
        )


def row_pairs(data: DataConfig, examples: list[TaskExample] | None = None) -> list[SFTPair]:
    """Every row of ``data.train_file`` (its ``examples``, read when not given) as (its prompt, its
    ``data.target_column`` text): the SFT warm start on your own data. A row without a non-empty text target is named.
    """
    column = data.target_column
    if column is None:
        raise ValueError(
            "data.target_column: a warm start on your rows needs the column holding a good response to each "
            "prompt (--target-column NAME)"
        )
    pairs = []
    for example in rl_examples(data) if examples is None else examples:
        row = example.ground_truth if isinstance(example.ground_truth, dict) else {}
        value = row.get(column)
        if not isinstance(value, str) or not value.strip():
            where = example.extra.get("where", f"{data.train_file}: row {example.index}")
            problem = "missing" if column not in row else f"expected non-empty text, got {value!r:.40}"
            raise ValueError(
                f"{where}: column {column!r} (data.target_column): {problem}; the row's columns: {', '.join(row)}"
            )
        pairs.append(SFTPair(example.prompt, value))
    return pairs
