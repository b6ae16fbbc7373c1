"""Launch verl's PPO trainer with tokenbalance registered and the config checked first.

Same command line as ``python -m verl.trainer.main_ppo``; our plugin is imported explicitly (verl's loader would
hide its errors), :func:`.validation.validate_launch` runs before Ray starts (a dry run adds verl's own
``validate_config``: :func:`.validation.verl_rejection`), hydra's run directory defaults to
``runs/verl/<date>/<time>`` (:func:`with_default_run_dir`), then verl's own ``main`` runs (docs/verl.md)::

    TOKENBALANCE_VERL_DRY_RUN=1 python -m tokenbalance.integrations.verl.main <overrides>  # check + print
"""

from __future__ import annotations

import os
import sys
import tempfile

from tokenbalance.run.cell_launch import override_key

DRY_RUN_ENV = "TOKENBALANCE_VERL_DRY_RUN"
RUN_DIR = "runs/verl/${now:%Y-%m-%d}/${now:%H-%M-%S}"  # hydra's default is outputs/<date>/<time>
DRY_WORDS, RUN_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
INSTALL = "pip install -e '.[verl]' && pip install 'verl[vllm]' (docs/verl.md)"


def dry_run_value(text: str | None) -> bool:
    """Whether ``text`` (the dry-run variable's value) asks for a dry run: 1/true/yes/on (any case);
    unset, empty, 0/false/no/off do not; ``ValueError`` for anything else (a typo never trains)."""
    word = (text or "").strip().lower()
    if word in DRY_WORDS or word in RUN_WORDS:
        return word in DRY_WORDS
    raise ValueError(
        f"{DRY_RUN_ENV}={text!r} (from DRY_RUN): not a yes/no value; 1/true/yes is a dry run, 0/false/no or unset "
        "trains; nothing started"
    )


def is_dry_run() -> bool:
    return dry_run_value(os.environ.get(DRY_RUN_ENV))


def with_default_run_dir(overrides: list[str], dry_run: bool) -> list[str]:
    """``overrides`` plus our default ``hydra.run.dir`` unless the user set one.

    A real run writes hydra's log and composed config to :data:`RUN_DIR`; a dry run to a fresh
    temporary directory, without the ``.hydra`` config copy, so nothing appears in the
    current directory.
    """
    if any(override_key(override) == "hydra.run.dir" for override in overrides):  # set, forced or deleted
        return list(overrides)
    if not dry_run:
        return [*overrides, f"hydra.run.dir={RUN_DIR}"]
    scratch = tempfile.mkdtemp(prefix="tokenbalance-verl-dry-run-")
    return [*overrides, f"hydra.run.dir={scratch}", "hydra.output_subdir=null"]


def main(config) -> None:
    """Validate ``config`` for tokenbalance, then run verl's ``main_ppo.main`` on it.

    With ``TOKENBALANCE_VERL_DRY_RUN=1`` only validate (ours, then verl's own ``validate_config``: a
    rejection is one line and exit status 2) and print the composed config and the method.
    """
    from verl.trainer import main_ppo

    from tokenbalance.integrations.verl.validation import VERL_REJECTS, launch_method, validate_launch, verl_rejection

    validate_launch(config)
    if is_dry_run():
        from omegaconf import OmegaConf

        problem = verl_rejection(config)  # main_ppo's own check, which a dry run stops before
        if problem:
            print(VERL_REJECTS.format(problem), file=sys.stderr)
            sys.exit(2)

        from tokenbalance.algorithms.describe import stage_summary

        print(OmegaConf.to_yaml(config))
        method = launch_method(config)
        if method is not None:
            print(f"tokenbalance: the method verl's workers run: {method.name}")
            print("\n".join(f"    {line}" for line in stage_summary(method)))
        print("tokenbalance: config valid (dry run, nothing launched)")
        return
    main_ppo.main.__wrapped__(config)


def launch(argv: list[str]) -> int:
    """The command line: the dry-run setting and the imports (hydra, verl, our plugin) checked first,
    each failure one line on stderr and status 2, then hydra composes the config and :func:`main` runs."""
    try:
        dry_run = is_dry_run()
    except ValueError as err:
        print(f"tokenbalance verl: error: {err}", file=sys.stderr)
        return 2
    try:
        import hydra

        import tokenbalance.integrations.verl.plugin  # noqa: F401  (registers; raises on a bad verl)
    except ImportError as err:
        missing = err.name or "verl"
        print(f"tokenbalance verl: error: cannot import {missing} ({err}); install verl: {INSTALL}", file=sys.stderr)
        return 2
    sys.argv[1:] = with_default_run_dir(argv, dry_run=dry_run)
    hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)(main)()
    return 0


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
