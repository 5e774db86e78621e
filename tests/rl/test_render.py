"""Rendering: frames of an episode with the RMC's attention, written as a GIF and a PNG
strip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from counter_env import CounterEnv
from PIL import Image
from tensordict import TensorDict

from relmem.models import LSTMModelConfig, RMCModelConfig
from relmem.rl import keys
from relmem.rl.agent import build_agent
from relmem.rl.render import _frame, render_episodes, rmc_attention, write_frames


@pytest.mark.parametrize("model", ["rmc", "lstm", None])
def test_an_episode_becomes_a_gif_and_a_strip(tmp_path, model: str | None) -> None:
    torch.manual_seed(0)
    configs = {
        "rmc": RMCModelConfig(mem_slots=2, head_size=4, num_heads=2),
        "lstm": LSTMModelConfig(hidden_size=8),
    }
    agent = None if model is None else build_agent((3, 3, 2), 3, model, configs[model])
    frames = render_episodes(CounterEnv, agent, episodes=2, seed=0, scale=4)
    # Episode lengths 2..4 steps: 3..5 frames each; board 3 wide + 1 gap + observation 3.
    assert 6 <= len(frames) <= 10
    assert all(f.shape == (12, 28, 3) and f.dtype == np.uint8 for f in frames)
    gif = write_frames(frames, tmp_path / "episode.gif")
    with Image.open(gif) as image:
        assert image.n_frames == len(frames) and image.size == (28, 12)
    strip = write_frames(frames, tmp_path / "episode.png")
    with Image.open(strip) as image:
        assert image.size == (28 * len(frames), 12)


def test_the_rmc_tints_the_cells_it_attends() -> None:
    """The RMC's panel differs from the plain observation; the LSTM's does not."""
    torch.manual_seed(0)
    rmc = build_agent((3, 3, 2), 3, "rmc", RMCModelConfig(mem_slots=2, head_size=4, num_heads=2))
    plain = render_episodes(CounterEnv, None, episodes=1, seed=0, scale=1)
    tinted = render_episodes(CounterEnv, rmc, episodes=1, seed=0, scale=1)
    assert np.array_equal(plain[0][:, :3], tinted[0][:, :3])  # the same board
    assert not np.array_equal(plain[0][:, 4:], tinted[0][:, 4:])


def test_bad_path_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="path suffix must be one of '.gif', '.png'"):
        write_frames([np.zeros((2, 2, 3), np.uint8)], tmp_path / "x.mp4")


@pytest.mark.parametrize("cell", [(1, 3), (4, 0), (2, 2)])
def test_the_tint_falls_on_the_cell_the_memory_attends(cell: tuple[int, int]) -> None:
    """Weights set by hand so that the memory attends to the one cell with red in it: that
    cell, and it alone, carries the strongest tint (the panel's row-major cell order, the
    coordinate maps and the attention's key order agree)."""
    height = width = 5
    torch.manual_seed(0)
    config = RMCModelConfig(mem_slots=2, head_size=16, num_heads=1, gate_style="memory")
    agent = build_agent((height, width, 6), 4, "rmc", config)
    encoder, rmc = agent.encoder.module, agent.core.core.cell
    with torch.no_grad():
        for conv in encoder.convs:  # feature 0 of a row: the red of its own cell
            conv.weight.zero_()
            conv.bias.zero_()
            conv.weight[0, 0, 0, 0] = 1.0
        rmc.input_projection.weight.zero_()
        rmc.input_projection.bias.zero_()
        rmc.input_projection.weight[5, 0] = 100.0
        block = rmc.blocks[0]
        block.qkv.weight.zero_()
        block.qkv.bias.zero_()
        block.qkv.weight[0, :2] = 1.0  # both memory rows (the identity's e0, e1) query on dim 0
        block.qkv.weight[16, 5] = 1.0  # a red cell's key on dim 0
    observation = torch.zeros(1, height, width, 6, dtype=torch.uint8)
    observation[0, cell[0], cell[1], 0] = 255
    td = TensorDict(
        {
            keys.OBSERVATION: observation,
            keys.IS_INIT: torch.ones(1, 1, dtype=torch.bool),
            "memory": torch.zeros(1, 2, 16),
        },
        [1],
    )
    with torch.no_grad():
        acted = agent.policy(td)
        weights = rmc_attention(agent, acted)[0]
    assert int(weights.argmax()) == cell[0] * width + cell[1] and weights.max() > 0.99
    board = np.zeros((height, width, 3), np.uint8)
    panels = [
        _frame(board, observation[0].numpy(), w)[:height, width + 1 :].astype(int)
        for w in (weights.numpy(), None)
    ]
    change = np.abs(panels[0] - panels[1]).sum(-1)  # the tint alone
    assert np.argwhere(change == change.max()).tolist() == [list(cell)]
