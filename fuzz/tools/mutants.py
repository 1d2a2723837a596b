"""The mutant catalogue: realistic bugs planted in our kernels and allocator.

Each mutant is a set of exact text substitutions in one source file of kvkernels
(``triton_kernels.py``, ``allocator.py`` or ``chain.py``), applied to a temporary copy that is loaded
as its own module, so the fuzzer meets the bug exactly as a developer would write it.
A substitution that no longer matches the source is an error, never a silent no-op
(tests check every mutant still applies). Kill rate = mutants the fuzzer finds within
the budget; for each, the time to kill and the minimized case length are reported.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import kvkernels

from ..engine.tiers import Tier, make_tier
from ..engine.verdict import Signature

SRC = Path(kvkernels.__file__).resolve().parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # "triton_kernels.py", "allocator.py", or "chain.py" / "float_pool.py" (docs/spec.md §6's chains)
    subs: tuple  # ((old, new), ...)
    why: str


MUTANTS = (
    Mutant("free-forgets-p2v-tombstone", "triton_kernels.py",
           (("    tl.store(p2v_ptr + p, tombstone, mask=v_ok & (p >= 0) & (p < p2v_rows))", "    pass"),),
           "the fused free tombstones v2p only; the physical page keeps its owner"),
    Mutant("free-unmasked-double-free", "triton_kernels.py",
           (("tl.store(p2v_ptr + p, tombstone, mask=v_ok & (p >= 0) & (p < p2v_rows))",
             "tl.store(p2v_ptr + p, tombstone, mask=v_ok)"),),
           "a double free reads p == -1 and writes p2v[-1], outside the table"),
    Mutant("read-table-no-negative-guard", "triton_kernels.py",
           (("page = tl.where(tok < 0, 0, tok) // PAGE_SIZE", "page = tok // PAGE_SIZE"),),
           "Triton's // truncates: -1 // 1 == -1 reads v2p[-1]"),
    Mutant("read-table-no-max-pages-clamp", "triton_kernels.py",
           (("n_pages = tl.minimum((seq_len + PAGE_SIZE - 1) // PAGE_SIZE, max_pages)",
             "n_pages = (seq_len + PAGE_SIZE - 1) // PAGE_SIZE"),),
           "a seq_len past max_pages writes columns past the table's width"),
    Mutant("read-table-stride-skips-blocks", "triton_kernels.py",
           (("        start += col_stride * UNROLL\n", "        start += col_stride * UNROLL + BLOCK\n"),),
           "the strided loop steps too far and leaves live columns unwritten"),
    Mutant("alloc-bind-descending", "triton_kernels.py",
           (("    p = offs + start_phys\n", "    p = start_phys + N - 1 - offs\n"),),
           "alloc_bind hands out the new frontier pages in descending order"),
    Mutant("bind-stores-p-in-p2v", "triton_kernels.py",
           (("    tl.store(p2v_ptr + p, v, mask=lane & (p >= 0) & (p < p2v_rows))\n\n\n@triton.jit(do_not_specialize=[\"N\", \"v2p_rows\", \"p2v_rows\"])\ndef free_unbind_kernel",
             "    tl.store(p2v_ptr + p, p, mask=lane & (p >= 0) & (p < p2v_rows))\n\n\n@triton.jit(do_not_specialize=[\"N\", \"v2p_rows\", \"p2v_rows\"])\ndef free_unbind_kernel"),),
           "the slow-path bind writes the wrong value into p2v"),
    Mutant("packed-ignores-kv-start", "triton_kernels.py",
           (("        pos = kv_start + cols\n", "        pos = cols\n"),),
           "the CSR read table forgets each row's kv_start offset"),
    Mutant("translate-no-negative-guard", "triton_kernels.py",
           (("    t = tl.where(nonneg, t, 0)\n", ""), ("    ok = lane & nonneg & (page < v2p_rows)", "    ok = lane & (page < v2p_rows)")),
           "a negative token id reads v2p[-1] instead of going to the padding sink"),
    Mutant("alloc-takes-holes-from-back", "allocator.py",
           (("phys = torch.cat((self.holes[:d], fresh))", "phys = torch.cat((self.holes.flip(0)[:d], fresh))"),
            ("            self.holes = self.holes[d:]\n", "            self.holes = self.holes.flip(0)[d:].flip(0)\n")),
           "the slow path takes holes from the back of the list, not the front"),
    Mutant("free-sorts-holes", "allocator.py",
           (("self.holes = torch.cat((self.holes, phys))", "self.holes = torch.cat((self.holes, phys)).sort().values"),),
           "the lazy free sorts holes (an extra kernel, and a different reuse order)"),
    Mutant("flush-ignores-in-flight-writer", "allocator.py",
           (("if (src <= dst if self.up else src >= dst) or p2v[src] in pinned:",
             "if (src <= dst if self.up else src >= dst):"),),
           "compaction moves a page the in-flight forward is still writing"),
    Mutant("flush-reuses-sources-early", "allocator.py",
           (("            if self._reader_in_flight():\n                batch.append(src)",
             "            if False:\n                batch.append(src)"),),
           "moved-out pages become holes while a reader may still read them"),
    Mutant("eager-compaction-wrong-order", "allocator.py",
           (("kept = sorted(p for p in freed if p < new_wm)", "kept = sorted((p for p in freed if p < new_wm), reverse=True)"),),
           "eager compaction pairs the lowest survivor with the highest freed page"),
    Mutant("grow-down-start-off-by-one", "allocator.py",
           (("start = self.watermark if self.up else self.watermark - new + 1",
             "start = self.watermark if self.up else self.watermark - new"),),
           "grow-down allocation starts one page below the frontier"),
    # A chain of pools over one byte buffer (kvkernels/chain.py, float_pool.py; reached by chain seeds only)
    Mutant("chain-memo-ignores-gate", "chain.py",
           (("        return i, self.state_key(), tuple(None if j is None else self.gates[j] for j in credited)\n",
             "        return i, self.state_key(), ()\n"),),
           "the capacity memo is keyed on the pools' state alone: a neighbour's gate that opens or closes "
           "with no alloc or free in between leaves schedulable capacity stale"),
    Mutant("chain-flush-ignores-closed-gate", "allocator.py",
           (("        gated = self.gate_open is not None and not self.gate_open()\n",
             "        gated = False\n"),),
           "a flush compacts (moves pages) while the pool's move gate is closed"),
    Mutant("chain-ladder-flushes-itself", "chain.py",
           (("            self.flush(j, True)\n", "            self.flush(pool, True)\n"),),
           "the relief ladder flushes the short pool itself instead of its growth-side neighbour"),
    Mutant("chain-frontier-off-by-one", "chain.py",
           (("        return (self.gap(i) + extra) // self.bytes_per_page[i]\n",
             "        return (self.gap(i) + extra) // self.bytes_per_page[i] + 1\n"),),
           "a pool's room counts one page more than the bytes up to its neighbour's frontier hold"),
    Mutant("chain-joint-counted-twice", "chain.py",
           (("            bands = sum(max(0, self.frontiers(b)[0] - self.frontiers(a)[1]) for a, b in zip(shown, shown[1:]))\n",
             "            bands = sum(self.gap(i) for i in shown)\n"),),
           "joint capacity sums each pool's gap, counting the band the two pools share twice"),
    Mutant("float-holes-from-one-end", "float_pool.py",
           (('        self.next_end = "high" if self.next_end == "low" else "low"\n', ""),),
           "a float takes holes from the low end of its list every time, not from its two ends in turn"),
    Mutant("float-make-room-ignores-gate", "float_pool.py",
           (("        if self._blocked() or gap >= min_bytes or live == 0", "        if gap >= min_bytes or live == 0"),),
           "a float's make_room moves pages while its move gate is closed"),
    Mutant("chain-walk-stops-at-empty-float", "chain.py",
           (("        while 0 <= j < len(self.members) and self.transparent(j):\n            j += step\n", ""),),
           "the walk along the chain stops at an empty float instead of seeing through it, so an end "
           "pool cannot grow past the float's parked span"),
)


# Not in the catalogue (kill rates stay comparable): bugs that need a rare combination of
# features, to measure guided generation against blind (benchmarks/guided_vs_blind.py).
FIXTURES = (
    Mutant("read-table-third-trip-full-edge", "triton_kernels.py",
           (("    while start < n_pages:\n        cols = start + tl.arange(0, BLOCK)\n        if UNROLL == 2:",
             "    trip = 0\n    while start < n_pages:\n        cols = start + tl.arange(0, BLOCK)\n        if UNROLL == 2:"),
            ("            _read_table_cols(cols, n_pages, req_row_ptr,",
             "            _read_table_cols(cols, tl.where((trip >= 2) & (start + BLOCK == n_pages), n_pages - 1, n_pages),"
             " req_row_ptr,"),
            ("        start += col_stride * UNROLL\n\n", "        trip += 1\n        start += col_stride * UNROLL\n\n")),
           "a program's third (or later) trip whose block ends exactly at the row's last live page "
           "leaves that page's entry unwritten"),
    Mutant("read-table-third-trip-partial-edge", "triton_kernels.py",
           (("    while start < n_pages:\n        cols = start + tl.arange(0, BLOCK)\n        if UNROLL == 2:",
             "    trip = 0\n    while start < n_pages:\n        cols = start + tl.arange(0, BLOCK)\n        if UNROLL == 2:"),
            ("            _read_table_cols(cols, n_pages, req_row_ptr,",
             "            _read_table_cols(cols, tl.where((trip >= 2) & (start + BLOCK > n_pages), n_pages - 1, n_pages),"
             " req_row_ptr,"),
            ("        start += col_stride * UNROLL\n\n", "        trip += 1\n        start += col_stride * UNROLL\n\n")),
           "a program's third (or later) trip over a partial last block leaves the row's last live page unwritten"),
)


ALLOCATOR_FILES = ("allocator.py", "chain.py", "float_pool.py")  # host-side mutants: every tier runs them


def _chain_mutant(chain_module=None, float_module=None):
    """The mutated chain as an allocator module: our ``DeviceAllocator`` with its
    ``chain_class`` swapped for the mutant's ``DeviceChain`` (or for ours building the
    mutant's ``DeviceFloat``)."""
    import types

    from kvkernels.allocator import DeviceAllocator
    from kvkernels.chain import DeviceChain

    chain = chain_module.DeviceChain if chain_module is not None else \
        type("DeviceChain", (DeviceChain,), {"float_class": float_module.DeviceFloat})
    source = chain_module or float_module
    module = types.ModuleType(source.__name__ + "_allocator")
    module.__file__ = source.__file__
    module.DeviceAllocator = type("DeviceAllocator", (DeviceAllocator,), {"chain_class": chain})
    module.DeviceChain = chain
    return module


class MutantError(RuntimeError):
    """A mutant no longer applies to the source it was written against."""


def mutated_source(m: Mutant) -> str:
    text = (SRC / m.file).read_text()
    for old, new in m.subs:
        n = text.count(old)
        if n != 1:
            raise MutantError(f"mutant {m.name}: {old.strip()[:60]!r} occurs {n} times in kvkernels/{m.file}")
        text = text.replace(old, new)
    return text


_TMP = tempfile.TemporaryDirectory(prefix="kvfuzz-mutants-")


def _load(m: Mutant, stem: str):
    path = Path(_TMP.name) / f"{m.name.replace('-', '_')}_{stem}.py"
    path.write_text(mutated_source(m))
    name = f"kvkernels._mutant_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "kvkernels"
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def mutant_tier(m: Mutant, backend: str) -> Tier:
    base = make_tier(backend)
    if m.file in ALLOCATOR_FILES:
        return Tier(backend, f"mutant:{m.name}", base.kernels, base.device, mutant_module(m).DeviceAllocator)
    if backend == "torch":
        raise MutantError(f"mutant {m.name} lives in a Triton kernel: use --backend interpret or cuda")
    return Tier(backend, f"mutant:{m.name}", mutant_module(m), base.device)


def mutant_module(m: Mutant):
    """The mutant as a module a ``kvfuzz run`` can be given: for a kernel mutant a kernel set
    (our launchers over the mutated kernels: ``--kernels``), for an allocator mutant the
    mutated ``allocator`` module (``--allocator MODULE:DeviceAllocator``; for a chain mutant a
    module whose ``DeviceAllocator`` builds the mutated chain). A module that
    replaces itself in ``sys.modules`` by this one is how ``benchmarks/first_case.py`` hands a
    mutant to the command line."""
    if m.file == "allocator.py":
        return _load(m, "alloc")
    if m.file == "chain.py":
        return _chain_mutant(_load(m, "chain"))
    if m.file == "float_pool.py":
        return _chain_mutant(float_module=_load(m, "float"))
    launchers_path = SRC / "launchers.py"
    spec = importlib.util.spec_from_file_location(f"kvkernels._mutant_launchers_{m.name.replace('-', '_')}",
                                                  launchers_path)
    launchers = importlib.util.module_from_spec(spec)
    launchers.__package__ = "kvkernels"
    spec.loader.exec_module(launchers)
    launchers._k = _load(m, "kernels")
    return launchers


@dataclass
class KillReport:
    name: str
    killed: bool
    seconds: float
    ops: int
    signature: Signature | None = None
    minimized_len: int | None = None
    original_len: int | None = None


def mutant_tier_named(name: str, backend: str) -> Tier:
    """The tier factory a campaign's child process calls (``TierSpec.factory``)."""
    return mutant_tier(next(m for m in (*MUTANTS, *FIXTURES) if m.name == name), backend)


def runs_on(m: Mutant, backend: str) -> bool:
    return backend != "torch" or m.file in ALLOCATOR_FILES


def hunt(m: Mutant, backend: str, budget_s: float, seed: int = 0, guided: bool = False) -> KillReport:
    """Fuzz one mutant, the way ``kvfuzz run`` fuzzes (supervised workers, the same find ->
    minimize -> case path), until the first failure or the budget ends; minimizing it
    may take half a budget more."""
    import io

    from ..engine.campaign import Campaign, CampaignOptions

    if not runs_on(m, backend):
        raise MutantError(f"mutant {m.name} lives in a Triton kernel: use --backend interpret or cuda")
    with tempfile.TemporaryDirectory(prefix="kvfuzz-mutant-cases-") as out:
        opts = CampaignOptions(backend=backend, seed=seed, budget_s=budget_s, out=out, stop_after=1, guided=guided,
                               minimize_s=max(5.0, budget_s / 2), factory="fuzz.tools.mutants:mutant_tier_named",
                               factory_arg=m.name)
        s = Campaign(opts, progress=None, out=io.StringIO()).run()
    if s.harness_errors:
        raise RuntimeError(f"mutant {m.name}: internal harness error:\n{s.harness_errors[0]}")
    if not s.cases:
        return KillReport(m.name, False, s.elapsed_s, s.ops)
    case = s.cases[0]
    return KillReport(m.name, True, s.found_after[case.signature], s.ops, case.signature,
                      case.lengths.get("minimized"), case.lengths.get("original"))


def main(backend: str = "interpret", budget_s: float = 30.0, only: list[str] | None = None, seed: int = 0) -> int:
    chosen = [m for m in MUTANTS if not only or m.name in only]
    unknown = set(only or ()) - {m.name for m in MUTANTS}
    if unknown:
        print(f"kvfuzz mutants: unknown mutant(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    cannot = [m.name for m in chosen if not runs_on(m, backend)]
    if cannot and only:
        print(f"kvfuzz mutants: {', '.join(cannot)} live in Triton kernels: use --backend interpret or cuda",
              file=sys.stderr)
        return 2
    if cannot:
        print(f"kvfuzz mutants: skipping {len(cannot)} Triton-kernel mutants on the torch tier "
              f"(--backend interpret or cuda runs them)")
    reports = []
    for m in chosen:
        if not runs_on(m, backend):
            continue
        r = hunt(m, backend, budget_s, seed)
        reports.append(r)
        sig = "-" if r.signature is None else str(r.signature)
        verdict = (f"killed in {r.seconds:6.2f} s, {r.ops:>6} ops, case {r.original_len} -> {r.minimized_len} ops, {sig}"
                   if r.killed else f"SURVIVED {r.seconds:.0f} s ({r.ops} ops)")
        print(f"{m.name:34} {verdict}", flush=True)
    killed = sum(r.killed for r in reports)
    print(f"kvfuzz mutants: backend={backend} killed {killed}/{len(reports)} "
          f"({100.0 * killed / max(1, len(reports)):.0f}%), budget {budget_s:.0f} s per mutant")
    return 0 if killed == len(reports) else 1
