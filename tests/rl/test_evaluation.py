"""Held-out evaluation: the levels are a function of (seed, episode index) only; the figures
are what the episodes gave."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from counter_env import CounterEnv
from tensordict.nn import TensorDictModule
from torchrl.modules import ProbabilisticActor

from relmem.models import LSTMModelConfig
from relmem.rl import keys
from relmem.rl.agent import build_agent
from relmem.rl.evaluation import HELD_OUT_TAG, evaluate, held_out_level


def always_zero() -> TensorDictModule:
    """A policy that always takes action 0 (reward 1 per step in CounterEnv)."""
    return TensorDictModule(
        lambda obs: torch.zeros(obs.shape[0], dtype=torch.int64),
        in_keys=[keys.OBSERVATION],
        out_keys=[keys.ACTION],
    )


def test_levels_do_not_depend_on_the_batch_size() -> None:
    one = evaluate(CounterEnv, always_zero(), episodes=40, seed=3, batch_size=7)
    two = evaluate(CounterEnv, always_zero(), episodes=40, seed=3, batch_size=40)
    assert one == two
    assert one.mean_return == one.mean_length and one.solve_rate == 1.0
    assert one.solve_stderr == 0.0 and 2 <= one.mean_length <= 4
    other = evaluate(CounterEnv, always_zero(), episodes=40, seed=4, batch_size=40)
    assert other.mean_length != one.mean_length


def test_a_long_episode_holds_up_only_the_last_ones() -> None:
    """The pool: a step plays B counted episode-steps until every episode has begun, so the
    policy runs at most ceil(total length / B) + the longest length times (batches played one
    after the other would each wait for their own longest episode: 281 calls here)."""
    calls = 0

    def zero(obs: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    policy = TensorDictModule(zero, in_keys=[keys.OBSERVATION], out_keys=[keys.ACTION])
    lengths = (1, 1, 1, 1, 1, 1, 1, 40)
    result = evaluate(CounterEnv, policy, episodes=64, seed=0, batch_size=8, lengths=lengths)
    total = round(result.mean_length * 64)  # reward 1 per step: return = length
    assert calls <= math.ceil(total / 8) + 40, (calls, total)
    assert result == evaluate(
        CounterEnv, always_zero(), episodes=64, seed=0, batch_size=64, lengths=lengths
    )


def test_random_policy_figures() -> None:
    """Uniform actions: reward 1 with probability 1/3 per step, lengths uniform on {2, 3, 4}."""
    result = evaluate(CounterEnv, None, episodes=600, seed=0, batch_size=200)
    assert result.episodes == 600
    assert abs(result.mean_length - 3) < 4 * math.sqrt(2 / 3 / 600)
    assert abs(result.mean_return - 1) < 4 * result.return_stderr
    # solved: at least one action 0 in the episode: 1 - E[(2/3)^L].
    expected = 1 - sum((2 / 3) ** n for n in (2, 3, 4)) / 3
    assert abs(result.solve_rate - expected) < 4 * result.solve_stderr
    assert result == evaluate(CounterEnv, None, episodes=600, seed=0, batch_size=200)


@pytest.mark.parametrize("greedy", [False, True])
def test_an_agent_plays_with_its_state(greedy: bool) -> None:
    torch.manual_seed(0)
    agent = build_agent(CounterEnv.observation_shape, 3, "lstm", LSTMModelConfig(hidden_size=8))
    result = evaluate(CounterEnv, agent.policy, episodes=30, seed=1, batch_size=16, greedy=greedy)
    assert result.episodes == 30 and 2 <= result.mean_length <= 4


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="game must be one of 'boxworld', 'minipacman'"):
        evaluate("chess")
    with pytest.raises(ValueError, match="episodes"):
        evaluate(CounterEnv, episodes=0)
    # numpy's and torch's own errors, before
    for seed in (-1, 1.5):
        with pytest.raises(ValueError, match=r"evaluate: seed must be an integer >= 0"):
            evaluate(CounterEnv, episodes=2, seed=seed)


def test_a_held_out_level_is_the_spawned_child_of_its_index() -> None:
    """Episode i's generator is made directly (an evaluation of 10^6 episodes spawned them all
    first: 1.3 GB); it is the same level set as spawning."""
    children = np.random.SeedSequence([HELD_OUT_TAG, 7]).spawn(6)
    for index in (0, 5):
        spawned = np.random.Generator(np.random.PCG64(children[index]))
        direct = held_out_level(7, index)
        assert np.array_equal(spawned.integers(0, 2**62, 8), direct.integers(0, 2**62, 8))


def test_greedy_takes_the_likeliest_action_and_sampling_does_not() -> None:
    """A policy that prefers action 0 (the rewarded one) at 1/2: greedy play earns a reward at
    every step, sampled play at about half (a mutation inverting `greedy` passed every test)."""

    def logits(obs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([0.5, 0.25, 0.25]).log().expand(obs.shape[0], 3)

    policy = ProbabilisticActor(
        TensorDictModule(logits, in_keys=[keys.OBSERVATION], out_keys=[keys.LOGITS]),
        in_keys=[keys.LOGITS],
        out_keys=[keys.ACTION],
        distribution_class=torch.distributions.Categorical,
    )
    greedy = evaluate(CounterEnv, policy, episodes=64, seed=3, greedy=True)
    sampled = evaluate(CounterEnv, policy, episodes=64, seed=3)
    assert greedy.mean_return == greedy.mean_length
    assert sampled.mean_return < 0.75 * sampled.mean_length


def test_the_standard_errors_are_the_documented_formulas(monkeypatch) -> None:
    """Return: sample standard deviation (ddof 1) / sqrt(n); solve rate: sqrt(p(1-p)/n). The
    statistical checks' 4-sigma bounds let ddof 0 or n - 1 through (a mutation audit)."""
    import relmem.rl.evaluation as evaluation

    returns = np.array([0.0, 1.0, 2.0, 5.0])
    solved = np.array([True, False, False, False])
    monkeypatch.setattr(evaluation, "_play", lambda *args: (returns, np.full(4, 3), solved))
    result = evaluate(CounterEnv, None, episodes=4, seed=0, batch_size=4)
    assert math.isclose(result.return_stderr, returns.std(ddof=1) / 2, rel_tol=1e-12)
    assert math.isclose(result.solve_stderr, math.sqrt(0.25 * 0.75 / 4), rel_tol=1e-12)
