"""The same grid at paper scale on verl: how each row launches, and the cells (row x model x seed).

Each cell runs one of the AR-Lopti K&K launch presets of ``examples/verl/`` (Qwen2.5-3B/7B-Instruct,
3-7 people, 64 prompts x 8, lr 1e-6, 5 epochs, T 0.7: ``examples/verl/common.sh``, docs/verl.md)
with its row's own hyper-parameters from its method preset (AR alpha, Lopti eta, TR-GRPO's
weight, a token rule by its ``MODULE:RULE``); an NTHR row runs ``examples/verl/kk_nthr.sh`` (the
``tokenbalance_nthr`` trainer, the same shared settings) with its NTHR settings. A row verl cannot run
is returned with the reason (NTHR with Lopti: two trainers; a token rule that reads what verl's loss
does not get, :mod:`tokenbalance.integrations.verl_rules`). The RL steps of the local grid do not
apply: the paper's schedule is the scripts' 5 epochs.

The scripts a cluster runs are written by :mod:`.scripts`, the cost estimate is
:mod:`.cost`, the table from the cells' verl logs :mod:`.report`. Nothing here imports
verl or the verl integration (which needs verl): the grid is text, written on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from tokenbalance.ablate.grid import Cell, GridMethod
from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.nthr import NTHRConfig
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.presets import get_method
from tokenbalance.algorithms.weights import ARConfig
from tokenbalance.integrations.verl_names import LOPTI_TRAINER, NTHR_TRAINER
from tokenbalance.integrations.verl_rules import CALCULATE_ENTROPY, verl_rule_problem

VERL_MODELS = ("3b", "7b")
POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
SCRIPTS = {  # (AR on, Lopti on) -> the AR-Lopti K&K preset
    (False, False): "examples/verl/kk_baseline.sh",
    (True, False): "examples/verl/kk_ar.sh",
    (False, True): "examples/verl/kk_lopti.sh",
    (True, True): "examples/verl/kk_ar_lopti.sh",
}
NTHR_SCRIPT = "examples/verl/kk_nthr.sh"  # GRPO / REINFORCE++ + NTHR, the tokenbalance_nthr trainer
NTHR_SETTINGS = f"trainer.v1.{NTHR_TRAINER}"
_TR_GRPO_FIELDS = ("shape", "alpha", "tau", "mu", "lower", "upper", "prob_source", "placement")


@dataclass(frozen=True)
class VerlLaunch:
    """How a row launches on verl: the preset script, its environment and extra hydra overrides."""

    script: str
    env: tuple[tuple[str, str], ...]
    overrides: tuple[str, ...]
    update_passes: int = 1  # actor updates per RL step: 2 with Lopti (one per pass)


def _base_difference(method: Method) -> str | None:
    """Why ``method``'s shared stages differ from the K&K scripts' (None when they match)."""
    base = get_method("grpo")
    for name in ("clip", "kl", "entropy_coeff", "loss_agg_mode", "policy_loss_agg_mode", "max_response_len"):
        if getattr(method, name) != getattr(base, name):
            return (
                f"its {name} ({getattr(method, name)}) differs from the K&K scripts' ({getattr(base, name)}); "
                "launch it by hand with verl overrides (docs/verl.md)"
            )
    return None


def _non_default(config, default, skip: tuple[str, ...]) -> dict[str, object]:
    return {
        f.name: getattr(config, f.name)
        for f in fields(config)
        if f.name not in skip and getattr(config, f.name) != getattr(default, f.name)
    }


def verl_launch(method: Method) -> VerlLaunch | str:
    """The launch of ``method`` on verl, or the reason it cannot run there."""
    if method.nthr is not None and method.lopti is not None:
        return f"NTHR and Lopti are two verl trainers ({NTHR_TRAINER}, {LOPTI_TRAINER}); a launch runs one"
    if method.nthr is not None and method.ar is not None:
        return (
            f"NTHR with AR has no verl preset script; run {NTHR_SCRIPT} with "
            f"{POLICY_LOSS}.loss_mode=tokenbalance_ar +{POLICY_LOSS}.ar_alpha=... by hand"
        )
    if method.dynamic_sampling.enabled:
        return "DAPO dynamic sampling has no tokenbalance verl preset (verl's DAPO recipe is its own trainer)"
    if method.advantage.estimator not in ("grpo", "reinforce_pp"):
        return f"advantage {method.advantage.estimator!r}: the K&K presets take ESTIMATOR=grpo or reinforce_pp"
    difference = _base_difference(method)
    if difference:
        return difference
    env: dict[str, str] = {"ESTIMATOR": method.advantage.estimator}
    overrides: list[str] = []
    if method.ar is not None:
        env["ALPHA"] = repr(method.ar.alpha)
        for name, value in _non_default(method.ar, ARConfig(), ("alpha",)).items():
            overrides.append(f"+{POLICY_LOSS}.ar_{name}={value}")
    if method.lopti is not None:
        extra = _non_default(method.lopti, LoptiConfig(), ("eta", "order", "strict_less"))
        if extra:
            return f"Lopti {extra}: the verl Lopti trainer offers only eta, order and strict_less"
        env["ETA"] = repr(method.lopti.eta)
        for name, value in _non_default(method.lopti, LoptiConfig(), ("eta",)).items():
            overrides.append(f"+{POLICY_LOSS}.lopti_{name}={value}")
    if method.tr_grpo is not None:
        if method.tr_grpo.weight_kl:
            return "TR-GRPO's weighted KL (weight_kl) is not offered on verl (docs/verl.md)"
        mode = "tokenbalance_ar_tr_grpo" if method.ar is not None else "tokenbalance_tr_grpo"
        overrides.append(f"{POLICY_LOSS}.loss_mode={mode}")
        overrides += [f"+{POLICY_LOSS}.tr_grpo_{name}={getattr(method.tr_grpo, name)}" for name in _TR_GRPO_FIELDS]
    rule = method.token_rule
    if rule is not None:
        problem = verl_rule_problem(rule, lopti_trainer=method.lopti is not None, needs_spec=True)
        if problem:
            return problem
        overrides.append(f"+{POLICY_LOSS}.token_rule={rule.spec}")
        if "entropy" in rule.needs:
            overrides.append(f"{CALCULATE_ENTROPY}=True")
    if method.nthr is not None:
        overrides += [
            f"+{NTHR_SETTINGS}.{name}={value}" for name, value in _non_default(method.nthr, NTHRConfig(), ()).items()
        ]
    script = NTHR_SCRIPT if method.nthr is not None else SCRIPTS[(method.ar is not None, method.lopti is not None)]
    return VerlLaunch(script, tuple(env.items()), tuple(overrides), 2 if method.lopti is not None else 1)


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
