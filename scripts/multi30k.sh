#!/usr/bin/env bash
# The Multi30k German->English recipe in MINUTES of wall time (default 60), end to end: installs into .venv, then
# prepro -> measure the candidate models' speed here and choose the one scripts/recipe_table.json predicts best for
# the target tokens the time left buys -> train it (learning rate decaying to 0 at the budget's end) -> test2016
# greedy and beam 4 (length penalty 1.2); prints the choice and a results table with the CPU it ran on and writes
# them to runs/multi30k_MINUTESm/recipe.json. Flags after MINUTES go to scripts/recipe.py (see its --help);
# --reverse trains English->German into data/multi30k_en_de and runs/multi30k_en_de_MINUTESm.
#   bash scripts/multi30k.sh [MINUTES] [--reverse] [--logdir DIR] [--data_dir DIR] [--candidates NAME,NAME]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
MINUTES="${1:-60}"
[ $# -gt 0 ] && shift
exec "$PY" scripts/recipe.py --minutes "$MINUTES" "$@"
