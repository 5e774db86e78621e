"""Render episodes of an agent (or of the uniform random policy) to a GIF or a PNG strip.

Each frame is two panels side by side, scaled up with nearest-neighbour pixels: the whole board
(the core's :meth:`~relmem.rl.envs.base.BatchedEnv.render`) and what the agent sees (the
observation's first three channels, or its first as grey: the viewport, or the full map).
Where the agent's core is the RMC, the observation panel is tinted by the attention the memory
pays to each cell in the step that reads it: the last block's softmax weights from the N
memory rows (queries) to the cell's input row (key), averaged over heads and memory rows, and
scaled so that the most attended cell of the frame has the strongest tint (70% of the colour);
each frame is scaled by its own maximum, so a frame of nearly even attention is tinted nearly
evenly. A cell's input row is what the encoder's two 2x2 convolutions (padded after, as
TensorFlow's 'same') made of the 3x3 block of cells starting at it: the tint at a cell is
attention to the content at and below-right of it.

Episodes come from the held-out set of :mod:`relmem.rl.evaluation` (episode ``i`` of seed
``s`` is the same level there and here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchrl.envs import ExplorationType, InitTracker, TransformedEnv, set_exploration_type
from torchrl.envs.utils import step_mdp

from relmem.cores.rmc import RelationalMemory, RMCState
from relmem.rl import keys
from relmem.rl.agent import EMBEDDING, Agent
from relmem.rl.envs.base import BatchedEnv
from relmem.rl.envs.torchrl_env import TorchRLBatchedEnv, game_class
from relmem.rl.evaluation import held_out_level, policy_device
from relmem.validation import check_choice, check_int

__all__ = ["render_episodes", "rmc_attention", "write_frames"]

TINT = np.array([255.0, 40.0, 0.0])  # the attention overlay's colour
GAP = 1  # pixels (before scaling) between the two panels


def rmc_attention(agent: Agent, td: Any) -> torch.Tensor | None:
    """The attention of the RMC's memory over the input cells in the step ``td`` holds.

    Args:
        agent: the agent; td: a step's entries after ``agent.policy(td)`` (the encoder's
            ``embedding [B, n, F]``, ``is_init`` and the memory read by that step).

    Returns:
        ``[B, n]`` (n cells, row-major), or None when the core is not the RMC.
    """
    core = agent.core.core
    if not isinstance(core, RelationalMemory):
        return None
    rows = td[EMBEDDING]
    memory = td[agent.state_keys[0]]
    initial = core.initial_state(rows.shape[0]).memory
    memory = torch.where(td[keys.IS_INIT].view(-1, 1, 1), initial, memory)
    _, _, details = core.cell(rows, RMCState(memory), return_details=True)
    slots = core.config.mem_slots
    return details.attention[-1][:, :, :slots, slots:].mean(dim=(1, 2))


def _frame(board: np.ndarray, observation: np.ndarray, attention: np.ndarray | None) -> np.ndarray:
    """``[h, w, 3]`` uint8: the board and the (tinted) observation side by side."""
    rgb = observation[..., :3] if observation.shape[-1] >= 3 else observation[..., :1]
    seen = np.broadcast_to(rgb, (*observation.shape[:2], 3)).astype(np.float64)
    if attention is not None:
        weight = attention.reshape(seen.shape[:2], order="C")
        weight = 0.7 * weight / max(weight.max(), 1e-12)
        seen = seen * (1 - weight[..., None]) + TINT * weight[..., None]
    height = max(board.shape[0], seen.shape[0])
    canvas = np.full((height, board.shape[1] + GAP + seen.shape[1], 3), 96, dtype=np.uint8)
    canvas[: board.shape[0], : board.shape[1]] = board
    canvas[: seen.shape[0], board.shape[1] + GAP :] = seen.round().astype(np.uint8)
    return canvas


def _episode(core: BatchedEnv, agent: Agent | None, generator: torch.Generator) -> list[np.ndarray]:
    """The frames of one episode of instance 0 of ``core`` (a batch of one)."""
    env = TransformedEnv(TorchRLBatchedEnv(core), InitTracker(init_key=keys.IS_INIT))
    if agent is not None:
        env.append_transform(agent.make_tensordict_primer())
    device = None if agent is None else policy_device(agent.policy)
    td = env.reset()
    frames = []
    while True:
        attention = None
        if agent is None:
            td.set(keys.ACTION, torch.randint(core.num_actions, (1,), generator=generator))
        else:
            acted = agent.policy(td.to(device))
            weights = rmc_attention(agent, acted)
            attention = None if weights is None else weights[0].cpu().numpy()
            td = acted.to(env.device)
        frames.append(_frame(core.render(0), td[keys.OBSERVATION][0].numpy(), attention))
        td = env.step(td)
        if td["next", keys.DONE].all():  # the core is not reset: render shows the end
            final = td["next", keys.OBSERVATION][0].numpy()
            frames.append(_frame(core.render(0), final, None))
            return frames
        td = step_mdp(td)


def render_episodes(
    game: str | type[BatchedEnv],
    agent: Agent | None = None,
    *,
    episodes: int = 1,
    seed: int = 0,
    scale: int = 16,
    greedy: bool = False,
    **options: Any,
) -> list[np.ndarray]:
    """The frames of ``episodes`` held-out episodes, one after the other.

    Args:
        game: ``'boxworld'``, ``'minipacman'`` or a :class:`BatchedEnv` subclass.
        agent: the :class:`~relmem.rl.agent.Agent` playing, or None for uniform random actions.
        episodes: how many (held-out episodes 0..episodes-1 of ``seed``).
        seed: the held-out set's seed (as :func:`relmem.rl.evaluation.evaluate`).
        scale: each cell becomes ``scale × scale`` pixels.
        greedy: the agent takes its most probable action instead of sampling.
        **options: the game's parameters.

    Returns:
        ``uint8 [h·scale, w·scale, 3]`` frames.
    """
    episodes = int(check_int("episodes", episodes, owner="render_episodes"))
    scale = int(check_int("scale", scale, owner="render_episodes"))
    seed = int(check_int("seed", seed, minimum=0, owner="render_episodes"))
    cls = game_class(game) if isinstance(game, str) else game
    generator = torch.Generator().manual_seed(seed)
    exploration = ExplorationType.DETERMINISTIC if greedy else ExplorationType.RANDOM
    frames: list[np.ndarray] = []
    with torch.no_grad(), set_exploration_type(exploration):
        for index in range(episodes):
            core = cls(batch_size=1, seed=seed, **options)
            core.generators = [held_out_level(seed, index)]
            frames += _episode(core, agent, generator)
    return [frame.repeat(scale, axis=0).repeat(scale, axis=1) for frame in frames]


def write_frames(frames: list[np.ndarray], path: str | Path, *, fps: float = 4.0) -> Path:
    """Write ``frames`` as an animated GIF (``.gif``) or a horizontal PNG strip (``.png``).

    Returns:
        The path written.
    """
    path = Path(path)
    check_choice("path suffix", path.suffix.lower(), (".gif", ".png"), owner="write_frames")
    if not frames:
        raise ValueError("write_frames: no frames to write")
    images = [Image.fromarray(frame) for frame in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        duration = int(round(1000 / fps))
        images[0].save(path, save_all=True, append_images=images[1:], duration=duration, loop=0)
    else:
        height = max(image.height for image in images)
        strip = Image.new("RGB", (sum(image.width for image in images), height))
        offset = 0
        for image in images:
            strip.paste(image, (offset, 0))
            offset += image.width
        strip.save(path)
    return path
