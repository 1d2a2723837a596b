"""Preloaded by the fork server of interpreted children: Triton imported under
``TRITON_INTERPRET=1``, so ``triton.language``'s own ``@jit`` functions are interpreted."""

from . import preload

preload(interpret=True)
