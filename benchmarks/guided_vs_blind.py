"""Guided against blind generation on the interpreter, the same seeds and budgets.

Four parts, each printed as a table row and written as JSON (``--out``):

* ``throughput``: in one process, ``--ops`` ops of small-track sequences blind (the seeded
  generator, no features) and guided (``guide.GuidedTrack``: features, corpus, mutations; and
  ``guided-rerun``, without its known reads, where ``--modes`` names it), seeds from 0, one
  sequence of each mode in turn: ops per CPU second (process time: the machine is shared), the CPU seconds
  guided spent planning (picking, mutating, the mutations' shadow runs on the spec) and the
  features reached per 1,000 ops (blind's measured by the same collector, off the clock);
* ``overhead``: the same blind sequences bare and with features collected (``overhead``);
* ``hook``: the value features' host cost per launch (describing it, collecting its features),
  on the launches of blind sequences, CPU microseconds (what the CUDA tier pays per launch);
* ``fixture``: time and ops to kill ``mutants.FIXTURES`` (read tables wrong only on a third
  or later trip over a partial last block, or over one ending exactly at the row's last live
  page), blind and guided, per seed;
* ``kill-ops``: the fixtures' work to kill (ops, CPU seconds), in one process, no campaign,
  up to ``--max-ops`` per run: what the wall-clock ``fixture`` part measures, without its noise;
  and where those ops went (``where_spent``: per pool and plan kind, the share and ops per kill);
* ``mutants``: the same for a subset of the catalogue (``--mutants``);
* ``stones``: what the mutations make of a stepping stone, offline (the shadow runs alone, no
  kernel): after a seed's fresh phase, the entry whose read table reached the most trips, and
  of ``--plans`` mutations aimed at that feature, how many make a row long enough for one more.

    TRITON_INTERPRET=1 .venv/bin/python -m benchmarks.guided_vs_blind --out benchmarks/results/FILE.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import tempfile
import time
from collections import Counter


def _track(mode: str, root: str):
    """The track a mode runs: ``blind`` (the seeded generator), ``guided`` (``guide.GuidedTrack``),
    ``guided-rerun`` (guided with every read run again: no ``guide.KnownReads``, what it saves),
    ``guided-between`` (a fresh sequence's program budget checked between ops only, not per launch)."""
    from fuzz.engine import guide, tracks

    if mode not in MODES:
        raise SystemExit(f"mode {mode!r}: choose from {', '.join(MODES)}")
    if mode == "blind":
        return tracks.get("small")
    return guide.GuidedTrack(root, known_reads=mode != "guided-rerun", launch_budget=mode != "guided-between")


MODES = ("blind", "guided", "guided-rerun", "guided-between")


def throughput(n_ops: int, ops_per_seq: int = 100, modes=("blind", "guided")) -> list[dict]:
    """Each mode's sequences (seeds from 0, ``ops_per_seq`` ops, guided's as its plans cut them)
    until ``n_ops``, one sequence of each mode in turn (so a load on the shared machine falls
    on every mode alike). Ops are every op drawn and run (spec, checks, the target's result);
    ``known`` of them were reads whose target result ``guide.KnownReads`` knew (not run on the
    target again), so ``target_ops_per_cpu_s`` counts only the others (blind has none)."""
    from fuzz.engine import features, guide, tracks
    from fuzz.engine.tiers import make_tier

    tier = make_tier("interpret")
    blind = tracks.get("small")
    blind.run_sequence(tier, 10**6, 20)  # warm the interpreter's caches
    with tempfile.TemporaryDirectory() as root:
        state = {m: {"track": _track(m, f"{root}/{m}"), "ops": 0, "known": 0, "cpu": 0.0, "plan_cpu": 0.0,
                     "seen": set(), "seed": 0} for m in modes}
        code = features.CodeCoverage(features.files_under_test(tier))
        while any(st["ops"] < n_ops for st in state.values()):
            for name, st in state.items():
                if st["ops"] >= n_ops:
                    continue
                track, seed = st["track"], st["seed"]
                t0 = time.process_time()
                if name != "blind":  # picking and mutating an entry, its shadow runs: guidance's own cost
                    track.plan(tier, seed)
                    st["plan_cpu"] += time.process_time() - t0
                seq = track.run_sequence(tier, seed, ops_per_seq)
                st["cpu"] += time.process_time() - t0
                st["ops"] += len(seq.ops)
                st["known"] += getattr(seq.run, "known_hits", 0)
                if name == "blind":  # its features, off the clock: the same sequence again, collected
                    traced, code.trace_kernels = guide.code_schedule(seed)  # guided's schedule, kernels too
                    col = features.Collector(code if traced else None)
                    with col:
                        again = blind.run_sequence(tier, seed, ops_per_seq)
                    col.add_run(again.run)
                    st["seen"] |= col.ids()
                st["seed"] += 1
        rows = []
        for name, st in state.items():
            seen = st["seen"] if name == "blind" else st["track"].corpus.features
            ops, cpu = st["ops"], st["cpu"]
            rows.append({"mode": name, "ops": ops, "known": st["known"], "sequences": st["seed"], "cpu_s": round(cpu, 2),
                         "plan_cpu_s": round(st["plan_cpu"], 2), "ops_per_cpu_s": round(ops / cpu, 1),
                         "target_ops_per_cpu_s": round((ops - st["known"]) / cpu, 1),
                         "features": len(seen), "features_per_1000_ops": round(1000 * len(seen) / ops, 1)})
    return rows


def overhead(n_ops: int, ops_per_seq: int = 100, rounds: int = 2, backend: str = "interpret",
             deferred: bool | None = None, kernels: str | None = None) -> list[dict]:
    """The cost of collecting features alone: the same blind sequences (seeds from 0) run bare
    and under the guided track's collection schedule (value features on every launch, code
    coverage and the interpreted kernel bodies as ``guide.code_schedule`` says of the sequences
    run so far), and on CUDA ``deferred`` too (value features made at each op's end, as the guided
    track collects there), in every order in turn (ABBA for two), CPU seconds, with each
    round's cost (each round its own seeds, so the feature memo meets new shapes throughout) (a GPU's CPU seconds include its synchronizing waits: one round's figure is noisy); what a guided run pays on top of the ops it runs (its ops differ from blind's, so ``throughput`` alone cannot say)."""
    from fuzz.engine import features, guide, tracks
    from fuzz.engine.tiers import make_tier

    tier = make_tier(backend, kernels)
    track = tracks.get("small")
    track.run_sequence(tier, 10**6, 20)
    # On CUDA the guided track collects value features only (launch hook): no code tracing.
    code = features.CodeCoverage(features.files_under_test(tier)) if backend == "interpret" else None
    if backend != "interpret":  # every seed once, untimed: its kernels' compiles would fall on whichever mode ran first
        for seed in range(rounds * (max(1, n_ops // ops_per_seq) + 1)):
            track.run_sequence(tier, seed, ops_per_seq)
    if deferred is None:  # as the guided track collects there (on the interpreter a row's lengths may change after its launch)
        deferred = backend == "cuda"
    modes = ("bare", "collected") + (("deferred",) if deferred else ())
    cpu, per_round, orders = dict.fromkeys(modes, 0.0), [], list(itertools.permutations(modes))
    ops = i = seed = 0  # i: the sequences run, which the schedule counts (as the track does); each round
    for _ in range(rounds):  # runs seeds of its own: shapes the feature memo has not met, as a campaign's next ops
        before = dict(cpu)
        while ops < n_ops * (_ + 1):
            for mode in orders[i % len(orders)]:  # every order in turn: no mode always first (the memo's misses) or last
                t0 = time.process_time()
                if mode == "bare":
                    seq = track.run_sequence(tier, seed, ops_per_seq)
                else:
                    traced = False
                    if code is not None:
                        traced, code.trace_kernels = guide.code_schedule(i)
                    col = features.Collector(code if traced else None, deferred=mode == "deferred")
                    with col:
                        seq = track.run_sequence(tier, seed, ops_per_seq)
                    col.add_run(seq.run)
                cpu[mode] += time.process_time() - t0
            ops += len(seq.ops)
            seed, i = seed + 1, i + 1
        bare = cpu["bare"] - before["bare"]
        per_round.append({m: round(1 - bare / (cpu[m] - before[m]), 3) for m in modes[1:]})
    return [{"mode": m, "ops": ops, "cpu_s": round(c, 2), "ops_per_cpu_s": round(ops / c, 1)} for m, c in cpu.items()] + [
        {**{f"{m}_cost": round(1 - cpu["bare"] / cpu[m], 3) for m in modes[1:]}, "collection_cost": round(1 - cpu["bare"] / cpu["collected"], 3),
         "per_round": per_round}]


def hook(n_seqs: int = 8, ops_per_seq: int = 100, rounds: int = 7, backend: str = "interpret") -> list[dict]:
    """The value features' cost per launch on the host, as the CUDA tier pays it (where no code is
    traced): the launches of ``n_seqs`` blind sequences recorded on ``backend``, then handed to a
    ``features.Collector`` (one per sequence) in their order, the shape memo emptied first (so a
    shape is new the first time it comes, as in a fresh worker), two ways: ``full``, each described
    again (``launches._describe``, what the hook does for an observer that takes a ``Launch``) and
    called with it; ``light``, handed over as ``launches._run_light`` does when collectors alone
    observe (``Collector.light``); CPU microseconds per launch, the least of ``rounds``. On the
    interpreter twice: with the launches' CPU tensors, and with each replaced by a ``meta`` one of
    its shape (as a GPU tensor: its ``seq_lens`` not read, no trip features); on CUDA, as recorded.
    A loop of the hook alone runs warm; in a campaign each launch finds it cold
    (``profile_collect.py --attribute`` times it there)."""
    import torch

    from fuzz.engine import features, launches, tracks
    from fuzz.engine.tiers import make_tier

    tier, track, per_seq = make_tier(backend), tracks.get("small"), []
    for seed in range(n_seqs):
        with launches.Recorder() as rec:
            track.run_sequence(tier, seed, ops_per_seq)
        per_seq.append(rec.launches)
    n = sum(map(len, per_seq))

    def meta(v):
        return torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v

    def full(col, fn, args, kwargs, dims, run):
        launch = launches._describe(fn, args, kwargs, run)
        launch.grid_dims = dims
        col(launch)

    def light(col, fn, args, kwargs, dims, run):
        col.light(fn, args, kwargs, dims)

    rows = []
    variants = (("cpu", lambda v: v), ("meta (as cuda)", meta)) if backend == "interpret" else ((backend, lambda v: v),)
    for label, conv in variants:
        seqs = [[(ln.fn, tuple(map(conv, ln.args)), {**{k: conv(v) for k, v in ln.kwargs.items()}, "grid": ln.grid, "warmup": False},
                  ln.grid_dims, ln.run) for ln in lns] for lns in per_seq]
        row = {"tensors": label, "launches": n}
        for way, call in (("full", full), ("light", light)):
            best = float("inf")
            for _ in range(rounds):
                getattr(features, "_MEMO", {}).clear()
                t0 = time.process_time()
                for lns in seqs:
                    col = features.Collector()
                    for launch in lns:
                        call(col, *launch)
                best = min(best, time.process_time() - t0)
            row[f"{way}_us_per_launch"] = round(1e6 * best / n, 1)
        rows.append(row)
    return rows


def kills(names: list[str], seeds: list[int], budget_s: float) -> list[dict]:
    from fuzz.tools.mutants import FIXTURES, MUTANTS, hunt

    by_name = {m.name: m for m in (*MUTANTS, *FIXTURES)}
    rows = []
    for name in names:
        for seed in seeds:
            for guided in (False, True):
                r = hunt(by_name[name], "interpret", budget_s, seed=seed, guided=guided)
                if r.killed and "timeout" in str(r.signature):  # an op slowed past the auto timeout by
                    print(json.dumps({"mutant": name, "seed": seed, "guided": guided, "retried": str(r.signature),
                                      "ops": r.ops}), flush=True)  # a loaded machine: not the bug; once more
                    r = hunt(by_name[name], "interpret", budget_s, seed=seed, guided=guided)
                rows.append({"mutant": name, "seed": seed, "mode": "guided" if guided else "blind", "killed": r.killed,
                             "seconds": round(r.seconds, 1), "ops": r.ops,
                             "signature": None if r.signature is None else str(r.signature)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def target_tier(name: str, backend: str):
    """The tier a kill-ops target names: ``kernels=PATH`` (a kernel set, as ``--kernels``),
    ``allocator=PATH:FACTORY`` (an allocator over our kernels, as ``--allocator``), else a mutant
    of the catalogue or ``mutants.FIXTURES``."""
    from fuzz.engine import allocators
    from fuzz.engine.tiers import make_tier
    from fuzz.tools.mutants import mutant_tier_named

    kind, _, where = name.partition("=")
    if kind == "kernels":
        return make_tier(backend, where)
    if kind == "allocator":
        return allocators.attach(make_tier(backend), where)
    return mutant_tier_named(name, backend)


def ops_to_kill(names: list[str], seeds: list[int], max_ops: int, ops_per_seq: int = 200,
                modes=("blind", "guided"), backend: str = "interpret") -> list[dict]:
    """Work to kill, in one process and without a campaign (no start-up, no minimizing, no op
    timeouts a loaded machine trips): the sequences a one-worker campaign of seed ``s`` runs
    (sequence seeds ``s * 1_000_003 + k``, 200 ops each, guided's as its plans cut them), blind and guided (a
    fresh corpus each), until the first divergence or ``max_ops``; ops and CPU seconds."""
    rows = []
    for name in names:
        tier = target_tier(name, backend)
        for seed in seeds:
            for mode in modes:
                with tempfile.TemporaryDirectory() as root:
                    track = _track(mode, root)
                    ops, k, seq, t0, known = 0, 0, None, time.process_time(), 0
                    found, spent, where = None, Counter(), None
                    while ops < max_ops and found is None:
                        s = seed * 1_000_003 + k
                        kind = "blind" if mode == "blind" else _plan_kind(track.plan(tier, s)["how"])
                        try:
                            seq = track.run_sequence(tier, s, ops_per_seq)
                        except Exception as exc:  # a mutant that crashes the run itself: killed too
                            found, k = f"raised {type(exc).__name__}", k + 1
                            break
                        ops, k, known = ops + len(seq.ops), k + 1, known + getattr(seq.run, "known_hits", 0)
                        c = seq.config  # a chain's config has no one grow direction
                        where = f"{getattr(c, 'grow', 'chain')} {'lazy' if getattr(c, 'lazy', False) else 'eager'}|{kind}"
                        spent[where] += len(seq.ops)
                        found = None if seq.divergence is None else str(seq.divergence.signature)
                rows.append({"mutant": name, "seed": seed, "mode": mode, "killed": found is not None, "ops": ops,
                             "known": known, "sequences": k, "seconds": round(time.process_time() - t0, 3),
                             "signature": found, "spent": dict(spent), "killed_in": where if found else None})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _plan_kind(how: list) -> str:
    return "fresh" if how == ["fresh"] else "reconfig" if "reconfig" in how else "mutation"


def where_spent(rows: list[dict]) -> list[dict]:
    """Per mutant and mode, where the ops to kill went: per pool (grow direction, laziness) and plan
    kind (blind; guided's fresh, reconfigured and other mutated sequences), the share of all ops and
    the ops spent there per kill made there. A bug that kills in one kind of pool only shows how
    much of a mode's work went there, and how much each op there was worth."""
    out = []
    for name in dict.fromkeys(r["mutant"] for r in rows):
        for mode in MODES:
            mine = [r for r in rows if r["mutant"] == name and r["mode"] == mode and "spent" in r]
            spent, kills = Counter(), Counter(r["killed_in"] for r in mine if r["killed_in"])
            for r in mine:
                spent.update(r["spent"])
            total = sum(spent.values())
            for key in sorted(spent, key=spent.get, reverse=True) if total else ():
                out.append({"mutant": name, "mode": mode, "where": key, "share": round(spent[key] / total, 3),
                            "kills": kills[key], "ops_per_kill": round(spent[key] / kills[key]) if kills[key] else None})
    return out


def _reused_blind(path: str, names: list[str], seeds: list[int]) -> list[dict]:
    """Blind's kill-ops rows of ``names`` x ``seeds`` from an earlier JSON, marked ``reused``; every
    one must be there (a partial reuse would compare different seeds)."""
    with open(path) as f:
        old = {(r["mutant"], r["seed"]): r for r in json.load(f).get("kill_ops", []) if r["mode"] == "blind"}
    missing = [(n, s) for n in names for s in seeds if (n, s) not in old]
    if missing:
        raise SystemExit(f"--reuse-blind {path}: no blind row for {missing[:3]}")
    return [{**old[(n, s)], "reused": path} for n in names for s in seeds]


def stones(name: str, seeds: list[int], n_plans: int) -> list[dict]:
    """Per seed (a one-worker campaign's sequence seeds, as ``ops_to_kill``): run the fresh phase
    (``guide.SEED_ENTRIES`` sequences of ``guide.FRESH_OPS`` ops), take the entry holding the highest
    ``trips|read_table_kernel|N|...`` feature, and mutate it ``n_plans`` times aimed at that feature
    (its focus, goal and shadow run as ``GuidedTrack.plan`` gives them); a plan counts when its
    shadow run has a table op, within its run length, reading a row at least one trip longer
    than the stone's (its goal: the row's pages plus the pages short of one more trip)."""
    import random

    from fuzz.engine import guide, mutations
    from fuzz.engine.shapes import TABLE_OPS
    from fuzz.tools.mutants import mutant_tier_named

    tier = mutant_tier_named(name, "interpret")
    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as root:
            track = guide.GuidedTrack(root)
            for k in range(guide.SEED_ENTRIES):
                track.plan(tier, seed * 1_000_003 + k)
                track.run_sequence(tier, seed * 1_000_003 + k, 200)
            stones_ = [(g[3], e, f) for e in track.corpus.entries for f, g in (e.get("goals") or {}).items()
                       if f.startswith("trips|read_table_kernel|")]
            if not stones_:
                rows.append({"seed": seed, "stone": None})
                continue
            trips, entry, why = max(stones_, key=lambda t: (t[0], -t[1]["goals"][t[2]][1]))
            focus, goal = entry["where"][why], entry["goals"][why]
            shadow = track._shadow(tier, 10**9 + seed, entry)
            hits, how = 0, {}
            for i in range(n_plans):
                stream, marks, _, done = mutations.mutate(entry, entry, random.Random(i), tier.kernels, focus=focus,
                                                        shadow=shadow, goal=guide.aim(guide.frontier(entry, why, random.Random(-i)), why,
                                                                                      track.corpus.counts, random.Random(-i)))
                ops, config, _ = shadow(stream, marks)
                longest = max((-(-len(r) // config.page_size) for op in ops[: focus + 1 + guide.TAIL]
                               if isinstance(op, TABLE_OPS) for r in op.rows), default=0)
                hit = longest >= goal[0] + goal[1]
                hits += hit
                for d in done:
                    how.setdefault(d, [0, 0])[hit] += 1
            rows.append({"seed": seed, "stone": why, "goal": goal, "knobs": entry.get("knobs"), "plans": n_plans,
                         "one_more_trip": hits, "by_mutation (misses, hits)": how})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def medians(rows: list[dict]) -> list[dict]:
    """Per mutant and mode: kills, and the median ops and seconds to kill over the seeds (a miss
    counts as more than anything seen: its ops and seconds, so a median over misses is a
    lower bound, marked ``>``). Ops first: on a shared machine wall seconds are noise."""
    out = []
    for name in dict.fromkeys(r["mutant"] for r in rows):
        for mode in MODES:
            mine = [r for r in rows if r["mutant"] == name and r["mode"] == mode]
            if not mine:
                continue
            ops = sorted((r["ops"] if r["killed"] else float("inf"), r["ops"]) for r in mine)
            secs = sorted((r["seconds"] if r["killed"] else float("inf"), r["seconds"]) for r in mine)
            mid = len(mine) // 2  # the upper median of an even count: no credit for half a kill
            out.append({"mutant": name, "mode": mode, "killed": sum(r["killed"] for r in mine), "runs": len(mine),
                        "median_ops": ops[mid][0] if ops[mid][0] != float("inf") else f">{ops[mid][1]}",
                        "median_s": secs[mid][0] if secs[mid][0] != float("inf") else f">{secs[mid][1]}"})
    return out


def main() -> int:
    from fuzz.engine.tiers import select_backend

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=3000, help="ops per mode for the throughput part (per round: overhead)")
    p.add_argument("--rounds", type=int, default=2, help="overhead: rounds of --ops ops per mode, each's cost listed")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=60.0, help="per hunt")
    p.add_argument("--max-ops", type=int, default=4000, help="per run of the kill-ops part")
    p.add_argument("--mutants", default="read-table-stride-skips-blocks,grow-down-start-off-by-one",
                   help="comma list of catalogue mutants (empty: none)")
    p.add_argument("--parts", default="throughput,fixture,mutants")
    p.add_argument("--plans", type=int, default=100, help="stones: mutations per stone")
    p.add_argument("--fixtures", default="read-table-third-trip-partial-edge,read-table-third-trip-full-edge",
                   help="comma list of mutants.FIXTURES, kernels=PATH (a kernel set) or allocator=PATH:FACTORY (kill-ops)")
    p.add_argument("--note", default="", help="what else ran on the machine (a shared CPU: say so)")
    p.add_argument("--modes", default="blind,guided", help=f"kill-ops, throughput: the modes run (comma list of {', '.join(MODES)})")
    p.add_argument("--reuse-blind", metavar="JSON",
                   help="kill-ops: blind's rows taken from an earlier run's JSON (same mutants, seeds, --max-ops) "
                        "instead of run again: the blind generator's streams are unchanged, so its ops are too")
    p.add_argument("--backend", choices=("interpret", "cuda", "torch"), default="interpret",
                   help="the tier (cuda: the overhead, hook and kill-ops parts only; value features alone; torch: kill-ops of an allocator)")
    p.add_argument("--kernels", help="overhead: the kernel set measured (as --kernels; default ours)")
    p.add_argument("--out")
    args = p.parse_args()
    select_backend(args.backend)
    parts = args.parts.split(",")
    from fuzz.environment import environment

    result = {"machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
              "cpus": __import__("os").cpu_count(), "note": args.note, "args": vars(args),
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "environment": environment()}
    if "overhead" in parts:
        result["overhead"] = overhead(args.ops, rounds=args.rounds, backend=args.backend, kernels=args.kernels)
        for row in result["overhead"]:
            print(json.dumps(row), flush=True)
    if "hook" in parts:
        result["hook"] = hook(backend=args.backend)
        for row in result["hook"]:
            print(json.dumps(row), flush=True)
    if "throughput" in parts:
        result["throughput"] = throughput(args.ops, modes=args.modes.split(","))
        for row in result["throughput"]:
            print(json.dumps(row), flush=True)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if "fixture" in parts:
        result["fixture"] = kills(args.fixtures.split(","), seeds, args.budget_s)
    if "kill-ops" in parts:
        names, modes = args.fixtures.split(","), args.modes.split(",")
        reused = _reused_blind(args.reuse_blind, names, seeds) if args.reuse_blind else []
        result["kill_ops"] = reused + ops_to_kill(names, seeds, args.max_ops, backend=args.backend,
                                                  modes=[m for m in modes if not (reused and m == "blind")])
        result["kill_ops_medians"] = medians(result["kill_ops"])
        result["kill_ops_where"] = where_spent(result["kill_ops"])
        for row in result["kill_ops_where"] + result["kill_ops_medians"]:
            print(json.dumps(row), flush=True)
    if "stones" in parts:
        result["stones"] = stones(args.fixtures.split(",")[0], seeds, args.plans)
    if "mutants" in parts and args.mutants:
        result["mutants"] = kills(args.mutants.split(","), seeds, args.budget_s)
    result["medians"] = medians(result.get("fixture", []) + result.get("mutants", []))
    for row in result["medians"]:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
