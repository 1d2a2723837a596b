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
