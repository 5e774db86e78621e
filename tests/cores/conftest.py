"""Shared set-up for the RMC core tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread for every core test module.

    The cases are tiny; on a shared 2-core machine two intra-op threads spend most of their time
    waiting for each other (93 s against 5 s for the fast-path file, measured).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
