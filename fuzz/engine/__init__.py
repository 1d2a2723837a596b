"""The fuzzing engine: one engine, several tracks (``tracks``: small, production, compile).

Leaf modules first (docs/architecture.md's table; ``tests/test_layout.py`` holds the engine to
importing only downwards): ``verdict`` (what a run concluded), ``oplang``/``ops`` (the op
records), the primitives (``memory`` red zones, ``boundary``, ``knobs``, ``vector_oracle``,
``signatures``, ``launches``: the one hook on Triton's launch path, ``tiers``, ``zygote``: how a child
starts, ``supervise``: child processes), the spec side and the generators (``spec_side``, ``shapes``, ``generate``,
``strategies``), the small runner (``runner``), the production track's parts
(``production/``), the tracks, ``kinds``/``dispatch`` (every op kind; replay on the owning
track), ``case``/``minimize``/``slot``, ``worker`` (inside a child), and on top ``options``
(what a campaign is asked), ``confirm`` (a finding made trustworthy), ``summary`` and ``campaign``.

May import ``kvref``, ``kvkernels``, torch and hypothesis; never ``fuzz.tools`` or the
CLI. Importing this package imports no Triton: a kernel set (and with it Triton) is
loaded by ``tiers.make_tier`` after ``tiers.select_backend`` has chosen the tier.

The names below are the stable API for scripts and exported regression tests.
"""

import importlib

_API = {"Case": "case", "CaseError": "case", "Signature": "case", "load_case": "case", "Op": "ops",
        "OpError": "ops", "parse_ops": "kinds", "Divergence": "verdict", "replay": "dispatch", "SetupError": "tiers",
        "Tier": "tiers", "make_tier": "tiers", "select_backend": "tiers"}
__all__ = sorted([*_API, "PoolConfig"])


def __getattr__(name: str):
    """Imported on first use, so that ``import fuzz.engine`` loads no kernel set (and no
    Triton) before the tier is chosen."""
    if name == "PoolConfig":
        from kvref import PoolConfig

        return PoolConfig
    if name in _API:
        return getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
