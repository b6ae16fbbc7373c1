"""Knights & Knaves (K&K) logic puzzles as used by Logic-RL and AR-Lopti (spec ``kk.md``).

    from tokenbalance.tasks import kk
    rows = kk.generate_rows(3, "test")                       # the 100 Logic-RL 3-people test rows
    kk.compute_score(prompt + response, rows[0]["reward_model"]["ground_truth"])   # 3.0, -0.5, -1.0 or -3.0

The modules (statements, solver, generator, formatter, cot, templates, records, reward, io, task) and the differences
from the reference: docs/tasks.md ("Knights & Knaves")."""

from tokenbalance.tasks.kk.generator import KKProblem, generate_problems, iter_problems
from tokenbalance.tasks.kk.io import read_kk_examples, write_logic_rl_parquet
from tokenbalance.tasks.kk.records import default_slice, generate_rows
from tokenbalance.tasks.kk.reward import (
    KKScore,
    compute_score,
    score_response,
    score_with_metrics,
)
from tokenbalance.tasks.kk.solver import all_solutions, count_solutions
from tokenbalance.tasks.kk.statements import parse_statements, render_statement
from tokenbalance.tasks.kk.task import KKTask, response_text, tokenizer_corpus
from tokenbalance.tasks.kk.templates import TEMPLATE_NAMES, render_prompt

__all__ = [
    "response_text",
    "tokenizer_corpus",
    "KKProblem",
    "KKScore",
    "KKTask",
    "TEMPLATE_NAMES",
    "all_solutions",
    "compute_score",
    "count_solutions",
    "default_slice",
    "generate_problems",
    "generate_rows",
    "iter_problems",
    "parse_statements",
    "read_kk_examples",
    "render_prompt",
    "render_statement",
    "score_response",
    "score_with_metrics",
    "write_logic_rl_parquet",
]
