"""The trainer of the RL tasks: the supervised :class:`~relmem.train.trainer.Trainer` with the
step that plugs in (collect a batch, update on it) and the RL metrics.

Everything else is the supervised trainer's, unchanged: the cadence of
:func:`relmem.train.loop.run` (logging, evaluation, checkpoints, signals, the time limit, the
progress bar), the run directory, its lock, ``metrics.jsonl`` / TensorBoard, atomic
checkpoints (weights, optimiser, schedule, torch's generator, the task's state: here the
environments' and collector's, :meth:`GameTask.state_dict <relmem.rl.game_task.GameTask.
state_dict>`), exact resumes and ``summary.json``.

Metrics (``train/...`` over the steps since the last log line, as sums and counts): ``solved``
(BoxWorld), ``return`` and ``length`` of the episodes that ended, the loss and its terms
(``loss_objective``, ``loss_critic``, ``loss_entropy``), the update's statistics (``entropy``,
``grad_norm``, PPO's ``kl``, ``clip_fraction`` and ``optimiser_steps``:
:data:`relmem.rl.learners.STATISTICS`), ``perf/frames_per_s``; at the evaluation cadence
``eval/solved``, ``eval/return``, ``eval/return_se``, ``eval/length`` on the task's fixed
validation levels, whose best weights are kept as ``checkpoints/best``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor, nn

from relmem.rl.learners import LOSS_TERMS, make_update
from relmem.rl.runs import agent_of
from relmem.tasks.base import Measure
from relmem.train.config import TrainConfig
from relmem.train.distributed import DistInfo
from relmem.train.runs import check_model_size
from relmem.train.trainer import StepOutcome, Trainer, TrainingDiverged


class RLTrainer(Trainer):
    """Trains the agent of a :class:`~relmem.rl.game_task.GameTask` (one process).

    ``config.batch_size`` is the number of environments per collector; each :meth:`step` is
    one collected batch of ``batch_size x unroll`` frames and its update.

    Raises:
        ValueError: run under ``torchrun`` (scale collection with ``--task.collectors`` or
            TorchRL's distributed collectors instead, ``docs/rl.md`` §4).
    """

    def __init__(
        self,
        config: TrainConfig,
        task_name: str,
        info: DistInfo,
        device: torch.device,
        argv: list[str] | None,
        max_parameters: int | None = None,
    ) -> None:
        if info.enabled:
            raise ValueError(
                f"{task_name} trains in one process; run it without torchrun and scale "
                "collection with --task.algorithm impala --task.collectors N (docs/rl.md §4, "
                "`relmem docs rl 4`)"
            )
        learner = config.task
        if learner.algorithm == "ppo" and learner.minibatches > config.batch_size:
            raise ValueError(
                f"--task.minibatches {learner.minibatches} splits --batch-size "
                f"{config.batch_size} whole trajectories: at most {config.batch_size} "
                "minibatches (a minibatch needs at least one whole trajectory)"
            )
        ignored = learner.ignored_options()
        if ignored:  # the cpu presets set PPO's: a warning, not a refusal
            print(
                f"relmem: warning: {', '.join(ignored)}: not read by "
                f"--task.algorithm {learner.algorithm}",
                file=sys.stderr,
                flush=True,
            )
        super().__init__(config, task_name, info, device, argv, max_parameters)

    def check_size(self, max_parameters: int) -> None:
        check_model_size(self.config, self.task, max_parameters, agent_of)

    def build_model(self) -> nn.Module:
        """The agent, its environments and collector, and its update."""
        config = self.config
        torch.manual_seed(config.seed)
        agent = self.prefer_fused(agent_of(config, self.task).to(self.device))
        self.task.start(agent, config.batch_size, config.seed)
        self.update = make_update(agent, self.task.config)
        return agent

    def _apply(self, loss: Tensor) -> Tensor:
        if not torch.isfinite(loss.detach()):
            raise TrainingDiverged(f"the loss is {loss.item()} at step {self.progress.step + 1}")
        return self.apply_gradients(loss)

    def step(self, signum: int, time_up: bool) -> StepOutcome:
        """Collect one batch and update on it.

        Raises:
            TrainingDiverged: a loss is not finite (that update is not applied).
        """
        batch = self.task.collect().to(self.device)
        terms = self.update(batch, self._apply)
        self.task.sync_weights()
        self.scheduler.step()
        one = torch.ones(1, dtype=torch.float64)
        measures = {
            "loss": Measure(one * sum(terms[name] for name in LOSS_TERMS), one),
            **{name: Measure(one * value, one) for name, value in terms.items()},
            **self.task.measures(batch.cpu()),
        }
        self.window.add(
            {k: Measure(t.to(self.device), c.to(self.device)) for k, (t, c) in measures.items()},
            None,
        )
        self.progress.step += 1
        self.window_steps += 1
        self.window_tokens += batch.numel()
        return StepOutcome(signum, time_up)

    def train_metrics(self, close: bool = True) -> dict[str, float]:
        metrics = super().train_metrics(close)
        metrics["perf/frames_per_s"] = metrics.pop("perf/tokens_per_s")
        return metrics

    def evaluate(self, on_grid: bool = True) -> dict[str, float]:
        """The agent on the task's validation levels (torch's generator is left as it was, so
        an evaluation changes nothing in the training that follows); the weights go to
        ``checkpoints/best`` when they beat every earlier evaluation on the ``eval_every`` grid
        (``on_grid=False``, a run's stop between evaluations, keeps nothing: a resume past it
        must keep what the uninterrupted run keeps)."""
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[]):
            result = self.task.evaluate(self.model)
        self.model.train(was_training)
        if on_grid:
            self.keep_if_best(result[self.metric.name])
        return {f"eval/{name}": value for name, value in result.items()}

    def summary(
        self, status: str, last_eval: dict[str, float] | None, eval_step: int
    ) -> dict[str, Any]:
        updates = self.task.update_metrics  # training-only: evaluations have none
        blanks = {f"eval/{x.name}": None for x in updates}
        filled = None if last_eval is None else blanks | last_eval
        summary = super().summary(status, filled, eval_step)
        for name in ("held_out_loss", *(f"held_out_{x.name}" for x in updates)):
            summary.pop(name, None)
        summary["frames_seen"] = summary["sequences_seen"] * self.task.config.unroll
        if last_eval is not None:
            summary.update({f"held_out_{k[5:]}": v for k, v in last_eval.items()})
        return summary

    def release(self) -> None:
        """Stop the collector, then release the run directory."""
        self.task.close()
        super().release()
