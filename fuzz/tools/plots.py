"""Figures of a ``kvfuzz bench`` report (the JSON of ``kvfuzz bench --out``), as SVG.

- the read table replayed from a CUDA graph: time against live length, strided grid vs
  legacy grid, one panel per batch size (``kernels.read_table``; GPU reports only);
- the lazy free, one fused launch vs gather + two ``index_fill_`` (``kernels.free``);
- diffed ops per second per tier (``fuzz``).

matplotlib is an optional extra (``pip install 'kvfuzz[plots]'``). The figure is drawn
on the Agg canvas, never through pyplot, so no display is needed; the SVG carries no
date and fixed ids, so re-plotting an unchanged report gives an identical file.

Re-plot a committed report: ``python -m fuzz.tools.plots REPORT.json [--out FILE.svg]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..engine.tiers import SetupError

GRIDS = (("strided", "tab:blue", "o"), ("legacy", "tab:orange", "s"))


class PlotsUnavailable(SetupError):
    """matplotlib is not installed (the CLI's exit code 2, like any setup error)."""


def require_matplotlib():
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable("plots need matplotlib, which is the optional 'plots' extra of kvfuzz: "
                               "pip install 'kvfuzz[plots]' (or: pip install 'matplotlib>=3.7')") from exc
    return matplotlib


def plot_bench(report: dict, path) -> Path:
    """Draw ``report`` into the SVG file ``path``; returns the path."""
    matplotlib = require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    kernels = report.get("kernels") or {}
    read_rows = kernels.get("read_table") or []
    batch_sizes = sorted({r["bs"] for r in read_rows})
    bottom = ["fuzz", "free"] if kernels.get("free") else ["fuzz"]
    width = max(len(batch_sizes), len(bottom), 1)
    mosaic = ([[f"bs{bs}" for bs in batch_sizes] + ["."] * (width - len(batch_sizes))] if batch_sizes else [])
    mosaic.append([bottom[i * len(bottom) // width] for i in range(width)])

    with matplotlib.rc_context({"svg.hashsalt": "kvfuzz", "svg.fonttype": "none"}):
        fig = Figure(figsize=(max(3.2 * width, 6.0) + 0.8, 3.6 * len(mosaic)), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplot_mosaic(mosaic)
        if read_rows:  # one time scale for every batch size, so the panels compare at a glance
            ylim = (min(r["us"] for r in read_rows) / 1.25, max(r["us"] for r in read_rows) * 1.25)
        for bs in batch_sizes:
            _read_table(axes[f"bs{bs}"], [r for r in read_rows if r["bs"] == bs], bs, ylim)
        _fuzz(axes["fuzz"], report.get("fuzz") or [])
        if "free" in axes:
            _free(axes["free"], kernels["free"])
        fig.suptitle(_title(report))
        path = Path(path)
        fig.savefig(path, format="svg", metadata={"Date": None})
    return path


def _title(report: dict) -> str:
    env = report.get("environment") or {}
    where = env.get("gpu") or f"{env.get('cpu_count', '?')}-core CPU"
    return f"kvfuzz bench: {where}, torch {env.get('torch', '?')}, Triton {env.get('triton', '?')}"


def _read_table(ax, rows: list[dict], bs: int, ylim: tuple[float, float]) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for grid, color, marker in GRIDS:
        pts = sorted((r["live_tokens"], r["us"]) for r in rows if r["grid"] == grid)
        if pts:
            ax.plot(*zip(*pts), marker=marker, color=color, label=f"{grid} grid")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    lives = sorted({r["live_tokens"] for r in rows})
    ax.set_xticks(lives, [f"{n // 1024}k" if n >= 1024 else str(n) for n in lives])
    ax.set_title(f"read table, CUDA graph, bs {bs}")
    ax.set_xlabel("live length (tokens)")
    ax.set_ylabel("µs per replay")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def _fuzz(ax, rows: list[dict]) -> None:
    names = [r["backend"] for r in rows]
    rates = [r.get("ops_per_s", 0.0) for r in rows]
    bars = ax.bar(names, rates, color="tab:green")
    labels = [f"{r['ops_per_s']:,.0f}" if "ops_per_s" in r else f"failed (exit {r.get('exit')})" for r in rows]
    ax.bar_label(bars, labels, padding=2)
    ax.set_title("fuzzing throughput per tier")
    ax.set_ylabel("diffed ops / s")
    ax.margins(y=0.15)
    ax.grid(True, axis="y", alpha=0.3)


def _free(ax, rows: list[dict]) -> None:
    pages = [r["pages"] for r in rows]
    x = range(len(rows))
    fused = ax.bar([i - 0.2 for i in x], [r["fused_us"] for r in rows], 0.4, label="fused free_unbind", color="tab:blue")
    unfused = ax.bar([i + 0.2 for i in x], [r["unfused_us"] for r in rows], 0.4, label="gather + 2 index_fill_",
                     color="tab:orange")
    ax.bar_label(fused, [f"{r['fused_us']:.0f}" for r in rows], padding=2, fontsize="small")
    ax.bar_label(unfused, [f"{r['unfused_us']:.0f}" for r in rows], padding=2, fontsize="small")
    ax.set_xticks(list(x), [str(p) for p in pages])
    ax.set_title("lazy free")
    ax.set_xlabel("pages freed")
    ax.set_ylabel("µs per free")
    ax.margins(y=0.15)
    ax.legend(fontsize="small")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz.tools.plots", description="plot a kvfuzz bench report as SVG")
    p.add_argument("report", help="the JSON of kvfuzz bench --out")
    p.add_argument("--out", help="SVG file to write (default: the report's path with .svg)")
    args = p.parse_args(argv)
    try:
        report = json.loads(Path(args.report).read_text())
        out = plot_bench(report, args.out or Path(args.report).with_suffix(".svg"))
    except (OSError, json.JSONDecodeError, SetupError) as exc:
        print(f"plots: {args.report}: {exc}", file=sys.stderr)
        return 2
    print(f"plot written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
