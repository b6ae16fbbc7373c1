#!/usr/bin/env bash
# Does the GPU install line of docs/verl.md resolve? pip's resolver on the registry's metadata, installing
# nothing (no wheel is downloaded: PyPI serves each wheel's metadata on its own), then every pin of
# constraints-gpu.txt compared with the version it chose. Needs the package registry; scripts/test.sh
# runs it (TOKENBALANCE_SKIP_GPU_RESOLVE=1 skips it offline).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-${TOKENBALANCE_VENV:-.venv}/bin/python}
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$PYTHON" -m pip install --dry-run --ignore-installed --quiet --report "$report" \
    -c constraints-gpu.txt ".[verl,vllm,trl]"
"$PYTHON" - "$report" constraints-gpu.txt <<'PY'
import json
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

report, constraints = sys.argv[1:]
chosen = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in json.load(open(report))["install"]}
pins = [Requirement(line.split("#", 1)[0]) for line in open(constraints) if line.split("#", 1)[0].strip()]
wrong = [f"{pin} (chose {chosen.get(canonicalize_name(pin.name), 'nothing')})" for pin in pins
         if not pin.specifier.contains(chosen.get(canonicalize_name(pin.name), "0"), prereleases=True)]
if wrong:
    sys.exit(f"constraints-gpu.txt: the resolver did not choose {', '.join(wrong)}")
print(f"GPU install resolves: {len(chosen)} packages, every pin of {constraints} as chosen")
PY
