"""The generic training loop behind ``relmem train TASK``.

:func:`run` trains any registered model on any registered task from a :class:`TrainConfig`:

- data: every step draws the *global* batch on the training device from a generator seeded by
  ``(seed, step)`` and each data-parallel rank keeps its slice, so the data never depends on the
  number of processes or on where a run was resumed (generation costs far less than a step);
- tasks: last-step (classification, ``logits [B, C]``) or per-step (``logits [B, T, O]`` with a
  mask and ``lengths``, which the model receives); the task's primary metric
  (:class:`~relmem.tasks.base.MetricSpec`: accuracy, bit errors, ...) is logged as
  ``train/{name}``, ``eval/{name}``, ``eval/best_batch_{name}`` and per group;
- the run directory gets ``config.json`` (resolved config), ``run.json`` (command lines,
  versions, git SHA, devices), ``metrics.jsonl``, ``tb/``, ``checkpoints/`` and ``summary.json``;
- checkpoints are atomic (:mod:`relmem.train.checkpoint`); a resumed CPU run ends bit-identical
  to an uninterrupted one;
- SIGINT/SIGTERM finish the current step, checkpoint and exit; a non-finite loss stops the run
  before the update, keeps the last good checkpoint and exits with :data:`EXIT_DIVERGED`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from relmem.models import build_model as build_sequence_model
from relmem.models import count_parameters
from relmem.tasks.base import Batch, MetricSpec, Task, get_task, step_generator
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import TrainConfig, config_to_dict
from relmem.train.distributed import (
    DistInfo,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    shutdown_distributed,
)
from relmem.train.metrics import JsonlLogger, MetricLogger, MultiLogger, TensorBoardLogger

EXIT_OK = 0
EXIT_DIVERGED = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

# Independent random streams, mixed with the seed and the step (relmem.tasks.base.derive_seed).
STREAM_TRAIN = 1
STREAM_EVAL_BATCH = 2


class TrainingDiverged(RuntimeError):
    """The loss or the weights became NaN or infinite."""


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


def lr_multiplier(step: int, config: TrainConfig) -> float:
    """The schedule's factor on ``optim.lr`` at ``step`` (1 for 'constant').

    'paper': ``max(decay_rate ** (step / decay_steps), min_lr / lr)``, the Sonnet example's
    continuous exponential decay with a floor (spec 1.3).
    """
    o = config.optim
    if o.schedule == "constant":
        return 1.0
    return max(o.decay_rate ** (step / o.decay_steps), o.min_lr / o.lr)


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class _StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints and exits at the end of the step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up on the clean exit
        self.signum = signum
        print(
            f"\nrelmem: received {signal.Signals(signum).name}; finishing this step and "
            "saving a checkpoint (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopFlag]:
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handler)
        try:
            yield self
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)


def _shard(batch: Batch, info: DistInfo) -> Batch:
    """This rank's contiguous slice of a global batch."""
    if not info.enabled:
        return batch
    size = batch.targets.shape[0]
    per = size // info.world_size
    return batch.select(slice(info.rank * per, (info.rank + 1) * per))


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64 for metric sums, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def _autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    batch: Batch,
    *,
    info: DistInfo | None = None,
    chunk: int = 4000,
    bf16: bool = False,
) -> dict[str, Any]:
    """Loss and primary metric of ``model`` on ``batch``, sharded over ranks and summed.

    Args:
        model: maps ``inputs [B, T, F]`` (and ``lengths [B]``) to ``logits [B, C]`` or
            ``[B, T, O]``.
        task: supplies the loss and the metrics.
        batch: the *global* batch; each rank evaluates its strided share.
        info: the process group.
        chunk: sequences per forward pass.
        bf16: bfloat16 autocast (CUDA).

    Returns:
        ``{'loss', task.metric.name, 'count', 'groups': {group id: metric}}``, means over the
        batch and over each group's sequences.
    """
    info = info or DistInfo()
    was_training = model.training
    model.eval()
    device = batch.inputs.device
    acc = accumulator_dtype(device)
    name = task.metric.name
    sums = torch.zeros(2, dtype=acc, device=device)  # loss sum, metric sum
    group_sum = torch.zeros(task.num_groups, dtype=acc, device=device)
    group_count = torch.zeros(task.num_groups, dtype=acc, device=device)
    indices = torch.arange(info.rank, batch.targets.shape[0], info.world_size, device=device)
    for part in indices.split(chunk):
        sub = batch.select(part)
        with _autocast(device, bf16):
            logits, _ = model(sub.inputs, lengths=sub.lengths)
        values = task.metrics(logits, sub)[name].to(acc)  # [b]
        sums[0] += task.loss(logits, sub).to(acc) * part.numel()
        sums[1] += values.sum()
        if sub.groups is not None:
            group_sum.index_add_(0, sub.groups, values)
            group_count.index_add_(0, sub.groups, torch.ones_like(values))
    all_reduce_sum(sums, info)
    all_reduce_sum(group_sum, info)
    all_reduce_sum(group_count, info)
    count = batch.targets.shape[0]
    model.train(was_training)
    groups = {
        int(g): (group_sum[g] / group_count[g]).item()
        for g in range(task.num_groups)
        if group_count[g] > 0
    }
    return {
        "loss": (sums[0] / count).item(),
        name: (sums[1] / count).item(),
        "count": count,
        "groups": groups,
    }


def build_model(config: TrainConfig, task: Task) -> nn.Module:
    """The registered model ``config.model`` for ``task``, on the CPU, seeded by ``seed``."""
    torch.manual_seed(config.seed)
    return build_sequence_model(config.model, config.model_config(), config.head, task.spec)


def _all_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _new_run_dir(config: TrainConfig, task_name: str, info: DistInfo) -> Path:
    name = config.run_name
    if name is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        name = f"{task_name}-{config.model}-{stamp}"
    if info.enabled:  # every rank must agree on the (time-stamped) name
        holder = [name]
        dist.broadcast_object_list(holder, src=0)
        name = holder[0]
    run_dir = config.out_dir / name
    if ckpt_io.list_checkpoints(run_dir):
        raise FileExistsError(
            f"run directory {run_dir} already holds checkpoints; pass --resume {run_dir} to "
            "continue it, or choose another --run-name"
        )
    return run_dir


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _record_invocation(
    run_dir: Path, config: TrainConfig, device: torch.device, info: DistInfo, argv: list[str] | None
) -> None:
    from relmem import __version__

    path = run_dir / "run.json"
    record = json.loads(path.read_text()) if path.exists() else {"invocations": []}
    record["invocations"].append(
        {
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv if argv is None else argv),
            "resume": None if config.resume is None else str(config.resume),
            "relmem": __version__,
            "git_sha": _git_sha(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "host": platform.node(),
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or platform.machine(),
            "world_size": info.world_size,
            "num_threads": torch.get_num_threads(),
        }
    )
    _write_json(path, record)


def run(config: TrainConfig, task_name: str, *, argv: list[str] | None = None) -> RunResult:
    """Train ``config.model`` on the task ``task_name`` as configured.

    Args:
        config: the resolved configuration.
        task_name: a registered task (``relmem.tasks.list_tasks()``).
        argv: the command line to record in ``run.json`` (default ``sys.argv``).

    Returns:
        :class:`RunResult`; the CLI returns its ``exit_code``.

    Raises:
        ValueError: a setting does not fit the machine (bf16 off CUDA, indivisible batch).
        CheckpointError: ``config.resume`` names a damaged or missing checkpoint.
    """
    info, device = init_distributed(config.device)
    try:
        result = _run(config, task_name, info, device, argv)
        # Every rank finishes before any tears down its connections. Once, under a loaded CI
        # run, rank 1 aborted ("terminate called without an active exception") destroying its
        # gloo group while rank 0 was still writing the summary.
        barrier(info)
        return result
    finally:
        shutdown_distributed()


def _run(
    config: TrainConfig,
    task_name: str,
    info: DistInfo,
    device: torch.device,
    argv: list[str] | None,
) -> RunResult:
    if config.bf16 and device.type != "cuda":
        raise ValueError(f"bf16 autocast needs a CUDA device; this run is on {device}")
    if config.batch_size % info.world_size or config.eval_batch % info.world_size:
        raise ValueError(
            f"batch_size ({config.batch_size}) and eval_batch ({config.eval_batch}) must be "
            f"divisible by the number of processes ({info.world_size})"
        )
    if config.deterministic:
        torch.use_deterministic_algorithms(True)
    if device.type == "cpu" and config.cpu_threads is not None:
        torch.set_num_threads(config.cpu_threads)

    resume_ckpt = None if config.resume is None else ckpt_io.resolve_checkpoint(config.resume)
    if resume_ckpt is not None:
        run_dir = resume_ckpt.parent.parent
        train_state = ckpt_io.load_train_state(resume_ckpt)
    else:
        run_dir = _new_run_dir(config, task_name, info)
        train_state = None

    task = get_task(task_name).build(config.task)
    metric = task.metric
    model = build_model(config, task).to(device)
    if resume_ckpt is not None:
        ckpt_io.load_weights(resume_ckpt, model, device)
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=config.optim.lr,
        betas=config.optim.betas,
        eps=config.optim.eps,
        weight_decay=config.optim.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, config))
    step, elapsed_before, best_batch = 0, 0.0, float("nan")
    if train_state is not None:
        optimizer.load_state_dict(train_state["optimizer"])
        scheduler.load_state_dict(train_state["scheduler"])
        step = int(train_state["step"])
        elapsed_before = float(train_state["elapsed_s"])
        best_batch = float(train_state[f"best_batch_{metric.name}"])
        torch.set_rng_state(train_state["rng"]["cpu"])
        if device.type == "cuda" and train_state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(train_state["rng"]["cuda"])

    wrapped: nn.Module = model
    if info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=ids)

    config_dict = {"task_name": task_name, **config_to_dict(config)}
    logger: MetricLogger | None = None
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_ckpt is None:
            _write_json(run_dir / "config.json", config_dict)
        else:  # overrides given with --resume (e.g. more steps) become the run's config
            _write_json(run_dir / "config.json", config_dict | {"resume": None})
        _record_invocation(run_dir, config, device, info, argv)
        loggers: list[MetricLogger] = [
            JsonlLogger(run_dir / "metrics.jsonl", resume_step=step if train_state else None)
        ]
        if config.tensorboard:
            loggers.append(TensorBoardLogger(run_dir / "tb", purge_step=step if step else None))
        logger = MultiLogger(loggers)
        logger.log_config(config_dict)
        verb = "resuming" if train_state else "starting"
        print(
            f"relmem: {verb} {task_name} / {config.model} "
            f"({count_parameters(model):,} parameters) on {device}"
            + (f" x{info.world_size} processes" if info.enabled else "")
            + f" at step {step}; run directory: {run_dir}",
            flush=True,
        )

    held_out = task.held_out(device)
    per_rank = config.batch_size // info.world_size
    state = _LoopState(step=step, elapsed_before=elapsed_before, best_batch=best_batch)

    def save() -> None:
        if not _all_finite(model):
            raise TrainingDiverged(f"the weights became non-finite by step {state.step}")
        if info.is_main:
            ckpt_io.save_checkpoint(
                run_dir,
                state.step,
                model,
                {
                    "step": state.step,
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng": {
                        "cpu": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
                    },
                    "elapsed_s": state.elapsed(),
                    f"best_batch_{metric.name}": state.best_batch,
                    "task_name": task_name,
                    "config": json.dumps(config_dict),
                    "world_size": info.world_size,
                },
                keep=config.keep_checkpoints,
            )
        barrier(info)

    def evaluate_now() -> dict[str, Any]:
        m = metric.name
        result = evaluate(model, task, held_out, info=info, bf16=config.bf16)
        fresh = task.sample(
            config.eval_batch, step_generator(device, config.seed, STREAM_EVAL_BATCH, state.step)
        )
        batch_value = evaluate(model, task, fresh, info=info, bf16=config.bf16)[m]
        if metric.improves(batch_value, state.best_batch):
            state.best_batch = batch_value
        return {
            f"eval/{m}": result[m],
            "eval/loss": result["loss"],
            f"eval/batch_{m}": batch_value,
            f"eval/best_batch_{m}": state.best_batch,
            **{f"eval/{m}_group_{g}": v for g, v in result["groups"].items()},
        }

    bar = tqdm(
        total=config.steps,
        initial=step,
        disable=None if info.is_main else True,
        dynamic_ncols=True,
        unit="step",
    )
    status, exit_code, last_eval, last_eval_step = "completed", EXIT_OK, None, state.step
    stop = _StopFlag()
    acc = accumulator_dtype(device)
    train_sums = torch.zeros(3, dtype=acc, device=device)  # loss, metric, count
    window_start, window_steps = time.perf_counter(), 0
    state.start()
    wrapped.train()
    try:
        with stop.installed():
            while state.step < config.steps:
                generator = step_generator(device, config.seed, STREAM_TRAIN, state.step)
                batch = _shard(task.sample(config.batch_size, generator), info)
                with _autocast(device, config.bf16):
                    logits, _ = wrapped(batch.inputs, lengths=batch.lengths)
                loss = task.loss(logits, batch)
                time_up = (
                    config.time_limit_min is not None
                    and state.session() > 60 * config.time_limit_min
                )
                flags = torch.stack(
                    [
                        (~torch.isfinite(loss.detach())).to(acc),
                        torch.tensor(float(stop.signum or 0), device=device, dtype=acc),
                        torch.tensor(float(time_up), device=device, dtype=acc),
                    ]
                )
                nonfinite, signum, time_up_any = all_reduce_max(flags, info).tolist()
                if nonfinite:
                    raise TrainingDiverged(f"the loss is {loss.item()} at step {state.step + 1}")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.optim.grad_clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
                optimizer.step()
                scheduler.step()
                state.step += 1
                window_steps += 1
                bar.update(1)
                with torch.no_grad():
                    value = task.metrics(logits.detach(), batch)[metric.name].to(acc).sum()
                    train_sums += torch.stack(
                        [
                            loss.detach().to(acc) * per_rank,
                            value,
                            torch.tensor(per_rank, dtype=acc, device=device),
                        ]
                    )
                done = state.step >= config.steps
                metrics: dict[str, float] = {}
                if state.step % config.log_every == 0 or done:
                    all_reduce_sum(train_sums, info)
                    now = time.perf_counter()
                    loss_sum, value_sum, count = train_sums.tolist()
                    rate = window_steps * config.batch_size / max(now - window_start, 1e-9)
                    metrics.update(
                        {
                            "train/loss": loss_sum / count,
                            f"train/{metric.name}": value_sum / count,
                            "train/lr": scheduler.get_last_lr()[0],
                            "perf/sequences_per_s": rate,
                        }
                    )
                    train_sums.zero_()
                    window_start, window_steps = now, 0
                if state.step % config.eval_every == 0 or done or time_up_any:
                    last_eval, last_eval_step = evaluate_now(), state.step
                    metrics.update(last_eval)
                if metrics and logger is not None:
                    metrics["time_s"] = state.elapsed()
                    logger.log_dict(metrics, state.step)
                    _report(bar, state.step, metrics, metric)
                if state.step % config.checkpoint_every == 0 or done:
                    save()
                if signum or time_up_any:
                    if state.step % config.checkpoint_every and not done:
                        save()
                    if signum:
                        status = "interrupted"
                        exit_code = EXIT_SIGTERM if int(signum) == signal.SIGTERM else EXIT_SIGINT
                    else:
                        status = "time_limit"
                    break
    except TrainingDiverged as exc:
        status, exit_code = "diverged", EXIT_DIVERGED
        latest = ckpt_io.list_checkpoints(run_dir)
        kept = f"the last good checkpoint is {latest[-1]}" if latest else "no checkpoint exists"
        if info.is_main:
            print(
                f"\nrelmem: stopping: {exc}. The update was not applied and {kept}. "
                "Try a lower --optim.lr or set --optim.grad-clip.",
                file=sys.stderr,
                flush=True,
            )
    finally:
        bar.close()

    if last_eval is None and status != "diverged":
        last_eval, last_eval_step = evaluate_now(), state.step
    summary = {
        "status": status,
        "task": task_name,
        "model": config.model,
        "parameters": count_parameters(model),
        "steps": state.step,
        "target_steps": config.steps,
        "sequences_seen": state.step * config.batch_size,
        "wall_time_s": state.elapsed(),
        "device": str(device),
        "world_size": info.world_size,
        "held_out_size": int(held_out.targets.shape[0]),
        "held_out_step": last_eval_step,
        "metric": metric.name,
        f"held_out_{metric.name}": None if last_eval is None else last_eval[f"eval/{metric.name}"],
        "held_out_loss": None if last_eval is None else last_eval["eval/loss"],
        f"best_batch_{metric.name}": None if math.isnan(state.best_batch) else state.best_batch,
        "run_dir": str(run_dir),
    }
    if info.is_main:
        _write_json(run_dir / "summary.json", summary)
        if logger is not None:
            logger.close()
        value = summary[f"held_out_{metric.name}"]
        shown = "n/a" if value is None else metric.format(value)
        print(
            f"relmem: {status} after {state.step} steps in {state.elapsed():.0f} s; "
            f"held-out {metric.description} {shown}; run directory: {run_dir}",
            flush=True,
        )
    return RunResult(run_dir, status, exit_code, summary)


@dataclass
class _LoopState:
    """Counters that survive into checkpoints."""

    step: int
    elapsed_before: float
    best_batch: float
    _started: float = 0.0

    def start(self) -> None:
        self._started = time.perf_counter()

    def session(self) -> float:
        """Seconds since this invocation started training."""
        return time.perf_counter() - self._started

    def elapsed(self) -> float:
        """Training wall-clock seconds over every invocation of the run."""
        return self.elapsed_before + self.session()


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
