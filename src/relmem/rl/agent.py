"""The actor–critic agent of the paper's RL experiments (``docs/rl.md`` §3).

``observation -> CellEncoder -> recurrent core -> Linear 256 -> ReLU -> {logits, value}``:

- the encoder (:class:`~relmem.rl.modules.CellEncoder`) turns ``uint8 [*B, H, W, C]`` into one
  row of 26 features per cell;
- the core is any registered model (``--model``): the RMC reads the rows as a matrix
  (``input_rows = H·W``, one input row per cell); the ConvLSTM reads them as its
  ``[H, W, 26]`` map (the agent sets ``convlstm.height`` / ``width`` to the grid); every other
  core (the LSTM, the DNC) reads them concatenated, ``[*B, H·W·26]``. Its state lives in the
  TensorDict under :attr:`Agent.state_keys` and is reset on ``is_init``
  (:class:`~relmem.rl.modules.RecurrentCoreModule`);
- the heads share one hidden layer: flatten the core output -> Linear ``hidden_size`` -> ReLU,
  then a linear map to the policy's logits and one to the value.

:func:`build_agent` returns an :class:`Agent` whose ``policy`` is a TorchRL
``ProbabilisticActor`` (a categorical distribution over the logits) and ``value`` a module
writing ``state_value``; both share the encoder, the core and the hidden layer. PPO's loss
takes :attr:`Agent.loss_critic` as its critic: the value head alone, on the hidden layer that
the policy's pass over the same data wrote, so that an update runs the encoder and the core
once per loss evaluation rather than once for the policy and again for the value.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    InteractionType,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torch import nn
from torchrl.data import Categorical
from torchrl.envs import TensorDictPrimer
from torchrl.modules import ProbabilisticActor

from relmem.models import get_model, list_models
from relmem.models.convlstm import ConvLSTMModelConfig
from relmem.models.rmc import RMCModelConfig, rmc_config
from relmem.rl import keys
from relmem.rl.config import AgentConfig
from relmem.rl.modules import CellEncoder, RecurrentCoreModule, RMCModule
from relmem.validation import as_int, check_choice, check_int

__all__ = ["Agent", "AgentConfig", "build_agent"]

EMBEDDING = "embedding"  # the encoder's output, the core's input
CORE_OUTPUT = "core_output"  # the core's output [*B, O]
HIDDEN = "hidden"  # the shared hidden layer [*B, hidden_size]
# what a pass of the policy writes besides its outputs (a collected batch holds them too)
INTERMEDIATE_KEYS = (EMBEDDING, CORE_OUTPUT, HIDDEN, keys.LOGITS)


class Agent(nn.Module):
    """The encoder, the recurrent core and the heads (build it with :func:`build_agent`).

    Attributes:
        policy: ``ProbabilisticActor``: reads ``observation``, ``is_init`` and the state keys;
            writes ``logits [*B, A]``, ``action int64 [*B]``, ``action_log_prob [*B]`` and
            ``("next", state key)``. It samples the action unless a
            ``set_exploration_type(ExplorationType.DETERMINISTIC)`` context asks for the most
            probable one.
        value: reads the same entries; writes ``state_value [*B, 1]`` (and the next state).
        loss_critic: PPO's critic (:class:`ValueOfPolicyPass`): the value head on the
            ``hidden`` entry the policy's pass wrote into the same tensordict.
            Give the loss data without :data:`INTERMEDIATE_KEYS` (a collected batch's are
            stale and carry no gradient); the critic then fails loudly if the policy did not
            run first.
        state_keys: the recurrent state's entries (RMC: ``memory``; LSTM and ConvLSTM: ``h``,
            ``c``).
        core: the :class:`~relmem.rl.modules.RecurrentCoreModule`.

    ``policy`` and ``value`` are views over the registered parts (``encoder``, ``core``,
    ``trunk``, ``policy_head``, ``value_head``), so ``state_dict`` holds every parameter once.
    """

    def __init__(
        self,
        encoder: TensorDictModule,
        core: RecurrentCoreModule,
        trunk: TensorDictModule,
        policy_head: TensorDictModule,
        value_head: TensorDictModule,
        num_actions: int,
    ) -> None:
        super().__init__()
        self.encoder, self.core, self.trunk = encoder, core, trunk
        self.policy_head, self.value_head = policy_head, value_head
        policy = ProbabilisticActor(
            TensorDictSequential(encoder, core, trunk, policy_head),
            in_keys=[keys.LOGITS],
            out_keys=[keys.ACTION],
            spec=Categorical(num_actions),
            distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
            log_prob_key=keys.ACTION_LOG_PROB,
            default_interaction_type=InteractionType.RANDOM,
        )
        value = TensorDictSequential(encoder, core, trunk, value_head)
        # Not submodules: their parameters are the parts' (one copy in state_dict).
        self.__dict__["policy"] = policy
        self.__dict__["value"] = value
        self.__dict__["loss_critic"] = ValueOfPolicyPass(value_head)

    @property
    def state_keys(self) -> list[str]:
        return list(self.core.state_keys)

    def make_tensordict_primer(self) -> TensorDictPrimer:
        """The environment transform declaring the recurrent state (append it after
        ``InitTracker``; :func:`relmem.rl.envs.torchrl_env.make_env` takes it as
        ``primers=[...]``)."""
        return self.core.make_tensordict_primer()


class ValueOfPolicyPass(TensorDictModuleBase):
    """The value head over the hidden layer a pass of the policy has just written.

    TorchRL's ``ClipPPOLoss`` runs its actor and then its critic on one (shallow) copy of the
    loss's input: with this critic, the value loss back-propagates through the same encoder
    and core pass as the policy loss. Loss and gradients equal those
    of ``agent.value`` as the critic (``tests/rl/test_learners.py``); the encoder and the
    recurrent core run once instead of twice.

    Args:
        value_head: reads ``hidden [*B, hidden_size]``, writes ``state_value [*B, 1]``.

    Raises:
        KeyError: the input has no ``hidden`` entry (the policy has not run on it).
    """

    def __init__(self, value_head: TensorDictModule) -> None:
        super().__init__()
        self.value_head = value_head
        self.in_keys = list(value_head.in_keys)
        self.out_keys = list(value_head.out_keys)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.get(HIDDEN, None) is None:
            raise KeyError(
                f"{type(self).__name__}: the input has no {HIDDEN!r} entry: this critic reads "
                "the hidden layer the policy's pass wrote into the same tensordict, so the "
                "loss must run its actor first on the same tensordict (TorchRL's ClipPPOLoss "
                "does, A2CLoss does not); use agent.value to compute values on their own"
            )
        return self.value_head(tensordict)


def _build_core(
    model: str, core_config: object, grid: tuple[int, int], features: int
) -> tuple[RecurrentCoreModule, bool]:
    """The core module for ``model`` over an ``H×W`` grid of ``features`` per cell, and
    whether it reads rows (``[*B, H·W, F]``) rather than their concatenation."""
    entry = get_model(model)
    if not isinstance(core_config, entry.config_cls):
        raise TypeError(
            f"build_agent: model {model!r} takes a {entry.config_cls.__name__}, got "
            f"{type(core_config).__name__}"
        )
    cells = grid[0] * grid[1]
    if isinstance(core_config, RMCModelConfig):
        config = rmc_config(core_config, features, input_rows=cells)
        module = RMCModule(
            config,
            input_key=EMBEDDING,
            output_key=CORE_OUTPUT,
            implementation=core_config.implementation,
        )
        return module, True
    if isinstance(core_config, ConvLSTMModelConfig):
        default = ConvLSTMModelConfig()
        given = (core_config.height, core_config.width)
        if given not in ((default.height, default.width), grid):
            raise ValueError(
                f"build_agent: convlstm.height and convlstm.width are the observation's grid "
                f"{grid}; leave them at their defaults, got {given}"
            )
        core_config = dataclasses.replace(core_config, height=grid[0], width=grid[1])
    core = entry.build(core_config, cells * features, None)
    lstm = model == "lstm"
    # The LSTM packs its episodes, so one call over all of them costs what the steps do; cut
    # at every reset of any row ('segments'), it ran one step at a time once episodes were
    # short (docs/rl.md §3.2)
    module = RecurrentCoreModule(
        core,
        input_key=EMBEDDING,
        output_key=CORE_OUTPUT,
        state_keys=["h", "c"] if lstm else None,
        recurrent_impl="episodes" if lstm else "segments",
    )
    return module, False


def build_agent(
    observation_shape: tuple[int, int, int],
    num_actions: int,
    model: str,
    core_config: object,
    agent_config: AgentConfig | None = None,
) -> Agent:
    """The agent for observations ``uint8 [H, W, C]`` and ``num_actions`` actions.

    Args:
        observation_shape: ``(H, W, C)`` (``BatchedEnv.observation_shape``).
        num_actions: the action count.
        model: a registered core (``list_models()``: ``'rmc'``, ``'lstm'``, ``'convlstm'``,
            ...).
        core_config: that core's config (``TrainConfig.rmc``, ``.lstm``, ``.convlstm``).
        agent_config: the encoder and heads (None: :class:`AgentConfig`'s defaults).

    Raises:
        ValueError: an unknown ``model`` (the message lists the registered ones) or a bad
            shape; TypeError: a config of another model.
    """
    check_choice("model", model, tuple(list_models()), owner="build_agent")
    dims = [as_int(d) for d in observation_shape] if len(observation_shape) == 3 else []
    if len(dims) != 3 or any(d is None or d < 1 for d in dims):
        raise ValueError(
            f"build_agent: observation_shape must be (H, W, C) of integers >= 1, got "
            f"{tuple(observation_shape)!r}"
        )
    num_actions = int(check_int("num_actions", num_actions, minimum=2, owner="build_agent"))
    config = AgentConfig() if agent_config is None else agent_config
    if not isinstance(config, AgentConfig):
        raise TypeError(
            f"build_agent: agent_config must be an AgentConfig or None, got {type(config).__name__}"
        )
    height, width, channels = dims
    core, rows = _build_core(model, core_config, (height, width), config.conv_channels[-1] + 2)
    cell_encoder = CellEncoder(
        channels,
        config.conv_channels,
        config.kernel_size,
        flatten=not rows,
        grid=(height, width),
    )
    encoder = TensorDictModule(cell_encoder, in_keys=[keys.OBSERVATION], out_keys=[EMBEDDING])
    core_size = core.core.output_size
    trunk = TensorDictModule(
        nn.Sequential(nn.Linear(core_size, config.hidden_size), nn.ReLU()),
        in_keys=[CORE_OUTPUT],
        out_keys=[HIDDEN],
    )
    policy_head = TensorDictModule(
        nn.Linear(config.hidden_size, num_actions), in_keys=[HIDDEN], out_keys=[keys.LOGITS]
    )
    value_head = TensorDictModule(
        nn.Linear(config.hidden_size, 1), in_keys=[HIDDEN], out_keys=[keys.STATE_VALUE]
    )
    return Agent(encoder, core, trunk, policy_head, value_head, num_actions)
