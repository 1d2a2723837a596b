"""A GPU worker's head start (``fuzz/engine/head_start.py``) on the CPU.

What a GPU adds is its own compiler and a context per child; everything else runs here. The
scout, run on the compiled JITFunctions of a set imported without ``TRITON_INTERPRET`` (a
subprocess), predicts every specialization the interpreter's real launches of the same
small-track sequences show; the coordinator compiles them (for sm_90, through a stand-in
driver) into the cache, where a fresh process's launches with the real tensors find every one;
a marker makes the next head start nothing; and the worker's gate holds a launch only while its
own variant is being compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import pytest

from fuzz.engine import head_start, launches, signatures
from fuzz.engine.options import CampaignOptions

REPO = Path(__file__).resolve().parents[2]
SEEDS, N_OPS = 4, 100  # warm-up sequences 0-3, 100 ops each: 57 specializations of kvkernels

_SCOUT = """
import json, sys
from fuzz.engine import head_start, scout
from fuzz.engine.generate import warmup_seed
from fuzz.engine.knobs import choose
from fuzz.engine.production.recipes import Book
from fuzz.engine.tiers import load_kernels
module = load_kernels("kvkernels")
book = Book()
scout.scout(module, "kvkernels", [warmup_seed(i) for i in range(int(sys.argv[1]))], choose(module, 0),
                 n_ops=int(sys.argv[2]), hostile="spec", check_every=1, on_launch=book)
print(json.dumps(sorted(book.recipes)))
"""

# A head start as a worker makes it (compiling for sm_90: no GPU here), then the same call again.
_BEGIN = """
import json, sys, time
from fuzz.engine import head_start
from fuzz.engine.options import CampaignOptions
opts = CampaignOptions(backend="cuda", ops_per_sequence=int(sys.argv[1]))
note = head_start.begin(opts, 0, 0, True)
gate = head_start._GATE[0]


class Told:  # the worker's end of the pipe, counting each compile it is told done
    def __init__(self, conn):
        self.conn, self.done = conn, 0

    def poll(self, timeout):
        return self.conn.poll(timeout)

    def recv(self):
        msg = self.conn.recv()
        self.done += msg[0] == "done"
        return msg

    def close(self):
        self.conn.close()


gate.conn = told = Told(gate.conn)
end = time.monotonic() + 500
while gate.report is None and time.monotonic() < end:
    gate._drain(0.1)
first = {**head_start.state(), "told_done": told.done}
again = head_start.begin(opts, 0, 0, True)
# Cut short: the marker gone, what it finished kept (a campaign that ended before its head start did).
marker = next(p for p in head_start._marker_dir().iterdir() if not p.name.endswith(".done"))
marker.unlink()
head_start.begin(opts, 0, 0, True)
gate = head_start._GATE[0]
while gate.report is None and time.monotonic() < end:
    gate._drain(0.1)
print(json.dumps({"note": note, "state": first, "again": again, "resumed": head_start.state(),
                  "marker_back": marker.is_file()}))
"""

# In a fresh process: the same sequences' launches (recorded), each looked up with its real tensors.
_LOOKUP = """
import json, sys
from triton import knobs
from triton.runtime import driver
from fuzz.engine import head_start, scout
from fuzz.engine.generate import warmup_seed
from fuzz.engine.knobs import choose
from fuzz.engine.production.recipes import StandInDriver
from fuzz.engine.tiers import load_kernels
driver.set_active(StandInDriver("cuda:90:32"))
module = load_kernels("kvkernels")
seen = []
scout.scout(module, "kvkernels", [warmup_seed(i) for i in range(8)], choose(module, 0), n_ops=int(sys.argv[1]),
                 hostile="spec", check_every=1, on_launch=seen.append)
hits = []
knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
for launch in seen:
    launch.fn.warmup(*launch.args, grid=(1,), **launch.kwargs)
print(json.dumps({"launches": len(seen), "hits": hits.count(True), "misses": hits.count(False)}))
"""


def _compiled(code: str, *args, **env) -> dict | list:
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p])
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=full, cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_scout_predicts_every_specialization_the_interpreters_real_launches_show():
    """Nothing the scout's target launched ran, and its checked allocator would have refused
    ops on tables its kernels never wrote; yet every specialization the interpreter's real run
    of the same warm-up sequences (same knobs) launches is among those it recorded. It records
    the smoke test's too (4, with every table aligned), which the real run made before its
    observer was installed."""
    from fuzz.engine.generate import warmup_seed
    from fuzz.engine.knobs import choose
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get

    scouted = set(_compiled(_SCOUT, SEEDS, N_OPS))
    tier = make_tier("interpret", "kvkernels")
    keys: set[str] = set()
    stop = launches.observe(lambda launch: keys.add(repr(signatures.specialization(launch))))
    try:
        for i in range(SEEDS):
            seq = get("small").run_sequence(tier, warmup_seed(i), N_OPS, knobs=choose(tier.kernels, 0))
            assert seq.divergence is None, seq.divergence
    finally:
        stop()
    assert len(keys) >= 30  # page sizes, dtypes, alignments, block shapes: a comparison that could fail
    assert keys <= scouted, sorted(keys - scouted)[:3]
    assert len(scouted - keys) <= 8


def test_a_head_start_compiles_what_it_scouted_and_its_marker_makes_the_next_one_nothing(tmp_path):
    """The coordinator compiles each specialization its scout met (none fails, none is lost);
    a fresh process's launches of the same sequences with their real tensors then find every
    one on disk; the marker it left makes the same worker's next head start a no-op; and without
    the marker (a head start cut short) the next one queues only what the last did not finish."""
    cache = tmp_path / "cache"
    n_ops = 12
    got = _compiled(_BEGIN, n_ops, TRITON_CACHE_DIR=cache, KVFUZZ_COMPILE_TARGET="cuda:90:32",
                    **{head_start.SCOUT_S_ENV: "600"})  # what it scouts, not how fast: the load must not cut it
    state = got["state"]
    assert got["note"].startswith("head start: the smoke test and 10 sequences scouted"), got["note"]
    assert state["specializations"] >= 10 and state["failed"] == 0 and state["lost"] == 0, state
    assert state["compiled"] + state["cached"] == state["specializations"]
    assert state["told_done"] == state["specializations"], state  # each relayed as it ended, not only at the end
    assert got["again"] is None
    assert len(list((cache / "kvfuzz-head-start").iterdir())) == 2  # the marker, and the digests it finished
    resumed = got["resumed"]  # after the marker was lost: nothing queued, nothing waited for, the marker back
    assert resumed["earlier"] == state["specializations"] == resumed["specializations"], resumed
    assert resumed["compiled"] + resumed["cached"] == 0 and got["marker_back"]
    found = _compiled(_LOOKUP, n_ops, TRITON_CACHE_DIR=cache)
    assert found["misses"] == 0 and found["hits"] >= 10, found


# A set whose Python hangs on its first free (the fixture's sleep loop): the scout's smoke test hangs in it.
_HUNG = """
import json, sys, time
from fuzz.engine import head_start
from fuzz.engine.options import CampaignOptions
head_start.SCOUT_HUNG_S = 20.0
opts = CampaignOptions(backend="cuda", kernels=sys.argv[1], ops_per_sequence=12)
t0 = time.monotonic()
head_start.begin(opts, 0, 0, True)
gate = head_start._GATE[0]
queued, relayed = set(), None  # when the compiles queued before the hang were told done, the scout still hung
while gate.report is None and time.monotonic() - t0 < 120:
    gate._drain(0.05)
    queued |= gate.pending
    if queued and not gate.pending and gate.report is None and relayed is None:
        relayed = time.monotonic() - t0
print(json.dumps({"report": gate.report, "s": time.monotonic() - t0, "relayed": relayed,
                  "markers": [p.name for p in head_start._marker_dir().iterdir()]}))
"""


def test_a_scout_hung_in_the_targets_own_call_is_left_behind_and_named(tmp_path):
    """A kernel set whose Python never returns from its first free (a process-wide trigger, as a
    set that hangs on its Nth call) hangs the scout in the coordinator: the coordinator leaves it
    behind ``SCOUT_HUNG_S`` past its deadline, still ends the compiles it queued (the smoke
    test's bind came before the free), reports where the scout was, and writes no marker (the
    next head start scouts again). The compiles are told done as they end, while the scout still
    hangs: a worker's launch waits for its compile, never for the scout."""
    hang = REPO / "tests" / "fixtures" / "kernels" / "foreign" / "hang_late.py"
    got = _compiled(_HUNG, hang, TRITON_CACHE_DIR=tmp_path / "cache", KVFUZZ_COMPILE_TARGET="cuda:90:32",
                    KVFUZZ_FIXTURE_HANG_AT="1")
    report = got["report"]
    assert "free_unbind_inplace (hang_late.py:" in report.get("stuck", ""), report
    assert report["lost"] == 0 and report["failed"] == 0, report
    assert report["specializations"] >= 1 and report["compiled"] + report["cached"] == report["specializations"]
    assert not any(not name.endswith(".done") for name in got["markers"]), got["markers"]
    assert got["relayed"] is not None and got["relayed"] < got["s"], got
    assert got["s"] < 100, got  # not the scout's hang: SCOUT_S + SCOUT_HUNG_S and the compiles


class _Conn:
    """One end of a pipe, as the gate reads it."""

    def __init__(self):
        self.reader, self.writer = Pipe(duplex=False)

    def send(self, *msg):
        self.writer.send(msg)


def test_the_gate_holds_a_launch_only_while_its_own_variant_is_being_compiled(monkeypatch):
    monkeypatch.setattr(head_start, "digest", lambda launch: launch)  # a launch named by its digest here
    conn = _Conn()
    gate = head_start.Gate(conn.reader)
    conn.send("queued", "a")
    conn.send("queued", "b")
    conn.send("done", "a")
    t0 = time.monotonic()
    gate("a")  # done already
    gate("c")  # never queued: it compiles (or loads) at its launch, as without a head start
    assert time.monotonic() - t0 < 0.5 and gate.waits == 0
    threading.Timer(0.4, conn.send, ("done", "b")).start()
    t0 = time.monotonic()
    gate("b")
    assert time.monotonic() - t0 >= 0.35 and gate.waits == 1
    conn.send("end", {"compiled": 2})
    launches.gate(gate)
    gate("d")  # told the coordinator ended: the gate takes itself off
    assert not gate.open and gate not in launches._GATES and gate.report == {"compiled": 2}


def test_a_worker_waits_for_its_head_start_so_long_in_all_then_compiles_its_own(monkeypatch):
    """On a host where other campaigns' compiles crowd the children out, the head start must not
    cost more than compiling alone: past WAIT_TOTAL_S of waits in all, no launch waits any more
    (the pipe still read, so the coordinator's compiles go on into the cache)."""
    monkeypatch.setattr(head_start, "digest", lambda launch: launch)
    monkeypatch.setattr(head_start, "WAIT_TOTAL_S", 0.3)
    conn = _Conn()
    gate = head_start.Gate(conn.reader)
    for key in "abc":
        conn.send("queued", key)
    t0 = time.monotonic()
    gate("a")  # never done: waits out what is left of the total
    assert 0.25 <= time.monotonic() - t0 < 10 and gate.gave_up and gate.summary()["gave_up"]
    conn.send("done", "a")
    t0 = time.monotonic()
    gate("b")
    gate("c")
    assert time.monotonic() - t0 < 5 and gate.waits == 1 and gate.open  # neither waited (the count says so)
    assert "b" in gate.pending and "a" not in gate.pending  # still read


def test_the_gate_lets_everything_through_once_the_coordinator_is_gone(monkeypatch):
    monkeypatch.setattr(head_start, "digest", lambda launch: launch)
    conn = _Conn()
    gate = head_start.Gate(conn.reader)
    conn.send("queued", "a")
    gate("z")
    conn.writer.close()  # the coordinator died with "a" unfinished
    t0 = time.monotonic()
    gate("a")
    assert time.monotonic() - t0 < 0.5 and not gate.open and "error" in gate.report


@pytest.mark.parametrize(("opts", "wanted"), [
    (CampaignOptions(backend="cuda"), True),
    (CampaignOptions(backend="cuda", guided=True), True),
    (CampaignOptions(backend="cuda", compile_ahead="off"), False),
    (CampaignOptions(backend="cuda", scale="production"), False),  # compile-ahead's, before the clock
    (CampaignOptions(backend="cuda", factory="fuzz.tools.mutants:mutant_tier_named", factory_arg="x"), False),
    (CampaignOptions(backend="interpret"), False),
], ids=["gpu-small", "gpu-guided", "off", "production", "factory", "interpreter"])
def test_a_worker_makes_a_head_start_on_compiled_kernels_of_the_small_track_only(opts, wanted):
    assert head_start.wanted(opts) is wanted
