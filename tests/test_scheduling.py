"""The suite's own scheduling (tests/scheduling.py): under ``--dist worksteal`` every worker
starts with its share of the long tests, the longest first, checked against pytest-xdist's
own scheduler, so an xdist that splits the collection otherwise fails here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.scheduling import DEFAULT_S, MEASURED_S, block_sizes, long_first, weight

COSTS = {"a": 100, "b": 90, "c": 40, "d": 35, "e": 30}  # the long ones; the rest cost 0


def _items(n_short: int) -> list[str]:
    shorts = [f"s{i}" for i in range(n_short)]
    return shorts[:7] + ["c", "a"] + shorts[7:15] + ["e", "b"] + shorts[15:] + ["d"]  # long ones late, as collected


def _first_blocks(order: list[str], workers: int) -> list[list[str]]:
    """What xdist's worksteal scheduler hands each worker first, for a collection in this order."""
    from xdist.scheduler.worksteal import WorkStealingScheduling

    class Node:
        shutting_down = False

        def __init__(self, n):
            self.sent: list[int] = []
            self.gateway = SimpleNamespace(id=f"gw{n}")

        def send_runtest_some(self, indices):
            self.sent += indices

    sched = WorkStealingScheduling.__new__(WorkStealingScheduling)
    sched.numnodes, sched.node2collection, sched.node2pending = workers, {}, {}
    sched.pending, sched.collection, sched.steal_requested_from_node = [], None, None
    sched.log = lambda *a: None
    nodes = [Node(n) for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, order)
    sched.schedule()
    return [[order[i] for i in node.sent] for node in nodes]


@pytest.mark.parametrize("workers", [2, 3])
def test_each_worker_starts_with_its_share_of_the_long_tests_longest_first(workers):
    items = _items(40)
    order = long_first(items, workers, lambda i: COSTS.get(i, 0))
    assert sorted(order) == sorted(items)  # a permutation: nothing lost, nothing twice
    shorts = [i for i in order if i not in COSTS]
    assert shorts == [i for i in items if i not in COSTS]  # the short ones keep their order
    blocks = _first_blocks(order, workers)
    assert [len(b) for b in blocks] == block_sizes(len(items), workers)
    for block in blocks:
        longs = [i for i in block if i in COSTS]
        assert block[:len(longs)] == longs and longs == sorted(longs, key=COSTS.get, reverse=True), block
    totals = [sum(COSTS.get(i, 0) for i in b) for b in blocks]
    assert max(totals) - min(totals) <= max(COSTS.values()), totals  # balanced to within one test
    assert {i for b in blocks for i in b if i in COSTS} == set(COSTS)  # every long one starts in a first block
    if workers == 2:
        assert sorted(totals) == [135, 160]  # a+d, b+c+e (greedy); dealt round robin: 125 and 170


def test_one_worker_or_no_long_test_changes_little():
    items = _items(10)
    assert long_first(items, 1, lambda i: COSTS.get(i, 0))[:5] == ["a", "b", "c", "d", "e"]
    assert long_first(items, 2, lambda i: 0) == items


def test_weights_come_from_the_table_or_the_slow_marker():
    name = next(k for k in MEASURED_S if "[" not in k)
    assert weight(f"{name}[x-1]", slow=False) == MEASURED_S[name]  # a name's entry holds for each parameter
    one = next(k for k in MEASURED_S if "[" in k)  # one instance measured: it has its own weight
    assert weight(one, slow=True) == MEASURED_S[one]
    assert weight(one.split("[")[0] + "[not-measured]", slow=False) == 0
    assert weight(one.split("[")[0] + "[not-measured]", slow=True) == DEFAULT_S
    assert weight("tests/test_x.py::test_unlisted", slow=True) > 0
    assert weight("tests/test_x.py::test_unlisted", slow=False) == 0
