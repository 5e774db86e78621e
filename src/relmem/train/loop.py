"""``run(config, task_name)``: the loop behind ``relmem train TASK``, its cadence and its end.

:class:`~relmem.train.trainer.Trainer` does the set-up and each step; this module decides when
to log (``log_every``), evaluate (``eval_every``), checkpoint (``checkpoint_every``) and stop,
and writes the summary:

- metrics go to ``metrics.jsonl`` (and TensorBoard): ``train/loss``, ``train/{metric}``,
  ``train/lr``, ``perf/sequences_per_s``, ``eval/{metric}``, ``eval/loss``,
  ``eval/batch_{metric}`` and ``eval/best_batch_{metric}`` (a task with fresh batches),
  ``eval/{metric}_group_{g}``,
  ``time_s``; a time limit that stops the run off the ``eval_every`` grid logs one more
  evaluation, marked ``stop``, which a resume replaces by the uninterrupted run's records;
- checkpoints are atomic (:mod:`relmem.train.checkpoint`); a resumed CPU run ends bit-identical
  to an uninterrupted one;
- SIGINT, SIGTERM and SIGHUP (a closed terminal) finish the current step, checkpoint and exit
  with 128 + the signal's number; a non-finite loss stops the run
  before the update, keeps the last good checkpoint and exits with :data:`EXIT_DIVERGED`.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from relmem.tasks.base import MetricSpec
from relmem.tasks.registry import get_task
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import TrainConfig
from relmem.train.distributed import barrier, init_distributed, shutdown_distributed
from relmem.train.metrics import STOP_KEY
from relmem.train.trainer import Trainer, TrainingDiverged

EXIT_OK = 0
EXIT_DIVERGED = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGHUP = 129
# The signals that stop a run cleanly (SIGHUP where the platform has it), and their statuses.
STOP_SIGNALS = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}
if hasattr(signal, "SIGHUP"):
    STOP_SIGNALS[signal.SIGHUP] = EXIT_SIGHUP


@dataclass
class RunResult:
    """What :func:`run` returns.

    Attributes:
        run_dir: the run directory.
        status: 'completed', 'time_limit', 'interrupted' or 'diverged'.
        exit_code: the process exit status the CLI should return.
        summary: the contents of ``summary.json``.
    """

    run_dir: Path
    status: str
    exit_code: int
    summary: dict[str, Any]


class _StopFlag:
    """:data:`STOP_SIGNALS` set a flag; the loop checkpoints and exits at the end of the
    step."""

    def __init__(self) -> None:
        self.signum: int = 0
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up on the clean exit
        self.signum = signum
        again = " (Ctrl-C again to abort)" if signum == signal.SIGINT else ""
        print(
            f"\nrelmem: received {signal.Signals(signum).name}; finishing this step and "
            f"saving a checkpoint{again}",
            file=sys.stderr,
            flush=True,
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopFlag]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        try:
            yield self
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)


def run(
    config: TrainConfig,
    task_name: str,
    *,
    argv: list[str] | None = None,
    max_parameters: int | None = None,
) -> RunResult:
    """Train ``config.model`` on the task ``task_name`` as configured.

    Args:
        config: the resolved configuration.
        task_name: a registered task (``relmem.tasks.list_tasks()``).
        argv: the command line to record in ``run.json`` (default ``sys.argv``).
        max_parameters: refuse a model larger than this before anything is built or written
            (``relmem train --max-parameters``; None: no bound).

    Returns:
        :class:`RunResult`; the CLI returns its ``exit_code``.

    Raises:
        ValueError: a setting does not fit the machine (bf16 off CUDA, indivisible batch), or
            the model is over ``max_parameters``.
        CheckpointError: ``config.resume`` names a damaged or missing checkpoint.
    """
    info, device = init_distributed(config.device)
    trainer = None
    try:
        trainer_class = get_task(task_name).trainer or Trainer
        trainer = trainer_class(config, task_name, info, device, argv, max_parameters)
        result = _train(trainer)
        # Every rank finishes before any tears down its connections. Once, under a loaded CI
        # run, rank 1 aborted ("terminate called without an active exception") destroying its
        # gloo group while rank 0 was still writing the summary.
        barrier(info)
        return result
    finally:
        if trainer is not None:
            trainer.release()
        # The DDP wrapper's reducer holds the process group: free it first, so that
        # destroy_process_group joins gloo's threads now and not during interpreter exit, where
        # a group still alive can abort the process after a finished run.
        trainer = None
        if info.enabled:
            gc.collect()
        shutdown_distributed()


def _train(trainer: Trainer) -> RunResult:
    """Step until done, stopped or diverged, with the configured cadence; then summarise."""
    config, progress = trainer.config, trainer.progress
    bar = tqdm(
        total=config.steps,
        initial=progress.step,
        disable=None if trainer.info.is_main else True,
        dynamic_ncols=True,
        unit="step",
    )
    status, exit_code = "completed", EXIT_OK
    governor = trainer.thread_governor
    last_eval, last_eval_step = None, progress.step
    stop = _StopFlag()
    progress.start()
    trainer.wrapped.train()
    try:
        with stop.installed():
            while progress.step < config.steps:
                time_up = (
                    config.time_limit_min is not None
                    and progress.session() > 60 * config.time_limit_min
                )
                if governor is not None:
                    governor.before_step()
                started = time.perf_counter()
                outcome = trainer.step(stop.signum, time_up)
                if governor is not None:
                    governor.after_step(time.perf_counter() - started)
                bar.update(1)
                step, done = progress.step, progress.step >= config.steps
                # The record an uninterrupted run writes here: its log and eval grids only.
                log_grid, eval_grid = step % config.log_every == 0, step % config.eval_every == 0
                metrics: dict[str, float] = {}
                if log_grid:
                    metrics.update(trainer.train_metrics())
                if eval_grid:
                    last_eval, last_eval_step = trainer.evaluate(), step
                    metrics.update(last_eval)
                # A run that ends here (its last step, or a time limit) off a grid also logs
                # what it has: the training window so far, without closing it, and an
                # evaluation that feeds neither the curriculum, the schedule nor the best copy.
                # That record is marked, and a resume past here cuts it (metrics.STOP_KEY), so
                # that the resumed run's records and weights are the uninterrupted run's.
                final: dict[str, float] = {}
                if (done or outcome.time_up) and not log_grid:
                    final.update(trainer.train_metrics(close=False))
                if (done or outcome.time_up) and not eval_grid:
                    last_eval, last_eval_step = trainer.evaluate(on_grid=False), step
                    final.update(last_eval)
                for record in (metrics, final | {STOP_KEY: 1.0} if final else {}):
                    if record and trainer.logger is not None:
                        record["time_s"] = progress.elapsed()
                        trainer.logger.log_dict(record, step)
                        _report(bar, step, record, trainer.metric)
                stopping = bool(outcome.signum) or outcome.time_up
                if step % config.checkpoint_every == 0 or done or stopping:
                    trainer.save()
                if stopping:
                    if outcome.signum:
                        status = "interrupted"
                        exit_code = STOP_SIGNALS[outcome.signum]
                    else:
                        status = "time_limit"
                    break
    except TrainingDiverged as exc:
        status, exit_code = "diverged", EXIT_DIVERGED
        if trainer.info.is_main:
            _report_divergence(exc, trainer.run_dir)
    finally:
        bar.close()

    if last_eval is None and status != "diverged":
        last_eval, last_eval_step = trainer.evaluate(), progress.step
    summary = trainer.summary(status, last_eval, last_eval_step)
    trainer.finish(summary)
    return RunResult(trainer.run_dir, status, exit_code, summary)


def _report_divergence(exc: TrainingDiverged, run_dir: Path) -> None:
    latest = ckpt_io.list_checkpoints(run_dir)
    kept = f"the last good checkpoint is {latest[-1]}" if latest else "no checkpoint exists"
    print(
        f"\nrelmem: stopping: {exc}. The update was not applied and {kept}. "
        "Try a lower --optim.lr or set --optim.grad-clip.",
        file=sys.stderr,
        flush=True,
    )


def _report(bar: tqdm, step: int, metrics: dict[str, float], metric: MetricSpec) -> None:
    shown = {
        "loss": metrics.get("train/loss"),
        metric.short: metrics.get(f"train/{metric.name}"),
        "eval": metrics.get(f"eval/{metric.name}"),
        "seq/s": metrics.get("perf/sequences_per_s"),
    }
    shown = {k: v for k, v in shown.items() if v is not None}
    if not bar.disable:
        bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
    else:
        text = " ".join(f"{k} {v:.4g}" for k, v in shown.items())
        print(f"step {step} {text} time {metrics['time_s']:.0f}s", flush=True)
