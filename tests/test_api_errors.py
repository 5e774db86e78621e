"""The public API's last raw-torch errors (issue 35's probe): each is now one line naming the
class, the argument and what is allowed."""

from __future__ import annotations

import pytest
import torch

import relmem
from relmem.cores.rmc import FastRelationalMemory
from relmem.models.convlstm import ConvLSTMCore
from relmem.models.lstm import LSTMCore


def test_fast_path_wraps_only_an_rmc() -> None:
    """Wrapping an nn.LSTM failed later, inside the fast path, with an AttributeError."""
    with pytest.raises(TypeError, match="core must be a relmem.RelationalMemory .* got LSTM"):
        FastRelationalMemory(torch.nn.LSTM(4, 4))
    core = relmem.RelationalMemory(input_size=4, mem_slots=2, head_size=4, num_heads=2)
    FastRelationalMemory(core)  # the core it is for


@pytest.mark.parametrize(
    ("build", "owner"),
    [
        (
            lambda: relmem.RelationalMemory(input_size=4, mem_slots=2, head_size=4, num_heads=2),
            "RelationalMemoryCell.initial_state",
        ),
        (
            lambda: relmem.RelationalMemoryCell(
                input_size=4, mem_slots=2, head_size=4, num_heads=2
            ),
            "RelationalMemoryCell.initial_state",
        ),
        (lambda: relmem.DNC(4, 8, memory_size=6, word_size=4), "DNCMemory.initial_state"),
        (lambda: relmem.MemoryControllerLayer(8, memory_slots=6), "DNCMemory.initial_state"),
        (lambda: LSTMCore(4, 8), "LSTMCore.initial_state"),
        (
            lambda: ConvLSTMCore(16, channels=2, height=2, width=2, kernel_size=1),
            "ConvLSTMCore.initial_state",
        ),
    ],
    ids=[
        "RelationalMemory",
        "RelationalMemoryCell",
        "DNC",
        "MemoryControllerLayer",
        "lstm",
        "convlstm",
    ],
)
def test_initial_state_names_a_bad_device(build, owner: str) -> None:
    """torch's 'Expected one of cpu, cuda, ipu, xpu, ... device type at start of device
    string: bogus' named neither the method nor the argument."""
    core = build()
    with pytest.raises(
        ValueError, match=f"{owner}: device must be None, a torch.device .* 'bogus'"
    ):
        core.initial_state(2, device="bogus")
    core.initial_state(2, device="cpu")


def test_an_out_of_range_sparse_link_index_is_named() -> None:
    """A link column outside the memory failed as an index error inside the link update (or,
    on CUDA, a device-side assert)."""
    dnc = relmem.DNC(4, 8, memory_size=6, word_size=4, link="sparse", link_topk=2)
    state = dnc.initial_state(3)
    inputs = torch.randn(2, 3, 4)
    for bad in (state.link_index + 6, state.link_index - 1):
        with pytest.raises(ValueError, match=r"state.link_index must hold memory columns in 0..5"):
            dnc(inputs, state._replace(link_index=bad))
    dnc(inputs, state)  # the initial one is fine


@pytest.mark.parametrize(
    ("build", "owner"),
    [
        (
            lambda: relmem.RelationalMemory(
                input_size=10, mem_slots=2, head_size=10**6, num_heads=10**4
            ),
            "RelationalMemoryCell",
        ),
        (
            lambda: relmem.RelationalMemory(
                input_size=10**19, mem_slots=2, head_size=4, num_heads=2
            ),
            "RelationalMemoryCell",
        ),
        (lambda: relmem.DNC(10, 10**10, memory_size=8, word_size=8), "DNCCell"),
        (lambda: relmem.MemoryControllerLayer(10**10, memory_slots=8), "MemoryControllerLayer"),
    ],
    ids=["rmc-heads", "rmc-input-overflows", "dnc", "memory-controller-layer"],
)
def test_sizes_that_cannot_fit_in_memory_are_one_line(build, owner: str) -> None:
    """torch's allocator said 'DefaultCPUAllocator: can't allocate memory: you tried to
    allocate 400000000000 bytes', naming no class or size (or overflowed unpacking a size)."""
    with pytest.raises(MemoryError, match=f"^{owner}: its parameters at these sizes do not fit"):
        build()
