"""The generic trainer: configs, loop, checkpoints, metric logging and DDP plumbing."""

from relmem.train.checkpoint import CheckpointError, load_train_state, load_weights, save_checkpoint
from relmem.train.config import OptimConfig, TrainConfig, config_from_dict, config_to_dict
from relmem.train.loop import RunResult, evaluate, run
from relmem.train.runs import load_run_config, load_trained

__all__ = [
    "CheckpointError",
    "OptimConfig",
    "RunResult",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "evaluate",
    "load_run_config",
    "load_train_state",
    "load_trained",
    "load_weights",
    "run",
    "save_checkpoint",
]
