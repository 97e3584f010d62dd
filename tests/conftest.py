"""Test set-up shared by every test module: quiet, single-threaded torch so the suite is fast and
deterministic on a 2-core machine, and GPU tests skipped where there is no CUDA."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# The embedded test target, built once per run (tests/fixtures_builtin.py).
from fixtures_builtin import builtin_test_cache, builtin_test_target  # noqa: E402,F401


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
