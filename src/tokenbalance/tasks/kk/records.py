"""Logic-RL rows for generated Knights & Knaves puzzles (spec ``kk.md`` §8.1, §9): the 11 K&K fields then the 5
Logic-RL ones. With the defaults the rows for n = 3..7 equal the published ``{n}ppl/{train,test}.parquet``; n = 2
takes the K&K release's slices. docs/tasks.md ("Generation")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenbalance.tasks.kk.cot import chain_of_thought
from tokenbalance.tasks.kk.formatter import KNIGHT_KNAVE_WORDS, format_problem
from tokenbalance.tasks.kk.generator import DEFAULT_SEED, KKProblem, check_people, generate_problems
from tokenbalance.tasks.kk.statements import format_statements
from tokenbalance.tasks.kk.templates import DEFAULT_TEMPLATE, get_template

SPLITS = ("train", "test")
DEFAULT_DATA_SOURCE = "kk_logic"
PER_LEVEL_DATA_SOURCE = "kk_logic{n}"  # AR-Lopti's test_new files: kk_logic3 ... kk_logic7
ABILITY = "logic"
KK_RECORD_COLUMNS = (
    "quiz", "names", "knight_knave", "solution", "solution_text", "solution_text_format",
    "cot_head", "cot_repeat_steps", "cot_foot", "statements", "index",
)  # fmt: skip
LOGIC_RL_COLUMNS = KK_RECORD_COLUMNS + (
    "data_source", "prompt", "ability", "reward_model", "extra_info",
)  # fmt: skip


def check_split(split: object) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return str(split)


def default_slice(n_people: int, split: str) -> tuple[int, int]:
    """``(start_index, count)`` of the published split (see the module docstring)."""
    check_people(n_people)
    check_split(split)
    if n_people == 2:
        return (100, 200) if split == "train" else (0, 100)
    return (100, 900) if split == "train" else (1000, 100)


def kk_record(problem: KKProblem, seed: int = DEFAULT_SEED, *, with_cot: bool = True) -> dict[str, Any]:
    """The 11 K&K record fields; the text RNG is seeded with ``seed + problem.index``.

    ``with_cot=False`` leaves the three CoT fields empty (faster when only the quiz is needed)."""
    text = format_problem(seed + problem.index, problem.statements, problem.solution)
    if with_cot:
        cot_head, cot_steps, cot_foot = chain_of_thought(problem.statements, text.names)
    else:
        cot_head, cot_steps, cot_foot = "", [], ""
    return {
        "quiz": text.quiz,
        "names": list(text.names),
        "knight_knave": dict(KNIGHT_KNAVE_WORDS),
        "solution": list(problem.solution),
        "solution_text": text.solution_text,
        "solution_text_format": text.solution_text_format,
        "cot_head": cot_head,
        "cot_repeat_steps": cot_steps,
        "cot_foot": cot_foot,
        "statements": format_statements(problem.statements),
        "index": problem.index,
    }


def data_source_for(data_source: str, n_people: int) -> str:
    """``data_source`` with ``{n}`` replaced by the number of people (``kk_logic{n}`` -> ``kk_logic3``)."""
    return data_source.replace("{n}", str(n_people))


def logic_rl_row(
    record: dict[str, Any],
    *,
    row_index: int,
    split: str,
    data_source: str = DEFAULT_DATA_SOURCE,
    template: str = DEFAULT_TEMPLATE,
) -> dict[str, Any]:
    """A K&K record plus the Logic-RL fields; ``row_index`` is the row number within its file."""
    prompt = get_template(template).render_puzzle(record["quiz"], record["statements"], record["names"])
    return {
        **record,
        "data_source": data_source_for(data_source, len(record["names"])),
        "prompt": [{"content": prompt, "role": "user"}],
        "ability": ABILITY,
        "reward_model": {
            "ground_truth": {
                "solution_text_format": record["solution_text_format"],
                "statements": record["statements"],
            },
            "style": "rule",
        },
        "extra_info": {"index": row_index, "split": split},
    }


def generate_rows(
    n_people: int,
    split: str,
    *,
    start_index: int | None = None,
    count: int | None = None,
    seed: int = DEFAULT_SEED,
    template: str = DEFAULT_TEMPLATE,
    data_source: str = DEFAULT_DATA_SOURCE,
    on_progress: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Logic-RL rows for global indices ``start_index .. start_index + count - 1`` (default: :func:`default_slice`);
    ``split`` goes to ``extra_info.split``; ``on_progress`` as in ``generate_problems``."""
    default_start, default_count = default_slice(n_people, split)
    get_template(template)  # fail before the (possibly long) generation
    problems = generate_problems(
        n_people,
        default_start if start_index is None else start_index,
        default_count if count is None else count,
        seed,
        on_progress=on_progress,
    )
    return [
        logic_rl_row(kk_record(problem, seed), row_index=row, split=split, data_source=data_source, template=template)
        for row, problem in enumerate(problems)
    ]
