"""Whether a child's device is still usable: an asynchronous fault, charged to the replay that caused it.

A CUDA fault is asynchronous and sticky. The kernel that stored out of bounds returns at
once, and the error surfaces at whatever next waits for the device: the harness's next read
(then the runner names the op, ``verdict.surfaced``), a later op, or, when the faulty op was
a replay's last, nothing in that replay at all. A reused process then hands the poison to
its next job, which fails in code that has nothing to do with it (its red zones cannot be
allocated): the fault is charged to the wrong replay, the replay that caused it passes, and
the error looks like kvfuzz's own (exit 3).

So after every replay and every fuzzed sequence a child synchronises and allocates once
(``fault_of``). An error there is the replay's: a crash of its last op (``charged``), after
which the child leaves, so no job starts in a poisoned process. The probe allocates on every
device, not only on a GPU: it costs microseconds, and it is how the interpreter's twin of an
asynchronous fault (``tests/fixtures/kernels/foreign/async_fault.py``) is seen at all.
"""

from __future__ import annotations

import torch

from .verdict import Divergence, crash, is_cuda_error


def fault_of(device) -> BaseException | None:
    """The sticky device error this process holds (None: the device answers). Any other
    exception is not the device's and propagates."""
    device = torch.device(device)
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        torch.zeros(1, dtype=torch.int64, device=device).add_(1).tolist()  # the next allocation and read
    except Exception as exc:  # noqa: BLE001 - sorted below: only a device error is an answer
        if is_cuda_error(exc):
            return exc
        raise
    return None


def charged(ops, exc: BaseException) -> Divergence:
    """The crash of a replay whose fault surfaced only after its last op ran: charged to that
    op (the fault may be an earlier op's; a minimizer keeping the signature finds which)."""
    op = ops[-1] if ops else None
    return crash(max(0, len(ops) - 1), op, exc,
                 f"the device faulted during this replay; it surfaced after the last op, when the harness checked "
                 f"the device (launches are asynchronous: the fault may be an earlier op's): {exc}")
