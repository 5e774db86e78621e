"""The TorchRL face of a batched game: specs, partial resets, the info counters, seeding and
``make_env``'s errors."""

from __future__ import annotations

import pytest
import torch
from counter_env import CounterEnv
from torchrl.envs import InitTracker, TransformedEnv
from torchrl.envs.utils import check_env_specs

from relmem.rl import keys
from relmem.rl.envs.torchrl_env import TorchRLBatchedEnv, make_env


def test_specs_pass_torchrls_check() -> None:
    env = TransformedEnv(TorchRLBatchedEnv(CounterEnv(3, seed=0)), InitTracker())
    check_env_specs(env)
    assert env.batch_size == (3,)
    assert env.observation_spec[keys.OBSERVATION].dtype == torch.uint8
    assert env.observation_spec[keys.OBSERVATION].shape == (3, 3, 3, 2)
    assert env.full_done_spec[keys.TRUNCATED].shape == (3, 1)
    assert env.full_reward_spec[keys.REWARD].shape == (3, 1)


def test_only_ended_instances_restart() -> None:
    """A rollout resets exactly the instances whose episode ended, nothing else; their first
    step carries ``is_init``; the info counters come out per instance."""
    env = TransformedEnv(TorchRLBatchedEnv(CounterEnv(4, seed=1)), InitTracker())
    data = env.rollout(12, break_when_any_done=False)
    done = data["next", keys.DONE][..., 0]
    is_init = data[keys.IS_INIT][..., 0]
    torch.testing.assert_close(is_init[:, 1:], done[:, :-1])
    assert is_init[:, 0].all() and done.any()
    steps = data["next", "info", "steps"]
    assert steps.shape == (4, 12) and steps.dtype == torch.int64
    # Counting restarts at every episode start; other instances are not disturbed.
    torch.testing.assert_close(data["info", "steps"][is_init], torch.zeros_like(steps[is_init]))
    continuing = ~is_init[:, 1:]
    torch.testing.assert_close(data["info", "steps"][:, 1:][continuing], steps[:, :-1][continuing])


def test_truncation_is_reported_apart_from_termination() -> None:
    env = TorchRLBatchedEnv(CounterEnv(2, seed=0, lengths=(2,), truncate=True))
    data = env.rollout(2)
    assert data["next", keys.TRUNCATED][:, -1].all()
    assert not data["next", keys.TERMINATED].any()


def test_a_seed_fixes_the_episodes() -> None:
    def observations(seed: int) -> torch.Tensor:
        env = TorchRLBatchedEnv(CounterEnv(3, seed=123))
        env.set_seed(seed)
        return env.rollout(6, break_when_any_done=False)[keys.OBSERVATION]

    torch.testing.assert_close(observations(5), observations(5))
    assert not torch.equal(observations(5), observations(6))


def test_make_env_names_the_games() -> None:
    with pytest.raises(ValueError, match="make_env: game must be one of 'boxworld', 'minipacman'"):
        make_env("chess", 2, 0)


def test_make_env_boxworld() -> None:
    env = make_env("boxworld", 3, 0, grid_size=6, solution_length=(1, 2), observation="viewport")
    check_env_specs(env)
    data = env.rollout(5, break_when_any_done=False)
    assert data[keys.OBSERVATION].shape == (3, 5, 5, 5, 6)
    assert "solved" in data["next", "info"]
    assert env.base_env.core.batch_size == 3


def test_make_env_minipacman_with_an_agent() -> None:
    from relmem.models import LSTMModelConfig
    from relmem.rl.agent import build_agent

    agent = build_agent((5, 5, 3), 5, "lstm", LSTMModelConfig(hidden_size=8))
    env = make_env(
        "minipacman", 2, 0, observation="viewport", primers=[agent.make_tensordict_primer()]
    )
    check_env_specs(env)
    data = env.rollout(4, agent.policy, break_when_any_done=False)
    assert data[keys.OBSERVATION].shape == (2, 4, 5, 5, 3)
    assert set(data["next", "info"].keys()) >= {"level", "frame"}
