"""The run config of each cell and its start policy: every cell of seed s starts from the same policy (``model.path``,
else the embedded one built with seed s) and trains with seed s, so a seed's cells differ only in the method
(docs/ablate.md, "Pairing by seed"; restarts: :func:`tokenbalance.run.plan.cell_action`)."""

from __future__ import annotations

from pathlib import Path

from tokenbalance.ablate.grid import Cell, GridPlan
from tokenbalance.config import RunConfig, apply_overrides, load_config, replace_sections
from tokenbalance.run.setup import RunSetup


def base_config(
    plan: GridPlan, *, config_path: str | None = None, model: str | None = None, device: str | None = None
) -> RunConfig:
    """The settings every cell shares: ``--config`` (or the defaults), the preset's overrides, ``--model`` /
    ``--device``, then ``--set``. ``method.*`` overrides are refused: every row trains with its own preset's published
    hyper-parameters."""
    config = load_config(config_path) if config_path else RunConfig()
    shorthand = ([f"model.path={Path(model).resolve()}"] if model else []) + (
        [f"train.device={device}"] if device else []
    )
    config = apply_overrides(config, [*plan.preset.overrides, *shorthand, *plan.overrides])
    if config.train.method_overrides:
        raise ValueError(
            f"method overrides {config.train.method_overrides}: a grid trains every row with its preset's "
            "published hyper-parameters; define a method preset (or a row) instead"
        )
    if config.model.path is not None:
        config.model.path = str(Path(config.model.path).resolve())
    return config


def cell_config(
    base: RunConfig, cell: Cell, *, steps: int, policy: str, run_dir: Path, start_evals: Path | None = None
) -> RunConfig:
    """The run config of ``cell``: the shared settings with its method, seed, steps, start policy and run directory;
    ``start_evals``: where the cells share their start policy's step-0 evaluation (``train.start_eval_cache``)."""
    shared = {"start_eval_cache": str(start_evals.resolve())} if start_evals is not None else {}
    return replace_sections(
        base,
        train={"method": cell.method.preset, "seed": cell.seed, "steps": steps, **shared},
        model={"path": policy},
        output={"run_dir": str(run_dir.resolve()), "progress": False},
    )


def start_policy(base: RunConfig, seed: int, *, log=print, progress: bool = True, setup: RunSetup | None = None) -> str:
    """Seed ``seed``'s start policy: ``model.path``, or the embedded policy SFT-trained with that seed (built on first
    use, then reused from ``model.cache_dir``; from ``base``'s ``setup``: its task and SFT pairs, which no seed
    changes)."""
    if base.model.path is not None:
        return base.model.path
    from tokenbalance.trainer.embedded import ensure_embedded_policy
    from tokenbalance.trainer.runner import compute_device

    config = replace_sections(base, train={"seed": seed})
    device = compute_device(config)
    task, pairs = (setup.task, setup.sft_pairs) if setup is not None else (None, None)
    path = ensure_embedded_policy(config, device=device, progress=progress, log=log, task=task, pairs=pairs)
    return str(Path(path).resolve())
