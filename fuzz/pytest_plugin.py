"""kvfuzz inside a kernel team's own pytest suite.

    pytest -p kvfuzz --kvfuzz-kernels=their.kernels [--kvfuzz-backend interpret]
           [--kvfuzz-allocator MODULE_OR_FILE[:FACTORY]]
           [--kvfuzz-corpus DIR] [--kvfuzz-profile dev|ci|nightly] [--kvfuzz-out DIR]

adds these test items (marked ``kvfuzz``) to whatever else the session collects:

- ``kvfuzz::state_machine``: the Hypothesis differential state machine
  (``DifferentialMachine.for_tier(make_tier(backend, kernels))``); a divergence fails it
  and writes the shrunk sequence as a case file into ``--kvfuzz-out`` (default
  ``kvfuzz-out``) that ``kvfuzz replay`` reproduces and that can join the corpus;
- ``kvfuzz::case[FILE]``: one per case file (``*.json``, searched recursively) under
  ``--kvfuzz-corpus``, replayed on the kernel set under test, whatever kernel set it was
  found on; it passes when no oracle diverges.

``--kvfuzz-allocator`` puts a team's allocator under test (``docs/allocators.md``) in place
of ours; given alone, it is driven over our kernel set for the backend.

Installed, pytest loads this plugin in every session (entry point ``kvfuzz``), so it adds
nothing unless ``--kvfuzz-kernels`` or ``--kvfuzz-allocator`` is given. Without an install, ``-p fuzz.pytest_plugin``
loads it by module name.

The Hypothesis profiles are registered as ``kvfuzz-dev``, ``kvfuzz-ci`` and
``kvfuzz-nightly`` and apply to the state machine only: the suite's own Hypothesis tests
keep their settings, and a suite's own ``ci`` profile is not overwritten.

The interpreter tier needs ``TRITON_INTERPRET=1`` before Triton is imported, so the
plugin sets it as soon as the command line is parsed, before any conftest is imported.
It stays set for the whole session: the suite's other Triton tests run interpreted too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .engine.tiers import BACKENDS, SetupError, select_backend

# name: (max_examples, stateful_step_count, other settings). Measured with kvkernels on the
# interpreter tier, 2-core CPU: dev 1.5 s, ci 9 s.
PROFILES = {
    "dev": (20, 30, {}),  # keeps Hypothesis' example database: a failure is tried first next run
    "ci": (50, 50, {"database": None, "derandomize": True}),  # a pre-merge gate: the same sequences every run
    "nightly": (1000, 100, {"database": None}),
}
DEFAULT_PROFILE = "dev"
DEFAULT_OUT = "kvfuzz-out"

_TIER = pytest.StashKey()  # the Tier the items run on, built in pytest_configure


def pytest_addoption(parser):
    group = parser.getgroup("kvfuzz", "kvfuzz: differential fuzzing of a paged KV-cache kernel set")
    group.addoption("--kvfuzz-kernels", metavar="MODULE_OR_FILE",
                    help="kernel set under test (a dotted module or a .py file); without it the plugin adds no tests")
    group.addoption("--kvfuzz-allocator", metavar="MODULE_OR_FILE[:FACTORY]",
                    help="allocator under test (docs/allocators.md); default: ours, kvkernels.allocator:DeviceAllocator")
    group.addoption("--kvfuzz-backend", choices=BACKENDS, default=None,
                    help="tier: torch (default; pure-torch sets), interpret (Triton kernels under TRITON_INTERPRET=1 "
                         "on the CPU) or cuda")
    group.addoption("--kvfuzz-corpus", metavar="DIR",
                    help="replay every case file (*.json) under DIR as one test each (default: none)")
    group.addoption("--kvfuzz-profile", choices=sorted(PROFILES), default=None,
                    help=f"Hypothesis profile of the state machine (default: {DEFAULT_PROFILE})")
    group.addoption("--kvfuzz-out", metavar="DIR", default=None,
                    help=f"where a state-machine failure is written as a case file (default: {DEFAULT_OUT})")


def _given(opts) -> dict:
    return {name: getattr(opts, f"kvfuzz_{name}", None)
            for name in ("kernels", "allocator", "backend", "corpus", "profile", "out")}


def _usage(exc: Exception) -> pytest.UsageError:
    """A SetupError's message, with the CLI's option names spelled the plugin's way."""
    text = (str(exc).replace("--kernels ", "--kvfuzz-kernels=", 1).replace("--backend ", "--kvfuzz-backend ")
            .replace("--allocator ", "--kvfuzz-allocator=", 1))
    return pytest.UsageError(f"kvfuzz: {text}")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """The earliest point with the command line parsed: before any conftest (which may
    import Triton) is imported."""
    opts = _given(early_config.known_args_namespace)
    if (opts["kernels"] or opts["allocator"]) and opts["backend"] == "interpret":
        try:
            select_backend("interpret")
        except SetupError as exc:
            raise _usage(exc) from exc


def pytest_configure(config):
    config.addinivalue_line("markers", "kvfuzz: a test item added by the kvfuzz plugin (--kvfuzz-kernels)")
    opts = _given(config.option)
    if not (opts["kernels"] or opts["allocator"]):
        stray = [f"--kvfuzz-{name}" for name, value in opts.items() if value is not None]
        if stray:
            raise pytest.UsageError(f"kvfuzz: {', '.join(stray)} given without --kvfuzz-kernels (the kernel set "
                                    "to test) or --kvfuzz-allocator; the plugin adds no tests without one")
        return
    if opts["corpus"] and not Path(opts["corpus"]).is_dir():
        raise pytest.UsageError(f"kvfuzz: --kvfuzz-corpus {opts['corpus']}: not a directory")
    _register_profiles()
    from .engine.allocators import attach
    from .engine.tiers import make_tier

    try:
        tier = attach(make_tier(opts["backend"] or "torch", opts["kernels"]), opts["allocator"])
    except SetupError as exc:
        raise _usage(exc) from exc
    config.stash[_TIER] = tier


def _register_profiles() -> None:
    from hypothesis import HealthCheck, Phase, settings

    for name, (examples, steps, extra) in PROFILES.items():
        # No explain phase: on a failure it replays the shrunk example hundreds of times.
        settings.register_profile(
            f"kvfuzz-{name}", max_examples=examples, stateful_step_count=steps, deadline=None,
            report_multiple_bugs=False, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
            **extra)


def pytest_report_header(config):
    tier = config.stash.get(_TIER, None)
    if tier is None:
        return None
    corpus = config.option.kvfuzz_corpus
    cases = f"{len(_case_files(Path(corpus)))} case files in {corpus}" if corpus else "no corpus"
    allocator = f" allocator={tier.allocator_name}" if tier.allocator_name else ""
    return (f"kvfuzz: kernels={tier.kernels_name}{allocator} backend={tier.backend} "
            f"profile={config.option.kvfuzz_profile or DEFAULT_PROFILE}, {cases}")


def _case_files(corpus: Path) -> list[Path]:
    return sorted(corpus.rglob("*.json"))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """The session's own collection gets one more node, so the kvfuzz items are counted,
    listed by --collect-only and selected by -k / -m like any other test."""
    report = yield
    if isinstance(collector, pytest.Session) and collector.config.stash.get(_TIER, None) is not None:
        report.result.append(KvfuzzSuite.from_parent(collector, name="kvfuzz", nodeid="kvfuzz"))
    return report


class KvfuzzFailure(AssertionError):
    """A kvfuzz item failed for a reason its message says in full (no traceback needed)."""


class KvfuzzSuite(pytest.Collector):
    def collect(self):
        items = [MachineItem.from_parent(self, name="state_machine")]
        corpus = self.config.option.kvfuzz_corpus
        if corpus:
            root = Path(corpus)
            items += [CaseItem.from_parent(self, name=f"case[{path.relative_to(root).as_posix()}]", path=path)
                      for path in _case_files(root)]
        for item in items:
            item.add_marker(pytest.mark.kvfuzz)
        return items


class _KvfuzzItem(pytest.Item):
    @property
    def tier(self):
        return self.config.stash[_TIER]

    def repr_failure(self, excinfo, style=None):
        from .engine.case import CaseError

        if isinstance(excinfo.value, (KvfuzzFailure, CaseError, SetupError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"kvfuzz: {self.name}"


class MachineItem(_KvfuzzItem):
    """The differential state machine on the kernel set under test."""

    def runtest(self):
        from hypothesis import settings
        from hypothesis.stateful import run_state_machine_as_test

        from .engine.strategies import DifferentialMachine
        from .engine.verdict import Divergence

        tier = self.tier
        profile = self.config.option.kvfuzz_profile or DEFAULT_PROFILE
        last = {}

        def teardown(machine):
            if machine.run is not None:  # Hypothesis runs the shrunk example last
                last["run"] = (machine.config, machine.knobs, list(machine.ops))
            DifferentialMachine.teardown(machine)

        base = DifferentialMachine.for_tier(tier)
        # A name of its own per tier (and no source to find): Hypothesis keys its example
        # database on it, so two kernel sets never replay each other's examples.
        suffix = "".join(ch if ch.isalnum() else "_" for ch in f"_{tier.allocator_name}") if tier.allocator_name else ""
        machine = type(f"kvfuzz_{base.__name__}{suffix}", (base,), {"teardown": teardown})
        try:
            run_state_machine_as_test(machine, settings=settings.get_profile(f"kvfuzz-{profile}"))
        except Divergence as d:
            where = self._write_case(d, *last["run"]) if "run" in last else None
            how = f"\ncase file: {where}\nreplay it: kvfuzz replay {where}" if where else ""
            who = tier.kernels_name + (f", allocator {tier.allocator_name}" if tier.allocator_name else "")
            raise KvfuzzFailure(f"kvfuzz state machine ({tier.backend}, {who}): {d}{how}") from d

    def _write_case(self, divergence, config, knobs, ops) -> Path:
        from .engine.case import Case, write_case

        tier = self.tier
        case = Case.found(config=config, ops=ops, divergence=divergence, original_len=len(ops), tier=tier.backend,
                          kernels=tier.kernels_name, knobs=knobs, allocator=tier.allocator_name)
        out = Path(self.config.option.kvfuzz_out or DEFAULT_OUT)
        return write_case(case, out if out.is_absolute() else self.config.invocation_params.dir / out)


class CaseItem(_KvfuzzItem):
    """One case file of the corpus, replayed on the kernel set under test."""

    def runtest(self):
        from .engine.case import load_case
        from .engine.dispatch import replay

        tier = self.tier
        case = load_case(self.path)
        divergence, _ = replay(case.config, case.ops, tier, knobs=case.knobs)
        if divergence is not None:
            raise KvfuzzFailure(f"{self.path}: fails on {tier.backend} with {tier.kernels_name}: {divergence}\n"
                                f"(signature {divergence.signature}; the case file pins {case.signature})")
