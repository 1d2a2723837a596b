"""Block sizes and grids a kernel set really launches with: boundaries for sets that name none.

A team's launcher may write its block sizes as literals (``_k[(triton.cdiv(n, 256),)](...,
B=256)``, ``min(triton.cdiv(2048, bs), triton.cdiv(max_pages, 128))``): no module constant
says 256 or 2048, yet that is where its tails and trips are. So before drawing, a worker
launches a few of the set's functions once on scratch tables, watching every launch
(``launches.Seen``): the int constexprs passed (``B=256``), and the grids. From the grids
it infers what the constexprs do not say: an id kernel's block from ``cdiv(n, B)`` programs
for a known ``n``, and the read table's column-program cap (its TARGET) from a batch of one
row whose table is wide enough to need more programs than the cap allows.

The probes are valid, small inputs that write nothing a correct kernel would not (the read
table with every ``seq_lens`` 0): a set that crashes on them crashes on the smoke test's
neighbours too. Free is not probed (a kernel that faults on frees is a finding to report in
a case, not at set-up).
"""

from __future__ import annotations

import math

from .. import lazy
from ..boundary import cdiv

torch = lazy.Torch(globals())  # imported where first used: lazy.py says why

PROBE_IDS = 1000  # ids per id-kernel probe: cdiv(1000, B) programs tell B apart for B in 8 .. 1024
PROBE_COLS = 1 << 19  # read-table columns of the one-row probe: more than cdiv(TARGET, 1) * BLOCK_COLS
MIN_BLOCK = 8  # a constexpr int below this is a flag or a page size, not a block


def _pow2_block(n: int, programs: int) -> int | None:
    """The power of two ``B`` with ``cdiv(n, B) == programs``, if there is one."""
    if programs < 1:
        return None
    b = 1 << max(0, math.ceil(math.log2(n / programs)))
    return b if cdiv(n, b) == programs and b >= MIN_BLOCK else None


def observed_constants(kernels, device) -> tuple[dict[str, int], dict[str, int]]:
    """(blocks, targets) seen at launches, named ``launch:KERNEL.PARAM`` (a constexpr) or
    ``launch:FUNCTION grid`` (inferred from a grid). Empty when nothing launched (torch)."""
    from .. import launches

    long = torch.int64
    blocks: dict[str, int] = {}
    targets: dict[str, int] = {}
    rows = PROBE_IDS + 8
    v = torch.arange(1, PROBE_IDS + 1, dtype=long, device=device)

    def tables():
        v2p = torch.full((rows,), -1, dtype=long, device=device)
        p2v = torch.full((rows,), -1, dtype=long, device=device)
        v2p[0] = p2v[0] = 0
        return v2p, p2v

    probes = [
        ("alloc_bind_inplace", PROBE_IDS, lambda: kernels.alloc_bind_inplace(v.clone(), *tables(), 1)),
        ("bind_inplace", PROBE_IDS, lambda: kernels.bind_inplace(v.clone(), v.clone(), *tables())),
    ]
    cols = PROBE_COLS

    def read_table():
        v2p, _ = tables()
        kernels.build_kv_read_table(
            req_to_token=torch.zeros((1, cols), dtype=torch.int32, device=device),
            req_pool_indices=torch.zeros(1, dtype=long, device=device),
            seq_lens=torch.zeros(1, dtype=long, device=device), v2p=v2p, multiplier=1, page_size=1,
            max_pages=cols, out=torch.zeros((1, cols), dtype=torch.int32, device=device))

    for name, n, call in probes:
        with launches.Seen() as seen, launches.Recorder() as rec:
            try:
                call()
            except Exception:  # noqa: BLE001 - a probe that fails tells nothing; the fuzzing will
                continue
        _collect(seen, blocks)
        for launch in rec.launches[:1]:
            dims = launch.grid_dims or ()
            b = _pow2_block(n, dims[0]) if dims else None
            if b is not None and b not in blocks.values():
                blocks[f"launch:{name} grid"] = b
    with launches.Seen() as seen, launches.Recorder() as rec:
        try:
            read_table()
        except Exception:  # noqa: BLE001
            rec.launches.clear()
    _collect(seen, blocks)
    for launch in rec.launches[:1]:
        dims = launch.grid_dims or ()
        programs = math.prod(dims) if dims else 0  # bs = 1: every program is a column program
        col_block = max([v for v in launch.constexprs.values() if v >= MIN_BLOCK], default=0)
        # A cap shows as fewer programs than the launch's column block would need for the row.
        if programs and col_block and programs < cdiv(cols, col_block):
            targets["launch:build_kv_read_table programs at bs=1"] = programs
    return blocks, targets


def _collect(seen, blocks: dict[str, int]) -> None:
    for kernel, params in seen.constexprs.items():
        for param, values in params.items():
            for value in sorted(values):
                if isinstance(value, int) and value >= MIN_BLOCK:
                    key = f"launch:{kernel}.{param}" if len(values) == 1 else f"launch:{kernel}.{param}={value}"
                    blocks.setdefault(key, value)
