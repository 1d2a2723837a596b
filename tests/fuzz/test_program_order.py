"""Launch-order fuzzing and literal block sizes, on the interpreter (no GPU needed).

``order_dependent.py`` claims each free program's output block with an atomic counter:
right whenever programs run in launch order, which the interpreter always did. With the
programs of each launch run in a seeded other order (the default on ``--backend
interpret``), a campaign finds it and the case replays; with ``--program-order launch``
it is clean, as it used to be. ``literal_blocks_stride2.py`` names no block constant (its
sizes are literals in its launchers) and is wrong only when a row needs a second trip of
its strided read table: production scale aims there from what its launches show.
"""

from __future__ import annotations

import json
import os

import pytest

from fuzz.engine.case import load_case
from fuzz.engine.dispatch import replay
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get
from tests.fuzz.test_engine import REPO, kvfuzz, show

FOREIGN = REPO / "tests/fixtures/kernels/foreign"
SEQUENCES = 2  # seed 0 meets the order bug in sequence 0 (a 5+ page free at its 7th op; measured at 0a8ebf0)
# Seed 1 meets the trip bug at its 16th op (p_read_table; measured: seed 0 is clean): 16 ops,
# as the sequences always had, and twice the sequences it takes.
TRIP_SEQUENCES, TRIP_OPS = 4, 16
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present): the GPU orders programs itself")


@pytest.mark.slow
@needs_interpreter
def test_an_order_dependent_free_is_found_on_the_cpu_and_replays(tmp_path):
    summary = tmp_path / "summary.json"
    r = kvfuzz("run", "--backend", "interpret", "--kernels", FOREIGN / "order_dependent.py", "--max-sequences",
               SEQUENCES, "--out", tmp_path / "cases", "--summary", summary, timeout=400)
    assert r.returncode == 1, show(r)
    data = json.loads(summary.read_text())
    found = [f for f in data["failures"] if "free" in f["signature"].split("/")[0]]
    assert found and data["stopped_by"] == "max-sequences", data
    assert data["options"]["program_order"] == "random"
    case = load_case(found[0]["case"])
    assert case.mode["program_order"] == "random" and "order_seed" in case.mode
    rr = kvfuzz("replay", found[0]["case"], timeout=300)
    assert rr.returncode == 1 and "program_order=random" in rr.stdout, show(rr)
    same = kvfuzz("replay", found[0]["case"], "--in-process", timeout=300)
    assert same.returncode == 1, show(same)


@pytest.mark.slow
@needs_interpreter
def test_in_launch_order_the_same_free_is_clean(tmp_path):
    """The very sequences that fail in a random program order (the test above) agree in launch order."""
    r = kvfuzz("run", "--backend", "interpret", "--kernels", FOREIGN / "order_dependent.py", "--max-sequences",
               SEQUENCES, "--program-order", "launch", "--out", tmp_path / "cases", timeout=300)
    assert r.returncode == 0 and "stopped_by=max-sequences" in r.stdout, show(r)


@pytest.mark.slow
@needs_interpreter
def test_a_trip_bug_behind_literal_block_sizes_is_found_at_production_scale():
    tier = make_tier("interpret", str(FOREIGN / "literal_blocks_stride2.py"))
    production = get("production")
    info = production.worker_info(tier)
    assert info["scale"]["constants"]["source"] == "launches", info["scale"]["constants"]
    assert any("(launch)" in note for note in info["notes"])
    seed, d = 0, None
    while seed < TRIP_SEQUENCES and d is None:  # a bound of work, not of seconds
        seq = production.run_sequence(tier, seed, TRIP_OPS)
        d, config, ops = seq.divergence, seq.config, seq.ops
        seed += 1
    assert d is not None, f"not found in {TRIP_SEQUENCES} sequences of {TRIP_OPS} ops"
    assert d.kind in ("p_read_table", "g_read_table", "p_read_table_far") and d.field == "out", d
    again, _ = replay(config, ops[: d.step + 1], tier)
    assert again is not None and again.signature == d.signature
