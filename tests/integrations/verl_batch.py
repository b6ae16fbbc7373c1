"""verl 0.9.1's batch as its workers receive it, built in tests without Ray or TransferQueue."""

from __future__ import annotations

import torch
from verl.utils import tensordict_utils as tu


def stored_samples(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], **non_tensor):
    """One sample per ``(prompt ids, response ids, response mask)`` as verl's agent loop stores it
    (``list_of_dict_to_tensordict``: jagged tensors), with ``non_tensor`` as the worker sees
    ``extra_info`` (non-tensor data)."""
    samples = []
    for prompt, response, response_mask in rows:
        input_ids = torch.cat([prompt, response])
        samples.append(
            {
                "prompts": prompt,
                "responses": response,
                "input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "position_ids": torch.arange(len(input_ids)),
                "response_mask": response_mask,
                "loss_mask": response_mask,
            }
        )
    data = tu.list_of_dict_to_tensordict(samples)
    tu.assign_non_tensor(data, **non_tensor)
    return data
