"""SGLang's own allocator under the fuzz (fuzz/clients/sglang_allocator.py, docs/sglang.md):
``MultiEndedAllocator`` executed from SGLang 0.5.23's installed file, on the torch and
interpreter tiers, with SGLang's kernels.

- a bounded campaign on each tier is clean;
- every declared spec rule is needed: its case fails with the rule withdrawn and passes
  with it (``tests/clients/sglang-allocator-cases/rule_*.json``);
- every planted bug (``sglang_mutants.py``) fails its committed case, which the shipped
  file passes (``mutant_*.json``), and a campaign finds one and writes a case that replays;
- a case names the SGLang file it ran (sha256) and SGLang's version;
- without SGLang, exit 2 with the install command.

SGLang is installed as for the kernel adapter (``tests/clients/sglang_site.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import sys
from pathlib import Path

import pytest

import kvref
from fuzz.engine.dispatch import replay
from fuzz.engine.tiers import TierSpec
from tests.clients.sglang_site import INSTALL_HINT, pythonpath, skip_if_sglang_importable
from tests.fuzz.test_engine import REPO, kvfuzz, show

CASES = REPO / "tests/clients/sglang-allocator-cases"
RULE_CASES = sorted(CASES.glob("rule_*.json"))
# kvref's own bugs that SGLang's allocator showed: each case once diverged from the shipped file
REGRESSION_CASES = sorted(CASES.glob("regression_*.json"))
MUTANT_CASES = sorted(CASES.glob("mutant_*.json"))
SUB_POOL = "sglang/srt/mem_cache/allocator/unified_sub_pool.py"


@pytest.fixture(scope="module")
def on_path(sglang_site):
    """SGLang's site on this process's path (the adapter locates it through sys.path)."""
    if sglang_site not in sys.path:
        sys.path.insert(0, sglang_site)
        importlib.invalidate_caches()
    return sglang_site


def _tier(backend: str, allocator: str = "kvfuzz-sglang"):
    return TierSpec(backend, "kvfuzz-sglang", allocator=allocator).make()


def _case(path):
    data = json.loads(path.read_text())
    return kvref.PoolConfig.from_json(data["config"]), data["ops"], "{op}/{oracle}/{field}".format(**data["signature"])


def _campaign(site, tmp_path, backend, *extra):
    summary = tmp_path / "summary.json"
    r = kvfuzz("run", "--allocator", "kvfuzz-sglang", "--backend", backend, "--seed", 0, "--workers", 1,
               "--out", tmp_path / "cases", "--summary", summary, *extra, timeout=400, PYTHONPATH=pythonpath(site))
    assert summary.is_file(), show(r)
    return r, json.loads(summary.read_text())


# ---- clean on valid input ------------------------------------------------------------------------


# Valid input only (--hostile off): SPEC's hostile ops never reach SGLang's allocator (it has no
# checked mode), but they probe its kernels on copies, where on the interpreter they meet the
# kernel adapter's baseline findings (test_sglang.py), not the allocator's.
@pytest.mark.slow  # a campaign each: about 20 s on the 2-core machine (tests/scheduling.py)
@pytest.mark.parametrize("backend,sequences", [("torch", 12), ("interpret", 2)])
def test_a_bounded_campaign_is_clean(sglang_site, tmp_path, backend, sequences):
    r, s = _campaign(sglang_site, tmp_path, backend, "--max-sequences", sequences, "--ops-per-sequence", 120,
                     "--hostile", "off")
    assert r.returncode == 0 and s["failures"] == [] and s["contract_ops"] == 0, show(r)
    assert s["allocator"] == "kvfuzz-sglang" and s["kernels"] == "kvfuzz-sglang", s
    assert {"alloc", "free", "flush", "forward", "fire", "write", "read"} <= set(s["by_kind"]), s["by_kind"]


# ---- every declared difference is needed, every planted bug is caught -------------------------------


@pytest.mark.parametrize("backend", ["torch", "interpret"])
@pytest.mark.parametrize("case", RULE_CASES, ids=[c.stem for c in RULE_CASES])
def test_each_declared_rule_is_needed(on_path, case, backend):
    config, ops, signature = _case(case)
    d, _ = replay(config, ops, _tier(backend))
    assert d is None, d
    withdrawn = json.loads(case.read_text())["allocator"].split(":")[1]
    d, _ = replay(config, ops, _tier(backend, f"tests/fixtures/allocators/sglang_without_rule.py:{withdrawn}"))
    assert d is not None and str(d.signature) == signature, d


@pytest.mark.parametrize("backend", ["torch", "interpret"])
@pytest.mark.parametrize("case", REGRESSION_CASES, ids=[c.stem for c in REGRESSION_CASES])
def test_each_spec_bug_sglang_showed_stays_fixed(on_path, case, backend):
    config, ops, _ = _case(case)
    d, _ = replay(config, ops, _tier(backend))
    assert d is None, d


@pytest.mark.parametrize("case", MUTANT_CASES, ids=[c.stem for c in MUTANT_CASES])
def test_each_planted_bug_fails_its_case_and_the_shipped_file_passes_it(on_path, case):
    config, ops, signature = _case(case)
    d, _ = replay(config, ops, _tier("torch", f"kvfuzz-sglang:{case.stem}"))
    assert d is not None and str(d.signature) == signature, d
    d, _ = replay(config, ops, _tier("torch"))
    assert d is None, d


def test_every_rule_and_mutant_has_its_case(on_path):
    from fuzz.clients.sglang_allocator import SGLangAllocator
    from fuzz.clients.sglang_mutants import MUTANTS

    assert {c.stem for c in MUTANT_CASES} == {f"mutant_{m}" for m in MUTANTS}
    assert {c.stem for c in RULE_CASES} == {f"rule_{r}" for r in SGLangAllocator.KVFUZZ_SPEC_RULES} | {
        "rule_pending_by_event"}
    assert SGLangAllocator.KVFUZZ_SPEC_RULES <= set(kvref.RULES)


# ---- it runs SGLang's file, and says which ------------------------------------------------------


def test_the_adapter_executes_sglangs_file_and_each_patch_applies_once(on_path):
    from fuzz.clients import sglang as kernels
    from fuzz.clients import sglang_allocator as adapter
    from fuzz.clients.sglang_mutants import MUTANTS, apply

    module = adapter.load(kernels, on_host=True)
    path = adapter.SGLANG_FILES["unified_sub_pool"]
    assert path.endswith(SUB_POOL) and path.startswith(on_path), path
    assert module.MultiEndedAllocator.take_physical.__code__.co_filename == path
    assert adapter.SUB_POOL_SHA256 == hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert "sglang" not in sys.modules, "the adapter imported the sglang package"
    for name in MUTANTS:
        assert apply(adapter._SOURCE, name) != adapter._SOURCE, name


def test_a_found_case_names_sglangs_file_and_version_and_replays(sglang_site, tmp_path):
    summary = tmp_path / "summary.json"
    r = kvfuzz("run", "--allocator", "kvfuzz-sglang:mutant_fast_down_off_by_one", "--backend", "torch", "--seed", 0,
               "--workers", 1, "--max-sequences", 5, "--stop-on-first", "--out", tmp_path / "cases",
               "--summary", summary, timeout=300, PYTHONPATH=pythonpath(sglang_site))
    assert r.returncode == 1, show(r)
    case = json.loads(summary.read_text())["failures"][0]["case"]
    env = json.loads(open(case).read())["environment"]
    shipped = hashlib.sha256(Path(sglang_site, SUB_POOL).read_bytes())
    assert env["sglang"] == "0.5.23" and env["sglang_unified_sub_pool_sha256"] == shipped.hexdigest(), env
    again = kvfuzz("replay", case, timeout=300, PYTHONPATH=pythonpath(sglang_site))
    assert again.returncode == 1 and "same signature" in again.stdout, show(again)
    fixed = kvfuzz("replay", case, "--allocator", "kvfuzz-sglang", timeout=300, PYTHONPATH=pythonpath(sglang_site))
    assert fixed.returncode == 0, show(fixed)


def test_without_sglang_the_allocator_is_a_setup_error_naming_the_install(tmp_path):
    skip_if_sglang_importable()
    # with our kernels, so that what is missing is the allocator itself (test_sglang.py: its kernels)
    r = kvfuzz("run", "--allocator", "kvfuzz-sglang", "--kernels", "kvkernels.torch_path", "--backend", "torch",
               "--max-sequences", 1, "--out", tmp_path)
    assert r.returncode == 2 and INSTALL_HINT in r.stderr and "Traceback" not in r.stderr, show(r)


def test_a_tier_without_the_rules_is_judged_by_spec_as_written(on_path):
    # the same SGLang, spec rules withdrawn at the tier: the rule case diverges (the rules reach the spec side)
    config, ops, signature = _case(CASES / "rule_take_nearest_end.json")
    tier = _tier("torch")
    assert tier.spec_rules and (replay(config, ops, tier)[0] is None)
    d, _ = replay(config, ops, dataclasses.replace(tier, spec_rules=frozenset()))
    assert d is not None and str(d.signature) == signature, d


def test_a_dead_workers_ops_rebuild_from_its_hello_with_the_rules(on_path, monkeypatch):
    """The parent rebuilds a dead worker's ops (and a finding's history) from the worker's
    hello alone: with SGLang's allocator the spec follows its declared rules, so the hello
    carries them, and the ops rebuilt with them are the ops the worker ran."""
    import time

    from fuzz.engine import supervise, worker
    from fuzz.engine.campaign import CampaignOptions
    from fuzz.engine.tracks.small import SmallTrack

    ran, real = [], SmallTrack.run_sequence

    def recording(self, tier, seed, n_ops, **kw):
        seq = real(self, tier, seed, n_ops, **kw)
        ran.append((seed, seq))
        return seq

    monkeypatch.setattr(SmallTrack, "run_sequence", recording)
    sent = []

    class Queue:
        def put(self, msg):
            sent.append(msg)

    opts = CampaignOptions(backend="torch", kernels="kvfuzz-sglang", allocator="kvfuzz-sglang", seed=0, workers=1,
                           max_sequences=4, ops_per_sequence=120)
    beat = supervise.Beat([0] * supervise.SLOTS)
    beat.slots[supervise.HEARD] = 1  # as the parent says once it has the hello
    worker.fuzz_main(beat, opts, 0, 0, time.time() + 3600, Queue())
    hello = next(m[2] for m in sent if m[0] == "hello")
    assert set(hello["rules"]) == set(_tier("torch").spec_rules)
    assert len(ran) == 4
    for seed, seq in ran:
        assert opts.track.regenerate(seed, len(seq.ops), hello)[2] == seq.ops
    without = {**hello, "rules": []}
    assert [opts.track.regenerate(seed, len(seq.ops), without)[2] for seed, seq in ran] != [seq.ops for _, seq in ran]


def test_an_urgent_flush_waits_for_the_forward_through_the_stand_in_stream(on_path):
    """On a CPU, SGLang's one CUDA-only call on this path (``torch.cuda.current_stream()
    .wait_event``, in ``_settle_inflight_forward``) goes to the host stream, which settles
    kvfuzz's event: the forward counts as complete, and the walk moves what it wrote."""
    import torch

    from fuzz.clients import sglang as kernels
    from fuzz.clients.sglang_allocator import SGLangAllocator

    a = SGLangAllocator(kvref.PoolConfig(num_pages=8, grow="up", lazy=True), kernels, "cpu")
    tokens = a.alloc(4)  # virtual 1..4 on physical 1..4
    a.forward(tokens[3:])  # writes page 4, the one the walk would move
    a.free(tokens[1:2])  # page 2 becomes a hole
    a.flush(False)
    assert a.snapshot()["in_flight"]["fired"] is False and a.sgl._free_phys_pages.tolist() == [2]  # stopped at 4
    a.flush(True)
    assert a.snapshot()["in_flight"]["fired"] is True and a.sgl._inflight_forward is None
    assert a.sgl.virtual_to_physical[4].item() == 2 and a.sgl.watermark_physical == 4
    assert torch.equal(a.sgl.physical_to_virtual[1:4], torch.tensor([1, 4, 3]))


# ---- SGLang's chain: its UnifiedKVPool, its allocators wired as SGLang wires them ------------------


def _float_chain(ps=2):
    from kvref.config import ChainConfig

    flt = kvref.PoolConfig(num_pages=16, min_page=1, page_size=ps, grow="float", lazy=False)
    down = kvref.PoolConfig(num_pages=24, min_page=2, page_size=1, grow="down", lazy=False)
    return kvref.PoolConfig(num_pages=24, min_page=2, page_size=ps, lazy=True,
                            chain=ChainConfig(48, (2, 3, 2), (flt, down)))


def test_a_chain_runs_sglangs_own_pool_and_allocators_wired_as_sglang_wires_them(on_path):
    from fuzz.clients import sglang as kernels
    from fuzz.clients import sglang_pool
    from fuzz.clients.sglang_allocator import SGLangAllocator

    a = SGLangAllocator(_float_chain(), kernels, "cpu")
    up, flt, down = (m.sgl for m in a.chain.members)
    pool = up.unified_buffer
    assert type(pool).__init__.__code__.co_filename.endswith(sglang_pool.POOL_FILE)
    assert type(flt).__name__ == "FloatMultiEndedAllocator" and flt.unified_buffer is pool is down.unified_buffer
    # a member of one-slot pages beside pages of two is SGLang's state pool, its floor derived by SGLang
    assert type(pool.spec("pool2")).__name__ == "MambaSubPoolSpec" and down.min_page_index == 2
    assert (up.high_peer, flt.low_peer, flt.high_peer, down.low_peer) == (flt, up, down, flt)
    assert up.disagg_move_gate is not None and flt.disagg_move_gate is not None
    assert down.disagg_move_gate is None  # eager: SGLang asserts its compaction runs ungated
    a.chain.set_gate(1, False)
    assert flt.moves_blocked() and not up.moves_blocked()
    assert "sglang" not in sys.modules


@pytest.mark.parametrize("backend,n", [("torch", 10), ("interpret", 2)])
def test_chain_seeds_run_clean_on_sglangs_chain(on_path, backend, n):
    """Chain seeds of both layouts on SGLang's chain: no divergence from kvref (under the
    declared rules) and none from SGLang's own chain accounting, every chain op run."""
    from fuzz.engine.chain_gen import is_chain_seed
    from fuzz.engine.chain_ops import CHAIN_KINDS
    from fuzz.engine.tracks.small import SmallTrack

    track, tier = SmallTrack(), _tier(backend)
    kinds, layouts = set(), set()
    for seed in [s for s in range(400) if is_chain_seed(s)][:n]:
        seq = track.run_sequence(tier, seed, 200 if backend == "torch" else 60, hostile="off")
        assert seq.divergence is None, (seed, seq.divergence)
        kinds |= set(seq.run.stats.by_kind)
        layouts.add(len(seq.config.members))
    assert layouts == {2, 3}, layouts
    if backend == "torch":
        assert set(CHAIN_KINDS) <= kinds, set(CHAIN_KINDS) - kinds
