"""The host versions each integration is tested with, checked when the integration is imported.

A host outside its range fails at import of the integration with a message naming the installed
and the supported versions, instead of failing later, deep inside the host's trainer.
"""

from __future__ import annotations

from importlib import metadata

# Inclusive lower bound, exclusive upper bound; keep in step with pyproject's extras. verl and
# TransferQueue admit only the releases a test has run (our trainers override private verl methods).
SUPPORTED_HOSTS: dict[str, tuple[str, str]] = {
    "verl": ("0.9.1", "0.9.2"),
    "TransferQueue": ("0.1.11", "0.1.12"),
    "trl": ("1.15", "1.17"),
}
# The extra that installs each host.
HOST_EXTRAS = {"verl": "verl", "TransferQueue": "verl", "trl": "trl"}
SKIP_HOST_CHECK = "TOKENBALANCE_SKIP_HOST_CHECK"


class HostVersionError(ImportError):
    """The host framework is missing or outside the range the integration was tested with."""


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release parts: ``"0.9.1.dev0"`` -> ``(0, 9, 1)``, ``"1.16.0rc1"`` -> ``(1, 16, 0)``."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


def version_in_range(installed: str, low: str, high: str) -> bool:
    """``low <= installed < high`` on numeric release parts (pre-releases count as their release)."""
    version = parse_version(installed)
    return parse_version(low) <= version < parse_version(high)


def require_host(name: str, installed: str | None = None) -> str:
    """Check that host ``name`` is installed within :data:`SUPPORTED_HOSTS`; returns its version.

    ``installed`` overrides the detected version (for tests). Set ``TOKENBALANCE_SKIP_HOST_CHECK=1``
    to try an untested version at your own risk.
    """
    import os

    low, high = SUPPORTED_HOSTS[name]
    supported = f">={low},<{high}"
    extra = HOST_EXTRAS[name]
    if installed is None:
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise HostVersionError(
                f"{name} is not installed; the tokenbalance {extra} integration supports {name}{supported}: "
                f"pip install 'tokenbalance[{extra}]'"
            ) from None
    if not version_in_range(installed, low, high) and os.environ.get(SKIP_HOST_CHECK) != "1":
        raise HostVersionError(
            f"{name} {installed} is installed, but the tokenbalance {extra} integration is tested with "
            f"{name}{supported}; install a supported version (pip install 'tokenbalance[{extra}]') "
            f"or set {SKIP_HOST_CHECK}=1 to try it anyway"
        )
    return installed
