"""A model is ``encoder -> core -> head``: :class:`SequenceModel` and :func:`build_model`.

The task picks the encoder and the head (:class:`TaskSpec`), the run's config picks the core
(:mod:`relmem.models.registry`); every combination is the same module with the same call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from relmem.cores.base import zero_padding
from relmem.models.encoders import build_encoder
from relmem.models.heads import CoreReadout, HeadConfig, get_head
from relmem.models.registry import get_architecture, get_model, list_models
from relmem.models.seq2seq import Seq2SeqModel
from relmem.models.spec import TaskSpec

# Parameter names written by earlier releases, renamed on load so their checkpoints still load.
_LEGACY_PREFIXES = {"readout.": "head."}


class SequenceModel(nn.Module):
    """``encoder -> core -> head``, the one model shape of the trainer.

    Shapes:
        - inputs: ``[B, T, F]`` float (encoding 'features') or ``[B, T]`` int64 token ids.
        - state: the core's state (see :mod:`relmem.models.registry`); None: the initial one.
        - lengths: optional ``[B]`` int64 valid lengths in ``1..T`` of right-padded inputs; the
          padded values (NaN and inf included) change no output and no gradient.
        - returns ``(logits, state)``: ``logits [B, C]`` ('last' head) or ``[B, T, O]``
          (per-step heads); the state after each example's last valid step, not detached.
    """

    def __init__(self, encoder: nn.Module, core: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.core = core
        self.head = head
        self._register_load_state_dict_pre_hook(_rename_legacy_keys)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """The core's initial state for ``batch_size`` sequences."""
        return self.core.initial_state(batch_size, device=device)

    def forward(
        self, inputs: Tensor, state: Any = None, lengths: Tensor | None = None
    ) -> tuple[Tensor, Any]:
        if lengths is not None and inputs.is_floating_point():  # padding inert for the encoder
            inputs = zero_padding(inputs.transpose(0, 1), lengths.to(inputs.device)).transpose(0, 1)
        outputs, state = self.core(self.encoder(inputs), state, lengths=lengths)
        return self.head(outputs, lengths), state


def _rename_legacy_keys(state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
    for key in list(state_dict):
        for old, new in _LEGACY_PREFIXES.items():
            if key.startswith(prefix + old):
                state_dict[prefix + new + key[len(prefix + old) :]] = state_dict.pop(key)


def build_model(name: str, config: Any, head: HeadConfig, spec: TaskSpec) -> nn.Module:
    """The registered core ``name`` (with ``config``) between ``spec``'s encoder and head.

    A linear per-step head on a core that ends in a linear layer (``readout``) is folded into
    that layer, so the core emits the logits itself. A task with a ``spec.decoder`` gets a
    :class:`Seq2SeqModel` around the core (a second one for a separate decoder); one with a
    ``spec.architecture`` gets that registered shape with the core inside.
    """
    entry = get_model(name)
    if not isinstance(config, entry.config_cls):
        raise TypeError(
            f"model {name!r} takes a {entry.config_cls.__name__}, got {type(config).__name__}"
        )
    if spec.architecture is not None:
        return get_architecture(spec.architecture)(name, config, head, spec)
    if entry.architecture_only:
        raise ValueError(
            f"--model {name} is a choice of the reader (relmem train squad) only; this task "
            f"needs a core: {', '.join(list_models())}"
        )
    head_entry = get_head(spec.output)
    encoder = build_encoder(spec)
    if spec.decoder is not None:
        count = 2 if spec.decoder.separate_core else 1
        cores = [entry.build(config, encoder.output_size, None) for _ in range(count)]
        decoder_core = cores[1] if count == 2 else None
        return Seq2SeqModel(
            encoder,
            cores[0],
            head_entry.build(head, cores[0].output_size, spec),
            spec.seq_len,
            spec.decoder,
            decoder_core,
        )
    if head_entry.linear and entry.readout:
        core = entry.build(config, encoder.output_size, spec.output_size)
        return SequenceModel(encoder, core, CoreReadout())
    core = entry.build(config, encoder.output_size, None)
    head_module = head_entry.build(head, core.output_size, spec)
    if hasattr(head_module, "tie"):  # a decoder sharing the encoder's weight (a tied LM softmax)
        head_module.tie(encoder)
    return SequenceModel(encoder, core, head_module)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable scalars in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
