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
from kvkernels.allocator import DeviceAllocator, canary_intact, guarded
from kvref import ContractViolation, InvariantViolation

from .backends import Tier
from .knobs import apply as apply_knobs
from .ops import POISON, RAW_OPS, TABLE_OPS, poisoned_out, req_to_token_rows

STATE_FIELDS = ("v2p", "p2v", "free_virtual", "holes", "pending", "watermark", "live_pages", "in_flight", "kv")


@dataclass
class Divergence(Exception):
    step: int
    op: dict
    oracle: str
    field: str
    spec: object = None
    target: object = None
    message: str = ""

    @property
    def signature(self) -> dict:
        return {"op": self.op["op"], "oracle": self.oracle, "field": self.field}

    def __str__(self) -> str:
        return (f"step {self.step} {self.op['op']}: {self.oracle}/{self.field}: {self.message} "
                f"(spec {_short(self.spec)}, target {_short(self.target)})")

    def to_json(self) -> dict:
        return {"step": self.step, "op": self.op, "oracle": self.oracle, "field": self.field,
                "spec": _jsonable(self.spec), "target": _jsonable(self.target), "message": self.message}


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
    skipped_ops: int = 0
    by_kind: dict = field(default_factory=dict)


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
        self.target = cls(config, tier.kernels, tier.device, checked=True, guard_rows=guard_rows)
        self.full_every = max(1, full_every)
        self.stats = RunStats()
        self.step_no = 0
        rows = config.table_rows
        self.raw_spec = {"v2p": [0] + [-1] * (rows - 1), "p2v": [0] + [-1] * (rows - 1)}
        self.raw_target = RawTables(rows, guard_rows, tier.device)

    # ---- kernel-level ops on the raw tables -------------------------------------
    def _raw_spec_do(self, op: dict) -> Outcome:
        t, kind = self.raw_spec, op["op"]
        try:
            if kind == "k_bind":
                return Outcome(kvref.kernels.bind(t["v2p"], t["p2v"], op["v"], op["p"]))
            if kind == "k_alloc_bind":
                return Outcome(kvref.kernels.alloc_bind(t["v2p"], t["p2v"], op["v"], op["start"]))
            return Outcome(kvref.kernels.free_unbind(t["v2p"], t["p2v"], op["v"]))
        except ContractViolation as exc:
            return Outcome(error=exc)

    def _raw_target_do(self, tables: "RawTables", op: dict) -> Outcome:
        k, kind = self.tier.kernels, op["op"]
        try:
            if kind == "k_bind":
                return Outcome(k.bind_inplace(self._long(op["v"]), self._long(op["p"]), tables.v2p, tables.p2v))
            if kind == "k_alloc_bind":
                return Outcome(k.alloc_bind_inplace(self._long(op["v"]), tables.v2p, tables.p2v, op["start"]).tolist())
            return Outcome(k.free_unbind_inplace(self._long(op["v"]), tables.v2p, tables.p2v).tolist())
        except ContractViolation as exc:
            return Outcome(error=exc)
        except Exception as exc:  # noqa: BLE001 - any crash of the target is a finding
            return Outcome(crash=exc)

    def _raw_step(self, i: int, op: dict) -> Outcome:
        spec_out = self._raw_spec_do(op)
        if spec_out.error is not None:
            # The kernels have no checked mode: unchecked, they must stay inside the tables.
            self.stats.contract_ops += 1
            probe = self.raw_target.clone(max(self.raw_target.guard, self._guard_for(op)))
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
            raise Divergence(i, op, "result", "result", diff[1], diff[2], f"{op['op']} returned different pages")
        self._raw_memory(i, op, self.raw_target)
        for name in ("v2p", "p2v"):
            diff = first_difference(self.raw_spec[name], getattr(self.raw_target, name).tolist())
            if diff:
                raise Divergence(i, op, "state", f"raw_{name}", diff[1], diff[2], f"raw {name}{diff[0]} differs")
        return spec_out

    def _raw_memory(self, i: int, op: dict, tables: "RawTables") -> None:
        damaged = tables.damage()
        if damaged:
            raise Divergence(i, op, "memory", f"raw_{damaged[0]}", "canary", "overwritten",
                             f"red zone around raw {', '.join(damaged)} was written")

    # ---- one op on each side --------------------------------------------------
    def _spec_do(self, op: dict) -> Outcome:
        s, kind = self.spec, op["op"]
        try:
            if kind == "alloc":
                return Outcome(s.alloc(op["n"]))
            if kind == "free":
                return Outcome(s.free(op["tokens"]))
            if kind == "flush":
                return Outcome(s.flush(op["urgent"]))
            if kind == "forward":
                return Outcome(s.forward(op["tokens"]))
            if kind == "fire":
                return Outcome(s.fire())
            if kind == "write":
                return Outcome(s.write(op["tokens"], op["stamps"]))
            if kind == "read":
                return Outcome(s.read(op["tokens"]))
            if kind == "translate":
                return Outcome(s.translate(op["loc"]))
            if kind == "clear":
                return Outcome(s.clear())
            out = poisoned_out(op)
            if kind == "read_table":
                s.read_table(req_to_token=req_to_token_rows(op), req_pool_indices=op["req_idx"],
                             seq_lens=op["seq_lens"], max_pages=op["max_pages"], out=out)
            else:
                s.read_table_packed(req_to_token=req_to_token_rows(op), req_pool_indices=op["req_idx"],
                                    seq_lens=op["seq_lens"], indptr=op["indptr"], max_tokens=op["max_tokens"],
                                    out=out, kv_start_idx=op["kv_start"])
            return Outcome(out)
        except ContractViolation as exc:
            return Outcome(error=exc)

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.tier.device)

    def _table_call(self, alloc: DeviceAllocator, op: dict):
        dev = self.tier.device
        width = op["width"]
        rows = req_to_token_rows(op) or [[-1] * width]
        r2t = torch.tensor(rows, dtype=torch.int64, device=dev).reshape(len(rows), width)
        kw = dict(req_to_token=r2t, req_pool_indices=self._long(op["req_idx"]), seq_lens=self._long(op["seq_lens"]))
        ref_out = poisoned_out(op)
        out = torch.tensor(ref_out, dtype=torch.int32, device=dev)
        if op["op"] == "read_table":
            bs = len(op["req_idx"])
            view = out[:, : op["max_pages"]] if bs else out[:0, : op["max_pages"]]
            alloc.build_read_table(legacy=op["legacy"], max_pages=op["max_pages"], out=view, **kw)
        else:
            kv_start = None if op["kv_start"] is None else self._long(op["kv_start"])
            alloc.build_read_table_packed(indptr=self._long(op["indptr"]), max_tokens=op["max_tokens"],
                                          out=out, kv_start_idx=kv_start, **kw)
        return out.tolist()

    def _target_do(self, alloc: DeviceAllocator, op: dict) -> Outcome:
        kind = op["op"]
        try:
            if kind == "alloc":
                r = alloc.alloc(op["n"])
                return Outcome(None if r is None else r.tolist())
            if kind == "free":
                return Outcome(alloc.free(self._long(op["tokens"])))
            if kind == "flush":
                return Outcome(alloc.flush(op["urgent"]))
            if kind == "forward":
                return Outcome(alloc.forward(self._long(op["tokens"])))
            if kind == "fire":
                return Outcome(alloc.fire())
            if kind == "write":
                return Outcome(alloc.write(self._long(op["tokens"]), self._long(op["stamps"])))
            if kind == "read":
                return Outcome(alloc.read(self._long(op["tokens"])).tolist())
            if kind == "translate":
                return Outcome(alloc.translate(self._long(op["loc"])).tolist())
            if kind == "clear":
                return Outcome(alloc.clear())
            return Outcome(self._table_call(alloc, op))
        except ContractViolation as exc:
            return Outcome(error=exc)
        except Exception as exc:  # noqa: BLE001 - any crash of the target is a finding
            return Outcome(crash=exc)

    # ---- the oracles ------------------------------------------------------------
    def supports(self, op: dict) -> bool:
        if op["op"] == "read_table_packed":
            return self.tier.has("build_kv_read_table_packed")
        if op["op"] == "read_table" and op["legacy"]:
            return self.tier.has("build_kv_read_table_legacy")
        return True

    def step(self, op: dict) -> Outcome:
        """Run one op on both sides; raise Divergence at the first disagreement.

        Returns what the spec did (its result, or the ContractViolation it raised)."""
        i = self.step_no
        self.step_no += 1
        self.stats.ops += 1
        kind = op["op"]
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        if not self.supports(op):
            self.stats.skipped_ops += 1
            return Outcome(error=ContractViolation(f"{kind}: not in this kernel set"))
        if kind in RAW_OPS:
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
            name = "out" if kind in TABLE_OPS else "result"
            diverge("result", name, a, b, f"{kind} returned different values at {where or 'top level'}")
        self._memory(i, op, self.target)
        if i % self.full_every == 0 or kind in ("flush", "clear"):
            self.check_state(i, op)
        else:
            self._check_tables(i, op)
        return spec_out

    def _check_tables(self, i: int, op: dict) -> None:
        for name in ("v2p", "p2v"):
            diff = first_difference(getattr(self.spec, name), getattr(self.target, name).tolist())
            if diff:
                raise Divergence(i, op, "state", name, diff[1], diff[2], f"{name}{diff[0]} differs")

    def check_state(self, i: int, op: dict) -> None:
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

    def _memory(self, i: int, op: dict, alloc: DeviceAllocator) -> None:
        damaged = alloc.red_zone_damage()
        if damaged:
            raise Divergence(i, op, "memory", damaged[0], "canary", "overwritten",
                             f"red zone around {', '.join(damaged)} was written")

    def _contract(self, i: int, op: dict, spec_error: ContractViolation) -> None:
        kind = op["op"]
        if kind != "translate":
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
        probe = self.target.clone(checked=False, guard_rows=self._guard_for(op))
        out = self._target_do(probe, op)
        self._memory(i, op, probe)
        if kind in TABLE_OPS and out.result is not None:
            self._untouched_outside(i, op, out.result)

    def _guard_for(self, op: dict) -> int:
        ps, rows = self.config.page_size, self.config.table_rows
        ids = [t for key in ("tokens", "loc") for t in op.get(key, ())]
        ids += [t for r in op.get("rows", ()) for t in r]
        reach = max([0] + [t // ps - rows + 1 for t in ids] + [-(t // ps) for t in ids])
        pages = list(op.get("v", ())) + list(op.get("p", ()))
        if "start" in op:
            pages += [op["start"], op["start"] + len(op["v"])]
        reach = max([reach] + [x - rows + 1 for x in pages] + [-x for x in pages])
        return max(self.target.guard_rows, reach + 1)

    def _untouched_outside(self, i: int, op: dict, out: list) -> None:
        """A contract-breaking read table still writes nothing past max_pages / its rows."""
        if op["op"] == "read_table":
            bs, mp = len(op["req_idx"]), op["max_pages"]
            for b, row in enumerate(out):
                bad = [c for c, x in enumerate(row) if x != POISON and (b >= bs or c >= mp)]
                if bad:
                    raise Divergence(i, op, "memory", "out", POISON, row[bad[0]],
                                     f"read table wrote out[{b}][{bad[0]}] past max_pages={mp} or bs={bs}")
        else:
            end = op["indptr"][-1] if op["indptr"] else 0
            bad = [j for j, x in enumerate(out) if j >= max(end, 0) and x != POISON]
            if bad:
                raise Divergence(i, op, "memory", "out", POISON, out[bad[0]],
                                 f"packed read table wrote out[{bad[0]}] past indptr[-1]={end}")

    def finish(self) -> None:
        self.check_state(self.step_no, {"op": "end"})


class RawTables:
    """v2p/p2v for kernel-level ops, between red zones, on the target's device."""

    def __init__(self, rows: int, guard: int, device):
        self.rows, self.guard, self.device = rows, guard, device
        self.bufs = {}
        for name in ("v2p", "p2v"):
            self.bufs[name], view = guarded(rows, guard, -1, device)
            view[:1].fill_(0)
            setattr(self, name, view)

    def clone(self, guard: int) -> "RawTables":
        twin = RawTables(self.rows, guard, self.device)
        twin.v2p.copy_(self.v2p)
        twin.p2v.copy_(self.p2v)
        return twin

    def damage(self) -> list[str]:
        return [name for name, buf in self.bufs.items() if not canary_intact(buf, self.guard)]


def replay(config: kvref.PoolConfig, ops: list[dict], tier: Tier, **kw) -> tuple[Divergence | None, PoolRun]:
    run = PoolRun(config, tier, **kw)
    try:
        for op in ops:
            run.step(op)
        run.finish()
    except Divergence as d:
        return d, run
    return None, run

