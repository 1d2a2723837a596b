"""Compile-ahead (``fuzz/engine/production/ahead.py``, ``launches.record_only``) on the CPU.

Everything but a GPU's own compile is checked here: the scout, run on the compiled
JITFunctions of a set imported without ``TRITON_INTERPRET`` (a subprocess, as the compile
track's child does), records the specializations the interpreter's real launches of the same
sequences show; a recipe compiled with ``warmup`` (for sm_90, through a stand-in driver) is
the very cache entry a launch with the real tensors looks up; and the campaign scouts exactly
its workers' streams.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fuzz.engine import launches, signatures
from fuzz.engine.production import ahead, recipes
from fuzz.engine.production.limits import ScaleLimits
from tests.fuzz.test_launches import _FakeJit

REPO = Path(__file__).resolve().parents[2]
INDEP = str(REPO / "tests" / "fixtures" / "kernels" / "foreign" / "indep.py")
SEEDS = [3, 4]
N_OPS = 12

# Run in a process without TRITON_INTERPRET: the set's kernels are JITFunctions, the tensors CPU
# ones (kvkernels' launchers send CPU tensors to its torch path unless interpreting: told otherwise).
_SCOUT = """
import json, sys
import kvkernels.launchers
kvkernels.launchers.INTERPRET = True
from fuzz.engine.launches import record_only
from fuzz.engine.production import ahead
from fuzz.engine.production.generator import scale_info
from fuzz.engine.tiers import Tier, load_kernels
name, stream = sys.argv[1], json.loads(sys.argv[2])
tier = Tier("cuda", name, load_kernels(name), "cpu")
with record_only(lambda launch: None):
    scale_info(tier)  # the boundary probe's launches: not the sequences'
book = ahead.Book()
done = ahead.scout_seeds(tier, stream, stream["seeds"], book)
print(json.dumps({"keys": sorted(book.recipes), "constants": done["constants"], "cut": done["cut"]}))
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def _stream() -> dict:
    return ahead.stream(SEEDS, limits="small", n_ops=N_OPS)


def _interpreted_keys(name: str) -> tuple[set[str], dict]:
    """The specializations the interpreter's real launches of the same sequences show."""
    from fuzz.engine.production.generator import scale_info
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get

    tier = make_tier("interpret", name)
    constants = scale_info(tier)["constants"]
    keys: set[str] = set()
    stop = launches.observe(lambda launch: keys.add(repr(signatures.specialization(launch))))
    try:
        for seed in SEEDS:
            seq = get("production").run_sequence(tier, seed, N_OPS, limits=ScaleLimits.small())
            assert seq.divergence is None, seq.divergence
    finally:
        stop()
    return keys, constants


@pytest.mark.parametrize("name", ["kvkernels", INDEP], ids=["kvkernels", "indep"])
def test_the_scout_records_the_specializations_real_launches_of_the_same_ops_show(name):
    """The scout's launches never ran (no compile, no driver), yet the set of specializations it
    recorded is the one the interpreter's launches of the same seeds give, kernel by kernel,
    argument class by argument class, and the boundaries it drew at are the workers' own."""
    proc = subprocess.run([sys.executable, "-c", _SCOUT, name, json.dumps(_stream())], env=_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scouted = json.loads(proc.stdout.strip().splitlines()[-1])
    keys, constants = _interpreted_keys(name)
    assert scouted["cut"] == 0  # no sequence was cut short by the garbage the unrun kernels left
    assert scouted["constants"] == constants
    assert len(keys) >= 5  # several kernels, several classes: a comparison that could fail
    assert set(scouted["keys"]) == keys


def test_a_recipe_compiled_ahead_is_what_a_launch_with_the_real_tensors_finds_on_disk(tmp_path):
    """``run_job`` compiles every scouted specialization (for sm_90 here: no GPU) into the cache;
    then, in a fresh process, each launch of the same sequence issued with its real tensors
    (``warmup``: Triton's own binder computes the key) hits the disk cache: no compile left; and
    once ``preload`` has loaded the recipes, the same launches find them in memory."""
    cache = tmp_path / "cache"
    stream = ahead.stream(SEEDS[:1], limits="small", n_ops=8)
    recipes_out = tmp_path / "recipes.json"
    report = ahead.run_job({"kernels": INDEP, "streams": [stream], "processes": 2, "target": "cuda:90:32",
                            "recipes_out": str(recipes_out)}, env={"TRITON_CACHE_DIR": str(cache)})
    assert "error" not in report, report
    assert report["failed"] == [] and report["specializations"] >= 5
    assert report["compiled"] == report["specializations"]
    check = """
import json, sys
from triton import knobs
from triton.runtime import driver
from fuzz.engine.production import ahead, recipes
from fuzz.engine.launches import record_only
from fuzz.engine.tiers import Tier, load_kernels
driver.set_active(recipes.StandInDriver("cuda:90:32"))
tier = Tier("cuda", sys.argv[1], load_kernels(sys.argv[1]), "cpu")
seen = []
with record_only(seen.append):
    ahead.scout_seeds(tier, json.loads(sys.argv[2]), json.loads(sys.argv[2])["seeds"], ahead.Book())
hits = []
knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
for launch in seen:
    launch.fn.warmup(*launch.args, grid=(1,), **launch.kwargs)
got = {"launches": len(seen), "hits": hits.count(True), "misses": hits.count(False)}
for fn in {id(launch.fn): launch.fn for launch in seen}.values():
    fn.device_caches.clear()  # forget them: preload puts them back from the recipes alone
got["preload"] = ahead.preload(sys.argv[3])
hits.clear()
for launch in seen:
    launch.fn.warmup(*launch.args, grid=(1,), **launch.kwargs)
got["after_preload"] = len(hits)
print(json.dumps(got))
"""
    proc = subprocess.run([sys.executable, "-c", check, INDEP, json.dumps(stream), str(recipes_out)], cwd=REPO,
                          capture_output=True,
                          text=True, timeout=600, env=_env(TRITON_CACHE_DIR=str(cache)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # Each distinct key of the real launches was looked up once (later ones hit the memory cache):
    # the smoke test's are in the report but not relaunched here.
    assert got["misses"] == 0 and 5 <= got["hits"] <= report["specializations"] <= got["launches"] + 8
    # Preloaded from the recipes, they are in the kernels' own caches: a launch does not even look.
    assert got["preload"]["loaded"] == report["specializations"] and got["preload"]["failed"] == 0
    assert got["after_preload"] == 0


def test_record_only_hands_the_launch_over_resolved_and_runs_nothing():
    """Under ``record_only`` a launch reaches the callback, recorders and observers with its
    callable grid resolved from its arguments, and neither it nor its replay runs."""
    from fuzz.engine.tiers import make_tier

    tier = make_tier("interpret", INDEP)
    v2p = torch.full((64,), -1, dtype=torch.int64)
    p2v = torch.full((64,), -1, dtype=torch.int64)
    ids = torch.arange(1, 41, dtype=torch.int64)
    got, observed = [], []
    stop = launches.observe(observed.append)
    try:
        with launches.Recorder() as rec, launches.record_only(got.append):
            before = launches.count()
            tier.kernels.bind_inplace(ids, ids, v2p, p2v)
            rec.launches[0].replay()
    finally:
        stop()
    assert len(got) == 1 and rec.launches == got and observed == got
    assert launches.count() == before + 2  # the launch and its replay are counted: neither ran
    assert got[0].grid_dims is not None and got[0].grid_dims[0] >= 1
    assert (v2p == -1).all() and (p2v == -1).all()
    tier.kernels.bind_inplace(ids, ids, v2p, p2v)  # outside it, the same call runs
    assert (v2p[1:41] == ids).all()


def test_recipes_carry_dtypes_alignment_and_scalars_and_refuse_what_cannot_travel():
    base = torch.zeros(8, dtype=torch.int32)
    assert recipes.encode(base) == {"tensor": "int32", "aligned": True}
    assert recipes.encode(base[1:]) == {"tensor": "int32", "aligned": False}
    for value in (1, 16, 17, 2**40, True, None, 0.5):
        assert recipes.decode(json.loads(json.dumps(recipes.encode(value)))) == value
    arg = recipes.decode(recipes.encode(base[1:]))
    assert arg.dtype == torch.int32 and arg.data_ptr() % 16 != 0
    assert recipes.decode(recipes.encode(base)).data_ptr() % 16 == 0
    assert recipes.decode(recipes.encode((1, base)))[0] == 1
    with pytest.raises(recipes.Unencodable):
        recipes.encode(object())


def test_scout_tasks_take_every_streams_first_seeds_first():
    """When the scout's time runs out, each worker's early sequences were scouted, not one's all."""
    a, b = ahead.stream(range(10)), ahead.stream(range(100, 105))
    order = [(stream is a, seeds[0]) for stream, seeds in ahead._chunks([a, b])]
    assert order == [(True, 0), (False, 100), (True, 4), (False, 104), (True, 8)]


def test_a_variant_found_on_disk_counts_as_a_load_and_a_miss_as_a_compile():
    """What the compilation listener saw during the launch decides: hits and no miss, a load."""
    fn = _FakeJit()
    loads0, compiles0 = launches.loads(), launches.compiles()
    for hit in (True, False):
        before, hits = launches._variants(fn), tuple(launches._HITS)
        fn.add_variant(hit)
        launches._HITS[0 if hit else 1] += 1
        launches._note_compile(fn, 0.01, before, hits)
    assert (launches.loads(), launches.compiles()) == (loads0 + 1, compiles0 + 1)


def test_the_campaign_scouts_its_workers_own_streams(monkeypatch, tmp_path):
    """The job names each worker's warm-up seeds, then its first sequences (``sequence_seed``),
    with its palette, as the worker will draw them."""
    from fuzz.engine import campaign as camp
    from fuzz.engine.generate import warmup_seed
    from fuzz.engine.slot import ahead_job, compile_ahead, sequence_seed

    jobs = []
    monkeypatch.setattr(ahead, "run_job", lambda job, env=None: jobs.append((job, env)) or {"error": "stub"})
    opts = camp.CampaignOptions(backend="cuda", scale="production", kernels=INDEP, workers=2, seed=7,
                                ahead_sequences=3, max_sequences=5, cache_dir=str(tmp_path), compile_ahead="on")
    assert opts.compile_ahead_on() and not opts.compile_ahead_follows()
    env = opts.child_env()
    report, following = compile_ahead(opts, opts.tier_spec(), tmp_path, env)
    (job, seen_env), = jobs
    assert seen_env is env and following is None and job["follow_s"] is None
    assert job["kernels"] == INDEP and env["TRITON_CACHE_DIR"] == str(tmp_path.resolve())
    assert job["recipes_out"] == str(tmp_path / "compiled-ahead.json")
    for w, stream in enumerate(job["streams"]):
        timed = [sequence_seed(opts, w, k) for k in range(3 if w == 0 else 2)]  # worker 1's share of 5 is 2
        assert stream["seeds"] == [warmup_seed(i) for i in range(4)] + timed
        assert stream["palette_seed"] == opts.palette_seed(w) is not None
        assert stream["n_ops"] == opts.n_ops() and stream["hostile"] == opts.hostile
        assert stream["more"] == []
    follow = camp.CampaignOptions(backend="cuda", scale="production", kernels=INDEP, workers=2, seed=7,
                                  ahead_sequences=3, max_sequences=9, compile_ahead="follow", budget_s=40)
    job = ahead_job(follow, follow.tier_spec(), tmp_path / "r.json")
    assert job["follow_s"] == 40 and job["workers"] == 2
    assert [s["more"] for s in job["streams"]] == [[sequence_seed(follow, 0, k) for k in (3, 4)],
                                                  [sequence_seed(follow, 1, 3)]]  # shares of 9: 5 and 4
    assert report == {"error": "stub"}
    assert ahead.RECIPES_ENV not in env  # nothing compiled: no child preloads
    assert not camp.CampaignOptions(backend="interpret", scale="production").compile_ahead_on()
    assert not camp.CampaignOptions(backend="cuda", scale="small").compile_ahead_on()
    # auto follows the workers where it is on (a set that specializes its ints meets new
    # specializations in most sequences), and nowhere else
    assert camp.CampaignOptions(backend="cuda", scale="production").compile_ahead_follows()
    assert ahead_job(camp.CampaignOptions(backend="cuda", scale="production", kernels=INDEP, budget_s=30),
                     opts.tier_spec(), tmp_path / "a.json")["follow_s"] == 30
    assert not camp.CampaignOptions(backend="cuda", scale="small").compile_ahead_follows()
    assert not camp.CampaignOptions(backend="interpret", scale="production").compile_ahead_follows()
    assert not camp.CampaignOptions(backend="cuda", scale="production", compile_ahead="off").compile_ahead_follows()


def test_the_summary_says_whether_the_workers_drew_from_the_scouts_boundaries():
    from types import SimpleNamespace

    from fuzz.engine.slot import same_boundaries

    scouted = {"constants": {"blocks": {"BLOCK": 128}, "targets": {}, "source": "module"}}
    same = SimpleNamespace(hello={"scale": {"constants": dict(scouted["constants"])}})
    other = SimpleNamespace(hello={"scale": {"constants": {**scouted["constants"], "blocks": {"BLOCK": 64}}}})
    unstarted = SimpleNamespace(hello=None)
    assert same_boundaries(scouted, [same, unstarted]) is True
    assert same_boundaries(scouted, [same, other]) is False
    assert same_boundaries({"error": "no GPU"}, [same]) is None


def test_compile_ahead_on_without_a_gpu_tier_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fuzz", "run", "--backend", "interpret", "--scale", "production",
                           "--compile-ahead", "on", "--budget-s", "1", "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=_env(TRITON_INTERPRET="1"))
    assert proc.returncode == 2
    assert "--compile-ahead on" in proc.stderr and "--backend cuda" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is the target here")
def test_without_a_gpu_or_a_target_the_compile_ahead_says_so_at_once(monkeypatch):
    """A ``--backend cuda`` campaign on a machine without a GPU fails its workers' set-up; the
    compile-ahead before them must not scout for minutes first."""
    monkeypatch.delenv("KVFUZZ_COMPILE_TARGET", raising=False)
    report = ahead.run_job({"kernels": INDEP, "streams": [ahead.stream(range(50))]})
    assert "no GPU" in report["error"]
    assert ahead.describe(report).startswith("failed (no GPU")


def test_a_following_compile_ahead_compiles_later_sequences_and_stops_with_its_pool(tmp_path):
    """``follow_s``: after its report the child scouts each stream's ``more`` seeds and compiles
    what is new, while the campaign runs; ``stop`` ends it, its pool with it, and says how far
    it got."""
    first = ahead.stream(SEEDS[:1], limits="small", n_ops=6)
    job = {"kernels": INDEP, "target": "cuda:90:32", "processes": 2, "follow_s": 300, "workers": 1,
           "streams": [{**first, "more": [SEEDS[1]]}]}
    child = ahead.Job(job, {"TRITON_CACHE_DIR": str(tmp_path / "cache")})
    try:
        report = child.first(600)
        assert "error" not in report, report
        follow = child.tmp / "report.json.follow"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            counts = json.loads(follow.read_text()) if follow.is_file() else {}
            if counts.get("sequences") and not counts.get("queued") and counts["compiled"] == counts["specializations"]:
                break
            time.sleep(1)
    finally:
        counts = child.stop()
    assert child.proc.poll() is not None
    assert counts["sequences"] == 1 and counts["failed"] == 0
    assert counts["compiled"] == counts["specializations"] >= 1  # the second seed met variants the first did not
