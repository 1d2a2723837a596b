"""Shared test setup.

The interpreter tier needs ``TRITON_INTERPRET=1`` before Triton decorates any kernel,
so it is set here, before anything imports ``kvkernels``, whenever no GPU is present.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU; the interpreter-tier twin covers this on the CPU")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:  # cuda(no_twin=WHY): a GPU-only behaviour, and why
            why = item.get_closest_marker("cuda").kwargs.get("no_twin")
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU; no CPU twin: {why}") if why else skip_cuda)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)  # in an xdist worker (it sees dist "no")
    if workers > 1:  # ci/test.sh's --dist worksteal: the long tests first (tests/scheduling.py)
        from tests.scheduling import long_first, weight

        def cost(item):  # a test skipped unconditionally (cuda on a CPU) takes no time
            if any(m.name == "skip" for m in item.iter_markers()):
                return 0
            return weight(item.nodeid, item.get_closest_marker("slow") is not None)

        items[:] = long_first(items, workers, cost)


@pytest.fixture(autouse=True)
def every_minimized_case_keeps_its_signature(monkeypatch):
    """Pins, across the whole suite, that whatever any test minimizes replays with the
    signature it was minimized for: the minimizer's answer is judged once more, afresh,
    by the same judge (a flaky one gets its tries). A case that drifts to another
    signature fails the test that made it. Campaigns run in subprocesses are covered by
    their own replay checks."""
    from fuzz.engine import minimize

    real = minimize.Minimizer.run

    def checked(self, config, ops, known=None):
        config2, ops2, failure = real(self, config, ops, known=known)
        assert failure.signature == self.signature, f"minimized to {failure.signature}, not {self.signature}"
        from fuzz.engine.supervise import Cancelled

        for _ in range(self.tries):
            try:
                again = self.judge(config2, ops2)
            except (TimeoutError, Cancelled):  # the campaign ended under it: nothing to judge with
                return config2, ops2, failure
            if self.same(again):
                break
        else:
            raise AssertionError(f"the minimized case ({len(ops2)} ops) no longer fails with {self.signature}: "
                                 f"{again}")
        return config2, ops2, failure

    monkeypatch.setattr(minimize.Minimizer, "run", checked)
    yield


@pytest.fixture(autouse=True)
def launch_knobs_are_back_at_their_defaults():
    """A test that runs a pool with launch knobs (``BLOCK_COLS=4`` ...) leaves them set in the
    kernel module, and a later test in the same worker (``--dist worksteal`` orders them as it
    likes) then launches other grids than it reckons with. After each test every kernel set's
    knobs go back to the defaults ``knobs.apply`` recorded when it first set them."""
    yield
    import sys

    for mod in list(sys.modules.values()):
        defaults = getattr(mod, "_KVFUZZ_DEFAULTS", None)
        if isinstance(defaults, dict):
            for name, value in defaults.items():
                setattr(mod, name, value)
