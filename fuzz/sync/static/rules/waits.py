"""Explicit waits: calls whose whole job is to block the host until the device is done."""

from __future__ import annotations

import ast

from ..records import Family, Rule
from ..vocab import segment

SYNCHRONIZE = Rule(
    "SYNC13", "synchronize", "`torch.cuda.synchronize()`, `stream.synchronize()`, `event.synchronize()`",
    "`{form}` blocks the host until the device has finished its queued work",
    "it is the wait itself; order work with streams and events (`event.wait(stream)`) instead",
    "torch.cuda.synchronize()")


def _call(ck, node: ast.Call, t: str | None) -> None:
    name = t.split(".")[-1] if t is not None else (node.func.attr if isinstance(node.func, ast.Attribute) else None)
    if name == "synchronize":
        ck.report(SYNCHRONIZE, node, segment(node))


FAMILY = Family("waits", "Explicit waits", (SYNCHRONIZE,), {"call": _call})
