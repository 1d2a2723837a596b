"""The parent's record of one worker position: its current child and what it knows of it.

Also where a worker's history is rebuilt from (the sequences its current child ran since
it started), for a finding that needs what came before it (``confirm``).
"""

from __future__ import annotations

import time

from .generate import warmup_seed
from .supervise import CONTRACT, OPS, SEQS, Child

HISTORY_SEQUENCES = 256  # how far back a worker's history reaches for a case that needs it
FOLLOW_SEQUENCES = 2048  # sequences per worker a following compile-ahead may scout past its first ones


def sequence_seed(opts, worker: int, k: int) -> int:
    """Shard ``I/N`` takes sequence numbers ``k`` with ``k % N == I``; worker ``w`` of ``W``
    inside it every W-th of those."""
    shard_i, shard_n = opts.shard
    index = (k * opts.workers + worker) * shard_n + shard_i
    return opts.seed * 1_000_003 + index


def ahead_job(opts, spec, recipes_out) -> dict:
    """The compile-ahead job of a campaign (``production.ahead``): each worker's stream as that
    worker will draw it, its GPU warm-up seeds then its first ``opts.ahead_sequences`` sequences
    (its share of ``--max-sequences`` at most), with its palette; when it follows (``--compile-ahead
    follow``, or ``auto`` where it is on): the next ``FOLLOW_SEQUENCES`` too (``more``), scouted
    while the workers run."""
    from .compile_check.client import resolve_kernels
    from .production import ahead

    follow = opts.compile_ahead_follows()
    streams = []
    for w in range(opts.workers):
        quota = share(opts.max_sequences, opts.workers, w)
        n = opts.ahead_sequences if quota is None else min(opts.ahead_sequences, quota)
        last = n + FOLLOW_SEQUENCES if quota is None else quota
        seeds = [warmup_seed(i) for i in range(opts.track.gpu_warmup)] + [sequence_seed(opts, w, k) for k in range(n)]
        streams.append({**ahead.stream(seeds, palette_seed=opts.palette_seed(w), n_ops=opts.n_ops(),
                                       hostile=opts.hostile, check_every=opts.check_every),
                        "more": [sequence_seed(opts, w, k) for k in range(n, last)] if follow else []})
    return {"kernels": resolve_kernels(spec.name), "streams": streams, "recipes_out": str(recipes_out),
            "workers": opts.workers, "follow_s": opts.budget_s if follow else None}


def compile_ahead(opts, spec, log_dir, env: dict, progress=None):
    """Compile what the workers will launch, before the clock (``production.ahead``, ``ahead_job``),
    into ``--cache-dir`` or Triton's default cache (every process of this user shares it, and
    keeps it for the next run); the recipes that compiled go to ``log_dir``, and ``env`` (every
    child's) names them, so each child preloads them. A failure is only noted in the report.
    Returns the report and, when it follows the workers, the running ``ahead.Job`` (else None)."""
    from .production import ahead

    recipes = log_dir / "compiled-ahead.json"
    job = ahead_job(opts, spec, recipes)
    if job["follow_s"]:
        child = ahead.Job(job, env)
        report = child.first()
    else:
        child, report = None, ahead.run_job(job, env=env)
    if recipes.is_file():
        env[ahead.RECIPES_ENV] = str(recipes)
    if progress is not None:
        following = child is not None and "error" not in report
        progress.write(f"[kvfuzz] compile-ahead: {ahead.describe(report)}"
                       + (", and following the workers" if following else "") + "\n")
    return report, child


def same_boundaries(report: dict, slots) -> bool | None:
    """Whether every worker drew from the boundaries the compile-ahead scout drew from (its
    hello's ``scale`` constants): a scout that drew elsewhere compiled other variants."""
    if report.get("constants") is None:
        return None
    return all((slot.hello.get("scale") or {}).get("constants") == report["constants"] for slot in slots if slot.hello)


def share(total: int | None, workers: int, worker: int) -> int | None:
    """Worker ``worker``'s part of a shard's ``--max-sequences`` or ``--max-ops`` ``total``
    (None: no limit): ``total // workers``, one more for the first ``total % workers``
    workers. For sequences that is exactly the shard's sequence indices ``0 .. total - 1``
    (``sequence_seed``: worker ``w`` runs indices ``k * workers + w``), so the same total
    runs the same sequences whatever the worker count."""
    if total is None:
        return None
    return total // workers + (1 if worker < total % workers else 0)


def stop_reason(opts, worker: int, k: int, ops: int, deadline: float, exhausted) -> str | None:
    """Why worker ``worker`` starts no sequence ``k`` after ``ops`` ops of its position (its
    earlier children's included), or None: the budget, its share of ``--max-sequences`` or
    ``--max-ops`` (``slot.share``; ops are whole sequences, so a share is reached at the end
    of the sequence that crosses it), or a track with nothing left to run."""
    if time.monotonic() >= deadline:
        return "budget"
    quota = share(opts.max_sequences, opts.workers, worker)
    if quota is not None and k >= quota:
        return "max-sequences"
    quota = share(opts.max_ops, opts.workers, worker)
    if quota is not None and ops >= quota:
        return "max-ops"
    return "exhausted" if exhausted() else None


class Slot:
    """One worker position: its current child and what the parent knows of it."""

    def __init__(self, index: int):
        self.index = index
        self.child: Child | None = None
        self.hello: dict | None = None
        self.knobs: dict | None = None  # the current child's launch knobs (it says when they change)
        self.done = False
        self.restarts = 0
        self.stuck = 0  # restarts in a row that ran no op
        self.reported_harness = False  # the current child sent its harness error itself
        self.counted = {"ops": 0, "sequences": 0, "contract_ops": 0}  # exact, from earlier children's heartbeats
        self.stats: dict = {}  # the current child's last stats report
        self.kept: list[dict] = []  # the last stats reports of earlier children
        self.start_k = 0  # the current child's first sequence number
        self.warm = False  # whether the current child ran warm-up sequences first
        self.found_steps: dict[int, int] = {}  # seed -> the step its sequence stopped at (a finding)
        self.last_op_s = 0.0  # how long the last op of this slot had run when the run ended
        self.longest = 0.0  # the longest op of its earlier children
        self.stopped_by: str | None = None  # why it is done: a work limit, the budget, ... (Summary.stopped_by)

    def retire(self) -> int:
        """Count the current child's work (its heartbeat is exact, its last report may be a
        little behind) and close it; the ops it ran."""
        child = self.child
        ran = child.slots[OPS]
        self.longest = max(self.longest, child.longest)
        for key, slot in (("ops", OPS), ("sequences", SEQS), ("contract_ops", CONTRACT)):
            self.counted[key] += child.slots[slot]
        if self.stats:
            self.kept.append(self.stats)
        self.stats = {}
        child.close()
        self.child = None
        return ran

    def history(self, opts, upto_k: int, seed: int | None = None):
        """A thunk: the sequences the slot's current child ran before the one it failed in
        (``seed``, sequence number ``upto_k``), rebuilt from their seeds (the last
        HISTORY_SEQUENCES; its warm-up sequences first, if it ran them). Built only for a
        case that does not reproduce without them."""
        track, hello = opts.track, dict(self.hello or {})
        warmups = [warmup_seed(i) for i in range(track.gpu_warmup)] if (
            self.warm and opts.backend == "cuda") else []
        if seed in warmups:  # it failed while warming up: only the warm-up sequences before it ran
            seeds = warmups[:warmups.index(seed)]
        else:
            seeds = warmups + [sequence_seed(opts, self.index, k) for k in range(self.start_k, upto_k)]
        seeds = seeds[-HISTORY_SEQUENCES:]
        steps, worker_seed = dict(self.found_steps), opts.seed * 7919 + self.index if opts.backend == "cuda" else None

        def build() -> list[dict]:
            out = []
            for seed in seeds:
                config, _, ops = track.regenerate(seed, steps.get(seed, opts.n_ops() - 1) + 1, hello,
                                                  hostile=opts.hostile)
                out.append({"seed": seed, "config": config.to_json(), "ops": [op.to_json() for op in ops],
                            "knobs_from": {"track": track.name, "seed": seed, "worker_seed": worker_seed}})
            return out

        return build


def stopped_by(stop: str | None, slots: list[Slot]) -> str:
    """What ended the campaign (``Summary.stopped_by``): a signal, the first finding
    (``--stop-on-first``), enough failures (``stop_after``), else what ended its workers:
    the budget if it ended any of them (their work limits were then not reached), else
    ``max-ops``, ``max-sequences`` or ``exhausted`` (a track with nothing left to run). A
    worker position that stopped for none of these (it could no longer set up, or made no
    progress: ``health`` says so) does not count."""
    if stop in ("SIGTERM", "SIGINT"):
        return "signal"
    if stop is not None:
        return "first-finding" if stop == "first-finding" else "enough-failures"
    why = {slot.stopped_by if slot.done else "budget" for slot in slots}  # not done: the loop's own cap
    return next((w for w in ("budget", "max-ops", "max-sequences", "exhausted") if w in why), "budget")
