"""The tracks, by name: each a kind of sequence behind one protocol (``base.Track``).

``small`` (the allocator state machine on small pools), ``production`` (kernel-level
ops at production shapes) and ``compile`` (every kernel compiled for a GPU target at the
specializations a campaign meets, no GPU needed). ``of_ops`` picks the track that owns a sequence's ops, which
is how a case replays on the right runner without saying which.
"""

from __future__ import annotations

from .base import Sequence, Track
from .compile import CompileTrack
from .production import ProductionTrack
from .small import SmallTrack

TRACKS: dict[str, Track] = {t.name: t for t in (SmallTrack(), ProductionTrack(), CompileTrack())}

__all__ = ["TRACKS", "Sequence", "Track", "get", "of_ops"]


def get(name: str) -> Track:
    try:
        return TRACKS[name]
    except KeyError:
        raise ValueError(f"unknown track {name!r}; choose one of {', '.join(TRACKS)}") from None


def of_ops(ops) -> Track:
    """The track that owns these ops (all of one track; an empty list is small's)."""
    names = {op.track for op in ops} or {"small"}
    if len(names) > 1:
        raise ValueError(f"a sequence mixes ops of the tracks {', '.join(sorted(names))}")
    return get(names.pop())
