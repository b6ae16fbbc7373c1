"""Save and load a policy (causal LM + tokenizer) in Hugging Face format, local directories only.

    save_policy(model, tokenizer, "runs/tiny/policy")             # atomic: temp dir + rename
    model, tokenizer = load_policy("/models/Qwen2.5-3B", device="cuda", dtype=torch.bfloat16)

Never a hub id, never unpickle (unless ``allow_pickle=True``), no remote code, our tokenizer as the generic fast
tokenizer it was saved as, every problem one ``ValueError`` up front. docs/training.md ("Models")."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from tokenbalance.models.tokenizer import REASONING_TAGS
from tokenbalance.outputs import umask_modes

CONFIG_FILE = "config.json"
SAFETENSORS_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
PICKLE_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` to ``path`` atomically (a temporary directory renamed into
    place; an old ``path`` renamed away first and deleted last, or left as ``.<name>.old-*`` by a crash). Returns
    ``path``."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{target} exists and is not a directory; refusing to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        umask_modes(staging)
        replace_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def replace_directory(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``; an existing ``target`` is renamed away first, then deleted."""
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, old / target.name)  # rename into a fresh dir: the name cannot collide
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old / target.name, target)  # put the old policy back
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_policy_dir(path: str | os.PathLike, *, allow_pickle: bool = False) -> Path:
    """``path`` as a ``Path`` if it looks like a loadable local policy directory; ``ValueError`` naming the first
    missing piece otherwise (see :func:`load_policy`)."""
    directory = Path(path)
    if not directory.is_dir():
        hint = ""
        if not directory.exists() and not directory.is_absolute() and str(path).count("/") == 1:
            hint = (
                f" ({str(path)!r} looks like a hub id: download it first, e.g. "
                f"`hf download {path} --local-dir DIR`, and pass DIR)"
            )
        raise ValueError(
            f"policy path {str(path)!r} must be a local directory (it does not exist or is not a "
            f"directory); downloads from the Hugging Face hub are not supported here{hint}"
        )
    if not (directory / CONFIG_FILE).is_file():
        raise ValueError(f"{directory}: missing {CONFIG_FILE} (not a Hugging Face model directory)")
    has_safetensors = any(any(directory.glob(pattern)) for pattern in SAFETENSORS_PATTERNS)
    has_pickle = any((directory / name).is_file() for name in PICKLE_WEIGHT_FILES)
    if not has_safetensors and not has_pickle:
        raise ValueError(f"{directory}: missing weights (no *.safetensors or pytorch_model.bin)")
    if not has_safetensors and not allow_pickle:
        raise ValueError(
            f"{directory}: only pickle weights (pytorch_model.bin) found; refusing to unpickle them. "
            "Convert them to safetensors, or pass allow_pickle=True for a directory you trust"
        )
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{directory}: missing tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    return directory


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, where: object = "tokenizer") -> None:
    """``ValueError`` if ``tokenizer`` has no pad or no eos token."""
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"{where}: the tokenizer has no pad token; add one to its tokenizer_config.json (e.g. "
            '"pad_token": the eos token\'s text), or from Python pass load_policy(..., pad_token=...)'
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{where}: the tokenizer has no eos token; set tokenizer.eos_token")


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``directory``, of the class its ``tokenizer_config.json`` declares when that is a
    generic fast tokenizer (see the module docstring), else ``AutoTokenizer``'s."""
    config_file = directory / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in GENERIC_TOKENIZER_CLASSES and (directory / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)


def load_checked_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """:func:`load_tokenizer` with any failure reported as a ``ValueError`` naming ``directory``."""
    try:
        return load_tokenizer(directory)
    except Exception as err:  # noqa: BLE001 - any failure here is the files' (tokenizers raises its own types)
        raise ValueError(
            f"{directory}: cannot load the tokenizer ({_first_line(err)}); its tokenizer files are damaged or "
            "of an unknown format"
        ) from None


def load_policy(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str | None = None,
    pad_token: str | None = None,
    allow_pickle: bool = False,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` in eval mode from a local Hugging Face directory; ``ValueError`` for every problem.

    Args:
        path: a directory with ``config.json``, ``*.safetensors`` weights and tokenizer files.
        dtype: parameter dtype; ``None`` = ``config.json``'s (bfloat16 for Qwen2.5, float32 for ours); pass
            ``torch.float32`` for fp32 master weights.
        attn_implementation: ``"sdpa"``, ``"eager"``, ``"flash_attention_2"``, ...; ``None``: transformers' choice.
        pad_token: sets ``tokenizer.pad_token`` (``model.config.pad_token_id`` follows when unset).
        allow_pickle: also accept ``pytorch_model.bin``-only directories (unpickles them).
        tokenizer: the tokenizer already loaded from ``path``."""
    directory = check_policy_dir(path, allow_pickle=allow_pickle)
    try:
        json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{directory / CONFIG_FILE}: not a valid JSON file ({err}); the model directory is damaged"
        ) from None
    if tokenizer is None:
        tokenizer = load_checked_tokenizer(directory)
    if pad_token is not None:
        tokenizer.pad_token = pad_token
    check_tokenizer(tokenizer, directory)
    has_safetensors = any(any(directory.glob(pattern)) for pattern in SAFETENSORS_PATTERNS)
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            directory,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=has_safetensors,
            dtype=dtype,
            attn_implementation=attn_implementation,
            output_loading_info=True,
        )
        model, info = loaded
    except Exception as err:  # noqa: BLE001 - a damaged or mismatched file; safetensors has its own error type
        weights = ", ".join(sorted(p.name for pattern in SAFETENSORS_PATTERNS for p in directory.glob(pattern)))
        raise ValueError(
            f"{directory}: cannot load the model ({_first_line(err)}); the weights ({weights or 'pytorch_model.bin'}) "
            f"are damaged or do not match {CONFIG_FILE}"
        ) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ValueError(
            f"{directory}: the weights lack {len(missing)} tensor(s) that {CONFIG_FILE} asks for (e.g. {missing[0]}); "
            "they would be initialised at random. The weights and the config do not belong together"
        )
    embedding_rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > embedding_rows:
        raise ValueError(
            f"{directory}: the tokenizer has {len(tokenizer)} tokens but the model's embedding only "
            f"{embedding_rows} rows; tokenizer and weights do not belong together"
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def check_special_tokens(
    tokenizer: PreTrainedTokenizerBase,
    required: Iterable[str] = REASONING_TAGS,
    *,
    single_token: bool = False,
) -> dict[str, list[int]]:
    """The ids of each ``required`` tag after checking it survives encode -> decode, alone and inside text (no added
    or skipped special tokens); ``single_token=True`` also requires one token each. ``ValueError`` naming every
    failing tag."""
    ids_by_tag: dict[str, list[int]] = {}
    broken, split = [], []
    for tag in required:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        ids_by_tag[tag] = ids
        for text in (tag, f"a{tag} b"):
            decoded = tokenizer.decode(
                tokenizer.encode(text, add_special_tokens=False),
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            if decoded != text:
                broken.append(tag)
                break
        if len(ids) != 1:
            split.append(tag)
    if broken:
        raise ValueError(f"tokenizer does not round-trip these tags: {', '.join(broken)}")
    if single_token and split:
        raise ValueError(f"these tags are not single tokens: {', '.join(split)}")
    return ids_by_tag
