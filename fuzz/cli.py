"""The ``kvfuzz`` command line (also ``python -m fuzz``).

Exit codes: 0 clean; 1 failures found (with --baseline, new ones only; or a replayed case still fails, or check-sync
findings); 2 usage or setup error, or a run that did not test what it claims (no ops,
no Triton launch on a Triton tier); 3 an internal error of the harness itself.

Nothing that imports Triton or a kernel set runs in this process before the backend is
chosen, and a kernel set never runs in it at all during ``run``, ``replay`` and
``minimize``: supervised child processes do that, so a kernel that segfaults, hangs or
faults the GPU is a finding, not the end of the command.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from .cli_args import WORK_BUDGET_S, build_parser
from .engine import zygote
from .engine.supervise import EXIT_HARNESS, NotRun
from .engine.tiers import BACKENDS, SetupError, select_backend
from .sync import cli as check_sync_cli


def _cmd_run(args) -> int:
    select_backend(args.backend)
    zygote.warm(interpret=args.backend == "interpret")  # its imports overlap the engine's below
    from .engine.campaign import CampaignOptions, run_campaign
    from .engine.case import source_hash
    from .engine.tiers import default_kernels
    from .tools import reports

    for flag in ("summary", "junit_xml"):
        target = getattr(args, flag)
        if target and Path(target).is_dir():
            raise SetupError(f"--{flag.replace('_', '-')} {target}: is a directory; give a file name")
    baseline = None
    if args.baseline:
        from .tools.baseline import load_baseline

        baseline = load_baseline(args.baseline)  # before the budget is spent: a broken baseline is exit 2
    if args.allocator:
        from .engine import allocators, tracks

        allocators.check_name(args.allocator)
        args.kernels = args.kernels or allocators.default_kernels(args.allocator)
        if not tracks.get(args.scale).uses_allocator:
            raise SetupError(f"--allocator drives the allocator state machine (--scale small); --scale {args.scale} "
                             f"runs kernel-level ops only")
    if (args.guided or args.corpus) and args.scale != "small":
        raise SetupError(f"--guided and --corpus guide --scale small, not --scale {args.scale}")
    from .engine import tracks

    if args.compile_ahead in ("on", "follow") and (args.backend != "cuda"
                                                   or not tracks.get(args.scale).palette_on_gpu):
        raise SetupError(f"--compile-ahead {args.compile_ahead} compiles the kernels a GPU campaign at production scale meets: it "
                         f"needs --backend cuda --scale production (here --backend {args.backend} --scale "
                         f"{args.scale}, where nothing is compiled ahead)")
    if args.budget_s is None:
        args.budget_s = WORK_BUDGET_S if args.max_sequences or args.max_ops else 60.0
    opts = CampaignOptions(guided=args.guided or bool(args.corpus), corpus=args.corpus,
                           backend=args.backend, kernels=args.kernels, seed=args.seed, budget_s=args.budget_s,
                           max_sequences=args.max_sequences, max_ops=args.max_ops, stop_on_first=args.stop_on_first,
                           out=args.out, workers=args.workers, shard=args.shard,
                           ops_per_sequence=args.ops_per_sequence, hostile=args.hostile, op_timeout=args.op_timeout,
                           progress_s=args.progress_s, minimize=not args.no_minimize, scale=args.scale,
                           check_every=args.check_every, reproduce=args.reproduce, program_order=args.program_order,
                           cache_dir=args.cache_dir, allocator=args.allocator, palette=args.palette,
                           compile_ahead=args.compile_ahead, ahead_sequences=args.ahead_sequences,
                           shrink_jobs=args.shrink_jobs)
    s = run_campaign(opts)
    kernels = args.kernels or default_kernels(args.backend)
    verdict = None if baseline is None else baseline.compare(
        {str(c.signature): [c.kernels or kernels] for c in s.cases})
    for case, path in zip(s.cases, s.paths):
        known = "" if verdict is None or not verdict.is_known(case.signature) else \
            f"  [known: {verdict.reasons.get(str(case.signature)) or 'in the baseline'}]"
        print(f"case: {path}  ({case.signature}, {case.lengths.get('original')} -> "
              f"{case.lengths.get('minimized')} ops){known}")
    for text in s.harness_errors:
        print(f"kvfuzz run: internal harness error (exit 3):\n{text}", file=sys.stderr)
    for problem in s.health:
        print(f"kvfuzz run: not clean: {problem}", file=sys.stderr)
    for why, n in sorted(s.not_applicable.items(), key=lambda kv: -kv[1]):
        print(f"kvfuzz run: not checked ({n}x): {why}", file=sys.stderr)
    probed = ", ".join(f"{k} {v}" for k, v in sorted(s.hostile.items())) or "none"
    print(f"kvfuzz run: backend={args.backend} kernels={kernels} "
          + (f"allocator={args.allocator} " if args.allocator else "") + f"shard={args.shard[0]}/{args.shard[1]} "
          f"workers={args.workers} scale={args.scale} sequences={s.sequences} ops={s.ops} ops/s={s.ops_per_s:.0f} "
          f"contract_ops={s.contract_ops} hostile={args.hostile} (probed: {probed}) faults={s.faults} "
          f"failures={len(s.cases)} stopped_by={s.stopped_by} elapsed={s.elapsed_s:.1f}s"
          + (f" steady_ops/s={s.steady_ops_per_s:.0f}" if s.steady_ops_per_s else "")
          + (f" elements/s={s.elements / s.elapsed_s:.3g}" if s.elements and s.elapsed_s else "")
          + (f" far_ops_ran={s.far_ops['ran']}/{s.far_ops['ran'] + s.far_ops['not_applicable']}" if s.far_ops else "")
          + (f" compile_s={s.compile_s:.1f} compiles={s.compiles}" if s.compile_s else "")
          + (f" loads={s.loads}" if s.loads else "")
          + (f" compile_ahead_s={s.compile_ahead.get('seconds', 0):.1f}" if s.compile_ahead else "")
          + (f" interrupted={s.interrupted}" if s.interrupted else ""))
    if verdict is not None:
        print(f"kvfuzz run: {verdict.text()}"
              + "".join(f"\n  no longer seen (fixed?): {sig}" for sig in verdict.no_longer_seen))
    if args.stats:
        print(reports.stats_table(s))
    data = reports.summary_json(s, backend=args.backend, kernels=kernels, kernels_sha256=source_hash(kernels),
                                options={"seed": args.seed, "budget_s": args.budget_s, "workers": args.workers,
                                         "max_sequences": args.max_sequences, "max_ops": args.max_ops,
                                         "stop_on_first": args.stop_on_first,
                                         "scale": args.scale, "check_every": args.check_every,
                                         "shard": f"{args.shard[0]}/{args.shard[1]}", "hostile": args.hostile,
                                         "op_timeout": args.op_timeout or "auto", "reproduce": args.reproduce,
                                         "program_order": opts.order(), "palette": "on" if opts.palette_on() else "off",
                                         "compile_ahead": opts.compile_ahead if opts.compile_ahead_on() else "off"},
                                baseline=verdict, allocator=args.allocator)
    if opts.guided:
        from .tools.coverage_report import features_block

        data["features"] = features_block(opts.track.root)
        print(f"kvfuzz run: corpus {data['features']['corpus']}: {data['features']['entries']} entries, "
              f"{sum(data['features']['by_domain'].values())} features (kvfuzz coverage DIR: what none reached)")
    if args.summary:
        reports.write(args.summary, reports.dumps(data))
    if args.junit_xml:
        reports.write(args.junit_xml, reports.junit_xml(s, backend=args.backend, kernels=kernels, baseline=verdict))
    if args.json:
        import json

        print(json.dumps(data))
    return data["exit_code"]


# ---- replay and minimize -------------------------------------------------------------------------


def _case_spec(args, case):
    """(TierSpec, the kernels named, whether they are the case's own)."""
    from .engine import allocators
    from .engine.case import resolve_kernels
    from .engine.tiers import TierSpec

    backend = args.backend or case.tier or "torch"
    select_backend(backend)
    own = not args.kernels
    kernels = args.kernels or resolve_kernels(case.kernels, case.path, case.kernels_file)
    allocator = getattr(args, "allocator", None) or allocators.resolve(case.allocator, case.path, case.allocator_file)
    if allocator:
        allocators.check_name(allocator)
    return TierSpec(backend, kernels, allocator=allocator), kernels, own


def _executor(spec, op_timeout: float):
    import tempfile

    from .engine.supervise import Executor

    return Executor(spec, op_timeout=op_timeout, log_dir=Path(tempfile.gettempdir()))


def _verdict(run, what: str):
    """Run ``run()`` (an executor call); a setup or harness failure in the child becomes
    this process's SetupError / exit 3."""
    from .engine.supervise import HarnessFailed, SetupFailed

    try:
        return run()
    except SetupFailed as exc:
        raise SetupError(str(exc)) from None
    except HarnessFailed as exc:
        raise HarnessError(f"{what}: {exc}") from None


class HarnessError(RuntimeError):
    """kvfuzz's own failure (exit 3)."""


def _cmd_replay(args) -> int:
    from .engine.case import load_case

    case = load_case(args.case)
    if args.pytest:
        from .tools.pytest_export import render

        print(render(case, args.case))
        return 0
    spec, kernels, own = _case_spec(args, case)
    if args.sanitizer:
        from .tools.sanitizer import replay_under_sanitizer

        return replay_under_sanitizer(case, Path(args.case), spec, args.sanitizer)
    mode = _mode(args, case)
    history = (case.history or {}).get("sequences") or None
    tries = args.tries or case.replay_tries()
    where = f"backend={spec.backend} kernels={kernels}" + (f" allocator={spec.allocator}" if spec.allocator else "") + (
        f" hostile={mode['hostile']}") + (
        f" program_order={mode['program_order']}" if mode.get("program_order", "launch") != "launch" else "") + (
        f" after {len(history)} earlier sequences (the worker's history)" if history else "")
    d, tried, unrun = None, 0, []
    if args.in_process:
        try:
            d, tried = _replay_here(case, spec, mode, history, own), 1
        except NotRun as exc:  # it passed with an op that could not run here: no verdict
            unrun.append(str(exc))
        dropped = getattr(d, "dropped", None) or []
    else:
        executor = _executor(spec, args.op_timeout)
        try:
            while d is None and tried < tries + len(unrun) and len(unrun) <= UNRUN_RETRIES:
                tried += 1
                fresh = tried > 1
                try:
                    d = _verdict(lambda: executor.run(case.config, case.ops, case.knobs, mode, strict_knobs=own,  # noqa: B023
                                                      history=history, fresh=fresh), "replay")  # noqa: B023
                except NotRun as exc:  # neither a pass nor a failure: tried again, a few times
                    unrun.append(str(exc))
        finally:
            executor.close()
        dropped = executor.notes.get("dropped_knobs", [])
        tried -= len(unrun)
    if dropped:
        print(f"kvfuzz replay: warning: {kernels} has no launch knob {', '.join(dropped)}; dropped", file=sys.stderr)
    rate = _rate_text(case)
    if d is None and unrun and not tried:
        print(f"UNKNOWN {args.case}: the replay could not run here in {len(unrun)} tries ({where}): {unrun[-1]}"
              f"{rate}")
        return 2
    if d is None:
        print(f"PASS {args.case}: {len(case.ops)} ops agree with the spec in {tried} tr{'y' if tried == 1 else 'ies'} "
              f"({where}){rate}" + (f"; {len(unrun)} more could not run: {unrun[-1]}" if unrun else ""))
        return 0
    same = "same signature" if d.signature == case.signature else f"NEW signature (case has {case.signature})"
    print(f"FAIL {args.case}: {d.signature}: {d} [{same}; {where}; failed on try {tried} of {tries}]{rate}")
    from .engine.stacks import brief

    fault = getattr(d, "fault", None)
    if fault is not None and fault.stack:  # a hang: where the child was when its op ran out of time
        print("where the replay hung (its main thread, innermost call first):\n  " + "\n  ".join(brief(fault.stack)))
    elif fault is not None and fault.stderr:
        print("stderr of the replay (the fault's Python stack first):\n  " + "\n  ".join(_fault_lines(fault.stderr)))
    return 1


UNRUN_RETRIES = 2  # replays that could not run (memory, a device error before the first op) tried again


def _mode(args, case) -> dict:
    """The case's run mode, with the flags that override it."""
    mode = dict(case.run_mode)
    if getattr(args, "hostile", None):
        mode["hostile"] = args.hostile
    return mode


def _rate_text(case) -> str:
    r = case.reproduced
    if not r:
        return ""
    text = f"; found reproducing {r.get('k')}/{r.get('n')}" + (" (flaky)" if case.flaky else "")
    note = (case.history or {}).get("note")
    seen = (case.nondeterministic or {}).get("seen")
    return text + (f"; {note}" if note else "") + (
        f"; its campaign saw this kernel set fail non-deterministically ({'; '.join(seen[:3])})" if seen else "")


def _replay_here(case, spec, mode: dict, history, own: bool):
    """The replay in this process (a debugger's): the same mode and history as a child's."""
    import kvref

    from .engine.dispatch import judge, replay
    from .engine.kinds import parse_ops
    from .engine.worker import _knobs_of, set_order

    tier = spec.make()
    for past in history or ():
        set_order(tier, mode, past.get("seed"))
        replay(kvref.PoolConfig.from_json(past["config"]), parse_ops(past["ops"]), tier, knobs=_knobs_of(tier, past),
               hostile=mode["hostile"], check_every=mode.get("check_every", 1), strict_knobs=False)
    set_order(tier, mode)
    d, run = judge(case.config, case.ops, tier, knobs=case.knobs, strict_knobs=own, hostile=mode["hostile"],
                   check_every=mode.get("check_every", 1))
    if d is not None:
        d.dropped = run.dropped_knobs
    elif run.dropped_knobs:
        print(f"kvfuzz replay: warning: dropped launch knobs {', '.join(run.dropped_knobs)}", file=sys.stderr)
    return d


def _fault_lines(lines: list[str], n: int = 12) -> list[str]:
    """From faulthandler's report, the lines that say where (the innermost frames first)."""
    start = next((i for i, line in enumerate(lines) if "Fatal Python error" in line), max(0, len(lines) - n))
    return lines[start:start + n]


def _cmd_minimize(args) -> int:
    from .engine.case import load_case
    from .engine.lanes import Lanes, default_width
    from .engine.minimize import Minimizer, NotReproducible, hostile_kind

    case = load_case(args.case)
    spec, _, own = _case_spec(args, case)
    mode = _mode(args, case)
    history = (case.history or {}).get("sequences") or None
    executor = _executor(spec, args.op_timeout)
    deadline = time.monotonic() + args.budget_s
    tries = case.shrink_tries(cap=10)
    executor.standby()  # every candidate in a fresh child (the next one started ahead): what the case alone does
    # --shrink-jobs candidates at once, each on an executor of its own (a flaky case's one at a time: Minimizer)
    lanes = Lanes(executor, args.shrink_jobs or default_width(), lambda: _executor(spec, args.op_timeout))

    def judge_on(ex):  # a candidate that could not run (NotRun) is not seen to fail: the minimizer's rule
        def judge(config, ops):
            return ex.run(config, ops, case.knobs, mode, deadline=deadline + 30, strict_knobs=own,
                          history=history, fresh=True)
        return judge

    m = Minimizer(None, case.signature, deadline=deadline, hostile=hostile_kind(case), tries=tries,
                  judge=judge_on(executor), batch=lanes.batch(judge_on), width=lanes.width)
    if m.width > 1:
        lanes.open()  # the siblings set up while the case itself is replayed
    try:
        config, ops, d = _verdict(lambda: m.run(case.config, case.ops), "minimize")
    except NotReproducible as exc:
        print(f"kvfuzz minimize: {args.case}: {exc}", file=sys.stderr)
        return 1
    finally:
        lanes.close()
        executor.close()
    minimal = {"one_minimal": m.one_minimal, "candidates": m.replays, "fresh": True,
               **({} if m.one_minimal else {"note": "not shown 1-minimal (its --budget-s ended first): "
                                                    "`kvfuzz minimize CASE` again goes on"})}
    out = case.with_minimized(config, ops, d, passes=m.report()).with_fields(minimal=minimal).write(
        Path(args.out or args.case))
    ahead = (f"; {m.width} at once: {m.ran_ahead} run ahead, {m.unreached} of them never reached, {m.rounds} turns"
             if m.width > 1 else "")
    print(f"minimized {args.case}: {len(case.ops)} -> {len(ops)} ops in {m.replays} replays, each in a fresh process "
          f"({m.saved} more spared by the cache{ahead}; passes tried/kept: "
          f"{', '.join(f'{k} {v}' for k, v in m.report().items()) or 'none'}); "
          f"{'1-minimal' if m.one_minimal else 'NOT yet 1-minimal: the budget ended first'}; written to {out}")
    return 0


def _cmd_merge(args) -> int:
    if args.corpus:
        from .tools import coverage_report

        return coverage_report.merge_main(args.inputs, args.out)
    from .tools import merge, reports
    from .tools.baseline import load_baseline

    for flag in ("summary", "junit_xml", "write_baseline"):
        target = getattr(args, flag)
        if target and Path(target).is_dir():
            raise SetupError(f"--{flag.replace('_', '-')} {target}: is a directory; give a file name")
    baseline = load_baseline(args.baseline) if args.baseline else None
    try:
        result = merge.merge(args.inputs, args.out, baseline=baseline)
    except merge.MergeUsageError as exc:
        raise SetupError(str(exc)) from None
    print(result.text)
    if args.summary:
        reports.write(args.summary, reports.dumps(result.summary))
    if args.junit_xml:
        reports.write(args.junit_xml, result.junit)
    if args.write_baseline:
        reports.write(args.write_baseline, reports.dumps(merge.accepted_baseline(result.summary, baseline)))
        print(f"kvfuzz merge: baseline accepting {len(result.summary['failures'])} signature(s) written to "
              f"{args.write_baseline}")
    if args.json:
        import json

        print(json.dumps(result.summary))
    return result.exit_code


def _cmd_coverage(args) -> int:
    from .tools import coverage_report

    return coverage_report.main(args.corpora, as_json=args.json)


def _cmd_report(args) -> int:
    from .tools import morning
    from .tools.night import ReportUsageError

    try:
        return morning.main(args.dirs, args.html, history=args.history)
    except ReportUsageError as exc:
        raise SetupError(str(exc)) from None


# ---- the rest -------------------------------------------------------------------------------------


def _cmd_check_sync(args) -> int:
    return check_sync_cli.run(args)


def _cmd_mutants(args) -> int:
    select_backend(args.backend)
    from .tools.mutants import MUTANTS
    from .tools.mutants import main as mutants

    if args.list:
        for m in MUTANTS:
            print(f"{m.name:34} kvkernels/{m.file:18} {m.why}")
        return 0
    return mutants(backend=args.backend, budget_s=args.budget_s, only=args.only, seed=args.seed)


def _cmd_bench(args) -> int:
    from .tools.bench import main as bench

    tiers = None
    if args.tiers is not None:
        tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
        unknown = [t for t in tiers if t not in BACKENDS]
        if unknown or not tiers:
            raise SetupError(f"--tiers {args.tiers}: unknown tier {', '.join(unknown) or '(none given)'}; "
                             f"choose from {', '.join(BACKENDS)}")
    return bench(seconds=args.seconds, tiers=tiers, out=args.out, plot=args.plot)


COMMANDS = {"run": _cmd_run, "replay": _cmd_replay, "minimize": _cmd_minimize, "merge": _cmd_merge, "coverage": _cmd_coverage,
            "report": _cmd_report,
            "check-sync": _cmd_check_sync,
            "mutants": _cmd_mutants, "bench": _cmd_bench}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .engine.case import CaseError

    try:
        return COMMANDS[args.command](args)
    except (SetupError, CaseError) as exc:
        print(f"kvfuzz {args.command}: {exc}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"kvfuzz {args.command}: internal harness error: {exc}", file=sys.stderr)
        return EXIT_HARNESS
    except KeyboardInterrupt:
        print(f"kvfuzz {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - a bug of kvfuzz: say so, with the traceback, and exit 3
        print(f"kvfuzz {args.command}: internal harness error (please report it):\n{traceback.format_exc()}",
              file=sys.stderr)
        return EXIT_HARNESS
