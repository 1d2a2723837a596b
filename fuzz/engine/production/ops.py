"""Production-scale ops: SPEC §2 on raw tables at production sizes, one record per kernel.

Ops stay small in JSON because they are generative: parameters plus a seed, evaluated
on the target's device with the exact integer arithmetic of ``arith``. ``req_to_token``
rows are built from pages by the same arithmetic, with ``-1`` padding past each row's
fill and at seeded pages; ``seq_lens`` come from a seeded hash. Every op checks its
preconditions on the host (``invalid``) before the target sees it and answers
``ContractViolation`` otherwise, so a minimizer that drops the op a later one depends on
gets a rejection, not a false finding.

``execute`` runs the vectorized oracle and the target on the run's state
(``run.ScaleRun``: both sides' tables and rows) and hands both results to ``run.check``
(``compare.Compare``). ``prerequisite`` ops (``p_setup``, ``p_rows``) build harness
state without a kernel: the minimizer's ``keep-prerequisites`` pass keeps the last of
each before the failing op.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import kvref
from kvref import preconditions as pre

from .. import lazy
from .. import vector_oracle as vo
from ..ops import PACKED_SLACK, POISON, R2T_DTYPES, Ints, Op
from ..verdict import Outcome
from .arith import ModIds, affine_error, affine_ids, affine_list, cdiv, hash_tensor, out_cols, row_hashes, shrunk_ints
from .compare import Compare, packed_live, table_live
from .draws import _packed_layout_of, _req_tensor, _seq_lens, _seq_lens_of, device_ints, packed_layout
from .preflight import check_packed_call, check_table_call

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

BUILD_CHUNK = 1 << 22  # req_to_token elements built per pass (bounds the int64 temporaries)

@dataclass(frozen=True)
class ScaleOp(Op):
    """A production-scale kernel-level op: ``invalid`` (host-side preconditions, may read
    the run's host-known state) and ``execute`` (oracle, target, compare)."""

    track: ClassVar[str] = "production"
    needs: ClassVar[str] = ""  # an optional kernel-set function the op needs
    prerequisite: ClassVar[bool] = False  # harness state a later op reads (kept by the minimizer first)

    def supported_by(self, tier) -> bool:
        return not self.needs or tier.has(self.needs)

    def invalid(self, run) -> str | None:
        return None

    def preflight(self, ctx) -> None:
        """SPEC §2's preconditions of every kernel call this op makes, checked from its
        parameters (``ctx``: ``config`` and ``rows_shape``, the run's or a generator's
        twin) with ``kvref.preconditions``: host arithmetic, no device read. Raises the
        clause's ContractViolation (``gate``: a generated op that does is kvfuzz's bug)."""

    def execute(self, run, i: int) -> Outcome:
        raise NotImplementedError

    def elements(self) -> int:
        return 0

    def _shrink_fields(self, names: tuple[str, ...], floors: dict | None = None) -> Iterator[Op]:
        for name in names:
            v = getattr(self, name)
            for c in shrunk_ints(v, (floors or {}).get(name, 0)):
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
    prerequisite = True

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

    def preflight(self, ctx):
        pre.check_bind(rows=ctx.config.table_rows, v_pages=affine_list(self.v, self.n),
                       p_pages=affine_list(self.p, self.n))

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

    def preflight(self, ctx):
        pre.check_alloc_bind(rows=ctx.config.table_rows, v_pages=affine_list(self.v, self.n), start_phys=self.start)

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

    def preflight(self, ctx):
        """The ids' clauses (``free_unbind.bound`` needs the tables: ``invalid`` reads them)."""
        pre.ids("free_unbind", affine_list(self.v, self.n), ctx.config.table_rows, "v_pages",
                unique="free_unbind.v_unique")

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
    each row's fill (the full width, or for a quarter of the rows a seeded shorter one).
    ``dtype``: the tensor's, int32 (SGLang's ``req_to_token``) or int64 (SPEC §2: both)."""

    kind = "p_rows"
    prerequisite = True
    seed: int
    rows: int
    width: int
    src: Ints
    pad_every: int
    dtype: str = "int32"

    def invalid(self, run):
        if self.dtype not in R2T_DTYPES:
            return f"p_rows: dtype must be one of {R2T_DTYPES}, got {self.dtype!r}"
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
        return [w if h1 % 4 else h2 % (w + 1) for h1, h2 in zip(row_hashes(self.rows, self.seed + 1),
                                                                 row_hashes(self.rows, self.seed + 2))]

    def build(self, config: kvref.PoolConfig, device) -> torch.Tensor:
        ps, w = config.page_size, self.width
        ppr = cdiv(w, ps)
        lo, span, a, b, k0, m, c, d = self.src
        out = torch.empty((self.rows, w), dtype=getattr(torch, self.dtype), device=device)
        fills = device_ints(self.fills(), device)
        step = max(1, BUILD_CHUNK // max(1, ppr * ps))
        offs = torch.arange(ps, dtype=torch.int64, device=device)
        cols = torch.arange(w, dtype=torch.int64, device=device)
        for r0 in range(0, self.rows, step):
            r1 = min(self.rows, r0 + step)
            x = torch.arange(r0 * ppr, r1 * ppr, dtype=torch.int64, device=device)
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
        if self.dtype != "int32":
            yield dataclasses.replace(self, dtype="int32")


def _simpler_req(op) -> Iterator[Op]:
    """Batch row i reads req row i mod R, then every batch row reads row 0 (R = 1)."""
    a, b, rows = op.req
    if (a, b) != (1, 0):
        yield dataclasses.replace(op, req=(1, 0, rows))
    if rows > 1:
        yield dataclasses.replace(op, req=(1, 0, 1))


def _req_error(run, req: Ints) -> str | None:
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
    aligned: bool = False  # the out buffer's layout (arith.out_cols)

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

    def preflight(self, ctx):
        check_table_call(ctx, r2t_rows=ctx.rows_shape[0], width=ctx.rows_shape[1], req_idx=ModIds(self.req, self.bs),
                         seq_lens=self.seq_lens(ctx.config.page_size), max_pages=self.max_pages,
                         out_rows=self.bs, out_cols=self.max_pages)

    def elements(self):
        return self.bs * self.max_pages

    def inputs(self, run) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(seq_lens, the device tensors of req_pool_indices and seq_lens): the host's share of
        ``execute`` (``benchmarks/profile_host_ops.py`` times it)."""
        seq = self.seq_lens(run.config.page_size)
        return (seq, _req_tensor(self.req, self.bs, run.device),
                device_ints(seq, run.device))

    def live_cols(self, seq: list[int], ps: int) -> list[int]:
        """Each batch row's live columns (the comparison's mask: built only when results differ)."""
        return [min(cdiv(s, ps), self.max_pages) for s in seq]

    def execute(self, run, i):
        ps, dev = run.config.page_size, run.device
        seq, req_t, seq_t = self.inputs(run)
        o_buf, t_buf = (torch.full((self.bs + 2, out_cols(self.max_pages, self.aligned)), POISON, dtype=torch.int32,
                                   device=dev) for _ in range(2))
        vo.read_table(req_to_token=run.o_r2t, req_pool_indices=req_t, seq_lens=seq_t, v2p=run.o_v2p,
                      multiplier=run.config.multiplier, page_size=ps, max_pages=self.max_pages,
                      out=o_buf[1:1 + self.bs, :self.max_pages], clauses=run.clauses)
        fn = "build_kv_read_table_legacy" if self.legacy else "build_kv_read_table"
        run.call_target(i, self, lambda k: getattr(k, fn)(
            req_to_token=run.t_r2t.view, req_pool_indices=req_t.clone(), seq_lens=seq_t.clone(), v2p=run.t_v2p.view,
            multiplier=run.config.multiplier, page_size=ps, max_pages=self.max_pages,
            out=t_buf[1:1 + self.bs, :self.max_pages]))
        run.check(i, self, [Compare("out", o_buf, t_buf, live=lambda: table_live(o_buf.shape, self.live_cols(seq, ps), dev),
                                    where=lambda at: f"out[{at[0] - 1}][{at[1]}]")], deferrable=True)
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("bs",), {"bs": 1})
        yield from self._shrink_fields(("max_pages",), {"max_pages": 1})
        yield from self._shrink_fields(("n_long", "long_len"))
        if self.seed:
            yield dataclasses.replace(self, seed=0)
        yield from _simpler_req(self)
        if self.aligned:
            yield dataclasses.replace(self, aligned=False)


@dataclass(frozen=True)
class PReadTablePacked(ScaleOp):
    """read_table_packed into the buffer captured at ``max_tokens`` (SPEC §2: ``out`` holds
    ``max_tokens`` elements and ``indptr[bs] <= max_tokens``): seq_lens from ``_seq_lens``
    with cap ``row_cap`` (0: ``max_tokens``, as cases written before the field mean it),
    indptr = running sum of seq_lens (+ a seeded gap of up to ``gap`` per row), kv_start
    (when ``has_start``) a seeded start that keeps the row inside width."""

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
    row_cap: int = 0

    def row_tokens(self) -> int:
        return self.row_cap or self.max_tokens

    def invalid(self, run):
        err = _req_error(run, self.req)
        if err:
            return f"{self.kind}: {err}"
        w, cap = run.rows_shape[1], self.row_tokens()
        if self.bs < 1 or self.max_tokens < 1 or self.row_cap < 0 or not 1 <= cap <= w or self.gap < 0:
            return f"{self.kind}: bs {self.bs}, rows of up to {cap} tokens do not fit width {w}"
        if not 0 <= self.long_len <= cap or not 0 <= self.n_long <= self.bs:
            return f"{self.kind}: long_len {self.long_len} / n_long {self.n_long} out of range"
        end = self.end()
        if end > self.max_tokens:
            return f"{self.kind}: indptr[bs] = {end} > max_tokens = {self.max_tokens} (SPEC §2)"
        return None

    def layout(self, width: int):
        return packed_layout(self.seed, self.bs, self.row_tokens(), self.long_len, self.n_long, self.gap,
                             self.has_start, width)

    def end(self) -> int:
        """indptr[bs]: the tokens the layout packs, gaps included."""
        return _packed_layout_of(self.seed, self.bs, self.row_tokens(), self.long_len, self.n_long, self.gap, False,
                                 1)[1][-1]

    def elements(self):
        return sum(_seq_lens_of(self.seed, self.bs, self.row_tokens(), self.long_len, self.n_long))

    def preflight(self, ctx):
        seq, indptr, starts = self.layout(ctx.rows_shape[1])
        check_packed_call(ctx, r2t_rows=ctx.rows_shape[0], width=ctx.rows_shape[1], req_idx=ModIds(self.req, self.bs),
                          seq_lens=seq, indptr=indptr, kv_start=starts, max_tokens=self.max_tokens,
                          out_len=self.max_tokens)

    def inputs(self, run) -> tuple[list[int], list[int], dict]:
        """(seq_lens, indptr, their device tensors by name: req, seq, indptr, start)."""
        seq, indptr, starts = self.layout(run.rows_shape[1])
        ints = {name: device_ints(x, run.device) for name, x in
                (("seq", seq), ("indptr", indptr), ("start", starts)) if x is not None}
        ints["req"] = _req_tensor(self.req, self.bs, run.device)
        return seq, indptr, ints

    def execute(self, run, i):
        dev = run.device
        seq, indptr, ints = self.inputs(run)
        cap = self.max_tokens
        o_buf, t_buf = (torch.full((cap + 2 * PACKED_SLACK,), POISON, dtype=torch.int32, device=dev)
                        for _ in range(2))
        common = dict(multiplier=run.config.multiplier, page_size=run.config.page_size, max_tokens=cap)
        vo.read_table_packed(req_to_token=run.o_r2t, req_pool_indices=ints["req"], seq_lens=ints["seq"],
                             v2p=run.o_v2p, indptr=ints["indptr"], out=o_buf[PACKED_SLACK:PACKED_SLACK + cap],
                             kv_start_idx=ints.get("start"), clauses=run.clauses, **common)
        start_t = ints["start"].clone() if "start" in ints else None
        run.call_target(i, self, lambda k: k.build_kv_read_table_packed(
            req_to_token=run.t_r2t.view, req_pool_indices=ints["req"].clone(), seq_lens=ints["seq"].clone(),
            v2p=run.t_v2p.view, indptr=ints["indptr"].clone(), out=t_buf[PACKED_SLACK:PACKED_SLACK + cap],
            kv_start_idx=start_t, **common))
        run.check(i, self, [Compare("out", o_buf, t_buf,
                                    live=lambda: packed_live(o_buf.numel(), list(zip(indptr[:-1], seq)), dev),
                                    where=lambda at: f"out[{at - PACKED_SLACK}]")], deferrable=True)
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("bs",), {"bs": 1})
        end = max(1, self.end())
        if self.max_tokens > end:
            yield dataclasses.replace(self, max_tokens=end)
        yield from self._shrink_fields(("max_tokens",), {"max_tokens": 1})
        if self.row_cap:
            yield from self._shrink_fields(("row_cap",), {"row_cap": 1})
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
        i = torch.arange(self.n, dtype=torch.int64, device=device)
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
        run.check(i, self, [Compare("slots", expected, got)])  # not deferrable: the target owns `got`
        if self.bad_every and run.hostile != "off":  # SPEC §2 translate of any id: valid input, judged above
            run.stats.hostile["translate"] = run.stats.hostile.get("translate", 0) + 1
        return Outcome(None)

    def shrink(self):
        yield from self._shrink_fields(("n",))
        if self.bad_every:
            yield dataclasses.replace(self, bad_every=0)
        if self.seed:
            yield dataclasses.replace(self, seed=0)
