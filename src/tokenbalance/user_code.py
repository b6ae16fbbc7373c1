"""Load a user's function named ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``: one loader for every setting that names
user code (``data.reward``, a token rule given as ``train.method``).

Standard library only, so every layer may import it (tests/test_layering.py). Every failure is one
``ValueError`` line naming the setting, the module and the attribute (docs/tasks.md)::

    load_function("rules.py:high_entropy", "train.method")    # a file, imported once per process"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

DEFAULT_EXAMPLE = "mypkg.rewards:gsm8k"


def first_line(err: BaseException) -> str:
    """``TypeName: first line of the message`` of an exception."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def clip_text(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: Any) -> str:
    """``None``, ``nan``, ``0.5``, ``str '1.0'``, ``tuple (1.0, 'yes')``: a value and its type, short."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return f"{type(value).__name__} {clip_text(repr(value))}"


def is_spec(name: object) -> bool:
    """Whether ``name`` has the form of ``MODULE:FUNCTION`` / ``FILE.py:FUNCTION`` (a ``:``); not checked."""
    return isinstance(name, str) and ":" in name


def parse_spec(spec: str, setting: str, example: str = DEFAULT_EXAMPLE) -> tuple[str, str]:
    """``(module, attribute)`` of ``"pkg.module:function"`` or ``"path/file.py:function"`` (the attribute may be
    dotted: ``Class.method``); ``ValueError`` naming ``setting`` otherwise."""
    module, sep, attribute = spec.rpartition(":")
    module_ok = module.endswith(".py") or all(part.isidentifier() for part in module.split("."))
    if not (sep and module and module_ok and all(part.isidentifier() for part in attribute.split("."))):
        raise ValueError(f"{setting}={spec!r}: expected MODULE:FUNCTION (e.g. {example}) or FILE.py:FUNCTION")
    return module, attribute


def normalized_spec(spec: str, setting: str, example: str = DEFAULT_EXAMPLE) -> str:
    """``spec`` checked (:func:`parse_spec`), a ``FILE.py`` made absolute so that a saved config names the same file
    from any working directory (``--resume``, the grid, other processes)."""
    module, attribute = parse_spec(spec, setting, example)
    if module.endswith(".py"):
        return f"{os.path.abspath(os.path.expanduser(module))}:{attribute}"
    return spec


_file_modules: dict[str, Any] = {}  # FILE.py -> its module, loaded once per process


def _import_module(module: str, spec: str, setting: str, attribute: str) -> Any:
    if module.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(module))
        if path in _file_modules:
            return _file_modules[path]
        if not os.path.isfile(path):
            raise ValueError(f"{setting}={spec!r}: {path}: no such file")
        name = f"tokenbalance_user_{len(_file_modules)}_{os.path.splitext(os.path.basename(path))[0]}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"{setting}={spec!r}: {path}: cannot be loaded as a Python module")
        loaded = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = loaded
        try:
            loader_spec.loader.exec_module(loaded)
        except Exception as err:  # noqa: BLE001 - the user's module: reported in one line
            del sys.modules[name]
            raise ValueError(f"{setting}={spec!r}: importing {path} raised {first_line(err)}") from None
        _file_modules[path] = loaded
        return loaded
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module == err.name or module.startswith(err.name + ".")):
            raise ValueError(
                f"{setting}={spec!r}: cannot import module {module!r} ({err}); install it, put its directory on "
                f"PYTHONPATH, or name its file: FILE.py:{attribute}"
            ) from None
        raise ValueError(f"{setting}={spec!r}: importing module {module!r} raised {first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - the user's module: reported in one line
        raise ValueError(f"{setting}={spec!r}: importing module {module!r} raised {first_line(err)}") from None


def load_function(value: str | Callable[..., Any], setting: str, example: str = DEFAULT_EXAMPLE) -> Callable[..., Any]:
    """The callable named by ``"pkg.module:function"`` / ``"path/file.py:function"`` (a callable is returned as is);
    one ``ValueError`` line naming ``setting`` otherwise (module docstring)."""
    if callable(value):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{setting}: expected MODULE:FUNCTION or a function, got {shown(value)}")
    module_name, attribute = parse_spec(value, setting, example)
    loaded = _import_module(module_name, value, setting, attribute)
    parts = attribute.split(".")
    for depth, part in enumerate(parts):
        if not hasattr(loaded, part):
            owner = f"module {module_name!r}" if depth == 0 else repr(".".join([module_name, *parts[:depth]]))
            close = difflib.get_close_matches(part, [n for n in dir(loaded) if not n.startswith("_")], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{setting}={value!r}: {owner} has no attribute {part!r}{hint}")
        loaded = getattr(loaded, part)
    if not callable(loaded):
        raise ValueError(f"{setting}={value!r}: {module_name}.{attribute} is {shown(loaded)}, not a function")
    return loaded
