"""p_read_table_far: read tables past the int32 address boundary (2^31 elements), on the CPU.

The op allocates the target's req_to_token (or out) with ``torch.empty`` and touches only the
rows a batch reads, so on the CPU the real boundary costs a few MB of an 8 GB (int32) or 16 GB
(int64) mapping that Linux never backs. These tests run it at that real boundary: our kernels
and the foreign ``indep.py`` stay clean on the interpreter (and the torch path), the fixture
``int32_offset.py`` (row offset computed in int32) is found by a replay in a child process,
and the generator draws the op on a GPU's limits only (tests/fuzz/test_far.py's GPU twin is the
campaign command of docs/kernel-sets.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import kvref
from fuzz.engine.kinds import parse_ops
from fuzz.engine.ops import Op
from fuzz.engine.production.far import FAR, PReadTableFar, far_room
from fuzz.engine.production.generator import ScaleGenerator, generator, scale_info
from fuzz.engine.production.limits import ScaleLimits
from fuzz.engine.production.ops import PSetup
from fuzz.engine.production.run import ScaleRun
from fuzz.engine.tiers import make_tier

REPO = Path(__file__).resolve().parents[2]
FOREIGN = REPO / "tests/fixtures/kernels/foreign"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter is off (a GPU is present)")

CONFIG = kvref.PoolConfig(num_pages=4096, page_size=1, multiplier=2)
SRC = (1, 4095, 1, 0, 0, 4095, 7, 3)  # a walk over the whole pool (bound pages and tombstones)
SETUP = PSetup(n=3000, v=(1, 4095, 1, 0, 0), p=(1, 3000, 7, 5, 0))
ROWS, WIDTH = 8193, 262144  # row 8192 starts at element 2^31: int32 offsets wrap there
NEAR = dict(rows=ROWS, width=WIDTH, src=SRC)
OPS = {
    "int32": PReadTableFar(seed=5, read=(8192, 8191, 2048), bs=4, live=(0, 1, 2, 3), max_pages=700, long_len=700,
                           **NEAR),
    "int64": PReadTableFar(seed=8, read=(8192, 8191), bs=2, live=(0, 1), max_pages=64, long_len=64, dtype="int64",
                           **NEAR),
    "packed": PReadTableFar(seed=6, read=(8192, 0), bs=3, live=(0, 1, 2), max_pages=300, long_len=300, packed=True,
                            **NEAR),
    "legacy": PReadTableFar(seed=7, read=(8192, 8191), bs=2, live=(0, 1), max_pages=64, long_len=64, legacy=True,
                            **NEAR),
}
# bs x (max_pages + 3) past 2^31: batch rows 8192 and 8193 of out start past it.
FAR_OUT = PReadTableFar(seed=9, rows=2, width=1 << 18, read=(1, 0), bs=8194, live=(0, 8191, 8192, 8193),
                        max_pages=1 << 18, src=SRC, long_len=64)


def _maxrss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _run(tier, ops):
    run = ScaleRun(CONFIG, tier)
    for op in [SETUP, *ops]:
        out = run.step(op)
        assert out.error is None and out.crash is None, f"{op}: {out}"
        assert out.result is None, f"{op} was not applicable on the CPU: {out.result}"
    run.finish()
    return run


def test_the_ops_reach_past_the_boundary_and_stay_small_in_json():
    for op in [*OPS.values(), FAR_OUT]:
        assert len(json.dumps(op.to_json())) < 300
        assert parse_ops([json.loads(json.dumps(op.to_json()))]) == [op]
    for op in OPS.values():
        assert op.rows * op.width > FAR and max(op.read) * op.width >= FAR
    assert max(FAR_OUT.live) * (FAR_OUT.max_pages + 3) >= FAR
    assert OPS["int32"].need_bytes() > 8 << 30 and OPS["int64"].need_bytes() > 16 << 30


@pytest.mark.parametrize("backend", ["torch", pytest.param("interpret", marks=needs_interpreter)])
def test_our_kernels_are_clean_at_the_real_boundary_in_a_few_mb(backend):
    before = _maxrss_mb()
    run = _run(make_tier(backend), OPS.values())
    assert run.elements_checked >= sum(len(op.live) * op.max_pages for op in OPS.values())
    assert _maxrss_mb() - before < 1024, "the far tables were touched beyond the rows they read"


@needs_interpreter
def test_a_foreign_set_is_clean_at_the_real_boundary():
    _run(make_tier("interpret", str(FOREIGN / "indep.py")), [OPS["int32"], OPS["packed"]])


@needs_interpreter
@pytest.mark.slow
def test_our_kernels_are_clean_past_the_boundary_in_out():
    """8194 programs on the interpreter (~12 s): out rows 8192 and 8193 start past 2^31."""
    before = _maxrss_mb()
    _run(make_tier("interpret"), [FAR_OUT])
    assert _maxrss_mb() - before < 1024


@needs_interpreter
def test_int32_offset_is_found_by_a_replay_on_the_interpreter(tmp_path):
    """The fixture wraps at row 8192: its wild read kills the child (SIGSEGV under the
    interpreter; an illegal address on a GPU) or, where that address is mapped, diverges."""
    case = {"schema": "kvfuzz-case/1", "config": CONFIG.to_json(),
            "ops": [SETUP.to_json(), OPS["int32"].to_json()],
            "signature": {"op": "p_read_table_far", "oracle": "crash", "field": "SIGSEGV"}}
    path = tmp_path / "far.json"
    path.write_text(json.dumps(case))
    proc = subprocess.run([sys.executable, "-m", "fuzz", "replay", str(path), "--backend", "interpret", "--kernels",
                           str(FOREIGN / "int32_offset.py")], cwd=REPO, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "p_read_table_far" in text and ("SIGSEGV" in text or "result" in text), text
    # ... and below the boundary the same fixture is right.
    below = dataclasses.replace(OPS["int32"], read=(8191, 8190, 2048))
    _run(make_tier("interpret", str(FOREIGN / "int32_offset.py")), [below])


def test_not_applicable_when_the_device_is_short_of_memory(monkeypatch):
    """A GPU without the room answers not applicable (a note, never a finding)."""
    import torch

    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    cuda = torch.device("cuda")
    gib = 1 << 30
    assert far_room(cuda, 9 * gib, mem_info=lambda d: (100 * gib, 141 * gib)) is None
    why = far_room(cuda, 9 * gib, mem_info=lambda d: (20 * gib, 141 * gib))
    assert why and "9.0 GiB" in why and "20.0 GiB" in why
    assert far_room(torch.device("cpu"), 1 << 40) is None  # the CPU: virtual; a refused mapping is answered later
    run = ScaleRun(CONFIG, make_tier("torch"))
    run.step(SETUP)
    huge = dataclasses.replace(OPS["int32"], rows=1 << 40)  # no machine maps 4 PiB
    out = run.step(huge)
    assert out.error is None and out.result["far"] == "not applicable" and run.notes
    run.finish()


def _gpu_info():
    info = scale_info(make_tier("torch"))
    return {**info, "gpu": True}


def test_the_generator_draws_far_tables_on_a_gpu_early_and_not_on_the_interpreter():
    info = _gpu_info()
    seen, modes = 0, set()
    for seed in range(40):
        _, gen = generator(seed, info)
        ops = [gen.next_op() for _ in range(8)]
        far = [op for op in ops if isinstance(op, PReadTableFar)]
        assert len(far) <= 1
        if far:
            seen += 1
            op = far[0]
            if op.bs > len(op.read) + 3:  # the far-out form
                modes.add("out")
                assert max(op.live) * (op.max_pages + 3) >= FAR
            else:
                modes.add("r2t")
                assert op.rows * op.width > FAR and any(r * op.width >= FAR for r in op.read)
            modes.add(op.dtype)
            modes.add("packed" if op.packed else "table")
    assert seen >= 0.6 * 40 and modes >= {"out", "r2t", "int32", "int64", "packed", "table"}, (seen, modes)
    for seed in range(20):  # the interpreter's limits: never (CI's memory is not asked for)
        _, gen = generator(seed, {**info, "gpu": False})
        assert not any(isinstance(gen.next_op(), PReadTableFar) for _ in range(12))
    _, gen = generator(0, {**info, "gpu": False}, mix={"p_read_table_far": 1, "p_alloc_bind": 1})
    assert "p_read_table_far" not in gen.mix
    for seed in range(20):  # a mix of its own (a benchmark's) gets none unless it names the kind
        _, gen = generator(seed, info, mix={"p_read_table": 1, "p_rows": 1})
        assert not any(isinstance(gen.next_op(), PReadTableFar) for _ in range(12))


def test_the_far_draw_leaves_the_rest_of_the_stream_as_it_was():
    info = _gpu_info()
    for seed in range(6):
        _, gen = generator(seed, info)
        with_far = [op for op in (gen.next_op() for _ in range(24)) if not isinstance(op, PReadTableFar)]
        _, plain = generator(seed, info, limits=dataclasses.replace(ScaleLimits.production(), far_r2t=0.0))
        assert with_far == [plain.next_op() for _ in range(len(with_far))]


def test_shrinking_keeps_valid_ops_that_hold_the_rows_they_read():
    run = ScaleRun(CONFIG, make_tier("torch"))
    run.step(SETUP)
    for op in [*OPS.values(), FAR_OUT]:
        cands = list(op.shrink())
        assert cands and all(isinstance(c, PReadTableFar) and c != op for c in cands)
        assert all(c.invalid(run) is None for c in cands), [c for c in cands if c.invalid(run)]
    run.finish()


def test_a_generator_without_a_far_rng_draws_none():
    rng = random.Random(3)
    gen = ScaleGenerator(rng, kvref.PoolConfig(num_pages=1 << 16), generator(0, _gpu_info())[1].constants,
                         ScaleLimits.production())
    assert not any(isinstance(gen.next_op(), PReadTableFar) for _ in range(40))
    assert Op.registry["p_read_table_far"] is PReadTableFar


def test_a_finding_does_not_keep_the_far_tables_buffers_alive(monkeypatch):
    """A finding's traceback holds the frames that raised it, and they held the op's buffers (16
    GiB here): a minimizer that keeps its failing candidates kept them all, and on an 80 GiB H100
    the later far ops of the minimization answered "not applicable" and passed. The frames are
    cleared as the finding leaves the op."""
    import gc
    import weakref

    from fuzz.engine.production import far
    from fuzz.engine.verdict import Divergence

    alive, real_empty = [], far._empty

    def empty(*args, **kw):
        t = real_empty(*args, **kw)
        alive.append(weakref.ref(t))
        return t

    tier = make_tier("torch")
    real = tier.kernels.build_kv_read_table

    def one_column_off(**kw):  # the first column wrong: a finding at the first row it writes
        real(**kw)
        kw["out"][:, 0] += 1

    monkeypatch.setattr(far, "_empty", empty)
    monkeypatch.setattr(tier.kernels, "build_kv_read_table", one_column_off)
    run = ScaleRun(CONFIG, tier)
    run.step(SETUP)
    with pytest.raises(Divergence) as found:
        run.step(OPS["int64"])
    assert found.value.op == OPS["int64"] and found.value.field == "out"
    gc.collect()
    assert alive and not [r for r in alive if r() is not None], "a finding kept the far op's buffers alive"


def test_a_replay_whose_far_op_could_not_run_is_no_verdict(tmp_path, capsys):
    """In this process as in a child: a case that passes only because its far table found no room
    (a GPU shared with other workers' memory) is UNKNOWN (exit 2), never PASS; a minimizer's
    candidate of that kind is not seen to fail."""
    from fuzz.cli import main
    from fuzz.engine.minimize import local_judge
    from fuzz.engine.supervise import NotRun

    huge = dataclasses.replace(OPS["int32"], rows=1 << 40)  # no machine maps 4 PiB
    with pytest.raises(NotRun, match="not applicable"):
        local_judge(make_tier("torch"))(CONFIG, [SETUP, huge])
    case = {"schema": "kvfuzz-case/1", "config": CONFIG.to_json(), "ops": [SETUP.to_json(), huge.to_json()],
            "signature": {"op": "p_read_table_far", "oracle": "result", "field": "out"}}
    path = tmp_path / "far.json"
    path.write_text(json.dumps(case))
    assert main(["replay", str(path), "--backend", "torch", "--in-process"]) == 2
    assert "UNKNOWN" in capsys.readouterr().out
