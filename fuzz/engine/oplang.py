"""The op language's base record: ``Op``, its field types and JSON form.

An op carries literal ids, so a case file reads on its own and replays identically;
deleting an earlier op during minimization turns later ops into contract violations,
which changes the failure's signature and is rejected. Each record declares its fields
and their types as annotations (checked on construction, so a generator bug or a
hand-edited case fails at the op that is wrong), writes ``{"op": KIND, field: value,
...}`` in declaration order, registers itself under its kind, and names its ``track``.
The families live beside it: ``ops`` (the small track's pool and kernel-level ops) and
``production.ops`` / ``production.graph``; ``kinds`` imports them all.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar, Iterator

import kvref

Ints = tuple[int, ...]
Rows = tuple[Ints, ...]

POISON = 0x7A7A7A7A  # int32 canary in read-table buffers: nothing past the live prefix may change
OUT_SLACK_ROWS = 1
OUT_SLACK_COLS = 3
PACKED_SLACK = 4


class OpError(Exception):
    """An op that is not well formed (a case file's or a generator's mistake), as opposed
    to a well-formed op that breaks a contract (``ContractViolation``)."""


# ---- field types ---------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _ints(value, what: str) -> Ints:
    if not isinstance(value, (list, tuple)) or not all(_is_int(x) for x in value):
        raise OpError(f"{what} must be a list of ints, got {value!r}")
    return tuple(value)


def _coerce(hint, value, what: str):
    if hint is int:
        if not _is_int(value):
            raise OpError(f"{what} must be an int, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise OpError(f"{what} must be a bool, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise OpError(f"{what} must be a string, got {value!r}")
        return value
    if hint == Ints:
        return _ints(value, what)
    if hint == Rows:
        if not isinstance(value, (list, tuple)):
            raise OpError(f"{what} must be a list of int lists, got {value!r}")
        return tuple(_ints(r, f"{what}[{i}]") for i, r in enumerate(value))
    if hint == (Ints | None):
        if value is not None and not (isinstance(value, (list, tuple)) and all(_is_int(x) for x in value)):
            raise OpError(f"{what} must be a list of ints or null, got {value!r}")
        return None if value is None else tuple(value)
    raise TypeError(f"op field {what}: unsupported annotation {hint!r}")  # a bug in this module


def _plain(value):
    """Tuples back to JSON lists."""
    if isinstance(value, tuple):
        return [_plain(x) for x in value]
    return value


# ---- the base records -----------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    kind: ClassVar[str] = ""
    track: ClassVar[str] = "small"  # the track whose runner runs this op (``tracks``)
    registry: ClassVar[dict[str, type[Op]]] = {}
    pure: ClassVar[bool] = False  # a read: the target's state is the same after it (SPEC: it writes only its output)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.kind:
            Op.registry[cls.kind] = cls

    def __post_init__(self):
        # Every field is checked against its annotation on every construction; what each check
        # needs (the name, the type, the error's wording) is worked out once per class.
        specs = type(self).__dict__.get("_field_specs")
        if specs is None:
            hints = typing.get_type_hints(type(self))
            specs = tuple((f.name, hints[f.name], f"{self.kind} op: field {f.name!r}") for f in dataclasses.fields(self))
            type(self)._field_specs = specs
        for name, hint, what in specs:
            object.__setattr__(self, name, _coerce(hint, getattr(self, name), what))

    # ---- JSON --------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_json(self) -> dict:
        """Every field, except a defaulted one still at its default: a field added to a kind
        later (with a default) leaves the JSON of every op that does not use it unchanged,
        so old case files stay byte-identical and readable."""
        out = {"op": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            out[f.name] = _plain(value)
        return out

    @staticmethod
    def from_json(obj) -> Op:
        """The record of one op's JSON; its kind must be registered (``kinds`` imports every
        op module, so parse through ``kinds.parse_ops``)."""
        kind = obj.get("op") if isinstance(obj, dict) else None
        cls = Op.registry.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise OpError(f"not an op: {obj!r} (kinds: {', '.join(Op.registry)})")
        fields = dataclasses.fields(cls)
        need = {f.name for f in fields if f.default is dataclasses.MISSING}
        have, allowed = set(obj) - {"op"}, {f.name for f in fields}
        if not need <= have <= allowed:
            raise OpError(f"{kind} op needs fields {sorted(need)}"
                          + (f" (optional: {sorted(allowed - need)})" if allowed - need else "") + f", got {sorted(have)}")
        return cls(**{name: obj[name] for name in allowed if name in have})

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.to_json().items() if k != "op")
        text = f"{self.kind}({args})"
        return text if len(text) <= 100 else text[:97] + "..."

    # ---- behaviour shared by both families -----------------------------------------
    def shrink(self) -> Iterator[Op]:
        """Smaller variants of this op, the most promising first."""
        return iter(())

    def merge(self, following: Op) -> Op | None:
        """One op doing what this op and the one after it do together, if there is one."""
        return None

    def supported_by(self, tier) -> bool:
        return True

    def reach(self, config: kvref.PoolConfig) -> int:
        """How many rows past either end of v2p/p2v an id this op names could touch, so a
        probe's red zones can be made that wide."""
        ps, rows = config.page_size, config.table_rows
        pages = [t // ps for t in self.token_ids()] + list(self.page_ids())
        return max([0] + [p - rows + 1 for p in pages] + [-p for p in pages])

    def token_ids(self) -> Iterator[int]:
        return iter(())

    def page_ids(self) -> Iterator[int]:
        return iter(())
