"""The production track's host-side shortcuts against their plain definitions, over real op streams.

A GPU worker's default mix is host-bound, so the host work of a production op was cut
(``benchmarks/profile_host_ops.py``): a graph read table's check and run share the very
tuples of each step's inputs, its live masks' row lists are built only when results differ,
host ints reach a tensor through ``array``, and the per-row hashes share their row half.
None of it may change what is drawn, checked or run. Each test here computes the same thing
both ways, the shortcut and the definition it replaced (kept here verbatim), over the ops the
generator emits for many seeds of the default and read-heavy mixes at production limits.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

from fuzz.engine import oplang
from fuzz.engine.oplang import OpError, _plain
from fuzz.engine.production import arith, draws, graph
from fuzz.engine.production import ops as production_ops
from fuzz.engine.production.arith import HASH_P, cdiv, hash_int, row_hashes
from fuzz.engine.production.draws import device_ints
from fuzz.engine.production.generator import READ_HEAVY_MIX, regenerate, scale_info
from fuzz.engine.production.graph import GReadTable
from fuzz.engine.production.ops import PRows
from fuzz.engine.tiers import make_tier

SEEDS = range(40)
N_OPS = 24


@pytest.fixture(scope="module")
def gpu_info() -> dict:
    """kvkernels' scale_info as a GPU worker sends it (production limits, far tables on)."""
    info = scale_info(make_tier("torch"))
    info["gpu"] = True
    return info


def _stream_ops(info: dict, mix=None, seeds=SEEDS):
    for seed in seeds:
        config, ops = regenerate(seed, N_OPS, info, mix=mix)
        for op in ops:
            yield config, op


@pytest.fixture(scope="module")
def graph_ops(gpu_info) -> list:
    ops = [(cfg, op) for cfg, op in _stream_ops(gpu_info) if isinstance(op, GReadTable)]
    assert len(ops) >= 30 and any(op.packed for _, op in ops) and any(not op.packed for _, op in ops)
    return ops


# ---- a graph read table: one set of inputs per step, for its check and its run ---------------------------


def _live_cols_eager(op, seq, ps):
    """The table form's live columns as ``execute``'s compare built them before every check."""
    return [min(cdiv(n, ps), op.max_pages) for n in seq]


def _live_spans_eager(seq):
    """The packed form's spans as ``execute``'s compare built them before every check."""
    spans, at = [], 0
    for n in seq:
        spans.append((at, n))
        at += n
    return spans


def test_a_graph_ops_check_and_run_are_handed_the_same_inputs(graph_ops):
    """``preflight`` and ``execute`` both read ``_step_inputs``: the values ``step_inputs`` gives (the
    lists the check read before), for every step of every graph op of the stream."""
    for cfg, op in graph_ops:
        ps = cfg.page_size
        for step in range(-1, op.steps):
            shared = dict(graph._step_inputs(op, step, ps))
            assert {k: list(v) for k, v in shared.items()} == op.step_inputs(step, ps)
            assert list(shared) == (["req", "seq", "indptr", "start"] if op.packed else ["req", "seq"])


def test_a_graph_ops_live_masks_are_the_ones_built_eagerly(graph_ops):
    for cfg, op in graph_ops:
        ps = cfg.page_size
        for step in range(-1, op.steps):
            seq = dict(graph._step_inputs(op, step, ps))["seq"]
            if op.packed:
                assert op.live_spans(seq) == _live_spans_eager(seq)
            else:
                assert op.live_cols(seq, ps) == _live_cols_eager(op, seq, ps)


# ---- host ints to a tensor ----------------------------------------------------------------------------


def _device_ints_plain(values, device):
    t = torch.tensor(values, dtype=torch.int64)
    return t if str(device) == "cpu" else t.to(device, non_blocking=True)


@pytest.mark.parametrize("values", [[], [0], [1, -1, 7], (3, 4, 5), [True, 2], [-(1 << 63), (1 << 63) - 1],
                                    list(range(-600, 600, 7)), [1.5, 2]])
def test_device_ints_are_torch_tensors_values(values):
    got, want = device_ints(values, "cpu"), _device_ints_plain(values, "cpu")
    assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape and torch.equal(got, want)
    assert got.untyped_storage().resizable()  # owns its storage, as torch.tensor's does


@pytest.mark.parametrize("values", [[1 << 63], [-(1 << 63) - 1], ["a"], [None]])
def test_device_ints_refuse_what_torch_tensor_refuses(values):
    with pytest.raises(Exception) as want:
        _device_ints_plain(values, "cpu")
    with pytest.raises(Exception) as got:
        device_ints(values, "cpu")
    assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))


@pytest.mark.parametrize("mix", [None, READ_HEAVY_MIX], ids=["default", "read-heavy"])
def test_every_read_tables_input_tensors_are_the_plain_ones(gpu_info, mix):
    """The host inputs of every read table of the stream (``inputs``) against ``torch.tensor`` of their lists."""
    class _Run:
        device = "cpu"

    seen = 0
    for cfg, op in _stream_ops(gpu_info, mix, seeds=range(20)):
        run = _Run()
        run.config = cfg
        if op.kind == "p_rows":
            rows_shape = (op.rows, op.width)
        if op.kind == "p_read_table":
            seq, _, seq_t = op.inputs(run)
            assert torch.equal(seq_t, _device_ints_plain(seq, "cpu"))
            seen += 1
        elif op.kind == "p_read_table_packed":
            run.rows_shape = rows_shape
            seq, indptr, ints = op.inputs(run)
            _, _, starts = op.layout(rows_shape[1])
            for name, v in (("seq", seq), ("indptr", indptr), ("start", starts)):
                if v is not None:
                    assert torch.equal(ints[name], _device_ints_plain(v, "cpu")), name
            seen += 1
    assert seen >= 50


# ---- per-row hashes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 127, 128, 513, 4097])
@pytest.mark.parametrize("seed", [0, 1, 5, HASH_P - 1, HASH_P, HASH_P + 3, -7, -(1 << 40), (1 << 62) + 11, 123456789])
def test_row_hashes_are_hash_ints_values(n, seed):
    assert row_hashes(n, seed) == [hash_int(i, seed) for i in range(n)]


def test_row_hashes_past_the_kept_rows_are_hash_ints_values(monkeypatch):
    monkeypatch.setattr(arith, "ROW_HALF_MAX", 40)
    assert row_hashes(100, 9) == [hash_int(i, 9) for i in range(100)]
    assert row_hashes(40, 9) == [hash_int(i, 9) for i in range(40)]


def _fills_loop(op):
    w = op.width
    return [w if hash_int(r, op.seed + 1) % 4 else hash_int(r, op.seed + 2) % (w + 1) for r in range(op.rows)]


def test_every_rows_fills_are_the_loops(gpu_info):
    """p_rows' fills (and a graph op's own rows) over the stream, against the row-by-row loop they were."""
    seen = 0
    for _, op in _stream_ops(gpu_info):
        if isinstance(op, (PRows, GReadTable)):
            rows = op if isinstance(op, PRows) else PRows(op.seed, op.rows, op.width, op.src, 0, op.dtype)
            assert rows.fills() == _fills_loop(rows)
            seen += 1
    assert seen >= 100


# ---- an op's fields, checked on construction -------------------------------------------------------------


def _coerced_plain(op_cls, values: dict) -> dict:
    """What ``Op.__post_init__`` did per construction before its specs were kept per class."""
    hints = typing.get_type_hints(op_cls)
    return {f.name: oplang._coerce(hints[f.name], values[f.name], f"{op_cls.kind} op: field {f.name!r}")
            for f in dataclasses.fields(op_cls)}


def _outcome(fn, *args):
    try:
        return fn(*args)
    except OpError as exc:
        return str(exc)


def _built(op_cls, values: dict) -> dict:
    return dataclasses.asdict(op_cls(**values))


def test_every_op_of_the_stream_is_coerced_as_before_and_refused_alike(gpu_info):
    """Each op of the stream rebuilt from its JSON's values, and with each field in turn made wrong
    (a float, a string, a list of a string), gives the fields or the message the per-call form gave."""
    kinds = set()
    for _, op in _stream_ops(gpu_info, seeds=range(10)):
        values = {f.name: getattr(op, f.name) for f in dataclasses.fields(op)}
        plain = {name: _plain(v) for name, v in values.items()}  # lists, as a case file holds them
        assert _built(type(op), plain) == _coerced_plain(type(op), plain)
        if type(op).__name__ in kinds:
            continue
        kinds.add(type(op).__name__)
        for name in values:
            for bad in (1.5, "x", ["x"], None, True):
                wrong = {**plain, name: bad}
                assert _outcome(_built, type(op), wrong) == _outcome(_coerced_plain, type(op), wrong)
    assert len(kinds) >= 10


# ---- the whole stream, and what each op derives from it ---------------------------------------------------


def _derived(info: dict, mix) -> list:
    """Per op of the stream: its JSON, and the inputs its check and run derive (a graph op's every
    step, a read table's seq_lens or packed layout, p_rows' fills)."""
    out, width = [], None
    for cfg, op in _stream_ops(info, mix):
        ps, row = cfg.page_size, [op.to_json()]
        if isinstance(op, PRows):
            width = op.width
            row.append(op.fills())
        elif isinstance(op, GReadTable):
            row += [graph._step_inputs(op, step, ps) for step in range(-1, op.steps)]
        elif op.kind == "p_read_table":
            row.append(op.seq_lens(ps))
        elif op.kind == "p_read_table_packed":
            row.append(op.layout(width))
        out.append(row)
    return out


def _clear_caches():
    for fn in (graph._step_inputs, draws._seq_lens_of, draws._packed_layout_of):
        fn.cache_clear()


@pytest.mark.parametrize("mix", [None, READ_HEAVY_MIX], ids=["default", "read-heavy"])
def test_the_stream_and_its_inputs_are_the_ones_the_row_loops_give(gpu_info, mix, monkeypatch):
    """40 seeds x 24 ops, computed twice: as the code stands, and with every per-row hash a
    ``hash_int`` loop again (the definition ``row_hashes`` replaced) and the op records' checks
    worked out per construction."""
    _clear_caches()
    fast = _derived(gpu_info, mix)
    loop = lambda n, seed: [hash_int(i, seed) for i in range(n)]  # noqa: E731
    for mod in (graph, draws, production_ops):
        monkeypatch.setattr(mod, "row_hashes", loop)
    for cls in oplang.Op.registry.values():
        monkeypatch.delattr(cls, "_field_specs", raising=False)
    _clear_caches()
    try:
        assert _derived(gpu_info, mix) == fast
    finally:
        _clear_caches()
