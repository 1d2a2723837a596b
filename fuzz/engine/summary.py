"""What a campaign reports: its counts, its cases and whether a run without failures is clean."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

FAR_KIND = "p_read_table_far"  # the op that needs gigabytes of device memory, and may not get them
HEALTHY_OPS = 2000  # a run this long that never ran a kind the kernel set provides is not clean
MAX_RESTARTS_WITHOUT_PROGRESS = 5


@dataclass
class Summary:
    ops: int = 0
    contract_ops: int = 0
    sequences: int = 0
    elapsed_s: float = 0.0
    cases: list = field(default_factory=list)
    paths: list = field(default_factory=list)
    by_kind: dict = field(default_factory=dict)
    by_scenario: dict = field(default_factory=dict)
    hostile: dict = field(default_factory=dict)
    launches: int = 0
    not_applicable: dict = field(default_factory=dict)  # what could not be checked, and how often (never "clean")
    unrun_by_kind: dict = field(default_factory=dict)  # ops counted in by_kind that did not run (not applicable)
    compile_s: float = 0.0  # worker seconds in launches that compiled (compiled tier; the rest fuzzed)
    compiles: int = 0  # launches that compiled a specialization (where Triton cannot tell: or loaded it)
    loads: int = 0  # launches that loaded a specialization from the on-disk cache (launches.loads)
    load_s: float = 0.0  # worker seconds in those loads
    compile_ahead: dict | None = None  # what was compiled before the clock (production.ahead's report)
    elements: int = 0  # production scale: result elements diffed against the vectorized oracle
    faults: int = 0  # worker deaths and hangs (crash and timeout cases included)
    restarts: int = 0
    occurrences: dict = field(default_factory=dict)  # signature -> times seen
    harness_errors: list = field(default_factory=list)
    interrupted: str | None = None
    # What ended it: "max-sequences", "max-ops" (its work limits), "budget", "first-finding"
    # (--stop-on-first), "enough-failures" (stop_after), "signal", "exhausted" (nothing left to run)
    stopped_by: str = "budget"
    health: list = field(default_factory=list)  # why a run without failures is still not clean
    steady_ops_per_s: float | None = None  # after the workers' warm-up (GPU: no Triton compile in it)
    found_after: dict = field(default_factory=dict)  # signature -> seconds into the run
    # Where the seconds to a case went (seconds into the run, from the campaign's start): the
    # first worker set up ("ready": its tier, kernel set and smoke test) and its first op;
    # per signature, its confirmation's steps ("rated", "minimized", "rerated", "written").
    timeline: dict = field(default_factory=dict)
    confirm_timeline: dict = field(default_factory=dict)  # signature -> {step: seconds}
    confirm_work: dict = field(default_factory=dict)  # signature -> {step: {"children", "replays"}}, so far
    op_timeout_s: float = 0.0  # the op timeout in force at the end (auto: from the ops seen)
    notes: list = field(default_factory=list)  # what the workers said of the run (e.g. the boundaries drawn at)
    workers: list = field(default_factory=list)  # per worker: how long its last op had run, restarts
    feature_timeline: list = field(default_factory=list)  # guided: [seconds, entries, features] (FeatureClock)

    def worker_ready(self, at: float, hello: dict) -> None:
        """A worker said hello ``at`` seconds into the run: the first one's, with where its set-up went."""
        if "ready" not in self.timeline:
            self.timeline["ready"] = at
            self.timeline.update(hello.get("setup_s", {}))

    def marker(self, signature, start: float, *executors):
        """A confirmation's ``mark``: the end of each of its steps, in seconds since ``start``, and
        the children its ``executors`` started and the replays they ran so far (``confirm_work``); a
        list among them is read at each mark (executors started on the way: a shrink's siblings)."""
        steps, work = self.confirm_timeline.setdefault(signature, {}), self.confirm_work.setdefault(signature, {})

        def mark(step: str) -> None:
            steps[step] = time.monotonic() - start
            every = [e for x in executors for e in (x if isinstance(x, list) else [x]) if e is not None]
            if every:
                work[step] = {"children": sum(e.children for e in every), "replays": sum(e.jobs for e in every)}
        return mark

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def far_ops(self) -> dict | None:
        """``{ran, not_applicable}`` of the far read tables (None: the run drew none): the share of
        them that found their memory, while confirmations and other workers shared the GPU."""
        drawn = self.by_kind.get(FAR_KIND, 0)
        if not drawn:
            return None
        skipped = self.unrun_by_kind.get(FAR_KIND, 0)
        return {"ran": drawn - skipped, "not_applicable": skipped}

    @property
    def exit_code(self) -> int:
        """3: the harness failed; 1: failures found; 2: not clean for another reason (the
        health checks); 0: clean."""
        return 3 if self.harness_errors else 1 if self.cases else 2 if self.health else 0


def steady_rate(slots) -> float | None:
    """Ops per second of the workers' timed part: from each worker's end of warm-up to
    its last report (None when no worker got that far)."""
    spans = [(st["steady"], st["now"]) for slot in slots for st in slot.kept if st.get("steady")]
    if not spans:
        return None
    start = min(t for (t, _), _ in spans)
    end = max(t for _, (t, _) in spans)
    ops = sum(now_ops - ops0 for (_, ops0), (_, now_ops) in spans)
    return ops / (end - start) if end > start else None


def health(s, slots, opts) -> list[str]:
    """A run without failures is clean only if it exercised what the kernel set has."""
    limits = [f"--{name.replace('_', '-')} {n}" for name in ("max_sequences", "max_ops")
              if (n := getattr(opts, name, None)) is not None]
    if limits and s.stopped_by == "budget" and not s.cases:
        return [f"the budget ({opts.budget_s:g} s, only a safety cap here) ended the campaign before "
                f"{' / '.join(limits)}: {s.sequences} sequences, {s.ops} ops ran (a longer --budget-s?)"]
    if s.ops == 0:
        return ["the campaign ran no ops (a budget too short to finish one?)"]
    stuck = [slot.index for slot in slots if slot.stuck >= MAX_RESTARTS_WITHOUT_PROGRESS]
    if stuck:
        return [f"worker {', '.join(map(str, stuck))} stopped making progress: {MAX_RESTARTS_WITHOUT_PROGRESS} "
                f"restarts in a row ran no op"]
    if s.faults or s.cases or s.interrupted or limits:
        return []  # cut short on purpose, or the counts of a dead worker are partial
    if s.ops < HEALTHY_OPS or s.sequences < 10:
        return []  # too short a run for a missing kind to mean anything (each is >= 1% of ops)
    has = {fn for slot in slots if slot.hello for fn in slot.hello.get("has", ())}
    expected = opts.track.expected_kinds(has)
    missing = sorted(expected - set(s.by_kind))
    if missing:
        return [f"no {', '.join(missing)} op ran although the kernel set provides it (a longer budget?)"]
    return []


# Features reached over a guided campaign's time. The workers write each entry that reached a
# new feature into the corpus directory as they find it; the parent reads what was added since
# its last look (``Corpus.reload`` reads only new files) every ``FEATURE_EVERY_S`` seconds and
# notes ``[seconds, entries, features]``: the summary's ``feature_timeline``, which the morning
# page draws. A long night keeps at most ``FEATURE_POINTS`` samples: past that every other one
# is dropped and the spacing doubles, so the cost stays one directory listing per look.
FEATURE_EVERY_S = 2.0
FEATURE_POINTS = 256


class FeatureClock:
    """Samples of a guided corpus' entries and features, at seconds into the run."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.corpus = None
        self.points: list[list] = []
        self.every = FEATURE_EVERY_S
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
        if len(self.points) > FEATURE_POINTS:
            self.points = self.points[::-2][::-1]  # every other one, the latest kept
            self.every *= 2
