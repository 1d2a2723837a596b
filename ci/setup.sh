#!/usr/bin/env bash
# Set up a virtual environment for kvfuzz (idempotent). Prints the python to use.
# A fresh CPU machine gets the CPU build of torch (torch==2.13.0, from local disk here;
# an unpinned torch would pull a multi-GB CUDA build). A machine that already has torch
# (a GPU box) can skip the venv: KVFUZZ_NO_VENV=1 uses the current python as is.
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
  "$PY" -m pip install -q torch==2.13.0 >&2
fi
"$PY" -m pip install -q -e '.[test]' >&2
# kvfuzz's own modules byte-compiled once, here: where PYTHONDONTWRITEBYTECODE is set (this
# project's machines and CI), Python never writes them itself, so every process (a command's
# parent, each worker after its fork, each pytest worker) compiled them from source again
# (a command's parent: 0.45 -> 0.25 CPU s). A stale .pyc is never used (its source's mtime).
"$PY" -m compileall -q -j 0 fuzz kvref kvkernels tests benchmarks >&2
echo "$PY"
