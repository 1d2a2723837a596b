"""The fuzzing engine end to end: the CLI contract (DESIGN.md, "CLI"), seeds and shards,
case files, the minimizer, and each oracle against a target that breaks it on purpose.

CLI tests run ``python -m fuzz`` from the repository root in a subprocess without
``TRITON_INTERPRET`` in its environment, the way an engineer or a CI job calls it, so
they also check that ``--backend interpret`` turns the interpreter on by itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

import kvref
from fuzz.cli import build_parser
from fuzz.cli_args import WORK_BUDGET_S
from fuzz.engine.campaign import CampaignOptions, run_campaign
from fuzz.engine.case import SCHEMA, CaseError, Signature, load_case
from fuzz.engine.dispatch import replay
from fuzz.engine.kinds import parse_ops
from fuzz.engine.minimize import Minimizer, NotReproducible
from fuzz.engine.ops import POISON, Op
from fuzz.engine.slot import sequence_seed
from fuzz.engine.tiers import make_tier
from fuzz.engine.tracks import get as get_track
from kvkernels import checks
from kvkernels.allocator import DeviceAllocator
from kvref import ContractViolation

REPO = Path(__file__).resolve().parents[2]
PLANTED_REL = "tests/fixtures/kernels/forget_p2v_tombstone.py"
PLANTED = str(REPO / PLANTED_REL)
FAKES = REPO / "tests/fuzz/fixtures/kernels"
# Seed 0 of the campaign fails on its first sequence: one sequence finds and minimizes the
# planted bug on a runner of any speed (an 8 s budget did not even start a worker on a loaded one).
# In-process campaigns bounded by work take the CLI's budget for them (WORK_BUDGET_S), a safety cap:
# a shorter one is also the deadline their minimizing and rating run to.
ACCEPTANCE_SEQUENCES = "1"

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton's interpreter is off (a GPU is present)")


def cli_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KVFUZZ_BACKEND", "KVFUZZ_KERNELS")}
    env.update(extra)
    return env


def kvfuzz(*args, timeout: float = 240, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fuzz", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=cli_env(**env))


def show(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


# ---- (a) the acceptance tests of the issue --------------------------------------------


@pytest.mark.slow
def test_run_finds_minimizes_and_replays_the_planted_bug(tmp_path):
    out = tmp_path / "cases"
    r = kvfuzz("run", "--kernels", PLANTED_REL, "--backend", "interpret", "--max-sequences", ACCEPTANCE_SEQUENCES,
               "--out", out)
    assert r.returncode == 1, show(r)
    cases = sorted(out.iterdir())
    assert cases and all(p.is_file() and p.suffix == ".json" for p in cases), cases  # directly in --out
    loaded = {p: load_case(p) for p in cases}
    short = [p for p, c in loaded.items() if c.lengths["minimized"] <= 5]
    assert short, {p.name: c.lengths for p, c in loaded.items()}
    for p in short:
        assert len(loaded[p].ops) == loaded[p].lengths["minimized"]
    summary = [line for line in r.stdout.splitlines() if line.startswith("kvfuzz run:")]
    assert len(summary) == 1 and f"failures={len(cases)}" in summary[0], show(r)

    rp = kvfuzz("replay", short[0])
    assert rp.returncode == 1, show(rp)
    assert "FAIL" in rp.stdout and "same signature" in rp.stdout, show(rp)


@pytest.mark.slow
def test_run_on_the_correct_kernels_is_clean(tmp_path):
    out = tmp_path / "cases"
    r = kvfuzz("run", "--backend", "interpret", "--max-sequences", 2, "--out", out)
    assert r.returncode == 0, show(r)
    assert not out.exists() or not any(out.iterdir())
    assert "failures=0" in r.stdout and "stopped_by=max-sequences" in r.stdout, show(r)


# ---- (b) usage and setup errors exit 2, with a message and no traceback ---------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


USAGE_ERRORS = {
    "shard past N": (["run", "--shard", "3/2"], "--shard"),
    "shard N zero": (["run", "--shard", "0/0"], "--shard"),
    "shard not I/N": (["run", "--shard", "half"], "--shard"),
    "shard negative": (["run", "--shard", "-1/2"], "--shard"),
    "budget zero": (["run", "--budget-s", "0"], "--budget-s"),
    "max sequences zero": (["run", "--max-sequences", "0"], "--max-sequences"),
    "max ops not a number": (["run", "--max-ops", "many"], "--max-ops"),
    "unknown backend": (["run", "--backend", "tpu"], "invalid choice"),
    "replay unknown backend": (["replay", "x.json", "--backend", "tpu"], "invalid choice"),
    "kernels missing file": (["run", "--kernels", "tests/fuzz/fixtures/kernels/missing.py", "--max-sequences", "1"],
                             "no such file"),
    "kernels file not a kernel set": (["run", "--kernels", "tests/fuzz/fixtures/kernels/not_a_kernel_set.py",
                                       "--max-sequences", "1"], "not a kernel set"),
    "kernels module not a kernel set": (["run", "--kernels", "json", "--max-sequences", "1"], "not a kernel set"),
    "kernels module missing": (["run", "--kernels", "no_such_pkg.kernels", "--max-sequences", "1"], "cannot import"),
    "replay non-case JSON": (["replay", "{tmp}/other.json"], "not a kvfuzz case"),
    "replay not JSON": (["replay", "{tmp}/notes.json"], "not JSON"),
    "replay missing file": (["replay", "{tmp}/absent.json"], "cannot read"),
    "replay --pytest non-case": (["replay", "--pytest", "{tmp}/other.json"], "not a kvfuzz case"),
    "minimize non-case": (["minimize", "{tmp}/other.json"], "not a kvfuzz case"),
}


@pytest.mark.parametrize("name", list(USAGE_ERRORS))
def test_usage_errors_exit_2_with_a_message(name, tmp_path):
    _write(tmp_path / "other.json", json.dumps({"results": [1, 2, 3], "schema": "something-else/1"}))
    _write(tmp_path / "notes.json", "ops: alloc, free\n")
    args, message = USAGE_ERRORS[name]
    args = [a.format(tmp=tmp_path) for a in args]
    if args[0] == "run":
        args += ["--out", tmp_path / "out"]  # should the run start after all, keep its cases out of the tree
    r = kvfuzz(*args, timeout=120)
    assert r.returncode == 2, show(r)
    assert message in r.stderr, show(r)
    assert "Traceback" not in r.stderr + r.stdout, show(r)


# ---- (c) seeds and shards -------------------------------------------------------------


def test_shards_split_seeds_deterministically_and_disjointly():
    per = 40
    for n in (1, 2, 3, 4):
        for workers in (1, 3):
            owner: dict[int, tuple[int, int]] = {}
            for i in range(n):
                opts = CampaignOptions(seed=5, shard=(i, n), workers=workers)
                seeds = [sequence_seed(opts, w, k) for w in range(workers) for k in range(per)]
                assert seeds == [sequence_seed(replace(opts), w, k) for w in range(workers) for k in range(per)]
                for s in seeds:
                    assert s not in owner, f"seed {s} in shard {owner[s]} and shard {(i, n)} (workers={workers})"
                    owner[s] = (i, n)
            # Together the shards cover one campaign's first sequences, no more, no less.
            base = 5 * 1_000_003
            assert set(owner) == set(range(base, base + n * workers * per))
    a = {sequence_seed(CampaignOptions(seed=0), 0, k) for k in range(100)}
    b = {sequence_seed(CampaignOptions(seed=1), 0, k) for k in range(100)}
    assert not a & b


def test_shard_option_parses():
    assert build_parser().parse_args(["run", "--shard", "2/5"]).shard == (2, 5)
    assert build_parser().parse_args(["run"]).shard == (0, 1)


def test_same_seed_same_op_sequences(tmp_path):
    tier = make_tier("torch")
    opts = CampaignOptions(backend="torch", seed=3, shard=(1, 2), max_sequences=4, ops_per_sequence=60,
                           budget_s=WORK_BUDGET_S, out=str(tmp_path))

    def sequences():
        return [get_track("small").run_sequence(tier, sequence_seed(opts, 0, k), opts.ops_per_sequence).ops
                for k in range(opts.max_sequences)]

    first, second = sequences(), sequences()
    assert first == second
    assert len({json.dumps([op.to_json() for op in s]) for s in first}) == len(first)  # different seeds, different sequences
    one, two = run_campaign(opts), run_campaign(opts)
    assert one.sequences == two.sequences == opts.max_sequences
    assert one.ops == two.ops == sum(len(s) for s in first)
    assert one.contract_ops == two.contract_ops and not one.cases


# ---- (d) case files -------------------------------------------------------------------


@pytest.fixture(scope="module")
def planted_case_path(tmp_path_factory) -> Path:
    """A real case: the first sequence of seed 0 against the planted bug, minimized,
    with the kernel set named as on the command line (relative to the repository)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off (a GPU is present)")
    out = tmp_path_factory.mktemp("case")
    opts = CampaignOptions(backend="interpret", kernels=PLANTED_REL, seed=0, max_sequences=1, budget_s=WORK_BUDGET_S,
                           out=str(out))
    here = os.getcwd()
    os.chdir(REPO)
    try:
        summary = run_campaign(opts, progress=False)
    finally:
        os.chdir(here)
    assert len(summary.cases) == 1 and summary.paths[0].parent == out
    return summary.paths[0]


def test_case_file_schema(planted_case_path):
    case = json.loads(planted_case_path.read_text())
    assert case["schema"] == SCHEMA == "kvfuzz-case/1"
    # a single pool's config writes no "chain" (the form of every case written before chains)
    assert set(case["config"]) == {f.name for f in fields(kvref.PoolConfig)} - {"chain"}
    assert kvref.PoolConfig.from_json(case["config"])
    assert case["ops"] and all(Op.from_json(op).to_json() == op for op in case["ops"])
    assert case["seed"] == sequence_seed(CampaignOptions(seed=0), 0, 0)
    assert case["tier"] == "interpret" and case["kernels"] == PLANTED_REL
    assert "knobs" in case  # launch knobs: None when the kernel set exposes none
    sig = case["signature"]
    assert set(sig) == {"op", "oracle", "field"} and all(isinstance(v, str) and v for v in sig.values())
    d = case["divergence"]
    assert {"step", "op", "oracle", "field", "spec", "target", "message"} <= set(d)
    assert (d["op"]["op"], d["oracle"], d["field"]) == (sig["op"], sig["oracle"], sig["field"])
    assert d["op"] == case["ops"][d["step"]] and d["spec"] != d["target"] and d["message"]
    assert case["lengths"]["original"] >= case["lengths"]["minimized"] == len(case["ops"])
    env = case["environment"]
    for key in ("git_sha", "torch", "triton"):
        assert env.get(key), env
    assert re.fullmatch(r"[0-9a-f]{40}", env["git_sha"])
    loaded = load_case(planted_case_path)
    assert loaded.config == kvref.PoolConfig.from_json(case["config"])
    assert loaded.to_json() == case  # a round trip changes nothing


def _minimal_case(**changes) -> dict:
    case = {"schema": SCHEMA, "config": {"num_pages": 8, "min_page": 1, "page_size": 2},
            "ops": [{"op": "alloc", "n": 4}, {"op": "free", "tokens": [2, 3]}],
            "signature": {"op": "free", "oracle": "state", "field": "p2v"}}
    case.update(changes)
    return case


def test_load_case_accepts_a_minimal_case(tmp_path):
    case = load_case(_write(tmp_path / "ok.json", json.dumps(_minimal_case())))
    assert case.config == kvref.PoolConfig(num_pages=8, min_page=1, page_size=2)


MALFORMED = {
    "not JSON": "{'schema': 'kvfuzz-case/1'",
    "a list": json.dumps([_minimal_case()]),
    "no ops": json.dumps({k: v for k, v in _minimal_case().items() if k != "ops"}),
    "no signature": json.dumps({k: v for k, v in _minimal_case().items() if k != "signature"}),
    "other schema": json.dumps(_minimal_case(schema="kvfuzz-case/0")),
    "invalid config": json.dumps(_minimal_case(config={"num_pages": 1, "min_page": 1})),
    "unknown config field": json.dumps(_minimal_case(config={"num_pages": 8, "pages": 8})),
    "config not an object": json.dumps(_minimal_case(config=None)),
    "unknown op": json.dumps(_minimal_case(ops=[{"op": "explode"}])),
    "op missing a field": json.dumps(_minimal_case(ops=[{"op": "alloc"}])),
    "op with an extra field": json.dumps(_minimal_case(ops=[{"op": "alloc", "n": 2, "urgent": True}])),
    "ops not a list": json.dumps(_minimal_case(ops=5)),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_load_case_rejects_malformed_files(name, tmp_path):
    with pytest.raises(CaseError):
        load_case(_write(tmp_path / "bad.json", MALFORMED[name]))


def test_load_case_rejects_a_missing_file(tmp_path):
    with pytest.raises(CaseError):
        load_case(tmp_path / "absent.json")


def _run_exported(path: Path, **env) -> subprocess.CompletedProcess:
    """Run an exported test the way a user would: from its own directory, without the
    suite's conftest (so without TRITON_INTERPRET), the repository importable."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path.name],
                          cwd=path.parent, capture_output=True, text=True, timeout=240,
                          env=cli_env(PYTHONPATH=str(REPO), **env))


def _export(case_path: Path, tmp_path: Path) -> Path:
    """The exported test, put in another project's tests/ the way a user would paste it,
    with the kernel set at the path the case names (relative to that project's root)."""
    r = kvfuzz("replay", "--pytest", case_path)
    assert r.returncode == 0, show(r)
    project = tmp_path / "project"
    (project / Path(PLANTED_REL).parent).mkdir(parents=True)
    (project / PLANTED_REL).write_text((REPO / PLANTED_REL).read_text())
    (project / "tests" / "regressions").mkdir(parents=True)
    return _write(project / "tests" / "regressions" / "test_exported_case.py", r.stdout)


def test_replay_pytest_exports_a_standalone_test(planted_case_path, tmp_path):
    test_file = _export(planted_case_path, tmp_path)
    source = test_file.read_text()
    compile(source, str(test_file), "exec")
    assert str(REPO) not in source and "/tmp" not in source  # nothing absolute: it travels
    fixed = _run_exported(test_file, KVFUZZ_BACKEND="interpret", KVFUZZ_KERNELS="kvkernels")
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, show(fixed)
    broken = _run_exported(test_file)  # the case's own kernel set, found above the test: the planted bug
    assert broken.returncode == 1 and "1 failed" in broken.stdout and "Divergence" not in broken.stdout[:0], \
        show(broken)
    assert "no such file" not in broken.stdout, show(broken)  # it failed on the bug, not on a missing file


def test_a_case_replays_from_another_directory(planted_case_path, tmp_path):
    """The campaign ran in the repository, the case names its kernel set relative to it;
    replayed from an unrelated directory, the case finds the file through ``kernels_file``
    (relative to the case)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    case = json.loads(planted_case_path.read_text())
    assert case["kernels"] == PLANTED_REL and case["kernels_file"] and not Path(case["kernels_file"]).is_absolute()
    r = subprocess.run([sys.executable, "-m", "fuzz", "replay", str(planted_case_path)], cwd=elsewhere,
                       capture_output=True, text=True, timeout=240, env=cli_env(PYTHONPATH=str(REPO)))
    assert r.returncode == 1 and "same signature" in r.stdout, show(r)


def test_replay_of_a_case_passes_on_the_correct_kernels(planted_case_path):
    r = kvfuzz("replay", planted_case_path, "--kernels", "kvkernels")
    assert r.returncode == 0, show(r)
    assert r.stdout.startswith("PASS")


# ---- (e) the minimizer ----------------------------------------------------------------


@needs_interpreter
def test_minimizer_keeps_the_signature_and_shrinks():
    tier = make_tier("interpret", PLANTED)
    for seed in range(100):  # the first seed whose failure comes late enough to leave room to shrink
        seq = get_track("small").run_sequence(tier, seed, 200)
        config, ops, d = seq.config, seq.ops, seq.divergence
        if d is not None and d.step >= 10:
            break
    assert d is not None and d.step >= 10, "no seed in 0..99 failed after 10 ops on the planted bug"
    ops = ops[: d.step + 1]
    m = Minimizer(tier, d.signature, max_replays=500)  # work, not seconds: 47 replays (measured)
    small_config, small, small_d = m.run(config, ops)
    assert small_d.signature == d.signature
    assert len(small) < len(ops) and len(small) <= 5, small
    again, _ = replay(small_config, small, tier)
    assert again is not None and again.signature == d.signature


def test_minimizer_refuses_a_passing_sequence():
    config = kvref.PoolConfig(num_pages=8)
    with pytest.raises(NotReproducible):
        Minimizer(make_tier("torch"), Signature("free", "state", "p2v")).run(
            config, parse_ops([{"op": "alloc", "n": 2}, {"op": "free", "tokens": [1, 2]}]))


# ---- (f) each oracle, against a target that breaks it ----------------------------------


def _fake(name: str):
    return make_tier("torch", str(FAKES / f"{name}.py"))


def test_result_oracle_sees_a_read_table_column_past_the_live_prefix():
    config = kvref.PoolConfig(num_pages=8, page_size=2, multiplier=3)
    ops = [{"op": "alloc", "n": 6},
           {"op": "read_table", "rows": [[2, 3, 4, 5, 6, 7]], "req_idx": [0], "seq_lens": [3], "max_pages": 3,
            "width": 6, "legacy": False}]
    assert replay(config, ops, make_tier("torch"))[0] is None
    d, _ = replay(config, ops, _fake("past_prefix"))
    assert d is not None and d.signature == Signature("read_table", "result", "out"), d
    assert d.step == 1
    assert d.spec[2] == POISON and d.target[2] == 0  # column 2 = ceil(3 / 2): the first one past the prefix


def test_memory_oracle_sees_a_store_into_a_red_zone():
    config = kvref.PoolConfig(num_pages=8)
    ops = [{"op": "alloc", "n": 2}]
    assert replay(config, ops, make_tier("torch"))[0] is None
    d, _ = replay(config, ops, _fake("red_zone"))
    assert d is not None and d.signature == Signature("alloc", "memory", "p2v"), d
    assert (d.spec, d.target) == ("canary", "overwritten")


def test_contract_oracle_sees_a_checked_target_accepting_a_double_free(monkeypatch):
    monkeypatch.setattr(checks, "check_free", lambda config, v2p, tokens: None)
    ops = [{"op": "alloc", "n": 2}, {"op": "free", "tokens": [1]}, {"op": "free", "tokens": [1]}]
    d, _ = replay(kvref.PoolConfig(num_pages=8), ops, make_tier("torch"))
    assert d is not None and d.signature == Signature("free", "contract", "not-raised"), d
    assert d.step == 2 and "double free" in d.spec


def test_contract_oracle_sees_a_refusal_that_changed_state(monkeypatch):
    check = checks.check_free
    free = DeviceAllocator.free

    def leaky_free(self, tokens):
        try:
            check(self.config, self.v2p, tokens)
        except ContractViolation:
            self.free_virtual = self.free_virtual[1:]  # damage done before refusing
            raise
        return free(self, tokens)

    monkeypatch.setattr(DeviceAllocator, "free", leaky_free)
    ops = [{"op": "alloc", "n": 2}, {"op": "free", "tokens": [1]}, {"op": "free", "tokens": [1]}]
    d, _ = replay(kvref.PoolConfig(num_pages=8), ops, make_tier("torch"))
    assert d is not None and d.signature == Signature("free", "contract", "unchanged"), d


def test_contract_oracle_sees_a_spurious_refusal(monkeypatch):
    def refuse(config, v2p, tokens, why):
        raise ContractViolation(f"{why}: refused")

    monkeypatch.setattr(checks, "check_live_tokens", refuse)
    ops = [{"op": "alloc", "n": 2}, {"op": "read", "tokens": [1, 2]}]
    d, _ = replay(kvref.PoolConfig(num_pages=8), ops, make_tier("torch"))
    assert d is not None and d.signature == Signature("read", "contract", "spurious"), d


def test_crash_oracle_names_the_exception(monkeypatch):
    def boom(self, loc):
        raise IndexError("translate fell over")

    monkeypatch.setattr(DeviceAllocator, "translate", boom)
    d, _ = replay(kvref.PoolConfig(num_pages=8), [{"op": "translate", "loc": [1]}], make_tier("torch"))
    assert d is not None and d.signature == Signature("translate", "crash", "IndexError"), d


@pytest.mark.parametrize("fake, signature", [
    ("past_prefix", {"op": "read_table", "oracle": "result", "field": "out"}),
    ("red_zone", {"op": "alloc", "oracle": "memory", "field": "p2v"}),
])
def test_the_campaign_finds_each_fake(fake, signature, tmp_path):
    opts = CampaignOptions(backend="torch", kernels=str(FAKES / f"{fake}.py"), seed=0, max_sequences=40,
                           budget_s=WORK_BUDGET_S, out=str(tmp_path), stop_on_first=True)  # seed 0: its signature first
    summary = run_campaign(opts, progress=False)
    found = {c.signature: c for c in summary.cases}
    key = Signature(**signature)
    assert key in found, list(found)
    assert found[key].lengths["minimized"] <= 5


# ---- (g) a clean torch run prints one summary line ------------------------------------


def test_torch_run_on_the_correct_kernels_prints_one_summary(tmp_path):
    r = kvfuzz("run", "--backend", "torch", "--max-sequences", 3, "--out", tmp_path / "cases")
    assert r.returncode == 0, show(r)
    lines = [line for line in r.stdout.splitlines() if "ops/s" in line]
    assert len(lines) == 1, show(r)
    rate = re.search(r"ops/s=(\d+)", lines[0])
    assert rate and int(rate.group(1)) > 0, lines[0]
    assert "failures=0" in lines[0] and "backend=torch" in lines[0]
    assert not (tmp_path / "cases").exists()


def test_a_finding_leaves_the_run_without_the_frames_and_buffers_that_raised_it(monkeypatch):
    """Minimizers and rates keep every failing candidate's divergence: with its traceback it kept
    the frames that raised it, and their tensors (on a GPU, a far table's GiBs each)."""
    import gc
    import weakref

    from fuzz.engine.ops import Alloc, ReadTable
    from fuzz.engine.tiers import make_tier
    from fuzz.engine.tracks import get as get_track

    tier, seen = make_tier("torch"), []
    real = tier.kernels.build_kv_read_table

    def first_column_off(**kw):
        real(**kw)
        kw["out"][:, 0] += 1
        seen.append(weakref.ref(kw["out"]))

    monkeypatch.setattr(tier.kernels, "build_kv_read_table", first_column_off)
    config = kvref.PoolConfig(num_pages=64, min_page=1, page_size=1)
    toks = list(range(1, 25))  # a fresh pool's first alloc of 24 tokens, at page size 1
    ops = [Alloc(24), ReadTable([toks], [0], [24], 24, 24, False)]
    d, _ = replay(config, ops, tier)
    assert d is not None and d.op == ops[1] and d.__traceback__ is None
    gc.collect()
    assert seen and all(r() is None for r in seen), "a finding kept the buffers of the op that raised it"
    seq = get_track("small").run_sequence(tier, 3, 200)  # a campaign's sequence: the same
    assert seq.divergence is not None and seq.divergence.__traceback__ is None
