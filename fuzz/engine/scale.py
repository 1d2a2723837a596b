"""Production scale: kernel-level ops at the sizes where grid, stride and tail bugs live.

Small pools (tens of pages) never give a strided read-table program its second trip
or a launcher its second block at production constants, and a team's kernels expose no
knobs to shrink those constants. This module fuzzes SPEC §2 on raw tables at production
sizes instead (pools up to 2^20 pages, bs up to 512 and the cdiv(TARGET, bs) steps
beyond, rows up to 256k tokens, id batches up to 64k), with shapes aimed at the kernel
set's own block boundaries (``boundary``), against the vectorized oracle
(``vector_oracle``) on the same device.

Ops stay small in JSON because they are generative: parameters plus a seed, evaluated
on the target's device with integer arithmetic that is exact on CPU and GPU alike (every
product stays below 2^63). An id batch is an affine slice ``lo + (a * (i0 + i) + b) mod
span`` for ``i < n`` (unique when ``gcd(a, span) == 1`` and ``i0 + n <= span``);
``req_to_token`` rows are built from pages by the same arithmetic, with ``-1`` padding
past each row's fill and at seeded pages; ``seq_lens`` come from a seeded hash. Every op
checks its preconditions before the target sees it (only valid input goes to the target
here) and answers ``ContractViolation`` otherwise, so a minimizer that drops the op a
later one depends on gets a rejection, not a false finding.

One sequence has one pool geometry (``kvref.PoolConfig``: num_pages, page_size,
multiplier). Its state: the target's v2p/p2v between red zones whose canary, read as an
index, lands in a red zone again (``rows + guard // 2``; for token buffers times the page
size); the oracle's own copies; and the current ``req_to_token`` rows (``p_rows``), both
sides. Results are compared on the device, one host read per check, and only the first
divergent element is read back.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import torch

import kvref
from kvref import ContractViolation

from . import vector_oracle as vo
from .boundary import Boundaries, Constants, cdiv, kernel_constants
from .knobs import apply as apply_knobs
from .memory import Guarded, index_canary
from .ops import OUT_SLACK_COLS, PACKED_SLACK, POISON, Ints, Op, OpError, parse_ops
from .runner import Divergence, Outcome, RunStats
from .tiers import Tier

LONG = torch.int64
INT32_LIMIT = 1 << 31
HASH_P = 2_147_483_647  # 2^31 - 1, prime: every hash value stays below 2^31
HASH_A = 2_654_435_761
HASH_B = 2_246_822_519
HASH_C = 3_266_489_917
TABLE_GUARD = 64  # red-zone rows on each side of v2p/p2v
ROW_GUARD = 2  # red-zone rows of req_to_token on each side
BUILD_CHUNK = 1 << 22  # req_to_token elements built per pass (bounds the int64 temporaries)


# ---- integer arithmetic, identical on the host and on any device ---------------------------


def hash_int(x: int, seed: int) -> int:
    """The host twin of ``hash_tensor``: a value in [0, 2^31 - 1)."""
    h = (x % HASH_P * HASH_A + seed % HASH_P) % HASH_P
    return (h * HASH_B + HASH_C) % HASH_P


def hash_tensor(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Elementwise ``hash_int`` of a non-negative int64 tensor (new tensor)."""
    h = x.remainder(HASH_P).mul_(HASH_A).add_(seed % HASH_P).remainder_(HASH_P)
    return h.mul_(HASH_B).add_(HASH_C).remainder_(HASH_P)


def affine_ids(desc: Ints, n: int, device) -> torch.Tensor:
    """``lo + (a * (i0 + i) + b) mod span`` for ``i < n``: desc = (lo, span, a, b, i0)."""
    lo, span, a, b, i0 = desc
    i = torch.arange(i0, i0 + n, dtype=LONG, device=device)
    return i.mul_(a).add_(b).remainder_(span).add_(lo)


def affine_error(desc: Ints, n: int, lo_min: int, hi: int, what: str) -> str | None:
    """Why an affine slice is not ``n`` unique ids inside [lo_min, hi), or None."""
    if len(desc) != 5:
        return f"{what}: an id slice is (lo, span, a, b, i0), got {desc}"
    lo, span, a, b, i0 = desc
    if n < 0 or span < 1 or i0 < 0 or i0 + n > span:
        return f"{what}: slice [{i0}, {i0 + n}) does not fit span {span}"
    if math.gcd(a, span) != 1 or a <= 0 or b < 0:
        return f"{what}: a={a} is not a unit mod span {span} (ids would repeat)"
    if lo < lo_min or lo + span > hi:
        return f"{what}: ids [{lo}, {lo + span}) leave [{lo_min}, {hi})"
    return None


def unit_near(x: int, span: int) -> int:
    """The first ``a >= max(1, x)`` with ``gcd(a, span) == 1`` (a permutation multiplier)."""
    a = max(1, x) % max(span, 1) or 1
    while math.gcd(a, span) != 1:
        a += 1
    return a


def _shrunk_ints(v: int, floor: int = 0) -> list[int]:
    """Smaller values for an int field, the boldest first."""
    out = []
    for c in (floor, v // 2, v - v // 4, *(v - (1 << k) for k in range(v.bit_length() - 2, -1, -1))):
        if floor <= c < v and c not in out:
            out.append(c)
    return out


# ---- limits --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleLimits:
    """How big the generator goes (the op language itself has no limits)."""

    pool_pages: int = 1 << 20  # at page size 1
    pool_pages_paged: int = 1 << 16  # at page size > 1
    page_sizes: tuple = (1, 1, 16, 64)
    multipliers: tuple = (1, 2, 8, 64)
    max_ids: int = 1 << 16
    max_bs: int = 512
    max_step_bs: int = 4096  # bs at cdiv(TARGET, bs) steps may exceed max_bs up to this
    max_row_tokens: int = 1 << 18
    max_read_elems: int = 1 << 27  # bs * max_pages of one read table
    max_r2t_elems: int = 1 << 27
    max_packed: int = 1 << 25
    max_programs: int | None = None  # read-table programs per launch (the interpreter's cost)
    graph_steps: int = 32
    graph_programs: int | None = None

    @classmethod
    def production(cls) -> ScaleLimits:
        return cls()

    @classmethod
    def interpreter(cls) -> ScaleLimits:
        """Production constants, sizes the interpreter runs in about a second per op."""
        return cls(pool_pages=1 << 17, pool_pages_paged=1 << 14, max_ids=1 << 14, max_bs=512, max_step_bs=2048,
                   max_row_tokens=1 << 17, max_read_elems=1 << 21, max_r2t_elems=1 << 22, max_packed=1 << 20,
                   max_programs=2200, graph_steps=6, graph_programs=300)

    @classmethod
    def small(cls) -> ScaleLimits:
        return cls(pool_pages=1 << 12, pool_pages_paged=1 << 9, page_sizes=(1, 2, 4), max_ids=700, max_bs=40,
                   max_step_bs=40, max_row_tokens=1 << 11, max_read_elems=1 << 14, max_r2t_elems=1 << 16,
                   max_packed=1 << 14, max_programs=300, graph_steps=4, graph_programs=120)

    @classmethod
    def for_tier(cls, tier: Tier) -> ScaleLimits:
        return cls.production() if str(tier.device).startswith("cuda") else cls.interpreter()


# ---- the ops ---------------------------------------------------------------------------------------


def _fits_pool(config: kvref.PoolConfig) -> str | None:
    if config.table_rows * config.multiplier * config.page_size >= INT32_LIMIT:
        return "v2p * multiplier * page_size must stay below 2^31 (SPEC §2)"
    return None


@dataclass(frozen=True)
class ScaleOp(Op):
    """A production-scale kernel-level op: ``invalid`` (host-side preconditions, may read
    the run's host-known state) and ``execute`` (oracle, target, compare)."""

    needs: ClassVar[str] = ""  # an optional kernel-set function the op needs

    def supported_by(self, tier) -> bool:
        return not self.needs or tier.has(self.needs)

    def invalid(self, run: ScaleRun) -> str | None:
        return None

    def execute(self, run: ScaleRun, i: int) -> Outcome:
        raise NotImplementedError

    def elements(self) -> int:
        return 0

    def _shrink_fields(self, names: tuple[str, ...], floors: dict | None = None) -> Iterator[Op]:
        for name in names:
            v = getattr(self, name)
            for c in _shrunk_ints(v, (floors or {}).get(name, 0)):
                yield dataclasses.replace(self, **{name: c})


@dataclass(frozen=True)
class _Pairs(ScaleOp):
    """n virtual pages ``v`` and n physical pages ``p``, both affine slices."""

    n: int
    v: Ints
    p: Ints

    def invalid(self, run):
        c = run.config
        return (affine_error(self.v, self.n, c.min_page, c.num_pages, f"{self.kind} v")
                or affine_error(self.p, self.n, c.min_page, c.num_pages, f"{self.kind} p"))

    def ids(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        return affine_ids(self.v, self.n, device), affine_ids(self.p, self.n, device)

    def shrink(self):
        yield from self._shrink_fields(("n",))


@dataclass(frozen=True)
class PSetup(_Pairs):
    """Reset both sides' tables and bind ``n`` pages directly (harness state, no kernel)."""

    kind = "p_setup"

    def execute(self, run, i):
        for v2p, p2v in ((run.t_v2p.view, run.t_p2v.view), (run.o_v2p, run.o_p2v)):
            v2p.fill_(-1)
            p2v.fill_(-1)
            v2p[:1].fill_(0)
            p2v[:1].fill_(0)
            vo.bind(v2p, p2v, *self.ids(run.device))
        return Outcome(None)


@dataclass(frozen=True)
class PBind(_Pairs):
    kind = "p_bind"

    def execute(self, run, i):
        v, p = self.ids(run.device)
        vo.bind(run.o_v2p, run.o_p2v, v, p)
        run.call_target(i, self, lambda k: k.bind_inplace(v.clone(), p.clone(), run.t_v2p.view, run.t_p2v.view))
        run.check(i, self, [], state=True)
        return Outcome(None)

    def elements(self):
        return self.n


@dataclass(frozen=True)
class PAllocBind(ScaleOp):
    kind = "p_alloc_bind"
    n: int
    v: Ints
    start: int

    def invalid(self, run):
        c = run.config
        if self.start < c.min_page or self.start + self.n > c.num_pages:
            return f"p_alloc_bind: pages [{self.start}, {self.start + self.n}) leave the pool"
        return affine_error(self.v, self.n, c.min_page, c.num_pages, "p_alloc_bind v")

    def execute(self, run, i):
        v = affine_ids(self.v, self.n, run.device)
        expected = vo.alloc_bind(run.o_v2p, run.o_p2v, v, self.start)
        got = run.call_target(i, self, lambda k: k.alloc_bind_inplace(v.clone(), run.t_v2p.view, run.t_p2v.view,
                                                                      self.start))
        run.check(i, self, [Compare("p_pages", expected, got)], state=True)
        return Outcome(None)

    def elements(self):
        return self.n

    def shrink(self):
        yield from self._shrink_fields(("n",))
        if self.start > 1:
            yield dataclasses.replace(self, start=1)


@dataclass(frozen=True)
class PFreeUnbind(ScaleOp):
    kind = "p_free_unbind"
    n: int
    v: Ints

    def invalid(self, run):
        c = run.config
        err = affine_error(self.v, self.n, c.min_page, c.num_pages, "p_free_unbind v")
        if err is None and self.n and bool(run.o_v2p.index_select(0, affine_ids(self.v, self.n, run.device)).lt(0).any()):
            err = "p_free_unbind: a page is not bound (double free)"  # one host read; valid input only
        return err

    def execute(self, run, i):
        v = affine_ids(self.v, self.n, run.device)
        expected = vo.free_unbind(run.o_v2p, run.o_p2v, v)
        got = run.call_target(i, self, lambda k: k.free_unbind_inplace(v.clone(), run.t_v2p.view, run.t_p2v.view))
        run.check(i, self, [Compare("p_pages", expected, got)], state=True)
        return Outcome(None)

    def elements(self):
        return self.n

    def shrink(self):
        yield from self._shrink_fields(("n",))


@dataclass(frozen=True)
class PRows(ScaleOp):
    """Build ``req_to_token`` [rows, width] on both sides (harness state, no kernel).

    Page ``x = r * ceil(width / ps) + col`` of row ``r`` is virtual page
    ``lo + (a * (k0 + (c * x + d) mod m) + b) mod span`` (src = (lo, span, a, b, k0, m, c, d):
    an affine walk over a slice of bound pages, or over the whole pool), its tokens
    ``page * ps + o``; ``-1`` at pages whose hash is 0 mod ``pad_every`` (when > 0) and past
    each row's fill (the full width, or for a quarter of the rows a seeded shorter one)."""

    kind = "p_rows"
    seed: int
    rows: int
    width: int
    src: Ints
    pad_every: int

    def invalid(self, run):
        if self.rows < 1 or self.width < 1:
            return "p_rows: rows and width must be >= 1"
        if len(self.src) != 8:
            return f"p_rows: src is (lo, span, a, b, k0, m, c, d), got {self.src}"
        lo, span, a, b, k0, m, c, d = self.src
        if lo < 0 or span < 1 or lo + span > run.config.table_rows or min(a, b, k0, c, d) < 0 or m < 1 or self.pad_every < 0:
            return f"p_rows: src {self.src} leaves the table"
        return None

    def fills(self) -> list[int]:
        w = self.width
        return [w if hash_int(r, self.seed + 1) % 4 else hash_int(r, self.seed + 2) % (w + 1) for r in range(self.rows)]

    def build(self, config: kvref.PoolConfig, device) -> torch.Tensor:
        ps, w = config.page_size, self.width
        ppr = cdiv(w, ps)
        lo, span, a, b, k0, m, c, d = self.src
        out = torch.empty((self.rows, w), dtype=torch.int32, device=device)
        fills = torch.tensor(self.fills(), dtype=LONG, device=device)
        step = max(1, BUILD_CHUNK // max(1, ppr * ps))
        offs = torch.arange(ps, dtype=LONG, device=device)
        cols = torch.arange(w, dtype=LONG, device=device)
        for r0 in range(0, self.rows, step):
            r1 = min(self.rows, r0 + step)
            x = torch.arange(r0 * ppr, r1 * ppr, dtype=LONG, device=device)
            page = x.mul(c).add_(d).remainder_(m).add_(k0).mul_(a).add_(b).remainder_(span).add_(lo)
            if self.pad_every > 0:
                page = torch.where(hash_tensor(x, self.seed).remainder_(self.pad_every) == 0, -1, page)
            tok = (page.view(-1, 1) * ps + offs).view(r1 - r0, ppr * ps)[:, :w]
            if self.pad_every > 0:
                pad = (page.view(r1 - r0, ppr, 1) < 0).expand(-1, -1, ps).reshape(r1 - r0, ppr * ps)[:, :w]
                tok = torch.where(pad, -1, tok)
            tok = torch.where(cols.view(1, -1) < fills[r0:r1].view(-1, 1), tok, -1)
            out[r0:r1].copy_(tok)
        return out

    def execute(self, run, i):
        run.set_rows(self.build(run.config, run.device))
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("rows",), {"rows": 1})
        yield from self._shrink_fields(("width",), {"width": 1})
        if self.pad_every:
            yield dataclasses.replace(self, pad_every=0)
        if self.seed:
            yield dataclasses.replace(self, seed=0)


def _seq_lens(seed: int, bs: int, cap: int, long_len: int, n_long: int) -> list[int]:
    """``long_len`` for the ``n_long`` rows ``(i + seed) mod bs < n_long``; a seeded length in [0, cap] elsewhere."""
    out = []
    for i in range(bs):
        if (i + seed) % bs < n_long:
            out.append(long_len)
        else:
            h = hash_int(i, seed)
            out.append(0 if h % 8 == 0 else h % (cap + 1))
    return out


def _req_idx(req: Ints, bs: int) -> list[int]:
    a, b, rows = req
    return [(a * i + b) % rows for i in range(bs)]


def _simpler_req(op) -> Iterator[Op]:
    """Batch row i reads req row i mod R, then every batch row reads row 0 (R = 1)."""
    a, b, rows = op.req
    if (a, b) != (1, 0):
        yield dataclasses.replace(op, req=(1, 0, rows))
    if rows > 1:
        yield dataclasses.replace(op, req=(1, 0, 1))


def _req_error(run: ScaleRun, req: Ints) -> str | None:
    if run.rows_shape is None:
        return "no req_to_token rows yet (p_rows)"
    if len(req) != 3 or req[2] < 1 or req[2] > run.rows_shape[0] or req[0] < 0 or req[1] < 0:
        return f"req (a, b, rows) = {req} does not name rows of req_to_token {run.rows_shape}"
    return None


@dataclass(frozen=True)
class PReadTable(ScaleOp):
    """read_table over the current rows: ``req_idx[i] = (a * i + b) mod R`` (req = (a, b, R)),
    ``seq_lens`` from ``_seq_lens`` with cap ``max_pages * ps``."""

    kind = "p_read_table"
    seed: int
    bs: int
    max_pages: int
    req: Ints
    long_len: int
    n_long: int
    legacy: bool

    def supported_by(self, tier):
        return not self.legacy or tier.has("build_kv_read_table_legacy")

    def invalid(self, run):
        err = _req_error(run, self.req)
        if err:
            return f"p_read_table: {err}"
        ps, w = run.config.page_size, run.rows_shape[1]
        if self.bs < 1 or self.max_pages < 1 or (self.max_pages - 1) * ps >= w:
            return f"p_read_table: bs {self.bs}, max_pages {self.max_pages} do not fit rows of width {w}"
        if not 0 <= self.long_len <= self.max_pages * ps or not 0 <= self.n_long <= self.bs:
            return f"p_read_table: long_len {self.long_len} / n_long {self.n_long} out of range"
        return None

    def seq_lens(self, ps: int) -> list[int]:
        return _seq_lens(self.seed, self.bs, self.max_pages * ps, self.long_len, self.n_long)

    def elements(self):
        return self.bs * self.max_pages

    def execute(self, run, i):
        ps, dev = run.config.page_size, run.device
        seq = self.seq_lens(ps)
        req_t = torch.tensor(_req_idx(self.req, self.bs), dtype=LONG, device=dev)
        seq_t = torch.tensor(seq, dtype=LONG, device=dev)
        o_buf, t_buf = (torch.full((self.bs + 2, self.max_pages + OUT_SLACK_COLS), POISON, dtype=torch.int32,
                                   device=dev) for _ in range(2))
        vo.read_table(req_to_token=run.o_r2t, req_pool_indices=req_t, seq_lens=seq_t, v2p=run.o_v2p,
                      multiplier=run.config.multiplier, page_size=ps, max_pages=self.max_pages,
                      out=o_buf[1:1 + self.bs, :self.max_pages])
        fn = "build_kv_read_table_legacy" if self.legacy else "build_kv_read_table"
        run.call_target(i, self, lambda k: getattr(k, fn)(
            req_to_token=run.t_r2t.view, req_pool_indices=req_t.clone(), seq_lens=seq_t.clone(), v2p=run.t_v2p.view,
            multiplier=run.config.multiplier, page_size=ps, max_pages=self.max_pages,
            out=t_buf[1:1 + self.bs, :self.max_pages]))
        n_cols = [min(cdiv(s, ps), self.max_pages) for s in seq]
        run.check(i, self, [Compare("out", o_buf, t_buf, live=lambda: table_live(o_buf.shape, n_cols, dev),
                                    where=lambda at: f"out[{at[0] - 1}][{at[1]}]")])
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("bs",), {"bs": 1})
        yield from self._shrink_fields(("max_pages",), {"max_pages": 1})
        yield from self._shrink_fields(("n_long", "long_len"))
        if self.seed:
            yield dataclasses.replace(self, seed=0)
        yield from _simpler_req(self)


def table_live(shape, n_cols: list[int], device) -> torch.Tensor:
    """bool mask of a read-table buffer (one guard row first): the live prefix of each batch row."""
    live = torch.zeros(shape, dtype=torch.bool, device=device)
    if n_cols:
        n = torch.tensor(n_cols, dtype=LONG, device=device)
        live[1:1 + len(n_cols)] = torch.arange(shape[1], device=device).view(1, -1) < n.view(-1, 1)
    return live


def packed_live(numel: int, spans: list[tuple[int, int]], device) -> torch.Tensor:
    """bool mask of a packed buffer (PACKED_SLACK guard first): [start, start + n) of each row."""
    live = torch.zeros(numel, dtype=torch.bool, device=device)
    for start, n in spans:
        live[PACKED_SLACK + start:PACKED_SLACK + start + n] = True
    return live


def packed_layout(seed: int, bs: int, max_tokens: int, long_len: int, n_long: int, gap: int, has_start: bool,
                  width: int) -> tuple[list[int], list[int], list[int] | None]:
    """(seq_lens, indptr, kv_start or None) of a packed read table."""
    seq = _seq_lens(seed, bs, max_tokens, long_len, n_long)
    indptr = [0]
    for b, n in enumerate(seq):
        indptr.append(indptr[-1] + n + (hash_int(b, seed + 3) % (gap + 1) if gap else 0))
    starts = [hash_int(b, seed + 4) % (width - n + 1) for b, n in enumerate(seq)] if has_start else None
    return seq, indptr, starts


@dataclass(frozen=True)
class PReadTablePacked(ScaleOp):
    """read_table_packed: indptr = running sum of seq_lens (+ a seeded gap of up to ``gap``
    per row), kv_start (when ``has_start``) a seeded start that keeps the row inside width."""

    kind = "p_read_table_packed"
    needs = "build_kv_read_table_packed"
    seed: int
    bs: int
    max_tokens: int
    req: Ints
    long_len: int
    n_long: int
    gap: int
    has_start: bool

    def invalid(self, run):
        err = _req_error(run, self.req)
        if err:
            return f"p_read_table_packed: {err}"
        w = run.rows_shape[1]
        if self.bs < 1 or not 1 <= self.max_tokens <= w or self.gap < 0:
            return f"p_read_table_packed: bs {self.bs}, max_tokens {self.max_tokens} do not fit width {w}"
        if not 0 <= self.long_len <= self.max_tokens or not 0 <= self.n_long <= self.bs:
            return f"p_read_table_packed: long_len {self.long_len} / n_long {self.n_long} out of range"
        return None

    def layout(self, width: int):
        return packed_layout(self.seed, self.bs, self.max_tokens, self.long_len, self.n_long, self.gap,
                             self.has_start, width)

    def elements(self):
        return sum(_seq_lens(self.seed, self.bs, self.max_tokens, self.long_len, self.n_long))

    def execute(self, run, i):
        dev = run.device
        seq, indptr, starts = self.layout(run.rows_shape[1])
        ints = {name: torch.tensor(x, dtype=LONG, device=dev) for name, x in
                (("req", _req_idx(self.req, self.bs)), ("seq", seq), ("indptr", indptr), ("start", starts))
                if x is not None}
        total = indptr[-1]
        o_buf, t_buf = (torch.full((total + 2 * PACKED_SLACK,), POISON, dtype=torch.int32, device=dev)
                        for _ in range(2))
        common = dict(multiplier=run.config.multiplier, page_size=run.config.page_size, max_tokens=self.max_tokens)
        vo.read_table_packed(req_to_token=run.o_r2t, req_pool_indices=ints["req"], seq_lens=ints["seq"],
                             v2p=run.o_v2p, indptr=ints["indptr"], out=o_buf[PACKED_SLACK:PACKED_SLACK + total],
                             kv_start_idx=ints.get("start"), **common)
        start_t = ints["start"].clone() if "start" in ints else None
        run.call_target(i, self, lambda k: k.build_kv_read_table_packed(
            req_to_token=run.t_r2t.view, req_pool_indices=ints["req"].clone(), seq_lens=ints["seq"].clone(),
            v2p=run.t_v2p.view, indptr=ints["indptr"].clone(), out=t_buf[PACKED_SLACK:PACKED_SLACK + total],
            kv_start_idx=start_t, **common))
        spans = list(zip(indptr[:-1], seq))
        run.check(i, self, [Compare("out", o_buf, t_buf, live=lambda: packed_live(o_buf.numel(), spans, dev),
                                    where=lambda at: f"out[{at - PACKED_SLACK}]")])
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("bs",), {"bs": 1})
        yield from self._shrink_fields(("max_tokens",), {"max_tokens": 1})
        yield from self._shrink_fields(("n_long", "long_len", "gap"))
        if self.has_start:
            yield dataclasses.replace(self, has_start=False)
        if self.seed:
            yield dataclasses.replace(self, seed=0)
        yield from _simpler_req(self)


@dataclass(frozen=True)
class PTranslate(ScaleOp):
    """translate of ``n`` tokens ``page * ps + i mod ps`` (page an affine walk: src = (lo, span, a, b));
    every token whose hash is 0 mod ``bad_every`` (when > 0) is -1, or a page past the table."""

    kind = "p_translate"
    needs = "translate_tokens"
    seed: int
    n: int
    src: Ints
    bad_every: int

    def invalid(self, run):
        if len(self.src) != 4 or self.n < 0 or self.bad_every < 0:
            return f"p_translate: src is (lo, span, a, b), got {self.src}"
        lo, span, a, b = self.src
        if lo < 0 or span < 1 or a < 0 or b < 0 or lo + span > run.config.table_rows:
            return f"p_translate: src {self.src} leaves the table"
        return None

    def loc(self, config, device) -> torch.Tensor:
        ps, rows = config.page_size, config.table_rows
        lo, span, a, b = self.src
        i = torch.arange(self.n, dtype=LONG, device=device)
        tok = i.mul(a).add_(b).remainder_(span).add_(lo).mul_(ps).add_(i.remainder(ps))
        if self.bad_every > 0:
            h = hash_tensor(i, self.seed)
            bad = h.remainder(self.bad_every) == 0
            far = (rows + h.remainder(3)) * ps + h.remainder(ps)  # a page past the table
            tok = torch.where(bad, torch.where(h.remainder(2) == 0, -1, far), tok)
        return tok

    def elements(self):
        return self.n

    def execute(self, run, i):
        loc = self.loc(run.config, run.device)
        ps = run.config.page_size
        expected = vo.translate(loc=loc, v2p=run.o_v2p, page_size=ps)
        got = run.call_target(i, self, lambda k: k.translate_tokens(loc=loc.clone(), v2p=run.t_v2p.view, page_size=ps))
        run.check(i, self, [Compare("slots", expected, got)])
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("n",))
        if self.bad_every:
            yield dataclasses.replace(self, bad_every=0)
        if self.seed:
            yield dataclasses.replace(self, seed=0)


# ---- the runner ------------------------------------------------------------------------------------


@dataclass
class Compare:
    """One result to diff: the oracle's tensor and the target's. ``live`` (a thunk giving a
    bool mask) splits a mismatch into ``result`` (inside the live prefix) and ``memory``
    (poison past it); ``where`` names an element for the message."""

    field: str
    expected: torch.Tensor
    actual: object
    live: Callable[[], torch.Tensor] | None = None
    where: Callable[[object], str] | None = None


class ScaleRun:
    """The target's tables and the oracle's, one production-scale op at a time.

    Results (returned pages, out buffers with their poison) are compared after every op;
    the raw tables, the rows and every red zone after every op that writes the tables,
    every ``check_every``-th op otherwise, and at ``finish``."""

    def __init__(self, config: kvref.PoolConfig, tier: Tier, *, check_every: int = 1, knobs: dict | None = None):
        err = _fits_pool(config)
        if err:
            raise OpError(f"pool config {config}: {err}")
        self.config, self.tier = config, tier
        self.device = torch.device(tier.device)
        self.check_every = max(1, check_every)
        self.knobs = knobs
        apply_knobs(tier.kernels, knobs)
        rows = config.table_rows
        self.table_canary = index_canary(rows, TABLE_GUARD)  # read as a page id: lands in the trailing red zone
        self.t_v2p = Guarded((rows,), LONG, self.device, TABLE_GUARD, self.table_canary, -1)
        self.t_p2v = Guarded((rows,), LONG, self.device, TABLE_GUARD, self.table_canary, -1)
        self.t_v2p.view[:1].fill_(0)
        self.t_p2v.view[:1].fill_(0)
        self.o_v2p = self.t_v2p.view.clone()
        self.o_p2v = self.t_p2v.view.clone()
        self.t_r2t: Guarded | None = None
        self.o_r2t: torch.Tensor | None = None
        self.rows_shape: tuple[int, int] | None = None
        self.stats = RunStats()
        self.elements_checked = 0
        self.step_no = 0
        self._since_state = 0
        self.notes: list[str] = []  # what could not be checked (e.g. graph mode not applicable)
        self.graph_replays = 0
        self.graph_not_applicable = 0
        self.shapes: dict | None = None  # the generator's summary, when a generator made the ops
        self.last: list[Compare] = []  # the results the last check compared (tests read them)

    # ---- state the ops share ----------------------------------------------------------------
    def set_rows(self, rows: torch.Tensor) -> None:
        r, w = rows.shape
        canary = self.table_canary * self.config.page_size  # a token whose page is v2p's red zone
        self.t_r2t = Guarded((r, w), torch.int32, self.device, ROW_GUARD * w, canary, 0)
        self.t_r2t.view.copy_(rows)
        self.o_r2t = rows
        self.rows_shape = (r, w)

    def call_target(self, i: int, op: Op, fn):
        try:
            return fn(self.tier.kernels)
        except Exception as exc:  # noqa: BLE001 - any exception of the target is a finding
            raise Divergence(i, op, "crash", type(exc).__name__, None, repr(exc),
                             f"the target raised {type(exc).__name__}: {exc}") from None

    # ---- the ops --------------------------------------------------------------------------------
    def step(self, op: Op) -> Outcome:
        i = self.step_no
        self.step_no += 1
        self.stats.ops += 1
        self.stats.by_kind[op.kind] = self.stats.by_kind.get(op.kind, 0) + 1
        if not isinstance(op, ScaleOp):
            raise OpError(f"{op.kind} is not a production-scale op")
        if not op.supported_by(self.tier):
            return Outcome(error=ContractViolation(f"{op.kind}: not in this kernel set"))
        err = op.invalid(self)
        if err is not None:
            self.stats.contract_ops += 1
            return Outcome(error=ContractViolation(err))
        return op.execute(self, i)

    def finish(self) -> None:
        self._since_state = self.check_every
        self.check(self.step_no, None, [], state=True)

    # ---- the oracles ----------------------------------------------------------------------------
    def check(self, i: int, op: Op | None, compares: list[Compare], *, state: bool = False) -> None:
        """Diff results, then red zones and raw state (when due, or forced by ``state``: the ops
        that write the tables force it); one host read when all agree."""
        self._since_state += 1
        state = state or self._since_state >= self.check_every
        self.last = compares
        flags: list[tuple[str, object, torch.Tensor]] = []
        for cmp in compares:
            got = cmp.actual
            if not isinstance(got, torch.Tensor) or got.shape != cmp.expected.shape or got.dtype != cmp.expected.dtype:
                desc = (f"{tuple(got.shape)} {got.dtype} on {got.device}" if isinstance(got, torch.Tensor)
                        else type(got).__name__)
                raise Divergence(i, op, "result", cmp.field, f"{tuple(cmp.expected.shape)} {cmp.expected.dtype}", desc,
                                 f"{op.kind if op else 'end'} returned {desc}")
            if got.device != cmp.expected.device:
                got = cmp.actual = got.to(cmp.expected.device)
            flags.append(("cmp", cmp, torch.ne(cmp.expected, got).any()))
            self.elements_checked += cmp.expected.numel()
        if state:
            self._since_state = 0
            flags.append(("zone", "raw_v2p", self.t_v2p.damaged()))
            flags.append(("zone", "raw_p2v", self.t_p2v.damaged()))
            if self.t_r2t is not None:
                flags.append(("zone", "req_to_token", self.t_r2t.damaged()))
            flags.append(("state", ("raw_v2p", self.o_v2p, self.t_v2p.view), torch.ne(self.o_v2p, self.t_v2p.view).any()))
            flags.append(("state", ("raw_p2v", self.o_p2v, self.t_p2v.view), torch.ne(self.o_p2v, self.t_p2v.view).any()))
            if self.t_r2t is not None:
                flags.append(("state", ("req_to_token", self.o_r2t, self.t_r2t.view),
                              torch.ne(self.o_r2t, self.t_r2t.view).any()))
        if not flags:
            return
        try:
            bad = torch.stack([f for _, _, f in flags]).tolist()  # the one host read
        except Exception as exc:  # noqa: BLE001 - an asynchronous device fault of the target surfaces here
            raise Divergence(i, op, "crash", type(exc).__name__, None, repr(exc),
                             f"the device faulted after {op.kind if op else 'the run'}: {exc}") from None
        for (what, item, _), b in zip(flags, bad):
            if not b:
                continue
            if what == "cmp":
                self._result_divergence(i, op, item)
            if what == "zone":
                raise Divergence(i, op, "memory", item, "canary", "overwritten", f"red zone around {item} was written")
            name, exp, got = item
            at, e, g = vo.first_mismatch(exp, got)
            raise Divergence(i, op, "state", name, e, g, f"{name}{list(at) if isinstance(at, tuple) else [at]} differs")

    def _result_divergence(self, i: int, op: Op | None, cmp: Compare) -> None:
        exp, got = cmp.expected, cmp.actual
        kind = op.kind if op else "end"
        if cmp.live is not None:
            live = cmp.live()
            zero = torch.zeros((), dtype=exp.dtype, device=exp.device)
            hit = vo.first_mismatch(torch.where(live, exp, zero), torch.where(live, got, zero))
            if hit is not None:
                at, e, g = hit
                where = cmp.where(at) if cmp.where else str(at)
                raise Divergence(i, op, "result", cmp.field, e, g, f"{kind}: {where} differs (live prefix)")
            at, e, g = vo.first_mismatch(exp, got)
            where = cmp.where(at) if cmp.where else str(at)
            raise Divergence(i, op, "memory", cmp.field, e, g, f"{kind}: {where} changed past the live prefix "
                             f"(poison {POISON:#x})")
        at, e, g = vo.first_mismatch(exp, got)
        raise Divergence(i, op, "result", cmp.field, e, g, f"{kind}: {cmp.field}[{at}] differs")


def replay(config: kvref.PoolConfig, ops, tier: Tier, *, beat=None, **kw) -> tuple[Divergence | None, ScaleRun]:
    """Run ``ops`` (records or their JSON) from fresh tables; the first divergence, or None.
    ``beat``: a supervisor's heartbeat, told each op's index before it runs."""
    run = ScaleRun(config, tier, **kw)
    ops = parse_ops(ops)
    try:
        for i, op in enumerate(ops):
            if beat is not None:
                beat.op(i)
            run.step(op)
        run.finish()
    except Divergence as d:
        return d, run
    return None, run


# ---- the generator -----------------------------------------------------------------------------------


def scale_config(rng: random.Random, constants: Constants, limits: ScaleLimits | None = None) -> kvref.PoolConfig:
    """One production geometry: page size, a pool size at a block boundary (or a power of two
    +-1), a multiplier that keeps every entry inside int32."""
    limits = limits or ScaleLimits()
    ps = rng.choice(limits.page_sizes)
    top = limits.pool_pages if ps == 1 else limits.pool_pages_paged
    bounds = Boundaries(constants, rng)
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
FEATURES = {"p_read_table_packed": "build_kv_read_table_packed", "p_translate": "translate_tokens",
            "g_read_table": None}


class ScaleGenerator:
    """Production-scale ops for one pool geometry, sizes drawn mostly at the kernel set's
    boundaries (``boundary.Boundaries``). It tracks which virtual pages are bound (as
    intervals of indices into one permutation of the pool), so every free names bound
    pages; ``shapes`` records, per op, the boundary each size was drawn at."""

    def __init__(self, rng: random.Random, config: kvref.PoolConfig, constants: Constants,
                 limits: ScaleLimits | None = None, *, features: set | None = None, mix: dict | None = None,
                 legacy: bool = False, big: float = 0.1):
        self.rng, self.config, self.constants = rng, config, constants
        self.big = big  # share of read tables at the limits' full size instead of a boundary
        self.limits = limits or ScaleLimits()
        self.bounds = Boundaries(constants, rng)
        self.features = features  # None: every optional function is there
        self.legacy = legacy
        mix = dict(DEFAULT_MIX if mix is None else mix)
        for kind, fn in FEATURES.items():
            if kind in mix and features is not None and fn is not None and fn not in features:
                del mix[kind]
        self.mix = mix
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

    def rows_op(self, width: int, rows: int | None = None) -> PRows:
        """New req_to_token rows at least ``width`` tokens wide; queued, so it is emitted next."""
        rng, lim = self.rng, self.limits
        extra = rng.choice((0, 0, 1, self.config.page_size, rng.randrange(64)))
        width = width + extra
        cap_rows = max(1, lim.max_r2t_elems // width)
        if rows is None:
            rows = max(1, min(cap_rows, rng.choice((1, 7, 64, 257, 512, 1024))))
        rows = max(1, min(rows, cap_rows))
        lo, span, a, b = self.sigma
        if self.bound and rng.random() < 0.7:  # a walk over bound pages: mostly live entries
            s, e = rng.choice(self.bound)
            src = (lo, span, a, b, s, e - s, rng.randrange(1, 1 << 20), rng.randrange(1 << 20))
        else:
            src = (0, self.config.table_rows, 1, 0, 0, self.config.table_rows, rng.randrange(1, 1 << 20),
                   rng.randrange(1 << 20))
        op = PRows(seed=rng.randrange(1 << 30), rows=rows, width=width, src=src, pad_every=rng.choice((0, 0, 13, 97)))
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

    def table_shape(self, cols_cap: int) -> tuple[int, int, str, str]:
        """(bs, columns, their tags) for a read table, inside the limits."""
        rng, lim = self.rng, self.limits
        if rng.random() < self.big:  # the full production size: a server's largest batch and rows
            bs = lim.max_bs - rng.choice((0, 0, 1))
            cols = max(1, min(cols_cap, lim.max_read_elems // bs) - rng.choice((0, 0, 1, 2)))
            if lim.max_programs is None or self.programs(bs, cols) <= lim.max_programs:
                return bs, cols, "cap", "cap"
        for _ in range(8):
            bs, bs_tag = self.bounds.bs(lim.max_bs) if rng.random() < 0.7 else self.bounds.size(1, lim.max_bs)
            bs = min(bs, lim.max_step_bs)
            cols, cols_tag = self.bounds.trip_pages(bs, cols_cap)
            if rng.random() < 0.3:
                cols, cols_tag = self.bounds.size(1, cols_cap)
            if bs * cols <= lim.max_read_elems and (lim.max_programs is None or self.programs(bs, cols) <= lim.max_programs):
                return bs, cols, bs_tag, cols_tag
        bs = rng.randint(1, 8)
        return bs, rng.randint(1, min(cols_cap, 64)), "fallback", "fallback"

    def long_pages(self, bs: int, cols: int) -> tuple[int, str]:
        rng = self.rng
        r = rng.random()
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
                        n_long=min(n_long, bs), legacy=legacy)
        return self._tag(op, bs=bs_tag, max_pages=mp_tag, long_pages=long_tag)

    def _p_read_table_packed(self) -> Op:
        rng, lim = self.rng, self.limits
        for _ in range(8):
            bs, bs_tag = self.bounds.bs(lim.max_bs)
            cols, cols_tag = self.bounds.trip_pages(bs, lim.max_row_tokens)
            if bs * cols <= 4 * lim.max_packed and (lim.max_programs is None or self.programs(bs, cols) <= lim.max_programs):
                break
        else:
            bs, cols, bs_tag, cols_tag = rng.randint(1, 8), rng.randint(1, 64), "fallback", "fallback"
        self._need_rows(cols)
        long_len, long_tag = (cols, "max") if rng.random() < 0.5 else self.bounds.size(0, cols)
        n_long = min(bs, rng.choice((1, 2, bs)))
        if bs * cols > lim.max_packed:  # most rows short: the total stays inside the budget
            n_long = max(1, min(n_long, lim.max_packed // max(1, cols) // 2))
        R = self.rows[0]
        op = PReadTablePacked(seed=rng.randrange(1 << 30), bs=bs, max_tokens=cols,
                              req=(rng.randrange(R + 1), rng.randrange(R), R), long_len=long_len, n_long=n_long,
                              gap=rng.choice((0, 0, 3)), has_start=rng.random() < 0.5)
        if op.elements() > 2 * lim.max_packed:
            op = dataclasses.replace(op, n_long=1, max_tokens=min(cols, max(1, lim.max_packed // bs)),
                                     long_len=min(long_len, max(1, lim.max_packed // bs)))
        return self._tag(op, bs=bs_tag, max_tokens=cols_tag, long_len=long_tag)

    def _g_read_table(self) -> Op:
        from .graph import draw_graph_op

        return draw_graph_op(self)


# ---- sequences and their minimization (what a campaign calls) -------------------------------------------


def kernel_features(tier: Tier) -> set:
    return {fn for fn in ("build_kv_read_table_packed", "translate_tokens", "build_kv_read_table_legacy")
            if tier.has(fn)}


def scale_info(tier: Tier, knobs: dict | None = None) -> dict:
    """What a production op stream depends on besides its seed, as JSON: the kernel set's
    constants (at ``knobs``), its optional functions and whether it runs on a GPU. A
    supervisor rebuilds a dead worker's ops from this and the seed (``regenerate``)."""
    apply_knobs(tier.kernels, knobs)
    return {"constants": kernel_constants(tier.kernels).to_json(), "features": sorted(kernel_features(tier)),
            "gpu": str(tier.device).startswith("cuda")}


def generator(seed: int, info: dict, *, limits: ScaleLimits | None = None, mix: dict | None = None,
              big: float | None = None) -> tuple[kvref.PoolConfig, ScaleGenerator]:
    """What a seed decides, given ``scale_info``: the geometry and the op stream.
    ``big``: the share of full-size read tables (default 0.1 on a GPU, 0.02 on the interpreter)."""
    gpu = info["gpu"]
    big = (0.1 if gpu else 0.02) if big is None else big
    c = info["constants"]
    constants = Constants(dict(c["blocks"]), dict(c["targets"]), c["source"])
    limits = limits or (ScaleLimits.production() if gpu else ScaleLimits.interpreter())
    rng = random.Random(seed * 1_000_003 + 11)
    config = scale_config(rng, constants, limits)
    features = set(info["features"])
    gen = ScaleGenerator(rng, config, constants, limits, features=features, mix=mix,
                         legacy="build_kv_read_table_legacy" in features, big=big)
    return config, gen


def regenerate(seed: int, n_ops: int, info: dict, **kw) -> tuple[kvref.PoolConfig, list[Op]]:
    """The first ``n_ops`` ops of ``seed``'s sequence (the stream depends on nothing the
    target does)."""
    config, gen = generator(seed, info, **kw)
    return config, [gen.next_op() for _ in range(n_ops)]


def sequence(tier: Tier, seed: int, *, limits: ScaleLimits | None = None, mix: dict | None = None,
             knobs: dict | None = None, big: float | None = None) -> tuple[kvref.PoolConfig, ScaleGenerator]:
    """What a seed decides on this tier (constants read at the given knobs)."""
    return generator(seed, scale_info(tier, knobs), limits=limits, mix=mix, big=big)


def run_sequence(tier: Tier, seed: int, n_ops: int, deadline: float | None = None, beat=None, *,
                 limits: ScaleLimits | None = None, mix: dict | None = None, check_every: int = 1,
                 knobs: dict | None = None, big: float | None = None):
    """Generate and diff one production-scale sequence: (config, ops, divergence or None, run).

    Mirrors ``campaign.run_sequence``; ``beat`` (a supervisor's heartbeat) is told each op's
    index before it runs. ``run.shapes`` holds the generator's summary for the case."""
    config, gen = sequence(tier, seed, limits=limits, mix=mix, knobs=knobs, big=big)
    run = ScaleRun(config, tier, check_every=check_every, knobs=knobs)
    run.shapes = gen.summary()
    ops: list[Op] = []
    try:
        for _ in range(n_ops):
            if deadline is not None and time.monotonic() >= deadline:
                break
            op = gen.next_op()
            ops.append(op)
            if beat is not None:
                beat.op(len(ops) - 1)
            run.step(op)
        run.finish()
    except Divergence as d:
        run.shapes = gen.summary()
        return config, ops, d, run
    run.shapes = gen.summary()
    return config, ops, None, run


def judge(tier: Tier, signature, knobs: dict | None = None):
    """A minimizer's judge: ``(config, ops) -> Divergence | None``, the divergence only when it
    has ``signature``."""

    def fails(config, ops):
        try:
            d, _ = replay(config, ops, tier, knobs=knobs)
        except OpError:
            return None
        return d if d is not None and d.signature == signature else None

    return fails


def minimize(config: kvref.PoolConfig, ops: list[Op], tier: Tier, divergence: Divergence,
             deadline: float | None = None, knobs: dict | None = None):
    """Shrink a failing production sequence with ``minimize.Minimizer``'s strategies (their
    replays through ``replay`` here). First tries the failing op with only the last setup and
    rows before it (what a read table depends on), which spares most of ddmin's replays.
    Returns (config, ops, divergence)."""
    from .minimize import Minimizer

    m = Minimizer(None, divergence.signature, deadline=deadline, judge=judge(tier, divergence.signature, knobs))
    ops = list(ops[: divergence.step + 1]) if divergence.op is not None else list(ops)
    last = len(ops) - 1
    keep = {last}
    for kind in ("p_setup", "p_rows"):
        idx = [j for j in range(last) if ops[j].kind == kind]
        if idx:
            keep.add(idx[-1])
    core = [ops[j] for j in sorted(keep)]
    if len(core) < len(ops) and m.fails(config, core):
        ops = core
    from .minimize import DropOps, ShrinkOps

    ops = DropOps(m).apply(config, ops)
    ops = ShrinkOps(m).apply(config, ops)
    ops = DropOps(m).apply(config, ops)
    d = m.fails(config, ops) or divergence
    return config, ops, d


from . import graph as _graph  # noqa: E402,F401 - registers the g_* op kinds with the op language
