"""verl's own ``validate_config`` on the config a list of overrides composes, without the launcher.

``python -m tokenbalance.ablate.verl.check_config OVERRIDES...`` composes verl's ``ppo_trainer``
config with the overrides (hydra's compose API; ``hydra.*`` keys and ``hydra/`` groups left out) and
runs :func:`tokenbalance.integrations.verl.validation.verl_rejection` on it, the check the launcher's
dry run (``DRY_RUN=1``) runs too. A rejected config is one line and exit status 2. docs/verl.md "The
grid at paper scale".
"""

from __future__ import annotations

import sys

from tokenbalance.run.cell_launch import is_hydra_key, override_key


def composed_config(overrides: list[str]):
    """verl's ``ppo_trainer`` config as ``overrides`` compose it (``hydra.*`` keys and ``hydra/`` groups left out)."""
    from hydra import compose, initialize_config_module

    import tokenbalance.integrations.verl.plugin  # noqa: F401  (our config classes, as in a launch)

    kept = [word for word in overrides if not is_hydra_key(override_key(word))]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=kept)


def verl_config_problem(overrides: list[str]) -> str | None:
    """Why verl's ``validate_config`` rejects the config ``overrides`` compose; None when it accepts it."""
    from tokenbalance.integrations.verl.validation import verl_rejection

    return verl_rejection(composed_config(overrides))


def main(argv: list[str] | None = None) -> int:
    from tokenbalance.integrations.verl.main import INSTALL
    from tokenbalance.integrations.verl.validation import VERL_REJECTS

    try:
        problem = verl_config_problem(list(sys.argv[1:] if argv is None else argv))
    except ImportError as err:
        print(
            f"tokenbalance verl: error: cannot import {err.name or 'verl'} ({err}); install verl: {INSTALL}",
            file=sys.stderr,
        )
        return 2
    if problem:
        print(VERL_REJECTS.format(problem), file=sys.stderr)
        return 2
    print("verl's validate_config: config valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
