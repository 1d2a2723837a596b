"""A night on a whole GPU host: one ``kvfuzz run`` per GPU, one merged result, one corpus.

``python -m fuzz.tools.host --out DIR [--layout shards|workers] [--workers-per-gpu W]
[--gpus N] [--shard I/M] [--max-sequences S | --max-ops O] [--corpus C] [--baseline B]
[kvfuzz run options...]`` (``ci/nightly-host.sh`` runs the nightly's three campaigns with it;
``docs/host.md``).

Two layouts. ``workers``: one campaign whose ``W * N`` workers the campaign spreads over the N
GPUs round robin (``campaign._gpu``). ``shards`` (the default): one campaign per GPU, pinned to
it with ``CUDA_VISIBLE_DEVICES``, with shard ``I + M*i / M*N`` of the host's ``I/M``: one
parent per GPU, so confirmations, minimizations and the heartbeat loop of N GPUs' workers are
not one Python process's, and a device fault poisons one GPU's campaign only. The sub-shards
split the host's sequence numbers exactly (``k % M == I`` into ``k % MN == I + M*i``), and each
gets ``slot.share`` of ``--max-sequences``: so N GPUs run the very sequences one GPU runs with
the same limit, whatever the layout, and a figure for 8 GPUs compares with one for 1.

After the campaigns, ``merge.merge`` makes one result of their outputs in ``DIR`` (one case
per signature, occurrences summed, ``docs/nightly.md``), each GPU's corpus is merged into
``--corpus`` (the smallest subset covering their union), and ``DIR/host.json``
(``kvfuzz-host/1``) records the plan, each campaign's figures, the totals and what the host's
CPUs did meanwhile (the first suspect where N GPUs do not give N times one).

``KVFUZZ_SIMULATE_GPUS=N`` makes the placement believe the host has N GPUs, with a CPU
campaign (``--backend interpret`` unless given) standing in for each: the plan, the sharding,
the merge and the corpus union are then the ones a GPU host runs, on any machine; only
``CUDA_VISIBLE_DEVICES`` is left unset (it would name GPUs that do not exist).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..cli_args import _shard  # the same I/N as kvfuzz run --shard, with its messages

SCHEMA = "kvfuzz-host/1"
SIMULATE_ENV = "KVFUZZ_SIMULATE_GPUS"
LAYOUTS = ("shards", "workers")
# What the host decides for each campaign: given among the run options, it would contradict the plan.
OWNED = ("--workers", "--shard", "--out", "--summary", "--junit-xml", "--max-sequences", "--max-ops", "--corpus",
         "--backend", "--baseline", "--json")


class HostUsageError(ValueError):
    """A plan that cannot be made: too few GPUs, work that does not split, a flag the host owns (exit 2)."""


@dataclass(frozen=True)
class Host:
    devices: tuple  # CUDA_VISIBLE_DEVICES entries, one per GPU; () on a host without one
    simulated: bool = False

    @property
    def backend(self) -> str:
        return "cuda" if self.devices and not self.simulated else "interpret"


def find_host(env=None) -> Host:
    """The GPUs this host lets us use (``supervise.visible_gpus``), or ``KVFUZZ_SIMULATE_GPUS`` stand-ins."""
    env = os.environ if env is None else env
    simulated = env.get(SIMULATE_ENV, "").strip()
    if simulated:
        if not simulated.isdigit() or int(simulated) < 1:
            raise HostUsageError(f"{SIMULATE_ENV}={simulated!r}: give a number of GPUs, 1 or more")
        return Host(tuple(str(i) for i in range(int(simulated))), simulated=True)
    from ..engine.supervise import visible_gpus

    return Host(tuple(g for g in visible_gpus() if g is not None))


@dataclass(frozen=True)
class Placement:
    """One campaign of the plan: where it runs, its shard, its workers and its part of the work."""

    name: str
    devices: tuple
    shard: tuple
    workers: int
    max_sequences: int | None = None
    max_ops: int | None = None

    def env(self, host: Host) -> dict:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)} if self.devices and not host.simulated else {}


def plan(devices, *, layout: str = "shards", workers_per_gpu: int = 1, shard=(0, 1),
         max_sequences: int | None = None, max_ops: int | None = None) -> list[Placement]:
    """The campaigns that run the host's shard ``shard`` on ``devices``."""
    from ..engine.slot import share

    devices = tuple(devices)
    if layout not in LAYOUTS:
        raise HostUsageError(f"--layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if workers_per_gpu < 1:
        raise HostUsageError(f"--workers-per-gpu {workers_per_gpu}: need 1 or more")
    first, count = shard
    n = len(devices)
    if layout == "workers" or n <= 1:
        name = "host" if n != 1 else f"gpu{devices[0]}"
        return [Placement(name, devices, (first, count), workers_per_gpu * max(n, 1), max_sequences, max_ops)]
    for flag, total in (("--max-sequences", max_sequences), ("--max-ops", max_ops)):
        if total is not None and total < n:
            raise HostUsageError(f"{flag} {total} over {n} GPUs: less than one per GPU")
    return [Placement(f"gpu{d}", (d,), (first + count * i, count * n), workers_per_gpu,
                      share(max_sequences, n, i), share(max_ops, n, i)) for i, d in enumerate(devices)]


def command(p: Placement, out: Path, *, backend: str, run_args=(), corpus: Path | None = None,
            baseline: str | None = None, python: str = sys.executable) -> list[str]:
    argv = [python, "-m", "fuzz", "run", "--backend", backend, "--workers", str(p.workers),
            "--shard", f"{p.shard[0]}/{p.shard[1]}", "--out", str(out), "--summary", str(out / "summary.json"),
            "--junit-xml", str(out / "junit.xml")]
    for flag, value in (("--max-sequences", p.max_sequences), ("--max-ops", p.max_ops), ("--corpus", corpus),
                        ("--baseline", baseline)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + [str(a) for a in run_args]


def _read_json(path: Path):
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _exit_code(codes, merged_exit: int) -> int:
    """The stage's exit as ``kvfuzz run``'s: 3 a harness error (or a campaign killed), 2 setup or
    health, else 1 for a new failure in the merge."""
    if any(c == 3 or c < 0 or c > 3 and c != 130 for c in codes):
        return 3
    if 130 in codes:  # a campaign stopped by ^C before its summary
        return 130
    if any(c == 2 for c in codes):
        return 2
    return 1 if merged_exit == 1 or any(c == 1 for c in codes) and merged_exit is None else 0


@dataclass
class _Running:
    placement: Placement
    out: Path
    proc: subprocess.Popen
    log: Path
    wall_s: float | None = None


def _launch(host, placements, out: Path, run_args, corpus, baseline, backend, python) -> list[_Running]:
    runs = []
    for old in ("gpus", "corpora"):  # a last night's, perhaps of more GPUs: this stage's output alone is kept
        shutil.rmtree(out / old, ignore_errors=True)
    for p in placements:
        where = out / "gpus" / p.name
        where.mkdir(parents=True)
        own_corpus = None
        if corpus is not None:
            own_corpus = out / "corpora" / p.name if len(placements) > 1 else Path(corpus)
            if own_corpus != Path(corpus) and Path(corpus).is_dir():
                shutil.copytree(corpus, own_corpus)
        log = out / "gpus" / f"{p.name}.log"
        argv = command(p, where, backend=backend, run_args=run_args, corpus=own_corpus, baseline=baseline,
                       python=python)
        with open(log, "w") as fh:
            fh.write(" ".join(argv) + "\n")
            fh.flush()
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **p.env(host)})
        runs.append(_Running(p, where, proc, log))
    return runs


def _wait(runs: list[_Running], start: float) -> None:
    """Every campaign to its end; SIGTERM / SIGINT passed on to each (each then writes its
    interrupted summary, and the merge still runs)."""
    def forward(signum, _frame):
        for r in runs:
            if r.proc.poll() is None:
                r.proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while any(r.wall_s is None for r in runs):
            for r in runs:
                if r.wall_s is None and r.proc.poll() is not None:
                    r.wall_s = time.monotonic() - start
            time.sleep(0.05)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _merge_corpora(runs, corpus: Path) -> dict:
    from ..engine.corpus import Corpus, merge

    parts = [r.out.parent.parent / "corpora" / r.placement.name for r in runs]
    parts = [p for p in parts if p.is_dir()]
    fresh = corpus.parent / f".{corpus.name}.merging"
    shutil.rmtree(fresh, ignore_errors=True)
    read, kept, features = merge(parts, fresh)
    covered = set(Corpus(fresh).features)
    union = set().union(*(Corpus(p).features for p in parts)) if parts else set()
    shutil.rmtree(corpus, ignore_errors=True)
    shutil.move(str(fresh), str(corpus))
    return {"path": str(corpus), "entries_read": read, "kept": kept, "features": features,
            "union_covered": covered == union}


def _cpu_times() -> tuple | None:
    """The host's busy and total CPU time so far (``/proc/stat``, clock ticks), or None off Linux.
    The whole host's, not our children's: the workers are forked by the fork daemon
    (``engine.zygote``), not by the campaigns this starts, so no rusage of ours counts them."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _busy_cores(before, after, wall: float) -> float | None:
    """Cores the host kept busy on average over ``wall`` seconds (anything running on it)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1), 2)


def _corpus(path) -> dict:
    """What one campaign's own corpus holds (nothing to merge)."""
    from ..engine import guide

    c = guide.Corpus(path)
    return {"path": str(path), "entries_read": len(c.entries), "kept": len(c.entries), "features": len(c.features),
            "union_covered": True}


def run_stage(host: Host, placements: list[Placement], out, run_args=(), *, corpus=None, baseline=None,
              backend: str | None = None, python: str = sys.executable) -> dict:
    """Run the placements side by side, merge their outputs into ``out`` and their corpora into
    ``corpus``; the stage's record (``host.json``)."""
    from . import merge, reports
    from .baseline import load_baseline

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    backend = backend or host.backend
    before = _cpu_times()
    start = time.monotonic()
    runs = _launch(host, placements, out, run_args, corpus, baseline, backend, python)
    _wait(runs, start)
    wall = time.monotonic() - start
    busy = _busy_cores(before, _cpu_times(), wall)
    campaigns, shard_occurrences = [], 0
    for r in runs:
        s = _read_json(r.out / "summary.json") or {}
        shard_occurrences += sum(f.get("occurrences", 1) for f in s.get("failures", []))
        campaigns.append({**asdict(r.placement), "exit_code": r.proc.returncode, "wall_s": round(r.wall_s, 3),
                          "log": str(r.log), "summary": bool(s),
                          **{k: s.get(k) for k in ("ops", "sequences", "elements_checked", "elapsed_s", "ops_per_s",
                                                   "steady_ops_per_s", "elements_per_s", "compile_s", "stopped_by")}})
    inputs = [r.out for r in runs if any(r.out.glob("*.json"))]
    merged = None
    if inputs:
        result = merge.merge(inputs, out, baseline=load_baseline(baseline) if baseline else None)
        merged = {"text": result.text, "exit_code": result.exit_code,
                  "signatures": len(result.summary["failures"]),
                  "occurrences": sum(f["occurrences"] for f in result.summary["failures"]),
                  "cases": sum(1 for f in result.summary["failures"] if f["case"]),
                  "problems": result.summary["problems"]}
    ops = sum(c["ops"] or 0 for c in campaigns)
    elements = sum(c["elements_checked"] or 0 for c in campaigns)
    elapsed = max((c["elapsed_s"] or 0 for c in campaigns), default=0)
    steady = [c["steady_ops_per_s"] for c in campaigns]
    record = {
        "schema": SCHEMA, "devices": list(host.devices), "simulated": host.simulated, "backend": backend,
        "layout": "workers" if any(len(p.devices) > 1 for p in placements) else "shards",
        "gpus": len({d for p in placements for d in p.devices}), "host_cores": os.cpu_count(),
        "run_args": [str(a) for a in run_args], "campaigns": campaigns,
        "ops": ops, "sequences": sum(c["sequences"] or 0 for c in campaigns), "elements_checked": elements,
        "elapsed_s": round(elapsed, 3), "wall_s": round(wall, 3),
        # the campaigns' own clocks (from each one's start to its end, the slowest one's) and the wall
        # clock around them all (their processes' start, Triton's compiles, the merge's wait)
        "ops_per_s": round(ops / elapsed, 1) if elapsed else 0.0,
        "elements_per_s": round(elements / elapsed, 1) if elapsed else 0.0,
        "wall_ops_per_s": round(ops / wall, 1) if wall else 0.0,
        "steady_ops_per_s": round(sum(steady), 1) if steady and None not in steady else None,
        "cpu_cores_busy": busy,
        "merge": merged, "shard_occurrences": shard_occurrences,
        "corpus": None if corpus is None else _merge_corpora(runs, Path(corpus)) if len(runs) > 1 else _corpus(corpus),
        "exit_code": _exit_code([r.proc.returncode for r in runs], merged["exit_code"] if merged else None),
    }
    reports.write(str(out / "host.json"), reports.dumps(record))
    return record


def text_report(record: dict) -> str:
    kind = "simulated GPU" if record["simulated"] else "GPU"
    lines = [f"kvfuzz host: {len(record['campaigns'])} campaign(s) on {record['gpus']} {kind}(s), layout "
             f"{record['layout']}, backend {record['backend']}"]
    for c in record["campaigns"]:
        lines.append(f"  {c['name']:<8} shard {c['shard'][0]}/{c['shard'][1]} workers {c['workers']}: "
                     f"exit {c['exit_code']}, {c['ops'] or 0:,} ops, {c['ops_per_s'] or 0:,.0f} ops/s, "
                     f"{c['elapsed_s'] or 0:.1f} s (log {c['log']})")
    if record["merge"]:
        lines.append(record["merge"]["text"])
    if record["corpus"]:
        c = record["corpus"]
        lines.append(f"kvfuzz host: corpus {c['path']}: {c['kept']} of {c['entries_read']} entries kept, "
                     f"{c['features']} features (the union of the GPUs' corpora)")
    lines.append(f"kvfuzz host: {record['ops']:,} ops, {record['ops_per_s']:,.0f} ops/s "
                 f"({record['wall_ops_per_s']:,.0f} over the wall clock, {record['wall_s']:.1f} s), "
                 f"{record['elements_per_s']:.3g} elements/s; host CPUs "
                 f"{'?' if record['cpu_cores_busy'] is None else record['cpu_cores_busy']} of {record['host_cores']} busy; "
                 f"exit {record['exit_code']}")
    return "\n".join(lines)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"need a whole number, 1 or more, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fuzz.tools.host", description=__doc__.split("\n\n")[0],
                                 allow_abbrev=False,  # --workers is kvfuzz run's, not short for --workers-per-gpu
                                 epilog="Any other option is passed to each kvfuzz run (--scale, --kernels, --seed, "
                                        "--budget-s, --check-every, --cache-dir, ...).")
    ap.add_argument("--out", required=True, help="the merged result; each campaign's output under OUT/gpus/")
    ap.add_argument("--layout", choices=LAYOUTS, default="shards")
    ap.add_argument("--workers-per-gpu", type=_positive, default=None,
                    help="default 4 on GPUs; on a host without one (or simulated), the cores over the campaigns")
    ap.add_argument("--gpus", type=_positive, default=None, help="use the first N GPUs (default all)")
    ap.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/M", help="this host's share of the seeds")
    ap.add_argument("--max-sequences", type=_positive, default=None, help="the host's sequences, all GPUs together")
    ap.add_argument("--max-ops", type=_positive, default=None, help="the host's ops, all GPUs together")
    ap.add_argument("--corpus", default=None, help="the guided corpus: each GPU grows a copy, merged back at the end")
    ap.add_argument("--baseline", default=None, help="known failures (docs/nightly.md), for each run and the merge")
    ap.add_argument("--backend", default=None, help="default: cuda on GPUs, interpret without (or simulated)")
    return ap


def make_plan(args, host: Host) -> tuple[Host, list[Placement]]:
    if args.gpus is not None:
        if args.gpus > len(host.devices):
            raise HostUsageError(f"--gpus {args.gpus}: this host has {len(host.devices)}"
                                 + ("" if host.devices else f" (set {SIMULATE_ENV}=N to simulate N)"))
        host = Host(host.devices[:args.gpus], host.simulated)
    workers = args.workers_per_gpu
    if workers is None:
        workers = 4 if host.devices and not host.simulated else max(1, (os.cpu_count() or 1) // max(1, len(host.devices)))
    return host, plan(host.devices, layout=args.layout, workers_per_gpu=workers, shard=args.shard,
                      max_sequences=args.max_sequences, max_ops=args.max_ops)


def main(argv=None) -> int:
    args, run_args = parser().parse_known_args(argv)
    taken = [a for a in run_args if a.split("=", 1)[0] in OWNED]
    from .baseline import BaselineError, load_baseline

    try:
        if taken:
            raise HostUsageError(f"{', '.join(taken)}: the host sets this for each campaign (see --help)")
        if args.baseline:
            load_baseline(args.baseline)  # a broken one fails now, not after the night's campaigns
        host, placements = make_plan(args, find_host())
    except (HostUsageError, BaselineError) as exc:
        print(f"kvfuzz host: {exc}", file=sys.stderr)
        return 2
    record = run_stage(host, placements, args.out, run_args, corpus=args.corpus, baseline=args.baseline,
                       backend=args.backend)
    print(text_report(record))
    return record["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
