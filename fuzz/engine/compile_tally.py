"""What this process's compiled Triton launches compiled and loaded (``launches`` counts them).

A launch is asynchronous: one that holds the host compiled or loaded its kernel. Which of the
two it was shows in Triton's compilation listener (disk-cache hits and misses), and whether it
added a variant at all in the function's kernel cache; a worker reports both (``compiles``,
``loads``) and the seconds they took, and the head start is measured by them.
"""

from __future__ import annotations

import contextlib

_COMPILE = [0.0, 0]  # seconds spent in compiled launches that compiled a variant, and how many did
COMPILE_MIN_S = 0.2  # a compiled launch that held the host this long compiled (or loaded) its kernel
_LOADS = [0.0, 0]  # seconds in compiled launches whose new variant came from the disk cache, and how many
_HITS = [0, 0]  # disk-cache hits and misses Triton's compilation listener reported (stays 0 without one)


def _variants(fn) -> int | None:
    """How many compiled variants a JITFunction holds (its per-device kernel caches; the first
    item of each ``device_caches`` entry in Triton 3.6 through 3.9), None where that cannot be
    read (the interpreter, another Triton): a launch that adds one compiled (or loaded from the
    on-disk cache) a specialization."""
    caches = getattr(fn, "device_caches", None)
    if caches is None or type(fn).__name__ == "InterpretedFunction":
        return None
    try:
        return sum(len(entry[0]) for entry in list(caches.values()))
    except Exception:  # noqa: BLE001 - a Triton whose caches look different: fall back to timing
        return None


def _note_compile(fn, seconds: float, before: int | None = None, hits: tuple | None = None) -> None:
    """Count an outermost compiled (not interpreted) launch as a compile when it added a variant
    to the function's kernel cache, or, where the cache cannot be read, when it held the host
    for ``COMPILE_MIN_S`` (a launch is asynchronous; only a compile or a load blocks that long).
    A new variant for which Triton's listener reported disk-cache hits and no miss during the
    launch (``hits``: ``_HITS`` before it) is a load instead (``loads``)."""
    if type(fn).__name__ == "InterpretedFunction":
        return
    after = _variants(fn) if before is not None else None
    if (after > before) if after is not None else seconds >= COMPILE_MIN_S:
        loaded = hits is not None and _HITS[0] > hits[0] and _HITS[1] == hits[1]
        tally = _LOADS if loaded else _COMPILE
        tally[0] += seconds
        tally[1] += 1


def compile_seconds() -> float:
    """Host seconds this process spent in launches that compiled (compiled tier only)."""
    return _COMPILE[0]


def compiles() -> int:
    """Launches of this process that compiled a specialization (or loaded it from the disk cache,
    where Triton has no compilation listener to tell the two apart)."""
    return int(_COMPILE[1])


def loads() -> int:
    """Launches of this process whose new specialization was loaded from the disk cache."""
    return int(_LOADS[1])


def load_seconds() -> float:
    """Host seconds this process spent in launches that loaded a specialization from the disk cache."""
    return _LOADS[0]


def _listen_compiles() -> None:
    """Chain a listener into Triton's ``knobs.compilation.listener`` (once) that counts disk-cache
    hits and misses (``_HITS``); nothing where this Triton has no such knob."""
    try:
        from triton import knobs

        previous = knobs.compilation.listener
    except (ImportError, AttributeError):
        return
    if getattr(previous, "_kvfuzz_hits", None) is _HITS:
        return

    def listener(*args, **kwargs):
        _HITS[0 if kwargs.get("cache_hit") else 1] += 1
        if previous is not None:
            previous(*args, **kwargs)

    listener._kvfuzz_hits = _HITS
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        knobs.compilation.listener = listener
