"""Shared set-up of the Triton kernel tests: `needs_triton` skips a test when triton is not importable, and the
`interpret` fixture runs the kernels through Triton's CPU interpreter (TRITON_INTERPRET=1, dispatch forced to
Triton). A test module takes the fixture with `interpret = test_kernels_support.interpret` (an assignment,
not `from test_kernels_support import interpret`, which linters read as an unused import)."""

import pytest

from pdraft.kernels.dispatch import force_triton, triton_importable

needs_triton = pytest.mark.skipif(not triton_importable(), reason="triton is not installed (pip install triton)")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with force_triton():
        yield
