"""Small stand-ins with the interfaces of ``relmem.rl.envs.torchrl_env.make_env`` and
``relmem.rl.agent.build_agent`` (``docs/rl.md`` §3), for training tests that must not depend on
the size of the real games and agents.

- :class:`Reach`: a ``BatchedEnv`` on an n x n board: the agent (white) walks to a goal
  (yellow) placed at random; reaching it pays +10 and terminates, ``max_steps`` truncates.
- :func:`make_reach_env`: a TorchRL environment over any ``BatchedEnv`` with partial resets and
  ``InitTracker`` (what ``make_env`` gives for the real games).
- :func:`build_lstm_agent`: a flat encoder, TorchRL's ``LSTMModule`` and policy / value heads
  with the agent's attributes (``policy``, ``value``, ``make_tensordict_primer``,
  ``state_keys``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase, InitTracker, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import LSTMModule, ProbabilisticActor
from torchrl.modules.utils import get_primers_from_module

from relmem.rl import keys
from relmem.rl.envs.base import BatchedEnv, StepResult

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


class Reach(BatchedEnv):
    """Walk to the goal: +10 and the end on reaching it; truncated after ``max_steps``."""

    num_actions = 4

    def __init__(
        self, batch_size: int, seed: int | None = None, *, size: int = 3, max_steps: int = 12
    ) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_shape = (size, size, 3)
        self.agent = np.zeros((batch_size, 2), dtype=np.int64)
        self.goal = np.zeros((batch_size, 2), dtype=np.int64)
        self.steps = np.zeros(batch_size, dtype=np.int64)
        self.ended = np.ones(batch_size, dtype=bool)
        self.solved = np.zeros(batch_size, dtype=np.int64)
        super().__init__(batch_size, seed)

    def _observe(self) -> np.ndarray:
        obs = np.zeros((self.batch_size, self.size, self.size, 3), dtype=np.uint8)
        rows = np.arange(self.batch_size)
        obs[rows, self.goal[:, 0], self.goal[:, 1]] = (255, 255, 0)
        obs[rows, self.agent[:, 0], self.agent[:, 1]] = (255, 255, 255)
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


class BatchedTorchEnv(EnvBase):
    """A ``BatchedEnv`` as a TorchRL environment with ``batch_size=[B]``."""

    def __init__(self, core: BatchedEnv) -> None:
        super().__init__(batch_size=torch.Size([core.batch_size]))
        self.core = core
        b = core.batch_size
        self.observation_spec = Composite(
            {keys.OBSERVATION: Bounded(0, 255, (b, *core.observation_shape), dtype=torch.uint8)},
            shape=(b,),
        )
        self.action_spec = Categorical(core.num_actions, shape=(b,))
        self.reward_spec = Unbounded(shape=(b, 1))
        flag = Categorical(2, shape=(b, 1), dtype=torch.bool)
        self.done_spec = Composite(
            {keys.DONE: flag, keys.TERMINATED: flag.clone(), keys.TRUNCATED: flag.clone()},
            shape=(b,),
        )

    def _reset(self, tensordict: TensorDict | None, **kwargs: Any) -> TensorDict:
        mask = None
        if tensordict is not None and "_reset" in tensordict:
            mask = tensordict["_reset"].reshape(-1).numpy().copy()
        obs = torch.from_numpy(self.core.reset(mask))
        false = torch.zeros(self.core.batch_size, 1, dtype=torch.bool)
        return TensorDict(
            {
                keys.OBSERVATION: obs,
                keys.DONE: false,
                keys.TERMINATED: false.clone(),
                keys.TRUNCATED: false.clone(),
            },
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDict) -> TensorDict:
        result = self.core.step(tensordict[keys.ACTION].numpy())
        terminated = torch.from_numpy(result.terminated).unsqueeze(-1)
        truncated = torch.from_numpy(result.truncated).unsqueeze(-1)
        return TensorDict(
            {
                keys.OBSERVATION: torch.from_numpy(result.observation),
                keys.REWARD: torch.from_numpy(result.reward).unsqueeze(-1),
                keys.DONE: terminated | truncated,
                keys.TERMINATED: terminated,
                keys.TRUNCATED: truncated,
            },
            batch_size=self.batch_size,
        )

    def _set_seed(self, seed: int | None) -> None:
        self.core.seed(seed)


def make_reach_env(game: str, batch_size: int, seed: int | None, **options: Any) -> TransformedEnv:
    """``make_env``'s interface for the stand-in game (``game`` is ignored)."""
    return TransformedEnv(BatchedTorchEnv(Reach(batch_size, seed, **options)), InitTracker())


class LSTMAgent(nn.Module):
    """Flattened pixels -> Linear -> TorchRL ``LSTMModule`` -> policy logits and value."""

    def __init__(self, observation_shape: tuple[int, ...], num_actions: int, hidden: int) -> None:
        super().__init__()
        size = int(np.prod(observation_shape))
        self.encoder = TensorDictModule(
            nn.Sequential(nn.Flatten(-3), nn.Linear(size, hidden), nn.ReLU()),
            in_keys=["pixels"],
            out_keys=["embedding"],
        )
        scale = TensorDictModule(
            lambda obs: obs.float() / 255.0, in_keys=[keys.OBSERVATION], out_keys=["pixels"]
        )
        self.lstm = LSTMModule(
            input_size=hidden,
            hidden_size=hidden,
            in_keys=["embedding", "lstm_h", "lstm_c"],
            out_keys=["features", ("next", "lstm_h"), ("next", "lstm_c")],
        )
        self.policy_head = TensorDictModule(
            nn.Linear(hidden, num_actions), in_keys=["features"], out_keys=[keys.LOGITS]
        )
        self.value_head = TensorDictModule(
            nn.Linear(hidden, 1), in_keys=["features"], out_keys=[keys.STATE_VALUE]
        )
        trunk = [scale, self.encoder, self.lstm]
        self.policy = ProbabilisticActor(
            TensorDictSequential(*trunk, self.policy_head),
            in_keys=[keys.LOGITS],
            out_keys=[keys.ACTION],
            distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
        )
        self.value = TensorDictSequential(*trunk, self.value_head)
        self.state_keys = ["lstm_h", "lstm_c"]

    def make_tensordict_primer(self) -> Any:
        return self.lstm.make_tensordict_primer()


def build_lstm_agent(
    observation_shape: tuple[int, ...],
    num_actions: int,
    model: str,
    core_config: Any,
    agent_config: Any = None,
) -> LSTMAgent:
    """``build_agent``'s interface; the hidden size is ``core_config.hidden_size``."""
    return LSTMAgent(observation_shape, num_actions, core_config.hidden_size)


def play_first_episodes(
    game: str, policy: Any, *, episodes: int, seed: int, **options: Any
) -> SimpleNamespace:
    """``relmem.rl.evaluation.evaluate``'s interface: the first episode of each of
    ``episodes`` environments seeded by ``seed``, with ``policy`` (None: uniform random)."""
    env = make_reach_env(game, episodes, seed, **options)
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    if policy is not None:
        env.append_transform(get_primers_from_module(policy, warn=False))
    with torch.no_grad():
        data = env.rollout(env.base_env.core.max_steps, policy, break_when_any_done=False)
    done = data["next", keys.DONE].squeeze(-1)  # [E, T]
    first = done.int().argmax(dim=1)
    rows = torch.arange(episodes)
    returns = data["next", "episode_reward"].squeeze(-1)[rows, first].double()
    lengths = data["next", "step_count"].squeeze(-1)[rows, first].double()
    solved = data["next", keys.TERMINATED].squeeze(-1)[rows, first].double()
    return SimpleNamespace(
        mean_return=float(returns.mean()),
        return_stderr=float(returns.std() / episodes**0.5),
        mean_length=float(lengths.mean()),
        solve_rate=float(solved.mean()),
        solve_stderr=float(solved.std() / episodes**0.5),
    )
