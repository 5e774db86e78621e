import torch

import relmem


def test_sequence_runs_and_backpropagates():
    core = relmem.RelationalMemory(input_size=6, mem_slots=3, head_size=4, num_heads=2)
    output, state = core(torch.randn(5, 2, 6))
    assert output.shape == (5, 2, 3 * 8)
    assert state.memory.shape == (2, 3, 8)
    output.sum().backward()
