"""The read table's host-side launch choice (kvkernels.launchers.read_table_launch)."""

import torch

import kvkernels
from kvkernels import launchers


def test_the_tuned_rules_cover_the_strided_grid_and_leave_legacy_alone():
    assert launchers.read_table_launch(256, 131072) == (512, 8)  # the H200 sweep's choice at bs 256, 128k
    assert launchers.read_table_launch(4096, 1 << 20) == (512, 4)  # past every rule: the defaults
    assert launchers.read_table_launch(1, 1, legacy=True) == (512, 4)  # legacy is the reference, untuned
    for _bs, _pages, legacy, block_cols, warps in launchers.READ_TABLE_RULES:
        assert not legacy and block_cols & (block_cols - 1) == 0 and warps in (1, 2, 4, 8)


def test_the_first_matching_rule_wins(monkeypatch):
    monkeypatch.setattr(launchers, "READ_TABLE_RULES", ((16, 8192, False, 256, 2), (512, 1 << 20, False, 1024, 8)))
    assert launchers.read_table_launch(16, 8192) == (256, 2)
    assert launchers.read_table_launch(17, 8192) == (1024, 8)
    assert launchers.read_table_launch(16, 8192, legacy=True) == (512, 4)  # no legacy rule


def test_a_block_cols_set_by_a_test_or_the_fuzzers_knobs_wins(monkeypatch):
    monkeypatch.setattr(launchers, "READ_TABLE_RULES", ((1 << 20, 1 << 20, False, 1024, 8),))
    monkeypatch.setattr(launchers, "BLOCK_COLS", 4)
    assert launchers.read_table_launch(3, 50) == (4, 4)


def test_a_rule_changes_the_launch_not_the_result(triton_tier, monkeypatch):
    r2t = triton_tier.t([list(range(300))] * 2)
    args = dict(req_to_token=r2t, req_pool_indices=triton_tier.t([0, 1, 0]), seq_lens=triton_tier.t([300, 7, 0]),
                v2p=triton_tier.t(list(range(310))), multiplier=2, page_size=1, max_pages=300)
    outs = []
    for rules in ((), ((8, 1024, False, 128, 1), (8, 1024, True, 256, 2))):
        monkeypatch.setattr(launchers, "READ_TABLE_RULES", rules)
        for fn in (kvkernels.build_kv_read_table, kvkernels.build_kv_read_table_legacy):
            out = torch.full((3, 300), -7, dtype=torch.int32, device=triton_tier.device)
            outs.append(fn(**args, out=out).tolist())
    assert all(o == outs[0] for o in outs)
    assert outs[0][0] == [2 * c for c in range(300)] and outs[0][2] == [-7] * 300


def test_two_column_blocks_per_trip_write_the_same_table(triton_tier, monkeypatch):
    """UNROLL=2 gathers two column blocks before storing either; rows of every live length
    (none, one block, an odd number of blocks, past max_pages) come out the same."""
    monkeypatch.setattr(launchers, "BLOCK_COLS", 4)  # many blocks, several trips
    monkeypatch.setattr(launchers, "TARGET_BLOCKS", 2)
    r2t = triton_tier.t([[(c * 7 + r) % 50 for c in range(41)] for r in range(4)])
    args = dict(req_to_token=r2t, req_pool_indices=triton_tier.t([0, 1, 2, 3, 1]),
                seq_lens=triton_tier.t([41, 0, 3, 13, 99]), v2p=triton_tier.t(list(range(60))), multiplier=3,
                page_size=1, max_pages=41)
    outs = []
    for unroll in (1, 2):
        monkeypatch.setattr(launchers, "READ_TABLE_UNROLL", unroll)
        out = torch.full((5, 41), -7, dtype=torch.int32, device=triton_tier.device)
        outs.append(kvkernels.build_kv_read_table(**args, out=out).tolist())
    assert outs[0] == outs[1]
    assert outs[0][1] == [-7] * 41 and outs[0][2][3:] == [-7] * 38 and -7 not in outs[0][4]


def test_long_many_row_tables_take_two_blocks_per_trip(monkeypatch):
    assert launchers.read_table_unroll(256, 131072) == 2
    assert launchers.read_table_unroll(16, 131072) == 1 and launchers.read_table_unroll(256, 8192) == 1
    monkeypatch.setattr(launchers, "READ_TABLE_UNROLL", 1)
    assert launchers.read_table_unroll(256, 131072) == 1
