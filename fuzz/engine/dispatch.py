"""Replay a sequence on the runner of the track that owns its ops: the one dispatch above both runners."""

from __future__ import annotations

import kvref

from . import tracks
from .kinds import parse_ops


def replay(config: kvref.PoolConfig, ops, tier, **kw):
    """Run ``ops`` (records, or their JSON form) from a fresh state; (first divergence or
    None, the runner). Keywords: ``knobs``, ``strict_knobs``, ``hostile``, ``check_every``,
    ``beat`` (told each op's index before it runs), ``guard_rows``."""
    ops = parse_ops(ops)
    return tracks.of_ops(ops).replay(config, ops, tier, **kw)
