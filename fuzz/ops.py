"""The op language: each op is a small JSON object ``{"op": KIND, ...args}``.

Ops carry literal token ids, so a case file reads on its own and replays identically;
deleting an earlier op during minimization simply turns later ops into contract
violations, which changes the failure's signature and is rejected.

Pool ops (``PoolConfig``, one allocator):
  alloc{n}  free{tokens}  flush{urgent}  forward{tokens}  fire{}  write{tokens, stamps}
  read{tokens}  translate{loc}  clear{}
  read_table{rows, req_idx, seq_lens, max_pages, width, legacy}
  read_table_packed{rows, req_idx, seq_lens, kv_start, indptr, max_tokens, width}
where ``rows`` are the req_to_token rows (the given tokens, then -1 up to ``width``).

Kernel-level ops on a second pair of raw tables (same size as the pool's, starting
with only the sentinels set), straight through the kernel set with no allocator:
  k_bind{v, p}  k_alloc_bind{v, start}  k_free_unbind{v}
"""

from __future__ import annotations

POOL_OPS = ("alloc", "free", "flush", "forward", "fire", "write", "read", "translate", "clear",
            "read_table", "read_table_packed")
RAW_OPS = ("k_bind", "k_alloc_bind", "k_free_unbind")
TABLE_OPS = ("read_table", "read_table_packed")
POISON = 0x7A7A7A7A  # int32 canary in read-table buffers: nothing past the live prefix may change
OUT_SLACK_ROWS = 1
OUT_SLACK_COLS = 3
PACKED_SLACK = 4

_FIELDS = {
    "alloc": {"n"}, "free": {"tokens"}, "flush": {"urgent"}, "forward": {"tokens"}, "fire": set(),
    "write": {"tokens", "stamps"}, "read": {"tokens"}, "translate": {"loc"}, "clear": set(),
    "read_table": {"rows", "req_idx", "seq_lens", "max_pages", "width", "legacy"},
    "read_table_packed": {"rows", "req_idx", "seq_lens", "kv_start", "indptr", "max_tokens", "width"},
    "k_bind": {"v", "p"}, "k_alloc_bind": {"v", "start"}, "k_free_unbind": {"v"},
}


class OpError(ValueError):
    """An op that is not well-formed JSON for the op language (not a contract violation)."""


def validate_op(op: dict) -> dict:
    if not isinstance(op, dict) or op.get("op") not in _FIELDS:
        raise OpError(f"not an op: {op!r} (kinds: {', '.join(POOL_OPS + RAW_OPS)})")
    want = _FIELDS[op["op"]]
    have = set(op) - {"op"}
    if have != want:
        raise OpError(f"{op['op']} op needs fields {sorted(want)}, got {sorted(have)}")
    for name in sorted(want):
        kind = _TYPES[name]
        value = op[name]
        if not _is(value, kind):
            raise OpError(f"{op['op']} op: field {name!r} must be {kind}, got {value!r}")
    return op


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _ints(x) -> bool:
    return isinstance(x, list) and all(_int(t) for t in x)


def _is(value, kind: str) -> bool:
    if kind == "an int":
        return _int(value)
    if kind == "a bool":
        return isinstance(value, bool)
    if kind == "a list of ints":
        return _ints(value)
    if kind == "a list of int lists":
        return isinstance(value, list) and all(_ints(r) for r in value)
    return value is None or _ints(value)  # "a list of ints or null"


_TYPES = {
    "n": "an int", "urgent": "a bool", "legacy": "a bool", "max_pages": "an int", "width": "an int",
    "max_tokens": "an int", "tokens": "a list of ints", "stamps": "a list of ints", "loc": "a list of ints",
    "req_idx": "a list of ints", "seq_lens": "a list of ints", "indptr": "a list of ints",
    "rows": "a list of int lists", "kv_start": "a list of ints or null",
    "v": "a list of ints", "p": "a list of ints", "start": "an int",
}


def req_to_token_rows(op: dict) -> list[list[int]]:
    width = op["width"]
    return [list(r[:width]) + [-1] * (width - len(r[:width])) for r in op["rows"]]


def poisoned_out(op: dict) -> list:
    """The read-table output buffer, as the spec sees it: poison everywhere."""
    if op["op"] == "read_table":
        bs = len(op["req_idx"])
        return [[POISON] * (op["max_pages"] + OUT_SLACK_COLS) for _ in range(bs + OUT_SLACK_ROWS)]
    return [POISON] * ((op["indptr"][-1] if op["indptr"] else 0) + PACKED_SLACK)


def describe(op: dict, limit: int = 80) -> str:
    args = ", ".join(f"{k}={v}" for k, v in op.items() if k != "op")
    text = f"{op['op']}({args})"
    return text if len(text) <= limit else text[: limit - 3] + "..."
