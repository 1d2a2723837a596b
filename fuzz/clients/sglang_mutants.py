"""Planted bugs in SGLang 0.5.23's ``unified_sub_pool.py``: text patches applied to the
file before it is compiled (``sglang_allocator.load``), one per mutant.

Each is a bug of the kind SGLang's tracker records or SPEC's notes warn of, in one of
the places the allocator's correctness lives: the free path, bind, the fast and slow
alloc paths, the take order, the flush walk, pending batches behind an in-flight
forward. ``--allocator kvfuzz-sglang:mutant_NAME`` runs one; the kill table
(``benchmarks/results/sglang-allocator-cpu-torch.json``, docs/sglang.md) records the
bounded campaign that finds each and the case that replays it.

A patch names text that occurs exactly once in the file; a release whose text moved
makes ``apply`` refuse (SetupError) rather than run the unpatched file under a mutant's
name.
"""

from __future__ import annotations

from ..engine.tiers import SetupError

# name -> (where, the file's text, the mutant's text)
MUTANTS = {
    "free_keeps_live_count": (
        "_free_lazy: the live count is not decremented",
        "            self.live_page_count -= int(freed_p_pages.shape[0])\n",
        "            self.live_page_count -= 0\n"),
    "free_ids_to_front": (
        "_free_lazy: freed virtual ids go to the front of the free list (LIFO reuse)",
        "                self.free_virtual_ids = torch.cat([self.free_virtual_ids, free_v_pages])\n"
        "            self._free_phys_pages = torch.cat([self._free_phys_pages, freed_p_pages])\n"
        "            self.live_page_count -= int(",
        "                self.free_virtual_ids = torch.cat([free_v_pages, self.free_virtual_ids])\n"
        "            self._free_phys_pages = torch.cat([self._free_phys_pages, freed_p_pages])\n"
        "            self.live_page_count -= int("),
    "bind_swapped": (
        "bind: virtual and physical ids passed in each other's place",
        "                virtual_ids,\n                physical_ids,\n",
        "                physical_ids,\n                virtual_ids,\n"),
    "fast_down_off_by_one": (
        "_alloc_bind_fast_or_slow, fast path: grow-down start one page low",
        "                    start_phys = start_wm - N + 1\n",
        "                    start_phys = start_wm - N\n"),
    "slow_mixed_up_shifted": (
        "take_physical, mixed slow path: grow-up extension one page high",
        "                    new_wm - need_more,\n                    new_wm,\n",
        "                    new_wm - need_more + 1,\n                    new_wm + 1,\n"),
    "take_far_end": (
        "take_physical: a partial take takes the holes farthest from the pool's end",
        '                n_drain, "low" if self.grow_direction == "up" else "high"\n',
        '                n_drain, "high" if self.grow_direction == "up" else "low"\n'),
    "walk_no_crossing_check": (
        "_flush walk: no two-pointer crossing check (up)",
        '(self.grow_direction == "up" and src < dst)',
        '(self.grow_direction == "up" and src < dst and False)'),
    "walk_cursor_stuck": (
        "_flush walk: the survivor cursor is not advanced past the picked source (up)",
        "                    cursor = src - 1\n",
        "                    cursor = src\n"),
    "walk_ignores_write_race": (
        "_flush walk: a source the in-flight forward writes is moved anyway",
        "if write_set and src in write_set:",
        "if False and write_set and src in write_set:"),
    "pending_released_early": (
        "_commit_move_batch: sources moved under an unfired reader go straight back to the holes",
        "event_fired = latest_event is None or latest_event.query()",
        "event_fired = True"),
    "pending_overwritten": (
        "_commit_move_batch: a second batch under one unfired event replaces the first (its pages leak)",
        "                cpu_list, gpu_batches = self._pending_reuse.setdefault(\n"
        "                    latest_event, ([], [])\n                )\n",
        "                cpu_list, gpu_batches = self._pending_reuse[latest_event] = ([], [])\n"),
    "drain_ignores_event": (
        "_drain_pending_reuse: pending sources rejoin the holes before their event fires",
        "if event is None or event.query():",
        "if True:"),
    "absorb_off_by_one": (
        "_absorb_boundary_holes (up): absorbs a hole one page below the frontier's neighbour",
        "while n < M and all_cpu[M - 1 - n] == wm - 1 - n:",
        "while n < M and all_cpu[M - 1 - n] >= wm - 2 - n:"),
    "move_keeps_source": (
        "_commit_move_batch: the moved-out source keeps its p2v entry",
        "            self.physical_to_virtual.index_fill_(0, src_pages_t, -1)\n",
        "            pass\n"),
    # The chain (docs/spec.md §6): the kinds of bug SGLang fixed in its chain code in 2026.
    "flush_ignores_gate": (
        "_flush (chain): compaction moves pages while the pool's move gate is closed",
        "        if self.moves_blocked():\n            # Holes stay in the free list; the next flush picks them up.",
        "        if False:\n            # Holes stay in the free list; the next flush picks them up."),
    "schedulable_memo_ignores_gate": (
        "schedulable_available_size (chain): the memo is keyed on the chain's epoch alone, so a "
        "neighbour's gate that flips with no alloc or free in between leaves it stale",
        "        return epoch, _drains_on_urgent_flush(neighbor)\n",
        "        return epoch, None\n"),
    "float_make_room_ignores_gate": (
        "make_room (float): relocates live pages while the float's move gate is closed",
        "        gap_side_bytes = (gap_low if side == \"low\" else gap_high) * epp\n        if self.moves_blocked():\n",
        "        gap_side_bytes = (gap_low if side == \"low\" else gap_high) * epp\n        if False:\n"),
    "walk_stops_at_empty_float": (
        "_chain_low_frontier_above_bytes (chain): the walk stops at an empty float, so the up end "
        "cannot grow past its parked span",
        "        p = self.high_peer\n        while p is not None and p._is_frontier_transparent():\n"
        "            p = p.high_peer\n        if p is None:\n            return self.unified_buffer.total_bytes",
        "        p = self.high_peer\n        if p is None:\n            return self.unified_buffer.total_bytes"),
}


def apply(text: str, mutant: str | None) -> str:
    """``text`` with ``mutant``'s patch applied (None: as shipped)."""
    if mutant is None:
        return text
    if mutant not in MUTANTS:
        raise SetupError(f"no SGLang allocator mutant {mutant!r}; there are {', '.join(sorted(MUTANTS))}")
    _, old, new = MUTANTS[mutant]
    found = text.count(old)
    if found != 1:
        raise SetupError(f"mutant {mutant}: its text occurs {found} times in this unified_sub_pool.py, not once "
                         "(written against sglang 0.5.23)")
    return text.replace(old, new)
