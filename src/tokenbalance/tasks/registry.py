"""The task registry: names to task factories (``data.task``, ``gen-data``); built-in tasks are imported only when
asked for (:func:`register_task`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenbalance.tasks.base import Task

DEFAULT_TASK = "kk"  # the task of a config that names none, and of the TRL / verl reward adapters


def _make_kk() -> Task:
    from tokenbalance.tasks.kk.task import KKTask

    return KKTask()


def _make_arith() -> Task:
    from tokenbalance.tasks.arith import ArithTask

    return ArithTask()


TASK_FACTORIES: dict[str, Callable[[], Task]] = {"kk": _make_kk, "arith": _make_arith}


class _TaskNames(Sequence):
    """The registered task names, read from :data:`TASK_FACTORIES` at each use (so a task registered later is a valid
    ``data.task``); compares equal to the tuple of the names."""

    def __getitem__(self, index):
        return tuple(TASK_FACTORIES)[index]

    def __len__(self) -> int:
        return len(TASK_FACTORIES)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in TASK_FACTORIES

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, _TaskNames)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self))


TASK_NAMES: Sequence[str] = _TaskNames()


def task_names() -> tuple[str, ...]:
    """The names registered now, in registration order."""
    return tuple(TASK_FACTORIES)


def register_task(name: str, factory: Callable[[], Task], *, replace: bool = False) -> None:
    """Make ``get_task(name)`` return ``factory()`` (``data.task`` and ``gen-data`` accept ``name`` from then on); a
    name already registered is an error unless ``replace=True``.

        register_task("echo", EchoTask)          # a class is a factory too"""
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"task name must be a non-empty string of letters, digits, '_' or '-', got {name!r}")
    if not callable(factory):
        raise ValueError(f"task {name!r}: factory must be callable, got {factory!r}")
    if name in TASK_FACTORIES and not replace:
        raise ValueError(f"task {name!r} is already registered; pass replace=True to replace it")
    TASK_FACTORIES[name] = factory


def unregister_task(name: str) -> None:
    """Remove a registered task (tests that register a task clean up with it)."""
    if name not in TASK_FACTORIES:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_FACTORIES)}")
    del TASK_FACTORIES[name]


def get_task(name: str) -> Task:
    """A fresh task object by registry name; ``ValueError`` listing the valid names otherwise."""
    factory = TASK_FACTORIES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_FACTORIES)}")
    return factory()
