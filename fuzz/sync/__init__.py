"""No host synchronisation on the free path (SPEC.md §5; DESIGN.md oracle 5), three ways.

- ``fuzz.sync.static`` (a package; its command line in ``fuzz.sync.cli``):
  ``kvfuzz check-sync [PATH…]``, an AST check that follows the free paths from their
  entry points across modules and reports each synchronising form with its chain
  (docs/check-sync.md);
- ``fuzz.sync.runtime``: ``no_host_sync()`` / ``record_host_syncs()``, dispatch and
  function modes that reason, on the CPU, about what would synchronise on a device;
- ``fuzz.sync.gpu``: the ground truth on CUDA (sync debug mode + CUDA-graph capture);
- ``fuzz.sync.corpus`` and ``fuzz.sync.calibrate``: labelled snippets and the table that
  scores each detector against the GPU.

Submodules are imported on demand, so ``check-sync`` does not pay for importing torch.
May import kvref, kvkernels and torch (the runtime and GPU checks); never ``fuzz.engine``
or ``fuzz.tools``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "check_source": "static",
    "check_file": "static",
    "HostSyncError": "runtime",
    "HostSyncDetector": "runtime",
    "SyncEvent": "runtime",
    "no_host_sync": "runtime",
    "record_host_syncs": "runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
