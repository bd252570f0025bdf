#!/usr/bin/env bash
# Creates .venv in the repository root (once) and installs the pinned requirements into it.
# Sourced by demo.sh and test.sh; afterwards $PY is the virtual environment's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
STAMP="$VENV/.requirements.sha256"
WANT="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt"
  echo "$WANT" > "$STAMP"
fi
PY="$VENV/bin/python"
# WITH_LIBRETRANSLATE=1 (scripts/test.sh sets it): LibreTranslate in .venv-lt, apart, since its pins conflict with
# ours (requirements-lt.txt says which); tests/test_argos.py serves the exported packages with it
if [ "${WITH_LIBRETRANSLATE:-}" = 1 ]; then
  LT_VENV="$ROOT/.venv-lt"
  [ -x "$LT_VENV/bin/python" ] || python3 -m venv "$LT_VENV"
  LT_STAMP="$LT_VENV/.requirements.sha256"
  LT_WANT="$(sha256sum "$ROOT/requirements-lt.txt" | cut -d' ' -f1)"
  if [ ! -f "$LT_STAMP" ] || [ "$(cat "$LT_STAMP")" != "$LT_WANT" ]; then
    "$LT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements-lt.txt"
    echo "$LT_WANT" > "$LT_STAMP"
  fi
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# the fused training kernels (fast/kernels.py): built once per source, TensorFlow version and compiler; a failed
# build is remembered, and training then runs TensorFlow's ops (as it does without g++), with one line saying why
(cd "$ROOT" && "$PY" -m fast.kernels)
