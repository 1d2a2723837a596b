"""Case files: a failure as versioned JSON that replays anywhere.

Schema ``kvfuzz-case/1``: config, ops, seed, tier, kernel set and its launch knobs
(block sizes, optional), signature (op kind +
oracle + field, no addresses or values), the first divergence with spec vs target
values, original and minimized lengths, and the environment it was found in.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import kvref

from .ops import OpError, validate_op

SCHEMA = "kvfuzz-case/1"
REQUIRED = ("schema", "config", "ops", "signature")


class CaseError(ValueError):
    """A case file that cannot be read (CLI exit code 2)."""


def environment() -> dict:
    env = {"python": platform.python_version()}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        env["git_sha"] = sha.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git_sha"] = None
    try:
        import torch

        env["torch"] = torch.__version__
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        env["torch"] = None
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def make_case(*, config: kvref.PoolConfig, ops: list[dict], seed, tier: str, kernels: str, divergence,
              original_len: int, scenario: str | None = None, knobs: dict | None = None) -> dict:
    return {
        "schema": SCHEMA,
        "config": config.to_json(),
        "ops": ops,
        "seed": seed,
        "scenario": scenario,
        "tier": tier,
        "kernels": kernels,
        "knobs": knobs,
        "signature": divergence.signature,
        "divergence": divergence.to_json(),
        "lengths": {"original": original_len, "minimized": len(ops)},
        "environment": environment(),
    }


def signature_key(sig: dict) -> str:
    return f"{sig['op']}-{sig['oracle']}-{sig['field']}"


def case_filename(case: dict) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in signature_key(case["signature"]))
    return f"{case['kernels'].replace('/', '_').replace('.', '_')[-40:]}--{safe}.json"


def write_case(case: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / case_filename(case)
    path.write_text(json.dumps(case, indent=1) + "\n")
    return path


def load_case(path) -> dict:
    path = Path(path)
    try:
        case = json.loads(path.read_text())
    except OSError as exc:
        raise CaseError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise CaseError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(case, dict) or any(k not in case for k in REQUIRED):
        raise CaseError(f"{path}: not a kvfuzz case (needs {', '.join(REQUIRED)})")
    if case["schema"] != SCHEMA:
        raise CaseError(f"{path}: schema {case['schema']!r} is not {SCHEMA!r}")
    if not isinstance(case["ops"], list):
        raise CaseError(f"{path}: 'ops' must be a list of ops")
    knobs = case.get("knobs")
    if knobs is not None and not (isinstance(knobs, dict) and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in knobs.items())):
        raise CaseError(f"{path}: 'knobs' must be null or an object of integer launch knobs, got {knobs!r}")
    try:
        if not isinstance(case["config"], dict):
            raise TypeError("'config' must be an object")
        case["pool"] = kvref.PoolConfig.from_json(case["config"])
        for i, op in enumerate(case["ops"]):
            try:
                validate_op(op)
            except OpError as exc:
                raise OpError(f"ops[{i}]: {exc}") from None
    except (kvref.ContractViolation, OpError, TypeError) as exc:
        raise CaseError(f"{path}: {exc}") from exc
    case["path"] = str(path)
    return case


def resolve_kernels(kernels: str | None, case_path: str | None) -> str | None:
    """A kernel-set file named relative to where the campaign ran: look there first, then
    beside the case file and in each folder above it (a case moved into a repo's tests)."""
    if not kernels or not kernels.endswith(".py") or Path(kernels).is_file() or not case_path:
        return kernels
    for folder in Path(case_path).resolve().parents:
        if (folder / kernels).is_file():
            return str(folder / kernels)
    return kernels
