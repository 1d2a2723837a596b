"""The production track: kernel-level ops at production shapes (``fuzz.engine.production``).

Sequences are drawn at the kernel set's own block boundaries (its constants, read once
per worker and handed to the parent as ``scale_info``), so a set with no knobs is covered
at its real launch constants; they run on ``production.run.ScaleRun`` against the
vectorized oracle. No knobs: the set's own constants are what is fuzzed. A worker given a
palette seed draws every size over its palette (``production.palette``: a GPU then
compiles a bounded set of sizes); the palette travels in ``scale_info`` (``info["palette"]``),
so what the worker ran and what ``regenerate`` rebuilds from its hello are the same ops.
"""

from __future__ import annotations

import time

from ..boundary import describe
from ..production.generator import generator, regenerate, scale_info
from ..production.palette import palette_info
from ..production.run import ScaleRun
from ..tiers import OPTIONAL
from ..verdict import Divergence
from .base import Sequence, Track


class ProductionTrack(Track):
    name = "production"
    default_ops = 24  # production ops are big: a sequence of a few dozen fills seconds of GPU time
    case_extra = {"scale": "production"}
    palette_on_gpu = True  # production sizes are many and large: compiled per value, they would not stop compiling
    # Four ordinary production sequences (seeds ``warmup_seed(0..3)``) before a GPU worker is
    # timed: they meet the page sizes, dtypes and layouts most variants come from, so the
    # summary's steady rate is one of fuzzing, not of the first compiles.
    gpu_warmup = 4

    @staticmethod
    def _info(tier, knobs=None, palette_seed=None) -> dict:
        info = scale_info(tier, knobs)
        if palette_seed is not None:
            info["palette"] = palette_info(palette_seed)
        return info

    def worker_info(self, tier, *, palette_seed=None) -> dict:
        info = self._info(tier, palette_seed=palette_seed)
        notes = [f"boundaries: {describe(info['constants'])}"]
        if palette_seed is not None:
            notes.append(f"sizes from a palette (seed {palette_seed}, explore {info['palette']['explore']})")
        return {"has": [fn for fn in OPTIONAL if tier.has(fn)], "scale": info, "notes": notes}

    def case_extra_of(self, info: dict) -> dict:
        palette = (info.get("scale") or {}).get("palette")
        return {**self.case_extra, **({"palette": palette} if palette else {})}

    def runner(self, config, tier, *, guard_rows=None, **kw):
        return ScaleRun(config, tier, **kw)

    def run_sequence(self, tier, seed, n_ops, *, deadline=None, beat=None, knobs=None, hostile="spec",
                     check_every=1, palette_seed=None, limits=None, mix=None, big=None) -> Sequence:
        info = self._info(tier, knobs, palette_seed)
        config, gen = generator(seed, info, limits=limits, mix=mix, big=big, hostile=hostile)
        run = ScaleRun(config, tier, check_every=check_every, knobs=knobs, hostile=hostile, beat=beat)
        run.gate = True  # every op the generator emits as valid meets SPEC §2, or the run ends (exit 3)
        ops, d = [], None
        try:
            for _ in range(n_ops):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                op = gen.next_op()
                ops.append(op)
                run.step(op)
            run.finish()
        except Divergence as exc:
            d = exc
        run.shapes = gen.summary()
        return Sequence(config, "production", ops, d, run.stats, knobs=knobs,
                        extra={**self.case_extra_of({"scale": info}), "shapes": run.shapes},
                        elements=run.elements_checked, run=run)

    def regenerate(self, seed, n_ops, info, *, hostile="spec"):
        config, ops = regenerate(seed, n_ops, info["scale"], hostile=hostile)
        return config, "production", ops

    def expected_kinds(self, has) -> set[str]:
        return {"p_read_table", "p_alloc_bind", "p_free_unbind"}
