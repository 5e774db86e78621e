"""An RL task as the trainer sees it: a game, its environments and collector, and its metrics.

:class:`GameTask` plays the part a supervised :class:`~relmem.tasks.base.Task` plays for the
trainer: it names the primary metric and the extra ones (as :class:`~relmem.tasks.base.Measure`
sums and counts, reduced by the trainer's :class:`~relmem.train.evaluation.Totals`), owns the
data stream (here the TorchRL collector over the game's batched environments) and saves that
stream's position in ``train_state.pt`` through :meth:`state_dict`, as a stateful language
model saves its place in the corpus.

- **Environments**: ``make_env(game, B, seed, **options)`` (:mod:`relmem.rl.envs.torchrl_env`),
  with TorchRL's ``RewardSum`` and ``StepCounter`` appended (the episode's return and length,
  read at its last step) and the agent's ``TensorDictPrimer`` (its recurrent state).
- **Collection**: PPO uses one ``torchrl.collectors.Collector`` in this process (exactly
  resumable); IMPALA ``Collector(..., backend=..., num_collectors=k, sync=False)`` (one host's
  processes, or a Ray / torch.distributed cluster's workers).
- **Exact resume** (PPO): the environments' batched cores (``BatchedEnv.state_dict``: boards,
  counters, one numpy generator per instance; numpy arrays stored as tensors) and the
  collector's carried TensorDict (the last observation, ``is_init``, the running return and
  length, and the agent's recurrent state). Torch's global generator, which samples the
  actions, is the trainer's to save.
- **IMPALA's resume**: asynchronous collection cannot be replayed, so a checkpoint holds only
  how many resumes came before it; a resumed run's collector processes take level streams of
  their own (:meth:`GameTask.collector_seeds`) instead of replaying those the run began with.
- **Held-out levels**: training's evaluations play ``eval_episodes`` validation levels
  (``valid_seed``) and keep the weights that score best on them as ``checkpoints/best``
  (``keep_best``); ``relmem eval`` plays the test levels (``eval_seed``), which nothing in
  training has seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.collectors import Collector
from torchrl.envs import EnvBase, RewardSum, StepCounter, TransformedEnv

from relmem.rl import keys
from relmem.rl.config import LearnerConfig
from relmem.rl.evaluation import policy_device
from relmem.rl.learners import LOSS_TERMS, STATISTICS
from relmem.tasks.base import Measure, MetricSpec, derive_seed

SOLVED = MetricSpec("solved", True, "levels solved", "solved", percent=True)
RETURN = MetricSpec("return", True, "episode return", "ret")
LENGTH = MetricSpec("length", False, "episode length", "len")


def update_metrics(algorithm: str) -> tuple[MetricSpec, ...]:
    """The loss terms and statistics ``algorithm``'s update reports (``train/...`` only)."""
    names = (*LOSS_TERMS, *STATISTICS[algorithm])
    return tuple(MetricSpec(name, False, name.replace("_", " "), name) for name in names)


EPISODE_RETURN = "episode_reward"  # RewardSum's key
EPISODE_LENGTH = "step_count"  # StepCounter's key
STREAM_ENV = 11  # the training environments' seeds: derive_seed(seed, STREAM_ENV, worker)
# TorchRL's DistributedCollector launches its workers through submitit unless told otherwise:
# 'distributed' means this host's processes over torch.distributed ('submitit' a SLURM cluster's)
BACKEND_OPTIONS = {"distributed": {"launcher": "mp"}}
# TorchRL 0.14's Ray and distributed collectors stop at once on total_frames=-1 (the endless
# setting their docs give): they get a bound no run reaches, in whole batches
ENDLESS_BATCHES = 2**40

EnvFactory = Callable[..., TransformedEnv]
AgentFactory = Callable[..., nn.Module]


def training_env(
    make_env: EnvFactory,
    game: str,
    batch_size: int,
    seed: int,
    options: dict[str, Any],
    primer: Any,
) -> TransformedEnv:
    """``make_env``'s environment with the episode counters and the agent's primer appended
    (a module-level function: collector processes receive it pickled)."""
    env = make_env(game, batch_size, seed, **options)
    env.append_transform(RewardSum(in_keys=[keys.REWARD], out_keys=[EPISODE_RETURN]))
    env.append_transform(StepCounter())
    env.append_transform(primer)
    return env


def batched_core(env: EnvBase) -> Any:
    """The numpy :class:`~relmem.rl.envs.base.BatchedEnv` under a TorchRL environment."""
    return env.base_env.core


def to_tensors(value: Any) -> Any:
    """A ``BatchedEnv.state_dict`` with its numpy arrays as tensors (``weights_only`` loads)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {k: to_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_tensors(v) for v in value)
    return value


def to_arrays(value: Any) -> Any:
    """The inverse of :func:`to_tensors`."""
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {k: to_arrays(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_arrays(v) for v in value)
    return value


def episode_measures(batch: TensorDictBase, solvable: bool) -> dict[str, Measure]:
    """The episodes that ended in ``batch [B, T]``: their returns, lengths and, if
    ``solvable``, whether they were solved (terminated on a positive reward: the gem, not a
    distractor), one row per episode."""
    nxt = batch["next"]
    done = nxt[keys.DONE].squeeze(-1)  # [B, T]
    returns = nxt[EPISODE_RETURN].squeeze(-1)[done].double()
    lengths = nxt[EPISODE_LENGTH].squeeze(-1)[done].double()
    out = {RETURN.name: Measure.per_example(returns), LENGTH.name: Measure.per_example(lengths)}
    if solvable:
        won = nxt[keys.TERMINATED].squeeze(-1) & (nxt[keys.REWARD].squeeze(-1) > 0)
        out[SOLVED.name] = Measure.per_example(won[done].double())
    return out


class GameTask:
    """A game trained by reinforcement learning (``relmem train boxworld``).

    Args:
        game: ``'boxworld'`` or ``'minipacman'`` (what ``make_env`` builds), or a
            ``BatchedEnv`` subclass (a game of one's own, with its ``make_env``).
        config: the task's config (the game's options and the learner's settings).
        solvable: the game's episodes can be won (BoxWorld); the primary metric is then the
            solve rate, else the return.
        make_env: the environment factory (default
            :func:`relmem.rl.envs.torchrl_env.make_env`).
        build_agent: the agent factory (default :func:`relmem.rl.agent.build_agent`).
        evaluate: plays held-out episodes, ``evaluate(game, policy, *, episodes, seed,
            **options)`` (default :func:`relmem.rl.evaluation.evaluate`).

    Raises:
        ValueError / TypeError: a game option the game refuses (its message names it).
    """

    stateful = False
    keep_best = True
    group_name = "group"
    num_groups = 0

    def __init__(
        self,
        game: str | type,
        config: LearnerConfig,
        *,
        solvable: bool,
        make_env: EnvFactory | None = None,
        build_agent: AgentFactory | None = None,
        evaluate: Callable[..., Any] | None = None,
    ) -> None:
        if make_env is None:
            from relmem.rl.envs.torchrl_env import make_env
        self.game, self.config, self.solvable = game, config, solvable
        self.make_env, self.build_agent, self.play = make_env, build_agent, evaluate
        self.options = config.game_options()
        self.metric = SOLVED if solvable else RETURN
        self.update_metrics = update_metrics(config.algorithm)
        episodes = (RETURN, LENGTH) if solvable else (LENGTH,)
        self.extra_metrics = (*episodes, *self.update_metrics)
        probe = make_env(game, 1, 0, **self.options)  # the game checks its options here
        self.observation_shape = tuple(probe.observation_spec[keys.OBSERVATION].shape[-3:])
        self.num_actions = int(probe.action_spec.space.n)
        probe.close()
        self.collector: Any = None
        self._batches: Iterator[TensorDictBase] | None = None
        self._env: EnvBase | None = None
        self._impala: tuple[nn.Module, int, int] | None = None  # IMPALA's, until collection
        self.resumes = 0  # how many resumes led to this run segment (IMPALA's level streams)

    def data_identity(self) -> dict[str, Any]:
        """Nothing beyond the config, whose seeds generate every level
        (:meth:`relmem.tasks.base.Task.data_identity`)."""
        return {}

    def agent(self, model: str, core_config: Any) -> nn.Module:
        """A new agent with ``model``'s core (``rmc``, ``lstm``, ``convlstm``) and the task's
        ``agent`` settings (``--task.agent.*``)."""
        if self.build_agent is None:
            from relmem.rl.agent import build_agent

            self.build_agent = build_agent
        return self.build_agent(
            self.observation_shape, self.num_actions, model, core_config, self.config.agent
        )

    def env_factory(self, agent: nn.Module, batch_size: int, seed: int) -> Callable[[], EnvBase]:
        """A picklable function building ``batch_size`` training environments."""
        return functools.partial(
            training_env,
            self.make_env,
            self.game,
            batch_size,
            seed,
            self.options,
            agent.make_tensordict_primer(),
        )

    def start(self, agent: nn.Module, batch_size: int, seed: int) -> None:
        """Build the environments and the collector that feeds :meth:`collect` (``batch_size``
        environments per collector, ``unroll`` steps each per batch). IMPALA's collector
        processes start at the first :meth:`collect`, after a resume's :meth:`load_state_dict`
        has said which level streams they take."""
        c = self.config
        if c.algorithm == "ppo":
            frames = batch_size * c.unroll
            self._env = self.env_factory(agent, batch_size, derive_seed(seed, STREAM_ENV, 0))()
            device = policy_device(agent.policy)  # the games step on the CPU (TorchRL moves data)
            self.collector = Collector(
                self._env,
                agent.policy,
                frames_per_batch=frames,
                total_frames=-1,
                env_device=self._env.device,
                policy_device=device,
                storing_device=device,
            )
            self._batches = iter(self.collector)
        else:
            self._impala = (agent, batch_size, seed)

    def collector_seeds(self, seed: int) -> list[int]:
        """IMPALA's environment seeds, one per collector process: ``derive_seed(seed,
        STREAM_ENV, i)``, with the resume count appended after a resume so that resumed
        collectors play new levels rather than those the run began with."""
        resumed = (self.resumes,) if self.resumes else ()
        return [derive_seed(seed, STREAM_ENV, i, *resumed) for i in range(self.config.collectors)]

    def _start_collectors(self) -> None:
        """Start IMPALA's asynchronous collectors (``collectors`` of them, on ``backend``)."""
        c = self.config
        agent, batch_size, seed = self._impala
        frames = batch_size * c.unroll
        factories = [self.env_factory(agent, batch_size, s) for s in self.collector_seeds(seed)]
        cpu = torch.device("cpu")  # the actors act on the CPU, on copies of a GPU learner's policy
        self.collector = Collector(
            factories,
            agent.policy,
            backend=c.backend,
            backend_options=BACKEND_OPTIONS.get(c.backend),
            num_collectors=c.collectors,
            sync=False,
            frames_per_batch=frames,
            total_frames=-1 if c.backend == "process" else frames * ENDLESS_BATCHES,
            env_device=cpu,
            policy_device=cpu,
            storing_device=cpu,
        )
        self._batches = iter(self.collector)

    def collect(self) -> TensorDictBase:
        """The next collected batch, ``[B, T]``."""
        if self._batches is None:
            assert self._impala is not None, "GameTask.start() has not been called"
            self._start_collectors()
        return next(self._batches)

    def sync_weights(self) -> None:
        """Send the updated weights to collector processes (IMPALA; a no-op in-process)."""
        if self.config.algorithm != "ppo":
            self.collector.update_policy_weights_()

    def measures(self, batch: TensorDictBase) -> dict[str, Measure]:
        """:func:`episode_measures` of ``batch``."""
        return episode_measures(batch, self.solvable)

    def held_out(self, device: torch.device) -> Any:
        """The levels of training's evaluations: ``eval_episodes`` validation episodes from
        ``valid_seed``."""
        return HeldOutLevels(self.config.valid_seed, self.config.eval_episodes)

    def evaluate(
        self, agent: nn.Module | None, episodes: int | None = None, seed: int | None = None
    ) -> dict[str, float]:
        """Play held-out levels with ``agent``'s policy (None: a uniform random policy):
        ``solved`` and ``solved_se`` (a solvable game), ``return``, ``return_se``, ``length``.

        Args:
            agent: the agent, or None for a uniform random policy.
            episodes: episodes to play (None: ``eval_episodes``).
            seed: the levels' seed (None: the validation levels, ``valid_seed``; ``relmem
                eval`` passes the test levels' ``eval_seed``).
        """
        if self.play is None:
            from relmem.rl.evaluation import evaluate

            self.play = evaluate
        result = self.play(
            self.game,
            None if agent is None else agent.policy,
            episodes=episodes or self.config.eval_episodes,
            seed=self.config.valid_seed if seed is None else seed,
            **self.options,
        )
        figures = {
            "return": result.mean_return,
            "return_se": result.return_stderr,
            "length": result.mean_length,
        }
        if self.solvable:
            figures |= {"solved": result.solve_rate, "solved_se": result.solve_stderr}
        return figures

    def after_evaluation(self, metrics: dict[str, float]) -> dict[str, float]:
        return {}

    def plot_levels(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The collection's position. PPO: the environments' cores and the collector's
        carried TensorDict. IMPALA: only ``resumes``, how many resumes came before
        (asynchronous collection is not replayable; a resume starts new level streams)."""
        if self.config.algorithm != "ppo":
            return {"resumes": self.resumes}
        return {
            "env": to_tensors(batched_core(self._env).state_dict()),
            "carrier": self.collector._carrier.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (after :meth:`start`; IMPALA: before the first
        :meth:`collect`). An IMPALA checkpoint from before ``resumes`` existed (``{}``) counts
        as the run's first segment."""
        if self.config.algorithm != "ppo":
            self.resumes = int(state.get("resumes", 0)) + 1
            return
        if not state:
            return
        batched_core(self._env).load_state_dict(to_arrays(state["env"]))
        carrier = self.collector._carrier  # on the collector's device (the checkpoint's: CPU)
        saved = TensorDict(state["carrier"], batch_size=carrier.batch_size, device=carrier.device)
        carrier.update(saved)

    def close(self) -> None:
        """Stop the collector (and its processes)."""
        if self.collector is not None:
            self.collector.shutdown()
        self.collector, self._batches, self._env, self._impala = None, None, None, None


class HeldOutLevels:
    """The fixed held-out levels of an RL task: ``size`` episodes from ``seed``."""

    def __init__(self, seed: int, size: int) -> None:
        self.seed, self.size = seed, size
