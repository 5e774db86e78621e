"""The RL learners' inputs to TorchRL: the values given to the estimators
(``relmem.rl.learners.write_values``), each step's value and bootstrap value from the recurrent
state the agent really had, checked against a step-by-step replay of the collected batch,
across episode ends, truncations and a batch that starts mid-episode; and the losses' critic
(``Agent.loss_critic``), checked against the whole value network."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from test_agent import TINY, B, T, agent_and_env
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import A2CLoss, ClipPPOLoss
from torchrl.objectives.value import GAE

from relmem.rl import keys
from relmem.rl.agent import INTERMEDIATE_KEYS
from relmem.rl.config import LearnerConfig
from relmem.rl.learners import (
    LOSS_TERMS,
    PPOUpdate,
    total_loss,
    write_values,
    write_vtrace_targets,
)


def second_batch(model: str, truncate: bool):
    """An agent and its collector's second batch (its rows start mid-episode with a carried
    state; episodes of 2 to 4 steps end inside it)."""
    agent, env = agent_and_env(model, truncate=truncate)
    collector = Collector(env, agent.policy, frames_per_batch=B * T, total_frames=2 * B * T)
    batches = list(collector)
    collector.shutdown()
    data = batches[1]
    assert data[keys.IS_INIT][:, 1:].any() and not data[keys.IS_INIT][:, 0].all()
    return agent, data


def replayed_values(agent, data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one sequential step at a time from the state stored at ``t = 0``, the
    value of each observation and of the next one (read from the state after the step)."""
    state = {k: data[k][:, 0] for k in agent.state_keys}
    values, bootstraps = [], []
    with torch.no_grad(), set_recurrent_mode(False):
        for t in range(data.shape[1]):
            now = TensorDict(
                {
                    keys.OBSERVATION: data[keys.OBSERVATION][:, t],
                    keys.IS_INIT: data[keys.IS_INIT][:, t],
                    **state,
                },
                batch_size=[B],
            )
            agent.value(now)
            state = {k: now["next", k] for k in agent.state_keys}
            after = TensorDict(
                {
                    keys.OBSERVATION: data["next", keys.OBSERVATION][:, t],
                    keys.IS_INIT: torch.zeros(B, 1, dtype=torch.bool),
                    **state,
                },
                batch_size=[B],
            )
            agent.value(after)
            values.append(now[keys.STATE_VALUE])
            bootstraps.append(after[keys.STATE_VALUE])
    return torch.stack(values, 1), torch.stack(bootstraps, 1)


@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
@pytest.mark.parametrize("model", sorted(TINY))
def test_values_and_bootstraps_follow_the_agents_own_state(model: str, truncate: bool) -> None:
    agent, data = second_batch(model, truncate)
    expected_value, expected_bootstrap = replayed_values(agent, data)
    with torch.no_grad():
        write_values(agent, data)
    torch.testing.assert_close(data[keys.STATE_VALUE], expected_value, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        data["next", keys.STATE_VALUE], expected_bootstrap, rtol=1e-5, atol=1e-6
    )


def loss_and_gradients(agent, loss, data: TensorDict) -> tuple[dict, list]:
    """The loss terms and every parameter's gradient for one loss evaluation on ``data``."""
    agent.zero_grad()
    with set_recurrent_mode(True):
        terms = loss(data.exclude(*INTERMEDIATE_KEYS))
        total_loss(terms).backward()
    values = {name: terms[name].detach() for name in LOSS_TERMS}
    return values, [p.grad.clone() for p in agent.parameters()]


def batch_with_advantages(model: str, truncate: bool):
    """:func:`second_batch` with its values and GAE advantages written, ready for a loss."""
    agent, data = second_batch(model, truncate)
    with torch.no_grad(), set_recurrent_mode(True):
        write_values(agent, data)
        GAE(gamma=0.9, lmbda=0.8, value_network=None)(data)
    return agent, data


@pytest.mark.parametrize("model", sorted(TINY))
def test_the_shared_pass_critic_equals_the_value_network(model: str) -> None:
    """PPO's critic (the value head on the policy pass's hidden layer) gives the loss and the
    gradients of every parameter that the whole value network as the critic gives, while the
    encoder and the core run once."""
    agent, data = batch_with_advantages(model, truncate=True)
    kwargs = {"entropy_coeff": 0.01, "critic_coeff": 0.5, "loss_critic_type": "l2"}
    expected, expected_grads = loss_and_gradients(
        agent, ClipPPOLoss(agent.policy, agent.value, **kwargs), data
    )
    calls = []
    handle = agent.core.register_forward_hook(lambda *_: calls.append(1))
    got, got_grads = loss_and_gradients(
        agent, ClipPPOLoss(agent.policy, agent.loss_critic, **kwargs), data
    )
    handle.remove()
    assert len(calls) == 1
    assert float(expected["loss_critic"]) > 0
    for name in LOSS_TERMS:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_the_shared_pass_critic_needs_the_policy_pass() -> None:
    """Without the policy's fresh pass (A2CLoss runs its actor on a copy) the critic fails
    loudly rather than read nothing or a collected, gradient-free hidden layer."""
    agent, data = batch_with_advantages("lstm", truncate=False)
    with pytest.raises(KeyError, match="hidden.*run its actor first"):
        agent.loss_critic(data.exclude(*INTERMEDIATE_KEYS))
    loss = A2CLoss(agent.policy, agent.loss_critic, critic_coeff=0.5)
    with set_recurrent_mode(True), pytest.raises(KeyError, match="A2CLoss does not"):
        loss(data.exclude(*INTERMEDIATE_KEYS))


def vtrace_on_policy_reference(data: TensorDict, gamma: float) -> tuple[torch.Tensor, ...]:
    """V-trace with every importance weight 1 (on policy, rho-bar = c-bar = 1), by its
    recursion: ``v_t = V_t + δ_t + γ (1 - done_t) (v_{t+1} - V_{t+1})``, ``δ_t = r_t +
    γ (1 - terminated_t) V'_t - V_t``; the policy's advantage ``r_t + γ (1 - terminated_t)
    v'_{t+1} - V_t`` with ``v'_{t+1}`` the bootstrap ``V'_t`` where step t ends an episode or
    the batch. Float64, ``[B, T, 1]`` each."""
    value = data[keys.STATE_VALUE].double()
    bootstrap = data["next", keys.STATE_VALUE].double()
    reward = data["next", keys.REWARD].double()
    done = data["next", keys.DONE].double()
    keep = 1 - data["next", keys.TERMINATED].double()
    targets = torch.zeros_like(value)
    later = torch.zeros_like(value[:, 0])  # v_{t+1} - V_{t+1}, zero past the batch
    for t in reversed(range(value.shape[1])):
        delta = reward[:, t] + gamma * keep[:, t] * bootstrap[:, t] - value[:, t]
        later = delta + gamma * (1 - done[:, t]) * later
        targets[:, t] = value[:, t] + later
    following = torch.cat([targets[:, 1:], bootstrap[:, -1:]], dim=1)
    following = torch.where(done.bool(), bootstrap, following)
    advantage = reward + gamma * keep * following - value
    return targets, advantage


@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
@pytest.mark.parametrize("model", sorted(TINY))
def test_vtrace_on_policy_is_the_plain_return(model: str, truncate: bool) -> None:
    """The importance weights are those of the actions taken: on the collecting policy every
    one is 1. TorchRL's VTrace module scored a freshly sampled action instead (71% of the
    weights differed from 1, advantages off by up to 0.7)."""
    agent, data = second_batch(model, truncate)
    write_vtrace_targets(agent, data, gamma=0.9)
    targets, advantage = vtrace_on_policy_reference(data, gamma=0.9)
    torch.testing.assert_close(data["value_target"].double(), targets, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(data["advantage"].double(), advantage, rtol=1e-5, atol=1e-5)


def test_ppo_takes_its_advantages_at_the_configured_gamma_and_lambda() -> None:
    """PPOUpdate's GAE is built from the config (a mutation swapping gamma and lambda passed
    every fast test)."""
    agent, data = second_batch("lstm", truncate=True)
    expected = data.clone()
    with torch.no_grad(), set_recurrent_mode(True):
        write_values(agent, expected)
        GAE(gamma=0.9, lmbda=0.5, value_network=None)(expected)
    config = LearnerConfig(gamma=0.9, lmbda=0.5, epochs=1)
    PPOUpdate(agent, config)(data, lambda loss: torch.zeros(()))  # no optimiser step
    torch.testing.assert_close(data["advantage"], expected["advantage"])
