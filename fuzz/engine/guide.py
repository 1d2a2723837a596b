"""Coverage-guided generation for the small track: a corpus of sequences kept for the features
they alone reached, mutated and scheduled by rarity (libFuzzer's ``InputCorpus``).

An input is not an op list but the **choice stream** the seeded generator consumed
(``ChoiceRandom``: every draw of ``random.Random`` is one float in [0, 1)), with marks where
each op's draws begin. The generator still reads the spec to build every op, so a mutated
stream is always a valid sequence (contract violations only at the generator's own rate),
and mutations at op marks are op-level edits: **delete** an op's draws, **insert** fresh
ones, **splice** two entries at op marks, **swap** an op's kind (its second draw is the
kind's), **nudge** one draw a small step (a size, an index one or a few steps over a
boundary), re-draw a **knob** or a **config** draw. Draws past the stream's end are fresh,
so every sequence runs its full length.

The corpus is a directory of JSON entries (``Corpus``), each written atomically when it is
found: a killed campaign keeps everything found before it, and the next one loads it and
goes on (workers sharing one directory reload each other's finds). Each guided sequence's
stream is also written under ``.seq/`` before it runs, so the parent can rebuild the ops of
a worker that died in it (``GuidedTrack.regenerate``) as it does from a seed.
``merge`` keeps the smallest subset of several corpora covering their union (libFuzzer's
``-merge=1``: greedy, fewest ops first).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

from .features import CodeCoverage, Collector, config_features, feature_id, files_under_test
from .generate import SCENARIOS, random_config, sequence_r2t_dtype
from .knobs import choose, knob_module
from .tracks.small import SmallTrack

FORMAT = "kvfuzz-corpus/1"
SEED_ENTRIES = 8  # fresh sequences until the corpus holds this many (AFL's seed corpus: a few first finds narrow it)
FRESH = 0.2  # share of guided sequences drawn fresh (blind), so the corpus keeps growing from outside itself
CODE_EVERY = 4  # code coverage on one sequence in this many (its tracer costs ~30% of an interpreted op)
KERNEL_CODE_EVERY = 32  # and the interpreter's @triton.jit bodies traced on one in this many (~2.5x)
RELOAD_EVERY = 16  # sequences between rescans of the corpus directory (other workers' finds)
SEQ_KEPT = 64  # streams kept under .seq/ per worker process, for rebuilding a dead worker's ops
MUTATIONS = ("delete", "insert", "repeat", "splice", "swap", "nudge", "knob", "config")
WEIGHTS = (1, 1, 3, 1, 1, 3, 0.5, 0.5)  # a knob or a config draw changes every op after it: seldom


class ChoiceRandom(random.Random):
    """``random.Random`` reading its draws from ``given`` (floats in [0, 1)), then from a fresh
    ``Random(fresh_seed)``; ``log`` is every draw made, ``pos`` how many."""

    def __init__(self, given=(), fresh_seed: int = 0):
        self.given, self.pos, self.log, self.bits = list(given), 0, [], []
        self._fresh = random.Random(fresh_seed)
        super().__init__(0)

    def seed(self, *args, **kwargs):  # the stream is the state: nothing to seed
        pass

    def random(self) -> float:
        u = self.given[self.pos] if self.pos < len(self.given) else self._fresh.random()
        self.pos += 1
        self.log.append(u)
        self.bits.append(0)
        return u

    def getrandbits(self, k: int) -> int:
        if k <= 53:
            r = int(self.random() * (1 << k))
            self.bits[-1] = k
            return r
        return sum(self.getrandbits(min(53, k - i)) << i for i in range(0, k, 53))


def params_of(stream, fresh_seed: int):
    """(config, scenario, rng) of a stream, as ``generate.sequence_params`` draws them from a seed."""
    rng = ChoiceRandom(stream, fresh_seed)
    config = random_config(rng)
    return config, rng.choice(sorted(SCENARIOS)), rng


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Corpus:
    """Entries on disk (``DIR/*.json``), their features counted for rarity."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.entries: list[dict] = []
        self.counts: Counter = Counter()
        self._files: set[str] = set()
        self.reload()

    @property
    def features(self) -> set[int]:
        return set(self.counts)

    def reload(self) -> int:
        """Load entries written since the last look (by this or another worker); how many."""
        new = 0
        for path in sorted(self.root.glob("*.json")):
            if path.name in self._files:
                continue
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # a file another process is replacing: the next look reads it
            if entry.get("format") != FORMAT:
                continue
            self._files.add(path.name)
            self._index(entry)
            new += 1
        return new

    def _index(self, entry: dict) -> None:
        entry["ids"] = {feature_id(n) for n in entry["features"]}
        self.entries.append(entry)
        self.counts.update(entry["ids"])

    def add(self, entry: dict) -> bool:
        """Keep ``entry`` (stream, marks, knobs, r2t, features as names, ops, cost_s) if it reached
        a feature no entry has; written at once."""
        ids = {feature_id(n) for n in entry["features"]}
        if not ids - self.features:
            return False
        body = {k: v for k, v in entry.items() if k != "ids"}
        body["format"] = FORMAT
        name = hashlib.sha1(json.dumps(body["stream"]).encode()).hexdigest()[:16] + ".json"
        _write_json(self.root / name, body)
        self._files.add(name)
        self._index(body)
        return True

    def pick(self, rng: random.Random) -> tuple[dict, str | None]:
        """(an entry, the feature it was picked for), by rarity, domain first as Centipede
        partitions them: a domain weighted by its rarest feature's 1/count (so a few hundred
        code arcs do not drown a dozen trip buckets, and a domain every entry saturates, op
        kinds, is seldom picked), a feature in it by 1/count² (the rarest first), then one of the
        entries holding it. Not by cost: on the interpreter the cheap sequences are those with
        large blocks (one program, one trip), and weighting by 1/cost starved exactly the
        sequences whose rows reach three trips (benchmarks/results/guided-vs-blind-*)."""
        by_domain: dict[int, list[int]] = {}
        for f in self.counts:
            by_domain.setdefault(f >> 40, []).append(f)
        domains = sorted(by_domain)
        feats = by_domain[rng.choices(domains, [max(1.0 / self.counts[f] for f in by_domain[d]) for d in domains])[0]]
        fid = rng.choices(feats, [1.0 / self.counts[f] ** 2 for f in feats])[0]
        holders = [e for e in self.entries if fid in e["ids"]]
        entry = rng.choice(holders)
        return entry, next((n for n in entry["features"] if feature_id(n) == fid), None)


def _segments(entry: dict) -> list[list[list]]:
    """The stream cut at its op marks, each draw ``[u, bits]`` (bits: the width of the integer it
    was read as, 0 for a float): [config draws, op 0's draws, op 1's, ...]."""
    stream, marks = entry["stream"], entry["marks"]
    bits = entry.get("bits") or [0] * len(stream)
    cuts = [0, *marks, len(stream)]
    return [[[u, k] for u, k in zip(stream[x:y], bits[x:y])] for x, y in zip(cuts, cuts[1:])]


def _nudge(seg: list[list], rng: random.Random) -> None:
    """Move one draw of ``seg`` a small step: an integer draw by 1 to 3 units (a size or an
    index one to three over, across a block boundary when it sat next to one), a float by a
    small fraction (a chance near its threshold flips)."""
    if not seg:
        return
    draw = seg[rng.randrange(len(seg))]
    u, k = draw
    if k:
        r = int(u * (1 << k)) + rng.choice((-3, -2, -1, -1, 1, 1, 2, 3))
        draw[0] = (min(max(r, 0), (1 << k) - 1) + 0.5) / (1 << k)
    else:
        draw[0] = min(max(u + rng.choice((-1, 1)) * rng.choice((1 / 1024, 1 / 256, 1 / 64, 1 / 16)), 0.0), 0.999999)


def mutate(entry: dict, other: dict, rng: random.Random, kernels,
           focus: int | None = None) -> tuple[list[float], dict | None, list[str]]:
    """(stream, knobs, the mutations applied): one to three of ``MUTATIONS``. ``focus``: the op
    that first reached the feature the entry was picked for (its ``where``): most edits then
    land on that op or the few before it (which made the state it read), since an edit
    anywhere in a 200-op stream rarely touches it; ``repeat`` inserts nudged copies of it
    right after it, each another try at a neighbouring shape from nearly the same state."""
    segs = _segments(entry)
    knobs = dict(entry.get("knobs") or {}) or None
    done = []

    def op_index() -> int:  # a segment index of an op (1..): near the focus most of the time
        if focus is not None and focus + 1 < len(segs) and rng.random() < 0.75:
            return max(1, focus + 1 - rng.choice((0, 0, 0, 1, 2, 4)))
        return rng.randrange(1, len(segs))

    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choices(MUTATIONS, WEIGHTS)[0]
        ops = len(segs) - 1
        if kind == "delete" and ops > 1:
            del segs[op_index()]
        elif kind == "insert":
            length = len(segs[rng.randrange(1, len(segs))]) if ops else 4
            segs.insert(op_index() if ops else 1, [[rng.random(), 0] for _ in range(length)])
        elif kind == "repeat" and ops:
            i = op_index()
            for j in range(rng.choice((2, 4, 8))):
                copy = [list(d) for d in segs[i]]
                _nudge(copy, rng)
                segs.insert(i + 1 + j, copy)
        elif kind == "splice":
            theirs = _segments(other)
            segs = segs[: rng.randrange(1, len(segs) + 1)] + theirs[rng.randrange(1, len(theirs) + 1):] \
                if len(theirs) > 1 else segs
        elif kind == "swap" and ops:
            seg = segs[op_index()]
            if len(seg) >= 2:
                seg[1] = [rng.random(), 0]
        elif kind == "nudge":
            _nudge(segs[op_index() if ops and rng.random() < 0.9 else rng.randrange(len(segs))], rng)
        elif kind == "knob" and (mod := knob_module(kernels)) is not None:
            name = rng.choice(sorted(mod.FUZZ_KNOBS))
            knobs = {**(knobs or {}), name: rng.choice(tuple(mod.FUZZ_KNOBS[name]))}
        elif kind == "config" and segs[0]:
            segs[0][rng.randrange(len(segs[0]))] = [rng.random(), 0]
        else:
            continue
        done.append(kind)
    return [d[0] for s in segs for d in s], knobs, done


class GuidedTrack(SmallTrack):
    """The small track, its sequences planned from a corpus. One per process and corpus
    (``track_for``): a worker keeps its corpus in memory and on disk; the parent only reads
    the ``.seq/`` streams back (``regenerate``)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self._corpus: Corpus | None = None
        self._plans: dict[int, dict] = {}
        self._code: CodeCoverage | None = None
        self.sequences = 0
        self.kept = 0
        self._seq_seeds: list[int] = []  # the seeds whose streams are under .seq/, oldest first

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = Corpus(self.root)
        return self._corpus

    def worker_info(self, tier, *, palette_seed=None) -> dict:
        return {**super().worker_info(tier), "corpus": str(self.root)}

    def plan(self, tier, seed: int) -> dict:
        """What sequence ``seed`` runs: fresh (as blind) or a mutation of a corpus entry."""
        if seed in self._plans:
            return self._plans[seed]
        rng = random.Random(f"kvfuzz-guide:{seed}")
        corpus = self.corpus
        if len(corpus.entries) < SEED_ENTRIES or rng.random() < FRESH:
            plan = {"stream": [], "knobs": choose(tier.kernels, seed), "r2t": sequence_r2t_dtype(seed), "how": ["fresh"]}
        else:
            entry, why = corpus.pick(rng)
            stream, knobs, how = mutate(entry, rng.choice(corpus.entries), rng, tier.kernels,
                                        focus=(entry.get("where") or {}).get(why))
            plan = {"stream": stream, "knobs": knobs, "r2t": entry.get("r2t") or sequence_r2t_dtype(seed), "how": how}
        self._plans = {seed: plan}
        return plan

    def choose_knobs(self, tier, seed, worker_knobs):
        return worker_knobs if worker_knobs is not None else self.plan(tier, seed)["knobs"]

    def run_sequence(self, tier, seed, n_ops, *, knobs=None, **kw):
        plan = self.plan(tier, seed)
        seq_dir = self.root / ".seq"
        seq_dir.mkdir(parents=True, exist_ok=True)
        _write_json(seq_dir / f"{seed}.json", {"stream": plan["stream"], "r2t": plan["r2t"]})
        old = seq_dir / f"{self._kept_seeds_pop(seed)}.json"
        if old.name != f"{seed}.json":
            old.unlink(missing_ok=True)
        params = params_of(plan["stream"], seed)
        rng, marks = params[2], []
        code = None
        if self.sequences % CODE_EVERY == 0:
            if self._code is None:
                self._code = CodeCoverage(files_under_test(tier))
            self._code.trace_kernels = self.sequences % KERNEL_CODE_EVERY == 0
            code = self._code
        self.sequences += 1
        t0 = time.perf_counter()
        with (col := Collector(code)):
            seq = super().run_sequence(tier, seed, n_ops, knobs=plan["knobs"] if knobs is None else knobs,
                                       params=params, r2t_dtype=plan["r2t"], on_op=lambda: col.at(marks, rng.pos), **kw)
        col.add_run(seq.run)
        col.names |= config_features(seq.config, seq.scenario, seq.knobs)
        if self.sequences % RELOAD_EVERY == 0:
            self.corpus.reload()
        if self.corpus.add({"stream": rng.log, "bits": rng.bits, "marks": marks, "knobs": seq.knobs, "r2t": plan["r2t"],
                            "features": sorted(col.names), "where": col.where, "ops": len(seq.ops), "seed": seed, "how": plan["how"],
                            "cost_s": round(time.perf_counter() - t0, 4), "found": time.time()}):
            self.kept += 1
        seq.extra = {**seq.extra, "guided": plan["how"]}
        return seq

    def _kept_seeds_pop(self, seed: int) -> int:
        """The seed whose stream falls out of the last SEQ_KEPT (itself while there are fewer)."""
        kept = self._seq_seeds
        kept.append(seed)
        return kept.pop(0) if len(kept) > SEQ_KEPT else seed

    def regenerate(self, seed, n_ops, info, *, hostile="spec"):
        from .generate import regenerate

        path = Path(info.get("corpus") or self.root) / ".seq" / f"{seed}.json"
        if not path.is_file():
            return super().regenerate(seed, n_ops, info, hostile=hostile)
        saved = json.loads(path.read_text())
        return regenerate(seed, n_ops, has=info.get("has", ()), hostile=hostile, skips=info.get("skips", ()),
                          params=params_of(saved["stream"], seed), r2t_dtype=saved["r2t"])


_TRACKS: dict[str, GuidedTrack] = {}


def track_for(root: str | Path) -> GuidedTrack:
    """The process's guided track over corpus ``root``."""
    key = str(Path(root).resolve())
    if key not in _TRACKS:
        _TRACKS[key] = GuidedTrack(key)
    return _TRACKS[key]


def merge(inputs, out: str | Path) -> tuple[int, int, int]:
    """Write to ``out`` the smallest subset (greedy set cover, fewest ops first on ties) of the
    corpora ``inputs`` covering the union of their features; (entries read, kept, features)."""
    entries = []
    for root in inputs:
        if not Path(root).is_dir():
            raise FileNotFoundError(f"corpus {root}: not a directory")
        entries += Corpus(root).entries
    union = set().union(*(e["ids"] for e in entries)) if entries else set()
    left, chosen = set(union), []
    pool = sorted(entries, key=lambda e: (e.get("ops", 0), e.get("cost_s", 0.0)))
    while left:
        best = max(pool, key=lambda e: len(e["ids"] & left))
        chosen.append(best)
        left -= best["ids"]
    dest = Corpus(out)
    for e in chosen:
        dest.add(e)
    return len(entries), len(chosen), len(union)
