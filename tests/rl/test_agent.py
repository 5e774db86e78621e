"""The agent's recurrent plug-in (``docs/rl.md`` §3): the three module checks of spec §4.4 for
the RMC, LSTM and ConvLSTM cores, the collector carrying the state (pytorch/rl issue 2362),
the encoder's layout and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from counter_env import CounterEnv
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs import InitTracker, TransformedEnv
from torchrl.modules import set_recurrent_mode

from relmem.models import LSTMModelConfig, RMCModelConfig
from relmem.models.convlstm import ConvLSTMModelConfig, same_padding
from relmem.rl import ConvLSTMModule, RMCModule, keys
from relmem.rl.agent import build_agent
from relmem.rl.config import AgentConfig
from relmem.rl.envs.torchrl_env import TorchRLBatchedEnv
from relmem.rl.modules import CellEncoder, RecurrentCoreModule

TINY = {
    "rmc": RMCModelConfig(mem_slots=2, head_size=4, num_heads=2, gate_style="memory"),
    "lstm": LSTMModelConfig(hidden_size=8),
    "convlstm": ConvLSTMModelConfig(channels=4),
}
B, T = 4, 9


def agent_and_env(model: str, seed: int = 0, truncate: bool = False):
    """A tiny agent with ``model``'s core and B ``CounterEnv`` instances (episodes that
    terminate, or are truncated) carrying its primer."""
    torch.manual_seed(seed)
    agent = build_agent(CounterEnv.observation_shape, CounterEnv.num_actions, model, TINY[model])
    core = CounterEnv(B, seed=seed, truncate=truncate)
    env = TransformedEnv(TorchRLBatchedEnv(core), InitTracker())
    env.append_transform(agent.make_tensordict_primer())
    return agent, env


def rollout(model: str):
    agent, env = agent_and_env(model)
    with torch.no_grad():
        data = env.rollout(T, agent.policy, break_when_any_done=False)
    assert data.shape == (B, T)
    assert data[keys.IS_INIT][:, 1:].any(), "no episode ended inside the rollout"
    return agent, data


def actor_and_value(agent, td):
    """The policy (logits, a sampled action) and the value on ``td``, the shared part once."""
    agent.policy(td)
    agent.value_head(td)
    return td


@pytest.mark.parametrize("model", sorted(TINY))
def test_the_step_after_an_episode_end_equals_a_fresh_module(model: str) -> None:
    """§4.4 (1): where ``is_init`` is set mid-batch the output is the fresh module's."""
    agent, data = rollout(model)
    starts = data[keys.IS_INIT][..., 0].clone()
    starts[:, 0] = False
    for b, t in starts.nonzero().tolist():
        garbage = {k: torch.randn(1, *data[k].shape[2:]) for k in agent.state_keys}
        fresh = TensorDict(
            {
                keys.OBSERVATION: data[keys.OBSERVATION][b, t][None],
                keys.IS_INIT: torch.ones(1, 1, dtype=torch.bool),
                **garbage,
            },
            batch_size=[1],
        )
        with torch.no_grad():
            agent.policy(fresh)
        torch.testing.assert_close(fresh[keys.LOGITS][0], data[keys.LOGITS][b, t])
        for key in agent.state_keys:
            torch.testing.assert_close(fresh["next", key][0], data["next", key][b, t])


def exact_states(core: RecurrentCoreModule, starts: torch.Tensor) -> torch.Tensor:
    """``bool [B, T]``: where recurrent mode writes the exact next state: everywhere with
    ``'steps'`` or for the RMC, else at the last step of each sequence call and at T - 1:
    before any row's reset (``'segments'``), before the row's own (``'episodes'``)."""
    if core.recurrent_impl == "steps" or isinstance(core, RMCModule):
        return torch.ones_like(starts)
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    if core.recurrent_impl == "segments":
        ends[:, :-1] = ends[:, :-1].any(0)
    return ends


@pytest.mark.parametrize("model", sorted(TINY))
def test_recurrent_mode_equals_step_by_step(model: str) -> None:
    """§4.4 (2): recurrent mode over ``[B, T]`` with episodes packed along T gives the
    sequential outputs and next states, and the same gradients."""
    agent, data = rollout(model)
    inputs = data.select(keys.OBSERVATION, keys.IS_INIT, *agent.state_keys)
    generator = torch.Generator().manual_seed(3)
    weights = torch.randn(B, T, CounterEnv.num_actions + 1, generator=generator)

    def loss_of(td: TensorDict) -> torch.Tensor:
        out = torch.cat([td[keys.LOGITS], td[keys.STATE_VALUE]], -1)
        return (out * weights).sum()

    agent.zero_grad()
    with set_recurrent_mode(True):
        recurrent = actor_and_value(agent, inputs.clone())
    loss_of(recurrent).backward()
    recurrent_grads = {n: p.grad.clone() for n, p in agent.named_parameters()}

    agent.zero_grad()
    state = {k: inputs[k][:, 0] for k in agent.state_keys}
    steps = []
    for t in range(T):
        step = TensorDict(
            {
                keys.OBSERVATION: inputs[keys.OBSERVATION][:, t],
                keys.IS_INIT: inputs[keys.IS_INIT][:, t],
                **state,
            },
            batch_size=[B],
        )
        actor_and_value(agent, step)
        state = {k: step["next", k] for k in agent.state_keys}
        steps.append(step)
    sequential = torch.stack(steps, 1)
    loss_of(sequential).backward()

    torch.testing.assert_close(recurrent[keys.LOGITS], data[keys.LOGITS])
    torch.testing.assert_close(recurrent[keys.LOGITS], sequential[keys.LOGITS])
    torch.testing.assert_close(recurrent[keys.STATE_VALUE], sequential[keys.STATE_VALUE])
    exact = exact_states(agent.core, inputs[keys.IS_INIT][..., 0])
    for key in agent.state_keys:
        torch.testing.assert_close(recurrent["next", key][exact], sequential["next", key][exact])
        torch.testing.assert_close(recurrent["next", key][exact], data["next", key][exact])
    for name, param in agent.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
        torch.testing.assert_close(recurrent_grads[name], param.grad, msg=name)


RESETS = {  # (row, t) where is_init is set: t = 0, a time shared by two rows, the last step
    "t0_mid_last": [(0, 0), (1, 3), (2, 3), (1, 5), (3, 6)],
    "none": [],
    "every_step_one_row": [(4, t) for t in range(7)],
}


@pytest.mark.parametrize("impl", ["segments", "episodes"])
@pytest.mark.parametrize("resets", sorted(RESETS))
@pytest.mark.parametrize("model", sorted(TINY))
def test_sequence_calls_equal_steps(model: str, resets: str, impl: str) -> None:
    """Recurrent mode over segments or over episodes equals the step-by-step reference:
    outputs, the next states (every step for the RMC; the last step of each sequence call
    otherwise, zeros elsewhere), and the gradients of the inputs, the state at t = 0 and
    every parameter."""
    torch.manual_seed(0)
    agent = build_agent((3, 3, 2), 4, model, TINY[model])
    core = agent.core
    batch, steps = 5, 7
    starts = torch.zeros(batch, steps, 1, dtype=torch.bool)
    for row, t in RESETS[resets]:
        starts[row, t] = True
    with torch.no_grad():
        x = agent.encoder.module(torch.randint(0, 256, (batch, steps, 3, 3, 2), dtype=torch.uint8))
    # float64: the two implementations add the same terms in other orders, and in float32 a
    # bias gradient summed over every row differed by 3e-5 (of 59) on one machine
    core.double()
    x = x.double().requires_grad_(True)
    state0 = {
        key: torch.randn(batch, steps, *shape, dtype=torch.float64, requires_grad=True)
        for key, shape in zip(core.state_keys, core.state_shapes, strict=True)
    }
    td = TensorDict({"embedding": x, keys.IS_INIT: starts, **state0}, batch_size=[batch, steps])
    weights = {key: torch.randn_like(state0[key]) for key in state0}
    out_weights = torch.randn(batch, steps, core.core.output_size, dtype=torch.float64)

    core.recurrent_impl = impl
    exact = exact_states(core, starts[..., 0])

    def run(impl: str) -> tuple[TensorDict, dict[str, torch.Tensor]]:
        core.recurrent_impl = impl
        with set_recurrent_mode(True):
            out = core(td.clone())
        loss = (out["core_output"] * out_weights).sum()
        for key in core.state_keys:
            loss = loss + (out["next", key] * weights[key])[exact].sum()
        inputs = [x, *state0.values(), *agent.core.parameters()]
        grads = torch.autograd.grad(loss, inputs)
        names = ["x", *state0, *(n for n, _ in agent.core.named_parameters())]
        return out, dict(zip(names, grads, strict=True))

    reference, reference_grads = run("steps")
    calls, call_grads = run(impl)
    torch.testing.assert_close(calls["core_output"], reference["core_output"])
    for key in core.state_keys:
        torch.testing.assert_close(calls["next", key][exact], reference["next", key][exact])
        assert not calls["next", key][~exact].any()
    for name, grad in reference_grads.items():
        torch.testing.assert_close(call_grads[name], grad, msg=name)


def test_recurrent_impl_is_checked() -> None:
    with pytest.raises(ValueError, match="recurrent_impl must be one of 'segments', 'episodes'"):
        ConvLSTMModule(25 * 26, recurrent_impl="loop")


@pytest.mark.parametrize("model", sorted(TINY))
def test_the_collector_carries_the_state(model: str) -> None:
    """§4.4 (3) and pytorch/rl issue 2362: the collected data holds the state keys and
    ``is_init``; inside a trajectory the state read at t+1 is the one written at t, and it is
    not the zero primer (nor, for the RMC, its initial memory) after the first step."""
    agent, env = agent_and_env(model)
    collector = Collector(env, agent.policy, frames_per_batch=B * T, total_frames=2 * B * T)
    batches = list(collector)
    collector.shutdown()
    for data in batches:
        assert data.shape == (B, T)
        for key in (keys.IS_INIT, *agent.state_keys, *(("next", k) for k in agent.state_keys)):
            assert key in data.keys(True), key
        inside = ~data[keys.IS_INIT][:, 1:, 0]  # [B, T-1]: step t+1 continues step t
        assert inside.any()
        for key in agent.state_keys:
            read, written = data[key][:, 1:][inside], data["next", key][:, :-1][inside]
            torch.testing.assert_close(read, written, rtol=0, atol=0)
            initial = agent.core.initial_state(int(inside.sum()), torch.device("cpu"))
            index = agent.state_keys.index(key)
            assert (read - initial[index]).flatten(1).abs().amax(1).gt(0).all()
    # The second batch goes on from the first: the carried state was not dropped at the seam.
    first, second = batches
    continuing = ~second[keys.IS_INIT][:, 0, 0]
    for key in agent.state_keys:
        torch.testing.assert_close(
            second[key][:, 0][continuing], first["next", key][:, -1][continuing], rtol=0, atol=0
        )


def test_a_policy_without_its_state_is_refused() -> None:
    """Without the primer the module raises rather than running on zeros (issue 2362)."""
    agent = build_agent(CounterEnv.observation_shape, 3, "lstm", TINY["lstm"])
    env = TransformedEnv(TorchRLBatchedEnv(CounterEnv(B, seed=0)), InitTracker())
    with pytest.raises(KeyError, match="no 'h' entry; append the agent's make_tensordict_primer"):
        env.rollout(3, agent.policy)


def test_the_rmc_resets_to_its_identity_memory_not_zeros() -> None:
    agent = build_agent((5, 5, 6), 4, "rmc", RMCModelConfig(gate_style="memory"))
    initial = agent.core.initial_state(2, torch.device("cpu"))[0]
    assert initial.shape == (2, 8, 256)
    torch.testing.assert_close(initial[0], torch.eye(8, 256))


def test_the_agent_core_takes_the_fused_implementation() -> None:
    """``RMCModelConfig.implementation`` reaches the agent's core; a rollout and its data match
    the fast path's to float rounding (same weights, same levels)."""
    results = {}
    for implementation in ("fast", "fused"):
        torch.manual_seed(0)
        config = RMCModelConfig(
            mem_slots=2,
            head_size=4,
            num_heads=2,
            gate_style="memory",
            implementation=implementation,
        )
        agent = build_agent(CounterEnv.observation_shape, CounterEnv.num_actions, "rmc", config)
        assert agent.core.core.implementation == implementation
        env = TransformedEnv(TorchRLBatchedEnv(CounterEnv(B, seed=0)), InitTracker())
        env.append_transform(agent.make_tensordict_primer())
        with torch.no_grad(), set_recurrent_mode(False):
            data = env.rollout(T, agent.policy, break_when_any_done=False)
        results[implementation] = data
    torch.testing.assert_close(results["fused"][keys.LOGITS], results["fast"][keys.LOGITS])


def test_public_modules() -> None:
    from relmem.cores.rmc import RMCConfig

    rmc = RMCModule(RMCConfig(26, 4, 64, 4, gate_style="memory", input_rows=25))
    assert rmc.state_keys == ["memory"] and rmc.state_shapes == [(4, 256)]
    conv = ConvLSTMModule(25 * 26)
    assert conv.state_keys == ["h", "c"] and conv.state_shapes == [(64, 5, 5)] * 2


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_encoder_layout() -> None:
    """Rows are cells in row-major order, their last two features the cell's x and y; the
    'same' padding equals PyTorch's own (0 before, 1 after for a 2×2 kernel)."""
    encoder = CellEncoder(6)
    observation = torch.randint(0, 256, (2, 5, 5, 6), dtype=torch.uint8)
    rows = encoder(observation)
    assert rows.shape == (2, 25, 26)
    torch.testing.assert_close(rows[0, 7, -2:], torch.tensor([0.0, -0.5]))  # (y, x) = (1, 2)
    x = observation.permute(0, 3, 1, 2).float() / 255
    conv = encoder.convs[0]
    same = torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding="same")
    padded = conv(torch.nn.functional.pad(x, same_padding(2)))
    torch.testing.assert_close(padded, same)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="model must be one of .*convlstm.*lstm.*rmc"):
        build_agent((5, 5, 6), 4, "gru", TINY["lstm"])
    with pytest.raises(TypeError, match="model 'lstm' takes a LSTMModelConfig, got RMCModelConfig"):
        build_agent((5, 5, 6), 4, "lstm", TINY["rmc"])
    with pytest.raises(ValueError, match="convlstm.height and convlstm.width"):
        build_agent((5, 5, 6), 4, "convlstm", ConvLSTMModelConfig(height=3, width=3))
    with pytest.raises(ValueError, match="observation_shape must be"):
        build_agent((5, 5), 4, "lstm", TINY["lstm"])
    # an audit's reproductions: each failed later inside torch, or not at all
    numpy_shape = tuple(np.int64(d) for d in (5, 5, 6))  # BatchedEnv shapes may be NumPy's
    assert build_agent(numpy_shape, np.int64(4), "lstm", TINY["lstm"]) is not None
    with pytest.raises(TypeError, match="agent_config must be an AgentConfig or None, got dict"):
        build_agent((5, 5, 6), 4, "lstm", TINY["lstm"], {"hidden_size": 8})
    with pytest.raises(ValueError, match="task.agent.kernel_size must be an integer >= 1"):
        AgentConfig(kernel_size=2.0)
    with pytest.raises(ValueError, match="task.agent.conv_channels must be one or more"):
        AgentConfig(conv_channels=12)
    with pytest.raises(ValueError, match="CellEncoder: in_channels must be an integer >= 1"):
        CellEncoder(0)
    with pytest.raises(ValueError, match="CellEncoder: conv_channels must be a sequence"):
        CellEncoder(3, ())
    with pytest.raises(ValueError, match="ConvLSTMCore: height must be an integer >= 1"):
        ConvLSTMModule(26, height=0)


@pytest.mark.parametrize("model", sorted(TINY))
def test_observations_and_states_of_the_wrong_shape_are_named(model: str) -> None:
    """A channels-last ConvLSTM state was reshaped into place silently (scrambled); a wrong
    observation failed inside a convolution or a reshape."""
    agent, env = agent_and_env(model)
    td = env.reset()
    key = agent.state_keys[0]
    shape = td[key].shape[1:]
    assert tuple(reversed(shape)) != tuple(shape)  # channels last for the ConvLSTM's [C, H, W]
    bad = td.clone()
    bad[key] = torch.zeros(B, *reversed(shape))  # as many elements: a reshape took it
    with pytest.raises(ValueError, match=f"state entry {key!r} must be"):
        agent.policy(bad)
    wrong = td.clone()
    channels = td[keys.OBSERVATION].shape[-1]
    wrong[keys.OBSERVATION] = torch.zeros(B, 7, 7, channels, dtype=torch.uint8)
    with pytest.raises(ValueError, match="observations must be"):
        agent.policy(wrong)
    floats = td.clone()
    floats[keys.OBSERVATION] = td[keys.OBSERVATION].float() / 255
    with pytest.raises(TypeError, match="observations must be uint8"):
        agent.policy(floats)


def test_parameters_are_held_once_and_copies_stay_shared() -> None:
    import copy

    agent = build_agent((5, 5, 6), 4, "lstm", TINY["lstm"])
    names = list(agent.state_dict())
    assert not any(n.startswith(("policy.", "value.")) for n in names)
    assert len(names) == len({id(t) for t in agent.state_dict().values()})
    twin = copy.deepcopy(agent)
    assert twin.policy.module[0].module[1] is twin.core and twin.value.module[1] is twin.core
