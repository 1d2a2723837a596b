"""A fuzz campaign: seeds -> op sequences -> differential runs -> minimized case files.

Seeds are split deterministically: shard ``I/N`` takes sequence numbers ``k`` with
``k % N == I``, and worker ``w`` of ``W`` inside it takes every W-th of those, so a CI
matrix or a cluster array covers one campaign without overlap. The budget bounds the
whole run, minimization included.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .case import Case, write_case
from .generate import OpGenerator, sequence_params
from .knobs import choose as choose_knobs
from .minimize import Minimizer, NotReproducible
from .runner import Divergence, PoolRun
from .tiers import SetupError, make_tier

OPS_PER_SEQUENCE = 200


@dataclass
class CampaignOptions:
    backend: str = "torch"
    kernels: str | None = None
    seed: int = 0
    budget_s: float = 60.0
    out: str = "kvfuzz-out"
    workers: int = 1
    shard: tuple[int, int] = (0, 1)
    ops_per_sequence: int = OPS_PER_SEQUENCE
    max_sequences: int | None = None


@dataclass
class WorkerResult:
    ops: int = 0
    contract_ops: int = 0
    sequences: int = 0
    cases: list = field(default_factory=list)
    fuzz_s: float = 0.0


def sequence_seed(opts: CampaignOptions, worker: int, k: int) -> int:
    shard_i, shard_n = opts.shard
    index = (k * opts.workers + worker) * shard_n + shard_i
    return opts.seed * 1_000_003 + index


def run_sequence(tier, seed: int, n_ops: int, deadline: float | None = None):
    """Generate and diff one sequence; return (ops, divergence or None, run)."""
    config, scenario, rng = sequence_params(seed)
    gen = OpGenerator(rng, config, scenario)
    run = PoolRun(config, tier, knobs=choose_knobs(tier.kernels, seed))
    ops: list = []
    try:
        for _ in range(n_ops):
            if deadline is not None and time.monotonic() >= deadline:
                break
            op = gen.next_op(run.spec)
            ops.append(op)
            gen.observe(op, run.step(op))
        run.finish()
    except Divergence as d:
        return config, scenario, ops, d, run
    return config, scenario, ops, None, run


def fuzz_worker(opts: CampaignOptions, worker: int, deadline: float, counters=None) -> WorkerResult:
    tier = make_tier(opts.backend, opts.kernels)
    if tier.device == "cuda":  # one worker per GPU where there are several (round robin)
        import torch

        gpu = worker % torch.cuda.device_count()
        torch.cuda.set_device(gpu)  # Triton launches on the current device
        tier = replace(tier, device=f"cuda:{gpu}")
    res = WorkerResult()
    seen: set = set()
    start = time.monotonic()
    k = 0
    while time.monotonic() < deadline and (opts.max_sequences is None or k < opts.max_sequences):
        seed = sequence_seed(opts, worker, k)
        k += 1
        config, scenario, ops, d, run = run_sequence(tier, seed, opts.ops_per_sequence, deadline)
        res.sequences += 1
        res.ops += run.stats.ops
        res.contract_ops += run.stats.contract_ops
        if counters is not None:
            counters[0] += run.stats.ops
        if d is None:
            continue
        if d.signature in seen:
            continue
        seen.add(d.signature)
        if counters is not None:
            counters[1] += 1
        ops = ops[: d.step + 1]
        minimizer = Minimizer(tier, d.signature, deadline=deadline, knobs=run.knobs)
        try:
            min_config, min_ops, min_d = minimizer.run(config, ops)
        except NotReproducible:  # did not reproduce from scratch: keep it unminimized
            min_config, min_ops, min_d = config, ops, d
        res.cases.append(Case.found(config=min_config, ops=min_ops, seed=seed, tier=opts.backend,
                                    kernels=tier.kernels_name, divergence=min_d, original_len=len(ops),
                                    scenario=scenario, knobs=run.knobs))
    res.fuzz_s = time.monotonic() - start
    return res


def _worker_entry(opts, worker, deadline_wall, counters, queue):
    deadline = time.monotonic() + max(0.0, deadline_wall - time.time())
    try:
        queue.put((worker, fuzz_worker(opts, worker, deadline, counters), None))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as a setup error
        queue.put((worker, None, f"{type(exc).__name__}: {exc}"))


@dataclass
class Summary:
    ops: int
    contract_ops: int
    sequences: int
    elapsed_s: float
    cases: list
    paths: list

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _progress(stream, start, ops, failures, budget):
    elapsed = time.monotonic() - start
    rate = ops / elapsed if elapsed > 0 else 0.0
    stream.write(f"\r[kvfuzz] {elapsed:6.1f}/{budget:.0f}s  ops {ops:>9,}  {rate:8.0f} ops/s  failures {failures}")
    stream.flush()


def run_campaign(opts: CampaignOptions, progress=None) -> Summary:
    progress = sys.stderr if progress is None and sys.stderr.isatty() else progress
    start = time.monotonic()
    deadline = start + opts.budget_s
    if opts.workers <= 1:
        counters = [0, 0]
        if progress:
            import threading

            stop = threading.Event()

            def tick():
                while not stop.wait(0.5):
                    _progress(progress, start, counters[0], counters[1], opts.budget_s)
            thread = threading.Thread(target=tick, daemon=True)
            thread.start()
        try:
            results = [fuzz_worker(opts, 0, deadline, counters)]
        finally:
            if progress:
                stop.set()
                progress.write("\n")
    else:
        ctx = mp.get_context("spawn")
        counters = ctx.Array("q", 2 * opts.workers)
        queue = ctx.Queue()
        deadline_wall = time.time() + opts.budget_s
        procs = []
        for w in range(opts.workers):
            shared = _Slice(counters, w)
            p = ctx.Process(target=_worker_entry, args=(opts, w, deadline_wall, shared, queue))
            p.start()
            procs.append(p)
        results, errors = [], []
        while len(results) + len(errors) < len(procs):
            try:
                _, res, err = queue.get(timeout=0.5)
                (errors.append(err) if err else results.append(res))
            except Exception:  # noqa: BLE001 - queue.Empty: show progress and wait again
                if not any(p.is_alive() for p in procs) and queue.empty():
                    errors.append("a worker died without reporting")
                    break
            if progress:
                _progress(progress, start, sum(counters[0::2]), sum(counters[1::2]), opts.budget_s)
        for p in procs:
            p.join(timeout=5)
        if progress:
            progress.write("\n")
        if errors:
            raise SetupError("; ".join(sorted(set(errors))))
    elapsed = time.monotonic() - start
    distinct: dict = {}
    for res in results:
        for case in res.cases:
            distinct.setdefault(case.signature, case)
    paths = [write_case(c, Path(opts.out)) for c in distinct.values()]
    return Summary(ops=sum(r.ops for r in results), contract_ops=sum(r.contract_ops for r in results),
                   sequences=sum(r.sequences for r in results), elapsed_s=elapsed,
                   cases=list(distinct.values()), paths=paths)


class _Slice:
    """Two shared counters (ops, failures) of one worker inside a shared array."""

    def __init__(self, array, worker):
        self.array, self.base = array, 2 * worker

    def __getitem__(self, i):
        return self.array[self.base + i]

    def __setitem__(self, i, value):
        self.array[self.base + i] = value
