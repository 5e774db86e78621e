"""The ``--task.*`` options of the reinforcement-learning tasks (``docs/rl.md`` §4).

An RL task's config is its game's parameters (named as the game names them) plus the learner's
settings (:class:`LearnerConfig`), in one flat dataclass so that the command line reads
``relmem train boxworld --task.grid-size 6 --task.algorithm ppo --task.unroll 20``. The
trainer's own settings keep their meaning: ``--batch-size`` is the number of environments
stepped together (trajectories per training step), ``--steps`` the number of training steps
(each one collected batch of ``batch_size x unroll`` frames and its update), ``--seed`` seeds
the weights, the environments and the action sampling.

Nothing here imports TorchRL: the task registry reads these classes whenever ``relmem`` lists
tasks, and the library stays light until an RL run starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from relmem.validation import as_int, check_at_least, check_choice, check_int, check_positive

ALGORITHMS = ("ppo", "impala")
BACKENDS = ("process", "ray", "distributed", "submitit")


@dataclass
class AgentConfig:
    """The agent's parts around the core (``docs/rl.md`` §3; library defaults), the
    ``--task.agent.*`` options.

    Attributes:
        conv_channels: the encoder's convolutions (paper two: 12, 24).
        kernel_size: their square kernel (paper 2).
        hidden_size: the policy and value heads' shared hidden layer (256).
    """

    conv_channels: tuple[int, ...] = (12, 24)
    kernel_size: int = 2
    hidden_size: int = 256

    def __post_init__(self) -> None:
        widths = self.conv_channels
        if (
            isinstance(widths, (int, str))
            or not widths
            or any(as_int(c) is None or c < 1 for c in widths)
        ):
            raise ValueError(
                f"task.agent.conv_channels must be one or more integers >= 1, got {widths!r}"
            )
        self.conv_channels = tuple(int(c) for c in widths)
        self.kernel_size = int(check_int("task.agent.kernel_size", self.kernel_size))
        self.hidden_size = int(check_int("task.agent.hidden_size", self.hidden_size))


# The learner options each algorithm leaves unread (backend is refused under PPO instead).
IMPALA_IGNORES = ("lmbda", "clip_epsilon", "epochs", "minibatches", "normalize_advantage")
IMPALA_IGNORES += ("target_kl",)
PPO_IGNORES = ("collectors",)


@dataclass
class LearnerConfig:
    """How an RL task learns (the update that plugs into the trainer's step).

    Attributes:
        agent: the encoder and the heads around the core (:class:`AgentConfig`; the core's
            own sizes are ``--rmc.*``, ``--lstm.*``, ``--convlstm.*``).
        algorithm: 'ppo' (TorchRL ``ClipPPOLoss`` with ``GAE`` on whole rollouts, one process;
            for small runs) or 'impala' (V-trace targets with the taken actions' importance
            weights and ``A2CLoss``, on batches from an asynchronous multi-process collector;
            the paper's setting).
        unroll: T, environment steps per trajectory in a batch (IMPALA: 40).
        gamma: the discount (0.99).
        lmbda: GAE's lambda (PPO only).
        entropy_coeff: weight of the entropy bonus (IMPALA: 0.005).
        critic_coeff: weight of the value loss (IMPALA: 0.5).
        clip_epsilon: PPO's ratio clip.
        epochs: PPO's passes over each collected batch.
        minibatches: PPO's minibatches per pass; trajectories are split whole (the time axis
            is never shuffled: the recurrent core replays each trajectory from its stored
            state).
        normalize_advantage: PPO's per-minibatch advantage normalisation.
        target_kl: PPO's early stop (Stable-Baselines3's rule): a batch's update ends, its
            remaining minibatches and epochs skipped, at the first minibatch whose approximate
            KL divergence from the collecting policy exceeds ``1.5 * target_kl`` (that
            minibatch is not applied; the first optimiser step always is). None: every epoch
            runs.
        collectors: IMPALA's collector processes, each stepping ``batch_size`` environments;
            every training step takes the batch of whichever process finished first.
        backend: where IMPALA's collectors run, TorchRL's collector backend: 'process' (this
            host), 'ray' (a Ray cluster's nodes), 'distributed' (torch.distributed workers that
            TorchRL starts as processes of this host) or 'submitit' (torch.distributed workers
            on a SLURM cluster's nodes); ``docs/rl.md`` §4.6.
        eval_episodes: validation episodes played at each of training's evaluations (a fixed
            seeded set of levels, the same at every evaluation).
        valid_seed: the seed of the validation levels: training's evaluations play them, and
            the weights that score best on them are kept as ``checkpoints/best``.
        eval_seed: the seed of the test levels that ``relmem eval`` and ``relmem play`` play
            (1000 episodes by default). Both level sets are disjoint from training's (the
            training environments are seeded from ``--seed`` through another stream) and from
            each other, so that picking the best checkpoint never looks at the test levels.
    """

    agent: AgentConfig = field(default_factory=AgentConfig)
    algorithm: Literal["ppo", "impala"] = "ppo"
    unroll: int = 20
    gamma: float = 0.99
    lmbda: float = 0.95
    entropy_coeff: float = 0.01
    critic_coeff: float = 0.5
    clip_epsilon: float = 0.2
    epochs: int = 4
    minibatches: int = 1
    normalize_advantage: bool = False
    target_kl: float | None = None
    collectors: int = 2
    backend: Literal["process", "ray", "distributed", "submitit"] = "process"
    eval_episodes: int = 200
    valid_seed: int = 10_000_000
    eval_seed: int = 20_000_000

    def check_learner(self) -> None:
        """Validate the learner's settings (each error names ``task.<option>``)."""
        check_choice("task.algorithm", self.algorithm, ALGORITHMS)
        check_choice("task.backend", self.backend, BACKENDS)
        if self.algorithm == "ppo" and self.backend != "process":
            raise ValueError(
                f"task.backend={self.backend!r} places IMPALA's collectors, and PPO collects in "
                "this process; add --task.algorithm impala, or drop --task.backend"
            )
        check_at_least("task.", self, unroll=1, epochs=1, minibatches=1, collectors=1)
        check_at_least("task.", self, eval_episodes=1, valid_seed=0, eval_seed=0)
        if self.valid_seed == self.eval_seed:
            raise ValueError(
                f"task.valid_seed and task.eval_seed are both {self.eval_seed}: the validation "
                "levels that pick checkpoints/best would be the test levels; give them "
                "different seeds"
            )
        check_at_least("task.", self, entropy_coeff=0.0, critic_coeff=0.0)
        check_positive("task.", self, "clip_epsilon", "target_kl")
        for name in ("gamma", "lmbda"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"task.{name} must lie in [0, 1], got {value}")

    def ignored_options(self) -> list[str]:
        """The options set away from their defaults that ``algorithm`` does not read, as
        ``--task.name value`` (PPO's under IMPALA; IMPALA's collectors under PPO)."""
        unread = IMPALA_IGNORES if self.algorithm == "impala" else PPO_IGNORES
        defaults = LearnerConfig.__dataclass_fields__
        return [
            f"--task.{name.replace('_', '-')} {getattr(self, name)}"
            for name in unread
            if getattr(self, name) != defaults[name].default
        ]

    def game_options(self) -> dict[str, Any]:
        """The game's constructor arguments (the fields this class does not define)."""
        learner = set(LearnerConfig.__dataclass_fields__)
        return {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name not in learner
        }


@dataclass
class BoxWorldConfig(LearnerConfig):
    """``relmem train boxworld``: BoxWorld's parameters (``docs/rl.md`` §1) and the learner's.

    Attributes:
        grid_size: n, the interior's side (the map is (n+2) x (n+2)).
        solution_length: L, boxes on the path to the gem; an int or the values to draw from.
        num_forward: distractor branches; an int or the values to draw from.
        num_backward: backward distractors; an int or the values to draw from.
        branch_length: boxes per distractor branch.
        max_steps: the episode's step limit (truncation).
        observation: 'full' (the whole map) or 'viewport' (5x5 around the agent and the held
            key's colour).
    """

    grid_size: int = 12
    solution_length: int | tuple[int, ...] = (1, 2, 3, 4)
    num_forward: int | tuple[int, ...] = (0, 1, 2, 3, 4)
    num_backward: int | tuple[int, ...] = 0
    branch_length: int = 1
    max_steps: int = 120
    observation: Literal["full", "viewport"] = "full"

    def __post_init__(self) -> None:
        self.check_learner()
        check_choice("task.observation", self.observation, ("full", "viewport"))


@dataclass
class MiniPacmanConfig(LearnerConfig):
    """``relmem train minipacman``: Mini PacMan's parameters (``docs/rl.md`` §2) and the
    learner's.

    Attributes:
        task: 'regular', 'avoid', 'hunt', 'ambush' or 'rush' (the reward scheme).
        observation: 'full' (the 15 x 19 maze) or 'viewport' (5x5 around PacMan).
    """

    task: Literal["regular", "avoid", "hunt", "ambush", "rush"] = "regular"
    observation: Literal["full", "viewport"] = "full"

    def __post_init__(self) -> None:
        self.check_learner()
        check_choice("task.task", self.task, ("regular", "avoid", "hunt", "ambush", "rush"))
        check_choice("task.observation", self.observation, ("full", "viewport"))
