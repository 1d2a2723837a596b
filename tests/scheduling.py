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

# Seconds per call (the longest parameter) in the lead's --durations run of 2026-12-02 on a shared
# 2-core machine: only their order matters. A test absent here but marked slow counts DEFAULT_S.
MEASURED_S = {
    "tests/fuzz/test_tracks.py::test_what_could_not_be_checked_is_in_the_summary": 240,
    "tests/fuzz/test_hostile.py::test_production_probes_stay_clean_on_sets_that_mask_everything": 181,
    "tests/fuzz/test_program_order.py::test_a_trip_bug_behind_literal_block_sizes_is_found_at_production_scale": 175,
    "tests/fuzz/test_work_limits.py::test_same_seed_and_max_sequences_give_identical_cases_and_summaries_idle_and_under_load": 155,
    "tests/fuzz/test_verdicts.py::test_a_case_found_with_hostile_all_replays_in_that_mode": 149,
    "tests/fuzz/test_verdicts.py::test_every_fixture_gets_the_right_verdict_with_default_flags": 139,
    "tests/fuzz/test_program_order.py::test_an_order_dependent_free_is_found_on_the_cpu_and_replays": 128,
    "tests/fuzz/test_supervision.py::test_a_faulty_kernel_set_yields_a_case_and_the_campaign_lives_on": 117,
    "tests/fuzz/test_compile_check.py::test_a_cpu_run_reports_the_fixture_as_a_case_that_replays": 117,
    "tests/fuzz/test_scale.py::test_a_production_only_variant_is_found_shrunk_and_replayed": 108,
    "tests/fuzz/test_tracks.py::test_a_worker_that_met_a_cuda_fault_is_replaced": 100,
    "tests/fuzz/test_engine.py::test_run_on_the_correct_kernels_is_clean": 89,
    "tests/fuzz/test_engine.py::test_run_finds_minimizes_and_replays_the_planted_bug": 85,
    "tests/fuzz/test_far.py::test_our_kernels_are_clean_past_the_boundary_in_out": 75,
    "tests/fuzz/test_engine.py::test_replay_pytest_exports_a_standalone_test": 71,
    "tests/fuzz/test_ops.py::test_both_generators_cover_the_same_kinds": 62,
    "tests/fuzz/test_program_order.py::test_in_launch_order_the_same_free_is_clean": 59,
    "tests/test_pytest_plugin.py::test_entry_point_after_pip_install": 59,
    "tests/fuzz/test_supervision.py::test_the_spec_correct_foreign_set_is_clean": 58,
    "tests/fuzz/test_palette.py::test_every_palette_draw_lies_inside_the_range_asked_for": 58,
    "tests/fuzz/test_engine.py::test_the_campaign_finds_each_fake": 56,
    "tests/fuzz/test_work_limits.py::test_stop_on_first_returns_once_the_first_case_is_written_and_minimized": 53,
    "tests/fuzz/test_generated_valid.py::test_production_generator_emits_only_valid_input": 46,
    "tests/fuzz/test_guide.py::test_the_corpus_survives_a_killed_campaign_and_the_next_one_resumes_from_it": 45,
    "tests/fuzz/test_tracks.py::test_replay_in_process_works_at_either_scale": 45,
    "tests/fuzz/test_allocators.py::test_cli_finds_each_planted_bug_and_the_case_replays": 42,
    "tests/fuzz/test_work_limits.py::test_max_ops_ends_each_worker_at_the_sequence_that_reaches_its_share": 39,
    "tests/fuzz/test_allocators.py::test_cli_interpreter_tier_finds_a_bug_and_replays_it": 36,
    "tests/fuzz/test_far.py::test_int32_offset_is_found_by_a_replay_on_the_interpreter": 35,
    "tests/fuzz/test_engine.py::test_torch_run_on_the_correct_kernels_prints_one_summary": 32,
    "tests/fuzz/test_mutants.py::test_an_allocator_mutant_is_killed_on_the_torch_tier": 31,
    "tests/clients/test_sglang.py::test_spec_hostile_classes_find_exactly_the_baseline": 31,
    "tests/fuzz/test_mutants.py::test_a_kernel_mutant_is_killed_and_minimized_on_the_interpreter": 30,
    "tests/fuzz/test_engine.py::test_replay_of_a_case_passes_on_the_correct_kernels": 30,
    "tests/fuzz/test_work_limits.py::test_a_work_limit_the_budget_cut_short_is_not_clean": 30,
    "tests/fuzz/test_supervision.py::test_progress_and_fail_lines_reach_a_ci_log_before_the_end": 29,
    "tests/fuzz/test_hostile.py::test_a_set_that_asserts_out_holds_max_tokens_fuzzes_clean_at_small_scale": 29,
    "tests/fuzz/test_scale.py::test_our_kernels_run_clean_at_their_default_constants": 29,
    "tests/fuzz/test_supervision.py::test_a_case_replayed_on_a_kernel_set_without_its_knobs_drops_them_with_a_warning": 27,
    "tests/fuzz/test_supervision.py::test_executor_answers_a_crash_and_then_works_again": 27,
    "tests/fuzz/test_scale.py::test_a_set_that_asserts_out_holds_max_tokens_fuzzes_clean_at_production_scale": 26,
    "tests/fixtures_selftest/test_letter_kernels.py::test_letter_sets_are_clean_at_both_scales": 26,
    "tests/fuzz/test_engine.py::test_a_case_replays_from_another_directory": 25,
    "tests/fuzz/test_supervision.py::test_sigterm_ends_the_run_cleanly_with_every_case_on_disk": 25,
}
DEFAULT_S = 30


def weight(nodeid: str, slow: bool) -> float:
    """How long a test is expected to take (0: a short one), from its node id without parameters."""
    return MEASURED_S.get(nodeid.split("[")[0], DEFAULT_S if slow else 0)


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
