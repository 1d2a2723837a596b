"""The differential runner: one op sequence on the spec and on a target, step by step.

Oracles, strongest first (DESIGN.md): per-op results and the whole state against the
spec, the §4 invariants on both sides, red zones and poisoned read-table buffers,
contract handling (the checked target must refuse what the spec refuses, unchanged,
and an unchecked twin must stay inside its buffers). The first disagreement raises
Divergence naming the step, the oracle and the field, with both values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import kvref
from kvkernels.allocator import DeviceAllocator
from kvref import ContractViolation, InvariantViolation

from .case import Signature
from .knobs import apply as apply_knobs
from .memory import RawTables, RedZones
from .ops import POISON, TABLE_OPS, KernelOp, Op, PoolOp, parse_ops
from .tiers import Tier

STATE_FIELDS = ("v2p", "p2v", "free_virtual", "holes", "pending", "watermark", "live_pages", "in_flight", "kv")
END = "end"  # the signature's op kind for a divergence found by the final check


@dataclass
class Divergence(Exception):
    step: int
    op: Op | None  # None: the final state check after the last op
    oracle: str
    field: str
    spec: object = None
    target: object = None
    message: str = ""

    @property
    def kind(self) -> str:
        return END if self.op is None else self.op.kind

    @property
    def signature(self) -> Signature:
        return Signature(self.kind, self.oracle, self.field)

    def __str__(self) -> str:
        return (f"step {self.step} {self.kind}: {self.oracle}/{self.field}: {self.message} "
                f"(spec {_short(self.spec)}, target {_short(self.target)})")

    def to_json(self) -> dict:
        return {"step": self.step, "op": {"op": END} if self.op is None else self.op.to_json(),
                "oracle": self.oracle, "field": self.field, "spec": _jsonable(self.spec),
                "target": _jsonable(self.target), "message": self.message}


def _short(v, limit=160) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


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


@dataclass
class Outcome:
    """What one op did on one side."""
    result: object = None
    error: ContractViolation | None = None
    crash: BaseException | None = None


@dataclass
class RunStats:
    ops: int = 0
    contract_ops: int = 0
    by_kind: dict = field(default_factory=dict)


class TargetSide:
    """What a pool op needs to run on the target: the allocator and its device."""

    def __init__(self, alloc: DeviceAllocator, device):
        self.alloc = alloc
        self.device = device

    def long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def int32(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def batch(self, op) -> dict:
        """req_to_token, req_pool_indices and seq_lens of a read-table op, as tensors."""
        rows = op.req_to_token() or [[-1] * op.width]
        r2t = torch.tensor(rows, dtype=torch.int64, device=self.device).reshape(len(rows), op.width)
        return dict(req_to_token=r2t, req_pool_indices=self.long(op.req_idx), seq_lens=self.long(op.seq_lens))


def _attempt(fn) -> Outcome:
    try:
        return Outcome(fn())
    except ContractViolation as exc:
        return Outcome(error=exc)
    except Exception as exc:  # noqa: BLE001 - any crash of the target is a finding
        return Outcome(crash=exc)


class PoolRun:
    """A spec allocator and a target DeviceAllocator fed the same ops."""

    def __init__(self, config: kvref.PoolConfig, tier: Tier, *, guard_rows: int = 16, full_every: int = 1,
                 knobs: dict | None = None):
        self.config = config
        self.tier = tier
        self.knobs = knobs
        apply_knobs(tier.kernels, knobs)
        self.spec = kvref.Allocator(config)
        cls = tier.allocator_cls or DeviceAllocator
        self.guard_rows = guard_rows
        self.zones = RedZones(guard_rows, tier.device)
        self.target = cls(config, tier.kernels, tier.device, checked=True, buffers=self.zones)
        self.full_every = max(1, full_every)
        self.stats = RunStats()
        self.step_no = 0
        rows = config.table_rows
        self.raw_spec = {"v2p": [0] + [-1] * (rows - 1), "p2v": [0] + [-1] * (rows - 1)}
        self.raw_target = RawTables(rows, guard_rows, tier.device)

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.tier.device)

    # ---- kernel-level ops on the raw tables -------------------------------------
    def _raw_spec_do(self, op: KernelOp) -> Outcome:
        try:
            return Outcome(op.spec(self.raw_spec["v2p"], self.raw_spec["p2v"]))
        except ContractViolation as exc:
            return Outcome(error=exc)

    def _raw_target_do(self, tables: RawTables, op: KernelOp) -> Outcome:
        return _attempt(lambda: op.target(self.tier.kernels, tables, self._long))

    def _raw_step(self, i: int, op: KernelOp) -> Outcome:
        spec_out = self._raw_spec_do(op)
        if spec_out.error is not None:
            # The kernels have no checked mode: unchecked, they must stay inside the tables.
            self.stats.contract_ops += 1
            probe = self.raw_target.clone(self._guard_for(op))
            self._raw_target_do(probe, op)
            self._raw_memory(i, op, probe)
            return spec_out
        out = self._raw_target_do(self.raw_target, op)
        if out.crash is not None:
            raise Divergence(i, op, "crash", type(out.crash).__name__, None, repr(out.crash),
                             f"the target raised {type(out.crash).__name__}: {out.crash}")
        if out.error is not None:
            raise Divergence(i, op, "contract", "spurious", None, str(out.error),
                             f"the kernel set refused a call the spec accepts: {out.error}")
        diff = first_difference(spec_out.result, out.result)
        if diff is not None:
            raise Divergence(i, op, "result", "result", diff[1], diff[2], f"{op.kind} returned different pages")
        self._raw_memory(i, op, self.raw_target)
        for name in ("v2p", "p2v"):
            diff = first_difference(self.raw_spec[name], getattr(self.raw_target, name).tolist())
            if diff:
                raise Divergence(i, op, "state", f"raw_{name}", diff[1], diff[2], f"raw {name}{diff[0]} differs")
        return spec_out

    def _raw_memory(self, i: int, op: Op, tables: RawTables) -> None:
        damaged = tables.damage()
        if damaged:
            raise Divergence(i, op, "memory", f"raw_{damaged[0]}", "canary", "overwritten",
                             f"red zone around raw {', '.join(damaged)} was written")

    # ---- one op on each side --------------------------------------------------
    def _spec_do(self, op: PoolOp) -> Outcome:
        try:
            return Outcome(op.spec(self.spec))
        except ContractViolation as exc:
            return Outcome(error=exc)

    def _target_do(self, alloc: DeviceAllocator, op: PoolOp) -> Outcome:
        return _attempt(lambda: op.target(TargetSide(alloc, self.tier.device)))

    # ---- the oracles ------------------------------------------------------------
    def step(self, op: Op) -> Outcome:
        """Run one op on both sides; raise Divergence at the first disagreement.

        Returns what the spec did (its result, or the ContractViolation it raised)."""
        i = self.step_no
        self.step_no += 1
        self.stats.ops += 1
        self.stats.by_kind[op.kind] = self.stats.by_kind.get(op.kind, 0) + 1
        if not op.supported_by(self.tier):
            return Outcome(error=ContractViolation(f"{op.kind}: not in this kernel set"))
        if isinstance(op, KernelOp):
            return self._raw_step(i, op)
        spec_out = self._spec_do(op)

        def diverge(oracle, fld, spec, target, msg):
            raise Divergence(i, op, oracle, fld, spec, target, msg)

        if spec_out.error is not None:
            self.stats.contract_ops += 1
            self._contract(i, op, spec_out.error)
            return spec_out
        tgt_out = self._target_do(self.target, op)
        if tgt_out.crash is not None:
            diverge("crash", type(tgt_out.crash).__name__, None, repr(tgt_out.crash),
                    f"the target raised {type(tgt_out.crash).__name__}: {tgt_out.crash}")
        if tgt_out.error is not None:
            diverge("contract", "spurious", None, str(tgt_out.error),
                    f"the target refused a call the spec accepts: {tgt_out.error}")
        diff = first_difference(spec_out.result, tgt_out.result)
        if diff is not None:
            where, a, b = diff
            diverge("result", op.result_field, a, b, f"{op.kind} returned different values at {where or 'top level'}")
        self._memory(i, op, self.zones)
        if i % self.full_every == 0 or op.full_check:
            self.check_state(i, op)
        else:
            self._check_tables(i, op)
        return spec_out

    def _check_tables(self, i: int, op: Op) -> None:
        for name in ("v2p", "p2v"):
            diff = first_difference(getattr(self.spec, name), getattr(self.target, name).tolist())
            if diff:
                raise Divergence(i, op, "state", name, diff[1], diff[2], f"{name}{diff[0]} differs")

    def check_state(self, i: int, op: Op | None) -> None:
        spec_snap, tgt_snap = self.spec.snapshot(), self.target.snapshot()
        for name in STATE_FIELDS:
            diff = first_difference(spec_snap[name], tgt_snap[name])
            if diff:
                raise Divergence(i, op, "state", name, diff[1], diff[2], f"{name}{diff[0]} differs")
        # The target's snapshot now equals the spec's field for field, and the invariants
        # read nothing else: judging the spec's snapshot judges both sides at once.
        try:
            kvref.check_all(self.config, spec_snap, self.spec.written)
        except InvariantViolation as exc:
            raise Divergence(i, op, "invariant", exc.name, None, None, str(exc)) from None

    def _memory(self, i: int, op: Op, zones: RedZones) -> None:
        damaged = zones.damage()
        if damaged:
            raise Divergence(i, op, "memory", damaged[0], "canary", "overwritten",
                             f"red zone around {', '.join(damaged)} was written")

    def _contract(self, i: int, op: PoolOp, spec_error: ContractViolation) -> None:
        if op.checked_refusal:
            before = self.target.snapshot()
            tgt_out = self._target_do(self.target, op)
            if tgt_out.crash is not None:
                raise Divergence(i, op, "crash", type(tgt_out.crash).__name__, str(spec_error), repr(tgt_out.crash),
                                 f"checked target crashed instead of raising ContractViolation: {tgt_out.crash}")
            if tgt_out.error is None:
                raise Divergence(i, op, "contract", "not-raised", str(spec_error), None,
                                 f"spec raised ContractViolation ({spec_error}), checked target did not")
            after = self.target.snapshot()
            for name in STATE_FIELDS:
                if before[name] != after[name]:
                    raise Divergence(i, op, "contract", "unchanged", before[name], after[name],
                                     f"checked target changed {name} while refusing the call")
        # Unchecked, the target may do anything but write outside its buffers. The probe's
        # red zones reach every id the op names, so a stray store lands in a canary (and is
        # reported) instead of corrupting the fuzzer's own memory under the interpreter.
        zones = RedZones(self._guard_for(op), self.tier.device)
        probe = self.target.clone(checked=False, buffers=zones)
        out = self._target_do(probe, op)
        self._memory(i, op, zones)
        if isinstance(op, TABLE_OPS) and out.result is not None:
            outside = op.outside_writes(out.result)
            if outside is not None:
                where, value = outside
                raise Divergence(i, op, "memory", "out", POISON, value, f"{op.kind} wrote {where}")

    def _guard_for(self, op: Op) -> int:
        return max(self.guard_rows, op.reach(self.config) + 1)

    def finish(self) -> None:
        self.check_state(self.step_no, None)


def replay(config: kvref.PoolConfig, ops, tier: Tier, **kw) -> tuple[Divergence | None, PoolRun]:
    """Run ``ops`` (records, or their JSON form) from a fresh pool; the first divergence."""
    run = PoolRun(config, tier, **kw)
    ops = parse_ops(ops)
    try:
        for op in ops:
            run.step(op)
        run.finish()
    except Divergence as d:
        return d, run
    return None, run
