"""The static no-sync check (fuzz.sync.static): forms, free-path discovery, CLI contract.

Path sensitivity, entry points across modules, output formats and the rule registry
have their own files (test_static_paths.py, test_static_cli.py).
"""

from __future__ import annotations

import ast
import os
import re
import textwrap

import pytest

from fuzz.sync import cli as sync_cli
from fuzz.sync import static

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures", "sync")


def codes(source: str, roots=()) -> list[str]:
    plan = static.check_source(textwrap.dedent(source), "mod.py", roots=roots)
    return [f.code for f in plan.findings]


def free_body(body: str, params: str = "self, pages: torch.Tensor") -> str:
    """A method called `free` of a pool with v2p/p2v tables, with `body` as its body."""
    return "import torch\n\nclass Pool:\n    def free(" + params + "):\n" + textwrap.indent(
        textwrap.dedent(body).strip("\n"), " " * 8) + "\n"


# ------------------------------------------------------------------ the forms of SPEC.md §5

SYNCING = [
    ("x = self.v2p[pages][0].item()", "SYNC01"),
    ("x = pages.tolist()", "SYNC02"),
    ("x = self.v2p.cpu()", "SYNC03"),
    ("x = self.v2p.to('cpu')", "SYNC03"),
    ("x = pages.numpy()", "SYNC04"),
    ("x = int(self.v2p[pages].max())", "SYNC05"),
    ("x = float(self.p2v.sum())", "SYNC05"),
    ("x = bool((self.v2p[pages] >= 0).all())", "SYNC05"),
    ("if (self.v2p[pages] == -1).any():\n    raise ValueError('double free')", "SYNC06"),
    ("while self.v2p[0] < 0:\n    break", "SYNC06"),
    ("assert (self.v2p[pages] != -1).all()", "SYNC06"),
    ("ok = (self.v2p[pages] >= 0).all() and pages.numel() > 0", "SYNC06"),
    ("x = 1 if self.v2p[pages].any() else 0", "SYNC06"),
    ("x = torch.nonzero(self.v2p >= 0)", "SYNC07"),
    ("x = (self.p2v != -1).nonzero()", "SYNC07"),
    ("x = torch.where(self.v2p == -1)", "SYNC07"),
    ("x = torch.unique(pages)", "SYNC08"),
    ("x = pages.unique()", "SYNC08"),
    ("x = torch.masked_select(self.v2p, self.v2p >= 0)", "SYNC09"),
    ("x = self.v2p[self.v2p >= 0]", "SYNC10"),
    ("live = self.p2v != -1\nx = self.p2v[live]", "SYNC10"),
    ("x = torch.tensor([1, 2], device=self.v2p.device)", "SYNC11"),
    ("x = torch.tensor([1, 2]).to(self.v2p.device)", "SYNC11"),
    ("self.v2p[pages] = -1", "SYNC12"),
    ("self.v2p[pages] = 0", "SYNC12"),
    ("self.v2p[3] = -1", "SYNC12"),
    ("tomb = -1\nself.v2p[pages] = tomb", "SYNC12"),
    ("t = self.v2p\nt[pages] = -1", "SYNC12"),
    ("a, b = self.v2p, self.p2v\nb[pages] = -1", "SYNC12"),
    ("self.v2p[pages] = torch.tensor(-1)", "SYNC12"),
    ("torch.cuda.synchronize()", "SYNC13"),
    ("torch.cuda.current_stream().synchronize()", "SYNC13"),
    ("x = self.v2p[torch.tensor([1, 2])]", "SYNC14"),
    ("buf = torch.empty(3, dtype=torch.int64)\nbuf.copy_(self.v2p[pages])", "SYNC15"),
    ("x = torch.arange(self.p2v[0] + 3, device=self.v2p.device)", "SYNC16"),
    ("x = self.v2p[: pages[0]]", "SYNC16"),
    ("x = torch.repeat_interleave(pages, torch.ones_like(pages))", "SYNC17"),
    ("x = torch.equal(self.v2p, self.p2v)", "SYNC18"),
    ("x = f'freeing {pages}'", "SYNC19"),
    ("x = self.v2p[pages[0]]", "SYNC20"),
]

QUIET = [
    "self.v2p.index_fill_(0, pages, -1)",
    "t = self.v2p\nt.index_fill_(0, pages, -1)",
    "self.p2v.fill_(-1)",
    "self.v2p[2:5].fill_(-1)",
    "self.v2p[2:5] = -1",
    "t = self.v2p\nt[1:4] = 0",
    "self.v2p[pages] = pages",
    "vals = torch.full_like(pages, -1)\nself.v2p[pages] = vals",
    "self.v2p.index_copy_(0, pages, pages)",
    "self.v2p.scatter_(0, pages, -1)",
    "mask = self.v2p >= 0\nself.v2p.masked_fill_(mask, -1)",
    "mask = self.v2p >= 0\nself.v2p[mask] = -1",
    "x = torch.where(self.v2p >= 0, self.v2p, -1)",
    "x = torch.nonzero_static(self.v2p >= 0, size=4, fill_value=-1)",
    "phys = self.v2p[pages]",
    "_kernel[(1,)](self.v2p, pages, pages.numel(), BLOCK=8)",
    "if pages.numel() == 0:\n    return",
    "n = len(pages) + pages.shape[0] + pages.size(0)",
    "n = int(pages.numel())",
    "ok = pages.numel() > 0 and (self.v2p[pages] >= 0).all()",
    "offsets = torch.tensor([0, 1, 2])",
    "x = torch.arange(pages.numel(), device=self.v2p.device)",
    "self.free_virtual = torch.cat((self.free_virtual, pages))",
    "self.p2v[1:4].copy_(self.v2p[1:4])",
    "x = torch.repeat_interleave(pages, torch.ones_like(pages), output_size=pages.numel())",
]


@pytest.mark.parametrize("body,code", SYNCING, ids=[b.split("\n")[-1][:40] for b, _ in SYNCING])
def test_each_syncing_form_is_reported_with_its_code(body, code):
    assert code in codes(free_body(body))


@pytest.mark.parametrize("body", QUIET, ids=[b.split("\n")[-1][:40] for b in QUIET])
def test_look_alikes_that_do_not_sync_are_quiet(body):
    assert codes(free_body(body)) == []


def test_minus_one_is_a_unary_minus_over_a_constant_and_is_caught():
    stmt = ast.parse("v2p[idx] = -1").body[0]
    assert isinstance(stmt.value, ast.UnaryOp) and isinstance(stmt.value.op, ast.USub)
    assert isinstance(stmt.value.operand, ast.Constant) and stmt.value.operand.value == 1
    assert codes("def free(v2p, idx):\n    v2p[idx] = -1\n") == ["SYNC12"]
    assert codes("def free(v2p, idx):\n    v2p[idx] = +1\n") == ["SYNC12"]
    assert codes("def free(v2p, idx):\n    v2p[idx] = -(1)\n") == ["SYNC12"]


def test_module_and_class_constants_are_python_scalars():
    src = """
    import torch
    TOMBSTONE = -1

    class Pool:
        EMPTY = -1

        def free(self, pages: torch.Tensor):
            self.v2p[pages] = TOMBSTONE
            self.p2v[pages] = self.EMPTY
    """
    assert codes(src) == ["SYNC12", "SYNC12"]


def test_a_variable_right_hand_side_that_holds_a_tensor_is_quiet():
    assert codes(free_body("vals = self.p2v[pages]\nself.v2p[pages] = vals")) == []


def test_only_tensor_arguments_of_int_are_reported():
    assert codes(free_body("n = int(self.watermark)\nm = int(len(pages))")) == []
    assert codes(free_body("n = int(pages[0])")) == ["SYNC05"]


# ------------------------------------------------------------------ aliases and calls


def test_table_alias_through_a_self_attribute_set_in_another_method():
    src = """
    import torch

    class Pool:
        def __init__(self, v2p):
            self.v2p = v2p
            self.table = self.v2p

        def free(self, pages: torch.Tensor):
            self.table[pages] = -1
    """
    assert codes(src) == ["SYNC12"]


def test_table_and_scalar_reach_a_helper_through_its_parameters():
    src = """
    def _mark(table, rows, value):
        table[rows] = value

    def release(v2p, idx):
        _mark(v2p, idx, -1)
    """
    plan = static.check_source(textwrap.dedent(src), "m.py")
    assert [(f.code, f.line) for f in plan.findings] == [("SYNC12", 3)]
    assert plan.findings[0].chain_text == "release → _mark"  # from the entry point to the sync
    assert plan.findings[0].format().endswith("[free path: release → _mark]")
    # the same helper with a device tensor as value is fine
    src_ok = src.replace("_mark(v2p, idx, -1)", "_mark(v2p, idx, idx)")
    assert codes(src_ok) == []


def test_calls_are_followed_transitively_inside_the_module():
    src = """
    import torch

    class Pool:
        def free(self, pages: torch.Tensor):
            self._step_one(pages)

        def _step_one(self, pages: torch.Tensor):
            helper(pages)

    def helper(pages: torch.Tensor):
        return pages.tolist()

    def unrelated(pages: torch.Tensor):
        return pages.tolist()
    """
    plan = static.check_source(textwrap.dedent(src), "m.py")
    assert [(f.code, f.line) for f in plan.findings] == [("SYNC02", 12)]
    assert set(plan.reached) == {"Pool.free", "Pool._step_one", "helper"}


def test_free_paths_come_from_entry_points_not_from_names_or_tombstones():
    """A ``-1`` store or a call to a free-named helper makes no root (relocation
    helpers and allocation paths are not free paths); ``--root`` names such an entry point."""
    by_tombstone = """
    import torch

    class Pool:
        def give_back(self, pages: torch.Tensor):
            self.v2p.index_fill_(0, pages, -1)
            n = pages.tolist()
    """
    plan = static.check_source(textwrap.dedent(by_tombstone), "m.py")
    assert plan.roots == {} and plan.findings == [] and plan.unreached == ["Pool.give_back"]
    (note,) = plan.notes
    assert "Pool.give_back writes a tombstone into self.v2p" in note and "--root give_back" in note
    plan = static.check_source(textwrap.dedent(by_tombstone), "m.py", roots=("give_back",))
    assert "Pool.give_back" in plan.roots and "'give_back'" in plan.roots["Pool.give_back"]
    assert [f.code for f in plan.findings] == ["SYNC02"]

    by_callee = """
    def recycle_request(pool, tokens):
        pool.kernels.free_unbind_inplace(tokens, pool.v2p, pool.p2v)
        return tokens.tolist()
    """
    plan = static.check_source(textwrap.dedent(by_callee), "m.py")
    assert plan.findings == [] and "calls free_unbind_inplace()" in plan.notes[0]
    plan = static.check_source(textwrap.dedent(by_callee), "m.py", roots=("recycle_*",))
    assert "recycle_request" in plan.roots
    assert [f.code for f in plan.findings] == ["SYNC02"]

    not_free = """
    def summarize(t):
        return t.tolist()
    """
    plan = static.check_source(textwrap.dedent(not_free), "m.py")
    assert plan.roots == {} and plan.findings == [] and plan.notes == []


@pytest.mark.parametrize("name,expected", [
    ("free", True), ("_free_lazy", True), ("freePages", True), ("release", True), ("tombstone_pages", True),
    ("unbind", True), ("evict_request", True), ("dealloc", True), ("freeze", False), ("refresh", False),
    ("alloc", False), ("free_virtual_count", True), ("free_group_end", True), ("build_kv_read_table", True),
    ("build_read_table", True), ("bench_read_table", False), ("test_read_table_matches_spec", False),
    # an allocation helper whose name holds "free", and private helpers, are not entry points
    ("merge_and_sort_free", False), ("_free_eager", False), ("_check_read_table", False), ("relocate", False),
])
def test_default_entry_point_patterns(name, expected):
    assert any(static.matches_root(name, p) for p in static.DEFAULT_ROOTS) is expected


def test_a_dotted_root_pattern_names_one_method():
    assert static.matches_root("Pool.give_back", "Pool.give_back")
    assert not static.matches_root("Other.give_back", "Pool.give_back")
    assert static.matches_root("Pool._private", "_private") and not static.matches_root("Pool._private", "*private")


def test_spec_exemptions_eager_flush_checked_are_not_followed():
    src = """
    import torch

    class Pool:
        def free(self, pages: torch.Tensor):
            if self.checked:
                self._check_free(pages)
                assert (self.v2p[pages] != -1).all()
            if self.lazy:
                self._free_lazy(pages)
            else:
                self._free_eager(pages)
            self.flush()

        def _free_lazy(self, pages: torch.Tensor):
            self.v2p.index_fill_(0, pages, -1)

        def _free_eager(self, pages: torch.Tensor):
            moved = pages.tolist()
            self._move(moved)

        def _move(self, src):
            self.p2v.index_fill_(0, torch.tensor(src, device=self.p2v.device), -1)

        def flush(self):
            return self.p2v.tolist()

        def _check_free(self, pages: torch.Tensor):
            return pages.tolist()
    """
    plan = static.check_source(textwrap.dedent(src), "m.py")
    assert plan.findings == []
    assert set(plan.exempt) == {"Pool._free_eager", "Pool.flush", "Pool._check_free", "Pool._move"}
    for qual in ("Pool._free_eager", "Pool._move"):  # _move is reached only through the eager branch
        assert plan.exempt[qual].startswith("reached only from eager code: the eager false branch of `if self.lazy:`")
    assert plan.exempt["Pool._check_free"].startswith(
        "reached only from checked code: the checked-mode true branch of `if self.checked:` (line 6) in Pool.free")
    assert plan.exempt["Pool.flush"].startswith("reached only from flush code: Pool.flush: its name says flush")
    assert set(plan.reached) == {"Pool.free", "Pool._free_lazy"}
    assert {(f.code, f.exemption.kind) for f in plan.allowed} == {
        ("SYNC02", "eager"), ("SYNC11", "eager"), ("SYNC02", "flush"), ("SYNC02", "checked"), ("SYNC06", "checked")}


def test_shape_checks_on_the_free_path_are_followed_even_when_named_check():
    src = """
    import torch

    def check_free(v_pages, v2p):
        if v_pages.dim() != 1:
            raise ValueError("1-D pages")
        if (v2p[v_pages] == -1).any():  # a value check outside checked mode: a sync on every free
            raise ValueError("double free")

    def free_unbind_inplace(v_pages, v2p, p2v):
        check_free(v_pages, v2p)
        v2p.index_fill_(0, v_pages, -1)
    """
    plan = static.check_source(textwrap.dedent(src), "m.py")
    assert [(f.code, f.line) for f in plan.findings] == [("SYNC06", 7)]


def test_a_public_function_stays_a_root_even_when_only_exempt_code_calls_it():
    src = """
    import torch

    def release(v2p, pages: torch.Tensor):
        v2p[pages] = -1

    def flush(v2p, pages):
        release(v2p, pages)
    """
    assert codes(src) == ["SYNC12"]


def test_triton_kernels_are_device_code_and_skipped():
    src = """
    import triton
    import triton.language as tl

    @triton.jit
    def free_kernel(v2p_ptr, idx_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        if n > 0:
            tl.store(v2p_ptr + offs, -1)
    """
    plan = static.check_source(textwrap.dedent(src), "k.py")
    assert plan.roots == {} and plan.findings == []


# ------------------------------------------------------------------ pragmas


def test_pragma_with_a_reason_allows_exactly_its_line():
    body = "a = pages.tolist()  # sync-ok: debug build only\nb = pages.tolist()"
    plan = static.check_source(free_body(body), "m.py")
    assert [(f.code, f.line) for f in plan.findings] == [("SYNC02", 6)]


def test_pragma_without_a_reason_is_itself_a_finding():
    plan = static.check_source(free_body("a = pages.tolist()  # sync-ok"), "m.py")
    assert sorted(f.code for f in plan.findings) == ["SYNC00", "SYNC02"]
    plan = static.check_source(free_body("a = pages.tolist()  # sync-ok:   "), "m.py")
    assert sorted(f.code for f in plan.findings) == ["SYNC00", "SYNC02"]


# ------------------------------------------------------------------ the CLI contract


def _fixture(name: str) -> str:
    return os.path.relpath(os.path.join(FIXTURES, name))


def _expected_line(path: str, code: str) -> int:
    with open(path) as fh:
        for i, line in enumerate(fh, 1):
            if f"# expect: {code}" in line:
                return i
    raise AssertionError(f"{path} has no '# expect: {code}' marker")


@pytest.mark.parametrize("name,code,form", [
    ("bad_tombstone.py", "SYNC12", "-1"),
    ("bad_item.py", "SYNC01", ".item()"),
    ("bad_unique.py", "SYNC08", "torch.unique"),
])
def test_bad_fixture_allocators_fail_naming_the_line(name, code, form, capsys):
    path = _fixture(name)
    assert sync_cli.main([path]) == 1
    out = capsys.readouterr().out.splitlines()
    line = _expected_line(path, code)
    hits = [o for o in out if re.match(rf"^{re.escape(path)}:{line}:\d+: {code} ", o)]
    assert len(hits) == 1, out
    assert form in hits[0]
    assert "the host waits" in hits[0] or "the host reads" in hits[0]
    assert out[-1].startswith("check-sync: 1 finding in 1 file(s)")


def test_good_fixture_allocator_passes(capsys):
    assert sync_cli.main([_fixture("good_allocator.py")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [out[-1]] and out[-1].startswith("check-sync: 0 findings")


def test_good_fixture_free_paths_are_discovered(capsys):
    assert sync_cli.main(["-v", _fixture("good_allocator.py")]) == 0
    out = capsys.readouterr().out
    for qual in ("GoodPool.free", "GoodPool._tombstone", "GoodPool.release_range", "GoodPool.build_read_table"):
        assert f"free path {qual}" in out
    assert "exempt GoodPool._validate: reached only from checked code" in out  # only under `if self.checked:`
    (unreached,) = [line for line in out.splitlines() if "not on a free path:" in line]
    assert "GoodPool.flush" in unreached and "GoodPool.live_count" in unreached


def test_a_directory_is_checked_recursively(capsys):
    """Every ``# expect: CODE`` marker under the fixtures, in subpackages too, and nothing else."""
    assert sync_cli.main([os.path.relpath(FIXTURES)]) == 1
    out = capsys.readouterr().out
    reported = {tuple(m.groups()) for m in re.finditer(r"^(\S+?):(\d+):\d+: (SYNC\d\d) ", out, re.M)}
    expected = set()
    for root, _dirs, files in os.walk(FIXTURES):
        for name in files:
            if name.endswith(".py"):
                path = os.path.relpath(os.path.join(root, name))
                for i, line in enumerate(open(path), 1):
                    m = re.search(r"# expect: (SYNC\d\d)", line)
                    if m:
                        expected.add((path, str(i), m.group(1)))
    assert len(expected) >= 7 and reported == expected


def test_our_allocator_passes_by_default(capsys):
    assert sync_cli.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("check-sync: 0 findings in 2 file(s)")
    paths = static.default_paths()
    assert [os.path.basename(p) for p in paths] == ["allocator.py", "launchers.py"]
    assert all(os.path.exists(p) for p in paths)


def test_our_allocator_lazy_free_and_read_table_are_checked():
    plan = static.check_file(static.default_paths()[0])
    for qual in ("DeviceAllocator.free", "DeviceAllocator._free_lazy", "DeviceAllocator.build_read_table"):
        assert qual in plan.reached
    assert plan.exempt["DeviceAllocator._free_eager"].startswith("reached only from eager code")
    assert "DeviceAllocator.flush" in plan.unreached and "DeviceAllocator.flush" not in plan.reached


def test_a_syncing_line_injected_into_our_allocator_is_found(tmp_path):
    src = open(static.default_paths()[0]).read()
    needle = "        phys = self.kernels.free_unbind_inplace(pages, self.v2p, self.p2v)\n"
    assert needle in src
    bad = tmp_path / "allocator.py"
    bad.write_text(src.replace(needle, needle + "        self.v2p[pages] = -1\n"))
    plan = static.check_file(str(bad))
    assert [f.code for f in plan.findings] == ["SYNC12"]
    assert plan.findings[0].chain_text == "DeviceAllocator.free → DeviceAllocator._free_lazy"


def test_unreadable_and_unparsable_paths_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.py"
    assert sync_cli.main([str(missing)]) == 2
    assert "cannot read" in capsys.readouterr().err
    broken = tmp_path / "broken.py"
    broken.write_text("def free(:\n")
    assert sync_cli.main([str(broken)]) == 2
    err = capsys.readouterr().err
    assert "cannot parse" in err and f"{broken}:1:" in err
    # exit 2 wins over findings in other files
    assert sync_cli.main([_fixture("bad_item.py"), str(broken)]) == 2


def test_findings_are_sorted_and_use_one_based_columns():
    src = "def free(v2p, idx):\n    v2p[idx] = -1\n"
    (f,) = static.check_source(src, "m.py").findings
    assert (f.line, f.col) == (2, 5)
    assert f.format().startswith("m.py:2:5: SYNC12 ")
