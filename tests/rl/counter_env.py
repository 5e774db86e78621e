"""A tiny :class:`BatchedEnv` for the agent's tests: episodes of a few steps, random images.

Each episode lasts a length drawn from ``lengths`` (``terminated`` at its end, or
``truncated`` when ``truncate=True``); the observation is a random ``uint8 [3, 3, 2]`` image
from the instance's generator; action 0 earns reward 1 and ``solved`` is set when the episode
ends after at least one reward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from relmem.rl.envs.base import BatchedEnv, StepResult


class CounterEnv(BatchedEnv):
    num_actions = 3
    observation_shape = (3, 3, 2)

    def __init__(
        self,
        batch_size: int,
        seed: int | None = None,
        lengths: tuple[int, ...] = (2, 3, 4),
        truncate: bool = False,
    ) -> None:
        self.lengths = lengths
        self.truncate = truncate
        super().__init__(batch_size, seed)
        B = self.batch_size
        self.steps = np.zeros(B, dtype=np.int64)
        self.length = np.zeros(B, dtype=np.int64)
        self.rewarded = np.zeros(B, dtype=bool)
        self.solved = np.zeros(B, dtype=bool)
        self.ended = np.ones(B, dtype=bool)
        self.obs = np.zeros((B, *self.observation_shape), dtype=np.uint8)

    def _draw(self, b: int) -> None:
        self.obs[b] = self.generators[b].integers(0, 256, self.observation_shape, dtype=np.uint8)

    def reset(self, mask: np.ndarray | None = None) -> np.ndarray:
        for b in np.flatnonzero(self._mask(mask)):
            self.length[b] = self.generators[b].choice(self.lengths)
            self.steps[b] = 0
            self.rewarded[b] = self.solved[b] = self.ended[b] = False
            self._draw(b)
        return self.obs.copy()

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._actions(actions)
        if self.ended.any():
            raise RuntimeError("CounterEnv: step after the end of an episode without reset")
        reward = (actions == 0).astype(np.float32)
        self.rewarded |= actions == 0
        self.steps += 1
        for b in range(self.batch_size):
            self._draw(b)
        end = self.steps >= self.length
        self.ended = end.copy()
        self.solved = end & self.rewarded
        terminated = end & (not self.truncate)
        truncated = end & self.truncate
        return StepResult(self.obs.copy(), reward, terminated, truncated)

    def render(self, index: int = 0) -> np.ndarray:
        return self.obs[index, :, :, :1].repeat(3, axis=-1)

    def info(self) -> dict[str, np.ndarray]:
        return {"steps": self.steps.copy(), "solved": self.solved.copy()}

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError
