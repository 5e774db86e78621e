"""The RL updates that plug into the trainer's step: PPO and IMPALA-style V-trace.

Both are TorchRL's losses and value estimators, run in recurrent mode
(``torchrl.modules.set_recurrent_mode(True)``): the agent's cores read the whole ``[B, T]``
batch, start from the recurrent state stored at ``t = 0`` and reset rows at every ``is_init``.

- :class:`PPOUpdate`: ``GAE(..., deactivate_vmap=True)`` advantages on the collected batch,
  then ``epochs`` passes of ``ClipPPOLoss`` over ``minibatches`` groups of whole trajectories.
- :class:`VTraceUpdate`: ``VTrace`` targets (rho-bar = c-bar = 1) and one ``A2CLoss`` step,
  as TorchRL's ``sota-implementations/impala`` does.

Each update calls ``apply(loss)`` (the trainer's :meth:`~relmem.train.trainer.Trainer.
apply_gradients`, which also refuses a non-finite loss) once per optimiser step and returns
the mean of each loss term over its optimiser steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import A2CLoss, ClipPPOLoss
from torchrl.objectives.value import GAE, VTrace

from relmem.rl.config import LearnerConfig

Apply = Callable[[Tensor], None]
LOSS_TERMS = ("loss_objective", "loss_critic", "loss_entropy")


def total_loss(terms: TensorDictBase) -> Tensor:
    """The sum of a TorchRL loss module's ``loss_*`` outputs."""
    return sum(terms[name] for name in LOSS_TERMS)


class PPOUpdate:
    """Clipped PPO on whole rollouts.

    Args:
        agent: has ``policy`` (a ``ProbabilisticActor``) and ``value``.
        config: the learner's settings.
    """

    def __init__(self, agent: nn.Module, config: LearnerConfig) -> None:
        self.config = config
        self.loss = ClipPPOLoss(
            agent.policy,
            agent.value,
            clip_epsilon=config.clip_epsilon,
            entropy_coeff=config.entropy_coeff,
            critic_coeff=config.critic_coeff,
            loss_critic_type="l2",
            normalize_advantage=config.normalize_advantage,
        )
        self.advantage = GAE(
            gamma=config.gamma,
            lmbda=config.lmbda,
            value_network=agent.value,
            deactivate_vmap=True,
        )

    def __call__(self, batch: TensorDictBase, apply: Apply) -> dict[str, float]:
        """Update on ``batch [B, T]``; the mean loss terms."""
        c = self.config
        sums = dict.fromkeys(LOSS_TERMS, 0.0)
        updates = 0
        with set_recurrent_mode(True):
            with torch.no_grad():
                self.advantage(batch)
            for _ in range(c.epochs):
                for part in batch.chunk(c.minibatches, dim=0):
                    terms = self.loss(part)
                    apply(total_loss(terms))
                    for name in LOSS_TERMS:
                        sums[name] += float(terms[name].detach())
                    updates += 1
        return {name: value / updates for name, value in sums.items()}


class VTraceUpdate:
    """IMPALA's actor-critic update with V-trace targets.

    Args:
        agent: has ``policy`` (a ``ProbabilisticActor``) and ``value``.
        config: the learner's settings (``gamma``, ``entropy_coeff``, ``critic_coeff``).
    """

    def __init__(self, agent: nn.Module, config: LearnerConfig) -> None:
        self.loss = A2CLoss(
            agent.policy,
            agent.value,
            entropy_coeff=config.entropy_coeff,
            critic_coeff=config.critic_coeff,
            loss_critic_type="l2",
        )
        self.advantage = VTrace(
            gamma=config.gamma,
            actor_network=agent.policy,
            value_network=agent.value,
            rho_thresh=1.0,
            c_thresh=1.0,
        )
        # VTrace's constructor has no deactivate_vmap argument; the value estimators' base
        # class reads this attribute (a recurrent core's per-trajectory reset cannot be vmapped)
        self.advantage.deactivate_vmap = True

    def __call__(self, batch: TensorDictBase, apply: Apply) -> dict[str, float]:
        """One update on ``batch [B, T]``; its loss terms."""
        with set_recurrent_mode(True):
            with torch.no_grad():
                self.advantage(batch)
            terms = self.loss(batch)
            apply(total_loss(terms))
        return {name: float(terms[name].detach()) for name in LOSS_TERMS}


def make_update(agent: nn.Module, config: LearnerConfig) -> PPOUpdate | VTraceUpdate:
    """The update ``config.algorithm`` names."""
    return PPOUpdate(agent, config) if config.algorithm == "ppo" else VTraceUpdate(agent, config)
