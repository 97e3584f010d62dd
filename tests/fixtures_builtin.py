"""Session fixture for the embedded test target: `builtin_test_target` builds `builtin:tiny-stdlib-test`
once per test run into a temporary cache folder and returns its Hugging Face folder. Import it into
conftest.py (or a test module) to share it: `from fixtures_builtin import builtin_test_target`."""

from __future__ import annotations

from pathlib import Path

import pytest

TEST_TARGET = "tiny-stdlib-test"


@pytest.fixture(scope="session")
def builtin_test_cache(tmp_path_factory) -> Path:
    """The cache folder the session's test target lives in."""
    return tmp_path_factory.mktemp("pdraft-cache")


@pytest.fixture(scope="session")
def builtin_test_target(builtin_test_cache) -> Path:
    """The HF folder of `builtin:tiny-stdlib-test`, built once (a few seconds on one thread)."""
    from pdraft.targets.builtin import resolve

    return resolve(TEST_TARGET, cache_dir=builtin_test_cache, progress=False)
