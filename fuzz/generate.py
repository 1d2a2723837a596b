"""The fast seeded generator: pool configs and op sequences, by scenario.

It reads the spec allocator it is given (never the target) to know which requests are
live, so nearly every op is valid; contract violations are produced on purpose at a low
rate. Scenarios weight the op mix the way a server's workloads differ.
"""

from __future__ import annotations

import random

import kvref

SCENARIOS = {
    #               alloc free flush fwd fire write read table packed xlate clear raw
    "churn":        (30, 26, 6, 5, 5, 10, 6, 6, 2, 3, 1, 2),
    "fragment":     (25, 35, 14, 3, 3, 8, 6, 3, 1, 2, 0, 2),
    "full":         (45, 18, 8, 4, 4, 8, 5, 4, 1, 2, 1, 2),
    "long":         (20, 15, 8, 6, 6, 12, 8, 14, 4, 4, 1, 2),
    "short":        (35, 32, 6, 5, 5, 6, 4, 4, 1, 2, 0, 2),
    "inflight":     (22, 20, 16, 14, 8, 8, 5, 4, 1, 2, 0, 2),
    "kernels":      (10, 8, 2, 1, 1, 2, 2, 10, 4, 6, 0, 54),  # mostly kernel-level ops on raw tables
}
KINDS = ("alloc", "free", "flush", "forward", "fire", "write", "read", "read_table", "read_table_packed",
         "translate", "clear", "raw")


def random_config(rng: random.Random) -> kvref.PoolConfig:
    ps = rng.choice((1, 1, 1, 2, 4, 16))
    num_pages = rng.choice((4, 8, 16, 32, 64)) + rng.randint(0, 8)
    if ps == 16:
        num_pages = min(num_pages, 24)
    return kvref.PoolConfig(
        num_pages=num_pages,
        min_page=rng.choice((1, 1, 2, 3)),
        page_size=ps,
        grow=rng.choice(("up", "down")),
        lazy=rng.random() < 0.75,
        multiplier=rng.choice((1, 1, 2, 3, 16)),
        max_moves=rng.choice((0, 1, 2, 4, 8, 64)),
    )




class OpGenerator:
    def __init__(self, rng: random.Random, config: kvref.PoolConfig, scenario: str, contract_rate: float = 0.03):
        self.rng = rng
        self.config = config
        self.scenario = scenario
        self.weights = SCENARIOS[scenario]
        self.contract_rate = contract_rate
        self.live: list[list[int]] = []
        self.dead: list[list[int]] = []
        self.stamp = 1
        self.raw_bound: dict[int, int] = {}  # the raw tables as the spec left them: v -> p

    # ---- helpers ----------------------------------------------------------------
    def _pages(self, tokens: list[int]) -> list[list[int]]:
        ps = self.config.page_size
        return [tokens[i:i + ps] for i in range(0, len(tokens), ps)]

    def _some_tokens(self, limit: int = 12) -> list[int]:
        pool = [t for r in self.live for t in r]
        if not pool:
            return []
        return self.rng.sample(pool, min(len(pool), self.rng.randint(1, limit)))

    def _alloc_size(self, spec: kvref.Allocator) -> int:
        rng, ps = self.rng, self.config.page_size
        room = max(1, spec.index_room() + len(spec.holes))
        if self.scenario == "long":
            pages = rng.randint(1, max(1, room))
        elif self.scenario == "short":
            pages = rng.randint(1, 2)
        elif self.scenario == "full":
            pages = rng.choice((room, room + 1, rng.randint(1, room)))
        else:
            pages = rng.randint(1, max(1, min(room, 6)))
        return pages * ps

    def observe(self, op: dict, outcome) -> None:
        """Learn what the spec did with the op just run (``outcome``: runner.Outcome)."""
        kind = op["op"]
        if outcome.error is not None:
            return
        if kind in ("k_bind", "k_alloc_bind"):
            phys = op["p"] if kind == "k_bind" else [op["start"] + i for i in range(len(op["v"]))]
            for v, p in zip(op["v"], phys):
                self.raw_bound = {w: q for w, q in self.raw_bound.items() if q != p}
                self.raw_bound[v] = p
        elif kind == "k_free_unbind":
            for v in op["v"]:
                self.raw_bound.pop(v, None)
        elif kind == "alloc" and outcome.result:
            self.live.append(list(outcome.result))
        elif kind == "free":
            gone = set(op["tokens"])
            self.live = [r for r in self.live if gone.isdisjoint(r)]
        elif kind == "clear":
            self.dead.extend(self.live)
            self.live = []

    # ---- ops --------------------------------------------------------------------
    def next_op(self, spec: kvref.Allocator) -> dict:
        if self.rng.random() < self.contract_rate:
            return self._violation(spec)
        kind = self.rng.choices(KINDS, self.weights)[0]
        return getattr(self, f"_gen_{kind}")(spec)

    def _gen_alloc(self, spec):
        return {"op": "alloc", "n": self._alloc_size(spec)}

    def _gen_free(self, spec):
        if not self.live:
            return self._gen_alloc(spec)
        rng, ps = self.rng, self.config.page_size
        r = self.live.pop(rng.randrange(len(self.live)))
        pages = self._pages(r)
        if len(pages) > 1 and rng.random() < 0.3:
            cut = rng.randint(1, len(pages) - 1)
            keep, gone = pages[:cut], pages[cut:]
            if rng.random() < 0.5:
                keep, gone = gone, keep
            self.live.append([t for p in keep for t in p])
        else:
            gone = pages
        if ps == 1 or rng.random() < 0.5:
            rng.shuffle(gone)
        tokens = [t for p in gone for t in p]
        if ps > 1 and rng.random() < 0.2:
            tokens = tokens[: len(tokens) - rng.randint(0, ps - 1)]  # the last page may be partial
        self.dead.append([t for p in gone for t in p])
        self.dead = self.dead[-16:]
        return {"op": "free", "tokens": tokens}

    def _gen_flush(self, spec):
        return {"op": "flush", "urgent": self.rng.random() < 0.3}

    def _gen_forward(self, spec):
        rng = self.rng
        reqs = rng.sample(self.live, min(len(self.live), rng.randint(1, 3))) if self.live else []
        return {"op": "forward", "tokens": [t for r in reqs for t in r]}

    def _gen_fire(self, spec):
        return {"op": "fire"}

    def _gen_write(self, spec):
        tokens = self._some_tokens(16)
        stamps = list(range(self.stamp, self.stamp + len(tokens)))
        self.stamp += len(tokens)
        return {"op": "write", "tokens": tokens, "stamps": stamps}

    def _gen_read(self, spec):
        return {"op": "read", "tokens": self._some_tokens(16)}

    def _gen_translate(self, spec):
        rng, c = self.rng, self.config
        loc = self._some_tokens(8)
        for _ in range(rng.randint(0, 3)):
            loc.append(rng.choice((-1, -rng.randint(2, 50), rng.randint(0, (c.num_pages + 3) * c.page_size),
                                   *(self.dead[-1][:1] if self.dead else ()))))
        return {"op": "translate", "loc": loc}

    def _table_rows(self, bs: int) -> tuple[list[list[int]], list[int]]:
        rng = self.rng
        rows, lens = [], []
        for _ in range(bs):
            source = rng.random()
            if self.live and source < 0.75:
                row = list(rng.choice(self.live))
            elif self.dead and source < 0.9:
                row = list(rng.choice(self.dead))  # tombstoned pages read as entry 0
            else:
                row = []
            if row and rng.random() < 0.15:
                row[rng.randrange(len(row))] = -1
            rows.append(row)
            lens.append(rng.randint(0, len(row)) if row and rng.random() < 0.4 else len(row))
        return rows, lens

    def _gen_read_table(self, spec, broken: bool = False):
        rng, ps = self.rng, self.config.page_size
        bs = rng.choice((1, 1, 2, 3, 5, 8, 17, 64)) if rng.random() < 0.9 else 0
        rows, lens = self._table_rows(max(bs, 1))
        rows, lens = rows[: max(bs, 1)], lens[:bs]
        need = max([-(-n // ps) for n in lens] + [1])
        max_pages = need + rng.choice((0, 0, 1, 5))
        width = max([max_pages * ps] + [len(r) for r in rows]) + rng.choice((0, 0, 3))
        if broken:
            lens = [n + max_pages * ps + ps for n in lens] or [max_pages * ps + 1]
            if not bs:
                bs = 1
        req_idx = [rng.randrange(len(rows)) for _ in range(bs)]
        if not broken:
            lens = [min(n, len(rows[j])) if rows[j] else 0 for n, j in zip(lens, req_idx)]
        return {"op": "read_table", "rows": rows, "req_idx": req_idx, "seq_lens": lens[: len(req_idx)],
                "max_pages": max_pages, "width": width, "legacy": rng.random() < 0.3}

    def _gen_read_table_packed(self, spec):
        rng, ps = self.rng, self.config.page_size
        bs = rng.choice((1, 2, 3, 6))
        rows, _ = self._table_rows(bs)
        req_idx = [rng.randrange(bs) for _ in range(bs)]
        kv_start = None if rng.random() < 0.5 else [rng.randint(0, ps) for _ in range(bs)]
        lens = []
        for b, j in enumerate(req_idx):
            start = 0 if kv_start is None else kv_start[b]
            lens.append(max(0, min(len(rows[j]) - start, rng.randint(0, len(rows[j])))))
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n + rng.choice((0, 0, 2)))
        width = max([len(r) for r in rows] + [1]) + ps
        return {"op": "read_table_packed", "rows": rows, "req_idx": req_idx, "seq_lens": lens,
                "kv_start": kv_start, "indptr": indptr, "max_tokens": max(lens + [1]), "width": width}

    def _gen_clear(self, spec):
        return {"op": "clear"}

    def _gen_raw(self, spec):
        """A kernel-level op on the raw tables: ids unique, in [1, rows - 1)."""
        rng, rows = self.rng, self.config.table_rows
        ids = list(range(1, rows - 1))
        bound = sorted(self.raw_bound)
        pick = rng.random()
        if bound and pick < 0.35:
            return {"op": "k_free_unbind", "v": rng.sample(bound, rng.randint(1, len(bound)))}
        free_v = [v for v in ids if v not in self.raw_bound]
        used_p = set(self.raw_bound.values())
        free_p = [p for p in ids if p not in used_p]
        n = rng.randint(1, max(1, min(len(free_v), len(free_p), 9)))
        if not free_v or not free_p:
            return {"op": "k_free_unbind", "v": bound[:1]} if bound else self._gen_translate(spec)
        v = rng.sample(free_v, min(n, len(free_v)))
        if pick < 0.65:
            runs = [s for s in free_p if all(s + i in free_p for i in range(len(v)))]
            if runs:
                return {"op": "k_alloc_bind", "v": v, "start": rng.choice(runs)}
        return {"op": "k_bind", "v": v, "p": rng.sample(free_p, len(v))}

    # ---- contract violations ------------------------------------------------------
    def _violation(self, spec) -> dict:
        rng, c = self.rng, self.config
        choices = ["unaligned", "reserved", "read_table_short", "raw_out_of_range", "raw_duplicate"]
        if self.raw_bound:
            choices += ["raw_double_free"]
        if self.dead:
            choices += ["double_free", "write_dead", "read_dead", "forward_dead"]
        if self.live:
            choices += ["duplicate"]
        pick = rng.choice(choices)
        if pick == "unaligned":
            return {"op": "alloc", "n": c.page_size + 1} if c.page_size > 1 else {"op": "free", "tokens": [c.num_pages * c.page_size + rng.randint(0, 8)]}
        if pick == "reserved":
            return {"op": "free", "tokens": list(range(0, c.page_size))}
        if pick == "read_table_short":
            return self._gen_read_table(spec, broken=True)
        rows = c.table_rows
        if pick == "raw_out_of_range":
            return {"op": "k_bind", "v": [rng.choice((0, rows - 1, rows + rng.randint(0, 8), -rng.randint(1, 8)))],
                    "p": [rng.randint(1, rows - 2)]}
        if pick == "raw_duplicate":
            v = rng.randint(1, rows - 2)
            return {"op": "k_bind", "v": [v, v], "p": [1, min(2, rows - 2)]}
        if pick == "raw_double_free":
            v = rng.choice(sorted(self.raw_bound))
            return {"op": "k_free_unbind", "v": [v, v]}
        if pick == "duplicate":
            r = rng.choice(self.live)
            return {"op": "free", "tokens": r[: c.page_size] + r[: c.page_size]}
        dead = rng.choice(self.dead)
        if pick == "double_free":
            return {"op": "free", "tokens": list(dead)}
        if pick == "write_dead":
            return {"op": "write", "tokens": dead[:1], "stamps": [self.stamp]}
        if pick == "read_dead":
            return {"op": "read", "tokens": dead[:2]}
        return {"op": "forward", "tokens": dead[:1]}


def sequence_params(seed: int) -> tuple[kvref.PoolConfig, str, random.Random]:
    """Everything a seed decides: the pool config, the scenario, the op stream's RNG."""
    rng = random.Random(seed)
    config = random_config(rng)
    scenario = rng.choice(sorted(SCENARIOS))
    return config, scenario, rng
