"""The ``kvfuzz`` command line (also ``python -m fuzz``).

Exit codes: 0 clean, 1 failures found (or a replayed case still fails, or check-sync
findings), 2 usage or setup error. Nothing that imports Triton is imported before the
backend is chosen, so ``--backend interpret`` can still turn the interpreter on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .backends import BACKENDS, SetupError, select_backend
from .sync import cli as check_sync_cli


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes I/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text}: need 0 <= I < N")
    return i, n


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvfuzz", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="fuzz until the budget ends; write each distinct failure as a case file")
    run.add_argument("--backend", choices=BACKENDS, default="torch")
    run.add_argument("--kernels", help="kernel set: a dotted module or a path to a .py file (default: ours)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--budget-s", type=_positive(float), default=60.0)
    run.add_argument("--out", default="kvfuzz-out", help="directory for case files (default: kvfuzz-out)")
    run.add_argument("--workers", type=_positive(int), default=1)
    run.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N")
    run.add_argument("--ops-per-sequence", type=_positive(int), default=200)
    run.add_argument("--json", action="store_true", help="print the summary as JSON too")

    rp = sub.add_parser("replay", help="replay one case file: exit 1 if it still fails")
    rp.add_argument("case")
    rp.add_argument("--backend", choices=BACKENDS, help="default: the case's tier")
    rp.add_argument("--kernels", help="default: the case's kernel set")
    rp.add_argument("--pytest", action="store_true", help="print a standalone pytest test instead")

    mn = sub.add_parser("minimize", help="shrink a case further (rewrites it, or writes --out)")
    mn.add_argument("case")
    mn.add_argument("--backend", choices=BACKENDS)
    mn.add_argument("--kernels")
    mn.add_argument("--budget-s", type=_positive(float), default=60.0)
    mn.add_argument("--out")

    cs = sub.add_parser("check-sync", help="static no-host-sync check of allocator free paths")
    check_sync_cli.add_arguments(cs)

    mu = sub.add_parser("mutants", help="run the mutant catalogue: kill rate and time to kill per mutant")
    mu.add_argument("--backend", choices=BACKENDS, default="interpret")
    mu.add_argument("--budget-s", type=_positive(float), default=30.0, help="per mutant")
    mu.add_argument("--only", nargs="*", metavar="NAME")
    mu.add_argument("--seed", type=int, default=0)
    mu.add_argument("--list", action="store_true", help="list the catalogue and exit")

    bn = sub.add_parser("bench", help="diffed ops/s per tier; on a GPU also the kernel benchmarks")
    bn.add_argument("--seconds", type=_positive(float), default=10.0, help="per tier")
    bn.add_argument("--tiers", default=None, help="comma list (default: torch,interpret on CPU; torch,cuda on GPU)")
    bn.add_argument("--out", help="write the results as JSON here")
    return p


def _cmd_run(args) -> int:
    select_backend(args.backend)
    from .campaign import CampaignOptions, run_campaign

    opts = CampaignOptions(backend=args.backend, kernels=args.kernels, seed=args.seed, budget_s=args.budget_s,
                           out=args.out, workers=args.workers, shard=args.shard,
                           ops_per_sequence=args.ops_per_sequence)
    s = run_campaign(opts)
    kernels = args.kernels or ("kvkernels.torch_path" if args.backend == "torch" else "kvkernels")
    for case in s.cases:
        d = case["divergence"]
        print(f"FAIL {case['signature']['op']}/{case['signature']['oracle']}/{case['signature']['field']}: "
              f"{d['message']} (seed {case['seed']}, {case['lengths']['original']} -> "
              f"{case['lengths']['minimized']} ops)")
    for path in s.paths:
        print(f"case written: {path}")
    print(f"kvfuzz run: backend={args.backend} kernels={kernels} shard={args.shard[0]}/{args.shard[1]} "
          f"workers={args.workers} sequences={s.sequences} ops={s.ops} ops/s={s.ops_per_s:.0f} "
          f"contract_ops={s.contract_ops} failures={len(s.cases)} elapsed={s.elapsed_s:.1f}s")
    if args.json:
        print(json.dumps({"ops": s.ops, "ops_per_s": s.ops_per_s, "failures": len(s.cases),
                          "cases": [str(p) for p in s.paths], "sequences": s.sequences}))
    return 1 if s.cases else 0


def _case_tier(args, case):
    backend = args.backend or case.get("tier") or "torch"
    select_backend(backend)
    from .backends import make_tier
    from .case import resolve_kernels

    kernels = args.kernels or resolve_kernels(case.get("kernels"), case.get("path"))
    return make_tier(backend, kernels)


def _cmd_replay(args) -> int:
    from .case import load_case

    case = load_case(args.case)
    if args.pytest:
        from .pytest_export import render

        print(render(case, args.case))
        return 0
    tier = _case_tier(args, case)
    from .runner import replay

    d, run = replay(case["pool"], case["ops"], tier, knobs=case.get("knobs"))
    where = f"backend={tier.backend} kernels={tier.kernels_name}"
    if d is None:
        print(f"PASS {args.case}: {len(case['ops'])} ops agree with the spec ({where})")
        return 0
    same = "same signature" if d.signature == case["signature"] else f"NEW signature (case has {case['signature']})"
    print(f"FAIL {args.case}: {d} [{same}; {where}]")
    return 1


def _cmd_minimize(args) -> int:
    import time

    from .case import load_case
    from .minimize import Minimizer

    case = load_case(args.case)
    tier = _case_tier(args, case)
    m = Minimizer(tier, case["signature"], deadline=time.monotonic() + args.budget_s, knobs=case.get("knobs"))
    try:
        config, ops, d = m.run(case["pool"], case["ops"])
    except ValueError as exc:
        print(f"kvfuzz minimize: {args.case}: {exc}", file=sys.stderr)
        return 1
    before = len(case["ops"])
    case.pop("pool")
    case.pop("path", None)
    case.update(config=config.to_json(), ops=ops, divergence=d.to_json())
    case["lengths"]["minimized"] = len(ops)
    out = Path(args.out or args.case)
    out.write_text(json.dumps(case, indent=1) + "\n")
    print(f"minimized {args.case}: {before} -> {len(ops)} ops in {m.replays} replays; written to {out}")
    return 0


def _cmd_check_sync(args) -> int:
    return check_sync_cli.run(args)


def _cmd_mutants(args) -> int:
    select_backend(args.backend)
    from .mutants import MUTANTS
    from .mutants import main as mutants

    if args.list:
        for m in MUTANTS:
            print(f"{m.name:34} kvkernels/{m.file:18} {m.why}")
        return 0
    return mutants(backend=args.backend, budget_s=args.budget_s, only=args.only, seed=args.seed)


def _cmd_bench(args) -> int:
    from .bench import main as bench

    return bench(seconds=args.seconds, tiers=args.tiers, out=args.out)


COMMANDS = {"run": _cmd_run, "replay": _cmd_replay, "minimize": _cmd_minimize, "check-sync": _cmd_check_sync,
            "mutants": _cmd_mutants, "bench": _cmd_bench}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SetupError as exc:
        print(f"kvfuzz {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from .case import CaseError

        if isinstance(exc, CaseError):
            print(f"kvfuzz {args.command}: {exc}", file=sys.stderr)
            return 2
        raise
