"""The same grid at paper scale on verl: one launch script for every row x model x seed.

``tokenbalance ablate --runner verl`` writes ``OUT/verl/run_grid.sh``, which runs each cell with
the AR-Lopti K&K launch presets of ``examples/verl/`` (Qwen2.5-3B/7B-Instruct, 3-7 people, 64
prompts x 8, lr 1e-6, 5 epochs, T 0.7: ``examples/verl/common.sh``, docs/verl.md) and each row's
own hyper-parameters from its method preset (AR alpha, Lopti eta, TR-GRPO's weight), one cell after
another. Resumable like the local grid: a cell whose ``DONE`` file exists is skipped, a started
one resumes from its last verl checkpoint (``trainer.resume_mode=auto``, checkpoints in the
cell's directory). Each cell's verl metrics go to ``OUT/verl/<cell>/verl_metrics.jsonl`` (verl's
file logger; ``LOGGER`` changes the loggers).

A row a runner cannot run is listed with the reason (NTHR: verl gives the loss no hidden states,
:data:`tokenbalance.integrations.verl_names.NTHR_UNSUPPORTED`). The RL steps of the local grid do
not apply: the paper's schedule is the scripts' 5 epochs.

Nothing here imports verl or the verl integration (which needs verl): the script is text, written
on any machine; ``DRY_RUN=1`` checks every cell's composed config
through our launcher before anything starts.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields

from tokenbalance.ablate.grid import GridMethod
from tokenbalance.algorithms.methods import Method, get_method
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.weights import ARConfig
from tokenbalance.integrations.verl_names import NTHR_UNSUPPORTED

VERL_MODELS = ("3b", "7b")
POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
SCRIPTS = {  # (AR on, Lopti on) -> the AR-Lopti K&K preset
    (False, False): "examples/verl/kk_baseline.sh",
    (True, False): "examples/verl/kk_ar.sh",
    (False, True): "examples/verl/kk_lopti.sh",
    (True, True): "examples/verl/kk_ar_lopti.sh",
}
_TR_GRPO_FIELDS = ("shape", "alpha", "tau", "mu", "lower", "upper", "prob_source", "placement")


@dataclass(frozen=True)
class VerlLaunch:
    """How a row launches on verl: the preset script, its environment and extra hydra overrides."""

    script: str
    env: tuple[tuple[str, str], ...]
    overrides: tuple[str, ...]


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
    if method.nthr is not None:
        return NTHR_UNSUPPORTED
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
    script = SCRIPTS[(method.ar is not None, method.lopti is not None)]
    return VerlLaunch(script, tuple(env.items()), tuple(overrides))


@dataclass(frozen=True)
class VerlCell:
    row: GridMethod
    model: str
    seed: int
    launch: VerlLaunch

    @property
    def name(self) -> str:
        return f"{self.row.key}-{self.model}-seed{self.seed}"

    def command(self) -> str:
        """The cell's line in the script: ``run_cell NAME SEED env K=V... bash SCRIPT overrides...``."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (("MODEL", self.model), *self.launch.env))
        extra = " ".join(shlex.quote(o) for o in self.launch.overrides)
        return f"run_cell {self.name} {self.seed} env {env} bash {self.launch.script}" + (f" {extra}" if extra else "")


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
                    cells.append(VerlCell(row, model, seed, launch))
    return cells, [(row, str(reason)) for row, reason in unsupported]


SCRIPT_HEAD = """#!/usr/bin/env bash
# tokenbalance ablate --runner verl: grid {preset} at paper scale (AR-Lopti K&K setting, verl).
# Written by: {command}
# Rows: {rows}. Models: {models}. Seeds: {seeds}. {count} cells.
#
# On a GPU node (1 x 4 x 80 GB per cell, as the AR-Lopti scripts), from the repository root:
#   pip install -e '.[verl]' && pip install 'verl[vllm]'
#   bash examples/verl/prepare_kk_data.sh data/kk
#   DRY_RUN=1 bash {script}      # compose and validate every cell's config, launch nothing
#   bash {script}                # run the grid; run it again after an interruption to continue
# Environment: OUT (default {out}), LOGGER (default [console,file]), and those of
# examples/verl/common.sh (MODEL_PATH, DATA_DIR, N_GPUS). Each cell: the preset script with the row's
# hyper-parameters from its method preset (tokenbalance list-methods), then the seed and the cell's
# directories (hydra overrides given later win). The schedule is the scripts' (5 epochs, validation
# every 20 steps on 3-7 people); the local grid's RL steps do not apply.
#
# Not run on verl:
{unsupported}
set -euo pipefail
DEFAULT_OUT={out_quoted}
OUT="${{OUT:-$DEFAULT_OUT}}"
LOGGER="${{LOGGER:-[console,file]}}"

# run_cell NAME SEED COMMAND...: skip a finished cell, else run (verl resumes its checkpoints) and mark it done
run_cell() {{
  local name="$1" seed="$2"; shift 2
  local dir="$OUT/$name"
  if [[ -f "$dir/DONE" ]]; then echo "== $name: done, skipped"; return 0; fi
  echo "== $name"
  if [[ "${{DRY_RUN:-0}}" == "1" ]]; then
    "$@" "trainer.experiment_name=$name" "data.seed=$seed" "actor_rollout_ref.rollout.seed=$seed"
    return 0
  fi
  mkdir -p "$dir"
  VERL_FILE_LOGGER_PATH="$dir/verl_metrics.jsonl" "$@" "trainer.experiment_name=$name" \\
    "data.seed=$seed" "actor_rollout_ref.rollout.seed=$seed" "trainer.default_local_dir=$dir/checkpoints" \\
    "trainer.resume_mode=auto" "trainer.logger=$LOGGER" "hydra.run.dir=$dir/hydra" 2>&1 | tee -a "$dir/train.log"
  touch "$dir/DONE"
}}

"""


def comment_safe(text: str) -> str:
    """``text`` for a ``#`` comment line of the script: line breaks shown as ``\\n`` (a newline in a
    path would otherwise end the comment and run the rest as shell code)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def grid_script(
    preset: str,
    rows: tuple[GridMethod, ...],
    seeds: tuple[int, ...],
    models: tuple[str, ...],
    *,
    out: str,
    script_path: str,
    command: str,
) -> str:
    """The text of ``run_grid.sh`` for the grid."""
    cells, unsupported = verl_cells(rows, seeds, models)
    if not cells:
        raise ValueError(
            f"--runner verl: no cell to run ({'; '.join(f'{row.label}: {why}' for row, why in unsupported)})"
        )
    head = SCRIPT_HEAD.format(
        preset=comment_safe(repr(preset)),
        command=comment_safe(command),
        rows=", ".join(f"{r.label} ({r.preset})" for r in rows),
        models=", ".join(models),
        seeds=", ".join(map(str, seeds)),
        count=len(cells),
        script=comment_safe(shlex.quote(script_path)),
        out=comment_safe(out),
        out_quoted=shlex.quote(out),
        unsupported="\n".join(f"#   {row.label} ({row.preset}): {reason}" for row, reason in unsupported)
        or "#   (every row runs)",
    )
    return head + "\n".join(cell.command() for cell in cells) + "\n"
