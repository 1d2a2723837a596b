"""The track protocol: how sequences of one kind are made, run, rebuilt and replayed.

A track owns a family of ops (``Op.track``) and everything that differs between
families: the generator of a seed's sequence, the runner and its oracle, the info a
parent needs to rebuild a dead worker's ops, and the op kinds a kernel set must have
exercised before a long clean run counts as clean. The campaign, the workers, the
executor, the minimizer and the CLI speak only to this protocol; a new track is a new
module registered in ``tracks/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kvref

from ..ops import Op
from ..verdict import Divergence, RunStats


@dataclass
class Sequence:
    """What one generated sequence did in a worker."""

    config: kvref.PoolConfig
    scenario: str
    ops: list[Op]
    divergence: Divergence | None
    stats: RunStats
    knobs: dict | None = None
    extra: dict = field(default_factory=dict)  # written into the case (e.g. the shapes drawn)
    elements: int = 0  # result elements diffed against the oracle
    run: object = None  # the runner, for tests and benchmarks

    def __post_init__(self):
        if self.divergence is not None:  # kept by rates and minimizers: not the frames (and buffers) that raised it
            self.divergence.with_traceback(None)


class Track:
    """The protocol; ``small`` and ``production`` implement it."""

    name: str = ""
    default_ops: int = 200  # ops per generated sequence
    gpu_warmup: int = 0  # warm-up sequences a GPU worker runs before it is timed (``generate.warmup_seed``)
    uses_allocator: bool = False  # its sequences drive an allocator (``--allocator`` swaps it)
    head_start: bool = False  # a GPU worker scouts its first sequences and compiles what they meet in parallel (head_start.py)
    palette_on_gpu: bool = False  # ``--palette auto`` gives its GPU workers a palette of sizes (each new size compiles)
    case_extra: dict = {}  # keys every case of this track records (read back by nothing: for people)

    def worker_info(self, tier, *, palette_seed: int | None = None) -> dict:
        """JSON the parent keeps from a worker's hello: with a seed and an op index, enough to
        rebuild the ops that worker ran (``regenerate``) without importing the kernel set.
        ``palette_seed``: the worker's palette of sizes (``production.palette``), for a track
        whose sizes a GPU compiles per value; the others ignore it."""
        raise NotImplementedError

    def case_extra_of(self, info: dict) -> dict:
        """The keys a case of a worker that said ``info`` in its hello records (``case_extra``,
        and what the worker drew from, for people: ops in a case are explicit)."""
        return dict(self.case_extra)

    def choose_knobs(self, tier, seed: int, worker_knobs: dict | None) -> dict | None:
        """The launch knobs of a sequence (``worker_knobs``: the GPU worker's fixed choice)."""
        return None

    def run_sequence(self, tier, seed: int, n_ops: int, *, deadline: float | None = None, beat=None,
                     knobs: dict | None = None, hostile: str = "spec", check_every: int = 1,
                     palette_seed: int | None = None) -> Sequence:
        """Run ``seed``'s sequence; ``palette_seed`` as in ``worker_info`` (the same one: what the
        worker runs is what ``regenerate`` rebuilds from its hello)."""
        raise NotImplementedError

    def regenerate(self, seed: int, n_ops: int, info: dict, *, hostile: str = "spec") -> tuple[kvref.PoolConfig, str, list[Op]]:
        """(config, scenario, the first ``n_ops`` ops) of ``seed``'s sequence, from ``info`` alone."""
        raise NotImplementedError

    def runner(self, config: kvref.PoolConfig, tier, **kw):
        """A fresh runner: ``step(op)`` raises Divergence, ``finish()`` runs the final checks."""
        raise NotImplementedError

    def expected_kinds(self, has) -> set[str]:
        """Op kinds a long clean run must have run (``has``: the set's optional functions)."""
        return set()

    def exhausted(self, tier) -> bool:
        """Whether this process has run every sequence this track can make for ``tier``'s set
        (a finite track such as ``compile``): a worker may stop before its budget ends."""
        return False

    def replay(self, config: kvref.PoolConfig, ops: list[Op], tier, **kw) -> tuple[Divergence | None, object]:
        """Run ``ops`` from a fresh state; the first divergence (or None) and the runner."""
        run = self.runner(config, tier, **kw)
        try:
            for op in ops:
                run.step(op)
            run.finish()
        except Divergence as d:  # kept by minimizers and rates: without the frames (and buffers) that raised it
            return d.with_traceback(None), run
        return None, run
