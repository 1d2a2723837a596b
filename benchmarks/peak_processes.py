"""The most processes a kvfuzz command has alive at once: its own, its fork daemons' and every child's.

A campaign's fresh children (rated replays, shrink candidates, their siblings and the children
started ahead of them) are forked from its fork daemons, not from the campaign, so the command
runs with a ``KVFUZZ_ZYGOTE_DIR`` of its own and every process whose environment names that
directory is counted, every 0.1 s. On a GPU each such child is a CUDA context: this is what a
campaign asks of a GPU that other workers share.

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/peak_processes.py -- \\
        .venv/bin/python -m fuzz run --kernels tests/fixtures/kernels/foreign/segfault.py \\
        --max-sequences 6 --ops-per-sequence 30 --workers 1 --seed 0 --shrink-jobs 4 --out /tmp/c

Prints ``rc=... peak_processes=... wall=...s``; the command's output goes to ``--log``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def count(key: bytes) -> int:
    """Processes whose environment holds ``key`` (one that ends meanwhile is not counted)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += key in Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                pass
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "peak_processes.log",
                    help="where the command's output goes")
    ap.add_argument("--every-s", type=float, default=0.1)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command: peak_processes.py -- COMMAND ARGS...")
    zdir = tempfile.mkdtemp(prefix="kvfuzz-peak-")
    key = f"KVFUZZ_ZYGOTE_DIR={zdir}".encode()
    start, peak = time.monotonic(), 0
    try:
        with args.log.open("w") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "KVFUZZ_ZYGOTE_DIR": zdir})
            while proc.poll() is None:
                peak = max(peak, count(key))
                time.sleep(args.every_s)
    finally:
        shutil.rmtree(zdir, ignore_errors=True)  # its daemons see their socket gone and exit
    print(f"rc={proc.returncode} peak_processes={peak} wall={time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
