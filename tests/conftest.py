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
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
