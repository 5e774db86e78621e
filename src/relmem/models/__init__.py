"""Models for the training tasks: ``encoder -> core -> head``.

- :mod:`~relmem.models.spec`: :class:`TaskSpec`, what a task asks of its models;
- :mod:`~relmem.models.registry`: the cores (``rmc``, ``lstm``, ``dnc``, ``convlstm``), a file each;
- :mod:`~relmem.models.encoders` and :mod:`~relmem.models.heads`: what a task may name;
- :mod:`~relmem.models.model`: :class:`SequenceModel` and :func:`build_model`;
- :mod:`~relmem.models.seq2seq`: :class:`Seq2SeqModel`, for tasks with a ``TaskSpec.decoder``.

Importing this package imports every module in it, so every core, encoding and head registers
itself (a new core's file needs no line here).
"""

import importlib
import pkgutil

from relmem.models.dnc import DNCModelConfig
from relmem.models.encoders import build_encoder, register_encoder
from relmem.models.heads import CoreReadout, HeadConfig, get_head, register_head
from relmem.models.lstm import LSTMCore, LSTMModelConfig
from relmem.models.model import SequenceModel, build_model, count_parameters
from relmem.models.registry import ModelEntry, get_model, list_models, register_model
from relmem.models.rmc import RMCModelConfig
from relmem.models.seq2seq import Seq2SeqModel
from relmem.models.spec import DecoderSpec, TaskSpec

__all__ = [
    "DNCModelConfig",
    "DecoderSpec",
    "HeadConfig",
    "LSTMCore",
    "LSTMModelConfig",
    "ModelEntry",
    "RMCModelConfig",
    "Seq2SeqModel",
    "SequenceModel",
    "TaskSpec",
    "CoreReadout",
    "build_encoder",
    "build_model",
    "count_parameters",
    "get_head",
    "get_model",
    "list_models",
    "register_encoder",
    "register_head",
    "register_model",
]


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
