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
# constraints.txt pins the tested versions (transformers, tokenizers, numpy, the math-verify stack,
# the verl / TRL hosts, the lint tools): the README's main command installs with it too, so CI
# tests the environment the README's numbers come from. pyproject.toml keeps the wider ranges.
# The CPU build of PyTorch first: a plain `torch` requirement would pull the CUDA wheels.
"$VENV/bin/python" -m pip install --quiet -c constraints.txt "torch==2.13.0"
# dev tools plus the verl and TRL extras: the integration tests run, they do not skip, in CI
"$VENV/bin/python" -m pip install --quiet -c constraints.txt -e ".[dev,verl,trl]"
# the versions that resulted, in the log (antlr: 4.9.3, the runtime verl's hydra/omegaconf need);
# with TOKENBALANCE_CHECK_CONSTRAINTS=1 tests/test_environment.py fails on any package that differs
# from its pin
export TOKENBALANCE_CHECK_CONSTRAINTS=1
"$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|numpy|math-verify|antlr4-python3-runtime|verl|trl) '

# the GPU install (constraints-gpu.txt) still resolves: pip's resolver on the registry's metadata,
# nothing installed; in the full run only (TOKENBALANCE_SKIP_GPU_RESOLVE=1 skips it, e.g. offline)
if [ "$#" -eq 0 ] && [ "${TOKENBALANCE_SKIP_GPU_RESOLVE:-0}" != "1" ]; then
    PYTHON="$VENV/bin/python" bash scripts/check_gpu_install.sh
fi

# lint and format check first: seconds, and a failure names the file and line
"$VENV/bin/python" -m ruff check src tests benchmarks
"$VENV/bin/python" -m ruff format --check src tests benchmarks
"$VENV/bin/python" -m mypy

# With no arguments: the default suite (everything but `slow`, kept under 10 minutes), then the
# slow tier (real verl trainer launches on CPU, two-process runs, the GPU check script's dry runs, the bit-identity run
# beside a load: minutes each). CI runs both.
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
