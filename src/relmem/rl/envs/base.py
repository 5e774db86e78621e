"""The contract of a batched environment: B independent instances of one game stepped together.

Each game (BoxWorld, Mini PacMan) is written once, as a subclass of :class:`BatchedEnv` that
works on numpy arrays with a leading batch axis. The two ways users meet it are thin adapters
over that one implementation:

- :mod:`relmem.rl.envs.gym_env`: a ``gymnasium.Env`` (one instance, ``batch_size = 1``) under
  the ids ``relmem/BoxWorld-v0`` and ``relmem/MiniPacman-v0``;
- :mod:`relmem.rl.envs.torchrl_env`: a TorchRL ``EnvBase`` with ``batch_size=[B]``, for
  training.

Rules every game follows:

- **Randomness**: one ``numpy.random.Generator`` per instance (``self.generators[b]``), all
  spawned from one seed by :meth:`BatchedEnv.seed`; instance ``b``'s levels depend on nothing
  but its own generator, so the same seed gives the same level sequence in every instance,
  however the batch is stepped or reset.
- **No automatic reset**: an instance whose episode ended (terminated or truncated) stays
  ended until :meth:`BatchedEnv.reset` is called with it in ``mask``; stepping it before then
  raises ``RuntimeError``.
- **Observations** are ``uint8`` images ``[B, H, W, C]`` (``observation_shape = (H, W, C)``);
  networks scale them by 1/255.
- **Exact resume**: :meth:`BatchedEnv.state_dict` holds everything (boards, counters,
  generator states) as numpy arrays and plain Python values, and
  :meth:`BatchedEnv.load_state_dict` restores it, so that stepping on gives the same results.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np

from relmem.validation import check_int

__all__ = ["BatchedEnv", "StepResult"]


class StepResult(NamedTuple):
    """What :meth:`BatchedEnv.step` returns, batch-first.

    Attributes:
        observation: ``uint8 [B, H, W, C]``, the observation after the step.
        reward: ``float32 [B]``.
        terminated: ``bool [B]``, the episode reached a terminal state (no bootstrapping).
        truncated: ``bool [B]``, the episode hit its step limit (bootstrap the value).
    """

    observation: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


class BatchedEnv(ABC):
    """``batch_size`` independent instances of one game, stepped together in numpy.

    Subclasses set ``num_actions`` and ``observation_shape`` (in ``__init__``, before calling
    this class's ``__init__``, or as class attributes) and implement the abstract methods.

    Args:
        batch_size: B, the number of instances.
        seed: seed of the instances' generators (None: fresh entropy from the OS).

    Attributes:
        batch_size: B.
        num_actions: the size of the discrete action set.
        observation_shape: ``(H, W, C)`` of one instance's observation.
        generators: B ``numpy.random.Generator``, one per instance.
    """

    num_actions: int
    observation_shape: tuple[int, ...]

    def __init__(self, batch_size: int, seed: int | None = None) -> None:
        self.batch_size = int(check_int("batch_size", batch_size, owner=type(self).__name__))
        self.generators: list[np.random.Generator] = []
        self.seed(seed)

    def seed(self, seed: int | None) -> None:
        """Make one generator per instance, spawned from ``numpy.random.SeedSequence(seed)``.

        The episodes under way are not touched; the next :meth:`reset` draws from the new
        generators.
        """
        children = np.random.SeedSequence(seed).spawn(self.batch_size)
        self.generators = [np.random.Generator(np.random.PCG64(child)) for child in children]

    def _mask(self, mask: np.ndarray | None) -> np.ndarray:
        """``mask`` as ``bool [B]`` (None: every instance); a clear error for a wrong shape."""
        if mask is None:
            return np.ones(self.batch_size, dtype=bool)
        mask = np.asarray(mask)
        if mask.shape != (self.batch_size,) or mask.dtype != np.bool_:
            raise ValueError(
                f"{type(self).__name__}: mask must be a bool array of shape "
                f"({self.batch_size},), got {mask.dtype} {mask.shape}"
            )
        return mask

    def _actions(self, actions: Any) -> np.ndarray:
        """``actions`` as ``int64 [B]`` in ``0..num_actions-1``; a clear error otherwise."""
        array = np.asarray(actions)
        if array.shape != (self.batch_size,) or not np.issubdtype(array.dtype, np.integer):
            raise ValueError(
                f"{type(self).__name__}: actions must be integers of shape "
                f"({self.batch_size},), got {array.dtype} {array.shape}"
            )
        if array.size and (array.min() < 0 or array.max() >= self.num_actions):
            raise ValueError(
                f"{type(self).__name__}: actions must lie in 0..{self.num_actions - 1}, "
                f"got {array.tolist()}"
            )
        return array.astype(np.int64, copy=False)

    @abstractmethod
    def reset(self, mask: np.ndarray | None = None) -> np.ndarray:
        """Start new episodes in the instances where ``mask`` (``bool [B]``; None: all).

        Returns:
            ``uint8 [B, H, W, C]``, the observations of *every* instance (the others'
            unchanged).
        """

    @abstractmethod
    def step(self, actions: np.ndarray) -> StepResult:
        """Apply ``actions`` (``int [B]``) to every instance.

        Raises:
            RuntimeError: an instance's episode has ended and it was not reset since.
            ValueError: ``actions`` has the wrong shape, type or range.
        """

    @abstractmethod
    def render(self, index: int = 0) -> np.ndarray:
        """The whole board of instance ``index`` as ``uint8 [H', W', 3]`` RGB, one pixel per
        cell (the full observation, whatever the observation mode)."""

    @abstractmethod
    def info(self) -> dict[str, np.ndarray]:
        """Per-instance counters, each an array ``[B]`` (``'retries'``, ``'solved'``,
        ``'level'``, ...; the game documents its own)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: numpy arrays and plain Python values,
        generator states included."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (same game, same ``batch_size`` and options).

        Raises:
            ValueError: the state is from another game, size or configuration.
        """
