"""The values the RL learners give TorchRL's estimators (``relmem.rl.learners.write_values``):
each step's value and bootstrap value from the recurrent state the agent really had, checked
against a step-by-step replay of the collected batch, across episode ends, truncations and a
batch that starts mid-episode."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from test_agent import TINY, B, T, agent_and_env
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode

from relmem.rl import keys
from relmem.rl.learners import write_values


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
