"""A bounded palette of sizes per worker, so a kernel set that specializes its ints recompiles rarely.

Triton compiles a new variant of a kernel for every combination of its int arguments'
classes (equal to 1, divisible by 16, neither) and of its constexprs; a foreign set whose
launchers derive those from the sizes (``tests/fixtures/kernels/foreign/indep.py``)
recompiles whenever the production generator draws sizes it has not drawn before, and on
a GPU a short campaign then spends much of its time compiling. A ``Palette`` fixes, per
worker, a finite set of sizes (about two per octave, plus the small block boundaries) and
of batch sizes (about sixteen, at the cdiv(TARGET, bs) steps); ``PaletteBoundaries`` snaps
each ordinary boundary draw to the nearest palette value, keeping the boundary that value
was aimed at in its tag (``palette:BLOCK*2+1``), and keeps the ordinary draw in a small
share of draws (``explore``), so a long run still meets sizes the palette lacks.

What it bounds is values. Triton specializes an int argument on its class only (1, a
multiple of 16, neither), so a set whose only specializations are those classes compiles
one variant per class tuple of its arguments, which boundary draws reach with or without a
palette; a set whose constexprs follow the sizes (a block of ``next_power_of_2(n)``, a
size passed as ``tl.constexpr``) compiles one per value, and that is what a palette caps.

A palette is a pure function of (palette seed, constants, limits) and every draw takes
its randomness from the sequence's own RNG: a sequence's ops depend on its seed,
``scale_info`` (where the palette's seed and ``explore`` travel) and the hostile mode,
never on what ran before, so a dead worker's ops and a finding's history rebuild from the
worker's hello as before.
"""

from __future__ import annotations

import bisect
import json
import random

from ..boundary import Boundaries, Constants
from .limits import ScaleLimits

EXPLORE = 0.1  # the share of draws that leave the palette (the ordinary boundary draw)
OCTAVE_DRAWS = 2  # palette sizes drawn per octave [2^(j-1), 2^j]
MIN_TOP_LOG2 = 20  # octaves up to at least 2^20 (the production pool), more where the limits go further
BS_DRAWS = 16  # batch sizes drawn for the bs palette (duplicates fold: "about" sixteen)
SMALL_MULTIPLES = (1, 2)  # k * BLOCK +- 1 for these k: where a second (third) program or trip first appears


class Palette:
    """The sizes and batch sizes one worker's production sequences draw from, each with the
    tag of the boundary it was drawn at. Built from its seed, the constants and the limits
    only (``of`` memoizes it: a worker rebuilds it for every sequence)."""

    def __init__(self, palette_seed: int, constants: Constants, limits: ScaleLimits):
        self.seed = palette_seed
        rng = random.Random(palette_seed)
        b = Boundaries(constants, rng)
        top = max(MIN_TOP_LOG2, limits.pool_pages.bit_length(), limits.max_row_tokens.bit_length(),
                  limits.max_ids.bit_length())
        sizes: dict[int, str] = {}
        for j in range(top + 1):
            for _ in range(OCTAVE_DRAWS):
                v, tag = b.size(max(1, 2 ** (j - 1)), 2 ** j)
                sizes.setdefault(v, tag)
        for name, block in sorted(constants.blocks.items()):  # the small boundaries, whatever the draws gave
            for k in SMALL_MULTIPLES:
                for d in (-1, 0, 1):
                    if k * block + d >= 1:
                        sizes.setdefault(k * block + d, f"{name}*{k}{d:+d}" if d else f"{name}*{k}")
        bss: dict[int, str] = {}
        for _ in range(BS_DRAWS):
            v, tag = b.bs(limits.max_step_bs)
            bss.setdefault(v, tag)
        self.sizes = sorted(sizes.items())
        self.bss = sorted(bss.items())
        self._size_keys = [v for v, _ in self.sizes]
        self._bs_keys = [v for v, _ in self.bss]

    @classmethod
    def of(cls, palette_seed: int, constants: Constants, limits: ScaleLimits) -> Palette:
        key = (palette_seed, json.dumps(constants.to_json(), sort_keys=True), limits)
        if key not in _PALETTES:
            if len(_PALETTES) >= 64:  # a process meets a handful (one per worker and constants)
                _PALETTES.clear()
            _PALETTES[key] = cls(palette_seed, constants, limits)
        return _PALETTES[key]

    def to_json(self) -> dict:
        return {"seed": self.seed, "sizes": [v for v, _ in self.sizes], "bs": [v for v, _ in self.bss]}

    @staticmethod
    def _inside(values: list[tuple[int, str]], keys: list[int], lo: int, hi: int) -> list[tuple[int, str]]:
        return values[bisect.bisect_left(keys, lo): bisect.bisect_right(keys, hi)]

    def sizes_in(self, lo: int, hi: int) -> list[tuple[int, str]]:
        return self._inside(self.sizes, self._size_keys, lo, hi)

    def bss_in(self, lo: int, hi: int) -> list[tuple[int, str]]:
        return self._inside(self.bss, self._bs_keys, lo, hi)


_PALETTES: dict = {}


class PaletteBoundaries(Boundaries):
    """``Boundaries`` over a palette: a size (a batch size) inside the requested range is, in
    ``1 - explore`` of the draws, the palette value nearest to the ordinary draw; an explore
    draw, or a range the palette has no value in, is the ordinary draw itself. Snapping an
    ordinary draw (rather than picking any palette value that fits) keeps the distribution of
    sizes the ordinary draws have: the palette is log-spaced, and a uniform pick over it
    would halve the typical pool, batch and read table. The read-table widths
    (``trip_pages``, ``min_trip_pages``) are functions of bs and the constants, so finite
    given the bs palette; their fallbacks come here through ``size``."""

    def __init__(self, constants: Constants, rng: random.Random, palette: Palette, *, explore: float = EXPLORE,
                 aim: float = 0.8):
        super().__init__(constants, rng, aim=aim)
        self.palette = palette
        self.explore = explore

    def _snap(self, fits: list[tuple[int, str]], drawn: tuple[int, str]) -> tuple[int, str]:
        if not fits or self.rng.random() < self.explore:
            return drawn
        v = drawn[0]
        i = bisect.bisect_left(fits, (v, ""))
        near = min(fits[max(0, i - 1): i + 1], key=lambda f: (abs(f[0] - v), f[0]))
        return near[0], f"palette:{near[1]}"

    def size(self, lo: int, hi: int) -> tuple[int, str]:
        drawn = super().size(lo, hi)  # raises on an empty range
        return self._snap(self.palette.sizes_in(lo, hi), drawn)

    def bs(self, hi: int, *, beyond: bool = True) -> tuple[int, str]:
        # The ordinary draw reaches the cdiv steps up to TARGET itself when ``beyond``: so may the palette's.
        top = max([hi, *self.c.targets.values()]) if beyond else hi
        drawn = super().bs(hi, beyond=beyond)
        return self._snap(self.palette.bss_in(1, top), drawn)


def palette_info(palette_seed: int, explore: float = EXPLORE) -> dict:
    """What ``scale_info`` carries of a palette (``info["palette"]``): its seed and ``explore``."""
    return {"seed": palette_seed, "explore": explore}


def boundaries(constants: Constants, rng: random.Random, palette: Palette | None = None,
               explore: float = EXPLORE) -> Boundaries:
    """The boundary draws of a generator: over ``palette`` when there is one, else the ordinary ones."""
    if palette is None:
        return Boundaries(constants, rng)
    return PaletteBoundaries(constants, rng, palette, explore=explore)


def from_info(info: dict, constants: Constants, limits: ScaleLimits) -> tuple[Palette | None, float]:
    """(the palette, explore) ``scale_info`` asks for (``info["palette"]``), or (None, EXPLORE) for none."""
    spec = info.get("palette")
    if not spec:
        return None, EXPLORE
    return Palette.of(int(spec["seed"]), constants, limits), float(spec.get("explore", EXPLORE))
