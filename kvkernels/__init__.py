"""kvkernels: the system under test, and the default kernel set of kvfuzz.

Lives here: the Triton kernels (``triton_kernels``), their launchers (``launchers``),
the same semantics in plain torch (``torch_path``, the torch tier), ``DeviceAllocator``
(``allocator``) and its checked mode (``checks``). May import torch, triton and
``kvref`` (its errors and ``PoolConfig`` only); never ``fuzz``: the harness judges this
code and must not be leaned on by it.

The kernel-set functions (DESIGN.md, "kernel set") are importable from here; each
dispatches to the Triton kernels on CUDA tensors or under ``TRITON_INTERPRET=1``, and
to ``kvkernels.torch_path`` otherwise (see ``kvkernels.launchers``).
"""

from .allocator import DeviceAllocator
from .launchers import (
    alloc_bind_inplace,
    bind_inplace,
    build_kv_read_table,
    build_kv_read_table_legacy,
    build_kv_read_table_packed,
    free_unbind_inplace,
    translate_tokens,
)

__all__ = [
    "DeviceAllocator",
    "alloc_bind_inplace",
    "bind_inplace",
    "build_kv_read_table",
    "build_kv_read_table_legacy",
    "build_kv_read_table_packed",
    "free_unbind_inplace",
    "translate_tokens",
]
