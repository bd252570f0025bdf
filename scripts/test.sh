#!/usr/bin/env bash
# Installs the pinned requirements into .venv and runs the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
# tests/test_serve_page.py drives Debian's headless chromium: CI (CI=true, as root) installs it when missing
if [ "${CI:-}" = "true" ] && [ "$(id -u)" = 0 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# one pytest worker per core, at most 4 (pytest-xdist); a worker takes the tests of another once its own are done.
# Later flags win: `bash scripts/test.sh -n 0` runs in one process.
WORKERS="$(nproc)"; [ "$WORKERS" -gt 4 ] && WORKERS=4
exec "$PY" -m pytest -q -n "$WORKERS" --dist worksteal tests "$@"
