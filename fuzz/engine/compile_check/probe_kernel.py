"""The compile child's probe: a kernel of our own that any working Triton compiles for any
target, so a machine that cannot compile (no ptxas, an unknown target) is told apart from a
kernel set that does not. Imported only in the compile child (no ``TRITON_INTERPRET``)."""

import triton
import triton.language as tl


@triton.jit
def kvfuzz_probe(x, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x + i, i, mask=i < n)


SIGNATURE = {"x": "*i32", "n": "i32", "BLOCK": "constexpr"}
CONSTEXPRS = {"BLOCK": "16"}
ATTRS = ["x"]
