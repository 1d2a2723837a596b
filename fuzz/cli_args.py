"""The ``kvfuzz`` command line's grammar: every subcommand, its flags and their value types.

Apart from ``fuzz/cli.py`` (which runs the commands) so that tests and the CI examples check can
parse a command line without importing what the commands need.
"""

from __future__ import annotations

import argparse
import math

from .engine.generate import HOSTILE
from .engine.launches import MODES as ORDERS
from .engine.tiers import BACKENDS
from .sync import cli as check_sync_cli

WORK_BUDGET_S = 3600.0  # run's default budget with a work limit: a safety cap, not the measure of the run


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes I/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text}: need 0 <= I < N")
    return i, n


def _timeout(text: str) -> float | None:
    return None if text == "auto" else _positive(float)(text)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _limit(text: str) -> int | None:
    """A work limit: a whole number > 0, or an empty value for none (as ci/fuzz.sh passes an unset knob)."""
    return None if text == "" else _positive(int)(text)


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value
    return parse


def _shrink_jobs(p) -> None:
    p.add_argument("--shrink-jobs", type=_positive(int), default=None, metavar="N",
                   help="shrink candidates that each need a fresh child (a crash, a hang, a case with history) N at "
                        "once, each in a child of its own (default: half the cores, 1 to 4); a campaign's cases "
                        "share the N - 1 extra children; the minimized case, its 1-minimal check and the "
                        "candidates counted against the cap are the same at any N")


def _version() -> str:
    from .tools.reports import kvfuzz_version

    return f"kvfuzz {kvfuzz_version()}"


def _case_target(p, *, kernels_help: str) -> None:
    """A case file and what it runs on, each defaulting to the case's own (replay, minimize)."""
    p.add_argument("case")
    p.add_argument("--backend", choices=BACKENDS, help="default: the case's tier")
    p.add_argument("--kernels", help=kernels_help)
    p.add_argument("--allocator", metavar="MODULE_OR_FILE[:FACTORY]", help="default: the case's allocator")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvfuzz", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    run = command("run", "fuzz until the budget ends; write each distinct failure as a case file")
    run.add_argument("--backend", choices=BACKENDS, default="torch")
    run.add_argument("--kernels", help="kernel set: a dotted module or a path to a .py file (default: ours)")
    run.add_argument("--allocator", metavar="MODULE_OR_FILE[:FACTORY]",
                     help="allocator under test: MODULE_OR_FILE[:FACTORY] (docs/allocators.md; default: ours, kvkernels.allocator:DeviceAllocator)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--budget-s", type=_positive(float), default=None,
                     help="wall-clock budget, minimization included (default: 60; with --max-sequences or "
                          f"--max-ops, {WORK_BUDGET_S:g}: then only a safety cap, and a run it ends is not clean)")
    run.add_argument("--max-sequences", type=_limit, default=None, metavar="N",
                     help="end after N sequences of this shard, all workers together (worker w of W runs "
                          "sequence indices w, w + W, ... below N): the same work on any machine for a seed and "
                          "shard; an empty value means none")
    run.add_argument("--max-ops", type=_limit, default=None, metavar="N",
                     help="end after N ops of this shard, all workers together (N // W each, one more for the "
                          "first N %% W), in whole sequences: each worker ends the sequence that reaches its share")
    run.add_argument("--stop-on-first", action="store_true",
                     help="end as soon as the first finding is confirmed, minimized and written")
    run.add_argument("--out", default="kvfuzz-out", help="directory for case files")
    run.add_argument("--workers", type=_positive(int), default=1, help="worker processes (one GPU each on CUDA)")
    run.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N", help="this machine's share of the seeds")
    run.add_argument("--ops-per-sequence", type=_positive(int), default=None,
                     help="ops per generated sequence (default: 200; 24 at --scale production)")
    run.add_argument("--scale", choices=("small", "production", "compile"), default="small",
                     help="small pools through the allocator (small), or kernel-level ops at production shapes "
                          "drawn at the kernel set's own block boundaries, CUDA-graph replay included (production), "
                          "or every Triton kernel compiled for a GPU target at the specializations a run meets: ints "
                          "equal to 1, divisible by 16, neither; no GPU needed (compile)")
    run.add_argument("--check-every", type=_positive(int), default=1,
                     help="compare the whole state every N ops (results are compared after every op)")
    run.add_argument("--hostile", choices=HOSTILE, default="spec",
                     help="contract-breaking inputs: only where SPEC promises memory safety (spec), none (off), "
                          "or every one, run unchecked (all)")
    run.add_argument("--op-timeout", type=_timeout, default="auto", metavar="S|auto",
                     help="seconds one op may run before its worker is a 'timeout' case (default: auto, 10x the "
                          "longest op seen, 10 to 60 s); an op still running when the budget ends is waited for "
                          "this long and reported")
    run.add_argument("--reproduce", type=_count, default=5, metavar="N",
                     help="replay each finding N times in a fresh child before trusting it: the case records "
                          "its rate (reproduced k/N, flaky when 0 < k < N); 0 writes cases as found")
    run.add_argument("--program-order", choices=("auto", *ORDERS), default="auto",
                     help="the order the interpreter runs a launch's programs in (auto: a seeded order per "
                          "sequence on --backend interpret, recorded in the case; a GPU keeps its own)")
    run.add_argument("--cache-dir", metavar="DIR",
                     help="Triton's kernel cache for every worker (TRITON_CACHE_DIR): keep it between runs and a "
                          "GPU campaign does not spend its first seconds compiling")
    run.add_argument("--palette", choices=("auto", "on", "off"), default="auto",
                     help="draw each worker's production sizes from a bounded palette of its own (about two per "
                          "octave, at the set's boundaries; a tenth of draws leave it), so compiled kernels that "
                          "specialize on their sizes compile a bounded set of variants (auto: on for --backend cuda "
                          "with --scale production; the interpreter compiles nothing)")
    run.add_argument("--compile-ahead", choices=("auto", "on", "follow", "off"), default="auto",
                     help="before the clock, run the workers' first sequences with launches recorded, not run, and "
                          "compile the specializations they meet in parallel into the Triton cache, so workers only "
                          "load them (auto: follow for --backend cuda with --scale production; the interpreter and "
                          "torch tiers compile nothing); follow: and keep scouting and compiling the workers' later "
                          "sequences while they run, on the cores they leave; on: the first ones only. On the small "
                          "track a GPU worker makes a head start of its own instead (its warm-up sequences scouted "
                          "and compiled on the spare cores while it sets up): off turns that off too")
    run.add_argument("--ahead-sequences", type=_count, default=48, metavar="N",
                     help="sequences per worker the compile-ahead scouts, after its warm-up ones (default 48)")
    run.add_argument("--progress-s", type=_positive(float), default=30.0,
                     help="seconds between progress lines when stderr is not a terminal")
    run.add_argument("--summary", metavar="FILE", help="write a JSON summary here")
    run.add_argument("--junit-xml", metavar="FILE", help="write JUnit XML here (a test case per failure and per op kind)")
    run.add_argument("--stats", action="store_true", help="print the statistics table at the end")
    run.add_argument("--baseline", metavar="B",
                     help="known failures (a kvfuzz-baseline/1 file or a directory of accepted case files): "
                          "exit 1 only on a new signature; an empty value means none")
    run.add_argument("--no-minimize", action="store_true", help="write cases as found, without shrinking them")
    _shrink_jobs(run)
    run.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    run.add_argument("--guided", action="store_true", help="coverage-guided sequences from a corpus (--scale small)")
    run.add_argument("--corpus", metavar="DIR", type=lambda text: text or None,
                     help="the guided corpus, kept and resumed (default: OUT/corpus); it implies --guided, and an "
                          "empty value means none (as ci/fuzz.sh passes an unset KVFUZZ_CORPUS)")

    rp = command("replay", "replay one case file in a child process: exit 1 if it still fails")
    _case_target(rp, kernels_help="default: the case's kernel set (knobs it lacks are dropped, with a warning)")
    rp.add_argument("--op-timeout", type=_positive(float), default=60.0)
    rp.add_argument("--hostile", choices=HOSTILE, help="default: the mode the case was found in")
    rp.add_argument("--tries", type=_positive(int), default=None,
                    help="replays before PASS (default: the case's reproduction runs if it is flaky, else 1); "
                         "exit 1 at the first failure")
    rp.add_argument("--in-process", action="store_true", help="replay in this process (for a debugger)")
    rp.add_argument("--sanitizer", choices=("memcheck", "racecheck", "initcheck", "synccheck"),
                    help="replay under compute-sanitizer on a GPU and put its first report into the case")
    rp.add_argument("--pytest", action="store_true", help="print a standalone pytest test instead")

    mn = command("minimize", "shrink a case further (rewrites it, or writes --out)")
    _case_target(mn, kernels_help="default: the case's kernel set")
    mn.add_argument("--budget-s", type=_positive(float), default=60.0)
    mn.add_argument("--op-timeout", type=_positive(float), default=60.0)
    mn.add_argument("--hostile", choices=HOSTILE, help="default: the mode the case was found in")
    mn.add_argument("--out", help="default: rewrite the case in place")
    _shrink_jobs(mn)

    mg = command("merge", "merge shards' or nights' outputs: one case per signature, one summary, one JUnit file")
    mg.add_argument("inputs", nargs="+", metavar="OUT_DIR",
                    help="kvfuzz run --out directories (or folders of them, or an earlier merge)")
    mg.add_argument("--out", required=True, help="directory for the merged case files, summary.json and junit.xml")
    mg.add_argument("--baseline", metavar="B", help="known failures (a kvfuzz-baseline/1 file or a directory of "
                                                    "accepted case files): exit 1 only on a new signature")
    mg.add_argument("--summary", metavar="FILE", help="also write the merged summary JSON here")
    mg.add_argument("--junit-xml", metavar="FILE", help="also write the merged JUnit XML here")
    mg.add_argument("--write-baseline", metavar="FILE",
                    help="write a kvfuzz-baseline/1 file accepting every failure merged (and the --baseline's)")
    mg.add_argument("--json", action="store_true", help="print the merged summary as JSON on the last line")
    mg.add_argument("--corpus", action="store_true", help="the inputs are guided corpora: keep a covering subset")

    cv = command("coverage", "what guided corpora reached, per kernel and function, and what they never reached")
    cv.add_argument("corpora", nargs="+", metavar="CORPUS_DIR")
    cv.add_argument("--json", action="store_true", help="print the report as JSON")

    rpt = command("report", "the morning page: one self-contained HTML file of a night and the nights before it")
    rpt.add_argument("dirs", nargs="+", metavar="DIR",
                     help="nights' outputs, oldest first (ci/nightly.sh's KVFUZZ_OUT, a kvfuzz run --out or a "
                          "kvfuzz merge --out): the last is the night reported on")
    rpt.add_argument("--html", required=True, metavar="FILE", help="the page to write")
    rpt.add_argument("--history", metavar="FILE",
                     help="nights before, as JSON lines: read for the trends, then this night's line appended")

    cs = sub.add_parser("check-sync", help="static no-host-sync check of allocator free paths")
    check_sync_cli.add_arguments(cs)

    mu = command("mutants", "run the mutant catalogue: kill rate and time to kill per mutant")
    mu.add_argument("--backend", choices=BACKENDS, default="interpret")
    mu.add_argument("--budget-s", type=_positive(float), default=30.0, help="per mutant")
    mu.add_argument("--only", nargs="*", metavar="NAME")
    mu.add_argument("--seed", type=int, default=0)
    mu.add_argument("--list", action="store_true", help="list the catalogue and exit")

    bn = command("bench", "diffed ops/s per tier; on a GPU also the kernel benchmarks")
    bn.add_argument("--seconds", type=_positive(float), default=10.0, help="per tier")
    bn.add_argument("--tiers", default=None, help="comma list of backends (default: torch,interpret on a CPU; "
                                                  "torch,cuda on a GPU)")
    bn.add_argument("--out", help="write the results as JSON here")
    bn.add_argument("--plot", metavar="FILE.svg",
                    help="also draw the results as an SVG (needs the plots extra: pip install 'kvfuzz[plots]')")
    return p


# ---- run ------------------------------------------------------------------------------------
