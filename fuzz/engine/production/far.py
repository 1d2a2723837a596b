"""``p_read_table_far``: read tables past the int32 address boundary, built only where they are read.

A server's ``req_to_token`` is max running requests x max context (SGLang keeps it as one int32
tensor of ``[size + 1, max_context_len]``): a few thousand slots of 1M-token contexts is more
than 2^31 elements. A kernel that computes a row's element offset ``row * stride(0)`` in int32
is right until that product passes 2^31, and then reads far before the table (an illegal address
on a GPU, a SIGSEGV or garbage under the interpreter). The page-table form of the read table
has the same boundary in ``out``: ``b * out.stride(0)`` passes 2^31 at bs x max_pages > 2^31
(thousands of rows of 1M columns at page size 1), the usual ``tl.program_id(0) * stride``
computed in int32. The other tables stay far below it: v2p/p2v hold at most ~2^20 pages (int64
offsets < 2^21), a packed out holds one batch's tokens, translate one batch's ids.

The op reaches that boundary without the memory of a second copy: its ``read`` rows are built
once (``PRows`` over ``len(read)`` rows: the oracle's whole ``req_to_token``), and the target's
``[rows, width]`` tensor is ``torch.empty`` with only those rows (and two red-zone rows on each
side) written; ``out`` in the far-out form likewise (only the live batch rows, their neighbours
and the red-zone rows are poisoned and compared; every other batch row has ``seq_lens`` 0 and
must write nothing). On the CPU untouched pages of an ``empty`` tensor cost no physical memory
(Linux maps them on first touch), so the interpreter runs the real 2^31 boundary in a few MB
(``tests/fuzz/test_far.py``). On a GPU ``empty`` does allocate: the op first asks
``torch.cuda.mem_get_info`` and answers "not applicable" with a note (never a finding) when the
device lacks the memory and a margin for the other workers on it, and gives its memory back to
the device afterwards. Those gigabytes come from a memory pool of their own (``FarMemory``:
``torch.cuda.MemPool``), released alone when the op ends, so the caching allocator keeps every
other block (emptying the whole cache, ``empty_cache``, makes the later ops of the sequence
allocate from the driver again; it stays the fallback where a pool cannot be made or does not
give its memory back). On an H200 with torch 2.11 the pool gave its 8 GiB back alone in 5 ms
(``benchmarks/mempool_probe.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import traceback
from dataclasses import dataclass

from .. import lazy
from .. import vector_oracle as vo
from ..ops import OUT_SLACK_COLS, PACKED_SLACK, POISON, R2T_DTYPES, Ints
from ..verdict import Divergence, Outcome, crash
from .arith import cdiv, hash_int, shrunk_ints
from .compare import Compare, packed_live
from .ops import PRows, ScaleOp
from .preflight import check_packed_call, check_table_call

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

FAR = 1 << 31  # the element offset an int32 product cannot hold
FAR_GUARD = 2  # red-zone rows on each side of the target's req_to_token
FAR_MARGIN = 16 << 30  # bytes a far op leaves free on a GPU for the other workers (at least; 1/8 of it too)
# How long a far op waits for its memory before it is not applicable. A fuzz worker does not
# wait (its op is counted as not applicable, ``far_ops`` in the summary, and it fuzzes on); a
# confirmation's executor does (``worker.executor_main`` sets it): the campaign's far ops hold
# their memory for one op each, so a replay that waits a little runs instead of answering
# "not applicable", which would be neither a reproduction nor a pass.
ROOM_WAIT_S = [0.0]
CONFIRM_ROOM_WAIT_S = 30.0
ROOM_POLL_S = 0.25
MEM_INFO = [None]  # the free-memory probe far ops ask (None: the device's own; ``far_room``'s ``mem_info``)


def far_room(device: torch.device, need: int, mem_info=None) -> str | None:
    """Why ``need`` bytes cannot be allocated on ``device`` now (None: they can). On a GPU the
    free memory (plus what this process's caching allocator holds unused) must cover ``need``
    and a margin; on the CPU nothing is checked here, since a far op touches only the rows it
    reads (a refused allocation is answered as not applicable where it happens). ``mem_info``
    (``device -> (free, total)`` bytes, as ``torch.cuda.mem_get_info``) replaces the device's
    answer, on any device: how a test on the CPU plays a crowded GPU."""
    if device.type != "cuda" and mem_info is None:
        return None
    free, total = (mem_info or torch.cuda.mem_get_info)(device)
    if device.type == "cuda":
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    margin = max(FAR_MARGIN, total // 8)
    if free < need + margin:
        return (f"needs {need / 2**30:.1f} GiB plus a {margin / 2**30:.0f} GiB margin; "
                f"{free / 2**30:.1f} GiB of {total / 2**30:.0f} GiB free")
    return None


def wait_for_room(device: torch.device, need: int, wait_s: float, mem_info=None, *, beat=None,
                  clock=time.monotonic, sleep=time.sleep) -> str | None:
    """``far_room``, asked again every ``ROOM_POLL_S`` for up to ``wait_s`` seconds while it says
    no: None once there is room, else the last reason. ``beat()`` is called at each poll (a
    heartbeat: waiting is progress, not a hang)."""
    end = clock() + wait_s
    while True:
        why = far_room(device, need, mem_info)
        if why is None or clock() >= end:
            return why
        if beat is not None:
            beat()
        sleep(ROOM_POLL_S)


@dataclass(frozen=True)
class PReadTableFar(ScaleOp):
    """read_table (``packed``: the CSR form, ``max_pages`` then counts tokens) over a target
    ``req_to_token`` of ``rows`` x ``width`` (``dtype``) of which only the ``read`` rows exist,
    into an ``out`` of ``bs`` rows of which only the ``live`` ones have a length: batch row
    ``live[j]`` reads row ``read[j % len(read)]`` with ``seq_lens`` ``long_len`` for ``j == 0``
    and a seeded one in ``[1, long_len]`` after; every other batch row reads ``read[0]`` with length
    0. The rows' tokens are ``PRows(seed, len(read), width, src, 0)``'s. Packed: ``live`` is
    every batch row, ``indptr`` their running sum, ``max_pages`` a row's cap and the captured
    ``out`` holds ``max_tokens = bs * max_pages`` (SPEC §2: ``indptr[bs] <= max_tokens`` and an
    ``out`` of ``max_tokens``, as ``g_read_table``'s; cases written before this rule asked for an
    ``out`` of the lengths' sum and ``max_tokens = max_pages``, which SPEC refuses)."""

    kind = "p_read_table_far"
    seed: int
    rows: int
    width: int
    read: Ints
    bs: int
    live: Ints
    max_pages: int
    src: Ints
    long_len: int
    packed: bool = False
    legacy: bool = False
    dtype: str = "int32"

    def supported_by(self, tier):
        if self.packed:
            return tier.has("build_kv_read_table_packed")
        return not self.legacy or tier.has("build_kv_read_table_legacy")

    def _rows_op(self) -> PRows:
        return PRows(self.seed, max(1, len(self.read)), self.width, self.src, 0, self.dtype)

    def invalid(self, run):
        ps = run.config.page_size
        if self.dtype not in R2T_DTYPES:
            return f"p_read_table_far: dtype must be one of {R2T_DTYPES}, got {self.dtype!r}"
        if self.rows < 1 or self.width < 1 or self.bs < 1 or not self.read or not self.live:
            return "p_read_table_far: rows, width, bs, read and live must not be empty"
        if len(set(self.read)) != len(self.read) or not all(0 <= r < self.rows for r in self.read):
            return f"p_read_table_far: read {self.read} must be distinct rows of [0, {self.rows})"
        if list(self.live) != sorted(set(self.live)) or not all(0 <= b < self.bs for b in self.live):
            return f"p_read_table_far: live {self.live} must be ascending distinct batch rows of [0, {self.bs})"
        if self.packed and (self.legacy or tuple(self.live) != tuple(range(self.bs))):
            return "p_read_table_far: a packed table has every batch row live and no legacy grid"
        cap = self.max_pages if self.packed else self.max_pages * ps
        fits = self.max_pages <= self.width if self.packed else (self.max_pages - 1) * ps < self.width
        if self.max_pages < 1 or not fits or not 0 <= self.long_len <= cap:
            return f"p_read_table_far: max_pages {self.max_pages} / long_len {self.long_len} do not fit width {self.width}"
        return self._rows_op().invalid(run)

    def lens(self, ps: int) -> list[int]:
        """seq_lens of the live batch rows: ``long_len``, then seeded ones in [1, max(1, long_len)]."""
        top = max(1, self.long_len)
        return [self.long_len if j == 0 else 1 + hash_int(j, self.seed) % top for j in range(len(self.live))]

    def elements(self):
        return len(self.live) * self.max_pages

    def max_tokens(self) -> int:
        """The packed form's captured buffer: every row at its cap."""
        return self.bs * self.max_pages

    def preflight(self, ctx):
        """The target's call (``rows`` x ``width``, every batch row); the oracle's compact one
        reads the same rows, so its clauses are the same."""
        lens, k = self.lens(ctx.config.page_size), len(self.read)
        if self.packed:
            indptr = [0]
            for n in lens:
                indptr.append(indptr[-1] + n)
            check_packed_call(ctx, r2t_rows=self.rows, width=self.width, req_idx=[self.read[j % k] for j in self.live],
                              seq_lens=lens, indptr=indptr, kv_start=None, max_tokens=self.max_tokens(),
                              out_len=self.max_tokens())
            return
        seq, req = [0] * self.bs, [self.read[0]] * self.bs
        for j, b in enumerate(self.live):
            seq[b], req[b] = lens[j], self.read[j % k]
        check_table_call(ctx, r2t_rows=self.rows, width=self.width, req_idx=req, seq_lens=seq,
                         max_pages=self.max_pages, out_rows=self.bs, out_cols=self.max_pages)

    def need_bytes(self) -> int:
        """Bytes of the target's buffers (req_to_token with its red zones, and out)."""
        r2t = (self.rows + 2 * FAR_GUARD) * self.width * (4 if self.dtype == "int32" else 8)
        return r2t + (0 if self.packed else (self.bs + 2) * (self.max_pages + OUT_SLACK_COLS) * 4)

    # ---- running it ---------------------------------------------------------------------------
    def execute(self, run, i):
        dev = run.device
        beat = None if run.beat is None else (lambda: run.beat.op(i))
        why = wait_for_room(dev, self.need_bytes(), ROOM_WAIT_S[0], MEM_INFO[0], beat=beat)
        if why is None:
            mem = FarMemory(dev)
            try:
                out = self._execute(run, i, mem)
                mem.release(self.need_bytes())
                return out
            except _NoRoom as exc:
                why = str(exc)
                mem.release()
            except BaseException as exc:
                # A finding's traceback holds the frames that raised it, and they the op's buffers:
                # cleared, the buffers are gone before release, which then gives their GiBs back now.
                traceback.clear_frames(exc.__traceback__)
                mem.release()
                raise
        run.notes.append(f"step {i} {self.kind}: not applicable: {why}")
        return Outcome({"far": "not applicable", "why": why})

    def _execute(self, run, i, mem):
        cfg, dev, ps = run.config, run.device, run.config.page_size
        compact = self._rows_op().build(cfg, dev)  # the oracle's req_to_token: row k is the target's read[k]
        canary = run.table_canary * ps  # a token whose page is v2p's red zone (ScaleRun.set_rows)
        buf = _empty((self.rows + 2 * FAR_GUARD, self.width), compact.dtype, dev, mem)
        buf[:FAR_GUARD].fill_(canary)
        buf[FAR_GUARD + self.rows:].fill_(canary)
        r2t = buf[FAR_GUARD:FAR_GUARD + self.rows]
        read_t = torch.tensor(self.read, dtype=torch.int64, device=dev)
        r2t.index_copy_(0, read_t, compact)
        k, lens = len(self.read), self.lens(ps)
        live_t = torch.tensor(self.live, dtype=torch.int64, device=dev)
        req = torch.full((self.bs,), self.read[0], dtype=torch.int64, device=dev)
        req.index_copy_(0, live_t, torch.tensor([self.read[j % k] for j in range(len(self.live))], dtype=torch.int64,
                                                device=dev))
        seq = torch.zeros(self.bs, dtype=torch.int64, device=dev).index_copy_(0, live_t, torch.tensor(lens, dtype=torch.int64,
                                                                                                 device=dev))
        oracle = dict(req_to_token=compact, seq_lens=torch.tensor(lens, dtype=torch.int64, device=dev), v2p=run.o_v2p,
                      req_pool_indices=torch.tensor([j % k for j in range(len(self.live))], dtype=torch.int64, device=dev))
        target = dict(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=run.t_v2p.view)
        common = dict(multiplier=cfg.multiplier, page_size=ps)
        cmp = (self._packed if self.packed else self._table)(run, i, oracle, target, common, lens, mem)
        # req_to_token is an input: its red zones and the rows it holds must come back unchanged.
        guards = torch.cat([buf[:FAR_GUARD].reshape(-1), buf[FAR_GUARD + self.rows:].reshape(-1)])
        flags = torch.stack([guards.ne(canary).any(), r2t.index_select(0, read_t).ne(compact).any()])
        try:
            zone, changed = flags.tolist()
        except Exception as exc:  # noqa: BLE001 - an asynchronous device fault of the target surfaces here
            raise crash(i, self, exc, f"the device faulted after {self.kind}: {exc}") from None
        if zone:
            raise Divergence(i, self, "memory", "req_to_token", "canary", "overwritten",
                             "red zone around req_to_token was written")
        if changed:
            at, e, g = vo.first_mismatch(compact, r2t.index_select(0, read_t))
            raise Divergence(i, self, "state", "req_to_token", e, g,
                             f"req_to_token row {self.read[at[0]]} column {at[1]} changed (an input)")
        run.check(i, self, [cmp])
        return Outcome(None)

    def _table(self, run, i, oracle, target, common, lens, mem) -> Compare:
        dev, ps, cols = run.device, run.config.page_size, self.max_pages + OUT_SLACK_COLS
        o_buf = torch.full((len(self.live), cols), POISON, dtype=torch.int32, device=dev)
        vo.read_table(max_pages=self.max_pages, out=o_buf[:, :self.max_pages], clauses=run.clauses, **oracle, **common)
        # Buffer rows compared: the red-zone rows 0 and bs + 1, each live row and its neighbours.
        checked = sorted({0, self.bs + 1} | {b + d for b in self.live for d in (0, 1, 2)})
        checked_t = torch.tensor(checked, dtype=torch.int64, device=dev)
        t_buf = _empty((self.bs + 2, cols), torch.int32, dev, mem)
        t_buf.index_fill_(0, checked_t, POISON)
        fn = "build_kv_read_table_legacy" if self.legacy else "build_kv_read_table"
        _call(run, i, self, lambda kern: getattr(kern, fn)(out=t_buf[1:1 + self.bs, :self.max_pages],
                                                          max_pages=self.max_pages, **target, **common))
        at_row = {b: checked.index(b + 1) for b in self.live}
        expected = torch.full((len(checked), cols), POISON, dtype=torch.int32, device=dev)
        expected.index_copy_(0, torch.tensor([at_row[b] for b in self.live], dtype=torch.int64, device=dev), o_buf)
        n_cols = [min(cdiv(n, ps), self.max_pages) for n in lens]

        def live():
            mask = torch.zeros(expected.shape, dtype=torch.bool, device=dev)
            for b, n in zip(self.live, n_cols):
                mask[at_row[b], :n] = True
            return mask

        return Compare("out", expected, t_buf.index_select(0, checked_t), live=live,
                       where=lambda at: f"out[{checked[at[0]] - 1}][{at[1]}]")

    def _packed(self, run, i, oracle, target, common, lens, mem) -> Compare:
        dev = run.device
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n)
        cap = self.max_tokens()  # the buffer captured at max_tokens (SPEC §2), poisoned past the live spans
        o_buf, t_buf = (torch.full((cap + 2 * PACKED_SLACK,), POISON, dtype=torch.int32, device=dev)
                        for _ in range(2))
        ip = torch.tensor(indptr, dtype=torch.int64, device=dev)
        vo.read_table_packed(indptr=ip, out=o_buf[PACKED_SLACK:PACKED_SLACK + cap], kv_start_idx=None,
                             max_tokens=cap, clauses=run.clauses, **oracle, **common)
        _call(run, i, self, lambda kern: kern.build_kv_read_table_packed(
            indptr=ip.clone(), out=t_buf[PACKED_SLACK:PACKED_SLACK + cap], max_tokens=cap,
            **target, **common))
        spans = list(zip(indptr[:-1], lens))
        return Compare("out", o_buf, t_buf, live=lambda: packed_live(o_buf.numel(), spans, dev),
                       where=lambda at: f"out[{at - PACKED_SLACK}]")

    # ---- shrinking: the smallest table that still holds the rows read ----------------------------
    def shrink(self):
        k = len(self.read)
        for j in range(len(self.live)):
            one = (self.read[j % k],)
            if self.packed:
                yield dataclasses.replace(self, read=one, bs=1, live=(0,), long_len=self.lens(1)[j])
            elif len(self.live) > 1 or k > 1:
                yield dataclasses.replace(self, read=one, live=(self.live[j],))
        if self.rows > max(self.read) + 1:
            yield dataclasses.replace(self, rows=max(self.read) + 1)
        if not self.packed and self.bs > max(self.live) + 1:
            yield dataclasses.replace(self, bs=max(self.live) + 1)
        for c in shrunk_ints(self.max_pages, 1):
            yield dataclasses.replace(self, max_pages=c, long_len=min(self.long_len, c))
        for c in shrunk_ints(self.long_len):
            yield dataclasses.replace(self, long_len=c)
        if self.legacy:
            yield dataclasses.replace(self, legacy=False)
        if self.dtype != "int32":
            yield dataclasses.replace(self, dtype="int32")
        if self.seed:
            yield dataclasses.replace(self, seed=0)


class _NoRoom(Exception):
    pass


def _call(run, i: int, op, fn):
    """``run.call_target``, but a target that runs out of memory on a far table (a torch path
    that builds bs x max_pages temporaries, say) makes the op not applicable, not a finding:
    the op is about address arithmetic, not about how much memory a kernel set may take."""
    try:
        return fn(run.tier.kernels)
    except torch.OutOfMemoryError as exc:
        raise _NoRoom(f"the kernel set ran out of memory: {str(exc)[:200]}") from None
    except Exception as exc:  # noqa: BLE001 - any other exception of the target is a finding
        raise crash(i, op, exc, f"the target raised {type(exc).__name__}: {exc}") from None


class FarMemory:
    """Where a far op's big buffers come from: on a GPU a ``torch.cuda.MemPool`` of their own,
    given back to the device alone by ``release``; elsewhere (or where no pool can be made) the
    ordinary allocator. ``release(need)`` checks that the pool did give back ``need`` bytes; when it
    did not (a torch whose pools keep their blocks), it empties the whole cache instead, now and
    for the rest of the process (``MODE``)."""

    MODE = ["pool"]  # "pool", or "empty_cache" once a pool was seen keeping its memory

    def __init__(self, device: torch.device):
        self.device, self.pool = device, None
        if device.type == "cuda" and self.MODE[0] == "pool":
            with contextlib.suppress(Exception):
                self.pool = torch.cuda.MemPool()

    @contextlib.contextmanager
    def allocating(self):
        """The context the big allocations are made in (the ordinary allocator where the pool
        cannot be entered: this torch's pools are then not used again)."""
        ctx = contextlib.nullcontext()
        if self.pool is not None:
            try:
                index = self.device.index if self.device.index is not None else torch.cuda.current_device()
                ctx = torch.cuda.use_mem_pool(self.pool, index)
                ctx.__enter__()
            except Exception:  # noqa: BLE001 - a torch without usable pools: the whole cache goes afterwards
                self.MODE[0], self.pool, ctx = "empty_cache", None, contextlib.nullcontext()
        try:
            yield
        finally:
            ctx.__exit__(None, None, None)

    def release(self, need: int | None = None) -> None:
        """Give the op's memory back to the device (``need``: the bytes the op allocated, when it
        returned normally and its buffers are gone; None: empty the whole cache)."""
        if self.device.type != "cuda":
            return
        with contextlib.suppress(Exception):  # a sticky fault of the target is reported, not this
            before = torch.cuda.memory_reserved(self.device)
            pool, self.pool = self.pool, None
            del pool  # its blocks go back to the driver with it
            if need is None or torch.cuda.memory_reserved(self.device) > before - need * 9 // 10:
                if need is not None:
                    self.MODE[0] = "empty_cache"
                torch.cuda.empty_cache()


def _empty(shape, dtype, device, mem: FarMemory | None = None) -> torch.Tensor:
    """``torch.empty`` (in ``mem``'s pool), or ``_NoRoom`` when the allocator refuses it (a
    not-applicable answer)."""
    try:
        with mem.allocating() if mem is not None else contextlib.nullcontext():
            return torch.empty(shape, dtype=dtype, device=device)
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as exc:
        raise _NoRoom(f"allocating {shape} {dtype} failed: {type(exc).__name__}: {str(exc)[:200]}") from None


# ---- drawing one ----------------------------------------------------------------------------------


def far_rng(seed: int) -> random.Random:
    """A production sequence's far-op RNG: its own, so the rest of the stream stays what it was."""
    return random.Random(seed * 1_000_037 + 0xFA2)


def draw_far_op(gen, rng: random.Random) -> PReadTableFar:
    """A p_read_table_far for a ScaleGenerator (``gen``: geometry, bound pages, constants, the
    sequence's dtype), every choice from ``rng``. Three in four reach past 2^31 in req_to_token
    (rows just past the boundary: the first row whose offset passes it, the one before, the last,
    one near 2^29, and past 2^32 in a sixth of the int32 ones); at page size 1 one in four
    reaches past it in out instead (a batch of thousands of rows, four of them live).

    Where tables are priced (the interpreter, ``cost``) the draw is a cheap one: what wraps is
    one program's address arithmetic, which a huge row index or batch row reaches without many
    programs or long rows. The far-out batch is then the shortest one (max_pages 2^20: about
    2,049 programs, each row a few blocks long), the req_to_token rows at most 2^18 wide (the
    oracle's compact rows are built on the host), the columns inside ``op_work``."""
    cfg, lim = gen.config, gen.limits
    ps = cfg.page_size
    bounds = gen.boundaries(rng)  # over the worker's palette, if it has one
    features = gen.features
    src = gen.row_source(rng)
    seed = rng.randrange(1 << 30)
    priced = gen.budget is not None
    if ps == 1 and rng.random() < 0.25:  # far out: bs x max_pages past 2^31, a small req_to_token
        max_pages = 1 << 20 if priced else rng.choice((1 << 18, 1 << 19, 1 << 20))
        first = cdiv(FAR, max_pages + OUT_SLACK_COLS)  # the first batch row whose out offset passes 2^31
        bs = first + rng.choice((1, 2, 9))
        read = tuple(rng.sample(range(4), rng.choice((1, 2))))
        long_len = bounds.size(1, 2 * max(gen.constants.block_values() or [1]))[0] if priced else max_pages
        live = tuple(sorted({0, first - 1, first, bs - 1}))
        gen.take(bs, long_len, long_rows=len(live))
        op = PReadTableFar(seed=seed, rows=4, width=max_pages + rng.choice((0, 1, 7)), read=read, bs=bs,
                           live=live, max_pages=max_pages, src=src,
                           long_len=long_len, legacy=gen.legacy and rng.random() < 0.2, dtype=gen.r2t_dtype)
        return gen._tag(op, far="out", bs=str(bs), max_pages=str(max_pages))
    widths = (1 << 17, 1 << 18) if priced else (1 << 17, 1 << 18, 1 << 19, 1 << 20)
    width = rng.choice((*widths, (1 << 18) + ps * rng.randrange(1, 64)))
    first = cdiv(FAR, width)  # the first row whose offset passes 2^31
    past_2_32 = gen.r2t_dtype == "int32" and rng.random() < 1 / 6
    rows = (cdiv(2 * FAR, width) if past_2_32 else first) + rng.choice((1, 1, 2, 17))
    read = [first, first - 1, rows - 1, cdiv(1 << 29, width)] + ([cdiv(2 * FAR, width)] if past_2_32 else [])
    read = list(dict.fromkeys(r for r in read if r < rows))
    rng.shuffle(read)
    n_live = len(read) + rng.choice((0, 0, 1, 3))
    packed = (features is None or "build_kv_read_table_packed" in features) and rng.random() < 0.3
    col_cap = max(1, min(width if packed else cdiv(width, ps), lim.max_read_elems // n_live, 1 << 16))
    cols, tag = bounds.size(1, col_cap)
    for _ in range(gen.tries if priced else 0):  # inside op_work: no trips needed, only the far row
        if gen.affords(n_live, cols):
            break
        cols, tag = bounds.size(1, min(col_cap, 4 * max(gen.constants.block_values() or [1])))
    if priced and not gen.affords(n_live, cols):
        cols, tag = 1, "fallback"
    gen.take(n_live, cols)
    long_len = max(1, cols if packed else cols * ps - rng.randrange(ps))
    op = PReadTableFar(seed=seed, rows=rows, width=width, read=tuple(read), bs=n_live, live=tuple(range(n_live)),
                       max_pages=cols, src=src, long_len=long_len, packed=packed,
                       legacy=not packed and gen.legacy and rng.random() < 0.2, dtype=gen.r2t_dtype)
    return gen._tag(op, far="req_to_token", rows=f"{rows} x {width}", max_pages=tag)
