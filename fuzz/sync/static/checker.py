"""One function, in one calling context: its regions, the forms the rule families report, its calls.

The checker owns what every rule needs (the kind evaluator, the current allowed
region, where a call goes) and no rule of its own: each AST event is handed to the rule
families' hooks (``records.Family``), which report through ``report``.
"""

from __future__ import annotations

import ast
from contextlib import contextmanager
from dataclasses import dataclass

from . import regions, vocab
from .annotations import note_annotation
from .host import CheckerHost
from .kinds import Env, Eval, attr_kinds
from .model import Class, Func, Module
from .records import Family, Rule
from .regions import Exemption


@dataclass(frozen=True)
class RawFinding:
    rule: Rule
    variant: str | None
    line: int
    col: int
    form: str
    exemption: Exemption | None


@dataclass(frozen=True)
class Call:
    callee: Func
    env: Env
    self_cls: Class | None
    node: ast.Call
    exemption: Exemption | None


_BRANCH_LABEL = {"eager": "eager", "cpu-only": "CPU-only", "checked": "checked-mode", "error-path": "raising"}


class FunctionChecker(ast.NodeVisitor):
    def __init__(self, analysis: CheckerHost, func: Func, self_cls: Class | None, env: Env,
                 inherited: Exemption | None, families: tuple[Family, ...]):
        self.analysis = analysis
        self.project = analysis.project
        self.strict = analysis.strict
        self.func = func
        self.mod: Module = func.module
        self.self_cls = self_cls or self.project.class_of(func)
        self.self_name = func.self_name()
        self.env = env
        self.ev = Eval(self.project, self.mod, attr_kinds(self.project, self.self_cls), env, self.self_name,
                       resolve=self._callee)
        self.exemption = inherited
        self.findings: list[RawFinding] = []
        self.calls: list[Call] = []
        self.regions: list[Exemption] = []
        self._used: set[Exemption] = set()  # regions that allowed a sync or a call
        self._hooks: dict[str, list] = {}
        for fam in families:
            for event, hook in fam.hooks.items():
                self._hooks.setdefault(event, []).append(hook)
        self._build_env()

    # environment ---------------------------------------------------------------
    def _build_env(self) -> None:
        fn = self.func.node
        env = self.env
        params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for a in params:
            if vocab.is_table_name(a.arg):
                env.tables.add(a.arg)
            note_annotation(a.annotation, a.arg, env.tensors, env.not_tensors)
        for a in params:
            if a.arg in env.tables:
                env.tensors.add(a.arg)
            if a.arg not in env.tensors and a.arg not in env.scalars:
                env.not_scalars.add(a.arg)  # a parameter of unknown type is not a known scalar
        assigns: list[tuple[str, ast.expr, bool]] = []  # (name, value, is_iteration)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for tgt, val in vocab.pair_targets(t, node.value):
                        if isinstance(tgt, ast.Name):
                            assigns.append((tgt.id, val, False))
                        elif isinstance(tgt, (ast.Tuple, ast.List)):
                            assigns.extend((e.id, val, True) for e in tgt.elts if isinstance(e, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                note_annotation(node.annotation, node.target.id, env.tensors, env.not_tensors)
                if node.value is not None:
                    assigns.append((node.target.id, node.value, False))
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                assigns.append((node.target.id, ast.BinOp(ast.Name(node.target.id), node.op, node.value), False))
            elif isinstance(node, (ast.For, ast.comprehension)):
                target = node.target
                names = [target] if isinstance(target, ast.Name) else [
                    e for e in getattr(target, "elts", []) if isinstance(e, ast.Name)]
                assigns.extend((n.id, node.iter, True) for n in names)
            elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                assigns.append((node.target.id, node.value, False))
        env.tensors -= env.not_tensors
        for _ in range(5):
            before = env.key()
            for name, val, iterated in assigns:
                if name in env.not_tensors:
                    continue
                if not iterated and self.ev.is_table(val):
                    env.tables.add(name)
                if self.ev.is_tensor(val):
                    env.tensors.add(name)
                if not iterated and self.ev.is_mask(val):
                    env.masks.add(name)
                if self.ev.is_host(val):
                    env.hosts.add(name)
            if env.key() == before:
                break
        env.not_scalars |= {name for name, _, _ in assigns} - env.scalars
        for _ in range(4):  # locals assigned only from Python scalars (tomb = -1; fill = tomb)
            votes: dict[str, bool] = {}
            for name, val, iterated in assigns:
                votes[name] = votes.get(name, True) and (not iterated) and self.ev.is_pyscalar(val)
            new = {n for n, ok in votes.items() if ok and n not in env.tensors}
            if new <= env.scalars:
                break
            env.scalars |= new
            env.not_scalars -= new

    # reporting -----------------------------------------------------------------
    def report(self, rule: Rule, node: ast.AST, form: str = "", variant: str | None = None) -> None:
        if self.exemption is not None:
            self._used.add(self.exemption)
        self.findings.append(RawFinding(rule, variant, getattr(node, "lineno", 1), self.mod.column(node), form,
                                        self.exemption))

    def emit(self, event: str, *args) -> None:
        for hook in self._hooks.get(event, ()):
            hook(self, *args)

    # regions -------------------------------------------------------------------
    @contextmanager
    def region(self, kind: str | None, detail: str, first: ast.AST | None, last: ast.AST | None = None):
        if kind is None or self.exemption is not None or first is None:
            yield
            return
        last = last or first
        ex = Exemption(kind, detail, self.mod.path, self.func.qualname, first.lineno,
                       getattr(last, "end_lineno", None) or last.lineno)
        self.regions.append(ex)
        saved, self.exemption = self.exemption, ex
        try:
            yield
        finally:
            self.exemption = saved

    def _raises(self, stmts: list[ast.stmt]) -> bool:
        return "error-path" not in self.strict and regions.raises(stmts, self.analysis.always_raises_call(self))

    def _branch(self, node: ast.If | ast.IfExp, stmts, kind: str | None, which: str):
        """The region of one branch of an ``if``: its test's kind, else an error path when it raises."""
        if isinstance(stmts, list):
            if kind is None and self._raises(stmts):
                kind = "error-path"
            first, last = (stmts[0], stmts[-1]) if stmts else (None, None)
        else:
            first = last = stmts
        test = vocab.segment(node.test, 50)
        detail = f"the {_BRANCH_LABEL.get(kind, kind)} {which} branch of `if {test}:` (line {node.lineno})"
        return self.region(kind, detail, first, last)

    # traversal -----------------------------------------------------------------
    def run(self) -> None:
        """Check the body; keep the regions that allowed something (a raise-only branch with no sync is no news)."""
        self._block(self.func.node.body)
        self.regions = [r for r in self.regions if r in self._used]

    def _block(self, stmts: list[ast.stmt]) -> None:
        saved = self.exemption
        for i, stmt in enumerate(stmts):
            self.visit(stmt)
            if isinstance(stmt, ast.If) and self.exemption is None and i + 1 < len(stmts):
                kind = self._after_if(stmt)
                if kind is not None:
                    label = {"eager": "eager code", "cpu-only": "CPU-only code", "checked": "checked-mode code"}[kind]
                    detail = f"{label} after `if {vocab.segment(stmt.test, 50)}:` returns (line {stmt.lineno})"
                    ex = Exemption(kind, detail, self.mod.path, self.func.qualname, stmts[i + 1].lineno,
                                   stmts[-1].end_lineno or stmts[-1].lineno)
                    self.regions.append(ex)
                    self.exemption = ex
        self.exemption = saved

    def _after_if(self, node: ast.If) -> str | None:
        """The kind of the rest of a block after an ``if`` whose one branch always leaves it."""
        body_kind, else_kind = regions.classify(node.test, self.strict)
        check = self.analysis.always_raises_call(self)
        body_ends, else_ends = regions.terminates(node.body, check), regions.terminates(node.orelse, check)
        if body_ends and not else_ends:
            return else_kind
        if else_ends and not body_ends:
            return body_kind
        return None

    def generic_visit(self, node: ast.AST) -> None:
        for _field, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self._block(value)
                else:
                    for item in value:
                        if isinstance(item, ast.AST):
                            self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        # a nested def: its body runs when called; nested functions are checked as part of the parent
        self._block(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        return None

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.body)

    def visit_If(self, node: ast.If | ast.IfExp) -> None:
        """The test runs always; each branch in the region its side of the test implies."""
        body_kind, else_kind = regions.classify(node.test, self.strict)
        self.truth(node.test, "if ...:" if isinstance(node, ast.If) else "... if ... else ...")
        self.visit(node.test)
        for branch, kind, which in ((node.body, body_kind, "true"), (node.orelse, else_kind, "false")):
            with self._branch(node, branch, kind, which):
                self._block(branch) if isinstance(branch, list) else self.visit(branch)

    visit_IfExp = visit_If

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        kind = "error-path" if node.body and self._raises(node.body) else None
        with self.region(kind, f"an `except` block that re-raises (line {node.lineno})", node.body[0], node.body[-1]):
            self._block(node.body)

    def visit_While(self, node: ast.While) -> None:
        self.truth(node.test, "while ...:")
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.truth(node.test, "assert ...")
        self.visit(node.test)
        if node.msg is not None:
            with self.region(None if "error-path" in self.strict else "error-path",
                             f"the message of a failing assert (line {node.lineno})", node.msg):
                self.visit(node.msg)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for cond in node.ifs:
            self.truth(cond, "comprehension filter")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        saved = self.exemption
        for value in node.values[:-1]:
            self.truth(value, "and/or")
            self.visit(value)
            self._enter_and_region(node, value)
        self.visit(node.values[-1])
        self.exemption = saved

    def _enter_and_region(self, node: ast.BoolOp, value: ast.expr) -> None:
        """In ``a and b``, ``b`` runs only when ``a`` holds: in ``a``'s region, if it implies one."""
        if not isinstance(node.op, ast.And) or self.exemption is not None:
            return
        kind, _ = regions.classify(value, self.strict)
        if kind is not None:
            ex = Exemption(kind, f"guarded by `{vocab.segment(value, 40)}` (line {value.lineno})", self.mod.path,
                           self.func.qualname, value.lineno, node.end_lineno or node.lineno)
            self.regions.append(ex)
            self.exemption = ex

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self.truth(node.operand, "not ...")
        self.generic_visit(node)

    def truth(self, test: ast.expr, form: str) -> None:
        """A value tested for truth; an ``and``/``or`` tests its last operand here (the others in visit_BoolOp)."""
        if isinstance(test, ast.BoolOp):
            saved = self.exemption
            for value in test.values[:-1]:
                self._enter_and_region(test, value)
            self.truth(test.values[-1], form)
            self.exemption = saved
            return
        self.emit("truth", test, form)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self.emit("fstring", node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self._index(node, None)
        self.generic_visit(node)

    def _index(self, node: ast.Subscript, store_value: ast.expr | None) -> None:
        """Indexing a tensor: the hooks get its index parts (``t[a, b]`` -> [a, b])."""
        if self.ev.is_tensor(node.value):
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            self.emit("index", node, parts, store_value)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._store(target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Subscript):
            self._index(node.target, None)  # t[mask] += 1 reads through the mask too
        self.generic_visit(node)

    def _store(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t, v in vocab.pair_targets(target, value):
                if t is not target:
                    self._store(t, v)
            return
        if isinstance(target, ast.Subscript):
            self._index(target, value)
            self.emit("store", target, value)

    def visit_Call(self, node: ast.Call) -> None:
        self.emit("call", node, vocab.torch_attr(node.func))
        self._collect_call(node)
        self.generic_visit(node)

    # calls ---------------------------------------------------------------------
    def resolve_call(self, node: ast.Call) -> tuple[Func, Class | None, bool] | None:
        """(callee, its self class, whether the call binds self) for a call into the checked tree."""
        project, func = self.project, node.func
        if isinstance(func, ast.Name):
            found = project.lookup(self.mod, func.id)
            if isinstance(found, Func):
                return found, None, False
            if isinstance(found, Class):
                init = project.find_method(found, "__init__")
                return (init, found, True) if init else None
            return None
        if not isinstance(func, ast.Attribute):
            return None
        recv = func.value
        own = self.self_cls
        if isinstance(recv, ast.Name) and own is not None and recv.id in (self.self_name, "cls"):
            callee = project.find_method(own, func.attr)
            return (callee, own, True) if callee else None
        if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Name) and recv.func.id == "super" and own:
            defining = project.class_of(self.func)
            if len(recv.args) == 2:
                named = project.resolve_expr(self.mod, recv.args[0])
                defining = named if isinstance(named, Class) else defining
            callee = project.find_method(own, func.attr, after=defining)
            return (callee, own, True) if callee else None
        base = project.resolve_expr(self.mod, recv)
        if isinstance(base, Module):
            found = project.lookup(base, func.attr)
            if isinstance(found, Func):
                return found, None, False
            if isinstance(found, Class):
                init = project.find_method(found, "__init__")
                return (init, found, True) if init else None
        if isinstance(base, Class):
            callee = project.find_method(base, func.attr)
            if callee is None:
                return None
            if vocab.has_decorator(callee.node, "staticmethod", "classmethod"):
                return callee, base, vocab.has_decorator(callee.node, "classmethod")
            # Base.method(self, …): an explicit self keeps the caller's class
            explicit_self = node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == self.self_name
            return callee, own if explicit_self else base, False
        return None

    def _callee(self, node: ast.Call) -> Func | None:
        resolved = self.resolve_call(node)
        return resolved[0] if resolved else None

    def _collect_call(self, node: ast.Call) -> None:
        resolved = self.resolve_call(node)
        if resolved is None:
            return
        callee, self_cls, bound = resolved
        if callee.is_kernel:
            return
        cenv = Env()
        fargs = callee.node.args
        params = [a.arg for a in fargs.posonlyargs + fargs.args]
        if bound and callee.cls and params and not vocab.has_decorator(callee.node, "staticmethod"):
            params = params[1:]
        for p, a in zip(params, node.args, strict=False):
            self._bind_param(cenv, p, a)
        for kw in node.keywords:
            if kw.arg is not None:
                self._bind_param(cenv, kw.arg, kw.value)
        if self.exemption is not None:
            self._used.add(self.exemption)
        self.calls.append(Call(callee, cenv, self_cls, node, self.exemption))

    def _bind_param(self, cenv: Env, param: str, arg: ast.expr) -> None:
        ev = self.ev
        for ok, into in ((ev.is_table, cenv.tables), (ev.is_tensor, cenv.tensors), (ev.is_mask, cenv.masks),
                         (ev.is_host, cenv.hosts), (ev.is_pyscalar, cenv.scalars)):
            if ok(arg):
                into.add(param)
