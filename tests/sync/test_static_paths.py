"""check-sync on a production-shaped allocator: entry points, calls across modules, allowed regions, annotations."""

from __future__ import annotations

import ast
import os
import re
import textwrap

import pytest
import torch

from fuzz.sync import cli as sync_cli
from fuzz.sync import static
from fuzz.sync.runtime import record_host_syncs
from fuzz.sync.static.regions import KINDS

HERE = os.path.dirname(os.path.abspath(__file__))
MULTI = os.path.relpath(os.path.join(os.path.dirname(HERE), "fixtures", "sync", "multi_ended"))
MARKER = re.compile(r"# (expect: (?P<code>SYNC\d\d) from (?P<entry>\S+)|allowed: (?P<kind>[a-z-]+)|quiet)")


def _markers() -> tuple[dict, dict, set]:
    """(path, line) -> (code, entry) / kind, and the quiet lines, from the fixture's comments."""
    expect, allowed, quiet = {}, {}, set()
    for name in sorted(os.listdir(MULTI)):
        if not name.endswith(".py") or name == "__init__.py":  # the package docstring explains the markers
            continue
        path = os.path.join(MULTI, name)
        for i, line in enumerate(open(path), 1):
            m = MARKER.search(line)
            if m and m.group("code"):
                expect[(path, i)] = (m.group("code"), m.group("entry"))
            elif m and m.group("kind"):
                allowed[(path, i)] = m.group("kind")
            elif m:
                quiet.add((path, i))
    return expect, allowed, quiet


def _fixture_files() -> list[str]:
    return static.discover.expand([MULTI])


# ------------------------------------------------------------------ the acceptance fixture


def test_fixture_yields_exactly_its_planted_lazy_path_syncs_with_their_chains():
    expect, allowed, quiet = _markers()
    assert len(expect) == 4 and len(allowed) >= 10 and len(quiet) >= 4  # the fixture still has its traps
    report = static.check_paths(_fixture_files())
    assert not report.errors
    got = {(f.path, f.line): (f.code, f.entry) for f in report.findings}
    assert got == expect
    by_line = {(f.path, f.line): f for f in report.findings}
    cross = by_line[next(k for k, v in expect.items() if v[1] == "MultiEndedAllocator.free_group_end")]
    assert cross.chain_text == ("MultiEndedAllocator.free_group_end → BasePagedAllocator.free_group_end "
                                "(base_allocator.py) → BasePagedAllocator._merge_group (base_allocator.py)")
    lazy = by_line[next(k for k, v in expect.items() if v[1] == "MultiEndedAllocator.free")]
    assert lazy.chain_text == "MultiEndedAllocator.free → MultiEndedAllocator._free_lazy"
    assert lazy.also_from == ("MultiEndedAllocator.free_group_end",)  # the positionless free-group path
    assert {(f.path, f.line): f.exemption.kind for f in report.allowed} == allowed
    mentioned = {(f.path, f.line) for f in report.findings + report.allowed}
    assert not mentioned & quiet


def test_verbose_lists_every_exempted_region_with_its_reason(capsys):
    _, allowed, _ = _markers()
    assert sync_cli.main(["-v", MULTI]) == 1
    out = capsys.readouterr().out
    for (path, line), kind in allowed.items():
        assert re.search(rf"^{re.escape(path)}:{line}:\d+: allowed SYNC\d\d \({kind}: ", out, re.M), (path, line)
    regions = re.findall(r"^(\S+):(\d+)-(\d+): allowed region \(([\w-]+)\) in \S+: (.*)$", out, re.M)
    exempt = re.findall(r"^\S+: exempt \S+: reached only from ([\w-]+) code: (.*)$", out, re.M)
    assert {k for *_, k, _ in regions} == {"eager", "error-path", "cpu-only"}
    for *_, kind, reason in regions:
        assert reason.endswith(KINDS[kind])
    for kind, reason in exempt:
        assert reason.endswith(KINDS[kind])
    # each allowed line lies in a listed region, or in a function listed as exempt
    exempt_funcs = re.findall(r"^\S+: exempt (\S+):", out, re.M)
    assert {"MultiEndedAllocator.compact", "MultiEndedAllocator.relocate", "MultiEndedAllocator._dump_state",
            "_read_table_on_host"} <= set(exempt_funcs)
    listed = [(p, int(a), int(b)) for p, a, b, _k, _r in regions]
    for path, line in allowed:
        in_region = any(p == path and a <= line <= b for p, a, b in listed)
        func = _function_at(path, line)
        assert in_region or any(q.split(".")[-1] == func for q in exempt_funcs), (path, line)


def _function_at(path: str, line: int) -> str:
    defs = [n for n in ast.walk(ast.parse(open(path).read())) if isinstance(n, ast.FunctionDef)
            and n.lineno <= line <= n.end_lineno]
    return max(defs, key=lambda n: n.lineno).name


def test_each_allowed_kind_can_be_made_strict():
    """``compact`` is reached from the eager branch; made strict, the eager branch still calls a flush,
    which SPEC.md §3 allows too: all of it is reported only with both kinds strict."""
    _, allowed, _ = _markers()
    base = {(f.path, f.line) for f in static.check_paths(_fixture_files()).findings}
    for kind, strict in (("eager", {"eager", "flush"}), ("error-path", {"error-path"}), ("cpu-only", {"cpu-only"})):
        settings = static.Settings(strict=frozenset(strict))
        report = static.check_paths(_fixture_files(), settings)
        lines = {(f.path, f.line) for f in report.findings}
        assert lines == base | {k for k, v in allowed.items() if v == kind}, kind


def test_the_fixture_is_real_code_and_the_runtime_detector_agrees_with_the_markers():
    """The planted syncs happen on the lazy path at run time, and the eager/error/CPU ones only there."""
    from tests.fixtures.sync.multi_ended.multi_ended_allocator import FloatSlotPool, MultiEndedAllocator
    from tests.fixtures.sync.multi_ended.read_table import build_kv_read_table

    expect, allowed, _ = _markers()

    def lines(events) -> set:
        return {(os.path.relpath(e.filename), e.lineno) for e in events}

    pool = MultiEndedAllocator(32, page_size=1, lazy_compaction=True)
    runs = [pool.alloc_extend(k) for k in (3, 2, 4)]
    with record_host_syncs() as events:
        pool.free(runs[0], page_ids=runs[0])  # page ids given: the lazy free does not sync
    assert events == []
    with record_host_syncs() as events:
        pool.free(runs[1])
    assert lines(events) == {k for k, v in expect.items() if v[1] == "MultiEndedAllocator.free"}
    pool.free_group_begin()
    pool.free(runs[2][:2])
    pool.free(runs[2][2:])
    with record_host_syncs() as events:
        pool.free_group_end()
    assert lines(events) == {k for k, v in expect.items() if v[1] in (
        "MultiEndedAllocator.free", "MultiEndedAllocator.free_group_end")}

    eager = MultiEndedAllocator(32, page_size=1, lazy_compaction=False)
    runs = [eager.alloc_extend(k) for k in (3, 2, 4)]
    with record_host_syncs() as events:
        eager.free(runs[0])
    assert events and lines(events) <= {k for k, v in allowed.items() if v == "eager"}
    assert eager.moved == 3 and eager.high == 7  # the survivors moved down: it really compacted

    slots, freed = FloatSlotPool(8), torch.tensor([1, 2])  # made before the detector: a device tensor there
    with record_host_syncs() as events:
        slots.free(freed)
    assert lines(events) == {k for k, v in expect.items() if v[1] == "FloatSlotPool.free"}

    out = torch.full((2, 4), -7, dtype=torch.int32)
    req_to_token = torch.arange(8, dtype=torch.int64).reshape(2, 4)
    with record_host_syncs() as events:
        build_kv_read_table(req_to_token, torch.arange(2), torch.tensor([4, 2]), pool.v2p, 1, 4, out)
    assert events and lines(events) <= {k for k, v in allowed.items() if v == "cpu-only"}


# ------------------------------------------------------------------ regions, one at a time


def findings(src: str, **kw) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in static.check_source(textwrap.dedent(src), "m.py", **kw).findings]


def allowed(src: str, **kw) -> list[tuple[str, str]]:
    return [(f.code, f.exemption.kind) for f in static.check_source(textwrap.dedent(src), "m.py", **kw).allowed]


LAZY_EARLY_RETURN = """
import torch

class Pool:
    def free(self, pages: torch.Tensor):
        if self.lazy_compaction:
            self.v2p.index_fill_(0, pages, -1)
            return
        n = pages.tolist()
"""


def test_code_after_the_lazy_branch_returns_is_eager():
    assert findings(LAZY_EARLY_RETURN) == []
    assert allowed(LAZY_EARLY_RETURN) == [("SYNC02", "eager")]
    assert findings(LAZY_EARLY_RETURN, strict=("eager",)) == [("SYNC02", 9)]
    # without the return, the code after the if runs in lazy mode too
    assert findings(LAZY_EARLY_RETURN.replace("            return\n", "")) == [("SYNC02", 8)]


@pytest.mark.parametrize("test,eager_branch", [
    ("self.lazy", "else"), ("not self.lazy", "body"), ("self.config.lazy", "else"), ("self.eager", "body"),
    ("self.mode == 'eager'", "body"), ("self.mode != 'lazy'", "body"), ("self.mode is FreeMode.LAZY", "else"),
    ("self.lazy is False", "body"), ("self.lazy and pages.numel() > 0", None),
])
def test_lazy_and_eager_tests(test, eager_branch):
    src = f"""
    import torch

    class Pool:
        def free(self, pages: torch.Tensor):
            if {test}:
                a = pages.tolist()
            else:
                b = pages.tolist()
    """
    lines = {7: "body", 9: "else"}
    reported = {lines[line] for _, line in findings(src)}
    assert reported == {"body", "else"} - {eager_branch}


ERROR_PATH = """
import torch

class Pool:
    def free(self, pages: torch.Tensor):
        if pages.numel() > self.capacity:
            self._dump(pages)
            raise AssertionError(f"bad free {pages.tolist()}")
        self.v2p.index_fill_(0, pages, -1)

    def _dump(self, pages: torch.Tensor):
        print(self.v2p.tolist())
"""


def test_a_branch_that_only_leads_to_raise_is_an_error_path():
    plan = static.check_source(textwrap.dedent(ERROR_PATH), "m.py")
    assert plan.findings == []
    assert sorted(allowed(ERROR_PATH)) == [("SYNC02", "error-path"), ("SYNC02", "error-path")]
    assert plan.exempt["Pool._dump"].startswith("reached only from error-path code: the raising true branch")
    assert findings(ERROR_PATH, strict=("error-path",)) == [("SYNC02", 8), ("SYNC02", 12)]


def test_the_test_of_a_raising_branch_still_runs_every_time():
    src = ERROR_PATH.replace("if pages.numel() > self.capacity:", "if (self.v2p[pages] == -1).any():")
    assert findings(src) == [("SYNC06", 6)]


def test_a_branch_that_may_return_is_not_an_error_path():
    src = ERROR_PATH.replace("            self._dump(pages)\n", "            if self.quiet:\n                return\n")
    assert findings(src) == [("SYNC02", 9)]


def test_a_helper_that_always_raises_makes_its_call_site_an_error_path():
    src = """
    import torch

    class Pool:
        def free(self, pages: torch.Tensor):
            if pages.numel() > self.capacity:
                log = pages.tolist()
                self._fail(log)
            self.v2p.index_fill_(0, pages, -1)

        def _fail(self, log):
            raise AssertionError(log)
    """
    assert findings(src) == [] and allowed(src) == [("SYNC02", "error-path")]


def test_an_except_block_that_reraises_and_a_failing_asserts_message_are_error_paths():
    src = """
    import torch

    def free(v2p, pages: torch.Tensor):
        try:
            v2p.index_fill_(0, pages, -1)
        except RuntimeError:
            print(pages.tolist())
            raise
        assert pages.numel() > 0, f"empty free {pages.tolist()}"
    """
    assert findings(src) == [] and sorted(allowed(src)) == [("SYNC02", "error-path")] * 2


@pytest.mark.parametrize("guard,cpu_branch", [
    ("not v2p.is_cuda", "body"), ("v2p.is_cuda", "else"), ("v2p.is_cpu", "body"),
    ("v2p.device.type == 'cpu'", "body"), ("v2p.device.type != 'cpu'", "else"), ("v2p.device.type == 'cuda'", "else"),
    ("str(v2p.device) == 'cpu'", "body"), ("not torch.cuda.is_available()", "body"),
    ("not v2p.is_cuda and pages.numel() > 0", "body"), ("not v2p.is_cuda or pages.numel() > 0", None),
    ("pages.numel() > 0", None),
])
def test_cpu_only_branches_are_skipped(guard, cpu_branch):
    src = f"""
    import torch

    def build_read_table(v2p, pages: torch.Tensor):
        if {guard}:
            a = pages.tolist()
        else:
            b = pages.tolist()
    """
    lines = {6: "body", 8: "else"}
    assert {lines[line] for _, line in findings(src)} == {"body", "else"} - {cpu_branch}
    assert len(findings(src, strict=("cpu-only",))) == 2


def test_code_after_the_cuda_branch_returns_is_cpu_only():
    src = """
    import torch

    def build_read_table(v2p, pages: torch.Tensor):
        if v2p.is_cuda:
            return v2p[pages]
        return torch.tensor(pages.tolist())
    """
    assert findings(src) == [] and allowed(src) == [("SYNC02", "cpu-only")]


def test_checked_mode_follows_the_polarity_of_its_test():
    src = """
    import torch

    class Pool:
        def free(self, pages: torch.Tensor):
            if not self.checked:
                fast = pages.tolist()
            else:
                slow = pages.tolist()
            if self.checked and (self.v2p[pages] == -1).any():
                raise ValueError("double free")
    """
    assert findings(src) == [("SYNC02", 7)]
    assert findings(src, strict=("checked",)) == [("SYNC02", 7), ("SYNC02", 9), ("SYNC06", 10)]


def test_strict_all_reports_every_allowed_region():
    assert len(findings(ERROR_PATH, strict=("eager", "error-path", "cpu-only", "checked", "flush"))) == 2
    assert len(findings(ERROR_PATH, strict=tuple(static.config.strict_kinds(["all"])))) == 2


SET_UP_NAMED = """
import torch

class Slots:
    def __init__(self, pages: torch.Tensor):
        self.n = pages.numel() + int(pages.max())

class Pool:
    def free(self, pages: torch.Tensor):
        self.v2p.index_fill_(0, pages, -1)
        self.reset_slots(pages)
        self._clear_holes(pages)
        self._init_rows(pages)
        Slots(pages)

    def reset_slots(self, pages: torch.Tensor):
        self.live -= (self.v2p[pages] >= 0).sum().item()

    def _clear_holes(self, pages: torch.Tensor):
        self.holes = torch.unique(pages)

    def _init_rows(self, pages: torch.Tensor):
        for p in pages.tolist():
            self.p2v[p : p + 1].fill_(-1)

    def reset(self):
        self.live = int(self.v2p.ge(0).sum())
"""


def test_set_up_names_are_not_exempt_on_the_free_path():
    """``reset_slots``, ``_clear_holes``, ``_init_rows``, a constructor: called by the lazy free, so run every step."""
    plan = static.check_source(textwrap.dedent(SET_UP_NAMED), "m.py")
    got = [(f.code, f.line, f.chain_text) for f in plan.findings]
    assert got == [("SYNC05", 6, "Pool.free → Slots.__init__"), ("SYNC01", 17, "Pool.free → Pool.reset_slots"),
                   ("SYNC08", 20, "Pool.free → Pool._clear_holes"), ("SYNC02", 23, "Pool.free → Pool._init_rows")]
    assert plan.allowed == [] and plan.regions == [] and plan.exempt == {}
    assert "Pool.reset" in plan.unreached  # set-up that no free path calls is not checked at all


def test_setup_is_no_allowed_region_kind():
    assert "setup" not in KINDS
    with pytest.raises(static.config.ConfigError, match="'setup' is not an allowed-region kind"):
        static.config.strict_kinds(["setup"])


# ------------------------------------------------------------------ annotations


@pytest.mark.parametrize("annotation,is_tensor", [
    ("torch.Tensor", True), ("Tensor", True), ("Optional[torch.Tensor]", True), ("torch.Tensor | None", True),
    ("'torch.Tensor'", True), ("Union[torch.Tensor, None]", True),
    ("Optional[List[torch.Tensor]]", False), ("List[torch.Tensor]", False), ("list[torch.Tensor]", False),
    ("dict[str, torch.Tensor]", False), ("Tuple[torch.Tensor, ...]", False), ("'Optional[List[torch.Tensor]]'", False),
    ("Union[torch.Tensor, List[torch.Tensor]]", False), ("int", False),
])
def test_annotations_are_parsed_not_searched(annotation, is_tensor):
    src = f"""
    from typing import List, Optional, Tuple, Union
    import torch
    from torch import Tensor

    def free(v2p, pending: {annotation}):
        if pending:
            v2p.index_fill_(0, pending, -1)
    """
    assert findings(src) == ([("SYNC06", 7)] if is_tensor else [])


def test_a_container_annotation_pins_a_local_and_an_attribute():
    src = """
    from typing import List, Optional
    import torch

    class Pool:
        held: Optional[List[torch.Tensor]] = None

        def __init__(self):
            self.pending: Optional[List[torch.Tensor]] = None

        def free(self, pages: torch.Tensor):
            pending: Optional[List[torch.Tensor]] = self.pending
            if pending:
                pending = pending + [pages]
            if self.pending or self.held:
                self.pending = None
            if pages:
                pass
    """
    assert findings(src) == [("SYNC06", 17)]


def test_a_container_attribute_swapped_into_a_local_stays_a_container():
    """The production free-group shape: ``pending, self.reps = self.reps, None`` then ``if pending:``."""
    src = """
    from typing import List, Optional
    import torch

    class Pool:
        def clear(self):
            self.reps: Optional[List[torch.Tensor]] = None

        def free_group_end(self) -> None:
            pending, self.reps = self.reps, None
            if pending:
                reps = torch.cat(pending)
                self.v2p.index_fill_(0, reps, -1)
    """
    assert findings(src) == []


def test_host_tensors_are_read_without_a_sync_and_copied_to_the_device_with_one():
    src = """
    import torch

    def build_read_table(v2p, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, n_cpu: int):
        longest = int(seq_lens_cpu.max())
        lens = seq_lens_cpu.tolist()
        if seq_lens_cpu.any():
            pass
        order = torch.unique(seq_lens_cpu)
        staged = torch.tensor([1, 2])
        first = staged.item()
        row = v2p[n_cpu]
        lens_dev = seq_lens_cpu.to(v2p.device)
        return int(seq_lens.max())
    """
    assert findings(src) == [("SYNC11", 13), ("SYNC05", 14)]


def test_a_helpers_return_annotation_types_its_result():
    src = """
    from typing import List, Optional
    import torch

    class Pool:
        def free(self, pages: torch.Tensor):
            if self._live(pages):
                pass
            if self._groups(pages):
                pass
            if helper(pages):
                pass

        def _live(self, pages) -> Optional[torch.Tensor]:
            return None

        def _groups(self, pages) -> List[torch.Tensor]:
            return [pages]

    def helper(pages) -> "torch.Tensor":
        return pages
    """
    assert findings(src) == [("SYNC06", 7), ("SYNC06", 11)]


# ------------------------------------------------------------------ entry points across modules


def _package(tmp_path, files: dict[str, str]) -> str:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, src in files.items():
        (pkg / name).write_text(textwrap.dedent(src))
    return str(pkg)


def test_calls_are_followed_into_imported_functions_modules_and_constants(tmp_path):
    pkg = _package(tmp_path, {
        "consts.py": "TOMBSTONE = -1\n",
        "helpers.py": """
            import torch

            def mark(table, rows):
                return rows.tolist()
        """,
        "pool.py": """
            import torch
            from . import helpers
            from .consts import TOMBSTONE
            from .helpers import mark

            def free(v2p, pages: torch.Tensor):
                v2p[pages] = TOMBSTONE
                mark(v2p, pages)
                helpers.mark(v2p, pages)
        """,
    })
    plan_report = static.check_paths([os.path.join(pkg, "pool.py")])  # one file given: its imports are followed
    got = sorted((os.path.basename(f.path), f.line, f.code, f.chain_text) for f in plan_report.findings)
    assert got == [("helpers.py", 5, "SYNC02", "free → mark (helpers.py)"), ("pool.py", 8, "SYNC12", "free")]


@pytest.mark.parametrize("abstract", [False, True])
def test_self_calls_in_a_base_class_dispatch_to_the_subclass(tmp_path, abstract):
    """Entered through Sub, Base.release_all's ``self.free`` is Sub.free; a concrete Base is an entry of its own."""
    pkg = _package(tmp_path, {
        "base.py": f"""
            import abc
            import torch

            class Base({'abc.ABC' if abstract else 'object'}):
                def free(self, pages: torch.Tensor):
                    return pages.tolist()

                def release_all(self, pages: torch.Tensor):
                    self.free(pages)
        """,
        "sub.py": """
            import torch
            from .base import Base

            class Sub(Base):
                def free(self, pages: torch.Tensor):
                    self.v2p.index_fill_(0, pages, -1)
        """,
    })
    report = static.check_paths(static.discover.expand([pkg]))
    sub = report.files[os.path.join(pkg, "sub.py")]
    assert "Sub.release_all" in sub.roots and "inherited from Base.release_all" in sub.roots["Sub.release_all"]
    base = report.files[os.path.join(pkg, "base.py")]
    if abstract:  # never instantiated: Base.free runs only if a subclass calls it, and none does
        assert report.findings == [] and "Base.free" in base.unreached
        assert base.notes == ["Base is abstract: its entry points are checked on the classes derived from it"]
    else:  # a Base of its own frees with .tolist(), also from its own release_all; never through Sub
        assert [(f.line, f.chain_text, f.also_from) for f in report.findings] == [
            (7, "Base.free", ("Base.release_all",))]


def test_super_and_explicit_base_calls_are_followed(tmp_path):
    pkg = _package(tmp_path, {
        "base.py": """
            import torch

            class Base:
                def _unbind(self, pages: torch.Tensor):
                    return torch.nonzero(pages)
        """,
        "sub.py": """
            import torch
            from . import base

            class Sub(base.Base):
                def free(self, pages: torch.Tensor):
                    super()._unbind(pages)
                    super(Sub, self)._unbind(pages)
                    base.Base._unbind(self, pages)
        """,
    })
    report = static.check_paths([os.path.join(pkg, "sub.py")])
    (f,) = report.findings
    assert (f.code, os.path.basename(f.path), f.chain_text) == ("SYNC07", "base.py", "Sub.free → Base._unbind (base.py)")


def test_an_allocation_path_that_calls_a_free_named_helper_is_not_a_free_path():
    src = """
    import torch

    class Pool:
        def alloc_extend(self, n: int):
            self.merge_and_sort_free()
            return self.free_pages[:n]

        def merge_and_sort_free(self):
            self.free_pages = torch.tensor(sorted(self.free_pages.tolist()), device=self.v2p.device)

        def relocate(self, src: torch.Tensor, dst: torch.Tensor):
            self.p2v.index_fill_(0, src, -1)
            self.moved += len(src.tolist())
    """
    plan = static.check_source(textwrap.dedent(src), "m.py")
    assert plan.findings == [] and plan.roots == {} and plan.allowed == []
    assert set(plan.unreached) == {"Pool.alloc_extend", "Pool.merge_and_sort_free", "Pool.relocate"}
