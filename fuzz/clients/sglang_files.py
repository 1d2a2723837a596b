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
    of the installed distribution the adapter loads; ``{}`` where there is none."""
    from ..engine.tiers import SetupError
    from .loader import locate

    try:
        where = locate("sglang", "sglang", (SUB_POOL, BASE), INSTALL)
    except SetupError:
        return {}
    return {"sglang": where.version,
            "sglang_unified_sub_pool_sha256": hashlib.sha256(where.file(SUB_POOL).read_bytes()).hexdigest(),
            "sglang_base_sha256": hashlib.sha256(where.file(BASE).read_bytes()).hexdigest()}
