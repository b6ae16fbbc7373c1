"""The diagnostics' measurement modules are pure: standard library, numpy, torch and the algorithm core.

Plotting (matplotlib: ``plots.py``, ``plotted.py``), the metric sinks (TensorBoard / W&B), and
what works on a real policy through the trainer's pieces (``access.py``: the policy's log-probs in a step; ``probe.py`` and
``experiments.py``: the offline experiments on a probe batch) are the exceptions; the commands
parse arguments and render.
"""

import ast
import sys
from pathlib import Path

import tokenbalance

DIAGNOSTICS = Path(tokenbalance.__file__).parent / "diagnostics"
IMPURE = {"sinks.py", "plots.py", "plotted.py", "access.py", "probe.py", "experiments.py"}
ALLOWED_INTERNAL = (
    "tokenbalance.algorithms",
    "tokenbalance.types",
    "tokenbalance.checks",
    "tokenbalance.options",
    "tokenbalance.diagnostics",
)


def test_measurement_modules_import_only_pure_code():
    files = sorted(p for p in DIAGNOSTICS.glob("*.py") if p.name not in IMPURE)
    assert {"buckets.py", "grad_norms.py", "lld.py", "step.py", "edges.py"} <= {p.name for p in files}
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                root = name.split(".")[0]
                if not (
                    root in sys.stdlib_module_names or root in ("numpy", "torch") or name.startswith(ALLOWED_INTERNAL)
                ):
                    bad.append(f"{path.name} imports {name}")
    assert bad == []
