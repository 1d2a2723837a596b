"""A guided campaign's corpus on disk (``guide`` plans from it): entries kept for the features they
alone reached, counted for rarity, picked by domain and energy (``Corpus.pick``), the entries whose
read tables made the most trips (``Corpus.frontier``), and ``merge``, the smallest subset of several
corpora covering their union (libFuzzer's ``-merge=1``: greedy, fewest ops first).

The corpus is a directory of JSON entries, each written atomically when found: a killed campaign
keeps its finds, the next resumes (workers sharing one directory reload each other's).
``.meta/sources.json`` says where the files code coverage measured are, and whether a sequence traced
the interpreted kernel bodies (``kvfuzz coverage`` reads both back).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections import Counter
from pathlib import Path

from .aim import missing
from .features import DOMAINS, feature_id

__all__ = ["Corpus", "merge"]
FORMAT = "kvfuzz-corpus/5"  # /5: chain layouts drawn; /4: chain scenarios; /3: op-aligned marks; /2: sequential
SOURCES = ".meta/sources.json"  # a corpus's measured files: short name -> path (``Corpus.note_sources``)
DOMAIN_WEIGHT = {"trips": 4.0, "progress": 4.0, "spec": 4.0, "start": 4.0}  # ``Corpus.pick``: the rare conjunctions
YIELD_BOUNDS = (0.25, 2.0)  # ``Corpus.energy``: how far an entry's yield moves its energy


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
        self.other_formats: Counter = Counter()  # entries of another format (an older kvfuzz's), not read
        self.reload()

    @property
    def features(self) -> set[int]:
        return set(self.counts)

    def note(self) -> str | None:
        """What a campaign should say of the entries it could not read (None: there were none)."""
        if not self.other_formats:
            return None
        kinds = ", ".join(f"{n} of {fmt}" for fmt, n in sorted(self.other_formats.items()))
        return (f"corpus {self.root}: {sum(self.other_formats.values())} entries not read ({kinds}; this kvfuzz "
                f"reads {FORMAT}, whose streams replay op by op): the guide starts without them")

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
            self._files.add(path.name)
            if entry.get("format") != FORMAT:
                self.other_formats[str(entry.get("format"))] += 1
                continue
            self._index(entry)
            new += 1
        return new

    def _index(self, entry: dict) -> None:
        entry["ids"] = {feature_id(n) for n in entry["features"]}
        entry.setdefault("yielded", entry.get("new", len(entry["ids"])))
        entry.setdefault("picks", 0)
        self.entries.append(entry)
        self.counts.update(entry["ids"])

    def novel(self, names) -> bool:
        """Whether features ``names`` hold one no entry has (what ``add`` keeps)."""
        return any(feature_id(n) not in self.counts for n in names)

    def note_sources(self, files, kernel_bodies: bool = False) -> None:
        """Keep where the measured files are (``SOURCES``: ``code|pkg/file.py|...`` names their last two
        parts) so ``kvfuzz coverage`` can read a team's files back, and whether a sequence traced the
        interpreted kernel bodies (until one has, none of their lines is "never ran")."""
        old = self.sources()
        new = {"files": {**old["files"], **{"/".join(Path(f).parts[-2:]): str(f) for f in files}},
               "kernel_bodies": old["kernel_bodies"] or kernel_bodies}
        if new != old:
            (self.root / SOURCES).parent.mkdir(exist_ok=True)
            _write_json(self.root / SOURCES, new)

    def sources(self) -> dict:
        """What ``note_sources`` kept (nothing yet: an older corpus, or a file another worker is replacing)."""
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            kept = json.loads((self.root / SOURCES).read_text())
            return {"files": dict(kept["files"]), "kernel_bodies": bool(kept["kernel_bodies"])}
        return {"files": {}, "kernel_bodies": False}

    def add(self, entry: dict, parent: dict | None = None) -> bool:
        """Keep ``entry`` (stream, marks, knobs, r2t, features as names, ops, cost_s) if it reached
        a feature no entry has; written at once, with ``new``, how many. ``parent``: the entry it
        was mutated from, credited with them (``energy``)."""
        new = sum(feature_id(n) not in self.counts for n in set(entry["features"]))
        if not new:
            return False
        body = {k: v for k, v in entry.items() if k not in ("ids", "yielded", "picks")}
        body["format"], body["new"] = FORMAT, new
        name = hashlib.sha1(json.dumps(body["stream"]).encode()).hexdigest()[:16] + ".json"
        _write_json(self.root / name, body)
        self._files.add(name)
        self._index(body)
        if parent is not None:
            parent["yielded"] = parent.get("yielded", 0) + new
        return True

    def pick(self, rng: random.Random, weights: dict | None = None) -> tuple[dict, str | None]:
        """(an entry, the feature it was picked for), by rarity, domain first as Centipede
        partitions them: a domain weighted by its rarest feature's 1/count (so a few hundred
        code arcs do not drown a dozen trip buckets, and a domain every entry saturates, op
        kinds, is seldom picked), times ``DOMAIN_WEIGHT`` (the read tables' trips and their
        stepping stones: the combinations blind draws seldom; ``weights`` in its place); a feature in it by 1/count²
        (the rarest first), then one of the entries holding it by its energy (``energy``)."""
        by_domain: dict[int, list[int]] = {}
        for f in self.counts:
            by_domain.setdefault(f >> 40, []).append(f)
        domains = sorted(by_domain)
        weights = weights or DOMAIN_WEIGHT
        shares = [weights.get(DOMAINS[d], 1.0) * max(1.0 / self.counts[f] for f in by_domain[d]) for d in domains]
        feats = by_domain[rng.choices(domains, shares)[0]]
        fid = rng.choices(feats, [1.0 / self.counts[f] ** 2 for f in feats])[0]
        holders = [e for e in self.entries if fid in e["ids"]]
        if len(holders) > 1:
            mid = self.median_yield()
            entry = rng.choices(holders, [self.energy(e, mid) for e in holders])[0]
        else:
            entry = holders[0]
        entry["picks"] = entry.get("picks", 0) + 1
        return entry, next((n for n in entry["features"] if feature_id(n) == fid), None)

    def frontier(self, rng: random.Random) -> tuple[dict, str] | None:
        """(an entry, its trip feature) among those whose read table made the most trips (AFL's "favoured"
        entries: the furthest progress gets tries of its own, where rarity spreads them); None: no entry has one.
        Per kernel, one drawn at random among those whose next trip features (``missing``) some
        entry still lacks: the packed table counts tokens and makes eight trips where the paged
        one makes one (guided-vs-blind/README.md), and a frontier over both stayed on it. Packed
        rows' ``kv_start`` are a frontier of their own (``KERNEL kv_start``: unaligned, aligned at
        2+ trips or page size 1, whose ``missing`` is an unaligned row): the table's trips hide them."""
        best: dict[str, tuple[tuple, list]] = {}  # kernel -> ((most trips, -stride), [(entry, feature)])
        for e in self.entries:
            for name, goal in (e.get("goals") or {}).items():
                if name.startswith("trips|") or name.startswith("start|"):
                    kernel = name.split("|")[1] + (" kv_start" if name.startswith("start|") else "")
                    top, held = best.get(kernel, ((-1, 0), []))
                    key = (goal[3], -goal[4] if len(goal) > 4 else 0)  # most trips, then the shortest stride
                    if key >= top:
                        best[kernel] = (key, ([] if key > top else held) + [(e, name)])
        if not best:
            return None
        open_ = [k for k, (_, held) in sorted(best.items())
                 if any(missing(self.counts, name, goal) for e, name in held for goal in [e["goals"][name]])]
        entry, name = rng.choice(best[rng.choice(open_ or sorted(best))][1])
        entry["picks"] = entry.get("picks", 0) + 1
        return entry, name

    def median_yield(self) -> float:
        ys = sorted(_yield(e) for e in self.entries)
        return ys[len(ys) // 2] if ys else 0.0

    def energy(self, entry: dict, median: float | None = None) -> float:
        """AFL++'s "rare" schedule: the sum of 1/count over the entry's value features (an entry
        holding several rare ones is worth more tries), times its **yield** against the corpus's
        median, bounded to [1/4, 2] (at least 1 until it is first picked): the new features it and
        the mutants kept from it found per CPU second spent on it (its own run and one per pick,
        each costed as its own run). So an entry that keeps paying is
        tried more, and one picked often for nothing fades, whatever its cost; a cost factor
        alone (1/cost) drifted the corpus to cheap sequences, large blocks and one trip, which
        starved the rows that reach three trips (benchmarks/results/guided-vs-blind/energy-by-payoff.md)."""
        rare = sum(1.0 / self.counts[f] for f in entry["ids"] if f >> 40)  # domain 0 is code: hundreds of arcs
        median = self.median_yield() if median is None else median
        ratio = _yield(entry) / median if median > 0 else 1.0
        if not entry.get("picks"):  # untried: no less than the median (AFL++ favours new entries)
            ratio = max(ratio, 1.0)
        return max(rare, 1e-3) * min(max(ratio, YIELD_BOUNDS[0]), YIELD_BOUNDS[1])


def _yield(entry: dict) -> float:
    """New features found (its own and its kept mutants') per CPU second spent on it."""
    spent = max(entry.get("cost_s", 0.0), 1e-3) * (1 + entry.get("picks", 0))
    return entry.get("yielded", 0) / spent


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
    for root in inputs:
        kept = Corpus(root).sources()
        dest.note_sources(kept["files"].values(), kept["kernel_bodies"])
    return len(entries), len(chosen), len(union)
