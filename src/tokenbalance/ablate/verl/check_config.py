"""verl's own ``validate_config`` on the config a launch composes, for a dry run (``DRY_RUN=1``).

``python -m tokenbalance.ablate.verl.check_config OVERRIDES...`` composes verl's ``ppo_trainer``
config with the launch's overrides (hydra's compose API; ``hydra.*`` keys and ``hydra/`` groups left out) and runs
``verl.utils.config.validate_config`` as ``verl.trainer.main_ppo`` does before it starts Ray: batch
sizes against GPUs and mini-batches, micro-batch settings, the critic. A rejected config is one line
and exit status 2. ``examples/verl/common.sh`` runs it before the launcher's own dry run, whose
``config valid`` would otherwise not cover verl's checks. docs/verl.md "The grid at paper scale".
"""

from __future__ import annotations

import sys

from tokenbalance.run.cell_launch import is_hydra_key, override_key


def verl_config_problem(overrides: list[str]) -> str | None:
    """Why verl's ``validate_config`` rejects the config ``overrides`` compose; None when it accepts it."""
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    import tokenbalance.integrations.verl.plugin  # noqa: F401  (our config classes, as in a launch)

    kept = [word for word in overrides if not is_hydra_key(override_key(word))]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=kept)
    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except (AssertionError, ValueError, TypeError) as err:
        return " ".join(str(err).split()) or type(err).__name__
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        problem = verl_config_problem(list(sys.argv[1:] if argv is None else argv))
    except ImportError as err:
        print(
            f"tokenbalance verl: error: cannot import {err.name or 'verl'} ({err}); install verl: "
            "pip install -e '.[verl]' && pip install 'verl[vllm]' (docs/verl.md)",
            file=sys.stderr,
        )
        return 2
    if problem:
        print(f"verl's validate_config rejects this config: {problem}; nothing launched", file=sys.stderr)
        return 2
    print("verl's validate_config: config valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
