"""A command line parent imports no torch (``fuzz/engine/lazy.py``): it parses op kinds and
writes cases and summaries, while its children run the ops. Each parent that did import it
paid 2-3 CPU s; the suite starts well over a hundred of them, a nightly one per shard."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from fuzz.engine import lazy

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]

# What ``kvfuzz run``, ``replay``, ``minimize`` and ``merge`` import in the parent, and what it
# calls there: every op kind, the campaign, the tracks, the summary with its versions.
PARENT = """
import json, sys
import fuzz.cli, fuzz.cli_args
from fuzz.engine import campaign, case, kinds, tracks, confirm, minimize
from fuzz.tools import reports
from fuzz.environment import environment
env = environment()
print(json.dumps({"torch": "torch" in sys.modules, "triton": "triton" in sys.modules, "kinds": kinds.kinds(),
                  "env": env}))
"""


def test_the_parent_of_a_command_imports_neither_torch_nor_triton():
    proc = subprocess.run([sys.executable, "-c", PARENT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert (got["torch"], got["triton"]) == (False, False), ("a module on the parent's path imports torch or "
                                                             "Triton at import", got)
    # every track's op kinds registered: production, far, graph, hostile, compile
    assert {"p_read_table", "p_read_table_far", "g_read_table", "p_free_unbind_any", "c_compile"} <= set(got["kinds"])
    import torch
    import triton

    # ... and its summary still names the versions it would have read from the modules.
    assert (got["env"]["torch"], got["env"]["cuda"], got["env"]["triton"]) == (
        torch.__version__, torch.version.cuda, triton.__version__), got["env"]


def test_the_first_use_imports_torch_and_puts_it_in_the_modules_globals():
    module = types.ModuleType("kvfuzz_probe_lazy")
    module.torch = lazy.Torch(vars(module))
    assert "not imported yet" in repr(module.torch)
    exec("def make():\n    return torch.zeros(2, dtype=torch.int64)", vars(module))
    assert module.make().tolist() == [0, 0]
    import torch

    assert module.torch is torch  # every later lookup is an ordinary global one


GPUS = r"""
import ctypes, json, os, sys
os.environ.pop("CUDA_VISIBLE_DEVICES", None)

class Driver:  # libcuda as the parent sees it: cuInit, then cuDeviceGetCount
    def cuInit(self, flags):
        return 0
    def cuDeviceGetCount(self, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 3
        return 0

ctypes.CDLL = lambda name: Driver() if name == "libcuda.so.1" else None
from fuzz.engine.campaign import visible_gpus  # (from supervise)
print(json.dumps({"gpus": visible_gpus(), "torch": "torch" in sys.modules}))
"""


def test_a_cuda_campaigns_parent_counts_its_gpus_without_importing_torch():
    """The parent of a GPU campaign assigns GPUs to workers before it starts them: counted by
    the driver (milliseconds), where importing torch for it took 3-4 s on an H200 box."""
    proc = subprocess.run([sys.executable, "-c", GPUS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"gpus": ["0", "1", "2"], "torch": False}


@pytest.mark.cuda
def test_the_drivers_device_count_is_torchs():
    import torch

    from fuzz.engine.supervise import _driver_device_count

    assert _driver_device_count() == torch.cuda.device_count() > 0
