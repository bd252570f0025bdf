#!/usr/bin/env bash
# Installs the pinned requirements into .venv, then runs the whole job on the built-in numbers corpus:
# prepro (data/numbers) -> train (runs/numbers, at most 6 minutes, about 3 on 2 CPU cores) -> test (prints sacreBLEU).
# Running it again reuses the data dir and resumes (or skips) training.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$PY" prepro.py --dataset numbers --data_dir data/numbers
"$PY" train.py --data_dir data/numbers --logdir runs/numbers \
  --d_model 128 --d_ff 512 --num_blocks 2 --num_heads 4 \
  --batch_size 4096 --lr 2e-3 --warmup_steps 300 --num_epochs 6 --max_minutes 6 "$@"
"$PY" test.py --logdir runs/numbers
