"""The small track: the allocator state machine and kernel-level ops on pools of tens of pages.

Sequences come from the seeded generator (``generate``), which reads only the spec, and
run on ``runner.PoolRun`` (spec allocator against the target ``DeviceAllocator``). Small
pools shrink and replay fast; block sizes reach their boundaries through the kernel
set's ``FUZZ_KNOBS`` (one choice per sequence, or per GPU worker, recorded in the case).
"""

from __future__ import annotations

import contextlib
import time

from ..budget import OverBudget
from ..generate import WARMUP_SEQUENCES, contract_rate, make_generator, regenerate, sequence_params, sequence_r2t_dtype
from ..knobs import choose
from ..launches import budget as launch_budget
from ..runner import PoolRun
from ..tiers import OPTIONAL
from ..verdict import Divergence
from .base import Sequence, Track


class SmallTrack(Track):
    name = "small"
    default_ops = 200
    gpu_warmup = WARMUP_SEQUENCES
    uses_allocator = True
    head_start = True  # its stream is drawn from the spec alone: a scout of it predicts the launches

    def worker_info(self, tier, *, palette_seed=None) -> dict:
        from ..allocators import has_chains  # here: it may import the allocator (kvkernels imports Triton)

        return {"has": [fn for fn in OPTIONAL if tier.has(fn)], "chains": has_chains(tier)}

    def choose_knobs(self, tier, seed, worker_knobs):
        return worker_knobs if worker_knobs is not None else choose(tier.kernels, seed)

    def runner(self, config, tier, **kw):
        return PoolRun(config, tier, **kw)

    def run_sequence(self, tier, seed, n_ops, *, deadline=None, beat=None, knobs=None, hostile="spec",
                     check_every=1, palette_seed=None, params=None, r2t_dtype=None, on_op=None, stop=None, known=None, budget=None) -> Sequence:
        """``params``/``r2t_dtype``: what the seed would decide, given instead; ``on_op()``: called
        before each op is drawn (a guided run marks where each op's draws begin, ``guide``);
        ``stop()``: checked there too, true ends the sequence (a guided fresh one's work budget);
        ``known``: the reads already checked (``runner.PoolRun``, ``guide.KnownReads``);
        ``budget(programs)``: asked before each launch of a pure op, true drops that op
        (``budget.OverBudget``: not run, not counted) and ends the sequence."""
        if params is None:
            from ..allocators import has_chains

            params = sequence_params(seed, has_chains(tier))
        config, scenario, rng = params
        gen = make_generator(rng, config, scenario, contract_rate=contract_rate(hostile),
                             r2t_dtype=r2t_dtype or sequence_r2t_dtype(seed))
        run = self.runner(config, tier, knobs=choose(tier.kernels, seed) if knobs is None else knobs, hostile=hostile,
                          beat=beat, check_every=check_every, known=known)
        ops, d = [], None
        try:
            for _ in range(n_ops):
                if deadline is not None and time.monotonic() >= deadline or stop is not None and stop():
                    break
                if on_op is not None:
                    on_op()
                op = gen.next_op(run.spec)
                ops.append(op)
                try:  # a pure op changes no state: dropped half-way, the target is where the spec is
                    with launch_budget(budget) if budget is not None and op.pure else contextlib.nullcontext():
                        out = run.step(op, generated_valid=gen.last_violation is None)
                except OverBudget:
                    ops.pop()
                    break
                gen.observe(op, out)
            run.finish()
        except Divergence as exc:
            d = exc
        return Sequence(config, scenario, ops, d, run.stats, knobs=run.knobs, run=run)

    def regenerate(self, seed, n_ops, info, *, hostile="spec"):
        return regenerate(seed, n_ops, has=info.get("has", ()), hostile=hostile, skips=info.get("skips", ()),
                          rules=info.get("rules", ()), chains=info.get("chains", True))

    def expected_kinds(self, has) -> set[str]:
        kinds = {"alloc", "free", "read_table", "k_bind", "k_alloc_bind", "k_free_unbind"}
        if "build_kv_read_table_packed" in has:
            kinds.add("read_table_packed")
        return kinds
