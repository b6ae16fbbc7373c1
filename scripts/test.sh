#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. This is the README's test command
# and exactly what CI runs.
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

# With no arguments: the default suite (everything but `slow`, kept under 10 minutes), then the
# slow verl end-to-end tests (real verl trainer launches on CPU, minutes each). CI runs both.
# Arguments go to a single pytest call instead (e.g. `bash scripts/test.sh tests/algorithms`).
run_pytest() {
    set +e
    "$VENV/bin/python" -m pytest -q "$@"
    local status=$?
    set -e
    if [ "$status" -eq 5 ]; then
        echo "pytest collected no tests ($*): treating that as a failure" >&2
        return 1
    fi
    return "$status"
}

if [ "$#" -gt 0 ]; then
    run_pytest "$@"
else
    run_pytest -m "not slow"
    run_pytest -m slow
fi
