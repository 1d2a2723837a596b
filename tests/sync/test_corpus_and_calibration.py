"""The calibration corpus, the calibration report, and the GPU detector's CPU-side contract."""

from __future__ import annotations

import ast
import json
import os

import pytest
import torch

from fuzz.sync import calibrate, corpus, gpu, static

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "benchmarks", "results")


# ------------------------------------------------------------------ the corpus


def test_corpus_is_big_enough_and_labelled():
    assert len(corpus.SNIPPETS) >= 30
    assert {s.label for s in corpus.ALL_SNIPPETS} == {corpus.SYNCS, corpus.NO_SYNC}
    n_sync = sum(s.label == corpus.SYNCS for s in corpus.SNIPPETS)
    assert 10 <= n_sync <= len(corpus.SNIPPETS) - 10  # both sides are exercised


def test_every_spec_form_and_every_look_alike_is_covered():
    forms = {s.spec_form for s in corpus.SNIPPETS}
    assert set(corpus.SPEC_SYNC_FORMS) <= forms
    assert set(corpus.SPEC_NO_SYNC_FORMS) <= forms
    assert forms <= set(corpus.SPEC_SYNC_FORMS) | set(corpus.SPEC_NO_SYNC_FORMS) | {corpus.OTHER}
    tags = {t for s in corpus.SNIPPETS for t in s.tags}
    assert {"alias", "variable right-hand side", "look-alike"} <= tags
    sources = "\n".join(s.source for s in corpus.SNIPPETS)
    for needle in ("index_fill_", ".fill_(", "_tombstone_kernel[", ".numel()", "v2p[2:5] = -1", "= -1\n"):
        assert needle in sources, needle
    # both sides of each contrast are present
    for pair in (("store_minus_one", "index_fill"), ("store_int_index", "slice_store_one_row"),
                 ("bool_mask_store_device_value", "bool_mask_store_scalar"), ("nonzero", "nonzero_static"),
                 ("store_scalar_variable", "scatter_device_values"), ("store_alias_local", "index_fill_alias")):
        a, b = (corpus.BY_NAME[n] for n in pair)
        assert (a.label, b.label) == (corpus.SYNCS, corpus.NO_SYNC), pair


def test_minus_one_snippet_really_is_a_unary_minus():
    tree = ast.parse(corpus.BY_NAME["store_minus_one"].source)
    (assign,) = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    assert isinstance(assign.value, ast.UnaryOp) and isinstance(assign.value.op, ast.USub)


@pytest.mark.parametrize("snippet", corpus.ALL_SNIPPETS, ids=[s.name for s in corpus.ALL_SNIPPETS])
def test_every_snippet_runs_on_the_cpu_with_fresh_tables(snippet):
    if snippet.needs_kernels and not corpus.CPU_KERNELS:
        pytest.skip("a Triton launch on CPU tensors needs the interpreter (off where CUDA exists)")
    args = corpus.make_args("cpu")
    snippet.run("cpu", args)
    fresh = corpus.make_args("cpu")
    assert fresh["v2p"][3].item() == 6 and fresh["p2v"][6].item() == 3  # make_args is not shared state


@pytest.mark.parametrize("snippet", corpus.SNIPPETS, ids=[s.name for s in corpus.SNIPPETS])
def test_static_verdict_matches_the_label_on_the_corpus(snippet):
    plan = static.check_source(snippet.source, snippet.filename, roots=("snippet",))
    assert bool(plan.findings) is (snippet.label == corpus.SYNCS), [f.format() for f in plan.findings]


def test_adversarial_snippets_show_the_documented_static_limits():
    wrong = []
    for s in corpus.ADVERSARIAL:
        plan = static.check_source(s.source, s.filename, roots=("snippet",))
        if bool(plan.findings) is not (s.label == corpus.SYNCS):
            wrong.append(s.name)
    # Each was written to defeat one detector. The static check has since learned host tensors (a host
    # tensor's .item() reads host memory), so host_scalar_item now defeats only the CPU runtime modes.
    # The rest still defeat it; if one stops doing so, update the limits in fuzz/sync/static/__init__.py
    # and docs/check-sync.md.
    assert sorted(wrong) == sorted(s.name for s in corpus.ADVERSARIAL if s.name != "host_scalar_item")


# ------------------------------------------------------------------ the calibration report


def test_cpu_calibration_writes_the_table_and_json(tmp_path, capsys):
    assert calibrate.main(["--out", str(tmp_path)]) == 0
    md = (tmp_path / "sync-calibration.md").read_text()
    data = json.loads((tmp_path / "sync-calibration.json").read_text())
    assert "GPU truth pending" in md and data["truth_source"].startswith("labels")
    assert "| static AST check" in md and "| runtime modes on CPU tensors" in md
    assert len(data["snippets"]) == len(corpus.ALL_SNIPPETS)
    for det in ("static", "runtime_cpu"):
        sc = data["scores"][det]
        assert sc["caught"] + sc["missed"] + sc["false_alarms"] + sc["quiet"] + sc["unjudged"] == len(
            corpus.ALL_SNIPPETS)
        cpu_unrunnable = 0 if corpus.CPU_KERNELS else sum(s.needs_kernels for s in corpus.ALL_SNIPPETS)
        assert sc["unjudged"] == (0 if det == "static" else cpu_unrunnable)
    assert "to_cpu_string" in data["scores"]["runtime_cpu"]["missed_names"]
    assert "table_in_container" in data["scores"]["static"]["missed_names"]


def _fake_gpu_truth(overrule: str) -> dict:
    results = {}
    for s in corpus.ALL_SNIPPETS:
        syncs = s.label == corpus.SYNCS
        if s.name == overrule:
            syncs = not syncs
        results[f"snippet:{s.name}"] = {"syncs": syncs, "eager": "called a synchronizing CUDA operation" if syncs
                                        else None, "capture": None, "error": None, "runtime_cuda": []}
    results["snippet:cpu"] = {"syncs": None, "error": "warm-up failed: boom"}
    results["allocator:triton:free_lazy_ps1"] = {"syncs": False, "eager": None, "capture": None, "error": None,
                                                 "runtime_cuda": []}
    return {"schema": 1, "environment": {"gpu": "FakeGPU", "torch": "x", "triton": "y", "git_sha": "abc"},
            "results": results}


def test_gpu_truth_overrules_labels_and_is_scored(tmp_path):
    truth = tmp_path / "gpu.json"
    truth.write_text(json.dumps(_fake_gpu_truth("slice_store_scalar")))
    assert calibrate.main(["--truth", str(truth), "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "sync-calibration.json").read_text())
    md = (tmp_path / "out" / "sync-calibration.md").read_text()
    assert data["truth_source"] == "gpu" and "**Truth: the GPU** (FakeGPU" in md
    assert f"--truth {truth}` (GPU columns from an earlier `--gpu` run)" in md  # where the GPU columns came from
    assert data["label_overruled_by_gpu"] == ["slice_store_scalar"]
    assert "slice_store_scalar" in data["scores"]["static"]["missed_names"]
    assert "slice_store_scalar" in data["scores"]["label"]["missed_names"]
    assert data["scores"]["static"]["unjudged_names"] == ["cpu"]
    assert data["scores"]["gpu_capture"]["caught"] == 0  # the fake truth came from the debug mode only
    assert "triton:free_lazy_ps1" in md and "must not sync" in md


def test_gpu_and_truth_flags_are_exclusive_and_gpu_needs_cuda(tmp_path, capsys, monkeypatch):
    assert calibrate.main(["--gpu", "--truth", "x.json", "--out", str(tmp_path)]) == 2
    monkeypatch.setattr(gpu, "cuda_available", lambda: False)
    assert calibrate.main(["--gpu", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_committed_calibration_table_covers_the_corpus():
    md_path = os.path.join(RESULTS, "sync-calibration.md")
    json_path = os.path.join(RESULTS, "sync-calibration.json")
    assert os.path.exists(md_path) and os.path.exists(json_path)
    data = json.load(open(json_path))
    assert [r["name"] for r in data["snippets"]] == [s.name for s in corpus.ALL_SNIPPETS], (
        "the corpus changed: rerun python -m fuzz.sync.calibrate (with --truth for a stored GPU run)")
    text = open(md_path).read()
    assert "| detector | caught | missed | false alarms |" in text
    assert ("GPU truth pending" in text) == (data["truth_source"] != "gpu")


# ------------------------------------------------------------------ the GPU detector, CPU side


def test_gpu_module_imports_and_refuses_cleanly_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.cuda_available() is False
    with pytest.raises(gpu.CudaUnavailable):
        gpu.probe(lambda a: None, dict)
    with pytest.raises(gpu.CudaUnavailable):
        gpu.probe_allocator("torch")
    with pytest.raises(gpu.CudaUnavailable):
        gpu.run_truth(["selftest:ok"])


def test_gpu_worker_protocol_survives_crashes_and_broken_contexts():
    """Worker processes, JSON lines, restarts: exercised with tasks that need no GPU."""
    tasks = ["selftest:ok", "selftest:crash", "selftest:after_crash", "selftest:broken", "selftest:last"]
    lines = []
    out = gpu.run_truth(tasks, require_cuda=False, timeout_s=120, log=lines.append)
    res = out["results"]
    assert set(res) == set(tasks)
    assert res["selftest:ok"]["syncs"] is False and res["selftest:after_crash"]["syncs"] is False
    assert res["selftest:last"]["syncs"] is False
    assert res["selftest:crash"]["syncs"] is None and "worker exited 9" in res["selftest:crash"]["error"]
    assert res["selftest:broken"]["syncs"] is None and "context broken" in res["selftest:broken"]["error"]
    assert len(lines) == 3  # one worker per failure, plus the first
    assert out["environment"]["torch"] == torch.__version__


def test_gpu_task_list_covers_controls_corpus_and_allocator():
    names = gpu._task_names()
    assert names[: len(gpu.CONTROLS)] == list(gpu.CONTROLS)
    assert {f"snippet:{s.name}" for s in corpus.ALL_SNIPPETS} <= set(names)
    for tier in ("torch", "triton"):
        for probe, _ in gpu.ALLOCATOR_PROBES:
            assert f"allocator:{tier}:{probe}" in names


# ------------------------------------------------------------------ on a GPU (twins of the CPU tests above)


@pytest.mark.cuda
def test_gpu_controls_have_known_answers():
    for task, expected in gpu.CONTROLS.items():
        assert gpu._run_task(task)["syncs"] is expected, task


@pytest.mark.cuda
@pytest.mark.parametrize("tier", ["torch", "triton"])
def test_gpu_lazy_free_and_read_tables_do_not_sync(tier):
    verdicts = gpu.probe_allocator(tier)
    for name, must_not in gpu.ALLOCATOR_PROBES:
        if must_not and name in verdicts:
            v = verdicts[name]
            assert v.error is None, (name, v.error)
            assert v.syncs is False, (name, v.eager, v.capture)


@pytest.mark.cuda
@pytest.mark.parametrize("name,expected", [("store_minus_one", True), ("index_fill", False),
                                           ("item", True), ("kernel_launch", False)])
def test_gpu_spot_checks_on_the_corpus(name, expected):
    assert gpu.probe_snippet(corpus.BY_NAME[name]).syncs is expected
