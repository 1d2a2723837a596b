"""The allocator protocol: how kvfuzz drives an allocator it did not write, and judges it.

An allocator is named ``MODULE_OR_FILE[:FACTORY]`` (``docs/allocators.md``): a dotted
module or a ``.py`` file, and in it a *factory* called as

    factory(config, kernels, device, *, checked=..., buffers=...) -> allocator

with ``config`` a ``kvref.PoolConfig``, ``kernels`` the tier's kernel set and
``buffers`` the harness's table factory (red zones). Without ``:FACTORY`` the module's
``KVFUZZ_FACTORY`` is used. ``kvkernels.allocator:DeviceAllocator`` is the default and
goes through exactly this path, so every campaign drives its allocator through
``Driven``.

What an allocator lacks it declares, as ``KVFUZZ_LACKS`` on its factory (a class
attribute for a class): an op part (``flush``, ``forward``, ``write``, ``read``,
``translate``, ``clear``) makes the ops that need it skipped on both sides, the way an
optional kernel-set function is; ``checked`` (no checked mode) means the spec's
refusals are not sent to it; ``buffers`` (it allocates its own tables) means no red
zones around them; a snapshot field (``free_virtual``, ``holes``, ``pending``,
``watermark``, ``live_pages``, ``in_flight``, ``kv``) is not compared. Nothing lacking is
faked: a part the allocator neither has nor declares is a setup error, so a misspelt
method cannot turn into a silently skipped op. The read tables and ``translate`` are
kernel-set functions over the allocator's ``v2p``: an allocator without methods of its
own for them is read through the kernel set (and its checked refusals not asked for).

Representations that differ from SPEC's lists are adapted, never judged: tensors,
deques, tuples and sets become lists (sets sorted); ``KVFUZZ_SNAPSHOT = {FIELD:
"unordered"}`` compares a field as a multiset (``holes`` kept as a heap, say; the order
is still judged where it shows, by the pages the next ``alloc`` returns), and for
``pending`` also without batches or event ids. Exceptions in ``KVFUZZ_CONTRACT_ERRORS``
count as ``ContractViolation``.

The files whose branches guided generation counts as the allocator's code are those of the
factory's class and its bases; an adapter over code it executes from elsewhere names them
(``KVFUZZ_SOURCES``: paths).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import kvref
from kvref import ContractViolation

from .chain_ops import LAYOUTS, layouts_of
from .verdict import SetupError

DEFAULT = "kvkernels.allocator:DeviceAllocator"
# client adapters' short names (fuzz/clients/), and the kernel set each runs by default
CLIENTS = {"kvfuzz-sglang": "fuzz.clients.sglang_allocator"}
CLIENT_KERNELS = {"kvfuzz-sglang": "kvfuzz-sglang"}
# op part -> the op kinds skipped without it
PARTS = {"flush": ("flush",), "forward": ("forward", "fire"), "write": ("write",), "read": ("read",),
         "translate": ("translate",), "clear": ("clear",)}
FIELDS = ("free_virtual", "holes", "pending", "watermark", "live_pages", "in_flight", "kv")
STATE = ("v2p", "p2v", *FIELDS)  # what the runner compares, in its order
LACKABLE = frozenset(PARTS) | {"checked", "buffers"} | frozenset(FIELDS)
VIEWS = ("exact", "unordered")
METHODS = {"alloc": None, "free": None, "snapshot": None, "flush": "flush", "forward": "forward",
           "fire": "forward", "write": "write", "read": "read", "clear": "clear"}


# ---- naming and loading ---------------------------------------------------------------


def split(name: str) -> tuple[str, str | None]:
    """``MODULE_OR_FILE[:FACTORY]`` -> (module or file, factory or None)."""
    where, sep, factory = name.rpartition(":")
    if sep and factory.isidentifier() and where:
        return where, factory
    return name, None


def default_kernels(name: str | None) -> str | None:
    """The kernel set a client adapter runs unless ``--kernels`` says otherwise (None: the tier's)."""
    return CLIENT_KERNELS.get(split(name)[0]) if name else None


def environment(name: str | None) -> dict:
    """What a case's environment records of a client adapter's server (its version, the
    sha256 of the file it executes), found without executing anything."""
    if name and split(name)[0] == "kvfuzz-sglang":
        from ..clients.sglang_files import provenance

        return provenance()
    return {}


def is_file(where: str) -> bool:
    return where.endswith(".py") or os.sep in where


def check_name(name: str) -> None:
    """Refuse a name that cannot be an allocator, without importing it (the parent of a
    campaign never imports the code under test)."""
    where, _ = split(name)
    if is_file(where) and not Path(where).is_file():
        raise SetupError(f"--allocator {name}: no such file {where}")


def source_hash(name: str | None) -> str | None:
    """sha256 of the allocator's source (its file, or its module's files), like a kernel set's."""
    from .sources import source_hash as kernels_hash

    return kernels_hash(CLIENTS.get(split(name)[0], split(name)[0])) if name else None


def resolve(name: str | None, case_path, recorded_file: str | None = None) -> str | None:
    """The allocator of a case, wherever it is replayed from (see ``case.resolve_kernels``)."""
    from .sources import resolve_kernels

    if not name:
        return name
    where, factory = split(name)
    found = resolve_kernels(where, case_path, recorded_file)
    return found if factory is None else f"{found}:{factory}"


def _module(where: str, name: str):
    if not is_file(where):
        try:
            return importlib.import_module(where)
        except ImportError as exc:
            raise SetupError(f"--allocator {name}: cannot import {where}: {exc}") from exc
    path = Path(where)
    if not path.is_file():
        raise SetupError(f"--allocator {name}: no such file {where}")
    from .sources import load_file

    return load_file(path, "allocator", "--allocator", name)


@dataclass(frozen=True, eq=False)
class Protocol:
    """What kvfuzz knows of one factory: its name, what it lacks, how its snapshot compares."""

    name: str
    factory: object
    lacks: frozenset
    views: dict
    contract_errors: tuple
    rules: frozenset = frozenset()  # kvref.RULES it declares (KVFUZZ_SPEC_RULES)
    chains: tuple = ()  # KVFUZZ_CHAINS: the chain layouts it builds for a config with one (docs/allocators.md)
    sources: tuple = ()  # the files of its code (KVFUZZ_SOURCES, or its class's and its bases'): guided's code features

    @classmethod
    def of(cls, factory, name: str | None = None) -> Protocol:
        name = name or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', factory)}"
        lacks = getattr(factory, "KVFUZZ_LACKS", ()) or ()
        if isinstance(lacks, str) or not all(isinstance(x, str) for x in lacks):
            raise SetupError(f"--allocator {name}: KVFUZZ_LACKS must be a set of names, got {lacks!r}")
        unknown = sorted(set(lacks) - LACKABLE)
        required = [m for m in unknown if METHODS.get(m, "") is None]
        if required:
            raise SetupError(f"--allocator {name}: KVFUZZ_LACKS names {', '.join(required)}, which "
                             f"{'is' if len(required) == 1 else 'are'} required: an allocator kvfuzz drives must "
                             f"have {', '.join(f'{m}()' for m in METHODS if METHODS[m] is None)}")
        if unknown:
            raise SetupError(f"--allocator {name}: KVFUZZ_LACKS names {', '.join(unknown)}; an allocator may lack "
                             f"{', '.join(sorted(LACKABLE))}")
        views = dict(getattr(factory, "KVFUZZ_SNAPSHOT", None) or {})
        bad = {k: v for k, v in views.items() if k not in FIELDS or v not in VIEWS}
        if bad:
            raise SetupError(f"--allocator {name}: KVFUZZ_SNAPSHOT {bad!r}: fields are {', '.join(FIELDS)}, "
                             f"views {', '.join(VIEWS)}")
        errors = tuple(getattr(factory, "KVFUZZ_CONTRACT_ERRORS", ()) or ())
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in errors):
            raise SetupError(f"--allocator {name}: KVFUZZ_CONTRACT_ERRORS must hold exception classes")
        rules = getattr(factory, "KVFUZZ_SPEC_RULES", ()) or ()
        if isinstance(rules, str) or set(rules) - set(kvref.RULES):
            raise SetupError(f"--allocator {name}: KVFUZZ_SPEC_RULES {rules!r}: a set of {', '.join(sorted(kvref.RULES))}")
        chains = getattr(factory, "KVFUZZ_CHAINS", False)
        if not isinstance(chains, bool) and (isinstance(chains, str) or not set(chains) <= set(LAYOUTS)):
            raise SetupError(f"--allocator {name}: KVFUZZ_CHAINS {chains!r}: True, False or a set of "
                             f"{', '.join(LAYOUTS)}")
        proto = cls(name, factory, frozenset(lacks), views, errors, frozenset(rules), layouts_of(chains),
                    _sources(factory, name))
        proto._check_signature()
        return proto

    def _check_signature(self) -> None:
        try:
            params = inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            return  # a builtin or C callable: trusted
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return
        for kw in ("checked", "buffers"):
            if kw not in params and kw not in self.lacks:
                raise SetupError(f"--allocator {self.name}: its factory takes no {kw}= argument; declare "
                                 f"KVFUZZ_LACKS = {{{kw!r}, ...}} if it has no {_WHAT[kw]}")

    @property
    def skips(self) -> frozenset:
        """The op kinds the runner skips on both sides."""
        return frozenset(kind for part, kinds in PARTS.items() if part in self.lacks for kind in kinds)

    @property
    def fields(self) -> tuple:
        return tuple(f for f in STATE if f not in self.lacks)


def _sources(factory, name: str) -> tuple:
    """The files of an allocator's own code: its ``KVFUZZ_SOURCES`` (existing paths), or the files
    of the modules that define the factory and its bases (a class) or the factory (a function)."""
    named = getattr(factory, "KVFUZZ_SOURCES", None)
    if named is not None:
        if isinstance(named, str) or not all(isinstance(f, str) and Path(f).is_file() for f in named):
            raise SetupError(f"--allocator {name}: KVFUZZ_SOURCES {named!r}: a list of the paths of existing files")
        return tuple(sorted({str(Path(f).resolve()) for f in named}))
    owners = [k for k in getattr(factory, "__mro__", (factory,)) if k is not object]
    files = {getattr(sys.modules.get(getattr(k, "__module__", None) or ""), "__file__", None) for k in owners}
    return tuple(sorted(str(Path(f).resolve()) for f in files if f and f.endswith(".py")))


_WHAT = {"checked": "checked mode", "buffers": "use for the harness's table factory (red zones)"}
_LOADED: dict[str, Protocol] = {}


def load(name: str) -> Protocol:
    """The protocol of ``MODULE_OR_FILE[:FACTORY]`` (imported once per process)."""
    if name in _LOADED:
        return _LOADED[name]
    where, factory_name = split(name)
    module = _module(CLIENTS.get(where, where), name)
    if factory_name is None:
        factory = getattr(module, "KVFUZZ_FACTORY", None)
        if isinstance(factory, str):
            factory_name, factory = factory, getattr(module, factory, None)
        if factory is None:
            raise SetupError(f"--allocator {name}: {where} defines no KVFUZZ_FACTORY; name one: {where}:FACTORY")
    else:
        factory = getattr(module, factory_name, None)
        if factory is None:
            raise SetupError(f"--allocator {name}: {where} has no {factory_name}")
    if not callable(factory):
        raise SetupError(f"--allocator {name}: {factory_name or 'KVFUZZ_FACTORY'} is not callable")
    _LOADED[name] = Protocol.of(factory, name)
    return _LOADED[name]


def attach(tier, name: str | None):
    """``tier`` driving the allocator ``name`` (None: the default), after a smoke test on a
    tiny pool, so an allocator that cannot run is a setup error (exit 2) up front."""
    if not name:
        return tier
    proto = load(name)
    _smoke_test(proto, tier)
    return replace(tier, allocator_cls=proto, allocator_name=name, allocator_skips=proto.skips, spec_rules=proto.rules)


def protocol_of(tier) -> Protocol:
    """The protocol of the allocator a tier drives: named, a swapped-in class (mutants), or ours."""
    cls = getattr(tier, "allocator_cls", None)
    if isinstance(cls, Protocol):
        return cls
    if cls is None:
        return load(DEFAULT)
    key = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', id(cls))}#{id(cls)}"
    if key not in _LOADED:
        _LOADED[key] = Protocol.of(cls, key.split("#")[0])
    return _LOADED[key]


def has_chains(tier) -> list[str]:
    """The chain layouts the allocator ``tier`` drives builds (its ``KVFUZZ_CHAINS``), none where
    its kernel set opts out (a module ``KVFUZZ_CHAINS = False``): a chain seed then gives the
    single pool it always had (``generate.sequence_params``). A list: it travels in a worker's
    info as JSON."""
    if getattr(tier.kernels, "KVFUZZ_CHAINS", True) is False:
        return []
    return list(protocol_of(tier).chains)


def drive(tier, config: kvref.PoolConfig, *, checked: bool, buffers) -> Driven:
    """A fresh allocator of ``tier`` for ``config``, behind the protocol."""
    return Driven(protocol_of(tier), config, tier, checked=checked, buffers=buffers)


def _smoke_test(proto: Protocol, tier) -> None:
    import torch

    from .memory import RedZones

    config = kvref.PoolConfig(num_pages=6, min_page=1, page_size=1)
    try:
        a = Driven(proto, config, tier, checked=False, buffers=RedZones(4, tier.device))
        toks = a.alloc(2)
        a.free(toks[:1])
        a.snapshot()
        if "clear" not in proto.lacks:
            a.clear()
        a.snapshot()
    except SetupError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here means it cannot be driven at all
        raise SetupError(f"--allocator {proto.name} cannot run on the {tier.backend} tier: "
                         f"{type(exc).__name__}: {exc}") from exc
    for table in ("v2p", "p2v"):
        t = getattr(a.inner, table, None)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (config.table_rows,):
            raise SetupError(f"--allocator {proto.name}: .{table} must be its int64 table of num_pages + 1 rows "
                             f"(the one its kernels write), got {_describe(t)}")


def _describe(t) -> str:
    return f"{type(t).__name__} {getattr(t, 'dtype', '')} {tuple(getattr(t, 'shape', ()))}".strip()


# ---- driving one ------------------------------------------------------------------------


def flat(value) -> list:
    """A sequence of ids in SPEC's form, a list (a set's sorted); a list is trusted as is
    (this runs on every table after every op)."""
    if type(value) is list:
        return value
    if hasattr(value, "tolist"):  # a tensor, a numpy array
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return list(value)


def plain(name: str, value):
    """Snapshot field ``name`` in SPEC's form: lists of ints, ``pending`` as ``[[event_id,
    pages], ...]``, ``in_flight`` as ``None`` or ``{id, fired, pages}``, ints."""
    if name == "pending":
        return [[_int(e), flat(pages)] for e, pages in flat(value)]
    if name == "in_flight":
        return None if value is None else {str(k): flat(v) if k == "pages" else _int(v) for k, v in dict(value).items()}
    if name in ("watermark", "live_pages"):
        return _int(value)
    return flat(value)


def _int(value):
    return value.item() if hasattr(value, "item") and not isinstance(value, (int, bool)) else value


def view(name: str, value, how: str):
    """``value`` of snapshot field ``name`` as compared under view ``how``."""
    if how == "exact":
        return value
    if name == "pending":
        return sorted(p for _, pages in value for p in pages)
    if name == "in_flight":
        return value if value is None else {**value, "pages": sorted(value.get("pages", []))}
    return sorted(value) if isinstance(value, list) else value


def missing_methods(inner, missing: list[str]) -> str:
    """Advice a user can follow for methods the allocator lacks: a required one (``alloc``,
    ``free``, ``snapshot``) cannot be declared away, and an attribute of that name that is
    not callable (a free list kept in ``self.free``, shadowing ``free()``) is named with its
    type, since "has no free()" is then false and declaring it in KVFUZZ_LACKS is refused."""
    cls = type(inner).__name__
    said = []
    for m in missing:
        value = getattr(inner, m, None)
        what = (f"`{cls}.{m}` is {_a(type(value).__name__)}, not a method (an attribute shadows it: rename one)"
                if value is not None else f"{cls} has no {m}()")
        if METHODS[m] is None:
            said.append(f"`{m}` is required; {what}")
        else:
            said.append(f"{what}; declare KVFUZZ_LACKS = {{{METHODS[m]!r}, ...}} if it has no {METHODS[m]} "
                        "(docs/allocators.md)")
    return "; ".join(said)


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


class Driven:
    """One allocator behind the protocol, with the interface the ops drive
    (``runner.TargetSide.alloc``): tensors in, tensors or None out."""

    def __init__(self, proto: Protocol, config: kvref.PoolConfig, tier, *, checked: bool, buffers):
        self.proto, self.config, self.tier = proto, config, tier
        kw = {}
        if "checked" not in proto.lacks:
            kw["checked"] = checked
        if "buffers" not in proto.lacks:
            kw["buffers"] = buffers
        self.inner = self._call(lambda: proto.factory(config, tier.kernels, tier.device, **kw))
        missing = [m for m, part in METHODS.items()
                   if part not in proto.lacks and not callable(getattr(self.inner, m, None))]
        if missing:
            raise SetupError(f"--allocator {proto.name}: {missing_methods(self.inner, missing)}")
        self._own = {m for m in ("translate", "build_read_table", "build_read_table_packed")
                     if callable(getattr(self.inner, m, None))}
        if "translate" not in self._own and "translate" not in proto.lacks and not tier.has("translate_tokens"):
            raise SetupError(f"--allocator {proto.name}: has no translate() and the kernel set no translate_tokens; "
                             "declare KVFUZZ_LACKS = {'translate', ...}")
        self.skips = proto.skips
        self.fields = proto.fields
        self._checked = checked
        if config.chain is not None and getattr(self.inner, "chain", None) is None:
            raise SetupError(f"--allocator {proto.name}: the config is a chain of {len(config.members)} pools, and "
                             f"{type(self.inner).__name__} has no .chain (docs/allocators.md: chains)")

    def _call(self, fn):
        try:
            return fn()
        except ContractViolation:
            raise
        except self.proto.contract_errors as exc:
            raise ContractViolation(f"{type(exc).__name__}: {exc}") from exc

    def _ids(self, values):
        import torch

        if isinstance(values, torch.Tensor):
            return values.reshape(-1).to(torch.int64)
        return torch.tensor(list(values), dtype=torch.int64, device=self.tier.device)

    # ---- what the runner reads ---------------------------------------------------------
    @property
    def v2p(self):
        return self.inner.v2p

    @property
    def p2v(self):
        return self.inner.p2v

    @property
    def checked(self) -> bool:
        return self._checked

    @checked.setter
    def checked(self, value: bool) -> None:
        self._checked = value
        if "checked" not in self.proto.lacks:
            self.inner.checked = value

    def refuses(self, op) -> bool:
        """Whether the spec's refusal of ``op`` is also asked of this allocator (checked)."""
        if "checked" in self.proto.lacks:
            return False
        own = {"read_table": "build_read_table", "read_table_packed": "build_read_table_packed"}.get(op.kind)
        return own is None or own in self._own

    def snapshot(self) -> dict:
        snap = self._call(self.inner.snapshot)
        if not isinstance(snap, dict):
            raise TypeError(f"snapshot() returned {type(snap).__name__}, not a dict of SPEC's state")
        return {name: view(name, plain(name, snap[name]), self.proto.views.get(name, "exact")) for name in self.fields}

    def chain_snapshot(self) -> dict:
        """The chain's snapshot (``{"pools": [...], "gates": [...]}``), each pool's fields in
        SPEC's form as ``snapshot`` gives pool 0's."""
        chain = getattr(self.inner, "chain", None)
        if chain is None:
            raise SetupError(f"--allocator {self.proto.name}: its config has a chain, but it has no .chain "
                             "(docs/allocators.md: chains)")
        snap = self._call(chain.snapshot)
        pools = [{name: view(name, plain(name, p[name]), self.proto.views.get(name, "exact")) for name in self.fields}
                 for p in snap["pools"]]
        return {"pools": pools, "gates": [bool(g) for g in snap["gates"]]}

    def view(self, name: str, spec_value):
        """The spec's value of a field, seen the way this allocator's is compared."""
        return view(name, spec_value, self.proto.views.get(name, "exact"))

    # ---- the ops --------------------------------------------------------------------------
    def alloc(self, n_tokens: int):
        r = self._call(lambda: self.inner.alloc(n_tokens))
        return None if r is None else self._ids(r)

    def free(self, tokens) -> None:
        self._call(lambda: self.inner.free(tokens))

    def flush(self, urgent: bool = False) -> None:
        self._call(lambda: self.inner.flush(urgent))

    def forward(self, tokens) -> None:
        self._call(lambda: self.inner.forward(tokens))

    def fire(self) -> None:
        self._call(self.inner.fire)

    def write(self, tokens, stamps) -> None:
        self._call(lambda: self.inner.write(tokens, stamps))

    def read(self, tokens):
        return self._ids(self._call(lambda: self.inner.read(tokens)))

    def clear(self) -> None:
        self._call(self.inner.clear)

    def translate(self, loc):
        if "translate" in self._own:
            return self._ids(self._call(lambda: self.inner.translate(loc)))
        return self.tier.kernels.translate_tokens(loc=loc, v2p=self.v2p, page_size=self.config.page_size)

    def build_read_table(self, *, legacy: bool = False, **kwargs):
        if "build_read_table" in self._own:
            return self._call(lambda: self.inner.build_read_table(legacy=legacy, **kwargs))
        k = self.tier.kernels
        fn = k.build_kv_read_table_legacy if legacy else k.build_kv_read_table
        return fn(v2p=self.v2p, multiplier=self.config.multiplier, page_size=self.config.page_size, **kwargs)

    def build_read_table_packed(self, **kwargs):
        if "build_read_table_packed" in self._own:
            return self._call(lambda: self.inner.build_read_table_packed(**kwargs))
        return self.tier.kernels.build_kv_read_table_packed(
            v2p=self.v2p, multiplier=self.config.multiplier, page_size=self.config.page_size, **kwargs)

    def __getattr__(self, name: str):
        # Anything else (a test's look at DeviceAllocator internals) is the allocator's own.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
