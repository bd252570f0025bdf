#!/usr/bin/env bash
# Installs the pinned requirements into .venv and runs the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# CI (CI=true, as root) installs what some tests need when it is missing, so that they run instead of skipping:
# g++ for the fused kernels (fast/kernels.py; their tests fail under CI when the kernels do not build) and
# Debian's headless chromium for tests/test_serve_page.py
if [ "${CI:-}" = "true" ] && [ "$(id -u)" = 0 ]; then
  MISSING=""
  command -v g++ >/dev/null || MISSING="g++"
  { command -v chromium && command -v chromedriver; } >/dev/null || MISSING="$MISSING chromium chromium-driver"
  if [ -n "$MISSING" ]; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $MISSING >/dev/null
  fi
fi
WITH_LIBRETRANSLATE=1  # LibreTranslate in .venv-lt, for tests/test_argos.py
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
# one pytest worker per core, at most 4 (pytest-xdist); a worker takes the tests of another once its own are done.
# Later flags win: `bash scripts/test.sh -n 0` runs in one process.
WORKERS="$(nproc)"; [ "$WORKERS" -gt 4 ] && WORKERS=4
exec "$PY" -m pytest -q -n "$WORKERS" --dist worksteal tests "$@"
