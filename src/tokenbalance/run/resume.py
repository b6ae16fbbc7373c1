"""The settings a new sitting of a run may change (length, how it runs and reports), the same for ``train --resume``
and the grid's cells; anything else would be another experiment than its checkpoints'. docs/reliability.md."""

from __future__ import annotations

import copy

from tokenbalance.config import RunConfig, absolute_paths, to_dict

RESUMABLE_KEYS = (
    "train.steps",
    "train.eval_every",
    "train.start_eval_cache",
    "train.save_every",
    "train.keep_checkpoints",
    "train.device",
    "train.threads",
    "sft.save_every",
    "output.run_dir",
    "output.progress",
    "output.tensorboard",
    "output.wandb",
    "output.wandb_project",
    "output.wandb_entity",
    "output.wandb_name",
    "output.wandb_mode",
)


def changed_setting(saved: RunConfig, planned: RunConfig) -> tuple[str, object, object] | None:
    """The first setting outside :data:`RESUMABLE_KEYS` whose value differs, as (key, saved value, planned value);
    None when a new sitting may continue the run. Paths compare as absolute paths (a run saves its config with
    absolute paths)."""
    before = to_dict(absolute_paths(copy.deepcopy(saved)))
    after = to_dict(absolute_paths(copy.deepcopy(planned)))
    for section, values in after.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            if name not in RESUMABLE_KEYS and before[section].get(key) != value:
                return name, before[section].get(key), value
    return None
