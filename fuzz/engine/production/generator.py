"""The production generator: ops for one pool geometry, sizes drawn at the kernel set's boundaries.

Small pools never give a strided read-table program its second trip or a launcher its
second block at production constants, and a team's kernels expose no knobs to shrink
those constants; so sizes are drawn where the set's own constants bite
(``boundary.Boundaries``): pools up to 2^20 pages, bs up to 512 and the cdiv(TARGET, bs)
steps beyond, rows up to 256k tokens, id batches up to 64k. The stream depends only on
the seed, ``scale_info`` (the constants, the optional functions, the device) and the
hostile mode (unless it is ``off``, the default mix includes the hostile probes of
``hostile``), never on what the target does, so a supervisor rebuilds a dead worker's
ops from them.
"""

from __future__ import annotations

import dataclasses
import random

import kvref

from ..boundary import Constants, kernel_constants
from ..knobs import apply as apply_knobs
from ..ops import Op
from . import cost
from .arith import INT32_LIMIT, aligned_up, cdiv, unit_near
from .far import draw_far_op, far_rng
from .graph import draw_graph_op
from .hostile import FAR_MAX, PFreeUnbindAny, PReadTableOverflow, PReadTablePackedDisagree
from .limits import ScaleLimits
from .observe import observed_constants
from .ops import PAllocBind, PBind, PFreeUnbind, PReadTable, PReadTablePacked, PRows, PSetup, PTranslate
from .palette import EXPLORE, Palette, boundaries, from_info


def scale_config(rng: random.Random, constants: Constants, limits: ScaleLimits | None = None, *,
                 palette: Palette | None = None, explore: float = EXPLORE) -> kvref.PoolConfig:
    """One production geometry: page size, a pool size at a block boundary (or a power of two
    +-1; from the ``palette`` when there is one: the pool's size is a kernel's int argument
    too), a multiplier that keeps every entry inside int32."""
    limits = limits or ScaleLimits()
    ps = rng.choice(limits.page_sizes)
    top = limits.pool_pages if ps == 1 else limits.pool_pages_paged
    bounds = boundaries(constants, rng, palette, explore)
    lo = max(64, top // 64)
    num_pages = bounds.size(lo, top)[0] if rng.random() < 0.5 else top - rng.choice((0, 1, 3))
    num_pages = max(lo, min(top, num_pages))
    multiplier = rng.choice(limits.multipliers)
    while (num_pages + 1) * multiplier * ps >= INT32_LIMIT and multiplier > 1:
        multiplier //= 2
    return kvref.PoolConfig(num_pages=num_pages, page_size=ps, multiplier=multiplier)


DEFAULT_MIX = {"p_read_table": 30, "p_alloc_bind": 12, "p_bind": 8, "p_free_unbind": 14, "p_read_table_packed": 10,
               "p_translate": 6, "p_rows": 4, "g_read_table": 8}
READ_HEAVY_MIX = {"p_read_table": 80, "p_read_table_packed": 10, "p_alloc_bind": 3, "p_free_unbind": 3,
                  "p_rows": 1}
EAGER_MIX = {k: w for k, w in DEFAULT_MIX.items() if not k.startswith("g_")}
GRAPH_MIX = {"g_read_table": 1}
# SPEC §2's memory-safety promises at production sizes (``hostile``): added to the default mix
# unless the run's hostile mode is off; an explicit mix has them only if it names them.
HOSTILE_MIX = {"p_free_unbind_any": 3, "p_read_table_overflow": 3, "p_read_table_packed_disagree": 2}
FEATURES = {"p_read_table_packed": "build_kv_read_table_packed", "p_translate": "translate_tokens",
            "g_read_table": None, "p_read_table_packed_disagree": "build_kv_read_table_packed"}
FAR_AT = (1, 4)  # where a sequence's far read table comes (op index, inclusive): early, so a short run meets it


class ScaleGenerator:
    """Production-scale ops for one pool geometry, sizes drawn mostly at the kernel set's
    boundaries (``boundary.Boundaries``; over a worker's ``palette`` of sizes when it has one,
    ``palette``). It tracks which virtual pages are bound (as intervals of indices into one
    permutation of the pool), so every free names bound pages; ``shapes`` records, per op,
    the boundary each size was drawn at."""

    def __init__(self, rng: random.Random, config: kvref.PoolConfig, constants: Constants,
                 limits: ScaleLimits | None = None, *, features: set | None = None, mix: dict | None = None,
                 legacy: bool = False, big: float = 0.1, r2t_dtype: str = "int32",
                 far: random.Random | None = None, hostile: str = "spec", palette: Palette | None = None,
                 explore: float = EXPLORE, aligned: bool = False):
        self.rng, self.config, self.constants = rng, config, constants
        # The sequence's layout: req_to_token widths and out row strides multiples of 16 (one
        # specialization of a compiled kernel), or as drawn (``sequence_aligned``).
        self.aligned = aligned
        self.r2t_dtype = r2t_dtype  # every req_to_token of the sequence (p_rows, g_read_table)
        self.big = big  # share of read tables at the limits' full size instead of a boundary
        self.limits = limits or ScaleLimits()
        self.palette, self.explore = palette, explore
        self.bounds = self.boundaries(rng)
        self.features = features  # None: every optional function is there
        self.legacy = legacy
        far_ok = mix is None or "p_read_table_far" in mix  # a mix of its own (a benchmark's) names it or has none
        mix = dict({**DEFAULT_MIX, **HOSTILE_MIX} if mix is None else mix)
        if hostile == "off":
            mix = {k: w for k, w in mix.items() if k not in HOSTILE_MIX}
        for kind, fn in FEATURES.items():
            if kind in mix and features is not None and fn is not None and fn not in features:
                del mix[kind]
        if not self.limits.far_r2t:
            mix.pop("p_read_table_far", None)  # it takes gigabytes: only where the limits allow it
        self.mix = mix
        # The interpreter's prices (``cost``): None where tables are not priced (a GPU).
        self.budget = None if self.limits.op_work is None else cost.Prices(constants, self.limits)
        self.dear = False  # the table being drawn was let past ``op_work`` to reach a second trip
        # The tour (``limits.tour``): the mix's kinds still to meet, in a seeded order; while it
        # lasts tables are drawn at ``op_work`` or less (but its p_read_table), so a short run
        # meets every kind.
        self.tour = list(mix) if self.limits.tour else []
        rng.shuffle(self.tour)
        self.tour.sort(key=lambda k: k != "p_free_unbind")  # a free first: the binds after it get a gap to fill
        self.tries = 8 if self.budget is None else cost.Prices.tries
        self.touring = False
        # One far read table (p_read_table_far) in a ``far_r2t`` share of the sequences of the default
        # mix, drawn from its own RNG ``far`` (the rest of the stream is unchanged by it).
        self.far = far or rng
        self.far_at = (far.randint(*FAR_AT) if far is not None and far_ok and self.limits.far_r2t
                       and far.random() < self.limits.far_r2t else None)
        self.cap = config.num_pages - config.min_page
        self.sigma = (config.min_page, self.cap, unit_near(rng.randrange(1, max(2, self.cap)), self.cap),
                      rng.randrange(self.cap))
        self.bound: list[list[int]] = []  # sorted disjoint [start, end) intervals of bound permutation indices
        self.cursor = config.min_page  # next physical page for binds (wraps: p2v rows may then go stale, legally)
        self.rows: tuple[int, int] | None = None
        self.pending: list[Op] = []
        self.emitted = 0
        self.shapes: list[dict] = []

    # ---- bookkeeping -------------------------------------------------------------------------
    def boundaries(self, rng: random.Random):
        """Boundary draws from ``rng`` over this generator's palette (the far op's RNG has its own)."""
        return boundaries(self.constants, rng, self.palette, self.explore)

    def summary(self) -> dict:
        """JSON-able: the constants the draws aimed at and, per op index, what each size was drawn at."""
        return {"constants": self.constants.to_json(), "limits": dataclasses.asdict(self.limits),
                "shapes": list(self.shapes)}

    def _tag(self, op: Op, **tags) -> Op:
        if tags:
            self.shapes.append({"op": self.emitted, "kind": op.kind, **tags})
        self.emitted += 1
        return op

    def _gaps(self) -> list[tuple[int, int]]:
        gaps, at = [], 0
        for s, e in self.bound:
            if s > at:
                gaps.append((at, s))
            at = e
        if at < self.cap:
            gaps.append((at, self.cap))
        return gaps

    def _mark(self, s: int, e: int, bound: bool) -> None:
        pts = []
        for a, b in self.bound:
            if b <= s or a >= e:
                pts.append([a, b])
            else:
                if a < s:
                    pts.append([a, s])
                if b > e:
                    pts.append([e, b])
        if bound:
            pts.append([s, e])
        pts.sort()
        merged: list[list[int]] = []
        for a, b in pts:
            if merged and merged[-1][1] == a:
                merged[-1][1] = b
            else:
                merged.append([a, b])
        self.bound = merged

    def _v(self, i0: int) -> tuple:
        lo, span, a, b = self.sigma
        return (lo, span, a, b, i0)

    def _phys(self, n: int) -> int:
        c = self.config
        if self.cursor + n > c.num_pages:
            self.cursor = c.min_page
        start = self.cursor
        self.cursor += n
        return start

    # ---- ops ---------------------------------------------------------------------------------
    def next_op(self) -> Op:
        if self.pending:
            op = self.pending.pop(0)
            return op
        if self.emitted == 0:
            return self._setup()
        if self.far_at is not None and self.emitted >= self.far_at:
            self.far_at = None
            self._touring(True)  # priced like the tour's: its news is one program's offset, not trips
            return self._p_read_table_far()
        if self._touring(bool(self.tour)):
            kind = self.tour.pop(0)
            # The tour's read table alone is priced as outside it: a sequence of a few ops then
            # still gets a table that may reach a second trip, where trip bugs are.
            self._touring(kind != "p_read_table")
        else:
            kinds = list(self.mix)
            kind = self.rng.choices(kinds, weights=[self.mix[k] for k in kinds])[0]
        op = getattr(self, "_" + kind)()
        if self.pending:  # a prerequisite came first (new rows): emit it, then this op
            self.pending.append(op)
            return self.pending.pop(0)
        return op

    def _setup(self) -> Op:
        rng, cap = self.rng, self.cap
        n = rng.choice((cap, cap - 1, cap * 3 // 4, cap // 2, cap - min(cap - 1, rng.choice((128, 512, 1024)))))
        n = max(1, min(cap, n))
        p = (self.config.min_page, n, unit_near(rng.randrange(1, n + 1), n), rng.randrange(n), 0)
        self._mark(0, n, True)
        self.cursor = self.config.min_page + n
        return self._tag(PSetup(n=n, v=self._v(0), p=p), n=f"{n}/{cap} bound")

    def _ids_budget(self) -> int:
        return self.limits.max_ids

    def p_bind_like(self, alloc: bool) -> Op:
        gaps = self._gaps()
        if not gaps:
            if self.touring:  # every page is bound: the tour meets this kind after its free
                self.tour.append("p_alloc_bind" if alloc else "p_bind")
            return self._p_free_unbind()
        s, e = self.rng.choice(gaps)
        n, tag = self.bounds.size(1, min(e - s, self._ids_budget()))
        i0 = s + self.rng.randint(0, e - s - n)
        self._mark(i0, i0 + n, True)
        start = self._phys(n)
        if alloc:
            return self._tag(PAllocBind(n=n, v=self._v(i0), start=start), n=tag)
        p = (start, n, unit_near(self.rng.randrange(1, n + 1), n), self.rng.randrange(n), 0)
        return self._tag(PBind(n=n, v=self._v(i0), p=p), n=tag)

    def _p_bind(self) -> Op:
        return self.p_bind_like(False)

    def _p_alloc_bind(self) -> Op:
        return self.p_bind_like(True)

    def _p_free_unbind(self) -> Op:
        if not self.bound:
            return self.p_bind_like(True)
        s, e = self.rng.choice(self.bound)
        n, tag = self.bounds.size(1, min(e - s, self._ids_budget()))
        i0 = s + self.rng.randint(0, e - s - n)
        self._mark(i0, i0 + n, False)
        return self._tag(PFreeUnbind(n=n, v=self._v(i0)), n=tag)

    def _p_translate(self) -> Op:
        rng = self.rng
        n, tag = self.bounds.size(1, self._ids_budget())
        lo, span, a, b = self.sigma
        return self._tag(PTranslate(seed=rng.randrange(1 << 30), n=n, src=(lo, span, a, b + rng.randrange(span)),
                                    bad_every=rng.choice((0, 7, 61))), n=tag)

    def row_source(self, rng) -> tuple:
        """A ``p_rows`` src: mostly a walk over bound pages (live entries), else the whole pool."""
        lo, span, a, b = self.sigma
        if self.bound and rng.random() < 0.7:
            s, e = rng.choice(self.bound)
            return (lo, span, a, b, s, e - s, rng.randrange(1, 1 << 20), rng.randrange(1 << 20))
        rows = self.config.table_rows
        return (0, rows, 1, 0, 0, rows, rng.randrange(1, 1 << 20), rng.randrange(1 << 20))

    def rows_op(self, width: int, rows: int | None = None) -> PRows:
        """New req_to_token rows at least ``width`` tokens wide; queued, so it is emitted next."""
        rng, lim = self.rng, self.limits
        extra = rng.choice((0, 0, 1, self.config.page_size, rng.randrange(64)))
        width = aligned_up(width + extra) if self.aligned else width + extra
        cap_rows = max(1, lim.max_r2t_elems // width)
        if rows is None:
            rows = max(1, min(cap_rows, rng.choice((1, 7, 64, 257, 512, 1024))))
        rows = max(1, min(rows, cap_rows))
        src = self.row_source(rng)
        op = PRows(seed=rng.randrange(1 << 30), rows=rows, width=width, src=src, pad_every=rng.choice((0, 0, 13, 97)),
                   dtype=self.r2t_dtype)
        self.rows = (rows, width)
        self.pending.append(self._tag(op, width=f"{width} tokens", rows=str(rows)))
        return op

    def _p_rows(self) -> Op:
        ps = self.config.page_size
        pages, tag = self.bounds.size(1, self.limits.max_row_tokens // ps)
        self.rows_op(pages * ps)
        return self.pending.pop(0)

    def programs(self, bs: int, cols: int) -> int:
        """The most read-table programs any block/target pair of the constants would launch."""
        return max((bs * min(cdiv(t, bs), cdiv(cols, b)) for _, b, _, t in self.constants.pairs()), default=bs)

    def under(self, cap: int | None, bs: int, cols: int) -> bool:
        return cap is None or self.programs(bs, cols) <= cap  # the limits' programs a launch (None: none)

    def _touring(self, on: bool) -> bool:
        """Whether the op being drawn is the tour's (or the far table), told to the prices: cheap only."""
        self.touring = on
        if self.budget is not None:
            self.budget.touring = on
        return on

    def affords(self, bs: int, cols: int, **kw) -> bool:
        """Whether a bs x cols read table is within the interpreter's prices (``cost.Prices``;
        ``kw`` as ``cost.table_work``'s); always where tables are not priced."""
        return self.budget is None or self.budget.affords(bs, cols, **kw)

    def take(self, bs: int, cols: int, **kw) -> None:
        """Charge the table drawn; ``dear``: let past ``op_work`` (its long rows take the trip)."""
        self.dear = self.budget is not None and self.budget.take(bs, cols, **kw)

    def table_shape(self, cols_cap: int) -> tuple[int, int, str, str]:
        """(bs, columns, their tags) for a read table, inside the limits."""
        rng, lim = self.rng, self.limits
        if rng.random() < self.big:  # the full production size: a server's largest batch and rows
            bs = lim.max_bs - rng.choice((0, 0, 1))
            cols = max(1, min(cols_cap, lim.max_read_elems // bs) - rng.choice((0, 0, 1, 2)))
            if self.under(lim.max_programs, bs, cols) and self.affords(bs, cols):
                self.take(bs, cols)
                return bs, cols, "cap", "cap"
        for _ in range(self.tries):
            bs, bs_tag = self.bounds.bs(lim.max_bs) if rng.random() < 0.7 else self.bounds.size(1, lim.max_bs)
            bs = min(bs, lim.max_step_bs)
            cols, cols_tag = self.bounds.trip_pages(bs, cols_cap)
            if rng.random() < 0.3:
                cols, cols_tag = self.bounds.size(1, cols_cap)
            if bs * cols <= lim.max_read_elems and self.under(lim.max_programs, bs, cols) and self.affords(bs, cols):
                self.take(bs, cols)
                return bs, cols, bs_tag, cols_tag
        bs = rng.randint(1, 8)
        cols = rng.randint(1, min(cols_cap, 64))
        self.take(bs, cols)
        return bs, cols, "fallback", "fallback"

    def long_pages(self, bs: int, cols: int) -> tuple[int, str]:
        rng = self.rng
        r = rng.random()
        if self.dear:  # a table let past op_work for its second trip: its long rows take it
            trip = cost.trip_pages(self.constants, bs)
            return (cols, "max") if r < 0.5 or trip > cols else (trip, "second trip")
        if r < 0.45:
            return cols, "max"
        if r < 0.75:
            trips = [(n, t) for n, t in self.bounds.min_trip_pages(bs) if n <= cols]
            if trips:
                return rng.choice(trips)
        return self.bounds.size(0, cols)

    def _need_rows(self, width: int) -> None:
        if self.rows is None or self.rows[1] < width:
            self.rows_op(width)

    def _p_read_table(self) -> Op:
        rng, ps = self.rng, self.config.page_size
        bs, mp, bs_tag, mp_tag = self.table_shape(self.limits.max_row_tokens // ps)
        self._need_rows((mp - 1) * ps + 1)
        n_pages, long_tag = self.long_pages(bs, mp)
        long_len = max(0, n_pages * ps - rng.randrange(ps))
        n_long = rng.choice((1, 1, 2, bs, rng.randint(1, bs)))
        R = self.rows[0]
        req = (rng.randrange(R + 1), rng.randrange(R), R)
        legacy = self.legacy and rng.random() < 0.2
        op = PReadTable(seed=rng.randrange(1 << 30), bs=bs, max_pages=mp, req=req, long_len=long_len,
                        n_long=min(n_long, bs), legacy=legacy, aligned=self.aligned)
        return self._tag(op, bs=bs_tag, max_pages=mp_tag, long_pages=long_tag)

    def packed_op(self) -> tuple[PReadTablePacked, dict]:
        """A valid packed read table (rows at the boundaries, ``max_tokens`` from ``capacity``) and its tags."""
        rng, lim = self.rng, self.limits
        for _ in range(self.tries):
            bs, bs_tag = self.bounds.bs(lim.max_bs)
            cols, cols_tag = self.bounds.trip_pages(bs, lim.max_row_tokens)
            if (bs * cols <= 4 * lim.max_packed and self.under(lim.max_programs, bs, cols)
                    and self.affords(bs, cols, grid_cols=bs * cols)):
                break
        else:
            bs, cols, bs_tag, cols_tag = rng.randint(1, 8), rng.randint(1, 64), "fallback", "fallback"
        self.take(bs, cols, grid_cols=bs * cols)  # the grid follows max_tokens: at most bs * row_cap
        self._need_rows(cols)
        long_len, long_tag = (cols, "max") if rng.random() < 0.5 or self.dear else self.bounds.size(0, cols)
        n_long = min(bs, rng.choice((1, 2, bs)))
        if bs * cols > lim.max_packed:  # most rows short: the total stays inside the budget
            n_long = max(1, min(n_long, lim.max_packed // max(1, cols) // 2))
        R = self.rows[0]
        # gap 0: SPEC §2's indptr_consistent. The gap's old draw stays, so the sizes drawn after it are
        # those tests/fuzz/test_palette.py measured the palette on.
        op = PReadTablePacked(seed=rng.randrange(1 << 30), bs=bs, max_tokens=cols,
                              req=(rng.randrange(R + 1), rng.randrange(R), R), long_len=long_len, n_long=n_long,
                              gap=0 * rng.choice((0, 0, 3)), has_start=rng.random() < 0.5, row_cap=cols)
        if op.elements() > 2 * lim.max_packed:
            op = dataclasses.replace(op, n_long=1, row_cap=min(cols, max(1, lim.max_packed // bs)),
                                     long_len=min(long_len, max(1, lim.max_packed // bs)))
        max_tokens, cap_tag = self.capacity(op.bs, op.end(), op.bs * op.row_cap)
        return (dataclasses.replace(op, max_tokens=max_tokens),
                dict(bs=bs_tag, row_cap=cols_tag, long_len=long_tag, max_tokens=cap_tag))

    def capacity(self, bs: int, end: int, full: int) -> tuple[int, str]:
        """``max_tokens`` of a packed table whose indptr ends at ``end`` (SPEC §2: at least that):
        exactly it, a little more, or the buffer a server captured for ``full`` tokens."""
        rng, lim = self.rng, self.limits
        end = max(1, end)
        r = rng.random()
        if r < 0.4:
            v, tag = end, "indptr[bs]"
        elif r < 0.7:
            v, tag = end + rng.choice((1, self.config.page_size, rng.randrange(1, 512))), "indptr[bs]+slack"
        else:
            v, tag = max(end, min(full, 2 * lim.max_packed)), "bs*row_cap"
        if self.budget is not None:  # priced by ``packed_op`` at ``full`` tokens: no wider grid than that
            over = self.programs(bs, v) > self.programs(bs, max(full, end))
        else:
            over = lim.max_programs is not None and self.programs(bs, v) > lim.max_programs
        if v > end and over:
            v, tag = end, "indptr[bs] (program budget)"
        return v, tag

    def _p_read_table_packed(self) -> Op:
        op, tags = self.packed_op()
        return self._tag(op, **tags)

    # ---- hostile probes (HOSTILE_MIX): SPEC §2's memory-safety promises ----------------------
    def _p_free_unbind_any(self) -> Op:
        rng, rows = self.rng, self.config.table_rows
        n, tag = self.bounds.size(1, self._ids_budget())
        gaps, r = self._gaps(), rng.random()
        if gaps and r < 0.4:  # pages that are unbound now: double frees
            s, e = rng.choice(gaps)
            n = min(n, e - s)
            v, src = self._v(s + rng.randint(0, e - s - n)), "unbound pages"
        elif r < 0.7:
            v, src = (0, rows, unit_near(rng.randrange(1, rows), rows), rng.randrange(rows), 0), "any rows"
        else:
            v, src = (0, rows, rng.randrange(1, rows), rng.randrange(rows), 0), "any rows, repeats"
        op = PFreeUnbindAny(seed=rng.randrange(1 << 30), n=n, v=v, bad_every=rng.choice((0, 3, 17, 101)),
                            far=rng.choice((1, 2, 16, 64, FAR_MAX)))
        return self._tag(op, n=tag, ids=src)

    def _p_read_table_overflow(self) -> Op:
        rng, ps = self.rng, self.config.page_size
        bs, mp, bs_tag, mp_tag = self.table_shape(self.limits.max_row_tokens // ps)
        self._need_rows((mp - 1) * ps + 1)
        if (2 * self.rows[1] - 1) // ps < mp:  # too narrow to read one page past max_pages inside the red zone
            self.rows_op((mp + 1) * ps)
        over_max = ((2 * self.rows[1] - 1) // ps - (mp - 1)) * ps  # reads stay inside req_to_token's red zone
        over = rng.choice((1, ps, ps + 1, rng.randint(1, 8 * ps), self.bounds.size(1, over_max)[0]))
        R = self.rows[0]
        op = PReadTableOverflow(seed=rng.randrange(1 << 30), bs=bs, max_pages=mp, req=(rng.randrange(R + 1),
                                rng.randrange(R), R), n_long=min(bs, rng.choice((1, 1, 2, bs))),
                                over=max(1, min(over, over_max)), legacy=self.legacy and rng.random() < 0.2,
                                aligned=self.aligned)
        return self._tag(op, bs=bs_tag, max_pages=mp_tag)

    def _p_read_table_packed_disagree(self) -> Op:
        rng = self.rng
        op, tags = self.packed_op()
        w = self.rows[1]
        if op.gap + 1 > w:
            op = dataclasses.replace(op, gap=0)
        end = max(1, op.end())
        over = rng.choice((1, 2, rng.randint(1, 64), rng.randint(1, op.row_tokens())))
        hop = PReadTablePackedDisagree(
            seed=op.seed, bs=op.bs, max_tokens=end if rng.random() < 0.6 else max(end, op.max_tokens), req=op.req,
            long_len=op.long_len, n_long=op.n_long, gap=op.gap, has_start=op.has_start, row_cap=op.row_cap,
            over=max(1, min(over, w - op.gap)), n_over=min(op.bs, rng.choice((1, 1, 2, op.bs))))
        return self._tag(hop, **tags)

    def _g_read_table(self) -> Op:
        return draw_graph_op(self)

    def _p_read_table_far(self) -> Op:
        return draw_far_op(self, self.far)


# ---- what a seed decides ------------------------------------------------------------------------


def kernel_features(tier) -> set:
    return {fn for fn in ("build_kv_read_table_packed", "translate_tokens", "build_kv_read_table_legacy")
            if tier.has(fn)}


def scale_info(tier, knobs: dict | None = None, *, observe: bool = True) -> dict:
    """What a production op stream depends on besides its seed, as JSON: the kernel set's
    constants (at ``knobs``; with ``observe``, also the block sizes and grids its launches
    show: ``observe.observed_constants``), its optional functions and whether it runs on a
    GPU. A supervisor rebuilds a dead worker's ops from this and the seed (``regenerate``)."""
    apply_knobs(tier.kernels, knobs)
    seen = None
    if observe and tier.backend != "torch":
        key = (id(tier.kernels), tuple(sorted((knobs or {}).items())))
        if key not in _OBSERVED:
            _OBSERVED[key] = observed_constants(tier.kernels, tier.device)
        seen = _OBSERVED[key]
    info = {"constants": kernel_constants(tier.kernels, seen).to_json(), "features": sorted(kernel_features(tier)),
            "gpu": str(tier.device).startswith("cuda")}
    if tier.backend == "interpret":  # its tables are priced (``cost``); absent: the stream of before
        info["interpreter"] = True
    return info


def sequence_aligned(seed: int, gpu: bool) -> bool:
    """Whether a production sequence lays its buffers out aligned (``ScaleGenerator.aligned``):
    three in four on a GPU, where each alignment and stride class of a buffer is one more compile
    of a kernel (``benchmarks/variants.py`` counts them), half elsewhere; from an RNG of its own."""
    return random.Random(seed * 1_000_039 + 0xA1).random() < (0.75 if gpu else 0.5)


def sequence_r2t_dtype(seed: int) -> str:
    """The ``req_to_token`` dtype of a production sequence: int32 (SGLang's) or int64, half the
    seeds each, from an RNG of its own (the rest of the stream is the one it was before)."""
    return ("int32", "int64")[random.Random(seed * 1_000_033 + 0x5EED).random() < 0.5]


_OBSERVED: dict = {}  # per kernel set and knobs: what its launches showed (probed once per process)


def generator(seed: int, info: dict, *, limits: ScaleLimits | None = None, mix: dict | None = None,
              big: float | None = None, hostile: str = "spec") -> tuple[kvref.PoolConfig, ScaleGenerator]:
    """What a seed decides, given ``scale_info`` and the hostile mode (``off``: no hostile
    probes in the stream): the geometry and the op stream. ``big``: the share of full-size
    read tables (default 0.1 on a GPU, 0.02 on the interpreter). ``info["palette"]`` (a
    worker's palette seed and ``explore``, or absent): every size is drawn over that palette;
    without one the stream is the one it always was."""
    gpu = info["gpu"]
    big = (0.1 if gpu else 0.02) if big is None else big
    c = info["constants"]
    constants = Constants(dict(c["blocks"]), dict(c["targets"]), c["source"])
    limits = limits or (ScaleLimits.production() if gpu else
                        ScaleLimits.interpreter_priced() if info.get("interpreter") else ScaleLimits.interpreter())
    rng = random.Random(seed * 1_000_003 + 11)
    palette, explore = from_info(info, constants, limits)
    config = scale_config(rng, constants, limits, palette=palette, explore=explore)
    features = set(info["features"])
    gen = ScaleGenerator(rng, config, constants, limits, features=features, mix=mix,
                         legacy="build_kv_read_table_legacy" in features, big=big, r2t_dtype=sequence_r2t_dtype(seed),
                         far=far_rng(seed), hostile=hostile, palette=palette, explore=explore,
                         aligned=sequence_aligned(seed, gpu))
    return config, gen


def regenerate(seed: int, n_ops: int, info: dict, **kw) -> tuple[kvref.PoolConfig, list[Op]]:
    """The first ``n_ops`` ops of ``seed``'s sequence (the stream depends on nothing the
    target does; pass the run's ``hostile``)."""
    config, gen = generator(seed, info, **kw)
    return config, [gen.next_op() for _ in range(n_ops)]
