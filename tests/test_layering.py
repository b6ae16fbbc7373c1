"""Layering: what the pure packages may import.

* ``checks.py`` (the scalar range / choice checks shared by the config, the algorithms, the tasks
  and the models) and ``user_code.py`` (the loader of a user's ``MODULE:FUNCTION``: reward
  functions, token rules): the standard library only, so that every layer may import them.
* ``algorithms/`` (and ``types.py``, which holds the containers the algorithms return): the
  standard library, numpy and torch, ``tokenbalance.checks``, ``tokenbalance.user_code`` and
  itself; anywhere in the file.
* ``tasks/``: the standard library, numpy and torch, ``tokenbalance.checks``,
  ``tokenbalance.user_code`` and ``tokenbalance.tasks`` itself at module level. Inside a function body (a lazy import, run only when that function is called) it may also
  import pyarrow (parquet files) and math-verify (math scoring), so that importing a task stays
  light; no other package, not even lazily. ``tests/tasks/test_base.py`` checks that importing the
  tasks indeed loads neither.
"""

import ast
import sys
from pathlib import Path

import tokenbalance

PACKAGE = Path(tokenbalance.__file__).parent
ALLOWED_THIRD_PARTY = {"numpy", "torch"}
SHARED = (
    "tokenbalance.checks",
    "tokenbalance.user_code",
    "tokenbalance.outputs",
)  # stdlib only; every layer may import them
ALGORITHMS_INTERNAL = ("tokenbalance.algorithms", "tokenbalance.types", *SHARED)
TASKS_INTERNAL = ("tokenbalance.tasks", *SHARED)
TASKS_LAZY_THIRD_PARTY = {"pyarrow", "math_verify"}


def imported_modules(path: Path, package: str = "tokenbalance.algorithms") -> list[tuple[str, bool]]:
    """``(module, lazy)`` for every import of ``path``; ``lazy`` when it sits inside a function."""
    names = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            names.extend((alias.name, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # a relative import stays inside the package being checked
            names.append((package if node.level else node.module or "", lazy))
        inside = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return names


def forbidden_imports(
    files,
    internal: tuple[str, ...] = ALGORITHMS_INTERNAL,
    lazy_third_party: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    bad = []
    for path in files:
        for name, lazy in imported_modules(path, internal[0]):
            root = name.split(".")[0]
            allowed = (
                root in sys.stdlib_module_names
                or root == "__future__"
                or root in ALLOWED_THIRD_PARTY
                or (lazy and root in lazy_third_party)
                or name == "tokenbalance"
                or name.startswith(internal)
            )
            if not allowed:
                bad.append(f"{path.name} imports {name}" + (" (lazily)" if lazy else ""))
    return bad


def test_shared_modules_import_only_the_standard_library():
    for module in ("checks.py", "user_code.py", "outputs.py"):
        names = [name for name, _ in imported_modules(PACKAGE / module)]
        assert names and all(name.split(".")[0] in sys.stdlib_module_names | {"__future__"} for name in names)


def test_algorithms_import_only_stdlib_numpy_torch():
    files = sorted((PACKAGE / "algorithms").rglob("*.py")) + [PACKAGE / "types.py"]
    assert len(files) >= 10
    assert forbidden_imports(files) == []


def test_tasks_import_stdlib_numpy_torch_and_lazily_pyarrow_math_verify():
    files = sorted((PACKAGE / "tasks").rglob("*.py"))
    assert len(files) >= 10 and {"base.py", "arith.py", "reward.py"} <= {p.name for p in files}
    assert forbidden_imports(files, TASKS_INTERNAL, TASKS_LAZY_THIRD_PARTY) == []
    # the lazy imports the rule exists for are really there, inside functions
    lazy = {n.split(".")[0] for p in files for n, is_lazy in imported_modules(p, "tokenbalance.tasks") if is_lazy}
    assert TASKS_LAZY_THIRD_PARTY <= lazy


def test_the_check_detects_forbidden_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import math\nimport transformers\nfrom tokenbalance.trainer import loop\nimport torch.nn\n")
    assert forbidden_imports([probe]) == ["probe.py imports transformers", "probe.py imports tokenbalance.trainer"]


def test_the_tasks_check_allows_pyarrow_only_lazily(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import pyarrow\nfrom tokenbalance.tasks.base import Task\nfrom tokenbalance.models import x\n"
        "def read():\n    import pyarrow.parquet\n    import pandas\n    from . import files\n"
    )
    assert forbidden_imports([probe], TASKS_INTERNAL, TASKS_LAZY_THIRD_PARTY) == [
        "probe.py imports pyarrow",
        "probe.py imports tokenbalance.models",
        "probe.py imports pandas (lazily)",
    ]


# The floors of the package, lowest first (ARCHITECTURE: the folders are the layers). A module
# imports only from its own floor or below, lazily or not; nothing imports ``commands`` or ``cli``.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("types", "checks", "options", "outputs", "user_code", "threads", "extras"),
    ("algorithms", "tasks", "models", "rollout"),
    ("diagnostics",),
    ("config",),
    ("run", "integrations"),
    ("trainer",),
    ("analysis",),
    ("ablate",),
    ("commands", "cli"),
)
FLOOR_OF = {name: number for number, names in enumerate(FLOORS) for name in names}


def module_of(path: Path) -> str:
    """``tokenbalance.trainer.loop`` for ``.../tokenbalance/trainer/loop.py`` (a package: its name)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path) -> list[str]:
    """Every ``tokenbalance`` module ``path`` imports, lazily or not, relative imports resolved;
    ``from X import name`` counts as ``X.name`` where that is a module of the package."""
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append(candidate if module_path(candidate) is not None else base)
    return [name for name in found if name == "tokenbalance" or name.startswith("tokenbalance.")]


def module_path(module: str) -> Path | None:
    relative = Path(*module.split(".")[1:])
    for path in (PACKAGE / relative.with_suffix(".py"), PACKAGE / relative / "__init__.py"):
        if module != "tokenbalance" and path.exists():
            return path
    return None


def floor_breaches(files) -> list[str]:
    bad = []
    for path in files:
        source = module_of(path).split(".")
        if len(source) < 2:
            continue
        for name in package_imports(path):
            target = name.split(".")
            if len(target) < 2 or target[1] == source[1]:
                continue
            if target[1] not in FLOOR_OF or source[1] not in FLOOR_OF:
                bad.append(f"{module_of(path)} imports {name}: a folder with no floor (add it to FLOORS)")
            elif FLOOR_OF[target[1]] > FLOOR_OF[source[1]] or (
                target[1] == "cli" or (target[1] == "commands" and source[1] != "cli")
            ):
                bad.append(f"{module_of(path)} imports {name}, a higher floor")
    return bad


def import_circles(files) -> list[list[str]]:
    """The circles of the module graph (each once, as the list of its modules)."""
    graph = {module_of(path): set() for path in files}
    for path in files:
        for name in package_imports(path):
            if name in graph and name != module_of(path):
                graph[module_of(path)].add(name)
    circles, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt) :])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return circles


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def test_every_folder_imports_only_its_floor_or_below():
    files = package_files()
    folders = {module_of(p).split(".")[1] for p in files}
    assert folders <= set(FLOOR_OF), f"folders with no floor: {sorted(folders - set(FLOOR_OF))}"
    assert floor_breaches(files) == []


def test_no_import_circles():
    # a package's __init__ only hands names on; an import through it is an import of the module
    files = [p for p in package_files() if p.name != "__init__.py"]
    assert import_circles(files) == []


def test_the_floor_and_circle_checks_detect_breaches(tmp_path, monkeypatch):
    root = tmp_path / "tokenbalance"
    for folder in ("algorithms", "trainer"):
        (root / folder).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    low, high = root / "algorithms" / "low.py", root / "trainer" / "high.py"
    low.write_text("def f():\n    from tokenbalance.trainer import high\n")
    high.write_text("from tokenbalance.algorithms import low\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    assert floor_breaches([low, high]) == [
        "tokenbalance.algorithms.low imports tokenbalance.trainer.high, a higher floor"
    ]
    assert import_circles([low, high]) == [["tokenbalance.algorithms.low", "tokenbalance.trainer.high"]]
