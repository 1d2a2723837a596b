"""The module and class model: parsed files, their imports, classes and methods.

Why a project and not a file: a production allocator spreads one free path over
modules (a subclass's ``free_group_end`` calls ``super().free_group_end()`` in a base
class elsewhere, which calls back ``self.free``). The project loads the files given
and, on demand, the modules they import from the same tree (never site-packages), so
calls can be followed across them and a finding shows its chain from the entry point.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from dataclasses import dataclass, field

from . import vocab
from .annotations import note_annotation


class ParseError(Exception):
    """A file that cannot be read, decoded or parsed: exit 2."""


@dataclass
class Func:
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    module: Module
    cls: str | None
    is_kernel: bool

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def key(self) -> tuple[str, str]:
        return (self.module.realpath, self.qualname)

    def self_name(self) -> str | None:
        args = self.node.args.posonlyargs + self.node.args.args
        if self.cls and args and not vocab.has_decorator(self.node, "staticmethod"):
            return args[0].arg
        return None

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, Func) and other.key == self.key


@dataclass
class Class:
    name: str
    node: ast.ClassDef
    module: Module
    methods: dict[str, Func] = field(default_factory=dict)
    # attribute kinds from ``self.X = …`` anywhere in the class (filled by kinds.class_attrs)
    table_attrs: set[str] = field(default_factory=set)
    tensor_attrs: set[str] = field(default_factory=set)
    host_attrs: set[str] = field(default_factory=set)
    mask_attrs: set[str] = field(default_factory=set)
    scalar_attrs: set[str] = field(default_factory=set)
    not_tensor_attrs: set[str] = field(default_factory=set)  # annotated as something else
    attrs_done: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.module.realpath, self.name)

    @property
    def is_abstract(self) -> bool:
        """Declared abstract (``ABC`` base, ``ABCMeta``, an ``@abstractmethod``): never instantiated itself."""
        named = [ast.unparse(b) for b in self.node.bases] + [
            ast.unparse(k.value) for k in self.node.keywords if k.arg == "metaclass"]
        if any(n.split(".")[-1] in ("ABC", "ABCMeta") for n in named):
            return True
        return any(ast.unparse(d).split(".")[-1] == "abstractmethod"
                   for m in self.methods.values() for d in m.node.decorator_list)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, Class) and other.key == self.key


@dataclass(frozen=True)
class ImportRef:
    module: str  # dotted module name: absolute, or relative to ``anchor``
    symbol: str | None  # None: the name is the module itself
    # A relative import of a file: the directory it is relative to. Resolved on disk, not
    # by dotted name, so it holds in a package without ``__init__.py`` files too.
    anchor: str | None = None


_PRAGMA = re.compile(r"#\s*sync-ok\s*(?::\s*(?P<reason>.*))?$")


def pragmas(source: str) -> dict[int, str]:
    """line -> reason ('' when the pragma gives none)."""
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                m = _PRAGMA.search(tok.string)
                if m:
                    out[tok.start[0]] = (m.group("reason") or "").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


class Module:
    def __init__(self, tree: ast.Module, path: str, source: str, modname: str, is_package: bool, target: bool,
                 directory: str | None = None, root: str | None = None):
        self.tree = tree
        self.path = path  # as displayed
        self.realpath = os.path.realpath(path) if not path.startswith("<") else path
        self.modname = modname
        self.is_package = is_package
        self.target = target  # given to check (roots come from targets only)
        # of a file (None for a source string): where its relative imports start, and the
        # directory above its top package, where its absolute imports are looked up first
        self.directory = directory
        self.root = root
        self.lines = source.splitlines()
        self.functions: dict[str, Func] = {}
        self.classes: dict[str, Class] = {}
        self.imports: dict[str, ImportRef] = {}
        self.scalars: set[str] = set()
        self.negative_names: set[str] = set()
        self.pragmas = pragmas(source)
        for stmt in tree.body:
            self._top_level(stmt)

    def _top_level(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._add_func(stmt, None, stmt.name)
        elif isinstance(stmt, ast.ClassDef):
            self._add_class(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            self._constant(stmt, self.scalars)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self._import(stmt)
        elif isinstance(stmt, (ast.If, ast.Try)):  # try: import … except ImportError: …, if TYPE_CHECKING:
            for block in (stmt.body, getattr(stmt, "orelse", []), *(h.body for h in getattr(stmt, "handlers", []))):
                for s in block:
                    if isinstance(s, (ast.Import, ast.ImportFrom)):
                        self._import(s)

    @property
    def package(self) -> str:
        return self.modname if self.is_package else self.modname.rpartition(".")[0]

    def _import(self, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    self.imports[alias.asname] = ImportRef(alias.name, None)
                else:
                    head = alias.name.split(".")[0]
                    self.imports[head] = ImportRef(head, None)
            return
        base = stmt.module or ""
        if stmt.level and self.directory is not None:
            anchor = self.directory
            for _ in range(stmt.level - 1):
                anchor = os.path.dirname(anchor)
            for alias in stmt.names:
                if alias.name != "*":
                    self.imports[alias.asname or alias.name] = ImportRef(base, alias.name, anchor)
            return
        if stmt.level:
            parts = self.package.split(".") if self.package else []
            parts = parts[: len(parts) - (stmt.level - 1)] if stmt.level > 1 else parts
            base = ".".join([*parts, *([stmt.module] if stmt.module else [])])
        for alias in stmt.names:
            if alias.name != "*":
                self.imports[alias.asname or alias.name] = ImportRef(base, alias.name)

    def _constant(self, stmt: ast.Assign | ast.AnnAssign, into: set[str]) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if stmt.value is None:
            return
        for t in targets:
            if isinstance(t, ast.Name) and vocab.is_scalar_constant(stmt.value):
                into.add(t.id)
                if vocab.is_negative_constant(stmt.value):
                    self.negative_names.add(t.id)

    def _add_func(self, node, cls: str | None, qualname: str) -> Func:
        is_kernel = any(vocab.decorator_is_kernel(d) for d in node.decorator_list)
        func = Func(qualname, node, self, cls, is_kernel)
        self.functions[qualname] = func
        return func

    def _add_class(self, node: ast.ClassDef) -> None:
        cls = Class(node.name, node, self)
        self.classes[node.name] = cls
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cls.methods[stmt.name] = self._add_func(stmt, node.name, f"{node.name}.{stmt.name}")
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self._constant(stmt, cls.scalar_attrs)
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    note_annotation(stmt.annotation, stmt.target.id, cls.tensor_attrs, cls.not_tensor_attrs)

    def column(self, node: ast.AST) -> int:
        """1-based column in characters (``col_offset`` counts UTF-8 bytes)."""
        line_no = getattr(node, "lineno", 1)
        offset = getattr(node, "col_offset", 0)
        if 0 < line_no <= len(self.lines):
            return len(self.lines[line_no - 1].encode("utf-8")[:offset].decode("utf-8", "replace")) + 1
        return offset + 1


def module_name(path: str) -> tuple[str, str | None, bool]:
    """(dotted name, import root, is a package) of a file, from the ``__init__.py`` files above it."""
    path = os.path.abspath(path)
    directory, base = os.path.split(path)
    stem = os.path.splitext(base)[0]
    is_package = stem == "__init__"
    parts = [] if is_package else [stem]
    while os.path.exists(os.path.join(directory, "__init__.py")):
        directory, pkg = os.path.split(directory)
        parts.insert(0, pkg)
    return ".".join(parts) or stem, directory, is_package


def _dotted(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def read_source(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise ParseError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        return tokenize.decode_source(raw) if hasattr(tokenize, "decode_source") else raw.decode("utf-8")
    except (UnicodeDecodeError, SyntaxError) as e:
        raise ParseError(f"{path}: cannot decode: {e}") from e


def parse(source: str, path: str) -> ast.Module:
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as e:
        raise ParseError(f"{path}:{e.lineno or 0}:{(e.offset or 0)}: cannot parse: {e.msg}") from e
    except ValueError as e:  # null bytes
        raise ParseError(f"{path}: cannot parse: {e}") from e


def display_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


class Project:
    """The modules under check and the ones they import from the same tree."""

    def __init__(self) -> None:
        self.modules: dict[str, Module] = {}  # realpath -> module
        self.by_name: dict[str, Module] = {}
        self.roots: list[str] = []  # import roots, searched for absolute imports
        # A directory above a loaded file (no ``__init__.py`` needed) may be a namespace
        # package: ``pool/`` makes ``pool.x`` importable from the directory above it.
        self.namespaces: dict[str, list[str]] = {}  # its name -> the directories holding one
        self._missing: set[str] = set()
        self._found: dict[tuple[str, str], Module | None] = {}  # (directory, dotted name) -> module
        self._mro: dict[tuple, list[Class]] = {}

    # loading -------------------------------------------------------------
    def add_source(self, source: str, path: str, modname: str | None = None, target: bool = True) -> Module:
        tree = parse(source, path)
        name = modname or os.path.splitext(os.path.basename(path))[0]
        mod = Module(tree, path, source, name, False, target)
        self._register(mod)
        return mod

    def add_file(self, path: str, target: bool = True, shown: str | None = None) -> Module:
        real = os.path.realpath(path)
        if real in self.modules:
            mod = self.modules[real]
            mod.target = mod.target or target
            return mod
        source = read_source(path)
        modname, root, is_package = module_name(path)
        if root and root not in self.roots:
            self.roots.append(root)
            self._note_namespaces(root)
            self._missing.clear()  # a name missing so far may be found under the new root
        mod = Module(parse(source, path), shown or path, source, modname, is_package, target,
                     directory=os.path.dirname(os.path.abspath(path)), root=root)
        self._register(mod)
        return mod

    def _note_namespaces(self, root: str) -> None:
        """Every directory from a file's import root up may be a namespace package of the directory above."""
        here = root
        while True:
            parent, name = os.path.split(here)
            if not name or parent == here:
                return
            if name.isidentifier() and parent not in self.namespaces.setdefault(name, []):
                self.namespaces[name].append(parent)
            here = parent

    def _register(self, mod: Module) -> None:
        self.modules[mod.realpath] = mod
        self.by_name.setdefault(mod.modname, mod)

    def targets(self) -> list[Module]:
        return [m for m in self.modules.values() if m.target]

    def module(self, modname: str, anchor: str | None = None, near: Module | None = None) -> Module | None:
        """An importable module of the checked tree, loaded on first use; None outside it.

        A relative import (``anchor``, its directory) is looked up there only. An absolute
        one is looked up first under the importing module's own root (``near``: a flat
        folder imports its neighbours), then by name, under every import root, and under
        the directories holding a namespace package of its first name (``pool.x`` from a
        ``pool/`` folder without ``__init__.py``).
        """
        if anchor is not None:
            return self._find(anchor, modname)
        if not modname:
            return None
        if near is not None and near.root is not None:
            found = self._find(near.root, modname)
            if found is not None:
                return found
        if modname in self.by_name:
            return self.by_name[modname]
        if modname in self._missing:
            return None
        for root in (*self.roots, *self.namespaces.get(modname.split(".")[0], ())):
            found = self._find(root, modname)
            if found is not None:
                self.by_name[modname] = found
                return found
        self._missing.add(modname)
        return None

    def _find(self, directory: str, modname: str) -> Module | None:
        """The module ``modname`` names under ``directory`` (``""``: the package of the directory itself)."""
        key = (directory, modname)
        if key not in self._found:
            rel = os.path.join(directory, *modname.split(".")) if modname else directory
            found = None
            for cand in ((rel + ".py") if modname else None, os.path.join(rel, "__init__.py")):
                if cand is not None and os.path.isfile(cand):
                    try:
                        found = self.add_file(cand, target=False, shown=display_path(cand))
                    except ParseError:
                        continue
                    break
            self._found[key] = found
        return self._found[key]

    def imported(self, mod: Module, ref: ImportRef) -> Module | None:
        """The module an import of ``mod`` names (``from M import s``: M, or M.s when s is a module)."""
        return self.module(ref.module, ref.anchor, mod)

    # symbols ---------------------------------------------------------------
    def lookup(self, mod: Module, name: str, depth: int = 0):
        """What ``name`` means at the top level of ``mod``: a Func, a Class, a Module, or None."""
        if depth > 8:
            return None
        if name in mod.functions:
            return mod.functions[name]
        if name in mod.classes:
            return mod.classes[name]
        ref = mod.imports.get(name)
        if ref is None:
            return None
        target = self.imported(mod, ref)
        if ref.symbol is None:
            return target
        if target is not None and target is not mod:
            found = self.lookup(target, ref.symbol, depth + 1)
            if found is not None:
                return found
        return self.module(_dotted(ref.module, ref.symbol), ref.anchor, mod)

    def resolve_expr(self, mod: Module, node: ast.expr):
        """A Name or dotted Attribute chain at module level: Func, Class, Module, or None."""
        if isinstance(node, ast.Name):
            return self.lookup(mod, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve_expr(mod, node.value)
            if base is None:  # ``pool.helpers`` of ``import pool.helpers``, ``pool`` a namespace package
                spelled = self._spelled_module(mod, node.value)
                return self.module(_dotted(spelled[0], node.attr), spelled[1], mod) if spelled else None
            if isinstance(base, Module):
                return self.lookup(base, node.attr) or self.module(f"{base.modname}.{node.attr}", near=base)
            if isinstance(base, Class):
                meth = self.find_method(base, node.attr)
                return meth
        return None

    def is_scalar_name(self, mod: Module, name: str) -> bool:
        """A module constant such as ``TOMBSTONE = -1``, here or imported from the tree."""
        if name in mod.scalars:
            return True
        ref = mod.imports.get(name)
        if ref is None or ref.symbol is None:
            return False
        target = self.imported(mod, ref)
        return target is not None and target is not mod and self.is_scalar_name(target, ref.symbol)

    def _spelled_module(self, mod: Module, node: ast.expr) -> tuple[str, str | None] | None:
        """(dotted name, anchor) a chain of names starting at an import spells, whether or not it resolves."""
        if isinstance(node, ast.Name):
            ref = mod.imports.get(node.id)
            if ref is None:
                return None
            return (ref.module, None) if ref.symbol is None else (_dotted(ref.module, ref.symbol), ref.anchor)
        if isinstance(node, ast.Attribute):
            inner = self._spelled_module(mod, node.value)
            return (_dotted(inner[0], node.attr), inner[1]) if inner else None
        return None

    def negative_names(self, mod: Module) -> set[str]:
        names = set(mod.negative_names)
        for local, ref in mod.imports.items():
            if ref.symbol is not None:
                target = self.imported(mod, ref)
                if target is not None and target is not mod and ref.symbol in target.negative_names:
                    names.add(local)
        return names

    # classes -----------------------------------------------------------------
    def bases(self, cls: Class) -> list[Class]:
        out = []
        for b in cls.node.bases:
            found = self.resolve_expr(cls.module, b)
            if isinstance(found, Class) and found is not cls:
                out.append(found)
        return out

    def mro(self, cls: Class) -> list[Class]:
        """C3 linearisation over the bases found in the tree (unresolved bases are left out)."""
        if cls.key in self._mro:
            return self._mro[cls.key]
        self._mro[cls.key] = [cls]  # a cycle guard while computing
        seqs = [list(self.mro(b)) for b in self.bases(cls)] + [self.bases(cls)]
        out = [cls]
        while any(seqs):
            for seq in seqs:
                if not seq:
                    continue
                head = seq[0]
                if not any(head in s[1:] for s in seqs):
                    break
            else:  # inconsistent hierarchy: depth-first, first occurrence wins
                rest = [c for s in seqs for c in s]
                out += [c for i, c in enumerate(rest) if c not in out and c not in rest[:i]]
                break
            out.append(head)
            seqs = [s[1:] if s and s[0] == head else s for s in seqs]
        self._mro[cls.key] = out
        return out

    def find_method(self, cls: Class, name: str, after: Class | None = None) -> Func | None:
        order = self.mro(cls)
        if after is not None and after in order:
            order = order[order.index(after) + 1:]
        for c in order:
            if name in c.methods:
                return c.methods[name]
        return None

    def class_of(self, func: Func) -> Class | None:
        return func.module.classes.get(func.cls) if func.cls else None

    def subclassed(self) -> set[tuple]:
        """Classes that some loaded target class derives from."""
        out = set()
        for mod in self.targets():
            for cls in mod.classes.values():
                for base in self.mro(cls)[1:]:
                    out.add(base.key)
        return out
