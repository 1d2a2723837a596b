"""kvref's spec rules (``kvref.RULES``): the points where an allocator kvfuzz drives may
declare that it settles SPEC §3 differently (docs/allocators.md, ``KVFUZZ_SPEC_RULES``).

Each rule changes what the spec does on its committed trace (the SGLang cases of
``tests/clients/sglang-allocator-cases``, read here as plain ops: no SGLang needed), and
every §4 invariant holds under all of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvref
from fuzz.engine.kinds import parse_ops
from fuzz.engine.spec_side import SpecSide
from kvref.invariants import check_chain

CASES = Path(__file__).resolve().parents[1] / "clients/sglang-allocator-cases"
ALL = frozenset(kvref.RULES)


def _states(path: Path, rules) -> list:
    """Each op's result and the state after it (every member's, for a chain), every invariant
    checked."""
    data = json.loads(path.read_text())
    side = SpecSide(kvref.PoolConfig.from_json(data["config"]), rules)
    out = []
    for op in parse_ops(data["ops"]):
        result = side.apply(op).result
        chain = side.spec.chain
        if chain is not None:
            check_chain(chain)
        kvref.check_all(side.spec.config, side.spec.snapshot(), side.spec.written)
        out.append((result, side.spec.snapshot() if chain is None else chain.snapshot()))
    return out


@pytest.mark.parametrize("rule", sorted(ALL))
def test_each_rule_changes_the_spec_on_its_trace(rule):
    case = CASES / f"rule_{rule}.json"
    assert _states(case, ALL) != _states(case, ALL - {rule})


def test_an_unknown_rule_is_refused():
    with pytest.raises(kvref.ContractViolation, match="unknown spec rules"):
        kvref.Allocator(kvref.PoolConfig(num_pages=8), rules={"take_from_anywhere"})


@pytest.mark.parametrize("rules,left", [((), [7]), ({"take_nearest_end"}, [5])])
def test_a_partial_take_from_the_front_or_from_the_pools_end(rules, left):
    a = kvref.Allocator(kvref.PoolConfig(num_pages=8, grow="down"), rules=rules)
    a.free(a.alloc(3)[::2])  # virtual 1, 2, 3 on physical 5, 6, 7; free 1 and 3: holes [5, 7]
    a.alloc(1)
    assert a.holes == left  # SPEC: the front of the list; SGLang: the highest, nearest a grow-down pool's end
