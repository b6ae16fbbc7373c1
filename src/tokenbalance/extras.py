"""What each optional extra (pyproject.toml's ``[project.optional-dependencies]``) must install: the distributions its
commands import, in one table. The commands' early checks read it (``build-model``: :func:`missing_package` before the
download; ``train``'s ``output.tensorboard`` / ``output.wandb`` before the model loads), and ``tests/test_extras.py``
fails when an extra of pyproject.toml declares fewer. Standard library only, so every layer may import it."""

from __future__ import annotations

import importlib.util

EXTRA_NEEDS: dict[str, tuple[str, ...]] = {
    # build-model: transformers reads GGUF files with gguf and loads the model with accelerate
    "gguf": ("gguf", "accelerate"),
    "tensorboard": ("tensorboard",),  # output.tensorboard
    "wandb": ("wandb",),  # output.wandb
    # the TRL integration, and accelerate: TRL's launcher (`accelerate launch`)
    "trl": ("trl", "accelerate"),
    # the verl integration; verl's v1 trainer (the Lopti trainer's registry) also imports the other four, which verl
    # itself does not declare
    "verl": ("verl", "TransferQueue", "cachetools", "fastapi", "uvicorn"),
}

IMPORT_NAMES = {"TransferQueue": "transfer_queue"}  # a distribution imported under another name


def missing_package(extra: str) -> str | None:
    """The first distribution ``extra`` needs that cannot be imported here, or None."""
    for distribution in EXTRA_NEEDS[extra]:
        if importlib.util.find_spec(IMPORT_NAMES.get(distribution, distribution)) is None:
            return distribution
    return None
