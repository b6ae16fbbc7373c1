"""A ``cpu`` platform for verl's platform registry (``VERL_PLATFORM=cpu`` selects it).

Without an accelerator verl falls back to the "nvidia" platform and rewrites
``trainer.device=cpu`` to ``cuda``. This platform reports device ``cpu``, the gloo backend, and
Ray resource "GPU" (a logical resource the launcher declares with ``ray_init.num_gpus``; torch
never sees a GPU). ``device_module`` is a stand-in for ``torch.cuda``: verl calls
``empty_cache``, ``mem_get_info``, ``synchronize``, RNG state and memory counters on it.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory, as ``torch.cuda.mem_get_info`` reports device memory."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _make_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` functions verl calls, as no-ops or host equivalents."""
    module = types.ModuleType("tokenbalance_test_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    zero = lambda *args, **kwargs: 0  # noqa: E731
    nothing = lambda *args, **kwargs: None  # noqa: E731
    module.empty_cache = nothing
    module.ipc_collect = nothing
    module.set_per_process_memory_fraction = nothing
    module.reset_peak_memory_stats = nothing
    module.memory_allocated = zero
    module.memory_reserved = zero
    module.max_memory_allocated = zero
    module.max_memory_reserved = zero
    module.mem_get_info = lambda *args, **kwargs: _host_memory()
    module.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    module.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *args, **kwargs: "cpu"
    module.current_device = lambda: "cpu"  # verl calls tensor.to(get_device_id())
    return module


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl on the host CPU: gloo collectives, FSDP2 over CPU tensors, no accelerator."""

    _device_module = _make_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # never auto-detected: selected with VERL_PLATFORM=cpu only

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # Ray sets it for the logical "GPU" resource

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None
