"""Measure the host-sync detectors on the labelled corpus (SPEC.md §5, DESIGN.md oracle 5).

    python -m fuzz.sync.calibrate [--out DIR]                  # CPU detectors; truth = labels
    python -m fuzz.sync.calibrate --gpu [--out DIR]            # also run the GPU ground truth
    python -m fuzz.sync.calibrate --truth FILE [--out DIR]     # score against a stored GPU run

Writes ``DIR/sync-calibration.md`` (the table: detector × caught / missed / false alarms)
and ``DIR/sync-calibration.json`` (every verdict, every finding). ``--gpu`` also writes
``DIR/sync-calibration-gpu.json``, the raw GPU verdicts, which a later CPU-only run can
take back with ``--truth``. Exit 0 when the table was written, 2 on a usage or setup
error (``--gpu`` without CUDA).

Why the truth is the GPU and not the labels: a label is a belief about what ATen does
(``t[mask] = -1`` turns into ``masked_fill_``, ``t[idx[0]]`` calls ``.item()``); the GPU
settles it. Without a GPU run the table scores against the labels and says so.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from collections.abc import Iterable

DETECTORS_CPU = ("static", "runtime_cpu")
DETECTOR_TITLES = {
    "static": "static AST check (`kvfuzz check-sync`)",
    "runtime_cpu": "runtime modes on CPU tensors (`no_host_sync`)",
    "runtime_cuda": "runtime modes on CUDA tensors",
    "gpu_debug_mode": "GPU: `set_sync_debug_mode(\"error\")` alone",
    "gpu_capture": "GPU: CUDA-graph capture alone",
    "label": "the corpus label (author's belief)",
}


def _prepare_cpu_interpreter() -> None:
    # The kernel-launch snippets run interpreted on the CPU: Triton reads this when it decorates.
    if "fuzz.sync.corpus" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def run_cpu_detectors(snippets: Iterable | None = None) -> dict[str, dict]:
    """Static and CPU-runtime verdicts per snippet name."""
    _prepare_cpu_interpreter()
    from . import corpus, static
    from .runtime import record_host_syncs

    out: dict[str, dict] = {}
    for s in snippets if snippets is not None else corpus.ALL_SNIPPETS:
        plan = static.check_source(s.source, s.filename, roots=("snippet",))
        static_v = {"verdict": bool(plan.findings), "findings": [f"{f.line}:{f.col}: {f.code}" for f in plan.findings]}
        args = corpus.make_args("cpu")
        error = None
        with record_host_syncs(device="cpu") as events:
            try:
                s.run("cpu", args)
            except Exception as e:  # the snippet itself failed: no verdict
                error = f"{type(e).__name__}: {e}"
        runtime_v = {"verdict": None if error else bool(events), "events": [e.op for e in events], "error": error}
        out[s.name] = {"static": static_v, "runtime_cpu": runtime_v}
    return out


def _score(rows: list[dict], detector: str) -> dict:
    caught, missed, false_alarms, quiet, errors = [], [], [], [], []
    for r in rows:
        truth = r["truth"]
        got = r["verdicts"].get(detector)
        if truth is None or got is None:
            errors.append(r["name"])
        elif truth and got:
            caught.append(r["name"])
        elif truth and not got:
            missed.append(r["name"])
        elif got:
            false_alarms.append(r["name"])
        else:
            quiet.append(r["name"])
    return {"caught": len(caught), "missed": len(missed), "false_alarms": len(false_alarms), "quiet": len(quiet),
            "unjudged": len(errors), "missed_names": missed, "false_alarm_names": false_alarms,
            "unjudged_names": errors}


def build_report(cpu: dict[str, dict], gpu: dict | None) -> dict:
    from . import corpus

    gpu_results = (gpu or {}).get("results", {})
    rows = []
    for s in corpus.ALL_SNIPPETS:
        g = gpu_results.get(f"snippet:{s.name}")
        label = s.label == corpus.SYNCS
        verdicts = {
            "static": cpu[s.name]["static"]["verdict"],
            "runtime_cpu": cpu[s.name]["runtime_cpu"]["verdict"],
            "label": label,
        }
        if g is not None:
            judged = g.get("syncs") is not None
            verdicts["gpu_debug_mode"] = (g.get("eager") is not None) if judged else None
            verdicts["gpu_capture"] = (g.get("capture") is not None) if judged else None
            rc = g.get("runtime_cuda")
            verdicts["runtime_cuda"] = bool(rc) if (judged and rc is not None) else None
        truth = g.get("syncs") if g is not None else (label if gpu is None else None)
        rows.append({"name": s.name, "label": s.label, "spec_form": s.spec_form, "tags": list(s.tags),
                     "note": s.note, "truth": truth, "verdicts": verdicts, "static": cpu[s.name]["static"],
                     "runtime_cpu": cpu[s.name]["runtime_cpu"], "gpu": g})
    detectors = list(DETECTORS_CPU)
    if gpu is not None:
        detectors += ["runtime_cuda", "gpu_debug_mode", "gpu_capture", "label"]
    scores = {d: _score(rows, d) for d in detectors}
    allocator = {k.split(":", 1)[1]: v for k, v in gpu_results.items() if k.startswith("allocator:")}
    return {
        "schema": 1,
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "truth_source": "gpu" if gpu is not None else "labels (GPU truth pending)",
        "gpu_environment": (gpu or {}).get("environment"),
        "cpu_environment": _cpu_environment(),
        "n_snippets": len(rows),
        "n_adversarial": sum("adversarial" in r["tags"] for r in rows),
        "scores": scores,
        "label_overruled_by_gpu": [r["name"] for r in rows if gpu is not None and r["truth"] is not None
                                   and r["truth"] != (r["label"] == corpus.SYNCS)],
        "snippets": rows,
        "allocator": allocator,
    }


def _cpu_environment() -> dict:
    import platform

    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env


def _mark(v) -> str:
    return "—" if v is None else ("sync" if v else "·")


def render_markdown(report: dict) -> str:
    from . import corpus

    lines: list[str] = []
    gpu = report["truth_source"] == "gpu"
    lines.append("# Host-sync detector calibration (SPEC.md §5)")
    lines.append("")
    how = report.get("command") or ("python -m fuzz.sync.calibrate" + (" --gpu" if gpu else ""))
    how = f"`{how}`" + (" (GPU columns from an earlier `--gpu` run)" if "--truth" in how else "")
    lines.append(f"Generated {report['generated']} by {how}. Corpus: {report['n_snippets']} snippets "
                 f"({report['n_adversarial']} adversarial), `fuzz/sync/corpus.py`.")
    lines.append("")
    if gpu:
        env = report["gpu_environment"] or {}
        lines.append(f"**Truth: the GPU** ({env.get('gpu', '?')}, torch {env.get('torch', '?')}, "
                     f"Triton {env.get('triton', '?')}, git {str(env.get('git_sha') or '?')[:12]}): a snippet syncs when "
                     "it fails under `torch.cuda.set_sync_debug_mode(\"error\")` or fails CUDA-graph capture.")
    else:
        lines.append("**Truth: GPU truth pending.** No GPU run is recorded yet, so the detectors are scored against "
                     "the corpus labels (the author's belief). Run `python -m fuzz.sync.calibrate --gpu --out DIR` "
                     "on a CUDA machine to replace the labels with the GPU's verdicts.")
    lines.append("")
    lines.append("| detector | caught | missed | false alarms | correct silences | unjudged |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for det, sc in report["scores"].items():
        lines.append(f"| {DETECTOR_TITLES[det]} | {sc['caught']} | {sc['missed']} | {sc['false_alarms']} | "
                     f"{sc['quiet']} | {sc['unjudged']} |")
    lines.append("")
    for det, sc in report["scores"].items():
        if sc["missed_names"] or sc["false_alarm_names"] or sc["unjudged_names"]:
            parts = []
            if sc["missed_names"]:
                parts.append("missed " + ", ".join(f"`{n}`" for n in sc["missed_names"]))
            if sc["false_alarm_names"]:
                parts.append("false alarms " + ", ".join(f"`{n}`" for n in sc["false_alarm_names"]))
            if sc["unjudged_names"]:
                parts.append("unjudged " + ", ".join(f"`{n}`" for n in sc["unjudged_names"]))
            lines.append(f"- {DETECTOR_TITLES[det]}: " + "; ".join(parts) + ".")
    if gpu:
        over = report["label_overruled_by_gpu"]
        lines.append(f"- Labels overruled by the GPU: {', '.join(f'`{n}`' for n in over) if over else 'none'}.")
    lines.append("")
    lines.append("The adversarial snippets are written against the detectors' documented limits "
                 "(see the docstrings of `fuzz/sync/static/` and `fuzz/sync/runtime.py`); the rest were written "
                 "alongside the detectors, so their scores measure coverage of the listed forms, not held-out accuracy.")
    lines.append("")
    if report["allocator"]:
        lines.append("## DeviceAllocator on the GPU")
        lines.append("")
        lines.append("| tier:probe | SPEC §5 | GPU verdict | debug mode | capture | runtime modes on CUDA |")
        lines.append("|---|---|---|---|---|---|")
        must = {"free_eager": "may sync"}
        for key, v in sorted(report["allocator"].items()):
            name = key.split(":", 1)[1]
            verdict = "error: " + str(v.get("error")) if v.get("syncs") is None else ("SYNCS" if v["syncs"] else "no sync")
            lines.append(f"| {key} | {must.get(name, 'must not sync')} | {verdict} | "
                         f"{_cell(v.get('eager'))} | {_cell(v.get('capture'))} | "
                         f"{', '.join(v.get('runtime_cuda') or []) or '·'} |")
        lines.append("")
    lines.append("## Per snippet")
    lines.append("")
    cols = [c for c in ("static", "runtime_cpu", "runtime_cuda", "gpu_debug_mode", "gpu_capture")
            if c in report["scores"]]
    lines.append("| snippet | SPEC §5 form | label | truth | " + " | ".join(cols) + " |")
    lines.append("|---|---|---|---|" + "---|" * len(cols))
    for r in report["snippets"]:
        name = f"`{r['name']}`" + (" (adversarial)" if "adversarial" in r["tags"] else "")
        cells = []
        for c in cols:
            v = r["verdicts"].get(c)
            cell = _mark(v)
            if v is not None and r["truth"] is not None and v != r["truth"]:
                cell = f"**{cell}** ✗"
            cells.append(cell)
        label = "sync" if r["label"] == corpus.SYNCS else "·"
        lines.append(f"| {name} | {r['spec_form']} | {label} | {_mark(r['truth'])} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("`sync`: the detector (or truth) says the host waits; `·`: it says no sync; `—`: not judged "
                 "(the snippet failed to run there); **✗**: disagrees with the truth.")
    lines.append("")
    return "\n".join(lines)


def _cell(text) -> str:
    if not text:
        return "·"
    text = str(text).replace("|", "\\|")
    return text if len(text) <= 80 else text[:79] + "…"


def write(report: dict, out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, "sync-calibration.md")
    json_path = os.path.join(out_dir, "sync-calibration.json")
    with open(md_path, "w") as fh:
        fh.write(render_markdown(report))
    with open(json_path, "w") as fh:
        json.dump(report, fh, indent=1, sort_keys=False)
        fh.write("\n")
    return md_path, json_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.sync.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results", help="directory for the table and JSON")
    parser.add_argument("--gpu", action="store_true", help="run the GPU ground truth (needs CUDA)")
    parser.add_argument("--truth", help="a stored sync-calibration-gpu.json to score against")
    parser.add_argument("--timeout-s", type=float, default=480.0, help="budget for the GPU run")
    ns = parser.parse_args(argv)
    if ns.gpu and ns.truth:
        print("calibrate: --gpu and --truth are exclusive", file=sys.stderr)
        return 2
    _prepare_cpu_interpreter()
    gpu = None
    if ns.truth:
        try:
            with open(ns.truth) as fh:
                gpu = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            print(f"calibrate: cannot read {ns.truth}: {e}", file=sys.stderr)
            return 2
    elif ns.gpu:
        from . import gpu as gpu_mod

        if not gpu_mod.cuda_available():
            print("calibrate: --gpu needs a CUDA device; none is visible", file=sys.stderr)
            return 2
        gpu = gpu_mod.run_truth(timeout_s=ns.timeout_s, log=lambda m: print(m, file=sys.stderr))
        os.makedirs(ns.out, exist_ok=True)
        raw = os.path.join(ns.out, "sync-calibration-gpu.json")
        with open(raw, "w") as fh:
            json.dump(gpu, fh, indent=1)
            fh.write("\n")
        print(f"calibrate: GPU verdicts in {raw}", file=sys.stderr)
    cpu = run_cpu_detectors()
    report = build_report(cpu, gpu)
    report["command"] = "python -m fuzz.sync.calibrate" + (f" --truth {ns.truth}" if ns.truth else " --gpu" if ns.gpu else "")
    md, js = write(report, ns.out)
    for det, sc in report["scores"].items():
        print(f"{det:15s} caught {sc['caught']:3d}  missed {sc['missed']:3d}  false alarms {sc['false_alarms']:3d}  "
              f"quiet {sc['quiet']:3d}  unjudged {sc['unjudged']:3d}")
    print(f"calibrate: truth = {report['truth_source']}; wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
