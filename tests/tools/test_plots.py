"""Bench plots (fuzz/tools/plots.py): drawn from committed bench reports when matplotlib
(the optional ``plots`` extra) is installed; without it, a setup error that names the
extra, raised before ``kvfuzz bench`` spends any time benchmarking."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fuzz.tools import bench, plots

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"
GPU_REPORTS = sorted((RESULTS / "sweep-target-blocks-h200").glob("bench-*.json"))
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def test_gpu_reports_have_their_plots_committed():
    assert GPU_REPORTS
    for report in GPU_REPORTS:
        assert svg_texts(report.with_suffix(".svg")), f"{report.with_suffix('.svg')}: no text (re-plot it)"


def test_without_matplotlib_the_error_names_the_extra(no_matplotlib, tmp_path):
    with pytest.raises(plots.PlotsUnavailable, match=r"kvfuzz\[plots\]"):
        plots.plot_bench({"fuzz": []}, tmp_path / "x.svg")


def test_bench_checks_for_matplotlib_before_benchmarking(no_matplotlib, monkeypatch, tmp_path):
    def must_not_run(*_):
        raise AssertionError("benchmarked although the plot could never be drawn")

    monkeypatch.setattr(bench, "_tier_rate", must_not_run)
    with pytest.raises(plots.PlotsUnavailable):
        bench.main(seconds=1, tiers="torch", plot=str(tmp_path / "bench.svg"))


def test_replot_command_without_matplotlib_exits_2(no_matplotlib, tmp_path, capsys):
    assert plots.main([str(GPU_REPORTS[0]), "--out", str(tmp_path / "x.svg")]) == 2
    assert "kvfuzz[plots]" in capsys.readouterr().err


def test_replot_command_refuses_a_file_that_is_not_json(tmp_path, capsys):
    bad = tmp_path / "bench.json"
    bad.write_text("not json")
    assert plots.main([str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


@pytest.mark.parametrize("report", GPU_REPORTS, ids=[p.stem for p in GPU_REPORTS])
def test_gpu_report_plots_every_section(report, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.svg"
    assert plots.main([str(report), "--out", str(out)]) == 0
    texts = svg_texts(out)
    data = json.loads(report.read_text())
    for bs in sorted({r["bs"] for r in data["kernels"]["read_table"]}):
        assert f"read table, CUDA graph, bs {bs}" in texts
    assert {"strided grid", "legacy grid", "fuzzing throughput per tier", "lazy free"} <= set(texts)
    assert {r["backend"] for r in data["fuzz"]} <= set(texts)
    again = tmp_path / "again.svg"
    plots.plot_bench(data, again)
    assert again.read_bytes() == out.read_bytes()  # no date, fixed ids: re-plotting is reproducible


def test_bench_main_draws_the_plot(monkeypatch, tmp_path):
    """A CPU report: fuzz throughput only, a failed tier labelled as such."""
    pytest.importorskip("matplotlib")
    rows = {"torch": {"backend": "torch", "ops": 100, "ops_per_s": 50.0, "sequences": 1, "failures": 0, "seconds": 2},
            "interpret": {"backend": "interpret", "error": "boom", "exit": 2}}
    monkeypatch.setattr(bench, "_tier_rate", lambda backend, seconds: rows[backend])
    out, svg = tmp_path / "bench.json", tmp_path / "bench.svg"
    assert bench.main(seconds=2, tiers="torch,interpret", out=str(out), plot=str(svg)) == 0
    texts = svg_texts(svg)
    assert "fuzzing throughput per tier" in texts and "failed (exit 2)" in texts and "50" in texts
    assert not any(t.startswith("read table") for t in texts)
