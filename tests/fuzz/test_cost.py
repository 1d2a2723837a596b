"""The interpreter's production stream: priced tables, a tour of every kind, a cheap far table.

On ``--backend interpret`` a read table of the production constants that reaches a second
trip runs about TARGET programs (seconds each); drawn by default they left a minute's run
with a handful of ops and no far table at all. These tests hold the generator (no kernel
runs, except the int32 one) to what ``production/cost.py`` promises: the first sequence
meets every production kind, far tables included, each tour table within ``op_work``; a
table past ``op_work`` always reaches a second trip and the sequence's dear ones fit its
budget; and the streams of a GPU and of the torch tier are the ones they were.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.engine.production import cost
from fuzz.engine.production.far import FAR, PReadTableFar
from fuzz.engine.production.generator import DEFAULT_MIX, HOSTILE_MIX, generator, scale_info
from fuzz.engine.production.graph import GReadTable
from fuzz.engine.production.limits import ScaleLimits
from fuzz.engine.production.ops import PReadTable
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get as get_track

REPO = Path(__file__).resolve().parents[2]
FOREIGN = REPO / "tests/fixtures/kernels/foreign"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter is off (a GPU is present)")
KINDS = set(DEFAULT_MIX) | set(HOSTILE_MIX) | {"p_read_table_far", "p_setup", "p_rows"}
SETS = {"kvkernels": None, "indep": str(FOREIGN / "indep.py"), "literal_blocks": str(FOREIGN / "literal_blocks.py")}


@pytest.fixture(scope="module")
def infos() -> dict:
    """scale_info of each set on the interpreter (its constants read from a few real launches)."""
    if not INTERPRET:
        pytest.skip("Triton's interpreter is off (a GPU is present)")
    return {name: scale_info(make_tier("interpret", path)) for name, path in SETS.items()}


def _work(gen, op) -> int | None:
    """What the generator priced ``op`` at (the same call ``take`` makes), for the table kinds."""
    c = gen.constants
    if isinstance(op, PReadTableFar):
        return cost.table_work(c, op.bs, op.max_pages if op.bs == len(op.live) else op.long_len,
                               long_rows=None if op.bs == len(op.live) else len(op.live))
    if isinstance(op, GReadTable):
        return cost.table_work(c, op.bs, op.max_pages, launches=gen.limits.graph_steps + 1,
                               grid_cols=op.bs * op.max_pages if op.packed else None)
    if op.kind in ("p_read_table_packed", "p_read_table_packed_disagree"):
        return cost.table_work(c, op.bs, op.row_cap, grid_cols=op.bs * op.row_cap)
    if op.kind in ("p_read_table", "p_read_table_overflow"):
        return cost.table_work(c, op.bs, op.max_pages)
    return None


def test_the_interpret_backend_alone_is_priced(infos):
    assert all(info.get("interpreter") is True for info in infos.values())
    assert "interpreter" not in scale_info(make_tier("torch"))
    for info in ({**infos["indep"], "gpu": True}, {k: v for k, v in infos["indep"].items() if k != "interpreter"}):
        _, gen = generator(0, info)
        assert gen.budget is None and gen.tour == [] and gen.limits.op_work is None
    _, gen = generator(0, infos["indep"])
    assert gen.budget is not None and gen.limits == ScaleLimits.interpreter_priced()


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_first_sequence_meets_every_production_kind_cheaply(infos, name):
    """Seeds 0-29 of each set: every kind, the far table among ops 1-4, in the first
    ``default_ops`` ops; while the tour lasts no table but its p_read_table (which may reach a
    second trip) is priced past ``op_work``."""
    n_ops = get_track("production").default_ops
    lim = ScaleLimits.interpreter_priced()
    for seed in range(30):
        _, gen = generator(seed, infos[name])
        tour_len = len(gen.tour) - ("p_rows" in gen.tour) + 1  # the tour's tables and the far one
        ops = [gen.next_op() for _ in range(n_ops)]
        kinds = [op.kind for op in ops]
        assert set(kinds) >= KINDS, (seed, sorted(KINDS - set(kinds)))
        far = [i for i, k in enumerate(kinds) if k == "p_read_table_far"]
        assert len(far) == 1 and 1 <= far[0] - kinds[:far[0]].count("p_rows") <= 4, (seed, kinds)
        op = ops[far[0]]
        assert (max(op.read) * op.width >= FAR) or (max(op.live) * (op.max_pages + 3) >= FAR), op
        # The tour: every mix kind once before any weighted draw (prerequisite rows and a bind
        # postponed behind its free excepted); its tables cheap, the far table included.
        touring = [op for op in ops[1:] if op.kind != "p_rows"][:tour_len]
        for op in touring:
            w = _work(gen, op)
            if w is not None and op.kind != "p_read_table" and not (isinstance(op, PReadTableFar)
                                                                    and op.bs > len(op.live)):
                assert w <= lim.op_work, (seed, op.to_json(), w)


@pytest.mark.parametrize("name", sorted(SETS))
def test_a_dear_table_reaches_a_second_trip_within_the_sequence_budget(infos, name):
    """Seeds 0-29, 48 ops each: a table priced past ``op_work`` gives a row a second trip
    (its long rows too), and a sequence's dear tables together stay near its budget."""
    lim = ScaleLimits.interpreter_priced()
    dear_seen = 0
    for seed in range(30):
        _, gen = generator(seed, infos[name])
        dear = 0
        for _ in range(48):
            op = gen.next_op()
            w = _work(gen, op)
            if w is None or w <= lim.op_work or isinstance(op, PReadTableFar):
                continue
            dear += w
            cols = op.row_cap if "packed" in op.kind else op.max_pages
            assert cost.reaches_trip(gen.constants, op.bs, cols), (seed, op.to_json(), w)
            if type(op) is PReadTable:
                assert cost.reaches_trip(gen.constants, op.bs, -(-op.long_len // gen.config.page_size)), op
        assert dear <= lim.sequence_work + lim.trip_work, (seed, dear)
        dear_seen += dear > 0
    assert dear_seen >= 10, dear_seen  # trips are still reached, where they are what a table is for


@needs_interpreter
def test_int32_offset_is_found_at_production_scale_on_the_interpreter(tmp_path):
    """The fixture's read table wraps the row offset at 2^31 elements: the first sequence's
    far table finds it, with the default mix and limits (``--max-sequences 1`` bounds the work,
    ``--stop-on-first`` ends it at the first case). One reproduction and no minimization: what
    is tested is the stream, and each fresh-child replay of a crash costs a process start
    (``benchmarks/first_case.py`` measures the default flags, confirmation included). An op-timeout
    of its own: auto's 10 s for a first long op is 5x the 2 s the longest took on an idle core, and
    a far table timed out would not be the crash or divergence asked for."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fuzz", "run", "--backend", "interpret", "--scale", "production",
                           "--kernels", str(FOREIGN / "int32_offset.py"), "--max-sequences", "1", "--stop-on-first",
                           "--reproduce", "1", "--no-minimize", "--op-timeout", "120",
                           "--out", str(out), "--summary", str(tmp_path / "summary.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    summary = json.loads((tmp_path / "summary.json").read_text())
    sigs = [f["signature"] for f in summary["failures"]]
    assert sigs and sigs[0].startswith("p_read_table_far/"), (sigs, text)
    assert sigs[0].split("/")[1] in ("crash", "result"), sigs
