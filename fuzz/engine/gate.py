"""The gate every generated valid op passes before the target runs (DESIGN.md, Verdicts).

What counts as valid input is the spec's to say: an op a generator emits as valid is
checked against SPEC §2's named preconditions (``kvref.preconditions``) before any kernel
sees it. An op that fails one is kvfuzz's own bug, never a finding against the kernels: the
run ends as an internal harness error (exit 3) naming the op and the clause. Only hostile
ops break a precondition, on purpose, and each is labelled with the clause it breaks.

One helper for every track: the small track's spec side is kvref itself (its kernel-level
functions call the checks, so a refusal carrying a clause is the gate's answer); the
production track's ops check their own parameters (``ScaleOp.preflight``), which costs
host arithmetic only, never a device read.
"""

from __future__ import annotations

import json

from kvref import ContractViolation


class GeneratedInvalid(RuntimeError):
    """A generator emitted as valid an op that breaks a SPEC §2 precondition (kvfuzz's bug).
    ``clause``: the precondition's name; ``op``: the op."""

    def __init__(self, step: int, op, exc: ContractViolation):
        self.clause, self.op, self.step = exc.clause, op, step
        try:
            text = json.dumps(op.to_json())
        except Exception:  # noqa: BLE001 - the message must be written whatever the op holds
            text = repr(op)
        super().__init__(f"kvfuzz generated step {step} {op.kind} as valid input, but it breaks SPEC §2 "
                         f"precondition {exc.clause}: {getattr(exc, 'detail', exc)}; op: {text}")


# Each hostile class (``Op.hostile_class``, ``HostileOp.probe_class``: the inputs SPEC §2 promises
# memory safety for) with the clauses its inputs break on purpose. ``translate`` breaks none:
# translate has no precondition; its class is a data op the allocator refuses (§3) whose memory
# goes through translate.
HOSTILE_CLAUSES: dict[str, tuple[str, ...]] = {
    "free_unbind": ("free_unbind.ids_are_ints", "free_unbind.ids_in_range", "free_unbind.v_unique",
                    "free_unbind.bound", "free_unbind.v2p_in_table"),
    "read_table_seq_lens": ("read_table.max_pages_covers_rows",),
    "read_table_packed_seq_lens": ("read_table_packed.indptr_consistent",),
    "translate": (),
}


def spec_refusal(exc) -> bool:
    """Whether a refusal names a SPEC §2 clause (an allocator-level refusal of §3 does not)."""
    return isinstance(exc, ContractViolation) and getattr(exc, "clause", None) is not None


def admit(step: int, op, check) -> None:
    """Run ``check()`` (an op's preconditions); raise GeneratedInvalid if one is broken."""
    try:
        check()
    except ContractViolation as exc:
        if exc.clause is None:
            raise
        raise GeneratedInvalid(step, op, exc) from None
