"""Fixtures shared by every test directory."""

from __future__ import annotations

import pytest
import torch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def device(request: pytest.FixtureRequest) -> torch.device:
    """Where a test runs its model: the CPU in the default suite, and CUDA under ``-m gpu``
    when a GPU is there. A test that takes it checks the same thing on both, so the CPU run
    checks the test itself."""
    return torch.device(request.param)
