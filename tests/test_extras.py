"""Every optional extra of pyproject.toml installs what its commands import (tokenbalance.extras,
the one table the commands' early checks read): an extra that forgets one fails here."""

import re
from pathlib import Path

import pytest

from tokenbalance.extras import EXTRA_NEEDS, IMPORT_NAMES, missing_package

tomllib = pytest.importorskip("tomllib")  # the standard library from Python 3.11
PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"


def normalised(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(requirement: str) -> str:
    """The distribution of a requirement string: ``"trl>=1.15,<1.17"`` -> ``"trl"``."""
    return normalised(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def extras() -> dict[str, set[str]]:
    table = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {extra: {declared(r) for r in requirements} for extra, requirements in table.items()}


@pytest.mark.parametrize("extra", sorted(EXTRA_NEEDS))
def test_each_extra_declares_what_its_commands_import(extra):
    assert extra in extras(), f"pyproject.toml has no extra {extra!r}"
    assert {normalised(d) for d in EXTRA_NEEDS[extra]} - extras()[extra] == set()


def test_the_table_covers_every_extra_but_dev():
    assert set(extras()) - {"dev"} == set(EXTRA_NEEDS)
    assert extras()["gguf"] == {"gguf", "accelerate"} and extras()["trl"] >= {"trl", "accelerate"}


def test_a_forgotten_distribution_is_caught():
    pretend = {**extras(), "gguf": {"gguf"}}  # the gguf extra before accelerate was added (issue 39)
    assert {normalised(d) for d in EXTRA_NEEDS["gguf"]} - pretend["gguf"] == {"accelerate"}
    assert declared("TransferQueue>=0.1.11,<0.2") == "transferqueue" and declared("ruff>=0.17,<0.18") == "ruff"


def test_missing_package_names_the_first_one_not_importable(monkeypatch):
    import importlib.util

    absent = {"accelerate", IMPORT_NAMES["TransferQueue"]}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else object())
    assert missing_package("gguf") == "accelerate"
    assert missing_package("verl") == "TransferQueue"
    assert missing_package("wandb") is None


@pytest.mark.parametrize("extra", ["tensorboard", "wandb"])
def test_train_names_a_missing_reporting_package_before_work(extra, monkeypatch):
    import dataclasses
    import importlib.util

    from tokenbalance.config import RunConfig
    from tokenbalance.run.setup import prepare

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == extra else real(name, *a))
    config = RunConfig()
    config.output = dataclasses.replace(config.output, **{extra: True})
    with pytest.raises(ValueError, match=rf"^output.{extra}=true needs the {extra} package: pip install {extra}$"):
        prepare(config)
