"""The fuzzing engine: the typed op language (``ops``), the shared grammar (``shapes``)
and its two generators (``generate``: seeded; ``strategies``: Hypothesis), the
differential runner and its oracles (``runner``, red zones in ``memory``), the
minimizer (``minimize``), case files (``case``) and the campaign (``campaign``); tiers
and kernel sets (``tiers``, launch knobs in ``knobs``).

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
