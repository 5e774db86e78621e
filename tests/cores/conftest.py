"""Shared set-up for the RMC core tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread for every core test module.

    The cases are tiny; on a shared machine two intra-op threads spend most of their time
    waiting for each other (the timings are in ``docs/performance.md`` §4.2).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
