"""A TorchRL ``EnvBase`` over any :class:`~relmem.rl.envs.base.BatchedEnv` (``docs/rl.md`` §3).

:class:`TorchRLBatchedEnv` steps all B instances of one batched numpy game at once
(``batch_size=[B]``) and resets only the instances TorchRL asks for (the ``"_reset"`` mask
``bool [B, 1]``), so a collector's automatic partial resets map onto the core's
``reset(mask)``. :func:`make_env` builds a game by name and appends ``InitTracker`` (the
``is_init`` flag the agent's recurrent modules reset on) and, optionally, the agent's primers.

Entries (``relmem.rl.keys``), B the batch size:

- ``observation``: ``uint8 [B, H, W, C]``;
- ``action``: ``int64 [B]`` (a ``Categorical`` spec of ``num_actions`` values);
- ``reward``: ``float32 [B, 1]``; ``done``, ``terminated``, ``truncated``: ``bool [B, 1]``;
- ``("info", name)``: each of the core's :meth:`~relmem.rl.envs.base.BatchedEnv.info`
  counters, ``[B]`` in the counter's dtype (BoxWorld: ``retries``, ``solved``, ...).

The numpy core stays reachable as ``env.core`` (through a ``TransformedEnv``:
``env.base_env.core``) for ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase, InitTracker, Transform, TransformedEnv

from relmem.rl import keys
from relmem.rl.envs.base import BatchedEnv
from relmem.validation import check_choice

__all__ = ["GAMES", "TorchRLBatchedEnv", "make_env"]

#: The games :func:`make_env` builds, by name: ``"module:class"`` of their batched core.
GAMES = {
    "boxworld": "relmem.rl.envs.boxworld:BoxWorld",
    "minipacman": "relmem.rl.envs.minipacman:MiniPacman",
}

INFO = "info"


class TorchRLBatchedEnv(EnvBase):
    """A batched numpy game as a TorchRL environment with ``batch_size=[B]``.

    Args:
        core: the game, B instances (``core.batch_size``). It is used in place: its
            generators, episodes and counters are this environment's.

    Episodes do not restart by themselves: an instance whose episode ended reports ``done``
    and is restarted by the next ``reset`` whose ``"_reset"`` mask names it (TorchRL's
    collectors and ``rollout`` do this), as the core's contract asks.
    """

    def __init__(self, core: BatchedEnv) -> None:
        if not isinstance(core, BatchedEnv):
            raise TypeError(
                f"TorchRLBatchedEnv: core must be a BatchedEnv, got {type(core).__name__}"
            )
        batch = core.batch_size
        super().__init__(batch_size=torch.Size([batch]), device="cpu")
        self.core = core
        info_specs = {
            name: Unbounded(shape=(batch,), dtype=torch.from_numpy(np.asarray(value)).dtype)
            for name, value in core.info().items()
        }
        self.observation_spec = Composite(
            {
                keys.OBSERVATION: Unbounded(
                    shape=(batch, *core.observation_shape), dtype=torch.uint8
                ),
                INFO: Composite(info_specs, shape=(batch,)),
            },
            shape=(batch,),
        )
        self.action_spec = Categorical(core.num_actions, shape=(batch,), dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(batch, 1), dtype=torch.float32)
        done = Categorical(2, shape=(batch, 1), dtype=torch.bool)
        self.done_spec = Composite(
            {keys.DONE: done, keys.TERMINATED: done.clone(), keys.TRUNCATED: done.clone()},
            shape=(batch,),
        )

    def _info(self) -> TensorDict:
        """The core's counters, ``[B]`` each."""
        counters = {name: torch.as_tensor(np.asarray(v)) for name, v in self.core.info().items()}
        return TensorDict(counters, batch_size=self.batch_size)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        """Restart the instances in ``tensordict["_reset"]`` (``bool [B, 1]``; absent: all).

        Returns every instance's observation; TorchRL keeps the old entries of the others.
        """
        mask = None
        if tensordict is not None and "_reset" in tensordict:
            mask = tensordict.get("_reset").reshape(self.batch_size).cpu().numpy()
        observation = self.core.reset(mask)
        not_done = torch.zeros((*self.batch_size, 1), dtype=torch.bool)
        return TensorDict(
            {
                keys.OBSERVATION: torch.from_numpy(observation.copy()),
                INFO: self._info(),
                keys.DONE: not_done,
                keys.TERMINATED: not_done.clone(),
                keys.TRUNCATED: not_done.clone(),
            },
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step every instance with ``tensordict["action"]`` (``int64 [B]``)."""
        actions = tensordict.get(keys.ACTION).reshape(self.batch_size).cpu().numpy()
        result = self.core.step(actions)
        terminated = torch.from_numpy(np.asarray(result.terminated, dtype=bool)).unsqueeze(-1)
        truncated = torch.from_numpy(np.asarray(result.truncated, dtype=bool)).unsqueeze(-1)
        reward = torch.from_numpy(np.asarray(result.reward, dtype=np.float32)).unsqueeze(-1)
        return TensorDict(
            {
                keys.OBSERVATION: torch.from_numpy(result.observation.copy()),
                INFO: self._info(),
                keys.REWARD: reward,
                keys.DONE: terminated | truncated,
                keys.TERMINATED: terminated,
                keys.TRUNCATED: truncated,
            },
            batch_size=self.batch_size,
        )

    def _set_seed(self, seed: int | None) -> None:
        """Re-seed the instances' generators (:meth:`BatchedEnv.seed`)."""
        self.core.seed(seed)


def game_class(game: str) -> type[BatchedEnv]:
    """The batched core class of ``game`` (a key of :data:`GAMES`)."""
    check_choice("game", game, tuple(GAMES), owner="make_env")
    module, name = GAMES[game].split(":")
    return getattr(importlib.import_module(module), name)


def make_env(
    game: str,
    batch_size: int,
    seed: int | None,
    *,
    primers: Sequence[Transform] = (),
    **options: Any,
) -> TransformedEnv:
    """The game ``game`` with ``batch_size`` instances, as a TorchRL environment.

    Args:
        game: ``'boxworld'`` or ``'minipacman'``.
        batch_size: B.
        seed: seed of the instances' generators (None: fresh entropy).
        primers: transforms appended after ``InitTracker``, e.g. the agent's
            ``make_tensordict_primer()``.
        **options: the game's own parameters (``grid_size``, ``observation``, ``task``, ...).

    Returns:
        ``TransformedEnv(TorchRLBatchedEnv(core), Compose(InitTracker(), *primers))``; the core
        is ``env.base_env.core``.
    """
    core = game_class(game)(batch_size=batch_size, seed=seed, **options)
    env = TransformedEnv(TorchRLBatchedEnv(core), InitTracker(init_key=keys.IS_INIT))
    for primer in primers:
        env.append_transform(primer)
    return env
