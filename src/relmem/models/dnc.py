"""The DNC as a trainer core (``--model dnc``).

Its output layer ``y_t = W_y [h_t ; r_t] + b_y`` is linear, so a per-step linear head is folded
into it (``readout``): on copy tasks the DNC emits the target logits itself, as
``deepmind/dnc``'s does. Without a readout its output is ``hidden_size`` wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relmem.cores.dnc import DNC
from relmem.models.registry import register_model
from relmem.validation import check_at_least, check_choice


@dataclass
class DNCModelConfig:
    """DNC settings (see :class:`relmem.cores.dnc.DNC`). The sizes and ``clip_value`` default to
    ``deepmind/dnc`` ``train.py``'s repeat-copy model (``docs/dnc.md`` §14); ``compat`` defaults
    to 'paper' (Graves et al.'s activations and PyTorch's initialisation), so the default is a
    paper-mode DNC clipped at 20. ``compat='deepmind'`` gives deepmind's model entire.

    Attributes:
        hidden_size: Hc, units per LSTM controller layer.
        num_layers: L, controller layers (the Nth Farthest paper's DNC baseline uses 2).
        memory_size: N, memory slots.
        word_size: W, the width of a slot.
        num_read_heads: R.
        num_write_heads: Wh.
        clip_value: clip the controller output and state and the DNC output to ±value; 0
            disables it (deepmind: 20).
        compat: 'paper' (Graves et al. 2016) or 'deepmind' (``deepmind/dnc``'s interface
            activations, initialisation and forget bias; ``docs/dnc.md`` §3.3).
        recompute_steps: 0 (default) keeps every step's intermediates for the backward; n > 0
            trains in checkpointed chunks of n steps, recomputed in the backward: one chunk's
            memory instead of the sequence's, for about one more forward pass (the DNC's and
            the reader's memory controller's ``recompute_steps``; ``docs/dnc.md`` §17).
    """

    hidden_size: int = 64
    num_layers: int = 1
    memory_size: int = 16
    word_size: int = 16
    num_read_heads: int = 4
    num_write_heads: int = 1
    clip_value: float = 20.0
    compat: Literal["paper", "deepmind"] = "paper"
    recompute_steps: int = 0

    def __post_init__(self) -> None:
        check_at_least(
            "dnc.",
            self,
            hidden_size=1,
            num_layers=1,
            memory_size=1,
            word_size=1,
            num_read_heads=1,
            num_write_heads=1,
        )
        check_at_least("dnc.", self, clip_value=0, recompute_steps=0)
        check_choice("dnc.compat", self.compat, ("paper", "deepmind"))


@register_model("dnc", DNCModelConfig, readout=True)
def build_dnc(config: DNCModelConfig, input_size: int, readout_size: int | None) -> DNC:
    """A batch-first :class:`DNC`: ``[B, T, X] -> [B, T, Y]``, Y = ``readout_size`` or Hc."""
    return DNC(
        input_size,
        config.hidden_size,
        config.memory_size,
        config.word_size,
        config.num_read_heads,
        config.num_write_heads,
        batch_first=True,
        output_size=readout_size,
        num_layers=config.num_layers,
        compat=config.compat,
        clip_value=config.clip_value,
        recompute_steps=config.recompute_steps or None,
    )
