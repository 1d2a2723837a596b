"""Boundary-directed shapes: sizes drawn where a kernel set's own launch constants bite.

A kernel set at production constants (512-column read-table blocks, 1024 target
programs, 128-id blocks) hides its grid, stride and tail bugs from random small
shapes: a strided loop takes a second trip only past ``cdiv(TARGET, bs) * BLOCK_COLS``
columns, a floor-divided grid loses ids only when ``n % BLOCK != 0`` and ``n > BLOCK``.
Kernel sets that expose no ``FUZZ_KNOBS`` cannot be shrunk to show them, so the fuzzer
goes to them instead: it reads the set's module-level integer constants whose names
contain ``BLOCK`` or ``TARGET`` (on the module and on a ``launchers`` submodule, where
``kvkernels`` keeps them), and draws sizes at ``k * B - 1, k * B, k * B + 1`` for each
such ``B``, batch sizes where ``cdiv(TARGET, bs)`` steps, and read-table widths just past
the columns one round of programs covers. A set with no such constants gets a sweep of
powers of two up to 2^14 instead: every boundary of a power-of-two block is then a
candidate.

Every draw comes back with a tag (``"BLOCK_COLS*2+1"``, ``"bs@cdiv(TARGET_BLOCKS,bs)=3"``,
``"2^9-1"``, ``"uniform"``) so a case can say which boundary a size was aimed at.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from types import ModuleType

SWEEP_MAX_LOG2 = 14


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Constants:
    """The launch constants a kernel set declares (or the power-of-two sweep)."""

    blocks: dict = field(default_factory=dict)  # name -> value: names with BLOCK and without TARGET
    targets: dict = field(default_factory=dict)  # name -> value: names with TARGET
    source: str = "module"  # "module", "launches", "module+launches": where they came from; "sweep": none found

    def to_json(self) -> dict:
        return {"source": self.source, "blocks": dict(self.blocks), "targets": dict(self.targets)}

    def block_values(self) -> list[int]:
        return sorted(set(self.blocks.values()))

    def pairs(self) -> list[tuple[str, int, str, int]]:
        """(block name, block, target name, target) for every block/target combination."""
        return [(bn, b, tn, t) for bn, b in sorted(self.blocks.items()) for tn, t in sorted(self.targets.items())]


def _module_constants(mod: ModuleType) -> dict[str, int]:
    """Upper-case ints naming a BLOCK or a TARGET, private ones (``_BLOCK_COLS``) included."""
    found = {}
    for name, value in vars(mod).items():
        if name.startswith("__") or not name.lstrip("_").isupper():
            continue
        if ("BLOCK" in name or "TARGET" in name) and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found[name] = value
    return found


def kernel_constants(kernels: ModuleType, observed: tuple[dict, dict] | None = None) -> Constants:
    """The BLOCK/TARGET constants of a kernel set, read now (knobs applied or not), plus the
    ``observed`` (blocks, targets) its launches showed (``production.observe``; named
    ``launch:...``). ``source`` says where they came from: ``module``, ``launches``, both
    (``module+launches``), or ``sweep`` when there were none (powers of two instead)."""
    found: dict[str, int] = {}
    for mod in (kernels, getattr(kernels, "launchers", None)):
        if isinstance(mod, ModuleType):
            found.update(_module_constants(mod))
    blocks, targets = {}, {}
    for name in sorted(found, key=lambda n: (n.startswith("_"), n)):  # one name per value, public first
        kind = targets if "TARGET" in name else blocks
        if found[name] not in kind.values():
            kind[name] = found[name]
    sources = ["module"] if found else []
    seen_blocks, seen_targets = observed or ({}, {})
    new_blocks = {k: v for k, v in seen_blocks.items() if v not in blocks.values()}
    new_targets = {k: v for k, v in seen_targets.items() if v not in targets.values()}
    if new_blocks or new_targets:
        blocks.update(new_blocks)
        targets.update(new_targets)
        sources.append("launches")
    if not blocks and not targets:
        sweep = {f"2^{j}": 1 << j for j in range(SWEEP_MAX_LOG2 + 1)}
        return Constants(dict(sweep), dict(sweep), "sweep")
    if not targets:  # a block without a target still has trips: one program per block
        targets = {f"{k}(as target)": v for k, v in blocks.items()}
    if not blocks:
        blocks = {f"{k}(as block)": v for k, v in targets.items()}
    return Constants(blocks, targets, "+".join(sources))


def describe(constants: dict) -> str:
    """One line for a run's log: which boundaries it draws around and where each came from."""
    if constants.get("source") == "sweep":
        return ("no BLOCK/TARGET constants and no block sizes seen at launches: drawing sizes from a "
                f"power-of-two sweep up to 2^{SWEEP_MAX_LOG2}")
    parts = [f"{name.removeprefix('launch:')}={value} ({'launch' if name.startswith('launch:') else 'module'})"
             for kind in ("blocks", "targets") for name, value in sorted(constants.get(kind, {}).items())]
    return "drawing sizes around " + ", ".join(parts)


def bs_steps(target: int, hi: int) -> list[int]:
    """The batch sizes ``bs <= hi`` at which ``cdiv(target, bs)`` changes (the first bs of each value)."""
    out = set()
    for k in range(1, target + 1):
        bs = (target - 1) // k + 1  # the smallest bs with cdiv(target, bs) <= k
        if bs <= hi:
            out.add(bs)
        if bs == 1:
            break
    return sorted(out)


# The candidate lists of ``Boundaries.size``, ``bs`` and ``trip_pages``, per constants and range: every
# production read table draws both, and a set with no constants sweeps 15 blocks and targets up to
# 2^14 (listing them was most of a production op's draw). Memoized, the draws are the same; the
# caches are small (a sweep's list holds thousands of candidates: tens of MB at most).
@functools.lru_cache(maxsize=64)
def _size_candidates(blocks: tuple, lo: int, hi: int, small_cap: int) -> tuple[tuple, tuple]:
    cands = []
    for name, b in blocks:
        for k in range(1, hi // b + 2):
            for d in (-1, 0, 1):
                v = k * b + d
                if lo <= v <= hi:
                    cands.append((v, name, k, d))  # its tag built when drawn (``_tagged``): thousands listed, one drawn
            if len(cands) > 4096:
                break
    return tuple(cands), tuple(c for c in cands if c[0] <= small_cap)


def _tagged(cand: tuple) -> tuple[int, str]:
    """A ``_size_candidates`` entry (value, block name, k, d) as a draw: (value, ``NAME*k+d``)."""
    v, name, k, d = cand
    return v, f"{name}*{k}{d:+d}" if d else f"{name}*{k}"


@functools.lru_cache(maxsize=32)
def _bs_candidates(targets: tuple, hi: int, beyond: bool) -> tuple[tuple[int, str], ...]:
    cands = []
    for name, t in targets:
        top = max(hi, t) if beyond else hi
        for bs in bs_steps(t, top):
            for d in (-1, 0):
                if 1 <= bs + d <= top:
                    cands.append((bs + d, f"bs@cdiv({name},bs)={cdiv(t, bs + d)}{'-1' if d else ''}"))
    return tuple(cands)


@functools.lru_cache(maxsize=256)
def _trip_candidates(pairs: tuple, bs: int, hi: int) -> tuple[tuple[int, str], ...]:
    cands = []
    for bn, b, tn, t in pairs:
        cp = cdiv(t, bs)
        for m in (1, 2):
            for d in (-1, 0, 1):
                v = m * cp * b + d
                if 1 <= v <= hi:
                    cands.append((v, f"{m}*cdiv({tn},bs)*{bn}{d:+d}"))
    return tuple(cands)


class Boundaries:
    """Boundary draws for one kernel set's constants; every draw returns (value, tag)."""

    def __init__(self, constants: Constants, rng: random.Random, *, aim: float = 0.8):
        self.c = constants
        self.rng = rng
        self.aim = aim  # probability that a draw aims at a boundary rather than uniform
        self._blocks, self._targets = tuple(sorted(constants.blocks.items())), tuple(sorted(constants.targets.items()))
        self._pairs = tuple(constants.pairs())
        self._small_cap = 4 * max(constants.block_values() or [1]) + 1

    # ---- plain sizes ---------------------------------------------------------------
    def _candidates(self, lo: int, hi: int) -> tuple[tuple, tuple]:
        """(every block multiple +-1 in [lo, hi], those that are small multiples), memoized per
        constants across generators: a generator asks for the same ranges over and over."""
        return _size_candidates(self._blocks, lo, hi, self._small_cap)

    def size(self, lo: int, hi: int) -> tuple[int, str]:
        """A size in [lo, hi]: a block multiple +-1 (power of two +-1 otherwise), or uniform."""
        if hi < lo:
            raise ValueError(f"empty range [{lo}, {hi}]")
        rng = self.rng
        if rng.random() < self.aim:
            if self.c.source != "sweep" and rng.random() < 0.75:
                cands, small = self._candidates(lo, hi)
                if cands:
                    # Small multiples are where a second program/trip first appears: weight them up.
                    return _tagged(rng.choice(small if small and rng.random() < 0.6 else cands))
            j = rng.randint(0, max(0, hi.bit_length()))
            k = rng.choice((1, 1, 1, 3, 5))
            d = rng.choice((-1, 0, 1))
            v = k * (1 << j) + d
            if lo <= v <= hi:
                return v, f"{k}*2^{j}{d:+d}" if k != 1 else f"2^{j}{d:+d}"
        return rng.randint(lo, hi), "uniform"

    # ---- batch sizes ---------------------------------------------------------------
    def bs(self, hi: int, *, beyond: bool = True) -> tuple[int, str]:
        """A batch size where ``cdiv(TARGET, bs)`` steps (bs - 1, bs), up to ``hi``; the
        steps above ``hi`` up to TARGET itself too when ``beyond`` (cdiv = 1 starts there)."""
        rng = self.rng
        if rng.random() < self.aim:
            cands = _bs_candidates(self._targets, hi, beyond)
            if cands:
                return rng.choice(cands)
        return self.size(1, hi)

    # ---- read-table widths -----------------------------------------------------------
    def trip_pages(self, bs: int, hi: int) -> tuple[int, str]:
        """A column count around the columns one round of a bs-sized strided grid covers:
        ``m * cdiv(TARGET, bs) * BLOCK + d`` (m = 1, 2; d = -1, 0, 1), or a block multiple +-1."""
        rng = self.rng
        cands = _trip_candidates(self._pairs, bs, hi)
        if cands and rng.random() < self.aim:
            return rng.choice(cands)
        return self.size(1, hi)

    def min_trip_pages(self, bs: int) -> list[tuple[int, str]]:
        """For each block/target pair: the fewest columns that give a program a second trip at this bs."""
        return [(cdiv(t, bs) * b + 1, f"cdiv({tn},bs)*{bn}+1") for bn, b, tn, t in self.c.pairs()]
