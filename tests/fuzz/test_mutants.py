"""The mutant catalogue: every mutant still applies to today's sources, and the fuzzer kills them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.engine.case import Signature
from fuzz.tools.mutants import MUTANTS, SRC, Mutant, MutantError, hunt, mutant_tier, mutated_source

REPO = Path(__file__).resolve().parents[2]
INTERPRET = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="Triton's interpreter is off (a GPU is present)")


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_mutant_still_applies_and_changes_its_file(m):
    assert mutated_source(m) != (SRC / m.file).read_text()


def test_a_drifted_mutant_is_an_error_not_a_silent_no_op():
    drifted = Mutant("drifted", "triton_kernels.py", (("this line is not in the kernels", "x"),), "test")
    with pytest.raises(MutantError, match="occurs 0 times"):
        mutated_source(drifted)


def test_a_kernel_mutant_needs_a_triton_tier():
    kernel_mutant = next(m for m in MUTANTS if m.file == "triton_kernels.py")
    with pytest.raises(MutantError, match="--backend interpret or cuda"):
        mutant_tier(kernel_mutant, "torch")


# A hunt runs to its first kill (stop_after=1), or to its budget: the budget here is only a cap
# for a mutant no longer killed, not the 30 s of `kvfuzz mutants` (a worker's start-up on a loaded
# runner, then its sequences and the minimizing, all came out of it). How fast a kill comes is
# benchmarks/first_case.py's to measure.
HUNT_CAP_S = 300


@INTERPRET
def test_a_kernel_mutant_is_killed_and_minimized_on_the_interpreter():
    report = hunt(next(m for m in MUTANTS if m.name == "free-forgets-p2v-tombstone"), "interpret", HUNT_CAP_S)
    assert report.killed and report.minimized_len <= 5, report
    assert report.signature.op in ("free", "k_free_unbind")


def test_an_allocator_mutant_is_killed_on_the_torch_tier():
    report = hunt(next(m for m in MUTANTS if m.name == "alloc-takes-holes-from-back"), "torch", HUNT_CAP_S)
    assert report.killed and report.signature == Signature("alloc", "state", "v2p"), report


def test_mutants_list_names_the_whole_catalogue():
    proc = subprocess.run([sys.executable, "-m", "fuzz", "mutants", "--list"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0
    assert [line.split()[0] for line in proc.stdout.splitlines()] == [m.name for m in MUTANTS]


def test_a_mutant_reaches_the_command_line_as_a_module(tmp_path, monkeypatch):
    """benchmarks/first_case.py hands a mutant to ``kvfuzz run`` as a module that replaces
    itself by ``mutant_module``: a kernel set over the mutated kernels, or the mutated allocator."""
    from fuzz.engine.tiers import REQUIRED, load_kernels
    from fuzz.tools.mutants import mutant_module

    kernel = next(m for m in MUTANTS if m.file == "triton_kernels.py")
    alloc = next(m for m in MUTANTS if m.file == "allocator.py")
    wrapper = '''import sys\nfrom fuzz.tools.mutants import MUTANTS, mutant_module\n''' \
              '''sys.modules[__name__] = mutant_module(next(m for m in MUTANTS if m.name == {name!r}))\n'''
    (tmp_path / "kvfuzz_test_mutant_kernels.py").write_text(wrapper.format(name=kernel.name))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = load_kernels("kvfuzz_test_mutant_kernels")
    assert all(callable(getattr(module, fn)) for fn in REQUIRED)
    assert Path(module._k.__file__).read_text() == mutated_source(kernel)  # the mutant, not our kernels
    assert Path(mutant_module(alloc).__file__).read_text() == mutated_source(alloc)
    assert hasattr(mutant_module(alloc), "DeviceAllocator")
