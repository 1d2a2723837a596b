"""Whether a far op's memory pool (torch.cuda.MemPool) gives its gigabytes back to the device alone
(without emptying the whole cache), and which mode FarMemory settles in. GPU only::

    PYTHONPATH=. python3 benchmarks/mempool_probe.py
"""

from __future__ import annotations

import argparse
import time

import torch

from fuzz.engine.production.far import FarMemory


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.empty(1 << 28, device=dev)  # an ordinary cached block (1 GiB) that must stay cached
    del x
    r0 = torch.cuda.memory_reserved(dev)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool, dev.index):
        big = torch.empty(8 << 30, dtype=torch.uint8, device=dev)
    r1 = torch.cuda.memory_reserved(dev)
    del big
    t = time.perf_counter()
    del pool
    dt = time.perf_counter() - t
    r2 = torch.cuda.memory_reserved(dev)
    print(f"mempool probe: reserved before {r0 / 2**30:.2f} GiB, with pool {r1 / 2**30:.2f}, "
          f"after del pool {r2 / 2**30:.2f} ({dt * 1e3:.1f} ms)")
    mem = FarMemory(dev)
    with mem.allocating():
        big = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    del big
    mem.release(4 << 30)
    print("FarMemory mode after release:", FarMemory.MODE[0], "reserved", torch.cuda.memory_reserved(dev) / 2**30)


if __name__ == "__main__":
    main()
