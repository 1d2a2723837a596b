"""Preloaded by the fork server of every other child (compiled kernels, the torch tier):
Triton imported without ``TRITON_INTERPRET``, so ``triton.language``'s ``@jit`` functions compile."""

from . import preload

preload(interpret=False)
