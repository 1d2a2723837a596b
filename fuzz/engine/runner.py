"""The differential runner: one op sequence on the spec and on a target, step by step.

Oracles, strongest first (DESIGN.md): per-op results and the whole state against the
spec, the §4 invariants on both sides, red zones around every buffer a kernel touches
and poisoned read-table buffers, contract handling. The first disagreement raises
Divergence naming the step, the oracle and the field, with both values.

Contract handling: when the spec refuses an op, the checked target must refuse it too,
unchanged. Then, depending on ``hostile``, the op's kernels run unchecked on guarded
copies of the tables (a *probe*), where they may do anything but write outside their
buffers:
- ``spec`` (default): only for the classes of hostile input SPEC promises memory safety
  for (``Op.hostile_class``: free_unbind of any input, a read table whose seq_lens
  outgrow max_pages, translate of any id); nothing else a spec refuses is ever run
  unchecked, so a kernel set that trusts its callers meets no input SPEC lets it trust;
- ``off``: no probes (and the generators make no contract violations);
- ``all``: every refused op that calls a kernel is probed (for kernel sets that, like
  ours, promise to mask everything).
A probe runs the kernels alone, never the allocator's host logic, which would otherwise
index torch tensors with whatever a kernel returned for a hostile lane.
"""

from __future__ import annotations

import contextlib

import kvref
from kvref import ContractViolation, InvariantViolation

from . import features, lazy, spec_features
from .gate import GeneratedInvalid, spec_refusal
from .generate import HOSTILE
from .knobs import apply as apply_knobs
from .memory import RawTables, RedZones, index_canary
from .ops import POISON, TABLE_OPS, KernelOp, Op, PoolOp
from .shapes import NEGATIVE_REACH
from .spec_side import SpecSide, unsupported
from .verdict import Divergence, Outcome, RunStats, crash_field, is_cuda_error, surfaced

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

STATE_FIELDS = ("v2p", "p2v", "free_virtual", "holes", "pending", "watermark", "live_pages", "in_flight", "kv")
INPUT = "in:"  # red-zone names of an op's inputs (dropped after the op)
# Red-zone rows around each page table: past the most negative token a generated (valid)
# translate names, so a kernel that trusts it (``v2p[t // page_size]`` for ``t < 0``) reads a
# canary, the same wrong entry on every replay, instead of whatever lies before the buffer (16
# rows left ``t = -38`` a case its replays passed 1 time in 5).
GUARD_ROWS = max(16, NEGATIVE_REACH + 1)

__all__ = ["Divergence", "Outcome", "PoolRun", "RunStats", "TargetSide"]


def first_difference(a, b):
    """(where, a_part, b_part) for the first place two lists/values differ, else None."""
    if a == b:
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"[{i}]", x, y
        return f"len {len(a)} vs {len(b)}", len(a), len(b)
    return "", a, b


class TargetSide:
    """What an op needs to run on the target: the kernel set, the tables (an allocator's
    or raw ones), and its inputs, each a guarded copy registered in ``zones`` under
    ``in:NAME`` (the canary of each chosen by what its values index, see ``memory``)."""

    def __init__(self, kernels, config: kvref.PoolConfig, zones: RedZones, v2p, p2v, alloc=None):
        self.kernels, self.config, self.zones = kernels, config, zones
        self.v2p, self.p2v, self.alloc = v2p, p2v, alloc
        self.device = zones.device

    def _guarded(self, name, values, canary, dtype=None) -> torch.Tensor:
        t = torch.tensor(values, dtype=dtype or torch.int64)
        if self.device.type == "cuda":  # a pinned, asynchronous copy: the host does not wait for the GPU
            t = t.pin_memory()
        return self.zones.guarded(INPUT + name, t, canary)

    def pages(self, name: str, values) -> torch.Tensor:
        return self._guarded(name, values, index_canary(self.config.table_rows, self.zones.guard))

    def tokens(self, name: str, values) -> torch.Tensor:
        c = self.config
        return self._guarded(name, values, index_canary(c.table_rows, self.zones.guard, c.page_size))

    def data(self, name: str, values) -> torch.Tensor:
        return self.tokens(name, values)  # never an index; any canary will do

    def offsets(self, name: str, values, size: int) -> torch.Tensor:
        """Offsets into a buffer of ``size`` elements (indptr into out)."""
        return self._guarded(name, values, index_canary(size, self.zones.guard))

    def positions(self, name: str, values, width: int) -> torch.Tensor:
        return self._guarded(name, values, index_canary(width, self.zones.guard))

    def poisoned(self, values) -> torch.Tensor:
        """A read-table output buffer (int32), poisoned, between poisoned guards."""
        return self._guarded("out", values, POISON, torch.int32)

    def batch(self, op) -> dict:
        """req_to_token (in the op's ``r2t_dtype``), req_pool_indices and seq_lens of a read-table op."""
        rows = op.req_to_token() or [[-1] * op.width]
        r2t = torch.tensor(rows, dtype=getattr(torch, op.r2t_dtype)).reshape(len(rows), op.width)
        if self.device.type == "cuda":
            r2t = r2t.pin_memory()
        c, g = self.config, self.zones.guard
        seq_lens = self._guarded("seq_lens", op.seq_lens, index_canary(op.width, g))
        if self.device.type != "cpu":  # its rows for the trips features, which never read the device
            features.host_copy(seq_lens, op.seq_lens)
        return dict(req_to_token=self.zones.guarded(INPUT + "req_to_token", r2t,
                                                    index_canary(c.table_rows, g, c.page_size)),
                    req_pool_indices=self._guarded("req_pool_indices", op.req_idx, index_canary(len(rows), g)),
                    seq_lens=seq_lens)

    def damage(self) -> list[str]:
        """Damaged red zones (tables and inputs), then forget the inputs checked."""
        return self.damage_later().result()

    def damage_later(self):
        """``damage()``, its one flag read with the next read of the device (``PendingDamage``)."""
        pending = self.zones.damage_later()
        self.forget_inputs()
        return pending

    def damage_and(self, *tensors):
        """``damage()`` and the values of ``tensors``, in one read of the device."""
        out = self.zones.damage_and(*tensors)
        self.forget_inputs()
        return out

    def keep_inputs(self, step: int) -> None:
        """Leave this op's inputs in the zones, renamed per step, for a later check."""
        for name in [n for n in self.zones.buffers if n.startswith(INPUT) and "@" not in n]:
            self.zones.rename(name, f"{name}@{step}")

    def forget_inputs(self) -> None:
        for name in [n for n in self.zones.buffers if n.startswith(INPUT)]:
            self.zones.forget(name)


def _attempt(fn) -> Outcome:
    try:
        return Outcome(fn())
    except ContractViolation as exc:
        return Outcome(error=exc)
    except Exception as exc:  # noqa: BLE001 - any crash of the target is a finding
        return Outcome(crash=exc)


@contextlib.contextmanager
def _surfacing(step: int, op):
    """A sticky CUDA error raised by the harness's next read of a result, table or red zone is
    the crash of the op at ``step`` (``verdict.surfaced``); any other error passes through."""
    try:
        yield
    except Divergence:
        raise
    except Exception as exc:
        d = surfaced(step, op, exc)
        if d is None:
            raise
        raise d from None


def _settle() -> None:
    """A CUDA sequence's set-up (its pools', tables' and red zones' fills, queued) done, and the
    process's pinned host memory made, before op 0 begins: op 0's clock is the op-timeout's, and
    on a GPU shared with many other processes the first read of the device waited for every fill
    queued before it (1.5 s and more on an H100 at a load of 50: a ``timeout`` at op 0 that no
    fresh replay repeats). Before op 0 the set-up has the setting-up allowance (``supervise``)."""
    import torch

    torch.empty((), dtype=torch.bool, pin_memory=True)
    torch.cuda.synchronize()


class PoolRun:
    """A spec allocator and a target allocator (ours, DeviceAllocator, unless the tier names
    another) fed the same ops; the target is driven through the allocator protocol
    (``allocators.Driven``), so ops it lacks are skipped and its snapshot is adapted."""

    def __init__(self, config: kvref.PoolConfig, tier, *, guard_rows: int = GUARD_ROWS, check_every: int = 1,
                 knobs: dict | None = None, hostile: str = "spec", beat=None, strict_knobs: bool = True,
                 known=None):
        if hostile not in HOSTILE:
            raise ValueError(f"hostile must be one of {HOSTILE}, got {hostile!r}")
        self.config = config
        self.tier = tier
        self.knobs = knobs
        self.hostile = hostile
        self.beat = beat  # a worker's heartbeat: told the index of each op before it runs
        self.dropped_knobs = apply_knobs(tier.kernels, knobs, strict=strict_knobs)
        self.side = SpecSide(config, getattr(tier, "spec_rules", ()))
        self.guard_rows = guard_rows
        self.zones = RedZones(guard_rows, tier.device)
        self.full_every = max(1, check_every)
        # Every op is also judged by the checked target (it must accept what the spec
        # accepts) unless checks are spread out (full_every > 1: the GPU throughput mode,
        # where a checked pass would read the tables back on every op); refusals always are.
        self.strict = self.full_every == 1
        from .allocators import drive  # here: importing kvkernels (the default allocator) imports Triton

        self.target = drive(tier, config, checked=self.strict, buffers=self.zones)
        self.stats = RunStats()
        self.step_no = 0
        self.raw_target = RawTables(config.table_rows, guard_rows, tier.device)
        # ``known``: pure ops already checked from the same history (``guide.KnownReads``), every op checked only
        self.known = known if self.strict else None
        self.known_hits = 0  # pure ops whose target result was known, not run again (``_known_step``)
        self.history = None if self.known is None else self.known.begin(
            tier, repr((config, sorted((knobs or {}).items()), hostile, guard_rows)))
        if tier.device == "cuda":
            _settle()

    @property
    def spec(self) -> kvref.Allocator:
        return self.side.spec

    @property
    def raw_spec(self) -> dict:
        return self.side.raw

    def _side(self, zones: RedZones, v2p, p2v, alloc=None) -> TargetSide:
        return TargetSide(self.tier.kernels, self.config, zones, v2p, p2v, alloc)

    # ---- kernel-level ops on the raw tables -------------------------------------
    def _raw_step(self, i: int, op: KernelOp, spec_out: Outcome) -> Outcome:
        if spec_out.error is not None:
            self._refused(i, op, self.raw_spec, self.raw_target.v2p, self.raw_target.p2v)
            return spec_out
        t = self._side(self.raw_target.zones, self.raw_target.v2p, self.raw_target.p2v)
        out = _attempt(lambda: op.target(t))
        self._check_outcome(i, op, out, "the kernel set")
        diff = first_difference(spec_out.result, out.result)
        if diff is not None:
            raise Divergence(i, op, "result", "result", diff[1], diff[2], f"{op.kind} returned different pages")
        damaged, tables = t.damage_and(self.raw_target.v2p, self.raw_target.p2v)  # one read: zones, then state
        self._damaged(i, op, damaged, "raw_")
        for name, got in zip(("v2p", "p2v"), tables):
            diff = first_difference(self.raw_spec[name], got)
            if diff:
                raise Divergence(i, op, "state", f"raw_{name}", diff[1], diff[2], f"raw {name}{diff[0]} differs")
        return spec_out

    # ---- the oracles ------------------------------------------------------------
    def step(self, op: Op, *, generated_valid: bool = False) -> Outcome:
        """Run one op on both sides; raise Divergence at the first disagreement.

        Returns what the spec did (its result, or the ContractViolation it raised).
        ``generated_valid``: a generator emitted the op as valid input; if the spec refuses it
        with a SPEC §2 clause, that is kvfuzz's bug (``gate.GeneratedInvalid``, exit 3), raised
        before the target sees the op."""
        i = self.step_no
        self.step_no += 1
        if self.beat is not None:
            self.beat.op(i)
        self.stats.count(op.kind)
        if not op.supported_by(self.tier) or op.kind in self.target.skips:
            return unsupported(op)
        with _surfacing(i, op):
            return self._step(i, op, generated_valid)

    def _step(self, i: int, op: Op, generated_valid: bool = False) -> Outcome:
        spec_out = self.side.apply(op)
        spec_features.note_op(op, self.spec, spec_out.error)
        if generated_valid and spec_refusal(spec_out.error):
            raise GeneratedInvalid(i, op, spec_out.error)
        if self.known is not None:
            if not op.pure:  # the target's state is a function of these ops (refused ones too: it must not move)
                self.history = self.known.after(self.history, op)
            elif spec_out.error is None:
                return self._known_step(i, op, spec_out)
        if spec_out.error is not None:
            self.stats.contract_ops += 1
            try:
                return self._step_on(i, op, spec_out)
            except Divergence as d:
                d.refusal = str(spec_out.error)
                raise
        return self._step_on(i, op, spec_out)

    def _known_step(self, i: int, op: Op, spec_out: Outcome) -> Outcome:
        """A pure op the spec accepts: not run on the target where the same op, from the same
        history of state-changing ops, already ran and passed every check (``known``): the
        target is a function of that history, so it would again; what its launches reached is
        replayed instead (``known.replay``). Otherwise run, and known once it passed."""
        key = (self.history, op)
        if self.known.replay(key):
            self.known_hits += 1
            return spec_out
        with self.known.recording(key):
            return self._step_on(i, op, spec_out)

    def _step_on(self, i: int, op: Op, spec_out: Outcome) -> Outcome:
        if isinstance(op, KernelOp):
            return self._raw_step(i, op, spec_out)
        if spec_out.error is not None:
            self._contract(i, op, spec_out.error)
            return spec_out
        t = self._side(self.zones, self.target.v2p, self.target.p2v, self.target)
        tgt_out = _attempt(lambda: op.target(t))
        self._check_outcome(i, op, tgt_out, "the target")
        diff = first_difference(spec_out.result, tgt_out.result)
        if diff is not None:
            where, a, b = diff
            raise Divergence(i, op, "result", op.result_field, a, b,
                             f"{op.kind} returned different values at {where or 'top level'}")
        full = i % self.full_every == 0 or op.full_check
        if not (self.strict or full):
            t.keep_inputs(i)  # their red zones are judged at the next check
            return spec_out
        # The red zones, then the state: the zones' flag rides on the state's read of the device.
        pending = t.damage_later()
        if full:
            self.check_state(i, op, before=lambda: self._damaged(i, op, pending.result()))
        else:
            self._check_tables(i, op, before=lambda: self._damaged(i, op, pending.result()))
        return spec_out

    @staticmethod
    def _check_outcome(i: int, op: Op, out: Outcome, who: str) -> None:
        if out.crash is not None:
            raise Divergence(i, op, "crash", crash_field(out.crash), None, repr(out.crash),
                             f"{who} raised {type(out.crash).__name__}: {out.crash}")
        if out.error is not None:
            raise Divergence(i, op, "contract", "spurious", None, str(out.error),
                             f"{who} refused a call the spec accepts: {out.error}")

    def _check_tables(self, i: int, op: Op, before=None) -> None:
        v2p, p2v = self.target.v2p, self.target.p2v
        flat = torch.cat([v2p.reshape(-1).to(torch.int64), p2v.reshape(-1).to(torch.int64)]).tolist()  # one read
        got = [flat[:v2p.numel()], flat[v2p.numel():]]
        if before is not None:
            before()
        for name, values in zip(("v2p", "p2v"), got):
            diff = first_difference(getattr(self.spec, name), values)
            if diff:
                raise Divergence(i, op, "state", name, diff[1], diff[2], f"{name}{diff[0]} differs")

    def check_state(self, i: int, op: Op | None, before=None) -> None:
        """The state, field by field, then the invariants; ``before`` (the red zones' verdict)
        is judged once the snapshots are read, ahead of any of their differences."""
        spec_snap, tgt_snap = self.spec.snapshot(), self._target_state(i, op, self.target.snapshot)
        if before is not None:
            before()
        for name in self.target.fields:  # STATE_FIELDS, less what the allocator lacks
            diff = first_difference(self.target.view(name, spec_snap[name]), tgt_snap[name])
            if diff:
                raise Divergence(i, op, "state", name, diff[1], diff[2], f"{name}{diff[0]} differs")
        # The target's snapshot now equals the spec's field for field (every field it has),
        # and the invariants read nothing else: judging the spec's snapshot judges both.
        try:
            kvref.check_all(self.config, spec_snap, self.spec.written)
        except InvariantViolation as exc:
            raise Divergence(i, op, "invariant", exc.name, None, None, str(exc)) from None
        if self.spec.chain is not None:
            self._check_chain(i, op)

    def _check_chain(self, i: int, op: Op | None) -> None:
        """The other members of a chain, field by field, its gates, then the chain's invariants
        (docs/spec.md §6); pool 0 is the pool ``check_state`` has just compared."""
        spec_snap, tgt_snap = self.spec.chain.snapshot(), self._target_state(i, op, self.target.chain_snapshot)
        for pool, (spec_pool, tgt_pool) in enumerate(zip(spec_snap["pools"], tgt_snap["pools"])):
            if pool == 0:
                continue
            for name in self.target.fields:
                diff = first_difference(self.target.view(name, spec_pool[name]), tgt_pool[name])
                if diff:
                    raise Divergence(i, op, "state", f"pool{pool}.{name}", diff[1], diff[2],
                                     f"pool {pool}'s {name}{diff[0]} differs")
        if spec_snap["gates"] != tgt_snap["gates"]:
            raise Divergence(i, op, "state", "gates", spec_snap["gates"], tgt_snap["gates"], "the move gates differ")
        try:
            kvref.invariants.check_chain(self.spec.chain)
        except InvariantViolation as exc:
            raise Divergence(i, op, "invariant", exc.name, None, None, str(exc)) from None

    @staticmethod
    def _target_state(i: int, op: Op | None, read):
        """The target's state; an exception of the target while it gives it (its own consistency
        check, say) is its crash at this op."""
        out = _attempt(read)
        if out.error is not None or out.crash is not None:
            exc = out.error or out.crash
            raise Divergence(i, op, "crash", crash_field(exc), None, repr(exc),
                             f"the target raised {type(exc).__name__} while its state was read: {exc}")
        return out.result

    @classmethod
    def _memory(cls, i: int, op: Op, t: TargetSide, tables: str = "") -> None:
        """A memory divergence if a red zone changed; ``tables`` prefixes the tables' names
        (``raw_`` for the raw tables)."""
        cls._damaged(i, op, t.damage(), tables)

    @staticmethod
    def _damaged(i: int, op: Op, damaged: list[str], tables: str = "") -> None:
        if damaged:
            names = [n[len(INPUT):].split("@")[0] if n.startswith(INPUT) else tables + n for n in damaged]
            raise Divergence(i, op, "memory", names[0], "canary", "overwritten",
                             f"red zone around {', '.join(names)} was written")

    def _contract(self, i: int, op: PoolOp, spec_error: ContractViolation) -> None:
        if op.checked_refusal and self.target.refuses(op):
            before = self.target.snapshot()
            t = self._side(self.zones, self.target.v2p, self.target.p2v, self.target)
            self.target.checked = True
            try:
                tgt_out = _attempt(lambda: op.target(t))
            finally:
                self.target.checked = self.strict
            t.forget_inputs()
            if tgt_out.crash is not None:
                raise Divergence(i, op, "crash", crash_field(tgt_out.crash), str(spec_error), repr(tgt_out.crash),
                                 f"checked target crashed instead of raising ContractViolation: {tgt_out.crash}")
            if tgt_out.error is None:
                raise Divergence(i, op, "contract", "not-raised", str(spec_error), None,
                                 f"spec raised ContractViolation ({spec_error}), checked target did not")
            after = self.target.snapshot()
            for name in self.target.fields:
                if before[name] != after[name]:
                    raise Divergence(i, op, "contract", "unchanged", before[name], after[name],
                                     f"checked target changed {name} while refusing the call")
        self._refused(i, op, self.spec, self.target.v2p, self.target.p2v)

    def _refused(self, i: int, op: Op, spec_state, v2p, p2v) -> None:
        """Probe a refused op's kernels unchecked, if its hostile class allows it."""
        if self.hostile == "off" or not op.calls_kernels:
            return
        cls = op.hostile_class(spec_state, self.tier)
        if cls is None and self.hostile == "spec":
            return
        cls = cls or f"{op.kind}:unpromised"
        # The probe's red zones reach every id the op names, so a stray store lands in a
        # canary (and is reported) instead of corrupting the fuzzer's own memory.
        tables = RawTables.copy_of(v2p, p2v, self._guard_for(op))
        t = self._side(tables.zones, tables.v2p, tables.p2v)
        out = _attempt(lambda: op.probe(t))
        if out.crash is not None and is_cuda_error(out.crash):
            raise Divergence(i, op, "crash", crash_field(out.crash), None, repr(out.crash),
                             f"an unchecked {cls} probe faulted: {out.crash}")
        self.stats.hostile[cls] = self.stats.hostile.get(cls, 0) + 1
        self._memory(i, op, t, "raw_" if isinstance(op, KernelOp) else "")
        if isinstance(op, TABLE_OPS) and out.result is not None:
            outside = op.outside_writes(out.result)
            if outside is not None:
                where, value = outside
                raise Divergence(i, op, "memory", "out", POISON, value, f"{op.kind} wrote {where}")

    def _guard_for(self, op: Op) -> int:
        return max(self.guard_rows, op.reach(self.config) + 1)

    def finish(self) -> None:
        with _surfacing(self.step_no, None):  # a sticky CUDA error met by the final check
            t = self._side(self.zones, self.target.v2p, self.target.p2v, self.target)
            self._memory(self.step_no, None, t)  # the inputs still waiting for their check, and the tables
            self.check_state(self.step_no, None)
