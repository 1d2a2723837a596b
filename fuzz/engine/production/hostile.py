"""Production-scale hostile probes: SPEC §2's memory-safety promises, at production sizes.

SPEC promises memory safety whatever the input for: ``free_unbind`` (double frees, ids
past the table: "a kernel must never write outside the tables"), a read table whose
seq_lens outgrow ``max_pages`` (no column at or past ``max_pages``), the packed read
table when seq_lens and indptr disagree (nothing at or past ``max_tokens``), and
translate of any id (valid input: the padding sink, judged by ``p_translate`` itself).
The first three get an op each here. Each runs only the target's kernel, on guarded
copies of the tables (``memory.Guarded``, red zones wide enough for every id the op
names, canaries that read as ids land in a red zone again), and judges memory safety
alone: the red zones, and poison past the promised bound. Never values or state: the
spec refuses these inputs, so there is nothing to compare them with. The run's own
tables, rows and red zones are checked after each probe, so a probe that wrote them is
reported at the probe, not at a later op.

A kernel set may refuse hostile input (an exception that is not a device fault): that
is a clean probe. The generator draws these ops only when the run's hostile mode is not
``off`` (``ScaleRun`` refuses them under ``off``); each counts in ``run.stats.hostile``
under the small track's class names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar

from .. import lazy
from ..memory import Guarded, index_canary
from ..ops import PACKED_SLACK, POISON, Ints
from ..verdict import Divergence, Outcome, crash, is_cuda_error
from .arith import cdiv, hash_tensor, out_cols
from .draws import _req_idx, _seq_lens, device_ints
from .ops import PReadTable, PReadTablePacked, ScaleOp

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

FAR_MAX = 256  # rows past either end of the tables a p_free_unbind_any id may name


@dataclass(frozen=True)
class HostileOp(ScaleOp):
    """A probe: ``probe(run, i)`` runs the kernel and returns the flags to judge (``Flag``)."""

    probe_class: ClassVar[str] = ""

    def execute(self, run, i):
        run.stats.hostile[self.probe_class] = run.stats.hostile.get(self.probe_class, 0) + 1
        try:
            flags = self.probe(run, i)
            bad = torch.stack([f.hit for f in flags]).tolist()  # the one host read
        except Exception as exc:  # noqa: BLE001 - a kernel set may refuse hostile input; a device fault is a finding
            if is_cuda_error(exc):
                raise crash(i, self, exc, f"an unchecked {self.probe_class} probe faulted: {exc}") from None
            note = f"{self.kind}: the kernel set refused hostile input ({type(exc).__name__}); not probed"
            if note not in run.notes:
                run.notes.append(note)
            flags, bad = [], []
        for flag, b in zip(flags, bad):
            if b:
                expected, got, message = flag.detail()
                d = Divergence(i, self, "memory", flag.name, expected, got, f"{self.kind}: {message}")
                d.refusal = self.refusal()
                raise d
        run.check(i, self, [], state=True)  # the run's own tables, rows and red zones
        return Outcome(None)

    def probe(self, run, i) -> list[Flag]:
        raise NotImplementedError

    def refusal(self) -> str:
        """What the spec would refuse (a case records it like the small track's refusals)."""
        return f"{self.kind}: hostile input of class {self.probe_class} (SPEC §2 promises memory safety only)"


@dataclass
class Flag:
    """One memory oracle of a probe: ``hit`` (0-dim bool on the device) and, when it hit,
    ``detail()`` -> (expected, got, message), read back only then."""

    name: str
    hit: torch.Tensor
    detail: Callable[[], tuple]


def table_copies(run, reach: int = 0) -> tuple[Guarded, Guarded]:
    """Guarded copies of the target's v2p and p2v whose red zones reach ``reach`` rows past either end."""
    rows = run.config.table_rows
    guard = max(run.t_v2p.zone, reach + 1)
    copies = []
    for t in (run.t_v2p, run.t_p2v):
        g = Guarded((rows,), torch.int64, run.device, guard, index_canary(rows, guard))
        g.view.copy_(t.view)
        copies.append(g)
    return copies[0], copies[1]


def zone_flags(named: list[tuple[str, Guarded]]) -> list[Flag]:
    return [Flag(name, g.damaged(), lambda name=name: ("canary", "overwritten", f"red zone around {name} was written"))
            for name, g in named]


def poison_flag(buf: torch.Tensor, allowed: torch.Tensor, where: Callable[[int], str], bound: str) -> Flag:
    """Poison outside ``allowed`` changed: the first such element of ``buf`` (flat) named by ``where``."""
    wrote = buf.ne(POISON) & ~allowed

    def detail():
        at = int(wrote.nonzero()[0, 0])
        return POISON, int(buf[at]), f"wrote {where(at)}, {bound}"

    return Flag("out", wrote.any(), detail)


@dataclass(frozen=True)
class PFreeUnbindAny(HostileOp):
    """free_unbind of any input: ``n`` ids ``lo + (a * (i0 + i) + b) mod span`` (v = (lo, span,
    a, b, i0); any ``a``, so ids may repeat), each whose hash is 0 mod ``bad_every`` (when > 0)
    moved up to ``far`` rows past the table or before it (negative). Unbound ids are double
    frees. Judged: the red zones of both tables and of the ids."""

    kind = "p_free_unbind_any"
    probe_class = "free_unbind"
    seed: int
    n: int
    v: Ints
    bad_every: int
    far: int

    def invalid(self, run):
        if len(self.v) != 5 or self.n < 0 or self.bad_every < 0 or not 1 <= self.far <= FAR_MAX:
            return f"{self.kind}: v is (lo, span, a, b, i0), n >= 0, far in [1, {FAR_MAX}]"
        lo, span, a, b, i0 = self.v
        if lo < 0 or span < 1 or lo + span > run.config.table_rows or min(a, b, i0) < 0:
            return f"{self.kind}: v {self.v} leaves the table"
        return None

    def ids(self, rows: int, device) -> torch.Tensor:
        lo, span, a, b, i0 = self.v
        i = torch.arange(i0, i0 + self.n, dtype=torch.int64, device=device)
        v = i.mul(a).add_(b).remainder_(span).add_(lo)
        if self.bad_every > 0:
            h = hash_tensor(i, self.seed)
            k = h.remainder(self.far)
            out = torch.where(h.remainder(2) == 0, rows + k, -1 - k)
            v = torch.where(h.remainder(self.bad_every) == 0, out, v)
        return v

    def elements(self):
        return self.n

    def probe(self, run, i):
        rows = run.config.table_rows
        v2p, p2v = table_copies(run, self.far)
        ids = Guarded((self.n,), torch.int64, run.device, v2p.zone, v2p.canary)
        ids.view.copy_(self.ids(rows, run.device))
        run.tier.kernels.free_unbind_inplace(ids.view, v2p.view, p2v.view)
        return zone_flags([("raw_v2p", v2p), ("raw_p2v", p2v), ("v", ids)])

    def shrink(self):
        yield from self._shrink_fields(("n",))
        yield from self._shrink_fields(("far",), {"far": 1})


@dataclass(frozen=True)
class PReadTableOverflow(HostileOp):
    """read_table whose ``n_long`` long rows hold ``max_pages * ps + over`` tokens (the rest as
    in ``p_read_table``). Judged: nothing written at or past ``max_pages``, outside the batch
    rows, or into a red zone."""

    kind = "p_read_table_overflow"
    probe_class = "read_table_seq_lens"
    seed: int
    bs: int
    max_pages: int
    req: Ints
    n_long: int
    over: int
    legacy: bool = False
    aligned: bool = False  # the out buffer's layout (arith.out_cols)

    def valid_twin(self) -> PReadTable:
        return PReadTable(self.seed, self.bs, self.max_pages, self.req, 0, self.n_long, self.legacy)

    def supported_by(self, tier):
        return self.valid_twin().supported_by(tier)

    def invalid(self, run):
        err = self.valid_twin().invalid(run)
        ps = run.config.page_size
        # A kernel that trusts seq_lens reads columns up to the last long row's: inside req_to_token's red zone.
        if err is None and (self.over < 1 or (self.max_pages - 1 + cdiv(self.over, ps)) * ps >= 2 * run.rows_shape[1]):
            err = f"{self.kind}: over {self.over} reads past width {run.rows_shape[1]} and its red zone"
        return err

    def seq_lens(self, ps: int) -> list[int]:
        cap = self.max_pages * ps
        return _seq_lens(self.seed, self.bs, cap, cap + self.over, self.n_long)

    def elements(self):
        return self.bs * self.max_pages

    def probe(self, run, i):
        ps, dev, mp, bs = run.config.page_size, run.device, self.max_pages, self.bs
        v2p, p2v = table_copies(run)
        cols = out_cols(mp, self.aligned)
        body = (bs + 2) * cols
        buf = torch.full((body + cdiv(self.over, ps) + PACKED_SLACK,), POISON, dtype=torch.int32, device=dev)
        out = buf[:body].view(bs + 2, cols)
        fn = "build_kv_read_table_legacy" if self.legacy else "build_kv_read_table"
        getattr(run.tier.kernels, fn)(
            req_to_token=run.t_r2t.view, req_pool_indices=device_ints(_req_idx(self.req, bs), dev),
            seq_lens=device_ints(self.seq_lens(ps), dev), v2p=v2p.view,
            multiplier=run.config.multiplier, page_size=ps, max_pages=mp, out=out[1:1 + bs, :mp])
        allowed = torch.zeros_like(buf, dtype=torch.bool)
        allowed[:body].view(bs + 2, cols)[1:1 + bs, :mp] = True

        def where(at: int) -> str:
            return f"out[{at // cols - 1}][{at % cols}]" if at < body else f"{at - body + 1} elements past out's last row"

        return [poison_flag(buf, allowed, where, f"at or past max_pages={mp} or outside the batch of {bs}"),
                *zone_flags([("raw_v2p", v2p), ("raw_p2v", p2v)])]

    def shrink(self):
        yield from self._shrink_fields(("bs",), {"bs": 1})
        yield from self._shrink_fields(("max_pages",), {"max_pages": 1})
        yield from self._shrink_fields(("n_long",), {"n_long": 1})
        yield from self._shrink_fields(("over",), {"over": 1})
        if self.aligned:
            yield dataclasses.replace(self, aligned=False)


@dataclass(frozen=True)
class PReadTablePackedDisagree(HostileOp):
    """read_table_packed (the ``p_read_table_packed`` layout of the same fields) whose last
    ``n_over`` rows say ``over`` tokens more than their indptr span. Judged: nothing written
    before ``out`` or at or past ``max_tokens``, nor into a red zone."""

    kind = "p_read_table_packed_disagree"
    needs = "build_kv_read_table_packed"
    probe_class = "read_table_packed_seq_lens"
    seed: int
    bs: int
    max_tokens: int
    req: Ints
    long_len: int
    n_long: int
    gap: int
    has_start: bool
    row_cap: int
    over: int
    n_over: int

    def valid_twin(self) -> PReadTablePacked:
        return PReadTablePacked(self.seed, self.bs, self.max_tokens, self.req, self.long_len, self.n_long, self.gap,
                                self.has_start, self.row_cap)

    def invalid(self, run):
        err = self.valid_twin().invalid(run)
        # A kernel that trusts seq_lens reads up to gap + over positions past a row: inside req_to_token's red zone.
        if err is None and (self.over < 1 or self.gap + self.over > run.rows_shape[1] or not 1 <= self.n_over <= self.bs):
            err = f"{self.kind}: over {self.over} / n_over {self.n_over} out of range"
        return err

    def elements(self):
        return self.valid_twin().elements() + self.over * self.n_over

    def probe(self, run, i):
        dev, cap = run.device, self.max_tokens
        seq, indptr, ints = self.valid_twin().inputs(run)
        lens = [indptr[b + 1] - indptr[b] + (self.over if b >= self.bs - self.n_over else 0) for b in range(self.bs)]
        v2p, p2v = table_copies(run)
        buf = torch.full((cap + self.over + 2 * PACKED_SLACK,), POISON, dtype=torch.int32, device=dev)
        run.tier.kernels.build_kv_read_table_packed(
            req_to_token=run.t_r2t.view, req_pool_indices=ints["req"], seq_lens=device_ints(lens, dev),
            v2p=v2p.view, indptr=ints["indptr"], multiplier=run.config.multiplier, page_size=run.config.page_size,
            max_tokens=cap, out=buf[PACKED_SLACK:PACKED_SLACK + cap], kv_start_idx=ints.get("start"))
        allowed = torch.zeros_like(buf, dtype=torch.bool)
        allowed[PACKED_SLACK:PACKED_SLACK + cap] = True
        return [poison_flag(buf, allowed, lambda at: f"out[{at - PACKED_SLACK}]",
                            f"before out or at or past max_tokens={cap} (indptr[bs]={indptr[-1]})"),
                *zone_flags([("raw_v2p", v2p), ("raw_p2v", p2v)])]

    def shrink(self):
        yield from self._shrink_fields(("bs",), {"bs": 1})
        yield from self._shrink_fields(("n_over",), {"n_over": 1})
        yield from self._shrink_fields(("over",), {"over": 1})
        yield from self._shrink_fields(("n_long", "long_len", "gap"))


HOSTILE_KINDS = (PFreeUnbindAny.kind, PReadTableOverflow.kind, PReadTablePackedDisagree.kind)
__all__ = ["HOSTILE_KINDS", "HostileOp", "PFreeUnbindAny", "PReadTableOverflow", "PReadTablePackedDisagree"]
