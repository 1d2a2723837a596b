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
FRESH=0
if ! "$PY" -c "import torch" 2>/dev/null; then
  FRESH=1
  "$PY" -m pip install -q --no-compile torch==2.13.0 >&2
fi
"$PY" -m pip install -q --no-compile -e '.[test]' >&2
# Byte-compiled here, on every core: where PYTHONDONTWRITEBYTECODE is set (this project's
# machines and CI), Python never writes a .pyc itself, so every process (a command's parent,
# each worker after its fork, each pytest worker) would compile what it imports from source
# again (a command's parent: 0.45 -> 0.25 CPU s with kvfuzz's own compiled). pip compiles what
# it installs on one core; compileall -j 0 does it on all (a fresh set-up: 64 -> 54 s here).
# Some files in site-packages do not compile (templates, tests of other Pythons): not an error.
# A stale .pyc is never used (its header holds its source's mtime).
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$FRESH" = 1 ] || [ ! -d "$SITE/triton/__pycache__" ]; then
  "$PY" -m compileall -q -j 0 "$SITE" > /dev/null 2>&1 || true
fi
"$PY" -m compileall -q -j 0 fuzz kvref kvkernels tests benchmarks >&2
# The morning page's browser test (tests/tools/test_morning_page.py) opens it in Debian's chromium.
# Where this runs as root with apt and chromium is missing, it is installed quietly, tried once per
# venv (a machine that cannot reach a mirror does not wait on apt at every set-up); elsewhere that
# test skips and says why. KVFUZZ_NO_CHROMIUM=1: never try.
if [ "${KVFUZZ_NO_CHROMIUM:-0}" != 1 ] && [ ! -e "$VENV/.chromium-tried" ] && ! command -v chromium > /dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
  touch "$VENV/.chromium-tried"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
    > /dev/null 2>&1 || echo "ci/setup.sh: could not install chromium (apt-get install chromium); the browser test will skip" >&2
fi
echo "$PY"
