"""The nightly on a whole GPU host (``fuzz/tools/host.py``, ``ci/nightly-host.sh``), on the CPU:
``KVFUZZ_SIMULATE_GPUS=N`` makes the placement believe in N GPUs, and torch-tier campaigns
stand in for each (the interpreter's would do the same, slower). What a GPU host adds, the
``CUDA_VISIBLE_DEVICES`` pin of each campaign, is checked on the plan itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzz.engine import guide
from fuzz.engine.campaign import CampaignOptions
from fuzz.engine.slot import sequence_seed, share
from fuzz.tools import host
from tests.fuzz.test_engine import FAKES

REPO = Path(__file__).resolve().parents[2]
PAST_PREFIX = FAKES / "past_prefix.py"  # a torch-tier set with a planted bug: read_table/result/out


def _seeds(placements, seed: int = 7) -> list[int]:
    """Every sequence seed the placements' campaigns run (``slot.sequence_seed``, each worker's share)."""
    out = []
    for p in placements:
        opts = CampaignOptions(seed=seed, workers=p.workers, shard=p.shard)
        out += [sequence_seed(opts, w, k) for w in range(p.workers) for k in range(share(p.max_sequences, p.workers, w))]
    return out


@pytest.mark.parametrize("host_shard", [(0, 1), (2, 3)])
@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
@pytest.mark.parametrize("total", [8, 13, 40])
def test_the_gpus_run_exactly_the_sequences_one_campaign_of_the_hosts_shard_runs(host_shard, gpus, total):
    one = _seeds([host.Placement("one", (), host_shard, 1, total)])
    devices = [str(d) for d in range(gpus)]
    for layout in host.LAYOUTS:
        placements = host.plan(devices, layout=layout, workers_per_gpu=3, shard=host_shard, max_sequences=total)
        seeds = _seeds(placements)
        assert len(seeds) == len(set(seeds)) and sorted(seeds) == sorted(one), (layout, placements)
    shards = host.plan(devices, workers_per_gpu=3, shard=host_shard, max_sequences=total)
    assert len(shards) == gpus and sum(p.max_sequences for p in shards) == total


def test_each_campaign_is_pinned_to_its_gpu_and_one_campaign_sees_them_all(monkeypatch):
    monkeypatch.delenv(host.SIMULATE_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,6")
    h = host.find_host()
    assert h == host.Host(("2", "5", "6")) and h.backend == "cuda"
    shards = host.plan(h.devices, workers_per_gpu=4, shard=(1, 2))
    assert [p.env(h) for p in shards] == [{"CUDA_VISIBLE_DEVICES": d} for d in ("2", "5", "6")]
    assert [p.shard for p in shards] == [(1, 6), (3, 6), (5, 6)] and {p.workers for p in shards} == {4}
    [one] = host.plan(h.devices, layout="workers", workers_per_gpu=4, shard=(1, 2))
    assert one.env(h) == {"CUDA_VISIBLE_DEVICES": "2,5,6"} and one.workers == 12 and one.shard == (1, 2)
    monkeypatch.setenv(host.SIMULATE_ENV, "3")
    sim = host.find_host()
    assert sim.simulated and sim.devices == ("0", "1", "2") and sim.backend == "interpret"
    assert all(p.env(sim) == {} for p in host.plan(sim.devices))  # no pin naming GPUs that do not exist


@pytest.mark.parametrize("argv, env, says", [
    (["--max-sequences", "3"], {"KVFUZZ_SIMULATE_GPUS": "4"}, "--max-sequences 3 over 4 GPUs"),
    (["--gpus", "5"], {"KVFUZZ_SIMULATE_GPUS": "4"}, "--gpus 5: this host has 4"),
    (["--workers", "3"], {"KVFUZZ_SIMULATE_GPUS": "2"}, "--workers: the host sets this"),
    (["--summary=s.json"], {"KVFUZZ_SIMULATE_GPUS": "2"}, "--summary=s.json: the host sets this"),
    ([], {"KVFUZZ_SIMULATE_GPUS": "two"}, "KVFUZZ_SIMULATE_GPUS='two'"),
    (["--baseline", "no-such-baseline.json"], {"KVFUZZ_SIMULATE_GPUS": "2"}, "no-such-baseline.json: cannot read"),
])
def test_a_plan_that_cannot_be_made_is_exit_2_with_the_reason_before_any_campaign(tmp_path, argv, env, says):
    r = subprocess.run([sys.executable, "-m", "fuzz.tools.host", "--out", str(tmp_path / "o"), *argv],
                       capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o" / "gpus").exists()


def _stage(tmp_path, name: str, gpus: int, *extra: str, layout="shards", env=None) -> dict:
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "fuzz.tools.host", "--out", str(out), "--backend", "torch",
                        "--workers-per-gpu", "1", "--layout", layout, "--seed", "0", *extra],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, host.SIMULATE_ENV: str(gpus), **(env or {})})
    record = json.loads((out / "host.json").read_text())
    assert r.returncode == record["exit_code"], r.stdout + r.stderr
    return record


def test_two_simulated_gpus_run_one_gpus_work_and_merge_into_one_result(tmp_path):
    """The planted bug, found by each GPU's campaign: one case, its occurrences the sum of
    theirs; the same ops as one GPU running the same sequences, in either layout."""
    work = ["--kernels", str(PAST_PREFIX), "--max-sequences", "4"]
    one = _stage(tmp_path, "one", 1, *work)
    two = _stage(tmp_path, "two", 2, *work)
    together = _stage(tmp_path, "together", 2, *work, layout="workers")
    assert [c["shard"] for c in two["campaigns"]] == [[0, 2], [1, 2]] and two["layout"] == "shards"
    assert [c["max_sequences"] for c in two["campaigns"]] == [2, 2]
    assert together["layout"] == "workers" and [c["workers"] for c in together["campaigns"]] == [2]
    assert one["ops"] == two["ops"] == together["ops"] > 0 and one["sequences"] == two["sequences"] == 4
    out = tmp_path / "two"
    shards = [json.loads((out / "gpus" / g / "summary.json").read_text()) for g in ("gpu0", "gpu1")]
    assert all(s["failures"] for s in shards)  # each GPU found it
    merged = json.loads((out / "summary.json").read_text())
    assert merged["schema"] == "kvfuzz-merge/1" and merged["exit_code"] == 1 == two["exit_code"]
    [failure] = merged["failures"]
    assert failure["signature"] == "read_table/result/out" and len(failure["shards"]) == 2
    assert failure["occurrences"] == sum(f["occurrences"] for s in shards for f in s["failures"]) \
        == two["merge"]["occurrences"] == two["shard_occurrences"]
    assert [p.name for p in out.glob("*.json") if p.name not in ("summary.json", "host.json")] == [failure["case"]]
    assert merged["ops"] == two["ops"]


def test_each_gpus_corpus_grows_from_the_hosts_and_the_merge_covers_their_union(tmp_path):
    corpus = tmp_path / "corpus"
    first = _stage(tmp_path, "first", 1, "--max-sequences", "3", "--corpus", str(corpus))
    before = guide.Corpus(corpus).features
    assert before and first["corpus"]["features"] == len(before)
    night = _stage(tmp_path, "night", 2, "--max-sequences", "6", "--corpus", str(corpus))
    parts = [guide.Corpus(tmp_path / "night" / "corpora" / g).features for g in ("gpu0", "gpu1")]
    assert all(before <= p for p in parts)  # each GPU resumed the host's corpus
    after = guide.Corpus(corpus).features
    assert after == set().union(*parts) and night["corpus"]["features"] == len(after)
    assert night["corpus"]["kept"] <= night["corpus"]["entries_read"]


@pytest.mark.slow
def test_the_scaling_table_runs_the_same_work_per_gpu_count_and_resumes(tmp_path):
    out = tmp_path / "scaling"
    cmd = [sys.executable, "benchmarks/host_scaling.py", "--gpus", "1,2", "--scales", "small", "--layouts", "shards",
           "--backend", "torch", "--small-sequences", "4", "--workers-per-gpu", "1", "--out", str(out)]
    env = {**os.environ, host.SIMULATE_ENV: "2", "PYTHONPATH": str(REPO)}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((out / "host-scaling.json").read_text())
    assert [row["row"] for row in data["rows"]] == ["small-shards-1", "small-shards-2"] and not data["missing"]
    assert data["rows"][0]["ops"] == data["rows"][1]["ops"] > 0 and data["machine"]["simulated"]
    table = (out / "host-scaling.md").read_text()
    assert "| small | shards | 2 |" in table and "(simulated: CPU campaigns)" in table
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "rows").iterdir()}
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert again.returncode == 0 and "small-shards-1:" not in again.stdout, again.stdout + again.stderr
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (out / "rows").iterdir()}  # nothing ran again


@pytest.mark.slow
def test_the_host_nightly_leaves_one_merged_result_per_campaign_and_one_corpus(tmp_path):
    """ci/nightly-host.sh end to end on two simulated GPUs, bounded by work (and an op timeout no
    loaded runner reaches: a production op on the torch tier took 12 s on a 2-core machine
    shared with twenty other processes, and its timeout case had the night minimizing it)."""
    out = tmp_path / "night"
    env = {**os.environ, host.SIMULATE_ENV: "2", "KVFUZZ_BACKEND": "torch", "KVFUZZ_MAX_SEQUENCES": "2",
           "KVFUZZ_WORKERS_PER_GPU": "1", "KVFUZZ_SEED": "0", "KVFUZZ_OP_TIMEOUT": "600", "KVFUZZ_OUT": str(out),
           "KVFUZZ_RUN_ARGS": "--ops-per-sequence 8",  # production ops on the CPU: seconds each
           "KVFUZZ_CORPUS": str(tmp_path / "corpus"),
           "KVFUZZ_CACHE_DIR": str(tmp_path / "triton"), "KVFUZZ_NO_VENV": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "ci/nightly-host.sh"], capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for stage in ("cases", "guided", "production"):
        record = json.loads((out / stage / "host.json").read_text())
        assert [c["shard"] for c in record["campaigns"]] == [[0, 2], [1, 2]], stage
        assert all(c["exit_code"] == 0 and c["sequences"] == 1 and c["ops"] <= 8 for c in record["campaigns"]), stage
        assert json.loads((out / stage / "summary.json").read_text())["schema"] == "kvfuzz-merge/1"
    assert "--scale production" in " ".join(json.loads((out / "production" / "host.json").read_text())["run_args"])
    assert guide.Corpus(tmp_path / "corpus").features and (out / "coverage.txt").read_text().strip()


@pytest.mark.slow
def test_sigterm_reaches_every_campaign_and_the_merge_still_runs(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "fuzz.tools.host", "--out", str(out), "--backend", "torch",
                             "--workers-per-gpu", "1", "--budget-s", "600", "--progress-s", "1"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, host.SIMULATE_ENV: "2"})
    try:
        deadline = time.monotonic() + 240
        logs = [out / "gpus" / f"gpu{i}.log" for i in range(2)]
        # each campaign fuzzing: its progress lines, or a summary line at the latest
        while not all(p.is_file() and "[kvfuzz]" in p.read_text() for p in logs):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    record = json.loads((out / "host.json").read_text())
    assert len(record["campaigns"]) == 2 and record["merge"] is not None, text
    summaries = [json.loads((out / "gpus" / f"gpu{i}" / "summary.json").read_text()) for i in range(2)]
    assert [s["interrupted"] for s in summaries] == ["SIGTERM", "SIGTERM"], text
    assert all(c["elapsed_s"] < 300 for c in record["campaigns"]), record["campaigns"]
