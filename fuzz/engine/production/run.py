"""The production runner: the target's tables and the oracle's, one production op at a time.

One sequence has one pool geometry (``kvref.PoolConfig``: num_pages, page_size,
multiplier). Its state: the target's v2p/p2v between red zones (``memory.Guarded``) whose
canary, read as an index, lands in a red zone again (``rows + guard // 2``; for token
buffers times the page size); the oracle's own copies; and the current ``req_to_token``
rows (``p_rows``), both sides. Results are compared on the device, one host read per
check, and only the first divergent element is read back.

Hostile probes (``hostile``: SPEC §2's memory-safety promises, drawn unless the run's
``hostile`` is ``off``) run the target's kernel alone on guarded copies of the tables and
judge memory only; under ``off`` a replayed probe is refused, not run.

When several oracles disagree at one check, the report is chosen in a fixed order that
does not depend on the process's history: red zones, then the tables, then results. A
kernel that leaves lanes of a freshly allocated result unwritten returns whatever the
caching allocator held there (often the right values in a process that ran the same op
before, garbage in a fresh one), while the tables it failed to write are wrong in every
process; reporting the tables first keeps a case's signature the same in the campaign,
the minimizer and a fresh replay.
"""

from __future__ import annotations

import os

import kvref
from kvref import ContractViolation

from .. import lazy
from .. import vector_oracle as vo
from ..gate import GeneratedInvalid, admit
from ..knobs import apply as apply_knobs
from ..memory import Guarded, index_canary
from ..ops import Op, OpError
from ..verdict import Divergence, Outcome, RunStats, crash, surfaced
from .arith import INT32_LIMIT
from .compare import Compare, result_divergence
from .hostile import HostileOp
from .ops import ScaleOp

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

TABLE_GUARD = 64  # red-zone rows on each side of v2p/p2v
ROW_GUARD = 2  # red-zone rows of req_to_token on each side
DEFER_CUDA = 8  # results-only checks read back together, on CUDA (``ScaleRun`` says why)
DEFER_BYTES = 1 << 30  # ... while the results they hold stay under this (a far op's buffers do not)


def fits_pool(config: kvref.PoolConfig) -> str | None:
    if config.table_rows * config.multiplier * config.page_size >= INT32_LIMIT:
        return "v2p * multiplier * page_size must stay below 2^31 (SPEC §2)"
    return None


class ScaleRun:
    """Results (returned pages, out buffers with their poison) are compared after every op;
    the raw tables, the rows and every red zone after every op that writes the tables,
    every ``check_every``-th op otherwise, and at ``finish``.

    ``defer``: how many ops' checks may wait for one host read (default ``DEFER_CUDA`` on a
    GPU, 1 elsewhere; ``KVFUZZ_DEFER_CHECKS`` overrides it). Each check is one host read,
    and on a GPU that read waits for the device, which then idles while the host draws
    the next op. Measured on one H200 (benchmarks/results/deferred-checks-h200): reads 3x
    fewer, elements/s within noise, since the phase is bound by the oracle's device passes
    and the host's own work per op, not by its reads. A check that compares results only (no state due) is queued instead, with its flags
    already computed on the device, and read with the next check that reads state, when
    ``defer`` are queued, or at ``finish``. The verdict is the one an immediate read gives:
    the flags of op ``k`` are taken before op ``k + 1`` runs, and the earliest op with a
    hit is reported, with that op's step. What changes: an op after a divergent one runs
    before the divergence is seen, so a later crash or hang can be met first, and a device
    fault that surfaces at the read is laid to the last queued op (its case holds the
    earlier ones; the minimizer and a blocking replay pin it)."""

    def __init__(self, config: kvref.PoolConfig, tier, *, check_every: int = 1, knobs: dict | None = None,
                 strict_knobs: bool = True, hostile: str = "spec", beat=None, defer: int | None = None):
        err = fits_pool(config)
        if err:
            raise OpError(f"pool config {config}: {err}")
        self.config, self.tier = config, tier
        self.device = torch.device(tier.device)
        self.check_every = max(1, check_every)
        self.knobs, self.hostile, self.beat = knobs, hostile, beat
        self.gate = False  # the track's generated sequences set it: a refused valid op is then exit 3
        self.dropped_knobs = apply_knobs(tier.kernels, knobs, strict=strict_knobs)
        rows = config.table_rows
        self.table_canary = index_canary(rows, TABLE_GUARD)  # read as a page id: lands in the trailing red zone
        self.t_v2p = Guarded((rows,), torch.int64, self.device, TABLE_GUARD, self.table_canary, -1)
        self.t_p2v = Guarded((rows,), torch.int64, self.device, TABLE_GUARD, self.table_canary, -1)
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
        self.clauses: list = []  # the vector oracle's precondition flags, read with the next check
        self.defer = max(1, defer if defer is not None else _default_defer(tier))
        self.pending: list[tuple[int, Op | None, list, int]] = []  # queued checks: (step, op, flags, bytes held)
        self.host_reads = 0  # host reads of check flags (tests and benchmarks read it)

    # ---- state the ops share ----------------------------------------------------------------
    def set_rows(self, rows: torch.Tensor) -> None:
        r, w = rows.shape
        canary = self.table_canary * self.config.page_size  # a token whose page is v2p's red zone
        self.t_r2t = Guarded((r, w), rows.dtype, self.device, ROW_GUARD * w, canary, 0)
        self.t_r2t.view.copy_(rows)
        self.o_r2t = rows
        self.rows_shape = (r, w)

    def call_target(self, i: int, op: Op, fn):
        try:
            return fn(self.tier.kernels)
        except Exception as exc:  # noqa: BLE001 - any exception of the target is a finding
            raise crash(i, op, exc, f"the target raised {type(exc).__name__}: {exc}") from None

    # ---- the ops --------------------------------------------------------------------------------
    def step(self, op: Op) -> Outcome:
        i = self.step_no
        self.step_no += 1
        if self.beat is not None:
            self.beat.op(i)
        self.stats.count(op.kind)
        if not isinstance(op, ScaleOp):
            raise OpError(f"{op.kind} is not a production-scale op")
        if not op.supported_by(self.tier):
            return Outcome(error=ContractViolation(f"{op.kind}: not in this kernel set"))
        if isinstance(op, HostileOp) and self.hostile == "off":
            self.stats.contract_ops += 1
            return Outcome(error=ContractViolation(f"{op.kind}: a hostile probe, and hostile probes are off"))
        try:
            err = op.invalid(self)
            if err is not None:
                self.stats.contract_ops += 1
                return Outcome(error=ContractViolation(err))
            if not isinstance(op, HostileOp):  # a hostile op breaks its clause on purpose
                refused = self._preflight(i, op)
                if refused is not None:
                    return refused
            return op.execute(self, i)
        except Divergence:
            raise
        except Exception as exc:
            d = surfaced(i, op, exc)  # the harness's own copy, a mem_get_info, a red-zone read
            if d is None:
                raise
            raise d from None

    def _preflight(self, i: int, op: ScaleOp) -> Outcome | None:
        """SPEC §2's preconditions of the op's kernel calls (``ScaleOp.preflight``). Broken in a
        generated op (``gate``): kvfuzz's own bug, exit 3 (``gate.GeneratedInvalid``); in a
        replayed or minimized one: a refusal, like ``invalid``'s."""
        if self.gate:
            admit(i, op, lambda: op.preflight(self))
            return None
        try:
            op.preflight(self)
        except ContractViolation as exc:
            self.stats.contract_ops += 1
            return Outcome(error=exc)
        return None

    def finish(self) -> None:
        self._since_state = self.check_every
        self.check(self.step_no, None, [], state=True)

    # ---- the oracles ----------------------------------------------------------------------------
    def check(self, i: int, op: Op | None, compares: list[Compare], *, state: bool = False,
              results_only: bool = False, deferrable: bool = False) -> None:
        """Diff results, then red zones and raw state (when due, or forced by ``state``: the ops
        that write the tables force it); one host read when all agree. ``results_only``: an
        intermediate check of an op that checks the state itself when it ends (a graph op's
        replays): results alone, not counted toward ``check_every``. ``deferrable``: the
        compared tensors are the op's own, never written again (a fresh result buffer, not a
        graph's static one or a far op's cached one), so the read may wait (``defer``)."""
        if not results_only:
            self._since_state += 1
        state = state or (not results_only and self._since_state >= self.check_every)
        self.last = compares
        # The oracle's SPEC §2 flags first: an op that met preflight but whose tensors break a
        # clause is kvfuzz's own bug whatever the target did.
        flags: list[tuple[str, object, torch.Tensor]] = [("pre", name, f) for name, f in self.clauses]
        self.clauses = []
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
            tables = [("raw_v2p", self.o_v2p, self.t_v2p), ("raw_p2v", self.o_p2v, self.t_p2v)]
            if self.t_r2t is not None:
                tables.append(("req_to_token", self.o_r2t, self.t_r2t))
            for name, _, guarded in tables:
                flags.append(("zone", name, guarded.damaged()))
            for name, oracle, guarded in tables:
                flags.append(("state", (name, oracle, guarded.view), torch.ne(oracle, guarded.view).any()))
        if flags:
            self.pending.append((i, op, flags, sum(2 * c.expected.nbytes for c in compares)))
        if not self.pending or (deferrable and not state and len(self.pending) < self.defer
                                and sum(p[3] for p in self.pending) < DEFER_BYTES):
            return
        self._read_pending(i, op)

    def _read_pending(self, i: int, op: Op | None) -> None:
        """One host read of every queued check's flags; the earliest step with a hit is raised."""
        pending, self.pending = self.pending, []
        self.host_reads += 1
        try:
            bad = torch.stack([f for _, _, flags, _ in pending for _, _, f in flags]).tolist()  # the one host read
        except Exception as exc:  # noqa: BLE001 - an asynchronous device fault of the target surfaces here
            raise crash(i, op, exc, f"the device faulted after {op.kind if op else 'the run'}: {exc}") from None
        at = 0
        for step, step_op, flags, _ in pending:
            hits = [(what, item) for (what, item, _), b in zip(flags, bad[at:at + len(flags)]) if b]
            at += len(flags)
            if hits:
                _raise_first(step, step_op, hits)


def _default_defer(tier) -> int:
    env = os.environ.get("KVFUZZ_DEFER_CHECKS")
    if env:
        try:
            return int(env)
        except ValueError:
            raise ContractViolation(f"KVFUZZ_DEFER_CHECKS={env!r}: not an integer") from None
    return DEFER_CUDA if str(tier.device).startswith("cuda") else 1


def _raise_first(i: int, op: Op | None, hits: list) -> None:
    """The divergence of one check's hits, in a fixed order: preconditions, red zones, tables, results."""
    for what, item in sorted(hits, key=lambda h: ("pre", "zone", "state", "cmp").index(h[0])):
        if what == "pre":
            raise GeneratedInvalid(i, op, ContractViolation(
                f"the vector oracle found SPEC §2's {item} broken by the op's tensors", clause=item))
        if what == "zone":
            raise Divergence(i, op, "memory", item, "canary", "overwritten", f"red zone around {item} was written")
        if what == "state":
            name, exp, got = item
            at, e, g = vo.first_mismatch(exp, got)
            raise Divergence(i, op, "state", name, e, g, f"{name}{list(at) if isinstance(at, tuple) else [at]} differs")
        result_divergence(i, op, item)
