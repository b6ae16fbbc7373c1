"""verl 0.9.1 next to the TRL of our ``trl`` extra: a guard for verl's value-head patch.

verl 0.9.1 imports TRL's ``AutoModelForCausalLMWithValueHead`` whenever ``trl`` is importable, and
TRL 1.16 no longer has it, so every model build failed. :func:`guard_trl_value_head` narrows verl's
``is_trl_available`` to "TRL is installed and has that class" (nothing changes with an older TRL);
:mod:`.plugin` installs it in every process. Why and what it changes: docs/verl.md, "Install".
"""

from __future__ import annotations

import sys
import warnings

GUARDED_MODULES = ("verl.utils.import_utils", "verl.models.transformers.monkey_patch", "verl.utils.model")


def trl_value_head_importable() -> bool:
    """Whether ``AutoModelForCausalLMWithValueHead`` can be imported from TRL (either location)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import
        try:
            from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            try:
                from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
            except ImportError:
                return False
    return True


def guard_trl_value_head() -> None:
    """Replace verl's ``is_trl_available`` (idempotent; see the module docstring)."""
    from verl.utils import import_utils

    original = import_utils.is_trl_available
    if getattr(original, "tokenbalance_guard", False):
        return

    def is_trl_available() -> bool:
        """TRL is installed and still provides ``AutoModelForCausalLMWithValueHead``."""
        return original() and trl_value_head_importable()

    is_trl_available.tokenbalance_guard = True
    for name in GUARDED_MODULES:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "is_trl_available"):
            module.is_trl_available = is_trl_available
