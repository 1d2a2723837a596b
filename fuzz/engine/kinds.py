"""Every op kind of the language, registered by explicit import.

An op record registers itself when its class is defined; this module imports every
module that defines op records, so that ``parse_ops`` knows every kind whichever track
wrote the case. Code that reads ops from JSON (case files, a worker's report, an
executor's job) parses them here, never through an import side effect elsewhere.
"""

from __future__ import annotations

from . import chain_ops as _chain_ops  # noqa: F401 - chain_* kinds
from .compile_check import ops as _compile_ops  # noqa: F401 - c_* kinds
from .ops import Op, OpError
from .production import far as _far_ops  # noqa: F401 - p_read_table_far
from .production import graph as _graph_ops  # noqa: F401 - g_* kinds
from .production import hostile as _hostile_ops  # noqa: F401 - p_*_any / p_*_overflow / p_*_disagree kinds
from .production import ops as _production_ops  # noqa: F401 - p_* kinds

__all__ = ["parse_ops", "kinds"]


def kinds() -> list[str]:
    return list(Op.registry)


def parse_ops(items) -> list[Op]:
    """A list of ops from JSON (or records, passed through); names the bad index."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Op):
            out.append(item)
            continue
        try:
            out.append(Op.from_json(item))
        except OpError as exc:
            raise OpError(f"ops[{i}]: {exc}") from None
    return out


