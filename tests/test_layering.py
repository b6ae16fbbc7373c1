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
