"""The RL updates that plug into the trainer's step: PPO and IMPALA-style V-trace.

Both are TorchRL's losses and value estimators, run in recurrent mode
(``torchrl.modules.set_recurrent_mode(True)``): the agent's cores read the whole ``[B, T]``
batch, start from the recurrent state stored at ``t = 0`` and reset rows at every ``is_init``.

The value estimators are given their values, not the value network: :func:`write_values`
computes ``state_value`` and the bootstrap values ``("next", "state_value")``, each from the
recurrent state the agent really had (TorchRL's own second pass over ``td["next"]`` runs the
core over the next observations as one sequence, which is not the agent's trajectory across an
episode's end, and reads the per-step states a sequence call does not keep).

- :class:`PPOUpdate`: ``GAE`` advantages on the collected batch,
  then ``epochs`` passes of ``ClipPPOLoss`` over ``minibatches`` groups of whole trajectories,
  cut short by ``target_kl`` when the policy has moved too far from the collecting one.
- :class:`VTraceUpdate`: V-trace targets (rho-bar = c-bar = 1, TorchRL's
  ``vtrace_advantage_estimate`` with the importance weights of the actions taken,
  :func:`write_vtrace_targets`) and one ``A2CLoss`` step, as TorchRL's
  ``sota-implementations/impala`` does.

PPO's critic is ``agent.loss_critic``, the value head on the hidden layer of the policy's own
pass (:class:`~relmem.rl.agent.ValueOfPolicyPass`): one pass of the encoder and the core per
loss evaluation. The collected batch's copies of the policy's intermediate entries are dropped
before the loss, so that the critic can only read the fresh ones. ``A2CLoss`` runs its actor on
a copy of its input, so V-trace's critic is the whole value network.

Each update calls ``apply(loss)`` (the trainer's :meth:`~relmem.train.trainer.Trainer.
apply_gradients`, which also refuses a non-finite loss and returns the gradients' norm before
clipping) once per optimiser step and returns each loss term (:data:`LOSS_TERMS`) and the
update's statistics (:data:`STATISTICS`): the means over its optimiser steps of the loss terms,
the policy's entropy, the gradient norm and PPO's share of clipped ratios; for PPO also how far
the update moved the policy from the collecting one (the KL, :func:`kl_estimate`) and the
optimiser steps it took. An update that moves the policy too far shows there first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import A2CLoss, ClipPPOLoss
from torchrl.objectives.value import GAE
from torchrl.objectives.value.functional import vtrace_advantage_estimate

from relmem.rl import keys
from relmem.rl.agent import INTERMEDIATE_KEYS
from relmem.rl.config import LearnerConfig

Apply = Callable[[Tensor], Tensor]  # one optimiser step on a loss; the gradient norm
LOSS_TERMS = ("loss_objective", "loss_critic", "loss_entropy")
GRAD_NORM = "grad_norm"
KL = "kl"
OPTIMISER_STEPS = "optimiser_steps"
# what each algorithm's update reports beside its loss terms: means over its optimiser steps
# of the policy's entropy, the gradients' global L2 norm before clipping (GRAD_NORM) and, for
# PPO, the share of clipped ratios (PER_STEP); then, once per PPO update, the KL, the policy's
# divergence from the collecting one at the last minibatch the update evaluated (kl_estimate:
# before its last step, or at the minibatch that ended it early), and OPTIMISER_STEPS, the
# count of steps it took
PER_STEP = {"ppo": ("entropy", "clip_fraction", GRAD_NORM), "impala": ("entropy", GRAD_NORM)}
STATISTICS = {"ppo": (*PER_STEP["ppo"], KL, OPTIMISER_STEPS), "impala": PER_STEP["impala"]}


def write_values(agent: nn.Module, batch: TensorDictBase) -> None:
    """Write ``state_value`` and ``("next", "state_value")`` (``[B, T, 1]``) into ``batch``.

    ``state_value[:, t]`` comes from one recurrent-mode pass of ``agent.value`` over ``batch``
    (from the state stored at ``t = 0``, reset at every ``is_init``). The bootstrap value of
    step ``t`` is ``state_value[:, t + 1]`` inside an episode; where step ``t`` ends the
    episode or the batch (``("next", "done")``, ``t = T - 1``) it is the value of
    ``("next", "observation")[:, t]`` read from the state after step ``t`` (the last step of
    one of the recurrent pass's segments, where its per-step state is exact,
    :class:`~relmem.rl.modules.RecurrentCoreModule`). A terminated step's bootstrap value is
    computed too, and the estimators ignore it.

    Args:
        agent: has ``value`` and ``state_keys``.
        batch: collected ``[B, T]``; updated in place.
    """
    with set_recurrent_mode(True):
        current = agent.value(batch.select(*agent.value.in_keys))
    value = current.get(keys.STATE_VALUE)  # [B, T, 1]
    after = batch.get("next").select(keys.OBSERVATION)
    for key in agent.state_keys:
        after.set(key, current.get(("next", key)))
    after.set(keys.IS_INIT, torch.zeros_like(batch.get(keys.IS_INIT)))
    with set_recurrent_mode(False):
        bootstrap = agent.value(after).get(keys.STATE_VALUE)  # [B, T, 1]
    ends = batch.get(("next", keys.DONE)).clone()
    ends[:, -1] = True
    following = torch.cat([value[:, 1:], value[:, -1:]], dim=1)
    batch.set(keys.STATE_VALUE, value)
    batch.set(("next", keys.STATE_VALUE), torch.where(ends, bootstrap, following))


def total_loss(terms: TensorDictBase) -> Tensor:
    """The sum of a TorchRL loss module's ``loss_*`` outputs."""
    return sum(terms[name] for name in LOSS_TERMS)


def kl_estimate(terms: TensorDictBase) -> Tensor:
    """``[]``: KL(collecting policy ‖ updated policy) over a ``ClipPPOLoss`` call's samples.

    The estimator ``mean(r - 1 - log r)`` with ``r = π_new(a|s) / π_old(a|s)`` (Schulman's
    "k3": unbiased, never negative, of low variance), from the loss's own outputs:
    ``mean_ratio`` is ``mean(r)`` and ``kl_approx`` is ``mean(-log r)``, the plain estimator,
    which can be negative. Stable-Baselines3's ``target_kl`` reads the same estimator. The
    difference of two float32 means is clamped at 0 (its rounding is about 1e-8).
    """
    return (terms["mean_ratio"] - 1 + terms["kl_approx"]).detach().clamp_min(0)


class Means:
    """Running means of an update's loss terms and :data:`PER_STEP` statistics over its
    optimiser steps.

    Args:
        algorithm: 'ppo' or 'impala'.
    """

    def __init__(self, algorithm: str) -> None:
        self.sums = dict.fromkeys((*LOSS_TERMS, *PER_STEP[algorithm]), 0.0)
        self.count = 0

    def add(self, terms: TensorDictBase, grad_norm: Tensor) -> None:
        """One optimiser step's loss module outputs and gradient norm."""
        for name in self.sums:
            value = grad_norm if name == GRAD_NORM else terms[name]
            self.sums[name] += float(value.detach())
        self.count += 1

    def means(self) -> dict[str, float]:
        """Each name's mean over the steps added."""
        return {name: total / self.count for name, total in self.sums.items()}


class PPOUpdate:
    """Clipped PPO on whole rollouts, ended early by ``config.target_kl`` when set.

    Args:
        agent: has ``policy`` (a ``ProbabilisticActor``) and ``value``.
        config: the learner's settings.
    """

    def __init__(self, agent: nn.Module, config: LearnerConfig) -> None:
        self.config = config
        self.loss = ClipPPOLoss(
            agent.policy,
            agent.loss_critic,
            clip_epsilon=config.clip_epsilon,
            entropy_coeff=config.entropy_coeff,
            critic_coeff=config.critic_coeff,
            loss_critic_type="l2",
            normalize_advantage=config.normalize_advantage,
        )
        self.agent = agent
        self.advantage = GAE(gamma=config.gamma, lmbda=config.lmbda, value_network=None)

    def __call__(self, batch: TensorDictBase, apply: Apply) -> dict[str, float]:
        """Update on ``batch [B, T]``; the mean loss terms and statistics."""
        c = self.config
        means = Means("ppo")
        kl = 0.0
        kl_limit = math.inf if c.target_kl is None else 1.5 * c.target_kl
        with set_recurrent_mode(True):
            with torch.no_grad():
                write_values(self.agent, batch)
                self.advantage(batch)
            fresh = batch.exclude(*INTERMEDIATE_KEYS)
            # exactly `minibatches` groups of whole trajectories, their sizes differing by at
            # most one (chunk() made fewer when the batch does not divide: 6 into 3, not 4)
            size, extra = divmod(fresh.shape[0], c.minibatches)
            parts = fresh.split([size + 1] * extra + [size] * (c.minibatches - extra), dim=0)
            for part in (part for _ in range(c.epochs) for part in parts):
                terms = self.loss(part)
                kl = float(kl_estimate(terms))
                if means.count and kl > kl_limit:
                    break
                means.add(terms, apply(total_loss(terms)))
        return means.means() | {KL: kl, OPTIMISER_STEPS: float(means.count)}


class VTraceUpdate:
    """IMPALA's actor-critic update with V-trace targets.

    Args:
        agent: has ``policy`` (a ``ProbabilisticActor``) and ``value``.
        config: the learner's settings (``gamma``, ``entropy_coeff``, ``critic_coeff``).
    """

    def __init__(self, agent: nn.Module, config: LearnerConfig) -> None:
        # A2CLoss runs its actor on a copy of the data, so its critic needs the whole value
        # network (a second pass of the encoder and the core)
        self.loss = A2CLoss(
            agent.policy,
            agent.value,
            entropy_coeff=config.entropy_coeff,
            critic_coeff=config.critic_coeff,
            loss_critic_type="l2",
        )
        self.agent = agent
        self.gamma = config.gamma

    def __call__(self, batch: TensorDictBase, apply: Apply) -> dict[str, float]:
        """One update on ``batch [B, T]``; its loss terms and statistics."""
        means = Means("impala")
        with set_recurrent_mode(True):
            with torch.no_grad():
                write_vtrace_targets(self.agent, batch, self.gamma)
            terms = self.loss(batch)
            means.add(terms, apply(total_loss(terms)))
        return means.means()


def write_vtrace_targets(agent: nn.Module, batch: TensorDictBase, gamma: float) -> None:
    """Write V-trace's ``advantage`` and ``value_target`` (``[B, T, 1]``, rho-bar = c-bar = 1)
    into ``batch``, with :func:`write_values`' values.

    The importance weights are ``π(a_t | x_t) / μ(a_t | x_t)`` of the actions taken:
    ``log μ`` is the collected ``action_log_prob``, ``log π`` the current policy's recurrent
    pass over the batch. (TorchRL 0.14's ``VTrace`` module scores a freshly sampled action
    under a policy whose interaction type is random, the ProbabilisticActor's default, so that
    its weights were not 1 even on policy.)

    Args:
        agent: has ``policy`` (a ``ProbabilisticActor``), ``value`` and ``state_keys``.
        batch: collected ``[B, T]``; updated in place.
        gamma: the discount.
    """
    write_values(agent, batch)
    value = batch.get(keys.STATE_VALUE)  # [B, T, 1]
    with set_recurrent_mode(True):
        dist = agent.policy.get_dist(batch.exclude(*INTERMEDIATE_KEYS))
    log_pi = dist.log_prob(batch.get(keys.ACTION)).view_as(value)
    log_mu = batch.get(keys.ACTION_LOG_PROB).view_as(value)
    advantage, target = vtrace_advantage_estimate(
        gamma,
        log_pi,
        log_mu,
        value,
        batch.get(("next", keys.STATE_VALUE)),
        batch.get(("next", keys.REWARD)),
        batch.get(("next", keys.DONE)),
        batch.get(("next", keys.TERMINATED)),
        rho_thresh=1.0,
        c_thresh=1.0,
        time_dim=-2,
    )
    batch.set("advantage", advantage)
    batch.set("value_target", target)


def make_update(agent: nn.Module, config: LearnerConfig) -> PPOUpdate | VTraceUpdate:
    """The update ``config.algorithm`` names."""
    return PPOUpdate(agent, config) if config.algorithm == "ppo" else VTraceUpdate(agent, config)
