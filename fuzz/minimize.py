"""Shrink a failing op sequence while its signature stays the same.

Delta debugging over ops (Zeller's ddmin: drop chunks, then complements, halving the
chunk size), then per-op simplification (fewer tokens, smaller allocs, fewer rows),
then a smaller pool. Every candidate is replayed from scratch; the search stops at the
deadline and keeps the best sequence found so far.
"""

from __future__ import annotations

import time
from dataclasses import replace

import kvref

from .backends import Tier
from .runner import Divergence, replay


class Minimizer:
    def __init__(self, tier: Tier, signature: dict, deadline: float | None = None, knobs: dict | None = None):
        self.tier = tier
        self.knobs = knobs
        self.signature = signature
        self.deadline = deadline
        self.replays = 0

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def fails(self, config: kvref.PoolConfig, ops: list[dict]) -> Divergence | None:
        self.replays += 1
        d, _ = replay(config, ops, self.tier, knobs=self.knobs)
        return d if d is not None and d.signature == self.signature else None

    def ddmin(self, config, ops: list[dict]) -> list[dict]:
        n = 2
        while len(ops) >= 2 and not self.out_of_time():
            chunk = -(-len(ops) // n)
            parts = [ops[i:i + chunk] for i in range(0, len(ops), chunk)]
            reduced = False
            for i in range(len(parts)):
                complement = [op for j, p in enumerate(parts) if j != i for op in p]
                if self.fails(config, complement):
                    ops, n, reduced = complement, max(n - 1, 2), True
                    break
                if self.out_of_time():
                    return ops
            if not reduced:
                if n >= len(ops):
                    break
                n = min(len(ops), 2 * n)
        return ops

    def _variants(self, op: dict):
        kind = op["op"]
        for key in ("tokens", "loc"):
            if key in op and len(op[key]) > 1:
                seq = op[key]
                for keep in (seq[: len(seq) // 2], seq[len(seq) // 2:], seq[:1]):
                    new = dict(op, **{key: keep})
                    if "stamps" in op:
                        new["stamps"] = op["stamps"][: len(keep)] if keep == seq[: len(keep)] else op["stamps"][-len(keep):]
                    yield new
        if kind == "write":
            yield dict(op, stamps=[1 + i for i in range(len(op["stamps"]))])
        if kind in ("k_bind", "k_alloc_bind", "k_free_unbind") and len(op["v"]) > 1:
            n = len(op["v"])
            for keep in (range(0, n // 2), range(n // 2, n), *(range(b, b + 1) for b in range(n))):
                new = dict(op, v=[op["v"][j] for j in keep])
                if kind == "k_bind":
                    new["p"] = [op["p"][j] for j in keep]
                yield new
        if kind == "alloc" and op["n"] > 0:
            yield dict(op, n=op["n"] // 2)
        if kind == "flush" and op["urgent"]:
            yield dict(op, urgent=False)
        if kind == "read_table" and len(op["req_idx"]) > 1:
            n = len(op["req_idx"])
            keeps = [range(b, b + 1) for b in range(n)] + [range(0, n // 2), range(n // 2, n)]
            keeps += [[j for j in range(n) if j != b] for b in range(n)]
            for keep in keeps:
                yield dict(op, req_idx=[op["req_idx"][j] for j in keep], seq_lens=[op["seq_lens"][j] for j in keep])
        if kind == "read_table_packed" and len(op["req_idx"]) > 1:
            for b, n in enumerate(op["seq_lens"]):
                start = None if op["kv_start"] is None else [op["kv_start"][b]]
                yield dict(op, req_idx=[op["req_idx"][b]], seq_lens=[n], kv_start=start, indptr=[0, n],
                           max_tokens=max(n, 1))
        if kind in ("read_table", "read_table_packed"):
            yield from self._table_variants(op)

    @staticmethod
    def _table_variants(op: dict):
        """Fewer and shorter req_to_token rows: only the rows the batch reads, cut to what it reads."""
        used = sorted(set(op["req_idx"]))
        if len(used) < len(op["rows"]) and all(0 <= r < len(op["rows"]) for r in used):
            renumber = {r: i for i, r in enumerate(used)}
            yield dict(op, rows=[op["rows"][r] for r in used], req_idx=[renumber[r] for r in op["req_idx"]])
        if op["op"] == "read_table" and op["max_pages"] > 1:
            yield dict(op, max_pages=op["max_pages"] - 1)
        shorter = [r[: max(1, len(r) // 2)] for r in op["rows"]]
        if shorter != op["rows"]:
            yield dict(op, rows=shorter)
        if op["op"] == "read_table":
            if op["max_pages"] < op["width"]:  # enough at page size 1; rejected where it is not
                yield dict(op, width=op["max_pages"])

    def simplify_ops(self, config, ops: list[dict]) -> list[dict]:
        changed = True
        while changed and not self.out_of_time():
            changed = False
            for i in range(len(ops)):
                for variant in self._variants(ops[i]):
                    cand = ops[:i] + [variant] + ops[i + 1:]
                    if self.fails(config, cand):
                        ops, changed = cand, True
                        break
                    if self.out_of_time():
                        return ops
        return ops

    def simplify_config(self, config: kvref.PoolConfig, ops: list[dict]) -> kvref.PoolConfig:
        for change in ({"max_moves": 0}, {"multiplier": 1}, {"min_page": 1}):
            if self.out_of_time():
                break
            try:
                cand = replace(config, **change)
            except kvref.ContractViolation:
                continue
            if cand != config and self.fails(cand, ops):
                config = cand
        while config.num_pages > config.min_page + 1 and not self.out_of_time():
            try:
                cand = replace(config, num_pages=config.num_pages - max(1, (config.num_pages - config.min_page) // 4))
            except kvref.ContractViolation:
                break
            if not self.fails(cand, ops):
                break
            config = cand
        return config

    def run(self, config, ops: list[dict]) -> tuple[kvref.PoolConfig, list[dict], Divergence]:
        d = self.fails(config, ops)
        if d is None:
            raise ValueError("the case does not fail with its signature; nothing to minimize")
        ops = self.ddmin(config, ops)
        ops = self.simplify_ops(config, ops)
        config = self.simplify_config(config, ops)
        ops = self.ddmin(config, ops)
        return config, ops, self.fails(config, ops) or d
