"""What each optional extra (pyproject.toml's ``[project.optional-dependencies]``) must install, in one table, read by
the commands' early checks (``build-model``, ``output.tensorboard`` / ``output.wandb``) and checked against
pyproject.toml by ``tests/test_extras.py``. Standard library only."""

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
    # the GPU set (constraints-gpu.txt): verl with its own vllm extra, which brings vLLM
    "vllm": ("verl",),
}

IMPORT_NAMES = {"TransferQueue": "transfer_queue"}  # a distribution imported under another name


def missing_package(extra: str) -> str | None:
    """The first distribution ``extra`` needs that cannot be imported here, or None."""
    for distribution in EXTRA_NEEDS[extra]:
        if importlib.util.find_spec(IMPORT_NAMES.get(distribution, distribution)) is None:
            return distribution
    return None
