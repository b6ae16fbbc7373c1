#!/usr/bin/env bash
# Every GPU check of the project in one command, with the results in one Markdown file.
#
# STATUS: run on one H200 (2026-11-26: a device bug, fixed in 92770ed, and a wrong test guess) and
# one H100 (2026-11-27: a dtype bug of the new CUDA-graph decode step, fixed in 889e31b);
# docs/results.md ("On a GPU") has the figures. Read the results file before trusting a number in
# it. It is also checked on the CPU (--dry-run, which tests/cuda/test_gpu_check_script.py runs in
# the default suite).
#
# What it runs, on one CUDA device, writing each part to the results file as it finishes:
#   1. the tests marked `cuda` (tests/cuda; each skips where no GPU exists, reported as skipped):
#      - test_engines.py     FastEngine (its CUDA-graph step, the default on CUDA, and the eager
#                            decoders) and HFGenerateEngine sampling in float32 and bfloat16 against
#                            the full-forward sampler: the same tokens where the kernels allow
#                            (FastEngine float32 with the same random stream, greedy decoding of
#                            both), else the log-probs each engine reports vs a full forward within
#                            a dtype-derived tolerance plus a chi-square test of the sampled tokens
#      - test_presets.py     one RL step of every method preset, float32 and bfloat16: finite loss,
#                            every weight moves, everything stays on the device
#      - test_checkpoint.py  a checkpoint written on the GPU resumes on the CPU and back, bit for
#                            bit; a run moved GPU -> CPU -> GPU keeps every step
#      - test_nthr_bf16.py   NTHR's hidden-state path in bfloat16 (hidden states, log-Z trick,
#                            scores and token selection vs float32)
#      - test_trl.py         the TRL subclass trains 2 steps (float32, and bf16 autocast for GRPO,
#                            Lopti and NTHR)
#      - test_mixed_precision.py  one GRPO and one AR + Lopti step with float32 weights under bf16
#                            autocast (model.autocast) and the output layer in chunks
#                            (optim.logit_chunk_tokens): float32 weights and AdamW state, every
#                            weight moves, the fast engine decodes from a bf16 K/V cache; log-probs
#                            under autocast and in chunks within bf16 rounding of float32's; a step
#                            with activation checkpointing equal to one without
#   2. the benchmarks, at Qwen2.5-0.5B's shape with random weights built locally (no hub), bfloat16:
#      - benchmarks/rollout_speed.py   rollout tokens/s of both engines (and HF eager; the fast
#                                      engine with and without its CUDA graph), peak memory
#      - benchmarks/rl_step_vs_trl.py  one RL step: our trainer vs TRL's GRPOTrainer, peak memory;
#                                      ours also with float32 weights + bf16 autocast and the
#                                      output layer in chunks of 1024 positions
#                                      (and that with activation checkpointing, as TRL's default)
#      - benchmarks/update_cost.py     the update's FLOP/s as a share of the measured bf16 matmul rate
#      - benchmarks/rollout_speed.py   again at reasoning length (64 rows, 1024 new tokens; generate
#                                      and the fast engine with and without its CUDA graph), last
#   Not here: verl's trainer. It needs vLLM (or SGLang) and Ray, which the lent machine lacks and which
#   are far over what a call can carry (64 MiB); verl's real trainer runs on the CPU in the slow tier
#   (tests/integrations/test_verl_*e2e.py: GRPO, Lopti on two ranks with a resume, NTHR, a grid cell,
#   the stop on request), and on a cluster its dry run checks every cell (docs/verl.md).
#
# Usage:
#   bash scripts/gpu_check.sh [RESULTS] [--dry-run] [--force] [--no-install] [--tests-only | --bench-only]
#   bash scripts/gpu_check.sh --download-wheels [DIR]
#
#   RESULTS           a .md file, or a directory (then RESULTS/gpu_check.md); default ./gpu_check.md
#                     in the directory the script is called from. An existing file is never
#                     overwritten: the script stops, unless --force.
#   --dry-run         the same checks on the CPU with tiny shapes, nothing installed
#                     (TOKENBALANCE_GPU_CHECK_SELECT can narrow the tests)
#   --no-install      skip the pip steps (the environment already has the project and its needs)
#   --tests-only, --bench-only   one half (two shorter calls where one command's time is limited)
#   --download-wheels on a machine WITH network access: fetch the small wheels the GPU machine
#                     lacks into DIR (default $TOKENBALANCE_WHEELS, else .whl) for Python 3.12 x86-64
#
# Environment: PYTHON (default: python3; .venv/bin/python with --dry-run where it exists),
# TOKENBALANCE_WHEELS (the wheel directory installed from, default .whl),
# TOKENBALANCE_GPU_CHECK_DEVICE (cuda, cuda:N; --dry-run sets cpu),
# TOKENBALANCE_GPU_CHECK_SELECT (a pytest -k expression choosing among the tests, e.g. "float32"),
# TOKENBALANCE_GPU_CHECK_BUDGET (seconds for the whole script, default 570 on a GPU so that the
# summary is written inside a 600-second command limit; 0: none; a part that would start with
# less than a minute left is reported as not run).
#
# Install on the GPU machine (no network there): `pip install --no-deps --no-build-isolation -e .`
# plus every wheel in $TOKENBALANCE_WHEELS. Its image has PyTorch, transformers, accelerate,
# safetensors, tokenizers, numpy, pyarrow, pyyaml, rich, matplotlib, pytest and hypothesis; it
# lacks trl, datasets (and its dill, multiprocess) and math-verify (latex2sympy2_extended,
# antlr4-python3-runtime 4.9.3), and its setuptools may predate the project's pyproject.toml:
# --download-wheels fetches those (about 3 MB). If the editable install still fails, the checks run
# from src/ (PYTHONPATH) and the install part reports a warning. Then, with the
# project's device tool (`run`, which copies the working tree and returns what $OUT holds):
#
#   bash scripts/gpu_check.sh --download-wheels                  # here, once
#   (.gitignore ignores .whl/: the device tool carries ignored paths named in carry)
#   run: command "bash scripts/gpu_check.sh \"$OUT\"", carry [".whl"], timeout_s 600
#
# The exit status is 0 only when every part passed; a failing part does not stop the next one.

set -uo pipefail

usage() { sed -n '/^# Usage:/,/^# Environment:/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d'; }

ARGUMENTS="$*"
RESULTS_ARG="" DRY_RUN=0 FORCE=0 INSTALL=1 TESTS=1 BENCH=1 DOWNLOAD=0 DOWNLOAD_DIR=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --force) FORCE=1 ;;
        --no-install) INSTALL=0 ;;
        --tests-only) BENCH=0 ;;
        --bench-only) TESTS=0 ;;
        --download-wheels)
            DOWNLOAD=1
            if [ "$#" -gt 1 ] && [ "${2#-}" = "$2" ]; then DOWNLOAD_DIR=$2; shift; fi ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *)
            if [ -n "$RESULTS_ARG" ]; then echo "gpu_check.sh: one RESULTS path, got '$RESULTS_ARG' and '$1'" >&2; exit 2; fi
            RESULTS_ARG=$1 ;;
    esac
    shift
done
if [ "$TESTS" -eq 0 ] && [ "$BENCH" -eq 0 ]; then
    echo "gpu_check.sh: --tests-only and --bench-only together leave nothing to run" >&2
    exit 2
fi

CALLED_FROM=$PWD
absolute() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$CALLED_FROM" "$1" ;; esac; }
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
WHEELS=$(absolute "${TOKENBALANCE_WHEELS:-$REPO/.whl}")

# --------------------------------------------------------------------------------------------
# --download-wheels: the packages the GPU image lacks, at the versions CI tests (pure Python)

# setuptools: `pip install -e .` builds with the installed one (no network for build isolation), and
# the project's PEP 639 `license = "Apache-2.0"` needs setuptools >= 77.
WHEELS_NEEDED=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0
    latex2sympy2_extended==1.11.0 setuptools==80.9.0)
SDIST_NEEDED=(antlr4-python3-runtime==4.9.3) # no wheel on PyPI: built here (pure Python)

if [ "$DOWNLOAD" -eq 1 ]; then
    target=$(absolute "${DOWNLOAD_DIR:-$WHEELS}")
    pip_python=${PYTHON:-$([ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3)}
    mkdir -p "$target" || exit 1
    "$pip_python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$target" "${WHEELS_NEEDED[@]}" || exit 1
    "$pip_python" -m pip wheel --quiet --no-deps -w "$target" "${SDIST_NEEDED[@]}" || exit 1
    echo "wheels in $target:"
    ls -1 "$target"
    exit 0
fi

# --------------------------------------------------------------------------------------------
# Where the results go (never over an existing file unless --force)

if [ -z "$RESULTS_ARG" ]; then
    RESULTS="$CALLED_FROM/gpu_check.md"
elif [ -d "$RESULTS_ARG" ] || [ "${RESULTS_ARG%/}" != "$RESULTS_ARG" ]; then # a directory, or one to make
    RESULTS="$(absolute "${RESULTS_ARG%/}")/gpu_check.md"
else
    RESULTS=$(absolute "$RESULTS_ARG")
fi
if [ -e "$RESULTS" ] && [ "$FORCE" -ne 1 ]; then
    echo "gpu_check.sh: $RESULTS exists; name another file or directory, or pass --force to overwrite it" >&2
    exit 2
fi
mkdir -p "$(dirname "$RESULTS")" && : >"$RESULTS" || { echo "gpu_check.sh: cannot write $RESULTS" >&2; exit 2; }

if [ "$DRY_RUN" -eq 1 ]; then
    DEVICE=cpu
    INSTALL=0
    PYTHON=${PYTHON:-$([ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3)}
    DTYPE=bfloat16
    THREADS=1
    ROLLOUT_ARGS=(--shape tiny --batch 8 --group-size 4 --prompt-len 16 --new-tokens 8 --repeats 1)
    STEP_ARGS=(--shape tiny --steps 1 --rounds 1 --max-new-tokens 8 --data-count 32)
    UPDATE_ARGS=(--shape tiny --methods grpo,nthr --repeats 1 --data-count 32)
    LONG_ROLLOUT_ARGS=(--shape tiny --batch 8 --group-size 4 --prompt-len 16 --new-tokens 24 --repeats 1
        --engines generate,fast,fast-no-graph)
else
    DEVICE=${TOKENBALANCE_GPU_CHECK_DEVICE:-cuda}
    PYTHON=${PYTHON:-python3}
    DTYPE=bfloat16
    THREADS=8
    ROLLOUT_ARGS=(--shape qwen2.5-0.5b --batch 128 --group-size 8 --prompt-len 128 --new-tokens 128 --repeats 3)
    STEP_ARGS=(--shape qwen2.5-0.5b --steps 3 --rounds 1 --max-new-tokens 64)
    UPDATE_ARGS=(--shape qwen2.5-0.5b --methods grpo,lopti,nthr --repeats 3)
    # reasoning length: the CUDA-graph step reads all S + T cache columns at every step
    LONG_ROLLOUT_ARGS=(--shape qwen2.5-0.5b --batch 64 --group-size 8 --prompt-len 128 --new-tokens 1024 --repeats 1
        --engines generate,fast,fast-no-graph)
fi
BUDGET=${TOKENBALANCE_GPU_CHECK_BUDGET:-$([ "$DRY_RUN" -eq 1 ] && echo 0 || echo 570)}
export TOKENBALANCE_GPU_CHECK_DEVICE=$DEVICE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 WANDB_DISABLED=true WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false \
    HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error

# --------------------------------------------------------------------------------------------
# Writing the results

out() { printf '%s\n' "$@" >>"$RESULTS"; }
say() { printf '%s\n' "$*" >&2; }
fence() { out '```'; cat "$1" >>"$RESULTS"; out '```'; }
SUMMARY=()
FAILED=0
record() { # part, result (passed, warning: ..., failed ...), seconds
    SUMMARY+=("| $1 | $2 | $3 |")
    case "$2" in passed | warning*) ;; *) FAILED=1 ;; esac
    say "gpu_check: $1: $2 ($3 s)"
}
finish() {
    out "" "## Summary" "" "| part | result | seconds |" "|---|---|---|" "${SUMMARY[@]}" ""
    if [ "$FAILED" -eq 0 ]; then out "All parts passed."; else out "Some parts FAILED: see their sections above."; fi
    say "gpu_check: results in $RESULTS"
    exit "$FAILED"
}
time_limit() { # the seconds a part may take: its own limit, within what is left of the budget
    local left
    if [ "$BUDGET" -le 0 ]; then echo "$1"; return; fi
    left=$((BUDGET - SECONDS - 15))
    if [ "$left" -lt 60 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

out "# tokenbalance GPU check" ""
if [ "$DRY_RUN" -eq 1 ]; then
    out "Mode: **dry run on the CPU** (tiny shapes, $DTYPE): it checks that the script and its checks work, not the GPU." ""
else
    out "Mode: GPU ($DEVICE)." ""
fi
commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo "unknown (no git metadata in this copy)")
out "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')" "- commit: $commit" "- host: $(uname -n), $(nproc) CPUs" \
    "- command: bash scripts/gpu_check.sh $ARGUMENTS"

# --------------------------------------------------------------------------------------------
# Install (the GPU machine has no network: the project without dependencies, the carried wheels)

install_wheels() {
    shopt -s nullglob
    local wheels=("$WHEELS"/*.whl) wheel failed=0
    shopt -u nullglob
    if [ "${#wheels[@]}" -eq 0 ]; then
        echo "no wheels in $WHEELS (bash scripts/gpu_check.sh --download-wheels fetches them)"
        return 1
    fi
    echo "+ pip install --no-index --no-deps ${wheels[*]##*/}"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir "${wheels[@]}" 2>&1 && return 0
    echo "one call failed (a wheel this Python cannot use stops them all): one wheel at a time"
    for wheel in "${wheels[@]}"; do
        "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir "$wheel" >/dev/null 2>&1 \
            || { echo "FAILED: ${wheel##*/}"; failed=1; }
    done
    return "$failed"
}

install_project() {
    echo "+ pip install --no-index --no-deps --no-build-isolation -e ."
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . >"$TMP/editable.log" 2>&1 \
        && return 0
    tail -n 12 "$TMP/editable.log"
    return 1
}

if [ "$INSTALL" -eq 1 ]; then
    start=$SECONDS
    out "" "## Install" ""
    problems=()
    install_wheels >"$TMP/install.log" 2>&1 || problems+=("wheels")
    install_project >>"$TMP/install.log" 2>&1 || problems+=("editable install")
    if ! "$PYTHON" -c "import tokenbalance" >/dev/null 2>&1; then
        echo "tokenbalance does not import after the install: running it from $REPO/src (PYTHONPATH)" >>"$TMP/install.log"
        export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
    fi
    fence "$TMP/install.log"
    if [ "${#problems[@]}" -eq 0 ]; then
        record install passed $((SECONDS - start))
    else # the checks still run; what is missing fails there, by name
        record install "warning: ${problems[*]} failed (see Install)" $((SECONDS - start))
    fi
fi

# --------------------------------------------------------------------------------------------
# The machine and the versions

out "" "## Machine" ""
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$TMP/smi.txt" 2>&1
    fence "$TMP/smi.txt"
fi
"$PYTHON" - >"$TMP/versions.txt" 2>&1 <<'EOF'
import importlib.metadata as metadata
import platform

import torch

print(f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
if torch.cuda.is_available():
    print(f"GPU: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
else:
    print("GPU: none visible to torch")
for name in ("tokenbalance", "transformers", "accelerate", "trl", "datasets", "tokenizers", "safetensors", "math-verify"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name}: NOT INSTALLED")
EOF
fence "$TMP/versions.txt"
if [ "$DRY_RUN" -ne 1 ] && ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    out "" "No CUDA GPU is visible to torch: nothing was checked (the tests would only skip)."
    record "CUDA device" "failed: none visible" 0
    finish
fi

# --------------------------------------------------------------------------------------------
# The tests marked cuda

run_tests() {
    local start=$SECONDS status=passed limit
    limit=$(time_limit "${TESTS_TIMEOUT:-300}")
    if [ "$limit" -eq 0 ]; then record tests "failed: not run (the time budget is spent)" 0; return; fi
    local chosen=()
    [ -n "${TOKENBALANCE_GPU_CHECK_SELECT:-}" ] && chosen=(-k "$TOKENBALANCE_GPU_CHECK_SELECT")
    out "" "## Tests: pytest -m cuda tests/cuda (device $DEVICE)" ""
    [ "${#chosen[@]}" -gt 0 ] && out "Only the tests matching -k '$TOKENBALANCE_GPU_CHECK_SELECT'." ""
    timeout --kill-after=10 "$limit" "$PYTHON" -m pytest tests/cuda -m cuda -v --tb=short -rfEs \
        -p no:cacheprovider "${chosen[@]}" 2>&1 | tee "$TMP/pytest.log" >&2
    local rc=${PIPESTATUS[0]}
    fence "$TMP/pytest.log"
    local counts
    counts=$(grep -E '^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$TMP/pytest.log" | tail -n 1 | sed 's/=//g')
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status="failed: timed out"
    elif [ "$rc" -ne 0 ]; then
        status="failed (pytest exit $rc):${counts}"
    elif [ "$DRY_RUN" -ne 1 ] && grep -qE '[0-9]+ skipped' <<<"$counts"; then
        status="failed: tests skipped on the GPU:${counts}"
    else
        status="passed"
        out "" "Result:${counts}"
    fi
    record "tests" "$status" $((SECONDS - start))
}

# --------------------------------------------------------------------------------------------
# The benchmarks

run_benchmark() { # part (its name in the summary), title, script, arguments...
    local part=$1 title=$2 script=$3 start=$SECONDS limit
    shift 3
    limit=$(time_limit "${BENCH_TIMEOUT:-240}")
    if [ "$limit" -eq 0 ]; then record "$part" "failed: not run (the time budget is spent)" 0; return; fi
    local command=("$PYTHON" "benchmarks/$script" --device "$DEVICE" --dtype "$DTYPE" --threads "$THREADS" "$@")
    out "" "## Benchmark: $title" "" '`'"${command[*]/#$PYTHON/python}"'`' ""
    timeout --kill-after=10 "$limit" "${command[@]}" 2>"$TMP/stderr.log" | tee "$TMP/stdout.log" >&2
    local rc=${PIPESTATUS[0]}
    grep -v "^{'" "$TMP/stdout.log" >>"$RESULTS" # not the log lines TRL's Trainer prints
    if [ "$rc" -eq 0 ]; then
        record "$part" passed $((SECONDS - start))
    else
        out "" "Exit status $rc$([ "$rc" -eq 124 ] && echo ' (timed out)'); the end of its error output:"
        tail -n 40 "$TMP/stderr.log" >"$TMP/stderr.tail"
        fence "$TMP/stderr.tail"
        cat "$TMP/stderr.tail" >&2
        record "$part" "failed (exit $rc)" $((SECONDS - start))
    fi
}

[ "$TESTS" -eq 1 ] && run_tests
if [ "$BENCH" -eq 1 ]; then
    run_benchmark rollout_speed.py "rollout tokens/s" rollout_speed.py "${ROLLOUT_ARGS[@]}"
    run_benchmark rl_step_vs_trl.py "one RL step, ours vs TRL's GRPOTrainer" rl_step_vs_trl.py "${STEP_ARGS[@]}"
    run_benchmark update_cost.py "the update's share of the matmul rate" update_cost.py "${UPDATE_ARGS[@]}"
    run_benchmark "rollout_speed.py, reasoning length" "rollout tokens/s at reasoning length" rollout_speed.py \
        "${LONG_ROLLOUT_ARGS[@]}"
fi
finish
