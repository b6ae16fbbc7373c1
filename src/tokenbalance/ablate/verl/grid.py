"""The same grid at paper scale on verl: how each row launches, and the cells (row x model x seed).

Each cell runs its row's method through ``examples/verl/kk_method.sh`` with the AR-Lopti K&K settings
of ``examples/verl/common.sh`` (docs/verl.md): the row's preset (or token rule) travels as ``METHOD``,
resolved in verl's workers as in our trainer, on the trainer its passes need (``TRAINER``). A row verl
cannot run comes back with the reason. The schedule is the scripts' 5 epochs, not the local grid's RL
steps. Nothing here imports verl: the grid is text (:mod:`.scripts`, :mod:`.cost`, :mod:`.report`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenbalance.ablate.grid import Cell, GridMethod
from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.presets import as_overrides, get_method
from tokenbalance.integrations.verl_names import POLICY_LOSS_KEY, VERL_OWNED
from tokenbalance.integrations.verl_rules import CALCULATE_ENTROPY, verl_method_problem, verl_rule_problem

VERL_MODELS = ("3b", "7b")
# each model's hub name (examples/verl/common.sh's defaults; MODEL_PATH_3B / MODEL_PATH_7B name a copy)
VERL_MODEL_NAMES = {"3b": "Qwen/Qwen2.5-3B-Instruct", "7b": "Qwen/Qwen2.5-7B-Instruct-1M"}
POLICY_LOSS = POLICY_LOSS_KEY
SCRIPT = "examples/verl/kk_method.sh"  # METHOD on TRAINER with the K&K settings of common.sh
_PLAIN = re.compile(r"[A-Za-z0-9_.:/+-]+")


@dataclass(frozen=True)
class VerlLaunch:
    """How a row launches on verl: the script, its environment and extra hydra overrides."""

    script: str
    env: tuple[tuple[str, str], ...]
    overrides: tuple[str, ...]
    update_passes: int = 1  # actor updates per RL step: 2 with Lopti (one per pass)


def _base_difference(method: Method) -> str | None:
    """Why ``method``'s settings held by verl's keys differ from the K&K scripts' (None when they match)."""
    base = get_method("grpo")
    for name in ("clip", "kl", "entropy_coeff", "loss_agg_mode", "policy_loss_agg_mode", "max_response_len"):
        if getattr(method, name) != getattr(base, name):
            return (
                f"its {name} ({getattr(method, name)}) differs from the K&K scripts' ({getattr(base, name)}); "
                "launch it by hand with verl overrides (docs/verl.md)"
            )
    return None


def hydra_value(value: object) -> str:
    """``value`` as a hydra override writes it (strings with special characters quoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {hydra_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    if isinstance(value, str) and not _PLAIN.fullmatch(text):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def verl_launch(method: Method) -> VerlLaunch | str:
    """The launch of ``method`` on verl, or the reason it cannot run there."""
    trainer = "lopti" if method.lopti is not None else "nthr" if method.nthr is not None else "sync"
    problem = verl_method_problem(method, lopti_trainer=trainer == "lopti")
    if problem:
        return problem
    if method.dynamic_sampling.enabled:
        return "DAPO dynamic sampling has no tokenbalance verl preset (verl's DAPO recipe is its own trainer)"
    if method.advantage.estimator not in ("grpo", "reinforce_pp"):
        return f"advantage {method.advantage.estimator!r}: the K&K presets take ESTIMATOR=grpo or reinforce_pp"
    difference = _base_difference(method)
    if difference:
        return difference
    rule = method.token_rule
    if rule is not None:
        problem = verl_rule_problem(rule, lopti_trainer=trainer == "lopti", needs_spec=True)
        if problem:
            return problem
    name, changes = as_overrides(method)
    overrides = [
        f"+{POLICY_LOSS}.overrides.{key}={hydra_value(value)}"
        for key, value in changes.items()
        if key.partition(".")[0] not in VERL_OWNED  # the same as the K&K scripts' (checked above)
    ]
    if rule is not None and "entropy" in rule.needs:
        overrides.append(f"{CALCULATE_ENTROPY}=True")
    env = (("ESTIMATOR", method.advantage.estimator), ("METHOD", name), ("TRAINER", trainer))
    return VerlLaunch(SCRIPT, env, tuple(overrides), len(method.pass_names))


@dataclass(frozen=True)
class VerlCell(Cell):
    """One verl run of the grid: row ``method`` on ``model`` with seed ``seed``, launched by ``launch``."""

    model: str
    launch: VerlLaunch

    @property
    def name(self) -> str:
        return f"{self.method.key}-{self.model}-seed{self.seed}"


def verl_cells(
    rows: tuple[GridMethod, ...], seeds: tuple[int, ...], models: tuple[str, ...]
) -> tuple[list[VerlCell], list[tuple[GridMethod, str]]]:
    """The runnable cells (model-major, then seed, then row) and the rows verl cannot run, with why."""
    bad = [m for m in models if m not in VERL_MODELS]
    if bad:
        raise ValueError(f"--verl-models: unknown model {bad[0]!r}; valid: {', '.join(VERL_MODELS)}")
    launches = {row.key: verl_launch(get_method(row.preset)) for row in rows}
    unsupported = [(row, launches[row.key]) for row in rows if isinstance(launches[row.key], str)]
    cells = []
    for model in models:
        for seed in seeds:
            for row in rows:
                launch = launches[row.key]
                if isinstance(launch, VerlLaunch):
                    cells.append(VerlCell(row, seed, model, launch))
    return cells, [(row, str(reason)) for row, reason in unsupported]
