"""A head start's scout (``head_start.py``): what a small-track worker will launch, recorded and
not run. It runs the smoke test's calls and the worker's first sequences on CPU tensors under
``launches.record_only``, on a runner whose target's results are ignored (garbage: nothing ran),
so the spec's outcomes drive the generator as in the worker's own run."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings


@contextlib.contextmanager
def _route_cpu_to_kernels(module):
    """While entered, a launcher module that sends CPU tensors to a torch path unless its
    ``INTERPRET`` flag is set (ours: ``kvkernels.launchers``) sends them to its kernels, where
    ``record_only`` takes them: the scout's tensors are CPU ones."""
    flags = []
    for name in ("alloc_bind_inplace", "build_kv_read_table"):
        g = getattr(getattr(module, name, None), "__globals__", None)
        if g is not None and isinstance(g.get("INTERPRET"), bool) and not any(f is g for f, _ in flags):
            flags.append((g, g["INTERPRET"]))
            g["INTERPRET"] = True
    try:
        yield
    finally:
        for g, was in flags:
            g["INTERPRET"] = was


def _scout_track():
    """The small track with a runner whose target never ran (``record_only``): its divergences
    mean nothing, and the spec's outcome goes on to the generator as in a real run. Its
    allocator runs unchecked: a checked one reads the tables its kernels never wrote and refuses
    the op (a free of pages it finds unbound), where the real one launches."""
    from .runner import PoolRun
    from .tracks.small import SmallTrack
    from .verdict import Divergence

    class ScoutRun(PoolRun):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.target.checked = False

        def _step_on(self, i, op, spec_out):
            try:
                return super()._step_on(i, op, spec_out)
            except Divergence:
                return spec_out

        def finish(self) -> None:
            pass

    class ScoutTrack(SmallTrack):
        def runner(self, config, tier, **kw):
            return ScoutRun(config, tier, **kw)

    return ScoutTrack()


def scout(module, name: str, seeds, knobs, *, n_ops: int, hostile: str, check_every: int, on_launch,
          deadline: float | None = None) -> dict:
    """Record what a small-track worker with ``knobs`` launches for the smoke test and ``seeds``
    (``on_launch(launch)`` for each, none of them run): each sequence as the worker's track runs
    it (``SmallTrack.run_sequence``), on a scout's runner; counts of what ran."""
    from .knobs import apply as apply_knobs
    from .launches import record_only
    from .tiers import Tier, smoke_calls

    tier, track = Tier("cuda", name, module, "cpu"), _scout_track()
    done = {"sequences": 0, "ops": 0, "cut": 0, "skipped": 0}
    with record_only(on_launch), _route_cpu_to_kernels(module), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _, call in smoke_calls(module, "cpu"):
            with contextlib.suppress(Exception):
                call()
        for seed in seeds:
            if deadline is not None and time.monotonic() > deadline:
                done["skipped"] += 1
                continue
            try:
                seq = track.run_sequence(tier, seed, n_ops, knobs=knobs, hostile=hostile, check_every=check_every)
                done["ops"] += len(seq.ops)
            except Exception:  # noqa: BLE001 - the target's garbage broke an op: this sequence ends here
                done["cut"] += 1
            done["sequences"] += 1
        apply_knobs(module, None)
    return done


def where_now(thread) -> str:
    """Where ``thread`` is now: its innermost frame outside libraries (``stacks.where``)."""
    import traceback

    from .stacks import where

    frame = sys._current_frames().get(thread.ident)
    frames = [f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(traceback.extract_stack(frame))] if frame else []
    return where(frames) or "(no frame)"
