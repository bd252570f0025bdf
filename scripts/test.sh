#!/usr/bin/env bash
# Installs the pinned requirements into .venv and runs the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$PY" -m pytest -q tests "$@"
