"""Models for the training tasks: a registry of ``name -> builder``, classifiers and per-step
models for the RMC, the LSTM baseline and the DNC."""

from relmem.models import builders as _builders  # noqa: F401 - registers rmc, lstm, dnc
from relmem.models.classifier import (
    HeadConfig,
    LSTMClassifier,
    LSTMModelConfig,
    RMCClassifier,
    RMCModelConfig,
    count_parameters,
)
from relmem.models.dnc import DNCClassifier, DNCModelConfig, DNCPerStep
from relmem.models.per_step import LSTMPerStep, RMCPerStep
from relmem.models.registry import get_model, list_models, register_model

__all__ = [
    "DNCClassifier",
    "DNCModelConfig",
    "DNCPerStep",
    "HeadConfig",
    "LSTMClassifier",
    "LSTMModelConfig",
    "LSTMPerStep",
    "RMCClassifier",
    "RMCModelConfig",
    "RMCPerStep",
    "count_parameters",
    "get_model",
    "list_models",
    "register_model",
]
