"""The two runtime patches verl 0.9.1 needs on a CPU-only machine (applied by :mod:`.hook`).

* ``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
  ``"cpu:gloo,<device>:<backend>"``, which with device ``cpu`` names ``cpu`` twice and is
  rejected by torch; the wrapper passes plain ``"gloo"`` unless the caller chose a backend.
* FSDP2's ``CPUOffloadPolicy`` (verl forces ``pin_memory=True`` for the reference model) pins
  host memory, which needs an accelerator; the replacement class never pins.

Both must be installed before verl's worker modules import these names, which holds because
verl imports the external modules from ``verl/__init__``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch.distributed.fsdp


def gloo_process_group() -> None:
    """Make verl's process-group initialiser default to the plain ``gloo`` backend."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_tokenbalance_cpu", False):
        return

    @functools.wraps(original)
    def initialize(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize._tokenbalance_cpu = True
    distributed.initialize_global_process_group_ray = initialize


@dataclass
class UnpinnedCPUOffloadPolicy(torch.distributed.fsdp.CPUOffloadPolicy):
    """FSDP2 CPU offload that never pins memory (``pin_memory`` is forced to False)."""

    def __post_init__(self):
        self.pin_memory = False


def unpinned_cpu_offload() -> None:
    """Replace ``CPUOffloadPolicy`` where verl looks it up (torch's namespace, and verl's own
    module if it was imported already)."""
    import sys

    torch.distributed.fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    for name in ("verl.utils.fsdp_utils", "verl.workers.engine.fsdp.transformer_impl"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "CPUOffloadPolicy"):
            module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def apply_all() -> None:
    gloo_process_group()
    unpinned_cpu_offload()
