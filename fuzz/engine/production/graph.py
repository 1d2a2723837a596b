"""CUDA-graph replay fuzzing of the read table, and its emulation on the CPU tiers.

A server captures ``build_kv_read_table`` once, at its largest batch and width, with
short dummy sequences, then replays that graph every step after refreshing the captured
input tensors in place. Whatever the launcher decided on the host at capture time (a grid
sized from a live length read back, a cached bound) is frozen into the graph, so a kernel
set can be right on every eager call and wrong under replay. A ``g_read_table`` op is one
such capture and its replays: static buffers, an eager warm-up at the capture-time inputs
(seq_lens drawn small), the capture, then ``steps`` rounds of in-place mutation (seq_lens
from 0 to the maximum, req_pool_indices, a req_to_token row, v2p tombstones), replay, and
a diff of the whole ``out`` buffer, poison included, against the vectorized oracle.

On CUDA the capture is a ``torch.cuda.CUDAGraph``. On the CPU (the interpreter tier) the
capture call runs with ``JITFunction.run`` and the interpreter's ``InterpretedFunction.run``
wrapped, recording each Triton launch (kernel, grid, args, kwargs; ``warmup=True`` calls
skipped), and a replay re-issues exactly those launches with the same tensor objects: the
host-side decisions are frozen as a graph freezes them. Two cases cannot be emulated and
are reported as not applicable (never as clean): a capture call that launches no Triton
kernel (a torch fallback), and a launcher that hands a kernel a tensor it computed with
torch ops during the call (a graph would recompute it on replay; the emulation cannot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from itertools import accumulate

from .. import launches, lazy
from .. import vector_oracle as vo
from ..ops import PACKED_SLACK, POISON, Ints
from ..verdict import Outcome
from .arith import aligned_up, cdiv, hash_int, hash_rows, out_cols, row_hashes, vectorizable
from .compare import Compare, packed_live, table_live
from .draws import device_ints
from .ops import PRows, ScaleOp
from .preflight import check_packed_call, check_table_call

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

# Ops that only allocate: a tensor they made holds no capture-time value a replay would need.
_ALLOC_ONLY = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


# ---- recording Triton launches (``launches``: the one hook on Triton's launch path) ----------


class LaunchRecorder(launches.Recorder):
    """The outermost Triton launches of a capture call (``launches.Recorder``), plus the
    storages torch ops allocated during the call outside any launch (``made``): a launch
    argument computed that way holds a capture-time value a replay would not refresh."""

    def __init__(self):
        super().__init__()
        self.made: dict[int, str] = {}  # storage pointer -> the torch op that allocated it during the call
        self._mode = None

    def __enter__(self):
        super().__enter__()
        self._mode = _alloc_watch_class()(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        super().__exit__(*exc)
        return False

    def stale_args(self) -> list[str]:
        """Launch arguments the call computed with torch ops (values a replay would not refresh)."""
        stale = []
        for launch in self.launches:
            for x in (*launch.args, *launch.kwargs.values()):
                if isinstance(x, torch.Tensor):
                    op = self.made.get(x.untyped_storage().data_ptr())
                    if op is not None and not any(op.startswith(f"aten.{a}.") or op == f"aten.{a}" for a in _ALLOC_ONLY):
                        stale.append(op)
        return stale


@functools.cache
def _alloc_watch_class() -> type:
    """The dispatch mode that notes the storages torch ops allocate during the capture call
    (outside launches). Built on first use, so importing this module imports no torch."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:  # pragma: no cover - very old torch: the stale check is skipped

        class _NoWatch(contextlib.nullcontext):
            def __init__(self, recorder):
                super().__init__()
        return _NoWatch

    class _AllocWatch(TorchDispatchMode):
        def __init__(self, recorder: LaunchRecorder):
            super().__init__()
            self.recorder = recorder

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not self.recorder.inside:
                seen = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
                for t in _tensors(out):
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in seen:
                        self.recorder.made.setdefault(ptr, str(func))
            return out
    return _AllocWatch



def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


# ---- captures ---------------------------------------------------------------------------------------------


class CudaCapture:
    """torch.cuda.CUDAGraph: warm up on a side stream, capture, replay."""

    emulated = False

    def __init__(self):
        self.graph = None

    def warmup(self, call) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)

    def capture(self, call) -> str | None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        self.graph = graph
        return None

    def replay(self) -> None:
        self.graph.replay()


class EmulatedCapture:
    """The CPU stand-in: record the capture call's Triton launches, replay exactly those."""

    emulated = True

    def __init__(self):
        self.launches: list[launches.Launch] = []

    def warmup(self, call) -> None:
        call()

    def capture(self, call) -> str | None:
        """None when the capture can be emulated, else why not."""
        with LaunchRecorder() as rec:
            call()
        if not rec.launches:
            return "the capture call launched no Triton kernel (a torch path): graph replay is not applicable on this tier"
        stale = rec.stale_args()
        if stale:
            return (f"the launcher passes its kernel tensors computed with torch ops during the call "
                    f"({', '.join(sorted(set(stale)))}): replaying only the Triton launches cannot refresh them")
        self.launches = rec.launches
        return None

    def replay(self) -> None:
        for launch in self.launches:
            launch.replay()


def make_capture(device) -> CudaCapture | EmulatedCapture:
    return CudaCapture() if torch.device(device).type == "cuda" else EmulatedCapture()


# ---- the op -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GReadTable(ScaleOp):
    """One capture of the read table (``packed``: the CSR form, ``max_pages`` then counts
    a row's tokens and the captured ``out`` holds ``max_tokens = bs * max_pages``) and
    ``steps`` replays with mutated inputs, all seeded. The captured req_to_token is its own
    [rows, width] (built like ``p_rows`` from ``src``); v2p is the sequence's, tombstoned at
    ``tombs`` seeded pages per step and restored afterwards."""

    kind = "g_read_table"
    seed: int
    bs: int
    max_pages: int
    rows: int
    width: int
    src: Ints
    cap_len: int
    long_len: int
    steps: int
    tombs: int
    packed: bool
    dtype: str = "int32"  # of the captured req_to_token (p_rows' dtype)
    aligned: bool = False  # the out buffer's layout (arith.out_cols; the page-table form only)

    def supported_by(self, tier):
        return not self.packed or tier.has("build_kv_read_table_packed")

    def invalid(self, run):
        ps = run.config.page_size
        maxlen = self.max_pages if self.packed else self.max_pages * ps
        need = self.max_pages if self.packed else (self.max_pages - 1) * ps + 1
        if self.bs < 1 or self.max_pages < 1 or self.rows < 1 or self.width < need:
            return f"g_read_table: bs {self.bs}, max_pages {self.max_pages} do not fit rows {self.rows} x {self.width}"
        if not 0 <= self.cap_len <= maxlen or not 0 <= self.long_len <= maxlen or self.steps < 0 or self.tombs < 0:
            return "g_read_table: cap_len / long_len / steps / tombs out of range"
        return PRows(self.seed, self.rows, self.width, self.src, 0, self.dtype).invalid(run)

    def elements(self):
        return self.bs * self.max_pages * (self.steps + 1)

    # ---- the inputs of each step, decided on the host ------------------------------------------------
    # Each is defined by its row-by-row loop; large batches compute the same values with torch on
    # the CPU (``arith.vectorizable``; ``tests/fuzz/test_preflight.py`` compares them over many seeds).
    def lens(self, step: int, ps: int) -> list[int]:
        """seq_lens of ``step`` (-1: capture time, all short); the last step has every row full."""
        maxlen = self.max_pages if self.packed else self.max_pages * ps
        if step < 0:
            if self.cap_len >= 0 and vectorizable(self.bs, self.cap_len):
                return hash_rows(self.bs, self.seed + 5).remainder_(self.cap_len + 1).tolist()
            return [h % (self.cap_len + 1) for h in row_hashes(self.bs, self.seed + 5)]
        if step == self.steps - 1:
            return [maxlen] * self.bs
        s = hash_int(step, self.seed)
        ramp = maxlen * (step + 1) // max(1, self.steps)
        if maxlen >= 0 and vectorizable(self.bs, maxlen, self.long_len, ramp):
            h = hash_rows(self.bs, s)
            pick = h.remainder(4)
            out = torch.full_like(h, maxlen).masked_fill_(h.remainder(8) < 3, 0)
            out.masked_fill_(pick == 2, ramp)
            out = torch.where(pick == 1, h.remainder(maxlen + 1), out)
            return out.masked_fill_(pick == 0, self.long_len).tolist()
        out = []
        for h in row_hashes(self.bs, s):
            pick = h % 4
            if pick == 0:
                out.append(self.long_len)
            elif pick == 1:
                out.append(h % (maxlen + 1))
            elif pick == 2:
                out.append(ramp)
            else:
                out.append(0 if h % 8 < 3 else maxlen)
        return out

    def req_idx(self, step: int) -> list[int]:
        rows = self.rows
        if step < 0:
            if rows >= 1 and vectorizable(self.bs, rows):
                return torch.arange(self.bs, dtype=torch.int64).remainder_(rows).tolist()
            return [b % rows for b in range(self.bs)]
        s = hash_int(step, self.seed + 1)
        m = hash_int(1, s) % (rows + 1)
        if rows >= 1 and vectorizable(self.bs, m * self.bs, s, rows):
            return torch.arange(self.bs, dtype=torch.int64).mul_(m).add_(s).remainder_(rows).tolist()
        return [(m * b + s) % rows for b in range(self.bs)]

    def starts(self, step: int, seq: list[int]) -> list[int]:
        s = hash_int(step + 1, self.seed + 2)
        if seq and max(seq) <= self.width and vectorizable(len(seq), self.width, min(seq)):
            h = hash_rows(len(seq), s)
            room = torch.tensor(seq, dtype=torch.int64).neg_().add_(self.width + 1)  # >= 1 on every row
            return torch.where(h.remainder(3) == 0, 0, h.remainder(room)).tolist()
        return [0 if h % 3 == 0 else h % (self.width - n + 1) for n, h in zip(seq, row_hashes(len(seq), s))]

    def step_inputs(self, step: int, ps: int) -> dict:
        """The inputs ``step`` (-1: the capture) hands the kernel: req, seq, and when packed
        indptr and start (computed once for the check and the run: ``_step_inputs``)."""
        return {name: list(v) for name, v in _step_inputs(self, step, ps)}

    def live_cols(self, seq, ps: int) -> list[int]:
        """Each batch row's live columns at a replay of these seq_lens (the table form's mask)."""
        return [min(cdiv(n, ps), self.max_pages) for n in seq]

    @staticmethod
    def live_spans(seq) -> list[tuple[int, int]]:
        """(start, length) of each row in the packed buffer at a replay of these seq_lens."""
        return list(zip(accumulate(seq, initial=0), seq))

    def preflight(self, ctx):
        """Every replay's inputs, and the capture's: the very tuples the run hands the kernel
        (``_step_inputs``, shared by the check and the run)."""
        total = self.bs * self.max_pages
        for step in range(-1, self.steps):
            v = dict(_step_inputs(self, step, ctx.config.page_size))
            if self.packed:
                check_packed_call(ctx, r2t_rows=self.rows, width=self.width, req_idx=v["req"], seq_lens=v["seq"],
                                  indptr=v["indptr"], kv_start=v["start"], max_tokens=total, out_len=total)
            else:
                check_table_call(ctx, r2t_rows=self.rows, width=self.width, req_idx=v["req"], seq_lens=v["seq"],
                                 max_pages=self.max_pages, out_rows=self.bs, out_cols=self.max_pages)

    # ---- running it ---------------------------------------------------------------------------------------
    def execute(self, run, i):
        cfg, dev, ps = run.config, run.device, run.config.page_size
        rows_src = PRows(self.seed, self.rows, self.width, self.src, 0, self.dtype)
        o_r2t = rows_src.build(cfg, dev)
        t_r2t = o_r2t.clone()
        bs = self.bs
        static = {"req": (torch.zeros(bs, dtype=torch.int64, device=dev), torch.zeros(bs, dtype=torch.int64, device=dev)),
                  "seq": (torch.zeros(bs, dtype=torch.int64, device=dev), torch.zeros(bs, dtype=torch.int64, device=dev))}
        if self.packed:
            total = bs * self.max_pages
            shape = (total + 2 * PACKED_SLACK,)
            static["indptr"] = tuple(torch.zeros(bs + 1, dtype=torch.int64, device=dev) for _ in range(2))
            static["start"] = tuple(torch.zeros(bs, dtype=torch.int64, device=dev) for _ in range(2))
        else:
            shape = (bs + 2, out_cols(self.max_pages, self.aligned))
        o_buf, t_buf = (torch.full(shape, POISON, dtype=torch.int32, device=dev) for _ in range(2))

        def out_view(buf):
            return buf[PACKED_SLACK:PACKED_SLACK + total] if self.packed else buf[1:1 + bs, :self.max_pages]

        def common(side: int, r2t, v2p):
            args = dict(req_to_token=r2t, req_pool_indices=static["req"][side], seq_lens=static["seq"][side], v2p=v2p,
                        multiplier=cfg.multiplier, page_size=ps, out=out_view((o_buf, t_buf)[side]))
            if self.packed:
                # max_tokens: the captured buffer's capacity (SPEC §2), not one row's cap
                return dict(args, indptr=static["indptr"][side], kv_start_idx=static["start"][side],
                            max_tokens=total)
            return dict(args, max_pages=self.max_pages)

        def set_inputs(step: int) -> tuple[int, ...]:  # the step's seq_lens
            vals = _step_inputs(self, step, ps)  # the tuples the check was given
            # One host-to-device copy for every input of the step (``draws.device_ints``: no wait for
            # the device), then device-side copies into both sides' static buffers.
            flat = device_ints([x for _, v in vals for x in v], dev)
            at = 0
            for name, v in vals:
                src = flat[at:at + len(v)]
                at += len(v)
                for t in static[name]:
                    t.copy_(src)
            return dict(vals)["seq"]

        def oracle():
            fn = vo.read_table_packed if self.packed else vo.read_table
            fn(**common(0, o_r2t, run.o_v2p), clauses=run.clauses)

        target_args = common(1, t_r2t, run.t_v2p.view)
        fn_name = "build_kv_read_table_packed" if self.packed else "build_kv_read_table"

        def target_call():
            getattr(run.tier.kernels, fn_name)(**target_args)

        def compare(step: int, seq):
            # The live mask's per-row lists are built only when the results differ (``live`` is
            # called by ``result_divergence`` alone), from the step's own immutable seq_lens.
            if self.packed:
                live = lambda: packed_live(o_buf.numel(), self.live_spans(seq), dev)  # noqa: E731
                where = lambda a: f"out[{a - PACKED_SLACK}] at replay {step}"  # noqa: E731
            else:
                live = lambda: table_live(o_buf.shape, self.live_cols(seq, ps), dev)  # noqa: E731
                where = lambda a: f"out[{a[0] - 1}][{a[1]}] at replay {step} (capture seq_lens <= {self.cap_len})"  # noqa: E731
            run.check(i, self, [Compare("out", o_buf, t_buf, live=live, where=where)], results_only=True)

        saved = (run.o_v2p.clone(), run.t_v2p.view.clone())
        capture = make_capture(dev)
        try:
            seq = set_inputs(-1)
            oracle()
            run.call_target(i, self, lambda k: capture.warmup(target_call))
            compare(-1, seq)
            why = run.call_target(i, self, lambda k: capture.capture(target_call))
            if why is not None:
                run.notes.append(f"step {i} {self.kind}: {why}")
                run.graph_not_applicable += 1
                return Outcome({"graph": "not applicable", "why": why})
            for step in range(self.steps):
                seq = self._mutate(run, step, set_inputs, o_r2t, t_r2t)
                run.call_target(i, self, lambda k: capture.replay())
                oracle()
                compare(step, seq)
            run.graph_replays += self.steps
            run.check(i, self, [], state=True)
        finally:
            run.o_v2p.copy_(saved[0])
            run.t_v2p.view.copy_(saved[1])
        return Outcome({"graph": "cuda" if not capture.emulated else "emulated", "replays": self.steps})

    def _mutate(self, run, step: int, set_inputs, o_r2t, t_r2t) -> tuple[int, ...]:
        seq = set_inputs(step)
        s = hash_int(step, self.seed + 7)
        r = s % self.rows
        lo, span, a, b, k0, m, c, d = self.src
        row = PRows(s, 1, self.width, (lo, span, a, b, k0, m, c, d + s % (1 << 20)), 0, self.dtype).build(
            run.config, run.device)
        o_r2t[r:r + 1].copy_(row)
        t_r2t[r:r + 1].copy_(row)
        if self.tombs:
            n = run.config.num_pages - 1
            pages = torch.arange(self.tombs, dtype=torch.int64, device=run.device).mul_(s % 7919 + 1).add_(s).remainder_(n).add_(1)
            run.o_v2p.index_fill_(0, pages, -1)
            run.t_v2p.view.index_fill_(0, pages, -1)
        return seq

    def shrink(self):
        yield from self._shrink_fields(("steps",), {"steps": 1})
        yield from self._shrink_fields(("bs",), {"bs": 1})
        yield from self._shrink_fields(("max_pages",), {"max_pages": 1})
        yield from self._shrink_fields(("tombs", "cap_len", "long_len"))
        yield from self._shrink_fields(("rows",), {"rows": 1})
        if self.dtype != "int32":
            yield dataclasses.replace(self, dtype="int32")
        if self.aligned:
            yield dataclasses.replace(self, aligned=False)


# ---- drawing one ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def _step_inputs(op: GReadTable, step: int, ps: int) -> tuple:
    """``GReadTable.step_inputs`` as (name, values) pairs, once per op and step (its check and its run ask)."""
    seq = op.lens(step, ps)
    vals = [("req", tuple(op.req_idx(step))), ("seq", tuple(seq))]
    if op.packed:
        vals += [("indptr", tuple(accumulate(seq, initial=0))), ("start", tuple(op.starts(step, seq)))]
    return tuple(vals)


def draw_graph_op(gen) -> GReadTable:
    """A g_read_table for a ScaleGenerator: batch and width at the constants' boundaries,
    capture-time seq_lens short (a server's dummy capture), a few to ``graph_steps`` replays."""
    rng, lim, cfg = gen.rng, gen.limits, gen.config
    ps = cfg.page_size
    features = gen.features
    packed = (features is None or "build_kv_read_table_packed" in features) and rng.random() < 0.3
    cols_cap = lim.max_row_tokens if packed else lim.max_row_tokens // ps
    budget = lim.graph_programs if lim.graph_programs is not None else lim.max_programs
    launches = lim.graph_steps + 1  # a capture and up to graph_steps replays
    for _ in range(gen.tries):
        bs, bs_tag = gen.bounds.bs(lim.max_bs) if rng.random() < 0.6 else gen.bounds.size(1, min(lim.max_bs, 64))
        cols, cols_tag = gen.bounds.trip_pages(bs, cols_cap)
        elems = bs * cols
        grid_cols = bs * cols if packed else cols  # a packed capture holds bs * cols tokens
        if elems <= (lim.max_packed if packed else lim.max_read_elems) and gen.under(budget, bs, grid_cols) and gen.affords(
                bs, cols, launches=launches, grid_cols=grid_cols):
            break
    else:
        bs, cols, bs_tag, cols_tag = rng.randint(1, 8), rng.randint(1, 64), "fallback", "fallback"
    gen.take(bs, cols, launches=launches, grid_cols=bs * cols if packed else cols)
    maxlen = cols if packed else cols * ps
    width = (cols if packed else (cols - 1) * ps + 1) + rng.choice((0, 1, ps))
    width = aligned_up(width) if gen.aligned else width
    rows = max(1, min(bs, lim.max_r2t_elems // width, rng.choice((1, 3, bs, bs + 1))))
    src = gen.row_source(rng)
    cap_len = min(maxlen, rng.choice((0, 1, ps, 2 * ps, 3 * ps)))
    n_long, long_tag = gen.long_pages(bs, cols)
    long_len = min(maxlen, n_long if packed else n_long * ps)
    op = GReadTable(seed=rng.randrange(1 << 30), bs=bs, max_pages=cols, rows=rows, width=width, src=src,
                    cap_len=cap_len, long_len=long_len, steps=rng.randint(2, max(2, lim.graph_steps)),
                    tombs=rng.choice((0, 1, 8)), packed=packed, dtype=gen.r2t_dtype, aligned=gen.aligned and not packed)
    return gen._tag(op, bs=bs_tag, max_pages=cols_tag, long_len=long_tag, cap_len=str(cap_len))
