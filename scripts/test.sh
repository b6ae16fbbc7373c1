#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. This is the README's test command
# and exactly what CI runs. Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${TOKENBALANCE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# The CPU build of PyTorch first: a plain `torch` requirement would pull the CUDA wheels.
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
# dev tools plus the verl and TRL extras: the integration tests run, they do not skip, in CI
"$VENV/bin/python" -m pip install --quiet -e ".[dev,verl,trl]"

# lint and format check first: seconds, and a failure names the file and line
"$VENV/bin/python" -m ruff check src tests benchmarks
"$VENV/bin/python" -m ruff format --check src tests benchmarks
"$VENV/bin/python" -m mypy

set +e
"$VENV/bin/python" -m pytest -q "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$status"
