"""Coverage-guided generation for the small track: a corpus of sequences kept for the features
they alone reached, mutated and scheduled by rarity (libFuzzer's ``InputCorpus``).

An input is a **choice stream** (``streams``: the generator's draws, cut at op marks), so
a mutated input is always a valid sequence; the mutations and the data flow they follow
(which allocs made the rows a read table read) live there.

The corpus (``corpus``: ``Corpus``, ``merge``) is a directory of JSON entries, each written
atomically when found. A guided sequence's stream is written under ``.seq/`` before it runs, so
the parent rebuilds a dead worker's ops (``GuidedTrack.regenerate``).

The schedule (``GuidedTrack.plan``): ``SEED_ENTRIES`` fresh sequences of ``FRESH_OPS`` ops
(or ``FRESH_PROGRAMS`` programs launched, their cost on the interpreter: a pure op whose launch
would pass it is dropped before it runs, ``budget``, and the sequence ends there),
then a share ``FRESH`` of them fresh, the rest mutations; of those, ``FRONTIER`` go to the entries whose read
table made the most trips (``Corpus.frontier``), most of them one edit aimed at the trips x
last-block feature next to it that no entry holds (``aim``: ``aimed_edit``, ``missing``, ``aim``), run
``AIM_TAIL`` ops past the stone; the rest are picked by rarity (``Corpus.pick``), one to three
drawn edits near the op that reached the feature, run ``TAIL`` past it
(benchmarks/results/guided-vs-blind/README.md).

A read the target already ran and passed from the same history of state-changing ops (a plan's
replayed prefix, a repeated read table) is not run again, its features replayed (``KnownReads``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import random
import time
from pathlib import Path

from .aim import aim, aimed_edit, frontier, missing
from .corpus import DOMAIN_WEIGHT, Corpus, _write_json
from .features import (
    CodeCoverage,
    Collector,
    config_features,
    feature_id,
    files_under_test,
    knobs_feature,
)
from .generate import regenerate, sequence_r2t_dtype
from .knobs import choose, knob_module
from .launches import program_order_mode
from .mutations import mutate
from .streams import (
    ChoiceRandom,
    data_flow,
    params_of,
    rare_config,
    rare_scenario,
    reconfig_wants,
    retune,
    scenario_names,
)
from .tracks.small import SmallTrack

__all__ = ["ChoiceRandom", "Corpus", "GuidedTrack", "KnownReads", "aim", "aimed_edit", "frontier", "missing", "mutate",
           "params_of", "track_for"]
SEED_ENTRIES = 4  # fresh sequences until the corpus holds this many (AFL's seed corpus: a few first finds narrow it)
FRESH = 0.2  # share of guided sequences drawn fresh (blind), so the corpus keeps growing from outside itself
CODE_EVERY = 4  # code coverage on one sequence in this many (its tracer costs ~30% of an interpreted op)
KERNEL_CODE_EVERY = 32  # and the interpreter's @triton.jit bodies traced on one in this many (~2.5x)
CODE_DRY, CODE_BACKOFF = 4, 3  # code's interval doubles per this many traced sequences with no new arc, at most this often
RELOAD_EVERY = 16  # sequences between rescans of the corpus directory (other workers' finds)
SEQ_KEPT = 64  # streams kept under .seq/ per worker process, for rebuilding a dead worker's ops
FRONTIER = 0.7  # share of mutated plans given to ``Corpus.frontier`` (the rest: ``Corpus.pick``, by rarity)
TAIL = 56  # a mutation aimed at an op runs this many ops past it (repeat's copies and what they feed), not all 200
AIMED = 0.75  # share of frontier plans that are one aimed edit alone (``aimed_edit``: resize, or shrink the knobs)
AIM_TAIL = 8  # ... and run this many ops past the table op it aimed: the row is read there
FRESH_OPS = 40  # a fresh sequence's length: a stone is what the mutations need, not 200 ops of it
FRESH_PROGRAMS = 400  # ... or less: it ends before its launches would run more programs than this (the interpreter's cost)
RECONFIG = 0.9  # share of plans ``reconfig_wants`` names a pool shape for that run in one (``plan``)
ALLOCATOR_SPEC_WEIGHT = 64.0  # ... and the spec domain's where a named allocator is under test (``domain_weights``)
KNOWN_MAX = 1 << 12  # ``KnownReads``: reads kept (then it starts again; each holds its launches' features, a few KB)


class KnownReads:
    """The pure ops (``Op.pure``: reads, read tables) that ran on the target and passed every
    check, by the history of state-changing ops before them (a hash chain from the run's
    config, knobs and hostile mode) and the op, with what their launches reached: a mutated
    plan replays its entry's ops up to its first edit, and a repeated read table leaves the
    state where it was, so the same read from the same state comes again and again (a quarter
    of a guided run's CPU seconds, guided-vs-blind/known-reads.md). The target is a function
    of its history (a case replays from its ops alone), so ``runner.PoolRun`` does not run such
    a read again, and the features its launches reached are replayed into ``collector`` as at
    that op (``Collector.take``): a run's features, and so the corpus and every later plan, are
    those of running it. Only for one tier at a time, every op checked, the interpreter's
    program order and kvfuzz's own allocator. A run whose code is traced runs every read (its
    arcs come from its own calls: running only a read's host code, its launches recorded, left
    the line tracer's arcs around the launch other than a launch that ran leaves them) and
    records them for the next (``replaying`` off: ``GuidedTrack.run_sequence``)."""

    def __init__(self):
        self.memo: dict[tuple, tuple] = {}
        self.tier = None
        self.collector: Collector | None = None
        self.replaying = True

    def begin(self, tier, start: str) -> bytes:
        """The history of a run's first op (``start``: what it runs under)."""
        if tier is not self.tier or len(self.memo) >= KNOWN_MAX:
            self.memo.clear()
            self.tier = tier
        return hashlib.sha1(start.encode()).digest()

    @staticmethod
    def after(history: bytes, op) -> bytes:
        return hashlib.sha1(history + repr(op).encode()).digest()

    def replay(self, key: tuple) -> bool:
        """Whether ``key`` (history, op) is known; if so, its launches' features are taken again."""
        launches = self.memo.get(key) if self.replaying else None
        if launches is None:
            return False
        for programs, names, goals in launches:
            self.collector.take(programs, names, goals)
        return True

    @contextlib.contextmanager
    def recording(self, key: tuple):
        """Around the op's run: its launches logged, and known once it passed (no Divergence)."""
        col = self.collector
        col.log = []
        try:
            yield
            col.flush()  # a deferred collector's launches of this op: into the log
            self.memo[key] = tuple(col.log)
        finally:
            col.log = None


class GuidedTrack(SmallTrack):
    """The small track, its sequences planned from a corpus. One per process and corpus
    (``track_for``): a worker keeps its corpus in memory and on disk; the parent only reads
    the ``.seq/`` streams back (``regenerate``)."""

    def __init__(self, root: str | Path, known_reads: bool = True, launch_budget: bool = True):
        self.root = Path(root).resolve()
        self._corpus: Corpus | None = None
        self._plans: dict[int, dict] = {}
        self._code: CodeCoverage | None = None
        self._noted: bool | None = None  # what ``Corpus.note_sources`` was told: None (nothing), the files, with kernel bodies
        self.known = KnownReads() if known_reads else None  # off: every read runs (benchmarks/guided_vs_blind.py)
        self.launch_budget = launch_budget  # off: a fresh sequence's budget is checked between ops only, not per launch
        self.sequences = 0
        self.code_dry = 0  # traced sequences in a row that reached no code arc the corpus lacked (``code_schedule``)
        self.kept = 0
        self._seq_seeds: list[int] = []  # the seeds whose streams are under .seq/, oldest first

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = Corpus(self.root)
        return self._corpus

    def worker_info(self, tier, *, palette_seed=None) -> dict:
        info = {**super().worker_info(tier), "corpus": str(self.root)}
        if note := self.corpus.note():
            info["notes"] = [*info.get("notes", ()), note]
        return info

    def plan(self, tier, seed: int) -> dict:
        """What sequence ``seed`` runs: fresh (as blind, ``FRESH_OPS`` long) or a mutation of a
        corpus entry (a frontier plan's aimed edit, or a pick by rarity), and how long it runs."""
        if seed in self._plans:
            return self._plans[seed]
        rng = random.Random(f"kvfuzz-guide:{seed}")
        corpus = self.corpus
        if len(corpus.entries) < SEED_ENTRIES or rng.random() < FRESH:  # fresh ops, the knobs least tried
            knobs = self.rare_knobs(tier.kernels, rng) or choose(tier.kernels, seed)
            stream = self._fresh_stream(seed, rng, super().worker_info(tier)["chains"])
            plan = {"stream": stream, "knobs": knobs, "r2t": sequence_r2t_dtype(seed), "how": ["fresh"], "length": FRESH_OPS}
        else:
            front = rng.random() < FRONTIER and corpus.frontier(rng)
            entry, why = front or corpus.pick(rng, domain_weights(tier))
            focus = (entry.get("where") or {}).get(why)
            only = front and rng.random() < AIMED and aimed_edit(entry, why, tier.kernels)
            stream, marks, knobs, how = mutate(entry, rng.choice(corpus.entries), rng, tier.kernels,
                                               focus=focus, shadow=self._shadow(tier, seed, entry),
                                               rare_knobs=self.rare_knobs(tier.kernels, rng),
                                               goal=aim(frontier(entry, why, rng), why, corpus.counts, rng), only=only)
            if (wants := reconfig_wants(why, corpus.counts)) and rng.random() < RECONFIG:  # its ops, another pool
                stream, how = (tuned, [*how, "reconfig"]) if (tuned := retune(stream, seed, rng.choice(wants), rng)) else (stream, how)
            tail = AIM_TAIL if only and how == [only] else TAIL
            plan = {"stream": stream, "marks": marks, "knobs": knobs, "r2t": entry.get("r2t") or sequence_r2t_dtype(seed),
                    "how": how, "parent": entry, "why": why,
                    "length": (entry.get("ops") or 0) + TAIL if focus is None else focus + 1 + tail}
        self._plans = {seed: plan}
        return plan

    def _fresh_stream(self, seed: int, rng: random.Random, chains) -> list[float]:
        """A fresh sequence's stream: its pool config (its own RNG's) the least held of a few draws
        (``rare_config``: a corpus grown from its first entries stayed on one grow direction), then
        the scenario the corpus holds fewest entries of among those the tier runs (``rare_scenario``)."""
        pick = rare_scenario(self.corpus.counts, chains, rng)
        return [*rare_config(self.corpus.counts, seed), (pick + 0.5) / len(scenario_names())]

    def rare_knobs(self, kernels, rng: random.Random) -> dict | None:
        """One of the launch-knob combinations the corpus holds fewest entries of (none yet, first):
        what a fresh sequence runs under (stratified, where a seed's draw takes each with its share
        only), and what the knob mutation tries. Shapes only one combination makes (three trips at
        fuzzing sizes need the smallest block *and* the fewest programs) would wait for a draw."""
        if (mod := knob_module(kernels)) is None:
            return None
        names = sorted(mod.FUZZ_KNOBS)
        combos = [dict(zip(names, v)) for v in itertools.islice(
            itertools.product(*(tuple(mod.FUZZ_KNOBS[n]) for n in names)), 256)]
        counts = [self.corpus.counts.get(feature_id(knobs_feature(c)), 0) for c in combos]
        return rng.choice([c for c, n in zip(combos, counts) if n == min(counts)]) if combos else None

    def _shadow(self, tier, seed: int, entry: dict):
        """A mutation's shadow run: ``stream`` -> (ops, config, the stream as drawn, its ranges and
        marks), the generator against the spec alone for the entry's length, as sequence ``seed``
        will draw it (its fresh draws included), so a mutation can check what it made."""
        info = super().worker_info(tier)
        has, skips = info["has"], sorted(getattr(tier, "allocator_skips", ()))
        rules = sorted(getattr(tier, "spec_rules", ()))

        def run(stream, marks_in):
            config, scenario, rng = params_of(stream, seed, marks_in, chains=info["chains"])
            marks: list[int] = []
            _, _, ops = regenerate(seed, entry.get("ops", 0), has=has, skips=skips, hostile=entry.get("hostile", "spec"),
                                   params=(config, scenario, rng), r2t_dtype=entry.get("r2t"),
                                   on_op=lambda: _begin(rng, marks), rules=rules)
            return ops, config, {"stream": rng.log, "ranges": rng.ranges, "marks": marks}
        return run

    def choose_knobs(self, tier, seed, worker_knobs):
        return worker_knobs if worker_knobs is not None else self.plan(tier, seed)["knobs"]

    def run_sequence(self, tier, seed, n_ops, *, knobs=None, **kw):
        """Run the plan, ``n_ops`` at most (a mutation aimed at an op stops ``TAIL`` ops past it:
        what comes later is the entry's own ops again, whose features it already holds)."""
        plan = self.plan(tier, seed)
        n_ops = min(n_ops, plan.get("length") or n_ops)
        seq_dir = self.root / ".seq"
        seq_dir.mkdir(parents=True, exist_ok=True)
        _write_json(seq_dir / f"{seed}.json", {"stream": plan["stream"], "marks": plan.get("marks"), "r2t": plan["r2t"]})
        old = seq_dir / f"{self._kept_seeds_pop(seed)}.json"
        if old.name != f"{seed}.json":
            old.unlink(missing_ok=True)
        params = params_of(plan["stream"], seed, plan.get("marks"), chains=super().worker_info(tier)["chains"])
        rng, marks = params[2], []
        code = None
        traced, kernels = code_schedule(self.sequences, self.code_dry)
        if traced:
            if self._code is None:
                self._code = CodeCoverage(files_under_test(tier))
            if self._noted is None or (kernels and not self._noted):  # the files, then the kernel bodies traced
                self.corpus.note_sources(self._code.files, kernels)
                self._noted = kernels
            self._code.trace_kernels = kernels
            code = self._code
        self.sequences += 1
        t0 = time.process_time()  # CPU: the machine may be shared
        col, fresh = Collector(code, deferred=tier.backend == "cuda"), plan["how"] == ["fresh"]
        known = None  # another allocator may keep hidden state; another program order, a race a read would meet
        if self.known is not None and tier.allocator_cls is None and program_order_mode() == "launch":
            known, self.known.collector, self.known.replaying = self.known, col, code is None
        with col:
            seq = super().run_sequence(tier, seed, n_ops, knobs=plan["knobs"] if knobs is None else knobs,
                                       params=params, r2t_dtype=plan["r2t"], on_op=lambda: col.at(marks, _begin(rng)),
                                       stop=(lambda: col.programs >= FRESH_PROGRAMS) if fresh else None,
                                       budget=(lambda n: col.programs + n > FRESH_PROGRAMS) if fresh and self.launch_budget else None,
                                       known=known, **kw)
        col.add_run(seq.run)
        col.names |= config_features(seq.config, seq.scenario, seq.knobs)
        if self.sequences % RELOAD_EVERY == 0:
            self.corpus.reload()
        cost = round(time.process_time() - t0, 4)
        if code is not None:
            self.code_dry = 0 if self.corpus.novel(n for n in col.names if n.startswith("code|")) else self.code_dry + 1
        if self.corpus.novel(col.names):  # kept: which allocs made the rows each table op read, for resize
            flow = data_flow(seq.config, seq.ops, super().worker_info(tier)["has"], getattr(tier, "allocator_skips", ()),
                             getattr(tier, "spec_rules", ()))
            self.kept += self.corpus.add({
                "stream": rng.log, "ranges": rng.ranges, "marks": marks, "knobs": seq.knobs, "r2t": plan["r2t"],
                "features": sorted(col.names), "where": col.where, "goals": col.goals, "ops": len(seq.ops), "seed": seed, "how": plan["how"],
                "hostile": kw.get("hostile", "spec"), "cost_s": cost, "found": time.time(), **flow}, parent=plan.get("parent"))
        seq.extra = {**seq.extra, "guided": plan["how"]}
        return seq

    def _kept_seeds_pop(self, seed: int) -> int:
        """The seed whose stream falls out of the last SEQ_KEPT (itself while there are fewer)."""
        kept = self._seq_seeds
        kept.append(seed)
        return kept.pop(0) if len(kept) > SEQ_KEPT else seed

    def regenerate(self, seed, n_ops, info, *, hostile="spec"):
        path = Path(info.get("corpus") or self.root) / ".seq" / f"{seed}.json"
        if not path.is_file():
            return super().regenerate(seed, n_ops, info, hostile=hostile)
        saved = json.loads(path.read_text())
        params = params_of(saved["stream"], seed, saved.get("marks"), chains=info.get("chains", True))
        return regenerate(seed, n_ops, has=info.get("has", ()), hostile=hostile, skips=info.get("skips", ()),
                          params=params, r2t_dtype=saved["r2t"], on_op=params[2].begin_op, rules=info.get("rules", ()))


def domain_weights(tier) -> dict:
    """``Corpus.pick``'s domain weights for ``tier``: where a named allocator is what is under test
    (``--allocator``, a mutant's class), the spec domain (how kvref's flush ended, behind which
    reader) weighs ``ALLOCATOR_SPEC_WEIGHT``. Its flush bugs sit at those conjunctions, and at the
    rare conjunctions' common weight most picks go to code arcs and op kinds: over 50 seeds (6,000
    ops each) guided misses the move-limit bug twice and the pinned page once at 4, neither at 64
    (benchmarks/results/guided-vs-blind-foreign/). A kernel set's tier keeps them level: the
    same weight there costs kv_start and third-trip kills (3 and 2 missed of 18)."""
    if getattr(tier, "allocator_cls", None) is None:
        return DOMAIN_WEIGHT
    return {**DOMAIN_WEIGHT, "spec": ALLOCATOR_SPEC_WEIGHT}


def code_schedule(i: int, dry: int = 0) -> tuple[bool, bool]:
    """(code coverage on, the interpreted kernel bodies traced too) for a worker's sequence ``i``:
    code on the last of every ``CODE_EVERY`` (the 4th, 8th, ...), the kernel bodies on the last of
    every ``KERNEL_CODE_EVERY`` (the 32nd, 64th, ...). The first sequences run untraced: most
    catalogue mutants and many fixture runs die in the fresh phase, and a traced sequence pays
    the tracer's start (~0.15 CPU s the first time) and ~25 % more per op, a kernel-traced one
    ~2.5x. Tracing the second sequence, kernel bodies included, costs up to a third of a
    fixture's time to kill in CPU seconds (guided-vs-blind/traced-sequences.md). Once code
    stops paying (``dry`` traced sequences in a row reached no arc the corpus lacked), its interval
    doubles per ``CODE_DRY`` of them, up to ``CODE_BACKOFF`` times (one in 32): on a team's
    allocator the tracer is about 18 % of a guided op's cost, and its arcs are held early
    (guided-vs-blind-foreign/README.md)."""
    every = CODE_EVERY << min(dry // CODE_DRY, CODE_BACKOFF)
    kernels = i % KERNEL_CODE_EVERY == KERNEL_CODE_EVERY - 1
    return kernels or i % every == every - 1, kernels


def _begin(rng: ChoiceRandom, marks: list | None = None) -> int:
    """An op begins: the stream moves to its segment (op-aligned replay); where its draws begin."""
    rng.begin_op()
    if marks is not None:
        marks.append(rng.pos)
    return rng.pos


_TRACKS: dict[str, GuidedTrack] = {}


def track_for(root: str | Path) -> GuidedTrack:
    """The process's guided track over corpus ``root``."""
    key = str(Path(root).resolve())
    if key not in _TRACKS:
        _TRACKS[key] = GuidedTrack(key)
    return _TRACKS[key]
