"""The Knights & Knaves :class:`~tokenbalance.tasks.base.Task`: Logic-RL examples, prompts, the reference reward (on
prompt + response; metrics format_ok, answer_parsed, correct), SFT targets, the tokenizer corpus and ``gen-data``.
Each use takes its own range of global generator indices, so held-out puzzles are never trained on (docs/training.md,
"Data")."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tokenbalance.tasks.base import (
    SFT_TARGETS,
    BaseTask,
    ExampleSource,
    ProgressFactory,
    ScoreResult,
    TaskExample,
    drawn_choices,
)
from tokenbalance.tasks.kk.cot import chain_of_thought
from tokenbalance.tasks.kk.generator import DEFAULT_SEED
from tokenbalance.tasks.kk.records import DEFAULT_DATA_SOURCE, generate_rows
from tokenbalance.tasks.kk.reward import score_response, score_with_metrics
from tokenbalance.tasks.kk.statements import parse_statements
from tokenbalance.tasks.kk.templates import TEMPLATE_NAMES, get_template, reference_cot, reference_response

TWO_PEOPLE_LIMIT = 398  # the generator finds no further unique 2-people puzzle at seed 1234
REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")  # what the reward reads
RL_LIMIT = 1900  # RL prompts: train indices 100 .. 1999 (the first 900 are Logic-RL's train set)
VALIDATION_START = 10_000  # past the held-out range (1000 .. 1000 + eval_count - 1, eval_count <= 9000)
COT_FIELDS = ("cot_head", "cot_repeat_steps", "cot_foot")


def random_order_cot(example: TaskExample) -> str:
    """The chain of thought of a generated example with the search's choices drawn
    (:func:`~tokenbalance.tasks.kk.cot.search`) from a generator seeded by difficulty and index: a fixed trace per
    puzzle, different orders across puzzles."""
    puzzle = parse_statements(example.ground_truth["statements"])
    head, steps, foot = chain_of_thought(puzzle, tuple(example.extra["names"]), drawn_choices(example))
    return " ".join([head, *steps, foot])


def example_from_generated_row(row: dict[str, Any]) -> TaskExample:
    """A :class:`TaskExample` from a row of :func:`~tokenbalance.tasks.kk.records.generate_rows`."""
    return TaskExample(
        prompt=row["prompt"][0]["content"],
        question=row["quiz"],
        ground_truth=dict(row["reward_model"]["ground_truth"]),
        data_source=row["data_source"],
        difficulty=len(row["names"]),
        index=row["index"],
        extra={
            "names": list(row["names"]),
            "solution": list(row["solution"]),
            "split": row["extra_info"]["split"],
            "row": row["extra_info"]["index"],
            "solution_text": row["solution_text"],
            "cot_head": row["cot_head"],
            "cot_repeat_steps": list(row["cot_repeat_steps"]),
            "cot_foot": row["cot_foot"],
        },
    )


def kk_example_range(n_people: int, use: str, count: int) -> tuple[str, int, int]:
    """``(split, start_index, count)`` of the generated examples of ``use`` (module docstring)."""
    split = "test" if use in ("eval", "validation") else "train"
    if use in ("eval", "validation") and n_people > 2 and count > VALIDATION_START - 1000:
        raise ValueError(
            f"data.eval_count: at most {VALIDATION_START - 1000} K&K puzzles per number of people, got {count} "
            "(the held-out and validation ranges must not overlap)"
        )
    if use == "validation":
        if n_people == 2:
            raise ValueError(
                "data.eval_set=validation: K&K 2 people has no validation range (its ~398 puzzles are "
                "all test, RL or SFT puzzles); validate on 3 or more people"
            )
        return split, VALIDATION_START, count
    if n_people == 2:
        if use == "eval":
            return split, 0, min(count, 100)
        return split, 100, TWO_PEOPLE_LIMIT - 100
    if use == "eval":
        return split, 1000, count
    if use == "rl":
        if count > RL_LIMIT:
            raise ValueError(
                f"data.rl_count: at most {RL_LIMIT} generated K&K RL puzzles per number of people (train "
                f"indices 100 .. 1999; the SFT puzzles start at 2000), got {count}"
            )
        return split, 100, count
    return split, 2000, count


def response_text(row) -> str:
    """The CoT response of a Logic-RL row (:func:`~tokenbalance.tasks.kk.templates.reference_response`)."""
    return reference_response(row["solution_text_format"], reference_cot(row))


def tokenizer_corpus(
    people: Iterable[int] = (2, 3),
    *,
    count: int = 200,
    split: str = "train",
    template: str = "plain",
) -> Iterator[str]:
    """Deterministic text for tokenizer training: for the first ``count`` rows of ``split`` per number of people, the
    prompt, :func:`response_text` and the plain ``solution_text``."""
    for n_people in people:
        for row in generate_rows(n_people, split, count=count, template=template):
            yield row["prompt"][0]["content"]
            yield response_text(row)
            yield row["solution_text"]


class KKTask(BaseTask):
    """Knights & Knaves (Logic-RL data). ``difficulty`` is the number of people (2..8, default 3)."""

    name = "kk"
    templates = TEMPLATE_NAMES  # qwen-instruct (default), qwen-base, plain, compact
    max_reward = 3.0
    special_tokens: tuple[str, ...] = REASONING_TAGS

    def __init__(self, data_source: str = DEFAULT_DATA_SOURCE) -> None:
        self.data_source = data_source

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
        """The published split (train 100..999, test 1000..1099) unless ``count``/``start_index`` say otherwise; see
        :func:`~tokenbalance.tasks.kk.records.generate_rows`."""
        rows = generate_rows(
            3 if difficulty is None else difficulty,
            split,
            start_index=start_index,
            count=count,
            seed=DEFAULT_SEED if seed is None else seed,
            template=template or self.templates[0],
            data_source=self.data_source,
        )
        return [example_from_generated_row(row) for row in rows]

    def example_source(self, use: str, difficulty: int, count: int) -> ExampleSource:
        super().example_source(use, difficulty, count)  # checks ``use``
        split, start, n = kk_example_range(difficulty, use, count)
        return ExampleSource(split, count=n, start_index=start)

    def read_examples(self, path: str, template: str | None = None) -> list[TaskExample]:
        from tokenbalance.tasks.kk.io import read_kk_examples

        return read_kk_examples(path, template=template)

    def render_prompt(self, example: TaskExample, template: str) -> str:
        return get_template(template).render_puzzle(
            example.question, example.ground_truth.get("statements"), example.extra.get("names")
        )

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        result = score_with_metrics(example.prompt + response, example.ground_truth)
        return ScoreResult(reward=result.total, metrics=result.metrics())

    def score_without_prompt(self, response: str, ground_truth: Any, template: str) -> ScoreResult:
        """The reference reads prompt + response: the ``template``'s assistant header is put in front
        (:func:`~tokenbalance.tasks.kk.reward.score_response`)."""
        result = score_response(response, ground_truth, template)
        return ScoreResult(reward=result.total, metrics=result.metrics())

    def difficulty_label(self, difficulty: int) -> str:
        return f"{difficulty} people"

    # a role word ("knight", "knaves") in the answer block is what the reward scores (the decision); one in the
    # reasoning is a step of the search (an assumption, a deduction); the rest is other text
    token_class_names = ("answer_role", "role", "other")
    decision_classes = ("answer_role",)

    def text_classes(self, text: str) -> list[str]:
        """The class of each character of a response (:attr:`token_class_names`): role words inside
        ``<answer>...</answer>`` (to the end of the text when unclosed) are ``answer_role``, role words elsewhere
        ``role``, everything else ``other``."""
        kinds = ["other"] * len(text)
        answers = [(m.start(), m.end()) for m in re.finditer(r"<answer>(?:(?!</answer>).)*(?:</answer>|$)", text, re.S)]
        for match in re.finditer(r"\b(?:knight|knave)s?\b", text):
            inside = any(start <= match.start() < end for start, end in answers)
            kinds[match.start() : match.end()] = ["answer_role" if inside else "role"] * (match.end() - match.start())
        return kinds

    def sft_response(self, example: TaskExample, target: str) -> str:
        """``</think>`` then the answer block; with ``target="cot"`` the generator's synthetic chain of thought first
        (generated examples carry it; file examples do not); with ``"cot_random"`` the same search with its choices
        drawn per puzzle (:func:`random_order_cot`)."""
        if target not in SFT_TARGETS:
            raise ValueError(f"target: unknown value {target!r}; valid: {', '.join(map(repr, SFT_TARGETS))}")
        thinking = ""
        if target != "answer":
            if not all(field in example.extra for field in COT_FIELDS):
                raise ValueError(
                    f"example {example.index}: no chain of thought to train on (generated examples have one)"
                )
            thinking = reference_cot(example.extra) if target == "cot" else random_order_cot(example)
        return reference_response(example.ground_truth["solution_text_format"], thinking)

    def tokenizer_corpus(self, difficulties: Iterable[int], template: str) -> Iterator[str]:
        return tokenizer_corpus(difficulties, template=template)

    def write_data(self, options: Any, *, progress: ProgressFactory, log: Callable[[str], None]) -> None:
        write_data_files(options, progress=progress, log=log)


def parse_people(text: str) -> list[int]:
    """``"3"`` -> [3]; ``"3-7"`` -> [3, 4, 5, 6, 7]; each in 2..8."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise ValueError(f"--people must be N or A-B with people in 2..8, got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if not (2 <= low <= 8 and 2 <= high <= 8) or low > high:
        raise ValueError(f"--people must be in 2..8 (A <= B for a range), got {text!r}")
    return list(range(low, high + 1))


def write_data_files(args: Any, *, progress: ProgressFactory, log: Callable[[str], None]) -> None:
    """``tokenbalance gen-data kk``: Logic-RL parquet files, one per level or ``--merge``d."""
    from tokenbalance.tasks.files import check_parquet_target
    from tokenbalance.tasks.kk.io import write_logic_rl_parquet
    from tokenbalance.tasks.kk.records import PER_LEVEL_DATA_SOURCE, default_slice
    from tokenbalance.tasks.kk.templates import DEFAULT_TEMPLATE

    if args.level is not None:
        raise ValueError("--level applies to arith only; kk takes --people")
    people = args.people or "3"
    levels = parse_people(people)
    template = args.template or DEFAULT_TEMPLATE
    get_template(template)
    if args.per_level_source and args.data_source is not None:
        raise ValueError("give either --data-source or --per-level-source, not both")
    data_source = PER_LEVEL_DATA_SOURCE if args.per_level_source else (args.data_source or DEFAULT_DATA_SOURCE)
    if len(levels) > 1 and not args.merge and "{n}" not in args.out:
        raise ValueError(
            f"--people {people} gives one file per level: put {{n}} in --out "
            "(e.g. data/{n}ppl/train.parquet) or pass --merge"
        )
    slices = {}
    for n in levels:
        start, count = default_slice(n, args.split)
        slices[n] = (
            start if args.start_index is None else args.start_index,
            count if args.count is None else args.count,
        )
    total_draws = sum(start + count for start, count in slices.values())
    seed = DEFAULT_SEED if args.seed is None else args.seed
    replace = bool(getattr(args, "force", False))
    outputs = [args.out] if args.merge or "{n}" not in args.out else [args.out.replace("{n}", str(n)) for n in levels]
    for path in outputs:  # before generating: an existing file is refused now, not after minutes
        check_parquet_target(path, replace=replace)
    merged: list[dict] = []
    with progress(total_draws, "kk puzzles") as advance:
        for n in levels:
            start, count = slices[n]
            rows = generate_rows(
                n,
                args.split,
                start_index=start,
                count=count,
                seed=seed,
                template=template,
                data_source=data_source,
                on_progress=advance,
            )
            if args.merge:
                merged.extend(rows)
            else:
                path = write_logic_rl_parquet(rows, args.out.replace("{n}", str(n)), replace=replace)
                log(
                    f"wrote {len(rows)} rows ({n} people, {args.split}, indices {start}..{start + count - 1}) to {path}"
                )
    if args.merge:
        path = write_logic_rl_parquet(merged, args.out, replace=replace)
        log(f"wrote {len(merged)} rows ({people} people, {args.split}, merged) to {path}")
