"""Free paths: from the public entry points, through every call the checked tree can resolve.

Why entry points and not names or behaviour: on a production allocator, a function
whose name holds "free" (``merge_and_sort_free``) or that writes ``-1`` into ``p2v``
(a relocation helper) is as likely to be on the allocation side as on the free side.
What makes code a free path is that a free entry point runs it. Entry points are
functions matching root patterns (``--root``, ``[tool.kvfuzz.check-sync] roots``,
defaults in ``vocab.DEFAULT_ROOTS``); for a class, the patterns are matched on each
class that can be instantiated (not an abstract one), with methods looked up through
its MRO, so ``self.free()`` in a base class runs the subclass's ``free`` when entered
through the subclass. A base class that is also used on its own is checked on its own.

From each entry point the analysis follows calls (``f()``, ``self.m()``, ``cls.m()``,
``Class.m()``, ``super().m()``, ``module.f()``, imported names), binding page tables,
tensors, masks and scalars to the callee's parameters, and carries the allowed region
of the call site (``regions``) into the callee. A finding is reported once per line
and column with the shortest chain from an entry point; when it is reached both from
an allowed region and from plain free-path code, the plain path wins.
"""

from __future__ import annotations

import ast
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import regions, vocab
from .checker import FunctionChecker, RawFinding
from .kinds import Env, Eval, attr_kinds
from .model import Class, Func, Module, Project
from .regions import Exemption
from .registry import all_rules, families
from .rules.pragmas import PRAGMA_WITHOUT_REASON

MAX_VISITS = 20000


@dataclass(frozen=True)
class Hop:
    display: str  # Cls.method as the chain shows it
    func: Func
    path: str  # the module the display name belongs to

    def to_json(self) -> dict:
        return {"function": self.display, "path": self.func.module.path, "line": self.func.node.lineno}


def chain_text(chain: Sequence[Hop], limit: int = 6) -> str:
    if not chain:
        return ""
    base = chain[0].path
    parts = [h.display + (f" ({os.path.basename(h.func.module.path)})" if h.func.module.path != base else "")
             for h in chain]
    if len(parts) > limit:
        parts = parts[:2] + ["…"] + parts[-(limit - 3):]
    return " → ".join(parts)


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int  # 1-based, in characters, as editors and linters print it
    code: str
    message: str
    chain: tuple[Hop, ...] = field(default=(), compare=False)
    also_from: tuple[str, ...] = field(default=(), compare=False)  # other entry points that reach it
    exemption: Exemption | None = field(default=None, compare=False)  # set on allowed findings

    @property
    def chain_text(self) -> str:
        return chain_text(self.chain)

    @property
    def entry(self) -> str | None:
        return self.chain[0].display if self.chain else None

    def where(self) -> str:
        if not self.chain:
            return ""
        also = f"; also from {', '.join(self.also_from)}" if self.also_from else ""
        return f" [free path: {self.chain_text}{also}]"

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}{self.where()}"


@dataclass
class FilePlan:
    """What the checker decided about one file: its entry points, free paths, allowed regions, findings."""

    path: str
    target: bool = True
    roots: dict[str, str] = field(default_factory=dict)  # entry point -> why
    reached: dict[str, str] = field(default_factory=dict)  # qualname -> chain from an entry point
    exempt: dict[str, str] = field(default_factory=dict)  # qualname -> why (reached only in allowed regions)
    regions: list[Exemption] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)  # in an allowed region, or under a pragma
    unreached: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    files: dict[str, FilePlan] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    n_files: int = 0
    truncated: bool = False  # the walk hit MAX_VISITS: some calls were not followed

    @property
    def findings(self) -> list[Finding]:
        return sorted(f for p in self.files.values() for f in p.findings)

    @property
    def allowed(self) -> list[Finding]:
        return sorted(f for p in self.files.values() for f in p.allowed)

    @property
    def n_free_paths(self) -> int:
        return sum(len(p.reached) for p in self.files.values())


@dataclass
class _Visit:
    func: Func
    self_cls: Class | None
    env: Env
    exemption: Exemption | None
    chain: tuple[Hop, ...]
    caller: tuple | None = None  # the visit that made this call (None for an entry point)


def _reaching(entries: dict[tuple, set[str]], preds: dict[tuple, set[tuple]]) -> dict[tuple, set[str]]:
    """Every entry point from which each visit is reached, through any path of calls."""
    out = {k: set(v) for k, v in entries.items()}
    changed = True
    while changed:
        changed = False
        for key, callers in preds.items():
            have = out.setdefault(key, set())
            for c in callers:
                extra = out.get(c, set()) - have
                if extra:
                    have |= extra
                    changed = True
    return out


class Analysis:
    def __init__(self, project: Project, roots: Sequence[str] = vocab.DEFAULT_ROOTS,
                 strict: frozenset[str] = frozenset(), codes: set[str] | None = None):
        self.project = project
        self.patterns = tuple(dict.fromkeys(roots))
        self.strict = frozenset(strict)
        self.codes = codes if codes is not None else set(all_rules())
        self._raises: dict[tuple, bool] = {}
        self._base_entries: set[str] = set()

    # helpers the checker asks for ---------------------------------------------------
    def always_raises_call(self, checker: FunctionChecker):
        """A predicate on calls: does the callee raise on every path (a diagnostics-and-raise helper)?"""

        def check(call: ast.Call) -> bool:
            resolved = checker.resolve_call(call)
            if resolved is None:
                return False
            func = resolved[0]
            if func.key not in self._raises:
                self._raises[func.key] = False  # a recursion guard
                self._raises[func.key] = regions.raises(func.node.body, lambda c: False)
            return self._raises[func.key]

        return check

    def _match(self, *names: str) -> str | None:
        for pattern in self.patterns:
            if any(vocab.matches_root(n, pattern) for n in names):
                return pattern
        return None

    def _name_exemption(self, func: Func) -> Exemption | None:
        kind = vocab.name_exemption(func.name)
        if kind is None or kind in self.strict:
            return None
        body = func.node.body
        return Exemption(kind, f"{func.qualname}: its name says {kind}", func.module.path, func.qualname,
                         func.node.lineno, body[-1].end_lineno or body[-1].lineno)

    # entry points -----------------------------------------------------------------
    def entry_points(self) -> list[tuple[Func, Class | None, str, str, Module]]:
        """(function, self class, display name, why, module it is listed under)."""
        project = self.project
        out = []
        subclassed = project.subclassed()
        self._base_entries: set[str] = set()  # entries on a class something derives from
        for mod in project.targets():
            for qual, func in mod.functions.items():
                if func.cls is None and not func.is_kernel:
                    pattern = self._match(qual)
                    if pattern:
                        out.append((func, None, qual, f"matches root pattern {pattern!r}", mod))
            for cls in mod.classes.values():
                if cls.is_abstract:
                    continue
                names = dict.fromkeys(n for c in project.mro(cls) for n in c.methods)
                for name in names:
                    func = project.find_method(cls, name)
                    display = f"{cls.name}.{name}"
                    pattern = self._match(display, func.qualname) if func and not func.is_kernel else None
                    if pattern is None:
                        continue
                    why = f"matches root pattern {pattern!r}"
                    if func.module is not mod or func.cls != cls.name:
                        why += f" (inherited from {func.qualname} in {func.module.path})"
                    if cls.key in subclassed:
                        self._base_entries.add(display)
                    out.append((func, cls, display, why, mod))
        return out

    # the walk ------------------------------------------------------------------------
    def run(self) -> Report:
        project = self.project
        report = Report()
        for mod in project.targets():
            report.files[mod.path] = FilePlan(mod.path, target=True)

        def plan(mod: Module) -> FilePlan:
            if mod.path not in report.files:
                report.files[mod.path] = FilePlan(mod.path, target=mod.target)
            return report.files[mod.path]

        work: deque[_Visit] = deque()
        for func, cls, display, why, mod in self.entry_points():
            plan(mod).roots[display] = why
            ex = self._name_exemption(func)
            if ex is not None:
                plan(func.module).regions.append(ex)
            work.append(_Visit(func, cls, Env(), ex, (Hop(display, func, mod.path),)))

        seen: set[tuple] = set()
        preds: dict[tuple, set[tuple]] = {}  # visit -> the visits that call it (every path, not just the first)
        entries: dict[tuple, set[str]] = {}  # visit -> the entry points that start at it
        live: dict[Func, tuple[Hop, ...]] = {}
        allowed_only: dict[Func, Exemption] = {}
        raw: list[tuple[Func, tuple[Hop, ...], RawFinding, tuple]] = []  # (function, chain, finding, visit)
        fams = families()
        visits = 0
        while work and visits < MAX_VISITS:
            v = work.popleft()
            key = self._key(v)
            if v.caller is None:
                entries.setdefault(key, set()).add(v.chain[0].display)
            else:
                preds.setdefault(key, set()).add(v.caller)
            if key in seen:
                continue
            seen.add(key)
            visits += 1
            if v.exemption is None:
                live.setdefault(v.func, v.chain)
            else:
                allowed_only.setdefault(v.func, v.exemption)
            checker = FunctionChecker(self, v.func, v.self_cls, v.env, v.exemption, fams)
            checker.run()
            raw.extend((v.func, v.chain, rf, key) for rf in checker.findings)
            if v.exemption is None:
                plan(v.func.module).regions.extend(checker.regions)
            for call in checker.calls:
                ex = call.exemption
                if ex is None:
                    ex = self._name_exemption(call.callee)
                    if ex is not None and ex not in plan(call.callee.module).regions:
                        plan(call.callee.module).regions.append(ex)
                hop = Hop(call.callee.qualname, call.callee, call.callee.module.path)
                work.append(_Visit(call.callee, call.self_cls, call.env, ex, v.chain + (hop,), key))

        report.truncated = bool(work)
        for func, chain in live.items():
            plan(func.module).reached[func.qualname] = chain_text(chain)
        for func, ex in allowed_only.items():
            if func not in live:
                plan(func.module).exempt[func.qualname] = (
                    f"reached only from {ex.kind} code: {ex.detail} in {ex.function}; {regions.KINDS[ex.kind]}")
        self._aggregate(raw, plan, _reaching(entries, preds))
        self._pragmas_without_reason(plan)
        self._unreached(report, live, allowed_only)
        for p in report.files.values():
            p.findings.sort()
            p.allowed.sort()
            p.regions = sorted(dict.fromkeys(p.regions), key=lambda r: (r.start, r.end, r.function))
        return report

    @staticmethod
    def _key(v: _Visit) -> tuple:
        return (v.func.key, v.self_cls.key if v.self_cls else None, v.env.key(),
                v.exemption.kind if v.exemption else None)

    def _aggregate(self, raw, plan, reaching: dict[tuple, set[str]]) -> None:
        groups: dict[tuple, list] = {}
        entry_points: dict[tuple, set[str]] = {}
        for func, chain, rf, key in raw:
            if rf.rule.code not in self.codes:
                continue
            where = (func.module.path, rf.line, rf.col, rf.rule.code)
            groups.setdefault(where, []).append((func, chain, rf))
            if rf.exemption is None:
                entry_points.setdefault(where, set()).update(reaching.get(key, ()))
        for (path, line, col, code), items in groups.items():
            mod = items[0][0].module
            plain = [i for i in items if i[2].exemption is None]
            pool = plain or items
            # the chain from a public entry point (free, not _free_lazy) of the most derived
            # class (the subclass a scheduler holds, not its base), then the shortest
            pool.sort(key=lambda i: (i[1][0].func.name.startswith("_"), i[1][0].display in self._base_entries,
                                     len(i[1]), chain_text(i[1])))
            func, chain, rf = pool[0]
            on_chain = {h.display for h in chain}
            also = tuple(sorted(e for e in entry_points.get((path, line, col, code), ()) if e not in on_chain))
            message = rf.rule.render(rf.form, rf.variant)
            pragma = mod.pragmas.get(line)
            exemption = None if plain else rf.exemption
            if plain and pragma:
                exemption = Exemption("pragma", f"`# sync-ok: {pragma}`", path, func.qualname, line, line)
            finding = Finding(path, line, col, code, message, chain, also, exemption)
            (plan(mod).allowed if exemption else plan(mod).findings).append(finding)

    def _pragmas_without_reason(self, plan) -> None:
        if PRAGMA_WITHOUT_REASON.code not in self.codes:
            return
        for mod in self.project.targets():
            for line, reason in mod.pragmas.items():
                if not reason:
                    plan(mod).findings.append(Finding(mod.path, line, 1, PRAGMA_WITHOUT_REASON.code,
                                                      PRAGMA_WITHOUT_REASON.message))

    def _unreached(self, report: Report, live, allowed_only) -> None:
        """Functions of the checked files no entry point reaches; the likely free paths among them get a note."""
        for mod in self.project.targets():
            p = report.files[mod.path]
            for qual, func in mod.functions.items():
                if func.is_kernel or func in live or func in allowed_only:
                    continue
                p.unreached.append(qual)
                hint = self._free_hint(func)
                if hint:
                    p.notes.append(f"{qual} {hint}, but no entry point reaches it: pass --root "
                                   f"{func.name} if it frees pages")
            p.notes += [f"{c.name} is abstract: its entry points are checked on the classes derived from it"
                        for c in mod.classes.values() if c.is_abstract]

    def _free_hint(self, func: Func) -> str | None:
        """Why an unreached function looks like a free path: it tombstones a table, or calls a free entry."""
        project = self.project
        cls = project.class_of(func)
        env = Env()
        ev = Eval(project, func.module, attr_kinds(project, cls), env, func.self_name())
        for a in func.node.args.posonlyargs + func.node.args.args + func.node.args.kwonlyargs:
            if vocab.is_table_name(a.arg):
                env.tables.add(a.arg)
        for node in ast.walk(func.node):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for tgt, val in vocab.pair_targets(t, node.value):
                        if isinstance(tgt, ast.Name) and ev.is_table(val):
                            env.tables.add(tgt.id)
        negative = project.negative_names(func.module)
        for node in ast.walk(func.node):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Subscript) and ev.is_table(t.value) and vocab.is_negative_constant(
                            node.value, negative):
                        return f"writes a tombstone into {vocab.segment(t.value, 30)} at line {node.lineno}"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in vocab.TOMBSTONE_METHODS and ev.is_table(node.func.value) and any(
                        vocab.is_negative_constant(a, negative) for a in [*node.args, *(k.value for k in node.keywords)]):
                    return f"writes a tombstone into {vocab.segment(node.func.value, 30)} at line {node.lineno}"
                if not node.func.attr.startswith("_") and self._match(node.func.attr):
                    return f"calls {node.func.attr}() at line {node.lineno}"
        return None
