"""Case files: a failure as versioned JSON that replays anywhere.

Schema ``kvfuzz-case/1``: config, ops, seed, tier, kernel set and its launch knobs
(block sizes, optional), the allocator when it is not ours (``allocator``, with
``environment.allocator_sha256``; absent in older files, which mean ours), signature
(op kind + oracle + field, no addresses or values),
the first divergence with spec vs target values, original and minimized lengths, and
the environment it was found in. Keys a reader does not know (a corpus case's
``note``) are kept and written back where they were.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import kvref

from ..environment import environment
from .chain_ops import check_chain_ops
from .kinds import parse_ops
from .ops import Op, OpError
from .sources import resolve_kernels, source_hash
from .verdict import CaseError, Signature

__all__ = ["SCHEMA", "Case", "CaseError", "Signature", "load_case", "resolve_kernels", "source_hash", "write_case"]

SCHEMA = "kvfuzz-case/1"
REQUIRED = ("schema", "config", "ops", "signature")
# Written in this order; keys not listed here follow "schema" in the order they came.
ORDER = ("schema", "config", "ops", "seed", "scenario", "tier", "kernels", "kernels_file", "allocator",
         "allocator_file", "knobs", "mode", "signature", "divergence", "fault", "lengths", "minimize", "minimal",
         "reproduced", "flaky", "history", "nondeterministic", "environment")
MODE_DEFAULTS = {"hostile": "spec", "check_every": 1}  # a case without ``mode`` was found in these


@dataclass
class Case:
    config: kvref.PoolConfig
    ops: list[Op]
    signature: Signature
    seed: int | None = None
    scenario: str | None = None
    tier: str | None = None
    kernels: str | None = None  # as named on the command line (a module, or a file relative to where it ran)
    kernels_file: str | None = None  # a kernel-set file, relative to the case file's folder
    knobs: dict | None = None
    allocator: str | None = None  # MODULE_OR_FILE[:FACTORY] as named on the command line; None: ours
    allocator_file: str | None = None  # an allocator file, relative to the case file's folder
    mode: dict = field(default_factory=dict)  # every option that changes what runs: hostile, check_every, ...
    divergence: dict | None = None
    fault: dict | None = None  # crash and timeout cases: how the process died, its last stderr lines
    lengths: dict = field(default_factory=dict)
    minimize: dict | None = None  # per minimizer pass: "tried/kept"
    # {"one_minimal", "candidates", "fresh"[, "note"]}: whether removing any single op (or history
    # sequence) was seen to lose the signature (in a fresh process each, when "fresh"); if not, why
    minimal: dict | None = None
    # {"k": failures, "n": runs, "fresh": runs that each ran in a process of their own} before the case was written
    reproduced: dict | None = None
    flaky: bool | None = None  # 0 < k < n
    history: dict | None = None  # a fault that needs the worker's earlier sequences: what they were
    # the campaign saw this case's kernel set fail non-deterministically (another case's k < n, or a
    # case that needs its history): {"seen": [...], "note"}; its replay takes the tries a rate needs
    nondeterministic: dict | None = None
    environment: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # keys this version does not interpret (e.g. "note")
    omitted: tuple = ()  # known keys the file it was read from did not have: not written back either
    path: Path | None = None  # where it was read from; never written

    @classmethod
    def found(cls, *, config, ops, divergence, original_len: int, seed=None, scenario=None, tier=None,
              kernels=None, knobs=None, extra: dict | None = None, mode: dict | None = None,
              allocator: str | None = None) -> Case:
        """A new case from a divergence the fuzzer found (and minimized)."""
        fault = _fault_of(divergence)
        env = environment()
        env["kernels_sha256"] = source_hash(kernels)
        if allocator:
            from .allocators import source_hash as allocator_hash

            env["allocator_sha256"] = allocator_hash(allocator)
            from .allocators import environment as allocator_environment

            env.update(allocator_environment(allocator))
        absent = (("fault", fault), ("kernels_file", None), ("allocator", allocator), ("allocator_file", None))
        return cls(config=config, ops=list(ops), signature=divergence.signature, seed=seed, scenario=scenario,
                   tier=tier, kernels=kernels, knobs=knobs, allocator=allocator, mode=dict(mode or MODE_DEFAULTS),
                   divergence=divergence.to_json(), fault=fault,
                   lengths={"original": original_len, "minimized": len(ops)}, environment=env,
                   extra=dict(extra or {}),
                   omitted=tuple(k for k, v in (*absent, ("minimize", None), ("minimal", None), ("reproduced", None),
                                                ("flaky", None), ("history", None), ("nondeterministic", None))
                                 if v is None))

    def with_minimized(self, config, ops, divergence, passes: dict | None = None) -> Case:
        lengths = dict(self.lengths, minimized=len(ops))
        omitted = tuple(k for k in self.omitted if not (k == "minimize" and passes is not None))
        return dataclasses.replace(self, config=config, ops=list(ops), divergence=divergence.to_json(),
                                   fault=_fault_of(divergence) or self.fault, lengths=lengths,
                                   minimize=passes if passes is not None else self.minimize, omitted=omitted)

    def with_fields(self, **values) -> Case:
        """A copy with known keys set (and written from now on, even if the file lacked them)."""
        omitted = tuple(k for k in self.omitted if k not in values)
        return dataclasses.replace(self, omitted=omitted, **values)

    def replay_tries(self, cap: int = 50) -> int:
        """How often a replay must run this case before a PASS means something: once for a
        case that always failed; for a flaky one, or any case of a kernel set its campaign saw
        fail non-deterministically (a 5/5 case of a set that fails one call in three passed 3
        of 19 single replays: ``git show ac2c61b:benchmarks/results/verdict-matrix/README.md``),
        enough runs that the bug goes unseen less than 0.1% of the time (at least its own number of runs, at most ``cap``).

        The rate is not taken as ``k/n``: five runs say little (a bug of rate 1/3 reproduces
        3 of 5 times one campaign in five, and ``k/n`` then asks for 8 tries, which all pass
        4% of the time). The chance of ``t`` passes is averaged over what ``k`` of ``n`` says
        the rate may be (a uniform prior, so a Beta(k+1, n-k+1) posterior):
        prod over i < t of (n-k+1+i) / (n+2+i).

        In a set seen failing by chance the rate is the lower of the case's own and the set's least
        reproduced case's (``lowest``): five runs of one case can be a lucky draw (a 4/5 case of a
        set whose cases failed 1 call in 3 passed 1 of 20 replays of 11 tries), and its cases share
        the cause. A rate of 0/n (it failed when found, in no fresh replay since) takes ``cap``."""
        r = self.reproduced or {}
        k, n = r.get("k") or 0, r.get("n") or 0
        low = (self.nondeterministic or {}).get("lowest") or {}
        if low.get("n") and (not n or (low.get("k") or 0) * n < k * low["n"]):
            k, n = low.get("k") or 0, low["n"]
        if not (self.flaky or self.nondeterministic) or not n:
            return 1
        t, unseen = 0, 1.0
        while unseen > 0.001 and t < cap:
            unseen *= (n - k + 1 + t) / (n + 2 + t)
            t += 1
        return max(n, t)

    def shrink_tries(self, cap: int = 10) -> int:
        """Runs of each minimizer candidate before it counts as passing (``kvfuzz minimize``): a
        flaky case's, or any case of a set seen failing by chance, ``replay_tries``; a case that
        fails every time (with the history it needs, where it needs one) once, as a campaign
        shrinks it. A mark from before ``by_chance`` was recorded takes the tries."""
        mark = self.nondeterministic or {}
        return self.replay_tries(cap) if self.flaky or mark.get("by_chance", bool(mark)) else 1

    @property
    def run_mode(self) -> dict:
        """The options the case was found in (the defaults for a case that predates ``mode``)."""
        return {**MODE_DEFAULTS, **(self.mode or {})}

    def filename(self) -> str:
        """``KERNELS--OP-ORACLE-FIELD.json``: the kernel set's file stem or module name (the
        allocator's, with its factory, when the case names one)."""
        name = self.kernels or "kernels"
        name, keep = (Path(name).stem if name.endswith(".py") else name), 40
        if self.allocator:
            from .allocators import split

            where, factory = split(self.allocator)
            name = (Path(where).stem if where.endswith(".py") else where) + (f"_{factory}" if factory else "")
            keep = 64
        return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[-keep:] + f"--{self.signature.slug()}.json"

    def to_json(self) -> dict:
        known = {"schema": SCHEMA, "config": self.config.to_json(), "ops": [op.to_json() for op in self.ops],
                 "seed": self.seed, "scenario": self.scenario, "tier": self.tier, "kernels": self.kernels,
                 "kernels_file": self.kernels_file, "allocator": self.allocator, "allocator_file": self.allocator_file,
                 "knobs": self.knobs, "mode": self.mode,
                 "signature": self.signature.to_json(), "divergence": self.divergence, "fault": self.fault,
                 "lengths": self.lengths, "minimize": self.minimize, "minimal": self.minimal,
                 "reproduced": self.reproduced, "flaky": self.flaky, "history": self.history,
                 "nondeterministic": self.nondeterministic, "environment": self.environment}
        out = {"schema": SCHEMA, **self.extra}
        out.update((k, known[k]) for k in ORDER if k not in self.omitted)
        return out

    @classmethod
    def from_json(cls, data, path: Path | None = None) -> Case:
        where = f"{path}: " if path else ""
        if not isinstance(data, dict) or any(k not in data for k in REQUIRED):
            raise CaseError(f"{where}not a kvfuzz case (needs {', '.join(REQUIRED)})")
        if data["schema"] != SCHEMA:
            raise CaseError(f"{where}schema {data['schema']!r} is not {SCHEMA!r}")
        if not isinstance(data["ops"], list):
            raise CaseError(f"{where}'ops' must be a list of ops")
        knobs = data.get("knobs")
        if knobs is not None and not (isinstance(knobs, dict) and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in knobs.items())):
            raise CaseError(f"{where}'knobs' must be null or an object of integer launch knobs, got {knobs!r}")
        for key in ("allocator", "allocator_file"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise CaseError(f"{where}{key!r} must be null or a string (MODULE_OR_FILE[:FACTORY]), got {data[key]!r}")
        try:
            if not isinstance(data["config"], dict):
                raise TypeError("'config' must be an object")
            config = kvref.PoolConfig.from_json(data["config"])
            ops = parse_ops(data["ops"])
            check_chain_ops(config, ops)
            signature = Signature.from_json(data["signature"])
        except (kvref.ContractViolation, OpError, TypeError, CaseError) as exc:
            raise CaseError(f"{where}{exc}") from exc
        extra = {k: v for k, v in data.items() if k not in ORDER}
        omitted = tuple(k for k in ORDER if k not in data)
        return cls(omitted=omitted, config=config, ops=ops, signature=signature, seed=data.get("seed"),
                   scenario=data.get("scenario"), tier=data.get("tier"), kernels=data.get("kernels"),
                   kernels_file=data.get("kernels_file"), knobs=knobs, mode=_mode(data.get("mode"), where),
                   minimize=data.get("minimize"), minimal=data.get("minimal"), reproduced=data.get("reproduced"),
                   flaky=data.get("flaky"), history=data.get("history"),
                   nondeterministic=data.get("nondeterministic"), allocator=data.get("allocator"),
                   allocator_file=data.get("allocator_file"),
                   divergence=data.get("divergence"), fault=data.get("fault"), lengths=data.get("lengths") or {},
                   environment=data.get("environment") or {}, extra=extra, path=path)

    def dumps(self) -> str:
        """One key per line, one op per line: small diffs, and a 2,000-token op is one line."""
        data = self.to_json()
        lines = []
        for key, value in data.items():
            if key == "ops":
                body = ",\n".join("  " + json.dumps(op) for op in value)
                lines.append(f' "ops": [\n{body}\n ]' if value else ' "ops": []')
            else:
                lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
        return "{\n" + ",\n".join(lines) + "\n}\n"

    def dumps_for(self, path: Path) -> str:
        """The file's text for a case that will live at ``path``: a kernel-set file is also
        recorded relative to it (``kernels_file``), so the case finds it from anywhere."""
        if self.kernels and self.kernels.endswith(".py") and Path(self.kernels).is_file():
            self.kernels_file = os.path.relpath(Path(self.kernels).resolve(), Path(path).resolve().parent)
            self.omitted = tuple(k for k in self.omitted if k != "kernels_file")
        if self.allocator:
            from .allocators import split

            where = split(self.allocator)[0]
            if where.endswith(".py") and Path(where).is_file():
                self.allocator_file = os.path.relpath(Path(where).resolve(), Path(path).resolve().parent)
                self.omitted = tuple(k for k in self.omitted if k != "allocator_file")
        return self.dumps()

    def write(self, path: Path) -> Path:
        """Write atomically (a temp file beside it, then a rename): a reader, or a campaign
        killed mid-write, never sees half a case."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(self.dumps_for(path))
        os.replace(tmp, path)
        return path


def _mode(data, where: str) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise CaseError(f"{where}'mode' must be an object of run options, got {data!r}")
    hostile = data.get("hostile", "spec")
    if hostile not in ("spec", "off", "all"):
        raise CaseError(f"{where}mode.hostile must be spec, off or all, got {hostile!r}")
    return dict(data)


def _fault_of(failure) -> dict | None:
    fault = getattr(failure, "fault", None)
    return None if fault is None else fault.to_json()


def write_case(case: Case, directory: Path, *, keep_shorter: bool = False, same_length: bool = False) -> Path:
    """Write ``case`` as its file in ``directory``; with ``keep_shorter``, not over a case
    of the same signature with fewer ops (a second campaign into the same folder), nor one
    with as many unless ``same_length`` (the confirmed version of the case found)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / case.filename()
    if keep_shorter and path.exists():
        try:
            old = load_case(path)
            if old.signature == case.signature and (len(old.ops) < len(case.ops)
                                                    or len(old.ops) == len(case.ops) and not same_length):
                return path
        except CaseError:
            pass
    return case.write(path)


def load_case(path) -> Case:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CaseError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise CaseError(f"{path}: not JSON: {exc}") from exc
    return Case.from_json(data, path)
