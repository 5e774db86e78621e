"""One training run's pieces: set-up, one optimiser step, evaluation, checkpoints, summary.

:class:`Trainer` owns the model, the optimiser, the data stream and the counters; the cadence
(when to log, evaluate, checkpoint and stop) is :func:`relmem.train.loop.run`'s.

- Data: every step draws the *global* batch on the training device from a generator seeded by
  ``(seed, step)`` and each data-parallel rank keeps its slice, so the data never depends on the
  number of processes or on where a run was resumed (generation costs far less than a step).
- Loss: the task's per-example ``(total, count)`` sums (:class:`~relmem.tasks.base.Measure`);
  the objective is ``Σ total / Σ count`` over the global batch, the count all-reduced, so
  token-weighted losses stay exact under DDP.
- Stateful tasks: this rank's recurrent state is carried from one step to the next, detached at
  each boundary, and saved (gathered over the ranks) in the checkpoint, so a resumed run
  continues the same streams.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from relmem.cores.base import detach_state, map_state
from relmem.cores.rmc import prefer_fused
from relmem.models import count_parameters
from relmem.tasks.base import Batch, derive_seed, step_generator
from relmem.tasks.registry import get_task
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import OptimConfig, TrainConfig, config_to_dict
from relmem.train.distributed import (
    DistInfo,
    all_gather_rows,
    all_reduce_max,
    all_reduce_sum,
    barrier,
)
from relmem.train.evaluation import Totals, accumulator_dtype, autocast, evaluate
from relmem.train.lock import RunLock
from relmem.train.metrics import JsonlLogger, MetricLogger, MultiLogger, TensorBoardLogger
from relmem.train.optimizers import AdamEpsHat, TFRMSprop
from relmem.train.runs import (
    SUMMARY_FILE,
    build_model,
    check_data_identity,
    check_model_size,
    check_model_unchanged,
    check_options_read,
    never_checkpointed,
    new_run_dir,
    occupied,
    read_invocations,
    record_data_identity,
    record_invocation,
    write_json,
)
from relmem.train.threads import ThreadGovernor, usable_cores

# Independent random streams, mixed with the seed and the step (relmem.tasks.base.derive_seed).
STREAM_TRAIN = 1
STREAM_EVAL_BATCH = 2
STREAM_RANK = 3  # each data-parallel rank's global generator (dropout), after the weights'


class TrainingDiverged(RuntimeError):
    """The loss or the weights became NaN or infinite."""


def lr_multiplier(step: int, config: TrainConfig) -> float:
    """The schedule's factor on ``optim.lr`` at ``step`` (0-based: the step about to be
    taken), times the linear warm-up's; 'plateau' adds its reductions on top
    (:meth:`Trainer.plateau`).

    - 'constant' and 'plateau': 1.
    - 'paper': ``max(decay_rate ** (step / decay_steps), min_lr / lr)``, the Sonnet example's
      continuous exponential decay with a floor (``docs/tasks.md`` §1.3).
    - 'cosine': ``r + (1 - r) * (1 + cos(pi * step / steps)) / 2`` with ``r = min_lr / lr``.
    - warm-up: ``min(1, (step + 1) / warmup_steps)`` when ``warmup_steps > 0``.
    """
    o = config.optim
    warmup = min(1.0, (step + 1) / o.warmup_steps) if o.warmup_steps > 0 else 1.0
    if o.schedule in ("constant", "plateau"):
        return warmup
    floor = o.min_lr / o.lr
    if o.schedule == "cosine":
        progress = min(step / config.steps, 1.0)
        return warmup * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    return warmup * max(o.decay_rate ** (step / o.decay_steps), floor)


def make_optimizer(parameters: Any, o: OptimConfig) -> torch.optim.Optimizer:
    """``o.optimizer`` over ``parameters``: Adam (``betas``, ``eps``, ``weight_decay``; with
    ``eps_hat`` TF1's epsilon placement), RMSProp (decay ``alpha``, ``eps``, ``momentum``,
    ``weight_decay``) or TF1's RMSProp (the same and ``initial_mean_square``; the IMPALA
    presets'), :mod:`relmem.train.optimizers`."""
    if o.optimizer == "rmsprop-tf":
        return TFRMSprop(
            parameters,
            lr=o.lr,
            decay=o.alpha,
            momentum=o.momentum,
            eps=o.eps,
            initial_mean_square=o.initial_mean_square,
            weight_decay=o.weight_decay,
        )
    if o.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            parameters,
            lr=o.lr,
            alpha=o.alpha,
            eps=o.eps,
            momentum=o.momentum,
            weight_decay=o.weight_decay,
        )
    parameters = list(parameters)
    # The fused kernel (one pass over each tensor instead of a dozen foreach ops) exists for
    # floating-point tensors on the CPU and CUDA; it took the CPU preset's Adam step from
    # 1.4 ms to 0.37 ms (docs/performance.md §4.6).
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in parameters)
    if o.eps_hat:
        return AdamEpsHat(
            parameters,
            lr=o.lr,
            betas=o.betas,
            eps_hat=o.eps,
            weight_decay=o.weight_decay,
            fused=fused or None,
        )
    return torch.optim.Adam(
        parameters,
        lr=o.lr,
        betas=o.betas,
        eps=o.eps,
        weight_decay=o.weight_decay,
        fused=fused or None,
    )


@dataclass
class Progress:
    """Counters that survive into checkpoints, and the clock."""

    step: int = 0
    elapsed_before: float = 0.0
    best_batch: float = float("nan")
    best_held_out: float = float("nan")
    lr_scale: float = 1.0  # the 'plateau' schedule's reductions so far
    plateau_best: float = float("nan")  # its best held-out loss
    plateau_bad: int = 0  # evaluations since that best
    _started: float = 0.0

    def start(self) -> None:
        self._started = time.perf_counter()

    def session(self) -> float:
        """Seconds since this invocation started training."""
        return time.perf_counter() - self._started

    def elapsed(self) -> float:
        """Training wall-clock seconds over every invocation of the run."""
        return self.elapsed_before + self.session()


@dataclass(frozen=True)
class StepOutcome:
    """What every rank agreed on after a step: a signal number (0: none) and the time limit."""

    signum: int
    time_up: bool


def _state_leaves(state: Any) -> list[Tensor]:
    """The tensors of a (nested) state in a fixed order; ``[]`` for None."""
    leaves: list[Tensor] = []
    map_state(lambda t: leaves.append(t), state)
    return leaves


def _state_from_leaves(template: Any, leaves: list[Tensor]) -> Any:
    """``template``'s structure holding ``leaves`` (in :func:`_state_leaves`' order)."""
    remaining = iter(leaves)
    return map_state(lambda _: next(remaining), template)


class Trainer:
    """Everything one process needs to train ``config.model`` on ``task_name``.

    Construction is the set-up: it checks the settings against the machine, opens or resumes
    the run directory, builds the task, the model (DDP-wrapped when distributed), the optimiser
    and the schedule, restores a checkpoint's state, and opens the metric loggers (rank 0).

    This class is the supervised trainer. A task whose data comes from acting (reinforcement
    learning, :mod:`relmem.rl.trainer`) registers a subclass (``register_task(...,
    trainer=...)``) that replaces what differs: :meth:`build_model`, :meth:`step`,
    :meth:`evaluate` and the metrics. The cadence (:mod:`relmem.train.loop`), the run
    directory, its lock and logs, checkpoints (the task's :meth:`~relmem.tasks.base.Task.
    state_dict` rides in ``train_state.pt``), :meth:`apply_gradients` and the summary stay
    this class's.

    Args:
        config: the resolved configuration.
        task_name: a registered task.
        info: this process's place in the job.
        device: this process's device.
        argv: the command line to record in ``run.json`` (default ``sys.argv``).
        max_parameters: refuse a larger model before the run directory is made (None: no
            bound; :func:`~relmem.train.runs.check_model_size`).

    Raises:
        ValueError: a setting does not fit the machine (bf16 off CUDA, indivisible batch), a
            new run sets an option its model never reads
            (:func:`~relmem.train.runs.check_options_read`), the model is over
            ``max_parameters``, or ``steps`` is below a resumed checkpoint's step.
        CheckpointError: ``config.resume`` names a damaged or missing checkpoint.
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
        if config.bf16 and device.type != "cuda":
            raise ValueError(f"bf16 autocast needs a CUDA device; this run is on {device}")
        if config.batch_size % info.world_size or config.eval_batch % info.world_size:
            raise ValueError(
                f"batch_size ({config.batch_size}) and eval_batch ({config.eval_batch}) must "
                f"be divisible by the number of processes ({info.world_size})"
            )
        if config.deterministic:
            torch.use_deterministic_algorithms(True)
        # --cpu-threads auto: the loop asks the governor before each step (train/threads.py)
        self.thread_governor: ThreadGovernor | None = None
        if device.type == "cpu" and config.cpu_threads == "auto":
            self.thread_governor = ThreadGovernor(usable_cores())
        elif device.type == "cpu" and config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)
        self.config, self.task_name, self.info, self.device = config, task_name, info, device
        self.per_rank = config.batch_size // info.world_size

        # a run killed before its first checkpoint trains again from nothing, in its directory
        restart = config.resume is not None and never_checkpointed(config.resume)
        resume = None
        if config.resume is not None and not restart:
            resume = ckpt_io.resolve_checkpoint(config.resume)
        saved = None if resume is None else ckpt_io.load_train_state(resume)
        self.task = get_task(task_name).build(config.task)
        self.metric = self.task.metric
        self.data_identity = self.task.data_identity()  # what every checkpoint records
        if resume is None and get_task(task_name).trainer is None:  # an agent checks its own
            check_options_read(config, self.task)
        if max_parameters is not None:
            self.check_size(max_parameters)
        if restart:
            self.run_dir = Path(config.resume)
            if info.is_main:
                print(
                    f"relmem: {self.run_dir} holds no checkpoint (it stopped before its first): "
                    "training it from step 0 with its config.json; the metrics it logged are "
                    "replaced",
                    file=sys.stderr,
                    flush=True,
                )
        elif resume is None:
            self.run_dir = new_run_dir(config, task_name, info)
        else:
            self.run_dir = resume.parent.parent
        if resume is not None:
            check_data_identity(self.run_dir, self.task)

        self.model = self.build_model()
        if info.enabled:  # the same weights everywhere, then each rank its own dropout masks
            torch.manual_seed(derive_seed(config.seed, STREAM_RANK, info.rank))
        if resume is not None:
            ckpt_io.load_weights(resume, self.model, device)
        self.optimizer = make_optimizer(self.model.parameters(), config.optim)
        self.progress = Progress()
        # a lambda, not the bound method: LambdaLR then keeps no state of it in checkpoints
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: self._lr_factor(s)
        )
        self.state: Any = None  # the carried recurrent state of a stateful task (None: initial)
        if saved is not None:
            self._restore(saved)
            if config.steps < self.progress.step:
                raise ValueError(
                    f"--steps {config.steps} is below the step of {resume} "
                    f"({self.progress.step}): a resumed run trains up to --steps; pass a larger "
                    "one to train further, or resume an earlier checkpoint"
                )
        self.wrapped: nn.Module = self.model
        if info.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.wrapped = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.config_dict = {"task_name": task_name, **config_to_dict(config)}
        if saved is not None and "config" in saved:  # config.json edited since the checkpoint?
            trained = json.loads(saved["config"])
            check_model_unchanged(
                trained, self.config_dict, resume, "a resumed run keeps its model"
            )
        self.lock: RunLock | None = None  # rank 0's lock on the run directory
        # before anything is written: a held-out set the data cannot fill fails here
        self.held_out = self.task.held_out(device)
        self.window = Totals(self.task, device)  # the training metrics since the last log line
        self.window_steps, self.window_start = 0, time.perf_counter()
        self.window_tokens = 0  # time steps x rows of the global batches since the last log line
        if saved is not None and "train_window" in saved and info.is_main:
            # the sums since the last log line, all ranks' together (on rank 0 alone: the next
            # all-reduce adds them once), so the first record after a resume covers every step
            window = saved["train_window"]
            if window.shape != self.window.sums.shape:
                raise ValueError(
                    f"{resume} holds sums of {window.shape[0]} training metrics, and this "
                    f"configuration makes {self.window.sums.shape[0]}: an option that decides "
                    "the metrics (such as --task.algorithm) differs from the run's; resume "
                    "without it"
                )
            self.window.sums.copy_(window)
        self.logger = (
            self._open_logs(resumed=saved is not None, restarted=restart, argv=argv)
            if info.is_main
            else None
        )

    def check_size(self, max_parameters: int) -> None:
        """Refuse a model over ``max_parameters`` before anything is built or written.

        Raises:
            ValueError: naming ``--max-parameters``.
        """
        check_model_size(self.config, self.task, max_parameters)

    def build_model(self) -> nn.Module:
        """The model to train, on this process's device (weights seeded by ``config.seed``)."""
        return self.prefer_fused(build_model(self.config, self.task).to(self.device))

    def prefer_fused(self, model: nn.Module) -> nn.Module:
        """``model``, its RMC cores left on ``'auto'`` switched to the fused step on the CPU
        when its operators build (:func:`relmem.cores.rmc.prefer_fused`; rank 0 says how)."""
        note = prefer_fused(model, self.device)
        if note is not None and self.info.is_main:
            print(f"relmem: {note}", flush=True)
        return model

    def _restore(self, saved: dict[str, Any]) -> None:
        """Optimiser, schedule, counters, RNG and carried state from a checkpoint."""
        if "optimizer" not in saved:
            raise ckpt_io.CheckpointError(
                f"{self.config.resume} holds weights only (the best held-out copy); resume "
                "from the run directory or one of its step-* checkpoints"
            )
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.progress = Progress(
            step=int(saved["step"]),
            elapsed_before=float(saved["elapsed_s"]),
            best_batch=float(saved[f"best_batch_{self.metric.name}"]),
            best_held_out=float(saved.get("best_held_out", float("nan"))),
            **{k: saved[k] for k in ("lr_scale", "plateau_best", "plateau_bad") if k in saved},
        )
        self._restore_rng(saved["rng"])
        self.task.load_state_dict(saved.get("task_state", {}))  # absent before task states
        leaves = saved.get("carried_state", [])  # absent from checkpoints of stateless runs
        if leaves and leaves[0].shape[0] != self.config.batch_size:
            raise ValueError(
                f"--batch-size {self.config.batch_size}: this {self.task_name} run carries its "
                f"recurrent state from step to step in {leaves[0].shape[0]} rows (each its own "
                f"place in the data); resume it with --batch-size {leaves[0].shape[0]}"
            )
        if leaves:
            rows = slice(self.info.rank * self.per_rank, (self.info.rank + 1) * self.per_rank)
            template = self.model.initial_state(self.per_rank, self.device)
            self.state = _state_from_leaves(template, [t[rows].to(self.device) for t in leaves])

    def _gather_rng_states(self) -> dict[str, Tensor | None]:
        """Every rank's global generator states, in rank order: ``cpu [world, n]`` uint8 and
        ``cuda`` (this rank's device's) ``[world, m]`` or None off CUDA."""
        device = self.device

        def gather(state: Tensor) -> Tensor:  # through the device: NCCL moves CUDA tensors
            return all_gather_rows(state.unsqueeze(0).to(device), self.info).cpu()

        cuda = gather(torch.cuda.get_rng_state(device)) if device.type == "cuda" else None
        return {"cpu": gather(torch.get_rng_state()), "cuda": cuda}

    def _restore_rng(self, rng: dict[str, Any]) -> None:
        """This rank's generator states from a checkpoint's ``rng``: its own when the run had
        as many ranks (the resume is then exact), else rank 0's, each rank then mixing in its
        rank and the step so that no two draw the same dropout masks."""
        ranks = rng.get("ranks")  # absent before per-rank states were saved
        world, rank = self.info.world_size, self.info.rank
        if ranks is not None and ranks["cpu"].shape[0] == world:
            # clone(): given the row itself, a view at a storage offset, set_rng_state
            # segfaulted rank 1 (torch 2.13)
            torch.set_rng_state(ranks["cpu"][rank].clone())
            if self.device.type == "cuda" and ranks["cuda"] is not None:
                torch.cuda.set_rng_state(ranks["cuda"][rank].clone(), self.device)
            return
        torch.set_rng_state(rng["cpu"])
        if self.device.type == "cuda" and rng["cuda"]:
            torch.cuda.set_rng_state_all(rng["cuda"])
        if self.info.enabled:
            torch.manual_seed(derive_seed(self.config.seed, STREAM_RANK, rank, self.progress.step))

    def _open_logs(self, resumed: bool, restarted: bool, argv: list[str] | None) -> MetricLogger:
        """Lock the run directory, check what is in it, then write ``config.json`` and
        ``run.json``, open the metric loggers and announce the run.

        ``restarted``: a run that never checkpointed trains from step 0 in its directory, as a
        new run would (its metrics and ``data.json`` written anew), its ``best`` weights, if
        any, set aside.

        Nothing in the directory changes until the lock is held and ``run.json`` and
        ``metrics.jsonl`` have been read (a damaged ``metrics.jsonl`` stops the run here).
        """
        config, step = self.config, self.progress.step
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(self.run_dir)
        try:
            # checked again under the lock: another new run of the same name may have filled
            # the directory since new_run_dir looked (and would be wiped)
            problem = None if resumed or restarted else occupied(self.run_dir)
            if restarted and not never_checkpointed(self.run_dir):  # another process's since
                problem = (
                    f"{self.run_dir} holds a checkpoint now (another process trained it since "
                    f"this one looked); pass --resume {self.run_dir} again to continue from it"
                )
            if problem is not None:
                raise FileExistsError(problem)
            invocations = read_invocations(self.run_dir)
            # a resume with nothing left to train (killed after its last checkpoint) keeps the
            # last stop record: no step will log it again
            jsonl = JsonlLogger(
                self.run_dir / "metrics.jsonl",
                resume_step=step if resumed else None,
                keep_stop=step >= config.steps,
            )
            abandoned = (
                ckpt_io.set_aside_newer(self.run_dir, step) if resumed or restarted else None
            )
        except BaseException:
            self.lock.release()
            raise
        if abandoned is not None:
            print(
                f"relmem: resuming at step {step}, before the run's newest checkpoints: they "
                f"and their metrics belong to the history this run replaces; the checkpoints "
                f"are kept in {abandoned}",
                flush=True,
            )
        # overrides given with --resume (e.g. more steps) become the run's config
        write_json(
            self.run_dir / "config.json",
            self.config_dict | {"resume": None} if resumed or restarted else self.config_dict,
        )
        record_invocation(self.run_dir, config, self.device, self.info, argv, invocations)
        if not resumed:
            record_data_identity(self.run_dir, self.task)
        loggers: list[MetricLogger] = [jsonl]
        if config.tensorboard:
            # TensorBoard hides events at and after purge_step: the checkpoint's own step's
            # records were logged before it was saved
            purge = step + 1 if resumed or restarted else None
            loggers.append(TensorBoardLogger(self.run_dir / "tb", purge_step=purge))
        logger = MultiLogger(loggers)
        logger.log_config(self.config_dict)
        print(
            f"relmem: {'resuming' if resumed else 'starting'} {self.task_name} / {config.model} "
            f"({count_parameters(self.model):,} parameters) on {self.device}"
            + (f" x{self.info.world_size} processes" if self.info.enabled else "")
            + f" at step {step}; run directory: {self.run_dir}",
            flush=True,
        )
        return logger

    def sample(self, stream: int, batch_size: int) -> Batch:
        """The global batch of ``stream`` at the current step (the evaluation's fresh batch
        for :data:`STREAM_EVAL_BATCH`, a training batch otherwise)."""
        config, step = self.config, self.progress.step
        generator = step_generator(self.device, config.seed, stream, step)
        draw = self.task.sample_evaluation if stream == STREAM_EVAL_BATCH else self.task.sample
        return draw(batch_size, generator, step)

    def _shard(self, batch: Batch) -> Batch:
        """This rank's contiguous slice of a global batch."""
        if not self.info.enabled:
            return batch
        rank = self.info.rank
        return batch.select(slice(rank * self.per_rank, (rank + 1) * self.per_rank))

    def step(self, signum: int, time_up: bool) -> StepOutcome:
        """One optimiser step on this step's batch; every rank learns the others' flags.

        Args:
            signum: a signal this process received (0: none).
            time_up: this process's time limit is up.

        Raises:
            TrainingDiverged: the loss is not finite (the update is not applied).
        """
        batch = self._shard(self.sample(STREAM_TRAIN, self.config.batch_size))
        with autocast(self.device, self.config.bf16):
            logits, state = self.wrapped(batch.inputs, self.state, lengths=batch.lengths)
        measures = self.task.measure(logits, batch)
        total, count = measures["loss"]
        acc = accumulator_dtype(self.device)
        global_count = all_reduce_sum(count.detach().sum().to(acc), self.info)
        # DDP averages the ranks' gradients: this is Σ total / Σ count over the global batch.
        loss = total.sum() / (global_count / self.info.world_size).to(total.dtype)
        flags = torch.tensor([0.0, float(signum), float(time_up)], dtype=acc, device=self.device)
        flags[0] = (~torch.isfinite(loss.detach())).to(acc)
        nonfinite, signum_any, time_up_any = all_reduce_max(flags, self.info).tolist()
        if nonfinite:
            raise TrainingDiverged(f"the loss is {loss.item()} at step {self.progress.step + 1}")
        self.apply_gradients(loss)
        self.scheduler.step()
        if self.task.stateful:
            self.state = detach_state(state)
        self.progress.step += 1
        self.window_steps += 1
        self.window_tokens += batch.inputs.shape[:2].numel() * self.info.world_size
        self.window.add(measures, None)
        return StepOutcome(int(signum_any), bool(time_up_any))

    def apply_gradients(self, loss: Tensor) -> Tensor:
        """One optimiser update on ``loss``: zero the gradients, back-propagate, clip the
        global norm to ``optim.grad_clip`` (if set), step. The schedule moves once per
        training step, in :meth:`step`.

        Returns:
            ``[]``: the gradients' global L2 norm before clipping.
        """
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.config.optim.grad_clip
        if clip is None:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            norm = nn.utils.get_total_norm(grads)
        else:
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        return norm.detach()

    def train_metrics(self, close: bool = True) -> dict[str, float]:
        """``train/loss``, ``train/{metric}``, ``train/lr``, ``perf/sequences_per_s`` and
        ``perf/tokens_per_s`` (input time steps) since the last call that closed the window
        (all ranks' sums over all ranks' counts), and ``perf/cpu_threads`` (the count now in
        force) with ``--cpu-threads auto``. ``close=False`` leaves the window open: the next
        call still covers these steps (a run's last record off the log grid, whose checkpoint
        keeps the window for a resume)."""
        window = self.window if close else copy.deepcopy(self.window)
        means = window.all_reduce(self.info).means()
        now = time.perf_counter()
        seconds = max(now - self.window_start, 1e-9)
        rate = self.window_steps * self.config.batch_size / seconds
        tokens_rate = self.window_tokens / seconds
        if close:
            self.window.reset()
            self.window_steps, self.window_start, self.window_tokens = 0, now, 0
        m = self.metric.name
        governor = self.thread_governor
        threads = {} if governor is None else {"perf/cpu_threads": float(governor.threads)}
        return threads | {
            "train/loss": means["loss"],
            f"train/{m}": means[m],
            **{f"train/{x.name}": means[x.name] for x in self.task.extra_metrics},
            "train/lr": self.scheduler.get_last_lr()[0],
            "perf/sequences_per_s": rate,
            "perf/tokens_per_s": tokens_rate,
        }

    def evaluate(self, on_grid: bool = True) -> dict[str, float]:
        """The held-out metrics and, for a task with ``fresh_batches``, this step's fresh batch
        (``eval/...``), and what the task's
        :meth:`~relmem.tasks.base.Task.after_evaluation` adds (a curriculum's level).

        A task with ``keep_best`` gets its best held-out weights copied to
        ``checkpoints/best`` whenever an evaluation improves on them. ``on_grid=False`` (an
        evaluation off the ``eval_every`` grid, when a time limit or the last step stops the
        run there) reports the
        best batch including this one without keeping it, and leaves the task's state and the
        'plateau' schedule as they were, so that a resumed run's later records equal an
        uninterrupted run's.
        """
        m, config = self.metric.name, self.config
        result = evaluate(self.model, self.task, self.held_out, info=self.info, bf16=config.bf16)
        metrics = {
            f"eval/{m}": result[m],
            "eval/loss": result["loss"],
            **{f"eval/{x.name}": result[x.name] for x in self.task.extra_metrics},
        }
        if self.task.fresh_batches:
            fresh = self.sample(STREAM_EVAL_BATCH, config.eval_batch)
            batch_value = evaluate(self.model, self.task, fresh, info=self.info, bf16=config.bf16)
            best = self.progress.best_batch
            if self.metric.improves(batch_value[m], best):
                best = batch_value[m]
            if on_grid:
                self.progress.best_batch = best
            metrics |= {f"eval/batch_{m}": batch_value[m], f"eval/best_batch_{m}": best}
        metrics |= {f"eval/{m}_group_{g}": v for g, v in result["groups"].items()}
        if on_grid:  # an evaluation off the grid feeds nothing (docs/runs.md §1)
            self.keep_if_best(result[m])
        if on_grid and config.optim.schedule == "plateau":
            self.plateau(result["loss"])
        if on_grid:
            return metrics | self.task.after_evaluation(metrics)
        state = copy.deepcopy(self.task.state_dict())
        metrics |= self.task.after_evaluation(metrics)
        self.task.load_state_dict(state)
        return metrics

    def save(self) -> None:
        """Checkpoint the weights and the training state (rank 0 writes; all ranks wait).

        Raises:
            TrainingDiverged: the weights are not finite.
        """
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise TrainingDiverged(f"the weights became non-finite by step {self.progress.step}")
        carried = [all_gather_rows(t, self.info).cpu() for t in _state_leaves(self.state)]
        window = all_reduce_sum(self.window.sums.clone(), self.info).cpu()
        ranks_rng = self._gather_rng_states()
        if self.info.is_main:
            progress, device = self.progress, self.device
            train_state = {
                "step": progress.step,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": {
                    "cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
                    "ranks": ranks_rng,
                },
                "elapsed_s": progress.elapsed(),
                f"best_batch_{self.metric.name}": progress.best_batch,
                "best_held_out": progress.best_held_out,
                "lr_scale": progress.lr_scale,
                "plateau_best": progress.plateau_best,
                "plateau_bad": progress.plateau_bad,
                "carried_state": carried,
                "train_window": window,
                "task_state": self.task.state_dict(),
                "task_name": self.task_name,
                "config": json.dumps(self.config_dict),
                "world_size": self.info.world_size,
            }
            ckpt_io.save_checkpoint(
                self.run_dir,
                progress.step,
                self.model,
                train_state,
                self.data_identity,
                keep=self.config.keep_checkpoints,
            )
        barrier(self.info)

    def release(self) -> None:
        """Release the run directory's lock (rank 0; idempotent, also after a failure)."""
        if self.lock is not None:
            self.lock.release()

    def plateau(self, loss: float) -> None:
        """The 'plateau' schedule's update after an evaluation with held-out ``loss``: more
        than ``plateau_patience`` evaluations without a relative improvement of 1e-4 multiply
        the rate by ``plateau_factor`` (from the next step on)."""
        p, o = self.progress, self.config.optim
        if math.isnan(p.plateau_best) or loss < p.plateau_best * (1 - 1e-4):
            p.plateau_best, p.plateau_bad = loss, 0
            return
        p.plateau_bad += 1
        if p.plateau_bad > o.plateau_patience:
            p.lr_scale *= o.plateau_factor
            p.plateau_bad = 0
            factor = self._lr_factor(p.step)
            for group, base in zip(
                self.optimizer.param_groups, self.scheduler.base_lrs, strict=True
            ):
                group["lr"] = base * factor

    def _lr_factor(self, step: int) -> float:
        """The factor on ``optim.lr`` at ``step``: the schedule's, times the 'plateau'
        reductions so far."""
        return lr_multiplier(step, self.config) * self.progress.lr_scale

    def keep_if_best(self, value: float) -> None:
        """For a task with ``keep_best``: if ``value``, the primary metric on the held-out
        set, beats the best so far, remember it and copy the weights to ``checkpoints/best``."""
        if self.task.keep_best and self.metric.improves(value, self.progress.best_held_out):
            self.progress.best_held_out = value
            self.save_best()

    def save_best(self) -> None:
        """Copy the weights to ``checkpoints/best`` (rank 0 writes; all ranks wait)."""
        if self.info.is_main:
            record = {
                "step": self.progress.step,
                f"held_out_{self.metric.name}": self.progress.best_held_out,
                "config": json.dumps(self.config_dict),  # what eval compares config.json with
            }
            ckpt_io.save_best(
                self.run_dir, self.progress.step, self.model, record, self.data_identity
            )
        barrier(self.info)

    def summary(
        self, status: str, last_eval: dict[str, float] | None, eval_step: int
    ) -> dict[str, Any]:
        """The contents of ``summary.json``."""
        m, progress = self.metric.name, self.progress
        return {
            "status": status,
            "task": self.task_name,
            "model": self.config.model,
            "parameters": count_parameters(self.model),
            "steps": progress.step,
            "target_steps": self.config.steps,
            "sequences_seen": progress.step * self.config.batch_size,
            "wall_time_s": progress.elapsed(),
            "device": str(self.device),
            "world_size": self.info.world_size,
            "held_out_size": self.held_out.size,
            "held_out_step": eval_step,
            "metric": m,
            f"held_out_{m}": None if last_eval is None else last_eval[f"eval/{m}"],
            "held_out_loss": None if last_eval is None else last_eval.get("eval/loss"),
            **{
                f"held_out_{x.name}": None if last_eval is None else last_eval[f"eval/{x.name}"]
                for x in self.task.extra_metrics
            },
            f"best_batch_{m}": None if math.isnan(progress.best_batch) else progress.best_batch,
            **(self._best_summary() if self.task.keep_best else {}),
            "run_dir": str(self.run_dir),
        }

    def _best_summary(self) -> dict[str, Any]:
        """The best held-out metric and where its weights are (None before any evaluation)."""
        best = self.progress.best_held_out
        path = ckpt_io.best_checkpoint(self.run_dir)
        return {
            f"best_held_out_{self.metric.name}": None if math.isnan(best) else best,
            "best_checkpoint": None if path is None else str(path),
        }

    def finish(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json``, close the loggers and print the outcome (rank 0)."""
        if self.logger is None:
            return
        write_json(self.run_dir / SUMMARY_FILE, summary)
        self.logger.close()
        self.release()
        value = summary[f"held_out_{self.metric.name}"]
        shown = "n/a" if value is None else self.metric.format(value)
        print(
            f"relmem: {summary['status']} after {self.progress.step} steps in "
            f"{self.progress.elapsed():.0f} s; held-out {self.metric.description} {shown}; "
            f"run directory: {self.run_dir}",
            flush=True,
        )
