"""The small track's ops: the allocator state machine and kernel-level ops on raw tables.

An op carries literal ids, so a case file reads on its own and replays identically;
deleting an earlier op during minimization turns later ops into contract violations,
which changes the failure's signature and is rejected.

Each record knows, in one place:
- its fields and their types (the annotations; checked on construction, so a
  generator bug or a hand-edited case fails at the op that is wrong);
- its JSON form (``{"op": KIND, field: value, ...}`` in declaration order, the form of
  every case file written so far);
- how it runs on the spec (``kvref``) and on the target, and which of its results the
  runner diffs;
- how it shrinks (``shrink()``: smaller candidates, the most promising first).

Two families: ``PoolOp`` (one allocator: the state machine of SPEC §3 and the read
tables over its v2p) and ``KernelOp`` (kernel-level ops on a second pair of raw tables
of the pool's size, straight through the kernel set, no allocator: defined in
``raw_ops``, re-exported here). A new op is one class here (or there) plus its builder
in ``shapes`` and its tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

import kvref

from .oplang import OUT_SLACK_COLS, OUT_SLACK_ROWS, PACKED_SLACK, POISON, Ints, Op, OpError, Rows

__all__ = ["OUT_SLACK_COLS", "OUT_SLACK_ROWS", "PACKED_SLACK", "POISON", "R2T_DTYPES", "Ints", "KAllocBind", "KBind",
           "KFreeUnbind", "KernelOp", "Op", "OpError", "Rows"]


class PoolOp(Op):
    """An op on one allocator. ``spec`` runs it on ``kvref.Allocator`` (raising
    ContractViolation when the spec refuses it); ``target`` runs it on the target side
    (``runner.TargetSide``: the DeviceAllocator, its kernels, guarded inputs); both
    return plain values.

    When the spec refuses an op, ``hostile_class`` names the class of hostile input SPEC
    promises memory safety for that it falls in (None: no promise), and ``probe`` runs
    only the kernels the op would call, unchecked, on guarded copies of the tables."""

    result_field: ClassVar[str] = "result"
    full_check: ClassVar[bool] = False  # a full state comparison after this op, always
    checked_refusal: ClassVar[bool] = True  # a checked target must refuse what the spec refuses
    calls_kernels: ClassVar[bool] = False  # whether ``probe`` has kernels to run

    def spec(self, s: kvref.Allocator):
        raise NotImplementedError

    def target(self, t):
        raise NotImplementedError

    def hostile_class(self, s: kvref.Allocator, tier) -> str | None:
        return None

    def probe(self, t):
        """The op's kernels on ``t`` (a probe side); None when the op calls no kernel."""
        return None


def _translated(tier) -> str | None:
    """Data ops reach memory through translate (an invalid token goes to the padding
    sink): the SPEC §2 translate promise, when the kernel set has its own translate."""
    return "translate" if tier.has("translate_tokens") else None


def _translate_probe(t, tokens):
    return t.kernels.translate_tokens(loc=t.tokens("loc", tokens), v2p=t.v2p, page_size=t.config.page_size).tolist()


def _halves(seq: tuple) -> Iterator[tuple]:
    if len(seq) > 1:
        yield seq[: len(seq) // 2]
        yield seq[len(seq) // 2:]
        yield seq[:1]


# ---- pool ops --------------------------------------------------------------------------


@dataclass(frozen=True)
class Alloc(PoolOp):
    kind = "alloc"
    n: int

    def spec(self, s):
        return s.alloc(self.n)

    def target(self, t):
        r = t.alloc.alloc(self.n)
        return None if r is None else r.tolist()

    def shrink(self):
        if self.n > 0:
            yield Alloc(self.n // 2)

    def merge(self, following):
        # Both take pages from the front of the free list and the frontier, in order.
        if isinstance(following, Alloc) and self.n > 0 and following.n > 0:
            return Alloc(self.n + following.n)
        return None


@dataclass(frozen=True)
class _TokenOp(PoolOp):
    tokens: Ints

    def token_ids(self):
        return iter(self.tokens)

    def shrink(self):
        for keep in _halves(self.tokens):
            yield dataclasses.replace(self, tokens=keep)


@dataclass(frozen=True)
class Free(_TokenOp):
    kind = "free"
    calls_kernels = True

    def spec(self, s):
        return s.free(list(self.tokens))

    def target(self, t):
        return t.alloc.free(t.tokens("tokens", self.tokens))

    def hostile_class(self, s, tier):
        return "free_unbind"  # SPEC §2: never write outside the tables, whatever the input

    def probe(self, t):
        ps = t.config.page_size
        pages = list(self.tokens) if ps == 1 else [x // ps for x in self.tokens[::ps]]
        return t.kernels.free_unbind_inplace(t.pages("v", pages), t.v2p, t.p2v).tolist()


@dataclass(frozen=True)
class Flush(PoolOp):
    kind = "flush"
    full_check = True
    urgent: bool

    def spec(self, s):
        return s.flush(self.urgent)

    def target(self, t):
        return t.alloc.flush(self.urgent)

    def shrink(self):
        if self.urgent:
            yield Flush(False)


@dataclass(frozen=True)
class Forward(_TokenOp):
    kind = "forward"

    def spec(self, s):
        return s.forward(list(self.tokens))

    def target(self, t):
        return t.alloc.forward(t.tokens("tokens", self.tokens))


@dataclass(frozen=True)
class Fire(PoolOp):
    kind = "fire"

    def spec(self, s):
        return s.fire()

    def target(self, t):
        return t.alloc.fire()


@dataclass(frozen=True)
class Write(PoolOp):
    kind = "write"
    calls_kernels = True
    tokens: Ints
    stamps: Ints

    def token_ids(self):
        return iter(self.tokens)

    def spec(self, s):
        return s.write(list(self.tokens), list(self.stamps))

    def target(self, t):
        return t.alloc.write(t.tokens("tokens", self.tokens), t.data("stamps", self.stamps))

    def hostile_class(self, s, tier):
        return _translated(tier)

    def probe(self, t):
        return _translate_probe(t, self.tokens)

    def shrink(self):
        n = len(self.tokens)
        if n > 1:
            half = n // 2
            yield Write(self.tokens[:half], self.stamps[:half])
            yield Write(self.tokens[half:], self.stamps[half:])
            yield Write(self.tokens[:1], self.stamps[:1])
        plain = tuple(range(1, len(self.stamps) + 1))
        if self.stamps != plain:
            yield Write(self.tokens, plain)


@dataclass(frozen=True)
class Read(_TokenOp):
    kind = "read"
    calls_kernels = True
    pure = True

    def spec(self, s):
        return s.read(list(self.tokens))

    def target(self, t):
        return t.alloc.read(t.tokens("tokens", self.tokens)).tolist()

    def hostile_class(self, s, tier):
        return _translated(tier)

    def probe(self, t):
        return _translate_probe(t, self.tokens)


@dataclass(frozen=True)
class Translate(PoolOp):
    kind = "translate"
    checked_refusal = False  # translate has no checked mode: bad ids go to the padding sink
    pure = True
    loc: Ints

    def token_ids(self):
        return iter(self.loc)

    def spec(self, s):
        return s.translate(list(self.loc))

    def target(self, t):
        return t.alloc.translate(t.tokens("loc", self.loc)).tolist()

    def shrink(self):
        for keep in _halves(self.loc):
            yield Translate(keep)


@dataclass(frozen=True)
class Clear(PoolOp):
    kind = "clear"
    full_check = True

    def spec(self, s):
        return s.clear()

    def target(self, t):
        return t.alloc.clear()


# ---- read tables -----------------------------------------------------------------------


R2T_DTYPES = ("int64", "int32")  # SPEC §2: a server keeps req_to_token in either (SGLang: int32)


@dataclass(frozen=True)
class _TableOp(PoolOp):
    """Shared by both read-table forms: ``rows`` are the req_to_token rows (the given
    tokens, then -1 up to ``width``), built on the target as ``r2t_dtype`` (each form's
    last field, default int64: the spec side reads plain ints whatever the dtype)."""

    result_field = "out"
    calls_kernels = True
    pure = True

    def __post_init__(self):
        super().__post_init__()
        if self.r2t_dtype not in R2T_DTYPES:
            raise OpError(f"{self.kind} op: r2t_dtype must be one of {R2T_DTYPES}, got {self.r2t_dtype!r}")
        if self.r2t_dtype == "int32" and any(not -(2**31) <= t < 2**31 for r in self.rows for t in r):
            raise OpError(f"{self.kind} op: a token of rows does not fit r2t_dtype int32")

    def req_to_token(self) -> list[list[int]]:
        w = self.width
        return [list(r[:w]) + [-1] * (w - len(r[:w])) for r in self.rows]

    def token_ids(self):
        return (t for r in self.rows for t in r)

    def _renumbered_rows(self) -> Iterator[_TableOp]:
        """Only the rows the batch reads, then each row cut to half its length."""
        used = sorted(set(self.req_idx))
        if len(used) < len(self.rows) and all(0 <= r < len(self.rows) for r in used):
            renumber = {r: i for i, r in enumerate(used)}
            yield dataclasses.replace(self, rows=tuple(self.rows[r] for r in used),
                                      req_idx=tuple(renumber[r] for r in self.req_idx))

    def _shorter_rows(self) -> Iterator[_TableOp]:
        shorter = tuple(r[: max(1, len(r) // 2)] for r in self.rows)
        if shorter != self.rows:
            yield dataclasses.replace(self, rows=shorter)
        if self.r2t_dtype != R2T_DTYPES[0]:  # and the default req_to_token dtype
            yield dataclasses.replace(self, r2t_dtype=R2T_DTYPES[0])


@dataclass(frozen=True)
class ReadTable(_TableOp):
    kind = "read_table"
    rows: Rows
    req_idx: Ints
    seq_lens: Ints
    max_pages: int
    width: int
    legacy: bool
    r2t_dtype: str = "int64"

    @property
    def bs(self) -> int:
        return len(self.req_idx)

    def poisoned_out(self) -> list[list[int]]:
        """The output buffer, as the spec sees it: poison everywhere, with slack rows and
        columns so a write past the batch or past max_pages lands somewhere visible."""
        return [[POISON] * (self.max_pages + OUT_SLACK_COLS) for _ in range(self.bs + OUT_SLACK_ROWS)]

    def supported_by(self, tier) -> bool:
        return not self.legacy or tier.has("build_kv_read_table_legacy")

    def spec(self, s):
        out = self.poisoned_out()
        s.read_table(req_to_token=self.req_to_token(), req_pool_indices=list(self.req_idx),
                     seq_lens=list(self.seq_lens), max_pages=self.max_pages, out=out)
        return out

    def target(self, t):
        out = t.poisoned(self.poisoned_out())
        view = out[:, : self.max_pages] if self.bs else out[:0, : self.max_pages]
        t.alloc.build_read_table(legacy=self.legacy, max_pages=self.max_pages, out=view, **t.batch(self))
        return out.tolist()

    def hostile_class(self, s, tier):
        """SPEC §2: even when a seq_lens entry needs more than max_pages columns, nothing is
        written at or past max_pages. Only that break is promised: the op with its
        seq_lens cut to max_pages must be one the spec accepts."""
        cap = self.max_pages * s.config.page_size
        repaired = dataclasses.replace(self, seq_lens=tuple(min(n, cap) for n in self.seq_lens))
        try:
            repaired.spec(s)
        except kvref.ContractViolation:
            return None
        return "read_table_seq_lens"

    def probe(self, t):
        out = t.poisoned(self.poisoned_out())
        view = out[:, : self.max_pages] if self.bs else out[:0, : self.max_pages]
        fn = t.kernels.build_kv_read_table_legacy if self.legacy else t.kernels.build_kv_read_table
        fn(v2p=t.v2p, multiplier=t.config.multiplier, page_size=t.config.page_size, max_pages=self.max_pages,
           out=view, **t.batch(self))
        return out.tolist()

    def outside_writes(self, out: list[list[int]]) -> tuple[str, int] | None:
        """The first element written past ``max_pages`` or past the batch, if any."""
        for b, row in enumerate(out):
            for c, x in enumerate(row):
                if x != POISON and (b >= self.bs or c >= self.max_pages):
                    return f"out[{b}][{c}] past max_pages={self.max_pages} or bs={self.bs}", x
        return None

    def shrink(self):
        n = self.bs
        if n > 1:
            keeps = [(b,) for b in range(n)] + [tuple(range(0, n // 2)), tuple(range(n // 2, n))]
            keeps += [tuple(j for j in range(n) if j != b) for b in range(n)]
            for keep in keeps:
                yield dataclasses.replace(self, req_idx=tuple(self.req_idx[j] for j in keep),
                                          seq_lens=tuple(self.seq_lens[j] for j in keep))
        yield from self._renumbered_rows()
        if self.max_pages > 1:
            yield dataclasses.replace(self, max_pages=self.max_pages - 1)
        yield from self._shorter_rows()
        if self.max_pages < self.width:  # enough at page size 1; rejected where it is not
            yield dataclasses.replace(self, width=self.max_pages)


@dataclass(frozen=True)
class ReadTablePacked(_TableOp):
    kind = "read_table_packed"
    rows: Rows
    req_idx: Ints
    seq_lens: Ints
    kv_start: Ints | None
    indptr: Ints
    max_tokens: int
    width: int
    r2t_dtype: str = "int64"

    def capacity(self) -> int:
        """The elements of the ``out`` the kernel gets: ``max_tokens`` (SPEC §2: every caller
        passes the buffer captured at max_tokens), or ``indptr[-1]`` for a case written before
        that rule whose indptr ends past it."""
        return max(self.max_tokens, self.indptr[-1] if self.indptr else 0, 0)

    def poisoned_out(self) -> list[int]:
        """The output buffer: poison everywhere, ``PACKED_SLACK`` elements past the
        kernel's ``capacity()`` so a write past it lands somewhere visible."""
        return [POISON] * (self.capacity() + PACKED_SLACK)

    def supported_by(self, tier) -> bool:
        return tier.has("build_kv_read_table_packed")

    def spec(self, s):
        out = [POISON] * self.capacity()  # the spec sees the buffer the kernel sees
        s.read_table_packed(req_to_token=self.req_to_token(), req_pool_indices=list(self.req_idx),
                            seq_lens=list(self.seq_lens), indptr=list(self.indptr), max_tokens=self.max_tokens,
                            out=out, kv_start_idx=None if self.kv_start is None else list(self.kv_start))
        return out + [POISON] * PACKED_SLACK

    def _packed_args(self, t) -> dict:
        kv_start = None if self.kv_start is None else t.positions("kv_start", self.kv_start, self.width)
        return dict(indptr=t.offsets("indptr", self.indptr, len(self.poisoned_out())), max_tokens=self.max_tokens,
                    kv_start_idx=kv_start, **t.batch(self))

    def target(self, t):
        out = t.poisoned(self.poisoned_out())
        t.alloc.build_read_table_packed(out=out[: self.capacity()], **self._packed_args(t))
        return out.tolist()

    def hostile_class(self, s, tier):
        """SPEC §2: even when seq_lens and indptr disagree, nothing is written at or past
        max_tokens. Only that break is promised: indptr ascending from 0 or more to
        ``indptr[bs] <= max_tokens``, and the op with each seq_lens entry set to its row's
        indptr span (SPEC §2: ``indptr_consistent``) must be one the spec accepts."""
        bs, ptr = len(self.req_idx), self.indptr
        if len(ptr) != bs + 1 or len(self.seq_lens) != bs or ptr[0] < 0 or ptr[-1] > self.max_tokens:
            return None
        if any(ptr[b] > ptr[b + 1] for b in range(bs)):
            return None
        spans = [self.indptr[b + 1] - self.indptr[b] for b in range(bs)]
        repaired = dataclasses.replace(self, seq_lens=tuple(spans))
        try:
            repaired.spec(s)
        except kvref.ContractViolation:
            return None
        return "read_table_packed_seq_lens"

    def probe(self, t):
        out = t.poisoned(self.poisoned_out())
        t.kernels.build_kv_read_table_packed(v2p=t.v2p, multiplier=t.config.multiplier,
                                             page_size=t.config.page_size, out=out[: self.capacity()],
                                             **self._packed_args(t))
        return out.tolist()

    def outside_writes(self, out: list[int]) -> tuple[str, int] | None:
        """The first element written at or past the kernel's ``out`` (``max_tokens``), if any."""
        cap = self.capacity()
        for j in range(cap, len(out)):
            if out[j] != POISON:
                return f"out[{j}] at or past max_tokens={self.max_tokens} (out holds {cap})", out[j]
        return None

    def shrink(self):
        if len(self.req_idx) > 1:
            for b, n in enumerate(self.seq_lens):
                start = None if self.kv_start is None else (self.kv_start[b],)
                yield dataclasses.replace(self, req_idx=(self.req_idx[b],), seq_lens=(n,), kv_start=start,
                                          indptr=(0, n), max_tokens=max(n, 1))
        end = max(self.indptr[-1] if self.indptr else 0, 1)
        if self.max_tokens > end:
            yield dataclasses.replace(self, max_tokens=end)
        yield from self._renumbered_rows()
        yield from self._shorter_rows()


TABLE_OPS = (ReadTable, ReadTablePacked)


from .raw_ops import KAllocBind, KBind, KernelOp, KFreeUnbind  # noqa: E402 - registered after the pool ops

POOL_KINDS = tuple(k for k, c in Op.registry.items() if issubclass(c, PoolOp))
KERNEL_KINDS = tuple(k for k, c in Op.registry.items() if issubclass(c, KernelOp))
