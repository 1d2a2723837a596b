"""``kvfuzz report DIR... --html FILE``: the morning page of the last night given.

The last ``DIR`` is tonight; the ones before it (oldest first) and the ``--history`` file's
nights are the nights before, for the trends and for "since the night before". With
``--history``, tonight's line is then appended to it (replacing the line of a night already
there), so a nightly that runs this at its end grows the history by one line a night.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .night import ReportUsageError, read_night, record
from .nights import append_history, load_history, sequence
from .page import render


def main(dirs, html, history=None) -> int:
    out = Path(html)
    if out.is_dir():
        raise ReportUsageError(f"--html {html}: is a directory; give a file name")
    nights = [read_night(d) for d in dirs]
    tonight = nights[-1]
    past, problems = load_history(history) if history else ([], [])
    seq = sequence(past, [record(n) for n in nights])
    seq.append(seq.pop(next(i for i, r in enumerate(seq) if r["id"] == tonight["id"])))  # tonight last
    text = render(tonight, seq, out, problems)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if history:
        append_history(history, seq[-1])
    for p in problems:
        print(f"kvfuzz report: {p}", file=sys.stderr)
    new = sum(f["status"] == "new" for f in tonight["findings"])
    print(f"kvfuzz report: {tonight['label']}: {len(tonight['campaigns'])} campaign(s), {len(tonight['findings'])} "
          f"finding(s) ({new} new), {len(tonight['no_longer_seen'])} no longer seen, {len(seq)} night(s) in the "
          f"trends; {out} ({len(text.encode()) / 1024:.0f} KiB)")
    return 0
