"""The generic trainer: configs, checkpoints, metric logging, DDP plumbing and the loop.

This package's namespace holds what the tasks build on (configs and checkpoints), so that a
task module can write its presets without importing the trainer; the trainer itself is
:func:`relmem.train.loop.run` (it imports the tasks):

- :mod:`relmem.train.loop`: ``run(config, task_name)``, the cadence and the summary;
- :mod:`relmem.train.trainer`: set-up, one optimiser step, checkpoints;
- :mod:`relmem.train.evaluation`: held-out evaluation as (sum, count) totals;
- :mod:`relmem.train.runs`: run directories, written and read back.
"""

from relmem.train.checkpoint import CheckpointError, load_train_state, load_weights, save_checkpoint
from relmem.train.config import OptimConfig, TrainConfig, config_from_dict, config_to_dict

__all__ = [
    "CheckpointError",
    "OptimConfig",
    "TrainConfig",
    "config_from_dict",
    "config_to_dict",
    "load_train_state",
    "load_weights",
    "save_checkpoint",
]
