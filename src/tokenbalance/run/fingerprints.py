"""A run's fingerprints (``fingerprints.json``: written when the run starts, kept in its grid record): digests of what
must agree for two runs to be compared as a pair (the start policy's weights and tokenizer, the prompt stream it
trains on, the evaluation set), with the tokenbalance version and git commit that ran it. A grid's report pairs two
cells only when :data:`PAIRING_KEYS` agree (:func:`pairing_mismatch`); a resume refuses another start policy.
docs/ablate.md ("Pairing by fingerprint")."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenbalance.outputs import write_text_atomic

FINGERPRINTS_FILE = "fingerprints.json"
if TYPE_CHECKING:
    import torch

PAIRING_KEYS = ("start_policy", "prompt_order", "eval_set")
PAIRING_NAMES = {"start_policy": "start policy", "prompt_order": "prompt order", "eval_set": "evaluation set"}


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def policy_digest(model: torch.nn.Module) -> str:
    """A digest of a model's weights and buffers (names, dtypes, shapes, bytes) and of its config when it has one: two
    models with the same digest generate the same tokens from the same prompts and settings."""
    import torch

    digest = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        digest.update(config.to_json_string(use_diff=False).encode())
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}\n".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """A digest of what a tokenizer maps text to: its vocabulary, special tokens and chat template."""
    return _sha256_json(
        {
            "vocab": sorted(tokenizer.get_vocab().items()),
            "special": getattr(tokenizer, "special_tokens_map", {}),
            "chat_template": getattr(tokenizer, "chat_template", None),
        }
    )


def start_policy_fingerprint(model: torch.nn.Module, tokenizer) -> str:
    """The start policy's fingerprint: its weights' and its tokenizer's digests, together."""
    return _sha256_json([policy_digest(model), tokenizer_digest(tokenizer)])


def prompt_order_fingerprint(ordered_prompt_ids: Sequence[Sequence[int]]) -> str:
    """The prompt stream's fingerprint: the token ids of the training prompts in the order the run draws them."""
    return _sha256_json([list(ids) for ids in ordered_prompt_ids])


def eval_set_fingerprint(prompt_ids: Sequence[Sequence[int]], ground_truths: Sequence[Any]) -> str:
    """The evaluation set's fingerprint: each held-out prompt's token ids and what its answers are scored against."""
    return _sha256_json([[list(ids), truth] for ids, truth in zip(prompt_ids, ground_truths, strict=True)])


def source_commit() -> str | None:
    """The git commit of the tokenbalance source this process runs (None outside a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def write_fingerprints(run_dir: Path, fingerprints: dict[str, Any]) -> None:
    write_text_atomic(Path(run_dir) / FINGERPRINTS_FILE, json.dumps(fingerprints, indent=1, sort_keys=True) + "\n")


def read_fingerprints(run_dir: Path) -> dict[str, Any] | None:
    """The run's fingerprints; None when it has none (a run of older code). A damaged file: ``ValueError`` naming it."""
    path = Path(run_dir) / FINGERPRINTS_FILE
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a fingerprints file ({err})") from None
    if not isinstance(found, dict) or not all(isinstance(found.get(k), str) for k in PAIRING_KEYS):
        raise ValueError(f"{path}: not a fingerprints file (it lacks {', '.join(PAIRING_KEYS)})")
    return found


def pairing_mismatch(first: dict[str, Any] | None, second: dict[str, Any] | None) -> str | None:
    """Why two runs with these fingerprints are not a pair (None when every :data:`PAIRING_KEYS` digest agrees): a
    missing fingerprint, or the first digest that differs, both shown by their first 12 hex digits."""
    if first is None or second is None:
        which = "either" if first is None and second is None else ("the first" if first is None else "the second")
        return f"no fingerprints in {which} (a record of older code)"
    for key in PAIRING_KEYS:
        if first.get(key) != second.get(key):
            return f"{PAIRING_NAMES[key]} differs ({str(first.get(key))[:12]} vs {str(second.get(key))[:12]})"
    return None
