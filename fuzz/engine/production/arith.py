"""Integer arithmetic that is exact on the host and on any device (every product stays below
2^63): the seeded hash behind production ops' data, and affine id slices.

An id batch is an affine slice ``lo + (a * (i0 + i) + b) mod span`` for ``i < n``
(unique when ``gcd(a, span) == 1`` and ``i0 + n <= span``), so an op of 64k ids is five
ints in a case file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .. import lazy
from ..boundary import cdiv  # noqa: F401 - the production modules' one cdiv
from ..ops import OUT_SLACK_COLS, Ints

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

INT32_LIMIT = 1 << 31
HASH_P = 2_147_483_647  # 2^31 - 1, prime: every hash value stays below 2^31
HASH_A = 2_654_435_761
HASH_B = 2_246_822_519
HASH_C = 3_266_489_917



ALIGN = 16  # elements: Triton specializes ints on "multiple of 16" and pointers on 16-byte alignment


def aligned_up(n: int) -> int:
    """``n`` rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def out_cols(max_pages: int, aligned: bool) -> int:
    """Columns of a read table's ``out`` buffer: ``max_pages`` and the poisoned slack after them,
    rounded up to a multiple of 16 when ``aligned`` (every row then starts 64-byte aligned and the
    row stride is a multiple of 16: one specialization of the kernel instead of four)."""
    cols = max_pages + OUT_SLACK_COLS
    return aligned_up(cols) if aligned else cols


def hash_int(x: int, seed: int) -> int:
    """The host twin of ``hash_tensor``: a value in [0, 2^31 - 1)."""
    h = (x % HASH_P * HASH_A + seed % HASH_P) % HASH_P
    return (h * HASH_B + HASH_C) % HASH_P


# ``i * HASH_A mod HASH_P`` for rows ``i < len``: the half of ``hash_int(i, seed)`` that does not
# depend on the seed, shared by every per-row draw (each step of a graph op hashes rows 0..bs-1).
_ROW_HALF: list[int] = []
ROW_HALF_MAX = 1 << 16  # rows kept (512 KB of ints at most); longer lists are hashed row by row


def row_hashes(n: int, seed: int) -> list[int]:
    """``[hash_int(i, seed) for i in range(n)]``, the same values: ``(i % P * A + seed % P) % P`` is
    ``(i * A % P + seed % P) % P``, and ``i * A % P`` is computed once per row for every seed."""
    if n > ROW_HALF_MAX:
        return [hash_int(i, seed) for i in range(n)]
    if n > len(_ROW_HALF):
        _ROW_HALF.extend(i * HASH_A % HASH_P for i in range(len(_ROW_HALF), n))
    s, p, b, c = seed % HASH_P, HASH_P, HASH_B, HASH_C
    return [((x + s) % p * b + c) % p for x in _ROW_HALF[:n]]


def hash_tensor(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Elementwise ``hash_int`` of a non-negative int64 tensor (new tensor)."""
    h = x.remainder(HASH_P).mul_(HASH_A).add_(seed % HASH_P).remainder_(HASH_P)
    return h.mul_(HASH_B).add_(HASH_C).remainder_(HASH_P)


VECTOR_ROWS = 128  # from this many rows a seeded draw is computed with torch on the CPU (fewer: Python is faster)
_SAFE = 1 << 62  # ints the vectorized draws take: every intermediate stays inside int64


def vectorizable(n: int, *ints: int) -> bool:
    """Whether a draw over ``n`` rows with these parameters goes through torch (same values)."""
    return n >= VECTOR_ROWS and all(-_SAFE < x < _SAFE for x in ints)


def hash_rows(n: int, seed: int) -> torch.Tensor:
    """``hash_int(i, seed)`` for ``i < n``, an int64 CPU tensor."""
    return hash_tensor(torch.arange(n, dtype=torch.int64), seed)


def affine_ids(desc: Ints, n: int, device) -> torch.Tensor:
    """``lo + (a * (i0 + i) + b) mod span`` for ``i < n``: desc = (lo, span, a, b, i0)."""
    lo, span, a, b, i0 = desc
    i = torch.arange(i0, i0 + n, dtype=torch.int64, device=device)
    return i.mul_(a).add_(b).remainder_(span).add_(lo)


class LazyInts(Sequence):
    """``n`` ints computed from a descriptor on demand (``at(i)`` for ``0 <= i < n``): an op's ids
    as the precondition checks read them, never listed where a bound decides."""

    def __init__(self, desc: Ints, n: int):
        self.desc, self.n = tuple(desc), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.at(i % self.n)

    def at(self, i: int) -> int:
        raise NotImplementedError


class AffineIds(LazyInts):
    """``affine_ids`` on the host, lazily (for the precondition checks): ``summary()`` bounds
    the ids by ``[lo, lo + span)`` and knows them distinct when ``a`` is a unit mod ``span`` and
    the slice fits it, so a 64k-id op is checked in O(1) (``kvref.preconditions.ids``)."""

    def at(self, i: int) -> int:
        lo, span, a, b, i0 = self.desc
        return lo + (a * (i0 + i) + b) % span

    def summary(self) -> tuple[int, int, bool]:
        lo, span, a, b, i0 = self.desc
        return lo, lo + span - 1, span >= 1 and a > 0 and math.gcd(a, span) == 1 and 0 <= i0 and i0 + self.n <= span


class ModIds(LazyInts):
    """``(a * i + b) mod rows`` for ``i < n`` (desc = ``req`` = (a, b, rows)), lazily: a production
    read table's ``req_pool_indices``. ``bounds()`` is [0, rows - 1] (Python's mod of a positive
    ``rows``), so a batch of 4k rows is bounded in O(1) (``preflight.bounds``)."""

    def at(self, i: int) -> int:
        a, b, rows = self.desc
        return (a * i + b) % rows

    def __iter__(self):
        a, b, rows = self.desc
        return ((a * i + b) % rows for i in range(self.n))

    def bounds(self) -> tuple[int, int] | None:
        """(lo, hi) of the ids, or None where it would have to list them."""
        return (0, self.desc[2] - 1) if self.desc[2] >= 1 and self.n else None


def affine_list(desc: Ints, n: int) -> AffineIds:
    """The ids of ``affine_ids``, on the host (a lazy sequence)."""
    return AffineIds(desc, n)


def affine_error(desc: Ints, n: int, lo_min: int, hi: int, what: str) -> str | None:
    """Why an affine slice is not ``n`` unique ids inside [lo_min, hi), or None."""
    if len(desc) != 5:
        return f"{what}: an id slice is (lo, span, a, b, i0), got {desc}"
    lo, span, a, b, i0 = desc
    if n < 0 or span < 1 or i0 < 0 or i0 + n > span:
        return f"{what}: slice [{i0}, {i0 + n}) does not fit span {span}"
    if math.gcd(a, span) != 1 or a <= 0 or b < 0:
        return f"{what}: a={a} is not a unit mod span {span} (ids would repeat)"
    if lo < lo_min or lo + span > hi:
        return f"{what}: ids [{lo}, {lo + span}) leave [{lo_min}, {hi})"
    return None


def unit_near(x: int, span: int) -> int:
    """The first ``a >= max(1, x)`` with ``gcd(a, span) == 1`` (a permutation multiplier)."""
    a = max(1, x) % max(span, 1) or 1
    while math.gcd(a, span) != 1:
        a += 1
    return a


def shrunk_ints(v: int, floor: int = 0) -> list[int]:
    """Smaller values for an int field, the boldest first."""
    out = []
    for c in (floor, v // 2, v - v // 4, *(v - (1 << k) for k in range(v.bit_length() - 2, -1, -1))):
        if floor <= c < v and c not in out:
            out.append(c)
    return out
