"""Launch verl's PPO trainer with tokenbalance registered and the config checked first.

Same command line as ``python -m verl.trainer.main_ppo`` (verl's hydra config, the same
overrides); the only additions are: our plugin is imported explicitly (so an unsupported verl or
a broken install is reported instead of being swallowed by verl's plugin loader), and
:func:`.validation.validate_launch` runs on the composed config before Ray starts (NTHR,
unknown names, Lopti without its trainer, ... are rejected with the reason). Then verl's own
``main`` runs unchanged. Commands (docs/verl.md)::

    TOKENBALANCE_VERL_DRY_RUN=1 python -m tokenbalance.integrations.verl.main <overrides>  # check + print
    bash examples/verl/kk_ar_lopti.sh                                        # 4 GPUs, AR + Lopti
"""

from __future__ import annotations

import os

import hydra

import tokenbalance.integrations.verl.plugin  # noqa: F401  (registers; raises on a bad verl)
from tokenbalance.integrations.verl.validation import validate_launch


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    """Validate ``config`` for tokenbalance, then run verl's ``main_ppo.main`` on it.

    With ``TOKENBALANCE_VERL_DRY_RUN=1`` only validate and print the composed config.
    """
    from verl.trainer import main_ppo

    validate_launch(config)
    if os.environ.get("TOKENBALANCE_VERL_DRY_RUN") == "1":
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(config))
        print("tokenbalance: config valid (dry run, nothing launched)")
        return
    main_ppo.main.__wrapped__(config)


if __name__ == "__main__":
    main()
