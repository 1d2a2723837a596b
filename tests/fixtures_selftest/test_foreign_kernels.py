"""The foreign kernel sets of tests/fixtures/kernels/foreign/ do what their README says.

kvfuzz is tested against these sets, so they must be what they claim: the correct ones
match ``kvref`` on valid input, at small shapes and at production shapes where the
loops take several trips and the id grids several programs; each buggy variant diverges
at the shape where its bug lives and NOT at a small shape (this pins the shapes a
fuzzer must reach); each crasher crashes (SIGSEGV, hang, exception) on the valid input
its docstring names and is correct just below it.

Tiers: CPU tensors under Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` when there is no GPU) and CUDA tensors (``cuda`` marker). A CPU
test skips when the interpreter is off.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from kvref import kernels as spec

FOREIGN = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "foreign"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GUARD = 4  # canary rows on each side of a table
CANARY = 0x5A5A5A5A  # fits int32 too, so a stray v2p[-1] read shows as this value (times the multiplier)
POISON = -7  # old contents of every read-table output


# ------------------------------------------------------------------ loading


def sibling(stem: str) -> Path:
    return FOREIGN / f"{stem}.py"


_spec_variants = importlib.util.spec_from_file_location("_foreign_variants_catalogue", sibling("variants"))
variants = importlib.util.module_from_spec(_spec_variants)
sys.modules[_spec_variants.name] = variants
_spec_variants.loader.exec_module(variants)

_LOADED: dict[Path, object] = {}


def load(path: Path):
    """A kernel set from a file, the way kvfuzz loads one (spec_from_file_location), once."""
    if path not in _LOADED:
        module_spec = importlib.util.spec_from_file_location(f"_foreign_set_{len(_LOADED)}_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
        _LOADED[path] = module
    return _LOADED[path]


@pytest.fixture(scope="session")
def variant_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("foreign_variants")


def kernel_set(name: str, variant_dir: Path):
    if name in variants.BY_NAME:
        return load(variants.materialize(name, variant_dir))
    return load(sibling(name))


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)], ids=["interpret", "cuda"])
def device(request) -> torch.device:
    if request.param == "cpu" and not INTERPRET:
        pytest.skip("Triton's interpreter is off (TRITON_INTERPRET != 1): the cuda twin runs these kernels")
    return torch.device(request.param)


# ------------------------------------------------------------------ cases


@dataclass
class Outcome:
    """What one call returned and wrote, field by field, against kvref."""

    fields: list[tuple[str, object, object]] = field(default_factory=list)

    def add(self, name: str, got, want) -> None:
        self.fields.append((name, got, want))

    def diverged(self) -> list[str]:
        return [name for name, got, want in self.fields if got != want]

    def assert_matches(self) -> None:
        bad = self.diverged()
        assert not bad, f"diverges from kvref in {bad}"


class Tables:
    """v2p / p2v as kvref lists and as red-zoned int64 tensors on ``device``."""

    def __init__(self, g: torch.Generator, rows: int, bound: int, device: torch.device) -> None:
        # Bound pages use physical pages in the lower half only: the upper half stays a free run.
        self.v2p, self.p2v = [-1] * rows, [-1] * rows
        self.v2p[0] = self.p2v[0] = 0
        bound = min(bound, rows // 2 - 1)
        vs = (torch.randperm(rows - 2, generator=g)[:bound] + 1).tolist()
        ps = (torch.randperm(rows // 2 - 1, generator=g)[:bound] + 1).tolist()
        for v, p in zip(vs, ps, strict=True):
            self.v2p[v], self.p2v[p] = p, v
        self.bufs = []
        self.v2p_t, self.p2v_t = self._guarded(self.v2p, device), self._guarded(self.p2v, device)

    def _guarded(self, values: list[int], device) -> torch.Tensor:
        buf = torch.full((len(values) + 2 * GUARD,), CANARY, dtype=torch.int64, device=device)
        self.bufs.append(buf)
        view = buf[GUARD : GUARD + len(values)]
        view.copy_(torch.tensor(values, dtype=torch.int64))
        return view

    def compare(self, out: Outcome) -> Outcome:
        out.add("v2p", self.v2p_t.tolist(), self.v2p)
        out.add("p2v", self.p2v_t.tolist(), self.p2v)
        for i, buf in enumerate(self.bufs):
            guards = buf[:GUARD].tolist() + buf[GUARD + len(self.v2p) :].tolist()
            out.add(f"guards[{i}]", guards, [CANARY] * (2 * GUARD))
        return out


def ids(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def pick(g: torch.Generator, pool: list[int], n: int) -> list[int]:
    return [pool[i] for i in torch.randperm(len(pool), generator=g)[:n].tolist()]


def table_op(k, device, op: str, n: int, *, seed: int = 0) -> Outcome:
    """One bind / alloc_bind / free_unbind of ``n`` valid ids, against kvref."""
    g = torch.Generator().manual_seed(seed)
    rows = 2 * n + 40
    t = Tables(g, rows, bound=n + 5, device=device)
    out = Outcome()
    if op == "bind":
        vs = pick(g, [v for v in range(1, rows - 1) if t.v2p[v] == -1], n)
        ps = pick(g, [p for p in range(1, rows - 1) if t.p2v[p] == -1], n)
        spec.bind(t.v2p, t.p2v, vs, ps)
        k.bind_inplace(ids(vs, device), ids(ps, device), t.v2p_t, t.p2v_t)
    elif op == "alloc_bind":
        vs = pick(g, [v for v in range(1, rows - 1) if t.v2p[v] == -1], n)
        start = rows // 2
        out.add("p_pages", k.alloc_bind_inplace(ids(vs, device), t.v2p_t, t.p2v_t, start).tolist(),
                spec.alloc_bind(t.v2p, t.p2v, vs, start))
    else:
        vs = pick(g, [v for v in range(1, rows - 1) if t.v2p[v] != -1], n)
        out.add("p_pages", k.free_unbind_inplace(ids(vs, device), t.v2p_t, t.p2v_t).tolist(),
                spec.free_unbind(t.v2p, t.p2v, vs))
    return t.compare(out)


def tokens(g, shape, rows: int, ps: int, neg: bool) -> torch.Tensor:
    """Token ids whose page lies in the table; with ``neg``, about 1 in 8 is -1 (padding)."""
    tok = torch.randint(0, rows * ps, shape, generator=g)
    if neg:
        tok = torch.where(torch.randint(0, 8, shape, generator=g) == 0, -1, tok)
    return tok


def read_table(k, device, *, bs: int, max_pages: int, ps: int = 1, lens=None, neg: bool = True, mult: int = 2,
               seed: int = 0, req_dtype=torch.int32) -> Outcome:
    """One paged read table on valid input into a poisoned column slice of a wider buffer."""
    g = torch.Generator().manual_seed(seed)
    rows = 64
    t = Tables(g, rows, bound=40, device=device)
    width = max_pages * ps + 3
    r2t = tokens(g, (bs + 2, width), rows, ps, neg).to(req_dtype)
    req_idx = torch.randint(0, bs + 2, (bs,), generator=g)
    if lens is None:
        lens = torch.randint(0, max_pages * ps + 1, (bs,), generator=g).tolist()
    lens = list(lens) + [0] * (bs - len(lens))
    big = torch.full((bs + 1, max_pages + 5), POISON, dtype=torch.int32, device=device)
    out = big[:, 2:]  # a column slice: row stride != max_pages
    want = out.tolist()
    spec.read_table(req_to_token=r2t.tolist(), req_pool_indices=req_idx.tolist(), seq_lens=lens, v2p=t.v2p,
                    multiplier=mult, page_size=ps, max_pages=max_pages, out=want)
    k.build_kv_read_table(req_to_token=r2t.to(device), req_pool_indices=req_idx.to(device),
                          seq_lens=ids(lens, device), v2p=t.v2p_t, multiplier=mult, page_size=ps,
                          max_pages=max_pages, out=out)
    result = Outcome()
    result.add("out", out.tolist(), want)
    result.add("out left of the slice", big[:, :2].tolist(), [[POISON] * 2] * (bs + 1))
    return t.compare(result)


def read_table_packed(k, device, *, bs: int, max_tokens: int, ps: int = 1, lens=None, starts: bool = False,
                      seed: int = 0) -> Outcome:
    g = torch.Generator().manual_seed(seed)
    rows = 64
    t = Tables(g, rows, bound=40, device=device)
    width = max_tokens + ps + 3
    r2t = tokens(g, (bs + 2, width), rows, ps, neg=True)
    req_idx = torch.randint(0, bs + 2, (bs,), generator=g)
    if lens is None:
        lens = torch.randint(0, max_tokens + 1, (bs,), generator=g).tolist()
    lens = list(lens) + [0] * (bs - len(lens))
    kv_start = torch.randint(0, ps + 2, (bs,), generator=g).tolist() if starts else None
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)  # SPEC §2: spans = seq_lens
    # The buffer captured at max_tokens (SPEC §2: indptr[bs] <= max_tokens <= len(out)), with a
    # poisoned tail past the live spans that must stay poisoned.
    cap = indptr[-1] + bs
    out = torch.full((cap + 2,), POISON, dtype=torch.int32, device=device)
    want = out.tolist()
    spec.read_table_packed(req_to_token=r2t.tolist(), req_pool_indices=req_idx.tolist(), seq_lens=lens, v2p=t.v2p,
                           indptr=indptr, multiplier=3, page_size=ps, max_tokens=cap, out=want,
                           kv_start_idx=kv_start)
    k.build_kv_read_table_packed(req_to_token=r2t.to(device), req_pool_indices=req_idx.to(device),
                                 seq_lens=ids(lens, device), v2p=t.v2p_t, indptr=ids(indptr, device), multiplier=3,
                                 page_size=ps, max_tokens=cap, out=out,
                                 kv_start_idx=None if kv_start is None else ids(kv_start, device))
    result = Outcome()
    result.add("out", out.tolist(), want)
    return t.compare(result)


def translate(k, device, *, n: int, ps: int, hostile_domain: bool, seed: int = 0) -> Outcome:
    """Tokens in the table; with ``hostile_domain`` also -1, -5 and pages past the table (SPEC maps them to 0)."""
    g = torch.Generator().manual_seed(seed)
    rows = 64
    t = Tables(g, rows, bound=40, device=device)
    loc = tokens(g, (n,), rows, ps, neg=False).tolist()
    if hostile_domain:
        loc[:3] = [-1, -5, rows * ps + 2]
    result = Outcome()
    result.add("slots", k.translate_tokens(loc=ids(loc, device), v2p=t.v2p_t, page_size=ps).tolist(),
               spec.translate(t.v2p, loc, ps))
    return t.compare(result)


# A production read-table shape: bs 1024 gives one column program per row, so row 0's
# 600 pages take two trips of 512 columns (three of 256 at indep_other_blocks' sizes).
PROD_LENS = [600, 37, 0, 513, 512, 1]
PROD = dict(bs=1024, max_pages=600, lens=PROD_LENS)


# ------------------------------------------------------------------ correct sets

CORRECT = ["indep", "indep_other_blocks", "cpu_fallback", "trusting"]


@pytest.mark.parametrize("name", CORRECT)
@pytest.mark.parametrize("op", ["bind", "alloc_bind", "free_unbind"])
@pytest.mark.parametrize("n", [5, 300], ids=["small", "several-programs"])
def test_table_ops_match_spec(name, op, n, device, variant_dir):
    table_op(kernel_set(name, variant_dir), device, op, n).assert_matches()


@pytest.mark.parametrize("name", CORRECT)
def test_read_tables_match_spec(name, device, variant_dir):
    k = kernel_set(name, variant_dir)
    for ps in (1, 4):
        read_table(k, device, bs=3, max_pages=7, ps=ps, seed=ps).assert_matches()
        read_table_packed(k, device, bs=3, max_tokens=9, ps=ps, starts=True, seed=ps).assert_matches()
        read_table_packed(k, device, bs=2, max_tokens=6, ps=ps, seed=ps + 10).assert_matches()
    read_table(k, device, bs=2, max_pages=5, req_dtype=torch.int64, mult=1).assert_matches()
    read_table(k, device, **PROD).assert_matches()
    read_table_packed(k, device, bs=1024, max_tokens=600, lens=PROD_LENS, starts=True).assert_matches()


@pytest.mark.parametrize("name", CORRECT)
def test_translate_matches_spec(name, device, variant_dir):
    k = kernel_set(name, variant_dir)
    hostile = name != "trusting"  # trusting.py has no guard for t < 0: that input is hostile to it
    for ps in (1, 4):
        translate(k, device, n=9, ps=ps, hostile_domain=hostile).assert_matches()
    translate(k, device, n=600, ps=2, hostile_domain=hostile).assert_matches()


def test_indep_has_production_constants_and_no_knobs():
    k = load(sibling("indep"))
    assert (k.BLOCK, k.BLOCK_COLS, k.TARGET_BLOCKS) == (128, 512, 1024)
    assert not hasattr(k, "FUZZ_KNOBS")
    other = variants.source("indep_other_blocks")
    assert "BLOCK = 256  #" in other and "BLOCK_COLS = 256  #" in other and "TARGET_BLOCKS = 2048  #" in other


def test_cpu_fallback_never_launches_triton_on_cpu(variant_dir, monkeypatch):
    k = kernel_set("cpu_fallback", variant_dir)

    class NoTriton:
        def __getattr__(self, name):
            raise AssertionError(f"cpu_fallback launched Triton ({name}) on CPU tensors")

    monkeypatch.setattr(k, "_indep", NoTriton())
    cpu = torch.device("cpu")
    for op in ("bind", "alloc_bind", "free_unbind"):
        table_op(k, cpu, op, 5).assert_matches()
    read_table(k, cpu, bs=3, max_pages=7, ps=2).assert_matches()
    read_table_packed(k, cpu, bs=3, max_tokens=9, ps=2, starts=True).assert_matches()
    translate(k, cpu, n=9, ps=2, hostile_domain=True).assert_matches()


def test_trusting_double_free_writes_the_row_before_p2v(device, variant_dir):
    """The memory unsafety kvfuzz must report: a double free stores p2v[-1] (here a guard row)."""
    k = kernel_set("trusting", variant_dir)
    t = Tables(torch.Generator().manual_seed(0), 16, bound=4, device=device)
    v = next(v for v in range(1, 15) if t.v2p[v] != -1)
    k.free_unbind_inplace(ids([v], device), t.v2p_t, t.p2v_t)
    assert t.bufs[1][GUARD - 1].item() == CANARY
    k.free_unbind_inplace(ids([v], device), t.v2p_t, t.p2v_t)
    assert t.bufs[1][GUARD - 1].item() == -1


def test_variant_catalogue_applies_to_indep(variant_dir):
    for name in variants.BY_NAME:
        text = variants.source(name)
        assert text != sibling("indep").read_text()
    with pytest.raises(variants.VariantError):
        variants.source("stride_skips_trips", base_text="nothing to substitute")
    assert variants.main(["--out", str(variant_dir / "all")]) == 0
    assert sorted(p.stem for p in (variant_dir / "all").glob("*.py")) == sorted(variants.BY_NAME)


# ------------------------------------------------------------------ buggy variants: where each bug lives


def variant(name, variant_dir):
    assert not variants.BY_NAME[name].correct
    return kernel_set(name, variant_dir)


def test_stride_skips_trips_only_at_production_shapes(device, variant_dir):
    k = variant("stride_skips_trips", variant_dir)
    read_table(k, device, bs=3, max_pages=7).assert_matches()
    read_table(k, device, bs=1023, max_pages=600, lens=PROD_LENS).assert_matches()  # 2 programs a row: 1 trip each
    assert read_table(k, device, **PROD).diverged() == ["out"]


def test_floor_div_grid_only_past_a_partial_block(device, variant_dir):
    k = variant("floor_div_grid", variant_dir)
    for n in (5, 128, 256):
        table_op(k, device, "alloc_bind", n).assert_matches()
    assert set(table_op(k, device, "alloc_bind", 129).diverged()) == {"p_pages", "v2p", "p2v"}


def test_drops_last_col_block_only_one_past_a_column_block(device, variant_dir):
    k = variant("drops_last_col_block", variant_dir)
    read_table(k, device, bs=3, max_pages=1, lens=[1, 1, 0]).assert_matches()
    read_table(k, device, bs=2, max_pages=512, lens=[512, 3]).assert_matches()
    read_table(k, device, bs=2, max_pages=514, lens=[514, 3]).assert_matches()
    read_table(k, device, bs=2, max_pages=513, lens=[512, 3]).assert_matches()  # the lost column is not live
    assert read_table(k, device, bs=2, max_pages=513, lens=[513, 3]).diverged() == ["out"]


def test_no_negative_token_guard_only_at_page_size_one(device, variant_dir):
    k = variant("no_negative_token_guard", variant_dir)
    read_table(k, device, bs=4, max_pages=7, ps=4, seed=1).assert_matches()  # -1 // 4 == 0 under truncation
    read_table(k, device, bs=4, max_pages=7, ps=1, neg=False).assert_matches()
    assert read_table(k, device, bs=4, max_pages=7, ps=1, lens=[7, 7, 7, 7]).diverged() == ["out"]


def test_packed_ignores_kv_start_only_with_kv_start(device, variant_dir):
    k = variant("packed_ignores_kv_start", variant_dir)
    read_table_packed(k, device, bs=3, max_tokens=9, ps=1).assert_matches()
    assert read_table_packed(k, device, bs=3, max_tokens=9, ps=1, lens=[9, 9, 9], starts=True).diverged() == ["out"]


def test_free_out_missing_offset_only_past_one_block(device, variant_dir):
    k = variant("free_out_missing_offset", variant_dir)
    for n in (5, 128):
        table_op(k, device, "free_unbind", n).assert_matches()
    assert table_op(k, device, "free_unbind", 129).diverged() == ["p_pages"]


def _short_then_long(k, device):
    """Static buffers of a captured read table: rows of 2 pages, then 5 pages of max_pages 8."""
    t = Tables(torch.Generator().manual_seed(3), 32, bound=20, device=device)
    r2t = torch.arange(2 * 10, dtype=torch.int32, device=device).reshape(2, 10)
    req_idx, lens = ids([1, 0], device), ids([2, 1], device)
    out = torch.full((2, 8), POISON, dtype=torch.int32, device=device)
    args = dict(req_to_token=r2t, req_pool_indices=req_idx, seq_lens=lens, v2p=t.v2p_t, multiplier=1, page_size=1,
                max_pages=8, out=out)

    def expected():
        want = [[POISON] * 8 for _ in range(2)]
        return spec.read_table(req_to_token=r2t.tolist(), req_pool_indices=req_idx.tolist(),
                               seq_lens=lens.tolist(), v2p=t.v2p, multiplier=1, page_size=1, max_pages=8, out=want)

    return args, expected


def test_host_bound_seq_lens_is_right_eagerly_and_wrong_when_captured(device, variant_dir, monkeypatch):
    """Eager calls are right at any length; a launch made while 'capturing' keeps the warm-up's bound."""
    k = variant("host_bound_seq_lens", variant_dir)
    args, expected = _short_then_long(k, device)
    k.build_kv_read_table(**args)
    assert args["out"].tolist() == expected()
    args["seq_lens"].copy_(ids([5, 1], device))
    monkeypatch.setattr(k, "_capturing", lambda t: True)
    args["out"].fill_(POISON)
    k.build_kv_read_table(**args)  # what a graph captured now replays
    assert args["out"].tolist() != expected()
    monkeypatch.undo()
    args["out"].fill_(POISON)
    k.build_kv_read_table(**args)
    assert args["out"].tolist() == expected()


@pytest.mark.cuda
@pytest.mark.parametrize("name, right", [("indep", True), ("host_bound_seq_lens", False)])
def test_cuda_graph_replay_at_longer_rows(name, right, variant_dir):
    k = kernel_set(name, variant_dir)
    args, expected = _short_then_long(k, torch.device("cuda"))
    k.build_kv_read_table(**args)  # warm-up: compiles, and fills the variant's host-side cache
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k.build_kv_read_table(**args)
    args["seq_lens"].copy_(ids([5, 1], "cuda"))
    args["out"].fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    assert (args["out"].tolist() == expected()) is right


# ------------------------------------------------------------------ crashers

DRIVER = """
import importlib.util, sys, torch
path, device, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = importlib.util.spec_from_file_location("crasher", path)
k = importlib.util.module_from_spec(spec); sys.modules["crasher"] = k; spec.loader.exec_module(k)
ids = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)
v2p = torch.full((64,), -1, dtype=torch.int64, device=device); p2v = v2p.clone()
if "segfault" in path:
    k.alloc_bind_inplace(ids(list(range(1, n + 1))), v2p, p2v, 10)
    print("launching", flush=True)
    k.free_unbind_inplace(ids(list(range(1, n + 1))), v2p, p2v)
else:
    out = torch.zeros((1, 8), dtype=torch.int32, device=device)
    print("launching", flush=True)
    k.build_kv_read_table(req_to_token=torch.arange(8, device=device).reshape(1, 8), req_pool_indices=ids([0]),
                          seq_lens=ids([n]), v2p=v2p, multiplier=1, page_size=1, max_pages=8, out=out)
if device == "cuda":
    torch.cuda.synchronize()
print("returned", flush=True)
"""


def run_driver(stem: str, device: torch.device, n: int) -> subprocess.Popen:
    env = dict(os.environ)
    if device.type == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)  # compiled kernels: a wild store is a CUDA error, not SIGSEGV
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(sibling(stem)), device.type, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_segfault_stores_wild_from_three_pages(device):
    k = load(sibling("segfault"))
    table_op(k, device, "free_unbind", 2).assert_matches()
    proc = run_driver("segfault", device, 3)
    stdout, stderr = proc.communicate(timeout=120)
    assert "launching" in stdout and "returned" not in stdout, stderr[-2000:]
    if device.type == "cpu":
        assert proc.returncode == -signal.SIGSEGV, (proc.returncode, stderr[-2000:])
    else:
        assert proc.returncode != 0 and "illegal memory access" in stderr, stderr[-2000:]


def test_hang_spins_from_three_live_pages(device):
    k = load(sibling("hang"))
    read_table(k, device, bs=3, max_pages=7, lens=[2, 1, 0]).assert_matches()
    proc = run_driver("hang", device, 3)
    try:
        assert proc.stdout.readline().strip() == "launching"
        time.sleep(2.0)
        assert proc.poll() is None, "the read table of a 3-page row returned: hang.py no longer hangs"
    finally:
        proc.kill()
        proc.communicate()


def test_raises_when_bs_exceeds_max_pages(device):
    k = load(sibling("raises"))
    read_table(k, device, bs=3, max_pages=7).assert_matches()
    read_table(k, device, bs=3, max_pages=3, lens=[3, 2, 1]).assert_matches()
    with pytest.raises(RuntimeError):
        read_table(k, device, bs=3, max_pages=2, lens=[1, 2, 0])
