"""The order the suite's tests are handed to pytest-xdist workers in: the long ones first.

``ci/test.sh`` runs ``-n 2 --dist worksteal``. Worksteal splits the collection, in its order,
into one contiguous block per worker, and an idle worker then steals the back half of the
busiest worker's queue. It does not sort by duration: a campaign test collected last starts
last, and the suite ends minutes after the other worker ran dry (the tail). So each worker's
block is laid out here to start with its share of the long tests (``MEASURED_S``, or
``@pytest.mark.slow``), the longest first, each to the block with the least so far; the
short ones follow, in collection order, and are what stealing moves about at the end.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

# Seconds per test (call and setup) in `ci/test.sh --durations=70` on a fresh clone,
# 2-core machine, -n 3 (its tests of 6 s or more): only their order matters. A key with parameters
# is that one instance; a test with none here but marked slow counts DEFAULT_S.
MEASURED_S = {
    # (test_replayable's four are estimates: its exit_nth and kill_nth took 94 s together on 2 cores
    # at a load average of 9-17, not a fresh clone's run; they are set beside test_verdicts' like ones)
    "tests/fuzz/test_replayable.py::test_each_fixture_campaign_gives_cases_that_replay_rated_fresh_and_one_minimal[hang_nth]": 30,
    "tests/fuzz/test_replayable.py::test_each_fixture_campaign_gives_cases_that_replay_rated_fresh_and_one_minimal[kill_nth]": 20,
    "tests/fuzz/test_replayable.py::test_each_fixture_campaign_gives_cases_that_replay_rated_fresh_and_one_minimal[exit_nth]": 18,
    "tests/fuzz/test_replayable.py::test_each_fixture_campaign_gives_cases_that_replay_rated_fresh_and_one_minimal[flaky]": 15,
    "tests/fuzz/test_verdicts.py::test_every_fixture_gets_the_right_verdict_with_default_flags[hang_late]": 46,
    "tests/fuzz/test_shrink_lanes.py::test_a_fault_fixture_case_shrinks_to_the_same_case_at_width_1_and_3": 20,  # 37 at a load of 3
    "tests/test_pytest_plugin.py::test_entry_point_after_pip_install": 35,
    "tests/fuzz/test_program_order.py::test_a_trip_bug_behind_literal_block_sizes_is_found_at_production_scale": 33,
    "tests/fuzz/test_engine.py::test_replay_pytest_exports_a_standalone_test": 27,
    "tests/fuzz/test_scale.py::test_a_set_that_asserts_out_holds_max_tokens_fuzzes_clean_at_production_scale": 27,
    "tests/fuzz/test_verdicts.py::test_every_fixture_gets_the_right_verdict_with_default_flags[exit_nth]": 26,
    "tests/fuzz/test_scale.py::test_a_production_only_variant_is_found_shrunk_and_replayed[drops_last_col_block]": 25,
    "tests/fuzz/test_scale.py::test_a_production_only_variant_is_found_shrunk_and_replayed[stride_skips_trips]": 24,
    "tests/fuzz/test_state_machine.py::test_machine_agrees_on_interpreter_tier": 23,
    "tests/clients/test_sglang_allocator.py::test_a_bounded_campaign_is_clean[interpret-2]": 22,
    "tests/clients/test_sglang_allocator.py::test_a_bounded_campaign_is_clean[torch-12]": 20,
    "tests/clients/test_sglang_allocator.py::test_a_dead_workers_ops_rebuild_from_its_hello_with_the_rules": 10,
    "tests/clients/test_sglang_allocator.py::test_a_found_case_names_sglangs_file_and_version_and_replays": 7,
    "tests/fuzz/test_compile_check.py::test_our_kernels_and_indep_compile_at_every_specialization[kvkernels]": 21,
    "tests/fuzz/test_supervision.py::test_a_faulty_kernel_set_yields_a_case_and_the_campaign_lives_on[hang-1]": 20,
    "tests/fuzz/test_compile_ahead.py::test_a_recipe_compiled_ahead_is_what_a_launch_with_the_real_tensors_finds_on_disk": 18,
    "tests/fuzz/test_head_start.py::test_a_head_start_compiles_what_it_scouted_and_its_marker_makes_the_next_one_nothing": 18,
    "tests/fuzz/test_head_start.py::test_the_scout_predicts_every_specialization_the_interpreters_real_launches_show": 11,
    "tests/fuzz/test_compile_check.py::test_a_cpu_run_reports_the_fixture_as_a_case_that_replays": 18,
    "tests/clients/test_sglang.py::test_spec_hostile_classes_find_exactly_the_baseline": 18,
    "tests/test_pytest_plugin.py::test_interpreter_tier_from_a_clean_environment": 17,
    "tests/fuzz/test_allocators.py::test_cli_interpreter_tier_finds_a_bug_and_replays_it": 15,
    "tests/fuzz/test_far.py::test_our_kernels_are_clean_past_the_boundary_in_out": 15,
    "tests/kvref/test_chain.py::test_chains_hold_every_invariant_through_thousands_of_sequences": 18,  # a 1-core run
    "tests/fuzz/test_supervision.py::test_a_faulty_kernel_set_yields_a_case_and_the_campaign_lives_on[hang-2]": 15,
    "tests/clients/test_sglang.py::test_valid_input_is_clean": 14,
    "tests/fuzz/test_guide.py::test_what_blind_sequences_never_reached_is_named_and_guided_ones_reach_some_of_it": 14,
    "tests/fuzz/test_allocators.py::test_pytest_plugin_takes_an_allocator": 23,  # ci profile since (was 14)
    "tests/fuzz/test_ops.py::test_both_generators_cover_the_same_kinds": 14,
    "tests/fuzz/test_engine.py::test_run_on_the_correct_kernels_is_clean": 13,
    "tests/fuzz/test_hostile.py::test_a_set_that_asserts_out_holds_max_tokens_fuzzes_clean_at_small_scale[torch]": 13,
    "tests/kvref/test_machine.py::TestAllocatorMachine::runTest": 13,
    "tests/fuzz/test_verdicts.py::test_a_case_found_with_hostile_all_replays_in_that_mode": 11,
    "tests/fuzz/test_compile_ahead.py::test_a_following_compile_ahead_compiles_later_sequences_and_stops_with_its_pool": 11,
    "tests/test_pytest_plugin.py::test_a_planted_bug_fails_the_machine_and_the_corpus_and_leaves_a_case": 11,
    "tests/fuzz/test_compile_ahead.py::test_the_scout_records_the_specializations_real_launches_of_the_same_ops_show[indep]": 11,
    "tests/fuzz/test_tracks.py::test_what_could_not_be_checked_is_in_the_summary": 10,
    "tests/fuzz/test_cost.py::test_int32_offset_is_found_at_production_scale_on_the_interpreter": 10,
    "tests/test_pytest_plugin.py::test_collects_the_machine_and_one_item_per_case": 10,
    "tests/fuzz/test_compile_check.py::test_our_kernels_and_indep_compile_at_every_specialization[indep]": 10,
    "tests/fuzz/test_scale.py::test_the_vectorized_path_agrees_with_kvref_on_small_shapes[interpret]": 10,
    "tests/fuzz/test_compile_ahead.py::test_the_scout_records_the_specializations_real_launches_of_the_same_ops_show[kvkernels]": 10,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales[narrow_width-production]": 10,
    "tests/fixtures_selftest/test_new_foreign_kernels.py::test_literal_blocks_matches_spec_at_two_trips[interpret]": 10,
    "tests/fuzz/test_vector_oracle.py::test_read_table_packed_matches_kvref": 9,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales[clamp_max_tokens-production]": 9,
    "tests/sync/test_corpus_and_calibration.py::test_gpu_worker_protocol_survives_crashes_and_broken_contexts": 9,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales[int32_bounded-production]": 9,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales[refuse_short_out-production]": 9,
    "tests/fixtures_selftest/test_new_foreign_kernels.py::test_literal_stride_variants_only_past_one_trip[interpret-literal_blocks_stride2]": 8,
    "tests/fuzz/test_cost.py::test_a_dear_table_reaches_a_second_trip_within_the_sequence_budget[kvkernels]": 8,
    "tests/fixtures_selftest/test_foreign_kernels.py::test_read_tables_match_spec[interpret-indep_other_blocks]": 8,
    "tests/fuzz/test_vector_oracle.py::test_read_table_matches_kvref": 8,
    "tests/fuzz/test_hostile.py::test_production_probes_stay_clean_on_sets_that_mask_everything[indep]": 8,
    "tests/fuzz/test_hostile.py::test_a_set_that_asserts_out_holds_max_tokens_fuzzes_clean_at_small_scale[interpret]": 7,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales[drop_overlong_rows-production]": 7,
    "tests/fuzz/test_supervision.py::test_the_spec_correct_foreign_set_is_clean[2]": 7,
    "tests/fuzz/test_preflight.py::test_read_table_check_refuses_exactly_what_kvref_refuses": 7,
    "tests/fuzz/test_r2t_dtype.py::test_production_sequences_run_both_dtypes_clean[interpret]": 7,
    "tests/fuzz/test_guide.py::test_the_report_names_what_no_sequence_reached": 7,
    "tests/fuzz/test_scale.py::test_correct_foreign_sets_run_clean[indep_other_blocks]": 6,
    "tests/fixtures_selftest/test_new_foreign_kernels.py::test_literal_stride_variants_only_past_one_trip[interpret-literal_blocks_legacy_stride]": 6,
    "tests/fuzz/test_vector_oracle.py::test_free_unbind_matches_kvref": 6,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales[letter_all-production]": 6,
    "tests/fuzz/test_tracks.py::test_replay_in_process_works_at_either_scale[small]": 6,
    "tests/fuzz/test_verdicts.py::test_every_fixture_gets_the_right_verdict_with_default_flags[sigkill]": 6,
    "tests/clients/test_sglang.py::test_the_documented_cases_still_fail_with_their_signature[free-past-v2p]": 6,
    "tests/fuzz/test_allocators.py::test_cli_finds_each_planted_bug_and_the_case_replays[free_sorts_free_list]": 6,
    "tests/fuzz/test_guide.py::test_the_corpus_survives_a_killed_campaign_and_the_next_one_resumes_from_it": 6,
    "tests/fixtures_selftest/test_new_foreign_kernels.py::test_hang_late_hangs_only_at_exactly_k_pages[interpret]": 6,
    "tests/fuzz/test_zygote_daemon.py::test_an_idle_daemon_exits_and_removes_its_socket_and_the_next_command_starts_another": 6,
    "tests/fuzz/test_hostile.py::test_production_probes_stay_clean_on_sets_that_mask_everything[kvkernels]": 6,
    "tests/tools/test_morning_page.py::test_a_real_campaigns_page_says_what_it_found": 15,  # its campaign
    # not in a fresh clone's durations yet: 128 s on a 2-core machine shared with other suites (load 15-21),
    # in a run where test_fuzz_sh_keeps_and_resumes_a_corpus_where_kvfuzz_corpus_names_one (under 6 s in
    # the durations above) took 32 s: about a fifth of it unloaded
    "tests/tools/test_host.py::test_the_host_nightly_leaves_one_merged_result_per_campaign_and_one_corpus": 25,
}
DEFAULT_S = 10  # a slow test measured under 6 s, or added since: between the short ones and the long


def weight(nodeid: str, slow: bool) -> float:
    """How long a test is expected to take (0: a short one): its own entry, else its name's
    without parameters, else DEFAULT_S for a slow one."""
    return MEASURED_S.get(nodeid, MEASURED_S.get(nodeid.split("[")[0], DEFAULT_S if slow else 0))


def block_sizes(n: int, workers: int) -> list[int]:
    """The sizes of the blocks worksteal's first ``check_schedule`` sends, in order: each idle
    node gets ``len(pending) // nodes_remaining`` of what is left (pytest-xdist 3.x)."""
    sizes, left = [], n
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def long_first(items: Sequence[T], workers: int, cost: Callable[[T], float]) -> list[T]:
    """``items`` reordered so that each block of ``block_sizes`` starts with long items
    (``cost > 0``), by decreasing cost, each long item given to the block with the least cost
    so far (longest-processing-time scheduling); the others keep their relative order. The
    same list for every worker process (xdist refuses collections that differ)."""
    long = sorted((i for i in items if cost(i) > 0), key=cost, reverse=True)  # stable: ties keep their order
    short = [i for i in items if cost(i) <= 0]
    if workers < 2 or not long:
        return long + short
    blocks: list[list[T]] = [[] for _ in range(workers)]
    totals = [0.0] * workers
    for item in long:
        w = totals.index(min(totals))
        blocks[w].append(item)
        totals[w] += cost(item)
    out: list[T] = []
    for mine, size in zip(blocks, block_sizes(len(items), workers)):
        take = max(0, size - len(mine))
        out += mine + short[:take]
        short = short[take:]
    return out + short  # only when the long ones outnumber a block: the rest at the end
