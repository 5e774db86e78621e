"""Typed training configuration: plain dataclasses, no CLI dependency.

:class:`TrainConfig` is generic in the task's config (``TrainConfig[NthFarthestConfig]``) and
holds one config per registered model (``rmc``, ``lstm``, ``dnc``: a field named after the
model, typed by its config class, added from the model registry when this module is imported,
so a new core needs no edit here); ``model`` picks which one is built.
The CLI (``relmem.commands.train``) parses these with tyro; :func:`config_to_dict` and
:func:`config_from_dict` give the ``config.json`` of every run directory, and reloading it
rejects unknown keys and wrong types.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from relmem.models import HeadConfig, get_model, list_models
from relmem.validation import check_at_least, check_choice, check_positive

TaskConfigT = TypeVar("TaskConfigT")


@dataclass
class OptimConfig:
    """The optimiser (Adam or RMSProp), optional gradient clipping and the learning-rate
    schedule.

    Attributes:
        optimizer: 'adam' (default), 'rmsprop' (``torch.optim.RMSprop``) or 'rmsprop-tf'
            (TensorFlow 1's RMSProp, :class:`~relmem.train.optimizers.TFRMSprop`: epsilon inside
            the square root, the mean square starting at ``initial_mean_square``; IMPALA's, for
            the RL ``paper`` presets, ``docs/rl.md`` §4.5).
        lr: peak learning rate (paper 1e-4).
        betas: Adam's (beta1, beta2).
        eps: the optimiser's epsilon (Adam's; 'rmsprop' adds it to the root of the mean
            square, 'rmsprop-tf' to the mean square under the root).
        eps_hat: Adam's ``eps`` is TensorFlow 1's "epsilon hat", added to ``sqrt(v)`` before
            the bias correction (:class:`~relmem.train.optimizers.AdamEpsHat`); the ``paper``
            presets translated from TF code set it.
        alpha: RMSProp's decay of the mean square (0.99).
        initial_mean_square: 'rmsprop-tf''s mean square before the first step (TF: 1).
        momentum: RMSProp's momentum (0).
        weight_decay: L2 penalty added by the optimiser (0 in the paper).
        schedule: 'constant' (default); 'paper', the Sonnet example's continuous decay
            ``max(lr * decay_rate ** (step / decay_steps), min_lr)`` (``docs/tasks.md`` §1.3);
            'cosine', half a cosine from ``lr`` at step 0 to ``min_lr`` at the run's last step
            (``steps``), ``min_lr + (lr - min_lr) * (1 + cos(pi * step / steps)) / 2``;
            'plateau', the rate multiplied by ``plateau_factor`` whenever the held-out loss
            has not improved (by a relative 1e-4) for more than ``plateau_patience``
            evaluations, as ``torch.optim.lr_scheduler.ReduceLROnPlateau`` does per epoch.
        decay_rate: the 'paper' schedule's factor per ``decay_steps`` steps (0.9).
        decay_steps: the 'paper' schedule's steps per factor ``decay_rate`` (10000).
        min_lr: the 'paper' schedule's floor (8e-5), and where 'cosine' ends.
        plateau_factor: the 'plateau' schedule's factor (0.5).
        plateau_patience: the 'plateau' schedule's evaluations without improvement (5).
        grad_clip: clip the global gradient norm to this value; None disables (paper).
        warmup_steps: the rate rises linearly from ``lr / warmup_steps`` at the first step to
            the schedule's rate at step ``warmup_steps``, for any schedule (0: no warm-up).
    """

    optimizer: Literal["adam", "rmsprop", "rmsprop-tf"] = "adam"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    eps_hat: bool = False
    alpha: float = 0.99
    initial_mean_square: float = 1.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    schedule: Literal["constant", "paper", "cosine", "plateau"] = "constant"
    decay_rate: float = 0.9
    decay_steps: int = 10000
    min_lr: float = 8e-5
    plateau_factor: float = 0.5
    plateau_patience: int = 5
    grad_clip: float | None = None
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        check_positive("optim.", self, "lr", "eps", "grad_clip")
        check_at_least("optim.", self, weight_decay=0, decay_steps=1, min_lr=0, warmup_steps=0)
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must lie in [0, 1), got {self.betas}")
        check_choice("optim.schedule", self.schedule, ("constant", "paper", "cosine", "plateau"))
        check_choice("optim.optimizer", self.optimizer, ("adam", "rmsprop", "rmsprop-tf"))
        if self.eps_hat and self.optimizer != "adam":
            raise ValueError(f"optim.eps_hat is Adam's; optim.optimizer is {self.optimizer!r}")
        check_at_least("optim.", self, initial_mean_square=0)
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"optim.alpha must lie in [0, 1), got {self.alpha}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"optim.momentum must lie in [0, 1), got {self.momentum}")
        check_at_least("optim.", self, plateau_patience=0)
        if not 0 < self.plateau_factor < 1:
            raise ValueError(f"optim.plateau_factor must lie in (0, 1), got {self.plateau_factor}")
        if not 0 < self.decay_rate <= 1:
            raise ValueError(f"optim.decay_rate must lie in (0, 1], got {self.decay_rate}")


@dataclass
class _RunConfig(Generic[TaskConfigT]):
    """Everything that defines a training run (:class:`TrainConfig` adds the models' fields).

    Attributes:
        task: the task's config dataclass (e.g. ``NthFarthestConfig``, ``RepeatCopyConfig``).
        model: the registered model to train (``list_models()``: 'convlstm', 'dnc', 'lstm', 'rmc').
        rmc, lstm, dnc, ...: one field per registered model, its config (used when
            ``model`` names it).
        head: the MLP head on the core's last output (last-step tasks; per-step tasks use a
            linear readout per step).
        optim: optimiser, schedule and clipping.
        steps: optimiser steps in total (a resumed run continues up to this count).
        batch_size: the global batch, with N data-parallel processes batch_size / N each (an
            RL task: the environments stepped together, each collecting one trajectory).
        seed: seeds the weights and the training data (a supervised task's batches are a
            function of (seed, step); an RL task's levels come from it).
        time_limit_min: stop (and checkpoint) after this many minutes of training in this
            invocation (a resume trains up to as long again); None: none.
        eval_every: steps between held-out evaluations (also at the end).
        eval_batch: the fresh batch for the paper's best-batch metric (``docs/tasks.md``
            §1.4: 1600); unused by tasks without fresh batches (a corpus, an RL game).
        log_every: steps between metric lines in metrics.jsonl / TensorBoard / stdout.
        checkpoint_every: steps between checkpoints (also at the end and on a signal).
        keep_checkpoints: how many complete checkpoints to keep (>= 2 keeps a fallback).
        device: 'auto' (cuda, then mps, then cpu), 'cpu', 'cuda' or 'mps'.
        cpu_threads: intra-op threads when training on the CPU (``torch.set_num_threads``);
            None keeps PyTorch's default of one per core; 'auto' measures step times and uses
            every core while that is faster than one thread, one thread otherwise
            (:mod:`relmem.train.threads`; not bit-reproducible). A fixed count of more than
            one loses badly when another process holds a core: every one of the step's many
            small parallel regions then waits for a descheduled thread.
        bf16: bfloat16 autocast for the forward pass (CUDA only).
        deterministic: ``torch.use_deterministic_algorithms(True)``.
        out_dir: parent of new run directories.
        run_name: the run directory's name under out_dir; None: ``{task}-{model}-{time}``.
        resume: a run directory (or one of its checkpoints) to continue; a run that never
            completed a checkpoint (killed before its first) trains again from step 0.
        tensorboard: also write TensorBoard event files under ``RUN_DIR/tb``.
    """

    task: TaskConfigT
    model: str = "rmc"
    head: HeadConfig = field(default_factory=HeadConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    steps: int = 10000
    batch_size: int = 1600
    seed: int = 0
    time_limit_min: float | None = None
    eval_every: int = 500
    eval_batch: int = 1600
    log_every: int = 50
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    cpu_threads: int | Literal["auto"] | None = None
    bf16: bool = False
    deterministic: bool = False
    out_dir: Path = Path("runs")
    run_name: str | None = None
    resume: Path | None = None
    tensorboard: bool = True

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.resume is not None:
            self.resume = Path(self.resume)
        if self.model not in list_models(every=True):
            known = ", ".join(list_models(every=True))
            raise ValueError(f"model must be one of {known}; got {self.model!r}")
        counts = ("steps", "batch_size", "eval_every", "eval_batch", "log_every")
        counts += ("checkpoint_every", "keep_checkpoints")
        if isinstance(self.cpu_threads, str):
            check_choice("cpu_threads", self.cpu_threads, ("auto",))
        else:
            counts += ("cpu_threads",)
        check_at_least("", self, **dict.fromkeys(counts, 1))
        check_positive("", self, "time_limit_min")
        check_choice("device", self.device, ("auto", "cpu", "cuda", "mps"))
        if isinstance(self.seed, bool) or not -(2**63) <= self.seed < 2**64:
            raise ValueError(
                f"seed must lie in -2**63..2**64 - 1 (torch.manual_seed's range), got {self.seed}"
            )
        name = self.run_name
        if name is not None and (name in ("", ".", "..") or Path(name).name != name):
            raise ValueError(
                f"run_name must be a directory name under out_dir (not empty, no '/', not '.' "
                f"or '..'), got {name!r}"
            )

    def model_config(self) -> Any:
        """The config of the selected model (``getattr(self, self.model)``)."""
        return getattr(self, self.model)


TrainConfig = dataclasses.make_dataclass(
    "TrainConfig",
    [
        (name, get_model(name).config_cls, field(default_factory=get_model(name).config_cls))
        for name in list_models(every=True)
    ],
    bases=(_RunConfig[TaskConfigT],),
    namespace={"__module__": __name__},
)
TrainConfig.__doc__ = _RunConfig.__doc__


# What a resumed run keeps from its config: where it lives, and its model (the model's own
# section too, but for the choice of implementation, which computes the same function).
RUN_PLACE = ("out_dir", "run_name")
FIXED_ON_RESUME = (*RUN_PLACE, "model", "head")
FREE_MODEL_FIELDS = ("implementation",)


def fixed_difference(
    run: dict[str, Any], other: dict[str, Any], *, place: bool = True
) -> tuple[str, Any, Any] | None:
    """The first option a resumed run keeps (:data:`FIXED_ON_RESUME`, the model's section)
    that differs between two configs as :func:`config_to_dict` gives them: ``(option, run's
    value, other's value)``, the option dotted (``rmc.mem_slots``); None when none does.
    ``place=False`` compares the model alone (a run directory may have been moved)."""
    names = FIXED_ON_RESUME if place else tuple(n for n in FIXED_ON_RESUME if n not in RUN_PLACE)
    for name in (*names, run["model"]):
        before, after = run.get(name), other.get(name)
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):  # name the field
            changed = [k for k in before if before[k] != after.get(k)]
            changed = [k for k in changed if k not in FREE_MODEL_FIELDS]
            if not changed:
                continue
            return f"{name}.{changed[0]}", before[changed[0]], after.get(changed[0])
        return name, before, after
    return None


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass; paths become strings."""

    def convert(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        return value

    return convert(dataclasses.asdict(config))


def _convert(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError(f"{where}: {value!r} matches none of {annotation}: {'; '.join(errors)}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {args}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where}: expected a list, got {value!r}")
        item_types = [args[0]] * len(value) if len(args) == 2 and args[1] is ... else list(args)
        if len(item_types) != len(value):
            raise ValueError(f"{where}: expected {len(item_types)} items, got {value!r}")
        pairs = enumerate(zip(value, item_types, strict=True))
        return tuple(_convert(v, t, f"{where}[{i}]") for i, (v, t) in pairs)
    if dataclasses.is_dataclass(annotation):
        return config_from_dict(annotation, value, where)
    if annotation is Path:
        if not isinstance(value, str):
            raise TypeError(f"{where}: expected a path string, got {value!r}")
        return Path(value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool):
        if type(value) is not annotation:
            raise TypeError(f"{where}: expected {annotation.__name__}, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported config type {annotation}")


def config_from_dict(cls: Any, data: dict[str, Any], where: str = "config") -> Any:
    """Rebuild a config dataclass from :func:`config_to_dict`'s output, strictly. A key the
    dataclass lists in its ``OLDER_CONFIGS_MEANT`` (a field added after configs were written,
    whose default is not what leaving it out meant then) and ``data`` lacks takes the value
    given there, so a run written before the field existed reads and resumes as it ran.

    Args:
        cls: the dataclass, possibly parametrised (``TrainConfig[NthFarthestConfig]``).
        data: the dict.
        where: the key path, for error messages.

    Raises:
        ValueError / TypeError naming the offending key on unknown keys or wrong types.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected an object, got {data!r}")
    origin = typing.get_origin(cls) or cls
    hints = typing.get_type_hints(origin)
    params = getattr(origin, "__parameters__", ())
    substitution = dict(zip(params, typing.get_args(cls), strict=False))
    names = {f.name for f in dataclasses.fields(origin)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; expected some of {sorted(names)}")
    kwargs = {
        name: value
        for name, value in getattr(origin, "OLDER_CONFIGS_MEANT", {}).items()
        if name not in data
    }
    for name, value in data.items():
        annotation = substitution.get(hints[name], hints[name])
        kwargs[name] = _convert(value, annotation, f"{where}.{name}")
    return origin(**kwargs)
