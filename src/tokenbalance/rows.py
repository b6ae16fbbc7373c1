"""Finding repeated rows: a GRPO batch holds each prompt G times, and its work can be shared."""

from __future__ import annotations

import torch


def distinct_rows(key_BK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first_U, inverse_B)`` for the distinct rows of ``key_BK`` ([B, K] integers).

    ``first_U`` [U] is the first row index holding each distinct row (ascending by row content),
    ``inverse_B`` [B] the index of every row's content among them, so ``key_BK[first_U][inverse_B]``
    equals ``key_BK``. ``None`` when all rows are distinct (nothing to share).
    """
    distinct_UK, inverse_B = torch.unique(key_BK, dim=0, return_inverse=True)
    rows = key_BK.shape[0]
    if distinct_UK.shape[0] == rows:
        return None
    first_U = torch.full((distinct_UK.shape[0],), rows, dtype=torch.long, device=key_BK.device)
    first_U = first_U.scatter_reduce(0, inverse_B, torch.arange(rows, device=key_BK.device), reduce="amin")
    return first_U, inverse_B


def distinct_prompts(
    prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`distinct_rows` of left-padded prompts: two rows are the same prompt when both their
    ids and their padding agree."""
    return distinct_rows(torch.cat([prompt_ids_BP, prompt_mask_BP.long()], dim=1))
