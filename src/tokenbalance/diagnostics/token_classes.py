"""Token statistics by class (decisions, copies, wording, format) for a task that has
:meth:`~tokenbalance.tasks.base.BaseTask.text_classes` (arith's working): each token's class, the profile by class and
bucket, and one update's change of log p by class, bucket and sign. docs/metrics.md ("Offline diagnostics")."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenbalance.diagnostics.buckets import bucket_masks, interval_label
from tokenbalance.diagnostics.edges import check_bucket_edges

SATURATED_P = 0.999


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds to the decoded prefix (a multi-byte character goes to the token that completes it),
    falling back to the token decoded alone when decoding is not prefix-stable."""
    pieces, previous = [], ""
    for i, token in enumerate(ids):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if text.startswith(previous) and not text.endswith("\ufffd"):
            pieces.append(text[len(previous) :])
            previous = text
        elif text.endswith("\ufffd") and i + 1 < len(ids):
            pieces.append("")  # an incomplete character: shown with the token that completes it
        else:
            pieces.append(tokenizer.decode([token], skip_special_tokens=False))
            previous = text
    return pieces


def piece_kinds(pieces: Sequence[str], char_kinds: Sequence[str], text: str, rest: str) -> list[str]:
    """The class of each token piece: that of its first non-space character in ``text`` (whose character classes are
    ``char_kinds``); spaces only, and pieces the text does not hold (special tokens), are ``rest``."""
    kinds, start = [], 0
    for piece in pieces:
        end = start + len(piece)
        if text[start:end] != piece:  # a special token the text does not hold
            kinds.append(rest)
            continue
        first = next((i for i in range(start, end) if not text[i].isspace()), None)
        kinds.append(rest if first is None else char_kinds[first])
        start = end
    return kinds


def token_classes(
    text_classes, tokenizer, response_ids_BT: torch.Tensor, mask_BT: torch.Tensor, classes: Sequence[str]
) -> torch.Tensor:
    """[B, T] int64: the index in ``classes`` of each valid response token's class, -1 elsewhere.
    ``text_classes(text)`` gives the class of each character of a decoded response; the last of ``classes`` is the
    rest (spaces, special tokens)."""
    class_BT = torch.full(response_ids_BT.shape, -1, dtype=torch.long)
    for row in range(response_ids_BT.shape[0]):
        valid = mask_BT[row].bool().cpu()
        ids = response_ids_BT[row].cpu()[valid].tolist()
        pieces = token_pieces(tokenizer, ids)
        text = "".join(pieces)
        kinds = piece_kinds(pieces, text_classes(text), text, classes[-1])
        positions = valid.nonzero().flatten().tolist()
        for position, kind in zip(positions, kinds):
            class_BT[row, position] = classes.index(kind)
    return class_BT


def class_profile(
    old_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    class_BT: torch.Tensor,
    classes: Sequence[str],
    decisions: Sequence[str],
    edges,
) -> dict:
    """Per class the tokens in each bucket of the old probability, and overall: the share of tokens below the first
    inner edge (``low_share``) and the share of those that are ``decisions``."""
    edges = check_bucket_edges(edges)
    masks = bucket_masks(old_logp_BT.cpu(), mask_BT.cpu(), edges)
    class_BT = class_BT.cpu()
    total = int(mask_BT.bool().sum())
    rows = []
    for index, name in enumerate(classes):
        of_class = class_BT == index
        counts = [int((m & of_class).sum()) for m in masks]
        rows.append({"class": name, "tokens": sum(counts), "buckets": counts})
    low = int(masks[0].sum())
    decision_index = [classes.index(name) for name in decisions]
    low_decisions = int((masks[0] & torch.isin(class_BT, torch.tensor(decision_index))).sum())
    return {
        "intervals": [interval_label(edges, b) for b in range(len(edges) - 1)],
        "tokens": total,
        "classes": rows,
        "low_share": low / total if total else float("nan"),
        "low_decision_share": low_decisions / low if low else float("nan"),
        "decision_classes": list(decisions),
    }


def logp_change_by_class(
    old_logp_BT: torch.Tensor,
    new_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    class_BT: torch.Tensor,
    classes: Sequence[str],
    edges,
    *,
    saturated: float = SATURATED_P,
) -> list[dict]:
    """Δ log p = new - old per (class, old-probability bucket, advantage sign), tokens with p > ``saturated`` in an
    interval "saturated": tokens, mean Δ log p and the share moved the advantage's way; NaN where a set is empty."""
    edges = check_bucket_edges(edges)
    old = old_logp_BT.detach().double().cpu()
    change_BT = new_logp_BT.detach().double().cpu() - old
    valid_BT = mask_BT.bool().cpu()
    saturated_BT = valid_BT & (old > torch.log(torch.tensor(saturated, dtype=torch.float64)))
    intervals = [
        (interval_label(edges, b), m & ~saturated_BT) for b, m in enumerate(bucket_masks(old, valid_BT, edges))
    ]
    intervals.append(("saturated", saturated_BT))
    adv_BT = advantages_BT.detach().cpu()
    rows = []
    for index, name in enumerate(classes):
        of_class = class_BT.cpu() == index
        for label, in_interval in intervals:
            for sign, signed in (("A>0", adv_BT > 0), ("A<0", adv_BT < 0)):
                change_N = change_BT[of_class & in_interval & signed]
                moved = change_N > 0 if sign == "A>0" else change_N < 0
                rows.append(
                    {
                        "class": name,
                        "interval": label,
                        "sign": sign,
                        "tokens": int(change_N.numel()),
                        "dlogp_mean": float(change_N.mean()) if change_N.numel() else float("nan"),
                        "right_way_frac": float(moved.double().mean()) if change_N.numel() else float("nan"),
                    }
                )
    return rows
