"""The compile track: every Triton kernel of a set compiled for a GPU target, at the
specializations a campaign meets (``fuzz.engine.compile_check``).

A worker first *learns* the set: a few small-track sequences (the warm-up seeds: every page
size, with the set's launch knobs drawn per seed, hostile inputs off) run while a
``LaunchBook`` digests every launch; that book, with the target, is the worker's hello
(``worker_info``), and every sequence's ops are rebuilt from it and the seed alone
(``regenerate``). Compiling needs no GPU: under ``--backend interpret`` the target is
``KVFUZZ_COMPILE_TARGET`` (default ``cuda:90:32``, an H100/H200), under ``--backend cuda``
the device's own.

A sequence is every op of the set (``learn.candidates``); the compile child caches each
result, so a later sequence re-walks the known ones at once. A failure stops a sequence
only the first time its signature is seen in this process (the next sequence goes past
it), so every distinct failure is reported. Once every op has run, the track is
``exhausted``: a worker that asks (``Track.exhausted``) stops, one that does not waits out
its budget idle (its heartbeat says so) instead of spinning.
"""

from __future__ import annotations

import os
import time

import kvref

from ..compile_check.client import CompileRun, probe
from ..compile_check.learn import LaunchBook, candidates
from ..compile_check.ops import DEFAULT_TARGET
from ..generate import WARMUP_SEQUENCES, warmup_seed
from ..supervise import IDLE
from ..tiers import OPTIONAL, SetupError
from ..verdict import Divergence, RunStats
from .base import Sequence, Track

LEARN_OPS = 40  # ops per learning sequence
CONFIG = kvref.PoolConfig(num_pages=8)  # a compile case has no pool; its config is a placeholder


def target_of(tier) -> str:
    """``KVFUZZ_COMPILE_TARGET``, else the GPU's own on the cuda tier, else ``cuda:90:32``."""
    if os.environ.get("KVFUZZ_COMPILE_TARGET"):
        return os.environ["KVFUZZ_COMPILE_TARGET"]
    if tier.backend == "cuda":
        try:
            from triton.runtime import driver

            t = driver.active.get_current_target()
            return f"{t.backend}:{t.arch}:{t.warp_size}"
        except Exception:  # noqa: BLE001 - no driver to ask: the default target
            pass
    return DEFAULT_TARGET


def learn(tier, seeds=None, n_ops: int = LEARN_OPS) -> dict:
    """The set's launch book (``LaunchBook.to_json``) from small-track sequences run on ``tier``."""
    from .. import launches
    from ..knobs import apply
    from .small import SmallTrack

    if tier.backend == "torch":
        raise SetupError("--scale compile compiles Triton kernels: choose --backend interpret (compiled for "
                         f"{DEFAULT_TARGET} on this CPU) or --backend cuda")
    small, book = SmallTrack(), LaunchBook()
    stop = launches.observe(book)
    try:
        for seed in seeds if seeds is not None else [warmup_seed(i) for i in range(WARMUP_SEQUENCES)]:
            small.run_sequence(tier, seed, n_ops, knobs=small.choose_knobs(tier, seed, None), hostile="off")
    finally:
        stop()
        apply(tier.kernels, None)
    return book.to_json(target_of(tier))


class CompileTrack(Track):
    name = "compile"
    default_ops = 100_000  # a sequence is every op of the set (a few dozen); this only caps it
    case_extra = {"scale": "compile"}

    def __init__(self):
        self._learned: dict[tuple, dict] = {}  # (backend, kernels) -> the book with its target
        self._ran: dict[tuple, set] = {}  # ops run in this process, per kernel set
        self._reported: dict[tuple, set] = {}  # signatures a sequence of this process stopped at

    @staticmethod
    def _key(tier) -> tuple:
        return tier.backend, tier.kernels_name

    def info(self, tier, beat=None) -> dict:
        key = self._key(tier)
        if key not in self._learned:
            book = learn(tier)
            if not book["kernels"]:
                raise SetupError(f"--kernels {tier.kernels_name}: the learning sequences launched no @triton.jit "
                                 f"kernel on the {tier.backend} tier, so there is nothing to compile")
            missing = probe(tier, book["target"], [(k["kernel"], k["file"]) for k in book["kernels"]], beat)
            if missing:
                book["kernels"] = [k for k in book["kernels"] if f"{k['kernel']} ({k['file']})" not in missing]
                book["notes"] = book["notes"] + [f"{m}: not found after importing the set without the "
                                                 "interpreter (made at run time?): not compiled" for m in missing]
            self._learned[key] = book
        return self._learned[key]

    def worker_info(self, tier, *, palette_seed=None) -> dict:
        return {"has": [fn for fn in OPTIONAL if tier.has(fn)], "compile": self.info(tier)}

    def runner(self, config, tier, **kw):
        return CompileRun(config, tier, **kw)

    def exhausted(self, tier) -> bool:
        key = self._key(tier)
        return key in self._learned and set(candidates(self._learned[key], 0)) <= self._ran.get(key, set())

    def run_sequence(self, tier, seed, n_ops, *, deadline=None, beat=None, knobs=None, hostile="spec",
                     check_every=1, palette_seed=None) -> Sequence:
        key = self._key(tier)
        todo = candidates(self.info(tier, beat), seed)[:n_ops]
        ran, reported = self._ran.setdefault(key, set()), self._reported.setdefault(key, set())
        if set(todo) <= ran:
            self._idle(deadline, beat)
            return Sequence(CONFIG, "compile", [], None, RunStats(), extra=dict(self.case_extra))
        run = CompileRun(CONFIG, tier, beat=beat)
        ops: list = []
        for op in todo:
            if deadline is not None and time.monotonic() >= deadline:
                break
            ops.append(op)
            try:
                run.step(op)
            except Divergence as d:
                ran.add(op)
                if d.signature in reported:
                    continue
                reported.add(d.signature)
                ops[-1] = d.op  # the narrowed op, when a screen failed
                return self._sequence(ops, d, run)
            ran.add(op)
        return self._sequence(ops, None, run)

    def _sequence(self, ops, d, run) -> Sequence:
        return Sequence(CONFIG, "compile", ops, d, run.stats, extra=dict(self.case_extra), run=run)

    @staticmethod
    def _idle(deadline, beat) -> None:
        """Nothing left to compile: wait out the budget without spinning (a worker that
        checks ``exhausted`` never gets here)."""
        if deadline is None:
            return
        if beat is not None:
            beat.phase(IDLE)
        while time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def regenerate(self, seed, n_ops, info, *, hostile="spec"):
        return CONFIG, "compile", candidates(info["compile"], seed)[:n_ops]

    def expected_kinds(self, has) -> set[str]:
        return {"c_compile"}
