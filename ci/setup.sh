#!/usr/bin/env bash
# Set up a virtual environment for kvfuzz (idempotent). Prints the python to use.
# A fresh CPU machine gets the CPU build of torch (torch==2.13.0, from local disk here;
# an unpinned torch would pull a multi-GB CUDA build). A machine that already has torch
# (a GPU box) can skip the venv: KVFUZZ_NO_VENV=1 uses the current python as is.
# --no-compile: no byte-compiling of every file of torch at install (about 20 s of a fresh
# set-up here); Python compiles the modules that are imported, once, when they first are.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KVFUZZ_NO_VENV:-0}" = 1 ]; then
  command -v python3
  exit 0
fi
VENV=${KVFUZZ_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" >&2
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q --no-compile torch==2.13.0 >&2
fi
"$PY" -m pip install -q --no-compile -e '.[test]' >&2
echo "$PY"
