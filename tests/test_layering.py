"""Layering: algorithms/ imports only the standard library, numpy and torch (and itself)."""

import ast
import sys
from pathlib import Path

import tokenbalance

PACKAGE = Path(tokenbalance.__file__).parent
ALLOWED_THIRD_PARTY = {"numpy", "torch"}
# types.py holds the containers the algorithms return; it obeys the same rule.
ALLOWED_INTERNAL = ("tokenbalance.algorithms", "tokenbalance.types")


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # a relative import stays inside the package being checked
            names.append("tokenbalance.algorithms" if node.level else node.module or "")
    return names


def forbidden_imports(files) -> list[str]:
    bad = []
    for path in files:
        for name in imported_modules(path):
            root = name.split(".")[0]
            allowed = root in sys.stdlib_module_names or root in ALLOWED_THIRD_PARTY
            if not (allowed or name == "tokenbalance" or name.startswith(ALLOWED_INTERNAL)):
                bad.append(f"{path.name} imports {name}")
    return bad


def test_algorithms_import_only_stdlib_numpy_torch():
    files = sorted((PACKAGE / "algorithms").rglob("*.py")) + [PACKAGE / "types.py"]
    assert len(files) >= 10
    assert forbidden_imports(files) == []


def test_the_check_detects_forbidden_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import math\nimport transformers\nfrom tokenbalance.trainer import loop\nimport torch.nn\n")
    assert forbidden_imports([probe]) == ["probe.py imports transformers", "probe.py imports tokenbalance.trainer"]
