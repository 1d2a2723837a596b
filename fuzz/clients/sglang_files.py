"""Which SGLang the allocator adapter runs, found without executing any of it: a case
file's environment records it (``allocators.environment``), and a campaign's parent,
which never imports the code under test, writes case files."""

from __future__ import annotations

import hashlib

PINNED = "0.5.23"
INSTALL = f"pip install sglang=={PINNED} --no-deps"
SUB_POOL = "sglang/srt/mem_cache/allocator/unified_sub_pool.py"
BASE = "sglang/srt/mem_cache/allocator/base.py"


def provenance() -> dict:
    """``{"sglang": version, "sglang_unified_sub_pool_sha256": ..., "sglang_base_sha256": ...}``
    of the installed distribution the adapter loads (found through its metadata, as
    ``loader.locate`` finds it first); ``{}`` where there is none."""
    import importlib.metadata
    from pathlib import Path

    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        return {}
    root = Path(dist.locate_file(""))
    if not all((root / f).is_file() for f in (SUB_POOL, BASE)):
        return {}
    return {"sglang": dist.version,
            "sglang_unified_sub_pool_sha256": hashlib.sha256((root / SUB_POOL).read_bytes()).hexdigest(),
            "sglang_base_sha256": hashlib.sha256((root / BASE).read_bytes()).hexdigest()}
