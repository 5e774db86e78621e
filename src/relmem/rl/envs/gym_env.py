"""A ``gymnasium.Env`` over one instance of a :class:`~relmem.rl.envs.base.BatchedEnv`.

Each game subclasses :class:`BatchedGymEnv` with its batched class in ``core_class``; the
keyword arguments of the gymnasium constructor are the game's own parameters and go to that
class unchanged, so the two ways of building a game accept exactly the same options.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from relmem.rl.envs.base import BatchedEnv
from relmem.validation import check_choice

__all__ = ["BatchedGymEnv"]


class BatchedGymEnv(gym.Env):
    """One instance of ``core_class`` as a Gymnasium environment.

    Args:
        render_mode: None or ``'rgb_array'`` (:meth:`render` returns the whole board,
            ``uint8 [H', W', 3]``).
        **options: the game's parameters, passed to ``core_class(batch_size=1, **options)``.

    Observations are ``uint8 [H, W, C]``; actions are ``Discrete(num_actions)``; ``info`` holds
    the game's counters (:meth:`~relmem.rl.envs.base.BatchedEnv.info`) as Python scalars.
    """

    core_class: ClassVar[type[BatchedEnv]]
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        self.render_mode = check_choice(
            "render_mode", render_mode, (None, "rgb_array"), owner=type(self).__name__
        )
        self.core = self.core_class(batch_size=1, **options)
        self.observation_space = gym.spaces.Box(
            0, 255, shape=self.core.observation_shape, dtype=np.uint8
        )
        self.action_space = gym.spaces.Discrete(self.core.num_actions)

    def _info(self) -> dict[str, Any]:
        return {name: value[0].item() for name, value in self.core.info().items()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new episode; ``seed`` reseeds the instance's generator first."""
        super().reset(seed=seed)
        if seed is not None:
            self.core.seed(seed)
        observation = self.core.reset()[0]
        return observation, self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(
                f"{type(self).__name__}: action must be an integer in "
                f"0..{self.core.num_actions - 1}, got {action!r}"
            )
        result = self.core.step(np.array([action], dtype=np.int64))
        return (
            result.observation[0],
            float(result.reward[0]),
            bool(result.terminated[0]),
            bool(result.truncated[0]),
            self._info(),
        )

    def render(self) -> np.ndarray | None:
        """The whole board as ``uint8 [H', W', 3]`` (None without ``render_mode``)."""
        if self.render_mode is None:
            return None
        return self.core.render(0)
