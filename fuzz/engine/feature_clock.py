"""Features reached over a guided campaign's time: the corpus, looked at now and then.

The workers write each entry that reached a new feature into the corpus directory as they
find it; the parent reads what was added since its last look (``Corpus.reload`` reads only
new files) every ``EVERY_S`` seconds and notes ``[seconds, entries, features]``. The
summary's ``feature_timeline`` is those samples, so the morning page can draw features over
the night. A long night keeps at most ``MAX_POINTS`` samples: past that every other one is
dropped and the spacing doubles, so the cost stays that of one directory listing per look.
"""

from __future__ import annotations

from pathlib import Path

EVERY_S = 2.0
MAX_POINTS = 256


class FeatureClock:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.corpus = None
        self.points: list[list] = []
        self.every = EVERY_S
        self.last = float("-inf")

    def tick(self, at: float, force: bool = False) -> None:
        """A sample at ``at`` seconds into the run, if one is due (or ``force``: the last)."""
        if not force and at - self.last < self.every:
            return
        from .guide import Corpus

        if self.corpus is None:
            self.corpus = Corpus(self.root)
        else:
            self.corpus.reload()
        self.last = at
        self.points.append([round(at, 2), len(self.corpus.entries), len(self.corpus.counts)])
        if len(self.points) > MAX_POINTS:
            self.points = self.points[::-2][::-1]  # every other one, the latest kept
            self.every *= 2
