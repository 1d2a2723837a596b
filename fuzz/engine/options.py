"""What a campaign is asked to do (``kvfuzz run``'s options), and what each option decides
where it says ``auto``: the track, the palette, compile-ahead, the program order, the mode a
case records. ``campaign.Campaign`` runs it; a child is handed it whole (it pickles)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import tracks
from .confirm import DEFAULT_TRIES
from .tiers import TierSpec


@dataclass
class CampaignOptions:
    backend: str = "torch"
    kernels: str | None = None
    seed: int = 0
    budget_s: float = 60.0
    out: str = "kvfuzz-out"
    workers: int = 1
    shard: tuple[int, int] = (0, 1)
    ops_per_sequence: int | None = None  # default: the track's (200 small, 24 production)
    max_sequences: int | None = None  # the shard's sequences, all workers together (slot.share splits them)
    max_ops: int | None = None  # the shard's ops, all workers together, in whole sequences
    stop_on_first: bool = False  # end once the first finding is confirmed, minimized and written
    scale: str = "small"  # the track (``tracks``): "small" or "production"
    check_every: int = 1  # full state checks every N ops (results are still diffed every op)
    hostile: str = "spec"
    op_timeout: float | None = None  # None: auto (10x the longest op seen, 10 s to 60 s)
    reproduce: int = DEFAULT_TRIES  # fresh-child replays of a finding before it is trusted
    program_order: str = "auto"  # the interpreter's program order: auto = random per sequence there
    cache_dir: str | None = None  # Triton's kernel cache for every child (kept between runs: no recompiles)
    palette: str = "auto"  # sizes from a bounded palette per worker: on, off, auto (on for cuda at production scale)
    compile_ahead: str = "auto"  # the workers' specializations compiled before the clock: auto (follow where on), on, follow, off
    ahead_sequences: int = 48  # sequences per worker the compile-ahead scout runs (after its warm-up ones)
    progress_s: float = 30.0
    minimize: bool = True
    minimize_s: float = 0.0  # extra seconds past the budget for minimizing what was found
    shrink_jobs: int | None = None  # candidates that each need a fresh child, run this many at once (None: lanes.default_width)
    stop_after: int | None = None  # stop fuzzing after this many distinct failures (mutant hunts)
    factory: str | None = None  # a tier factory instead of a kernel set (TierSpec)
    factory_arg: str | None = None
    allocator: str | None = None  # MODULE_OR_FILE[:FACTORY] (allocators.py); None: ours
    guided: bool = False  # sequences planned from a corpus (guide.py), small track only
    corpus: str | None = None  # the guided corpus directory (None: OUT/corpus)

    @property
    def track(self) -> tracks.Track:
        if self.guided:
            from . import guide

            return guide.track_for(self.corpus or Path(self.out) / "corpus")
        return tracks.get(self.scale)

    def n_ops(self) -> int:
        return self.ops_per_sequence or self.track.default_ops

    def tier_spec(self) -> TierSpec:
        return TierSpec(self.backend, self.kernels, self.factory, self.factory_arg, self.allocator)

    def child_env(self) -> dict:
        return {"TRITON_CACHE_DIR": str(Path(self.cache_dir).resolve())} if self.cache_dir else {}

    def palette_on(self) -> bool:
        """Whether workers draw sizes from a palette: ``auto`` turns it on where sizes cost compiles
        (compiled kernels, on a track that asks for it: production); the interpreter compiles nothing."""
        if self.palette == "auto":
            return self.backend == "cuda" and self.track.palette_on_gpu
        return self.palette == "on"

    def palette_seed(self, worker: int) -> int | None:
        """Worker ``worker``'s palette seed (None: no palette); its hello carries it to the parent.
        The shard is in it, so worker ``w`` of each shard of a CI matrix draws its own palette."""
        if not self.palette_on():
            return None
        shard_i, shard_n = self.shard
        return (self.seed * 1_000_003 + worker) * shard_n + shard_i

    def compile_ahead_on(self) -> bool:
        """``auto``: where kernels compile and sizes vary (cuda, a track with a palette); never for a
        factory's tier or an allocator (not a plain kernel set); ``on`` elsewhere is the CLI's exit 2."""
        if self.factory or self.allocator or self.compile_ahead == "off":
            return False
        return self.backend == "cuda" and self.track.palette_on_gpu or self.compile_ahead in ("on", "follow")

    def compile_ahead_follows(self) -> bool:
        """``follow``, and ``auto`` where compile-ahead is on: a set that specializes its ints
        (``indep.py``) meets new specializations in most sequences, so a scout of the first
        ones leaves the rest to compile on the clock (one H200, a 40 s campaign: 254 compiles,
        69 % of its seconds, with ``on``; none, and 2.5x the ops, following)."""
        return self.compile_ahead == "follow" or (self.compile_ahead == "auto" and self.compile_ahead_on())

    def order(self) -> str:
        if self.program_order == "auto":
            return "random" if self.backend == "interpret" else "launch"
        return self.program_order

    def mode(self, seed: int | None = None) -> dict:
        """Every option that changes what a sequence runs, as a case records it."""
        mode = {"hostile": self.hostile, "check_every": self.check_every, "program_order": self.order()}
        if seed is not None and mode["program_order"] != "launch":
            mode["order_seed"] = seed
        return mode
