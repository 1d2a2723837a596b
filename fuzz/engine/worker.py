"""What runs inside a supervised child (``supervise.Child``): a fuzz worker, or an
executor that replays op lists for its parent.

Both build their tier themselves (so the parent never imports the kernel set) and
report through their parent's queue or pipe. An exception that escapes the engine here
is the harness's own (exit 3); everything the kernels do wrong is a finding or a fault.
"""

from __future__ import annotations

import sys
import time
import traceback

from .supervise import CONTRACT, EXIT_DEVICE, EXIT_HARNESS, EXIT_RESTART, IDLE, OPS, SEQ, Beat


def set_order(tier, mode: dict, seed: int | None = None) -> None:
    """The program order of a sequence on the interpreter (``launches``; compiled launches
    keep the GPU's own): ``mode["program_order"]``, drawn from the sequence's seed."""
    if tier.backend == "interpret":
        from .launches import set_program_order

        set_program_order(mode.get("program_order", "launch"), mode.get("order_seed", 0) if seed is None else seed)


def _knobs_of(tier, past: dict) -> dict | None:
    """The launch knobs an earlier sequence of a worker ran with, decided as the worker did."""
    how = past.get("knobs_from")
    if not how:
        return past.get("knobs")
    from . import tracks
    from .knobs import choose

    worker = None if how.get("worker_seed") is None else choose(tier.kernels, how["worker_seed"])
    return tracks.get(how["track"]).choose_knobs(tier, how["seed"], worker)


def _tier(spec, report, beat: Beat) -> object | None:
    from .tiers import SetupError, select_backend

    try:
        select_backend(spec.backend)  # (the launch hook imports Triton: the backend first)
        _clocked(beat)  # from the smoke test on: its compiles and a head start's waits are no hang
        tier = spec.make()
    except SetupError as exc:
        report(str(exc))
    except Exception as exc:  # noqa: BLE001 - a kernel set that cannot even be imported
        report(f"--kernels {spec.name}: {type(exc).__name__}: {exc}")
    else:
        from .health import fault_of

        exc = fault_of(tier.device)
        if exc is None:
            return tier
        report(f"--kernels {spec.name}: the device faulted while the kernel set was loaded or smoke-tested: {exc}")
    return None


HEARD_WAIT_S = 30.0


def _heard(beat: Beat) -> None:
    """Wait (``HEARD_WAIT_S`` at most) until the parent has this worker's hello: it is sent by the
    queue's feeder thread, and a worker that crashes in its first op before that thread runs takes
    it along, leaving the parent unable to rebuild its ops (the crash would be a set-up failure)."""
    from .supervise import HEARD

    end = time.monotonic() + HEARD_WAIT_S
    while not beat.slots[HEARD] and time.monotonic() < end:
        time.sleep(0.002)


def _clocked(beat: Beat) -> None:
    """Compiled launches off the op's clock: a compile is not a hang (``launches.clock``)."""
    from .launches import clock

    clock(beat.launching, beat.launched)


def fuzz_main(beat: Beat, opts, worker: int, start_k: int, deadline_wall: float, queue, warm: bool = True,
              ops_before: int = 0) -> None:
    """Fuzz sequences ``start_k, start_k + 1, ...`` of this worker until the deadline or its
    share of the work limits (``stop_reason``; ``ops_before``: what earlier children of its
    position ran). ``warm``: on a GPU, run the warm-up sequences first (a restarted worker
    does not)."""
    beat.slots[SEQ] = start_k - 1  # dead before its first sequence: the parent resumes at start_k
    from .procfs import process_age

    entered, t0 = process_age(), time.monotonic()  # seconds from this process's start to here (its imports)
    from . import head_start

    # Before the tier (and any CUDA context): the first compiles, in parallel children (head_start.py).
    head = head_start.begin(opts, worker, start_k, warm) if head_start.wanted(opts) else None
    headed = time.monotonic()
    tier = _tier(opts.tier_spec(), lambda text: queue.put(("setup", worker, text)), beat)
    if tier is None:
        return
    made = time.monotonic()  # the kernel set imported, the device up, the smoke test run
    from .generate import WARMUP_BASE, warmup_seed
    from .health import charged, fault_of
    from .knobs import choose as choose_knobs
    from .launches import compile_seconds, compiles, load_seconds, loads
    from .production.ahead import preload_ahead
    from .slot import sequence_seed, stop_reason
    from .tiers import SetupError, count_launches
    from .verdict import RunStats, is_cuda_error, poisoned, unrun_kind

    loaded = preload_ahead(tier)  # what the campaign compiled before the clock, into this process's kernels
    track = opts.track  # the guided track when --guided (guide.py)
    palette_seed = opts.palette_seed(worker)  # None: sizes drawn freely (the palette bounds a GPU's compiles)
    try:
        info = track.worker_info(tier, palette_seed=palette_seed)  # what the parent rebuilds ops from
    except SetupError as exc:
        queue.put(("setup", worker, str(exc)))
        return
    for note in (head, loaded):
        if note:
            info["notes"] = [*info.get("notes", ()), note]
    hello = {"kernels": tier.kernels_name, "skips": sorted(tier.allocator_skips),  # skips: ops its allocator lacks
             "rules": sorted(tier.spec_rules), **info}  # rules: the spec rules it declares
    # Where the worker's set-up went (the summary's timeline): its start (a fork, or a fresh
    # interpreter importing torch) to its entry; the tier (kernel set, device, smoke test); the rest.
    hello["setup_s"] = {"setup_entry": entered, "setup_head_start": headed - t0, "setup_tier": made - headed,
                        "setup_rest": time.monotonic() - made}
    queue.put(("hello", worker, hello))
    _heard(beat)
    stats, sequences, sent, scenarios = RunStats(), 0, time.monotonic(), {}
    elements = 0  # result elements diffed against the oracle
    deadline = time.monotonic() + max(0.0, deadline_wall - time.time())
    # On a GPU, a new launch shape is a Triton compile (seconds): each worker keeps one knob
    # set for its life and warms up on every page size before its fuzzing is timed.
    gpu = str(tier.device).startswith("cuda")
    worker_knobs = choose_knobs(tier.kernels, opts.seed * 7919 + worker) if gpu else None
    warm_left = track.gpu_warmup if gpu and warm else 0
    sent_knobs: object = ()  # the knobs last told to the parent (they hold until the next message)
    steady = None  # (wall time, ops) when the timed part began

    def report(final: bool = False):
        queue.put(("stats", worker, {"ops": stats.ops, "contract_ops": stats.contract_ops, "by_kind": stats.by_kind,
                                     "hostile": stats.hostile, "sequences": sequences, "by_scenario": scenarios,
                                     "launches": count_launches(), "final": final, "steady": steady,
                                     "compile_s": compile_seconds(), "compiles": compiles(), "loads": loads(),
                                     "load_s": load_seconds(), "not_applicable": not_applicable,
                                     "elements": elements, "unrun_by_kind": unrun_by_kind,
                                     "head_start": head_start.state(),
                                     "now": (time.time(), stats.ops)}))

    not_applicable: dict[str, int] = {}  # what a sequence could not check, and why (e.g. graph replay on a torch path)
    unrun_by_kind: dict[str, int] = {}  # ops that did not run, by kind (a far op with no memory for it)
    k = start_k
    stopped = None
    try:
        while (stopped := stop_reason(opts, worker, k, ops_before + beat.slots[OPS], deadline,
                                      lambda: track.exhausted(tier))) is None:
            if warm_left:
                warm_left -= 1
                seed = warmup_seed(track.gpu_warmup - 1 - warm_left)
                beat.sequence(k - 1, seed)  # takes no sequence number: a restart after it resumes at k
            else:
                if steady is None:
                    steady = (time.time(), stats.ops)
                seed = sequence_seed(opts, worker, k)
                beat.sequence(k, seed)
            set_order(tier, opts.mode(), seed)
            knobs = track.choose_knobs(tier, seed, worker_knobs)
            if knobs != sent_knobs:
                queue.put(("knobs", worker, knobs))
                sent_knobs = knobs
            seq = track.run_sequence(tier, seed, opts.n_ops(), deadline=deadline, beat=beat, knobs=knobs,
                                     hostile=opts.hostile, check_every=opts.check_every, palette_seed=palette_seed)
            d, scenario = seq.divergence, seq.scenario
            fault = None if poisoned(d) else fault_of(tier.device)  # an asynchronous fault: this sequence's
            if fault is not None and d is None:
                d = charged(seq.ops, fault)
            elements += seq.elements
            for note in getattr(seq.run, "notes", ()):
                why = note.split(": ", 1)[-1][:200] if note.startswith("step ") else note[:200]
                not_applicable[why] = not_applicable.get(why, 0) + 1
                kind = unrun_kind(note)
                if kind is not None:
                    unrun_by_kind[kind] = unrun_by_kind.get(kind, 0) + 1
            sequences += 1
            scenarios[scenario] = scenarios.get(scenario, 0) + 1
            stats.merge(seq.stats)
            beat.slots[CONTRACT] = stats.contract_ops
            if seed < WARMUP_BASE:
                k += 1
            if d is not None:
                if opts.stop_on_first:  # the parent halts this worker at the finding: its stats go first
                    report()
                queue.put(("finding", worker, {"seed": seed, "scenario": scenario, "config": seq.config.to_json(),
                                               "ops": [op.to_json() for op in seq.ops[: d.step + 1]],
                                               "divergence": d.to_json(), "knobs": knobs, "extra": seq.extra,
                                               "k": k if seed < WARMUP_BASE else k - 1}))
            if poisoned(d) or fault is not None:
                report()
                sys.exit(EXIT_RESTART)
            if d is not None and opts.stop_on_first:  # fuzz no further: the same work on any machine, not
                stopped = "first-finding"            # however long the parent's halt takes to arrive
                break
            if time.monotonic() - sent > 2.0:
                report()
                sent = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - the harness's own bug (exit 3), unless the device faulted
        report()
        if is_cuda_error(exc):  # surfaced outside any op (a sequence's setup): a crash of this worker
            traceback.print_exc()
            sys.stderr.flush()
            sys.exit(EXIT_DEVICE)
        queue.put(("harness", worker, traceback.format_exc()))
        sys.exit(EXIT_HARNESS)
    beat.phase(IDLE)
    report(final=True)
    queue.put(("done", worker, k, stopped))


def executor_main(beat: Beat, tier_spec, conn) -> None:
    """Replay the jobs the parent sends, one answer each: ``("result", (divergence JSON or
    None, notes))``, ``("unknown", (why, exiting))`` for a job that could not run here (its history
    faulted the device, an op was not applicable: neither a pass nor a failure),
    ``("poisoned", (text, reused))`` for a device error met outside any op (the parent reruns
    the job in a fresh process), ``("setup", text)`` or ``("harness", traceback)``. A CUDA error
    is never the harness's: after each job the device is checked (``health``), and a child
    whose device faulted answers, then leaves (``notes["exiting"]``)."""
    tier = _tier(tier_spec, lambda text: conn.send(("setup", text)), beat)
    if tier is None:
        return
    from .production import far
    from .tiers import SetupError
    from .verdict import is_cuda_error

    far.ROOM_WAIT_S[0] = far.CONFIRM_ROOM_WAIT_S  # a replay waits for the memory a campaign's far op holds
    beat.phase(IDLE)
    jobs = 0
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        jobs += 1
        try:
            kind, payload, exiting = _job(beat, tier, job)
        except SetupError as exc:
            conn.send(("setup", str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - sorted: a device error, or the harness's own bug
            if is_cuda_error(exc):  # met outside any op (red zones, snapshots): not this job's to answer
                conn.send(("poisoned", (f"{type(exc).__name__}: {exc}", jobs > 1)))
            else:
                conn.send(("harness", traceback.format_exc()))
            return
        beat.phase(IDLE)
        try:
            conn.send((kind, payload))
        except (BrokenPipeError, EOFError, OSError):
            return  # the parent went away (it is shutting down): nobody to answer
        if exiting:
            return


def _job(beat: Beat, tier, job) -> tuple[str, object, bool]:
    """One replay (after the history it asks for): ("result", (verdict, notes)) or ("unknown",
    (why, exiting)), and ``exiting``: whether this process must leave (its device faulted)."""
    import kvref

    from .dispatch import replay
    from .health import charged, fault_of
    from .kinds import parse_ops
    from .verdict import poisoned, unrun_notes

    mode = job.get("mode") or {}
    for k, past in enumerate(job.get("history") or ()):  # what the dead worker ran before
        beat.sequence(-1 - k, past.get("seed") or 0)
        set_order(tier, mode, past.get("seed"))
        d, _ = replay(kvref.PoolConfig.from_json(past["config"]), parse_ops(past["ops"]), tier,
                      knobs=_knobs_of(tier, past), hostile=mode.get("hostile", "spec"),
                      check_every=mode.get("check_every", 1), strict_knobs=False, beat=beat)
        exc = fault_of(tier.device) if not poisoned(d) else d
        if exc is not None:
            return "unknown", (f"its history faulted the device before the case ran (sequence {k}): {exc}", True), True
    beat.sequence(0, 0)
    set_order(tier, mode)
    ops = parse_ops(job["ops"])
    d, run = replay(kvref.PoolConfig.from_json(job["config"]), ops, tier,
                    knobs=job["knobs"], hostile=mode.get("hostile", "spec"), beat=beat,
                    strict_knobs=job.get("strict_knobs", True), check_every=mode.get("check_every", 1))
    exc = fault_of(tier.device)
    if exc is not None and d is None:
        d = charged(ops, exc)
    exiting = exc is not None or poisoned(d)
    notes = {"dropped_knobs": getattr(run, "dropped_knobs", []), "exiting": exiting}
    unrun = unrun_notes(run)
    if d is None and unrun:  # it passed, but not every op ran: no verdict
        return "unknown", ("; ".join(unrun[:3]), exiting), exiting
    return "result", (None if d is None else d.to_json(), notes), exiting
