"""Rendering: frames of an episode with the RMC's attention, written as a GIF and a PNG
strip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from counter_env import CounterEnv
from PIL import Image

from relmem.models import LSTMModelConfig, RMCModelConfig
from relmem.rl.agent import build_agent
from relmem.rl.render import render_episodes, write_frames


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
