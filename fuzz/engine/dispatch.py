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


def judge(config: kvref.PoolConfig, ops, tier, **kw):
    """``replay`` for a verdict in this process: ``supervise.NotRun`` where it passed with an op
    that could not run here (a far table with no room on a shared GPU), as a supervised child
    answers "unknown": such a pass is neither a pass nor a failure."""
    from .supervise import NotRun
    from .verdict import unrun_notes

    d, run = replay(config, ops, tier, **kw)
    if d is None and (unrun := unrun_notes(run)):
        raise NotRun("; ".join(unrun[:3]))
    return d, run
