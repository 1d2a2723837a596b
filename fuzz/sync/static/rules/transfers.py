"""Blocking copies between host and device memory: data that starts on the host, or ends there."""

from __future__ import annotations

import ast

from ..records import Family, Rule
from ..vocab import FROM_HOST_DATA, is_dtype, is_literal_cpu, is_true, kwarg, segment

HOST_DATA_TO_DEVICE = Rule(
    "SYNC11", "host-data-to-device", "`torch.tensor(data, device=…)`; `.to(device)`/`.cuda()` of a host tensor",
    "`{form}` builds the data in pageable host memory and copies it to the device with a blocking copy",
    "a copy from pageable host memory is staged through a pinned buffer and the host waits for it",
    "idx = torch.tensor([1, 2], device=self.v2p.device)", "idx = torch.arange(1, 3, device=self.v2p.device)")
SCALAR_STORE = Rule(
    "SYNC12", "scalar-store", "a Python scalar (or a host tensor) stored into a page table through an integer or tensor index: `table[idx] = -1`",
    "page-table store `{form}` of a Python scalar: it becomes a CPU tensor copied from pageable memory before the "
    "scatter, so the host waits (use index_fill_ or a kernel)",
    "index_put_ needs a tensor value: the scalar becomes a CPU tensor, copied to the device with a blocking copy",
    "self.v2p[pages] = -1", "self.v2p.index_fill_(0, pages, -1)",
    variants={"host": "page-table store `{form}` of a host tensor: a blocking host→device copy before the scatter"})
HOST_INDEX = Rule(
    "SYNC14", "host-index", "a host tensor used as an index into a device tensor",
    "`{form}` indexes a device tensor with a host tensor: the index is copied to the device with a blocking copy",
    "the index must live on the device, so it is copied there from pageable memory",
    "rows = self.v2p[torch.tensor([1, 2])]", "rows = self.v2p[torch.arange(1, 3, device=self.v2p.device)]")
BLOCKING_COPY = Rule(
    "SYNC15", "blocking-copy", "`copy_` between host and device without `non_blocking=True`",
    "`{form}` copies between host and device memory without non_blocking=True: the host waits",
    "a blocking copy returns only once the data has arrived",
    "torch.empty(3, dtype=torch.int64).copy_(self.v2p[pages])",
    "torch.empty(3, dtype=torch.int64).pin_memory().copy_(self.v2p[pages], non_blocking=True)")


def _call(ck, node: ast.Call, t: str | None) -> None:
    ev = ck.ev
    if t is not None:
        if t in FROM_HOST_DATA:
            device = kwarg(node, "device")
            data = node.args[0] if node.args else kwarg(node, "data")
            if device is not None and not is_literal_cpu(device) and not (data is not None and ev.is_tensor(data)):
                ck.report(HOST_DATA_TO_DEVICE, node, segment(node))
        return
    if not isinstance(node.func, ast.Attribute):
        return
    meth, recv = node.func.attr, node.func.value
    if meth in ("to", "cuda"):
        target = node.args[0] if node.args else kwarg(node, "device")
        if meth == "to" and is_literal_cpu(target):
            return  # a copy to the host: host-reads reports it
        if ev.is_host(recv) and (meth == "cuda" or (target is not None and not is_dtype(target))):
            if not is_true(kwarg(node, "non_blocking")):
                ck.report(HOST_DATA_TO_DEVICE, node, segment(node))
    elif meth == "copy_" and node.args:
        src = node.args[0]
        crosses = (ev.is_host(recv) and ev.is_tensor(src) and not ev.is_host(src)) or (
            ev.is_host(src) and ev.is_tensor(recv) and not ev.is_host(recv))
        if crosses and not is_true(kwarg(node, "non_blocking")):
            ck.report(BLOCKING_COPY, node, segment(node))
    elif meth in ("index_put_", "index_put") and len(node.args) >= 2 and ev.is_tensor(recv):
        indices, value = node.args[0], node.args[1]
        elts = indices.elts if isinstance(indices, (ast.Tuple, ast.List)) else []
        if not any(ev.is_mask(e) for e in elts) and ev.is_host(value):
            ck.report(SCALAR_STORE, node, segment(node), variant="host")


def _index(ck, node: ast.Subscript, parts: list[ast.expr], store_value: ast.expr | None) -> None:
    ev = ck.ev
    for part in parts:
        if not isinstance(part, ast.Slice) and not ev.is_mask(part) and ev.is_host(part):
            ck.report(HOST_INDEX, node, segment(node))


def _store(ck, target: ast.Subscript, value: ast.expr) -> None:
    """``table[idx] = scalar``; a slice store is a fill_ on a view, a mask store the masked_fill_ fast path."""
    ev = ck.ev
    parts = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
    if any(isinstance(p, ast.Slice) for p in parts) or any(ev.is_mask(p) for p in parts):
        return
    is_table = ev.is_table(target.value)
    advanced = any(ev.is_tensor(p) for p in parts)
    if ev.is_pyscalar(value) and (is_table or (advanced and ev.is_tensor(target.value))):
        ck.report(SCALAR_STORE, target, f"{segment(target)} = {segment(value, 20)}")
    elif ev.is_host(value) and (is_table or ev.is_tensor(target.value)):
        ck.report(SCALAR_STORE, target, f"{segment(target)} = {segment(value, 30)}", variant="host")


FAMILY = Family(
    "transfers", "Blocking copies between host and device",
    (HOST_DATA_TO_DEVICE, SCALAR_STORE, HOST_INDEX, BLOCKING_COPY),
    {"call": _call, "index": _index, "store": _store},
)
