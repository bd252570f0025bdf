#!/usr/bin/env bash
# Installs the pinned requirements into .venv, then runs the whole job on the built-in numbers corpus:
# prepro (data/numbers) -> train (runs/numbers, 900 steps: the learning rate decays to 0 at the last one) -> test
# (prints sacreBLEU). The budget is in steps, so a slower CPU learns as much, only later.
# Running it again reuses the data dir and says there is nothing left to train.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$PY" prepro.py --dataset numbers --data_dir data/numbers
"$PY" train.py --data_dir data/numbers --logdir runs/numbers \
  --d_model 128 --d_ff 512 --num_blocks 2 --num_heads 4 \
  --batch_size 2048 --lr 2e-3 --warmup_steps 200 --lr_schedule linear --max_steps 900 --eval_every 0 "$@"
"$PY" test.py --logdir runs/numbers
