"""A small stand-in game for training tests that must take seconds, with the interface of
``relmem.rl.envs.torchrl_env.make_env``.

- :class:`Reach`: a ``BatchedEnv`` on an n x n board: the agent walks to a goal placed at
  random; reaching it pays +10 and terminates, ``max_steps`` truncates. The observation is
  egocentric, as viewport BoxWorld's: a (2n-1) x (2n-1) window centred on the agent (white)
  showing the goal (yellow), so that a few thousand frames teach the way to the goal.
- :func:`make_reach_env`: it as a TorchRL environment with ``InitTracker``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torchrl.envs import InitTracker, TransformedEnv

from relmem.rl.envs.base import BatchedEnv, StepResult
from relmem.rl.envs.torchrl_env import TorchRLBatchedEnv

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


class Reach(BatchedEnv):
    """Walk to the goal: +10 and the end on reaching it; truncated after ``max_steps``."""

    num_actions = 4

    def __init__(
        self, batch_size: int, seed: int | None = None, *, size: int = 3, max_steps: int = 12
    ) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_shape = (2 * size - 1, 2 * size - 1, 3)
        self.agent = np.zeros((batch_size, 2), dtype=np.int64)
        self.goal = np.zeros((batch_size, 2), dtype=np.int64)
        self.steps = np.zeros(batch_size, dtype=np.int64)
        self.ended = np.ones(batch_size, dtype=bool)
        self.solved = np.zeros(batch_size, dtype=np.int64)
        super().__init__(batch_size, seed)

    def _observe(self) -> np.ndarray:
        obs = np.zeros((self.batch_size, *self.observation_shape), dtype=np.uint8)
        rows, centre = np.arange(self.batch_size), self.size - 1
        offset = self.goal - self.agent + centre
        obs[rows, offset[:, 0], offset[:, 1]] = (255, 255, 0)
        obs[:, centre, centre] = (255, 255, 255)
        return obs

    def reset(self, mask: np.ndarray | None = None) -> np.ndarray:
        for b in np.flatnonzero(self._mask(mask)):
            cells = self.generators[b].choice(self.size * self.size, size=2, replace=False)
            self.agent[b] = divmod(int(cells[0]), self.size)
            self.goal[b] = divmod(int(cells[1]), self.size)
            self.steps[b], self.ended[b] = 0, False
        return self._observe()

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._actions(actions)
        if self.ended.any():
            raise RuntimeError("Reach: step after the end of an episode without reset")
        self.agent = np.clip(self.agent + MOVES[actions], 0, self.size - 1)
        self.steps += 1
        terminated = (self.agent == self.goal).all(axis=1)
        truncated = ~terminated & (self.steps >= self.max_steps)
        self.ended = terminated | truncated
        self.solved += terminated
        reward = np.where(terminated, 10.0, 0.0).astype(np.float32)
        return StepResult(self._observe(), reward, terminated, truncated)

    def render(self, index: int = 0) -> np.ndarray:
        return self._observe()[index]

    def info(self) -> dict[str, np.ndarray]:
        return {"solved": self.solved.copy()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent.copy(),
            "goal": self.goal.copy(),
            "steps": self.steps.copy(),
            "ended": self.ended.copy(),
            "solved": self.solved.copy(),
            "generators": [g.bit_generator.state for g in self.generators],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("agent", "goal", "steps", "ended", "solved"):
            setattr(self, name, np.array(state[name]))
        for generator, saved in zip(self.generators, state["generators"], strict=True):
            generator.bit_generator.state = saved


def make_reach_env(game: Any, batch_size: int, seed: int | None, **options: Any) -> TransformedEnv:
    """``make_env``'s interface for the stand-in game (``game`` is :class:`Reach`)."""
    return TransformedEnv(TorchRLBatchedEnv(Reach(batch_size, seed, **options)), InitTracker())
