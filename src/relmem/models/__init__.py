"""Models for the training tasks: a registry of ``name -> builder`` and the classifiers."""

from relmem.models.classifier import (
    HeadConfig,
    LSTMClassifier,
    LSTMModelConfig,
    RMCClassifier,
    RMCModelConfig,
    count_parameters,
)
from relmem.models.registry import get_model, list_models, register_model

__all__ = [
    "HeadConfig",
    "LSTMClassifier",
    "LSTMModelConfig",
    "RMCClassifier",
    "RMCModelConfig",
    "count_parameters",
    "get_model",
    "list_models",
    "register_model",
]
