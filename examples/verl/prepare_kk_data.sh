#!/usr/bin/env bash
# Knights & Knaves data for the verl presets, written by our own generator (docs/tasks.md):
# the AR-Lopti K&K training file (4,500 prompts, 900 each for 3-7 people) and the five
# 100-puzzle test files with data_source kk_logic{n} (the authors' scripts; docs/tasks.md).
#   bash examples/verl/prepare_kk_data.sh [DATA_DIR]      (default: data/kk)
set -euo pipefail
DATA_DIR="${1:-${DATA_DIR:-data/kk}}"
tokenbalance gen-data kk --people 3-7 --split train --merge --out "$DATA_DIR/merge_34567ppl/train.parquet"
tokenbalance gen-data kk --people 3-7 --split test --per-level-source --out "$DATA_DIR/{n}ppl/test_new.parquet"
