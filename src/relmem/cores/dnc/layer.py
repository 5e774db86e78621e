"""MemoReader's memory controller as a drop-in sequence layer (``docs/dnc.md`` §12).

For token encodings ``d_1..d_T`` (width ``d_model``):

    x_t = pre_encoder(d)_t                  (d_t itself without a pre-encoder)
    z_t = [x_t ; r_{t−1}]
    h_t = RNN(z_t, h_{t−1})                 forward GRU/LSTM, hidden d_model; drives the memory
    r_t = DNCMemory(h_t)                    paper mode, one write head (docs/dnc.md §4–§9)
    v_t = W_h h_t + W_m flatten(r_t) + b    size d_model (2·d_model when bidirectional)
    o_t = ReLU(W_v v_t + b_v + d_t)         residual back to the layer input

With ``bidirectional=True`` (a library choice; MemoReader leaves it open) a backward GRU/LSTM
runs over the already computed ``z_{1..T}`` of each sequence, reversed within its length, and
its state enters only ``v_t`` (``W_h`` then sees ``[h_t ; h⃖_t]``), never the interface.
Everything beyond the MemoReader appendix's "Known" list is the library's choice.

Notation: B batch, T time, D ``d_model``, p ``memory_slots``, q ``word_size``, s
``read_heads``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from relmem.cores.base import finish_sequence, prepare_sequence, run_recomputed, where_active
from relmem.cores.dnc.addressing import EPSILON
from relmem.cores.dnc.controller import Controller, ControllerKind
from relmem.cores.dnc.dnc import (
    DNCState,
    check_step_input,
    fused_recurrence,
    fused_recurrence_ok,
)
from relmem.cores.dnc.memory import DNCMemory, Implementation, LinkKind, check_memory_options
from relmem.cores.gru import run_gru
from relmem.validation import allocation_errors, check_bool, check_factory, check_int


def reverse_within_lengths(x: Tensor, lengths: Tensor | None) -> Tensor:
    """Reverse each sequence of ``x [T, B, ...]`` over its first ``lengths[b]`` steps.

    Padded steps (``t >= lengths[b]``) stay where they are.
    """
    steps = x.shape[0]
    if lengths is None:
        return x.flip(0)
    t = torch.arange(steps, device=x.device).unsqueeze(1)  # [T, 1]
    index = torch.where(t < lengths, lengths - 1 - t, t)  # [T, B]
    index = index.view(steps, -1, *([1] * (x.dim() - 2))).expand_as(x)
    return torch.gather(x, 0, index)


class MemoryControllerLayer(nn.Module):
    """A DNC-style memory controller as a residual sequence layer ``[T, B, D] → [T, B, D]``.

    Args:
        d_model: D, the token encoding width (input and output).
        memory_slots: p (default 128). word_size: q (default 64). read_heads: s (default 4).
        controller: 'gru' (default) or 'lstm'; hidden size D.
        bidirectional: add a backward recurrent pass feeding only the output (default False).
        pre_encoder: optional module mapping ``[T, B, D]`` (``[B, T, D]`` with
            ``batch_first``) to the same shape, applied before the controller; the residual
            uses the raw input.
        batch_first: ``[B, T, D]`` input and output (default False, as ``nn.LSTM``).
        link: 'dense' (default), 'sparse' or 'none'; for documents of thousands of tokens keep
            p small, use 'sparse'/'none' (the dense link keeps O(T·B·p²) values for autograd)
            or set ``recompute_steps``.
        link_topk: K of the sparse link. interface_clip, eps, implementation: as
            :class:`DNCMemory` (by default the fused C++ memory step on the CPU).
        recompute_steps: None (default) keeps every step's intermediates for the backward; an
            integer runs the controller and memory in chunks of that many steps under
            activation checkpointing (:class:`relmem.DNC`'s option): one chunk's link states
            held instead of the document's, for about one more forward pass of the recurrence.
        device, dtype: factory arguments.

    Shapes:
        - input: ``[T, B, D]`` (``[B, T, D]`` with ``batch_first``) or a ``PackedSequence``.
        - lengths: optional ``[B]``; padded tokens write nothing, change no state, output 0.
        - output: same shape as the input.
        - state: :class:`DNCState` of the forward controller and memory, in and out; the
          backward direction (when enabled) has no carried state.
    """

    @allocation_errors
    def __init__(
        self,
        d_model: int,
        memory_slots: int = 128,
        word_size: int = 64,
        read_heads: int = 4,
        controller: ControllerKind = "gru",
        bidirectional: bool = False,
        pre_encoder: nn.Module | None = None,
        batch_first: bool = False,
        *,
        link: LinkKind = "dense",
        link_topk: int = 8,
        interface_clip: float = 0.0,
        eps: float = EPSILON,
        implementation: Implementation = "auto",
        recompute_steps: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_int("d_model", d_model, owner=name)
        self.recompute_steps = check_int(
            "recompute_steps", recompute_steps, owner=name, optional=True
        )
        memory_options: dict[str, Any] = {
            "memory_size": memory_slots,
            "word_size": word_size,
            "num_read_heads": read_heads,
            "num_write_heads": 1,
            "link": link,
            "link_topk": link_topk,
            "interface_clip": interface_clip,
            "eps": eps,
            "implementation": implementation,
        }
        # named in errors as the caller knows them, not as DNCMemory's memory_size, ...
        check_memory_options(
            name, memory_options, {"memory_size": "memory_slots", "num_read_heads": "read_heads"}
        )
        if pre_encoder is not None and not isinstance(pre_encoder, nn.Module):
            raise TypeError(
                f"{name}: pre_encoder must be None or an nn.Module, got "
                f"{type(pre_encoder).__name__}"
            )
        if controller not in ("gru", "lstm"):
            raise ValueError(f"{name}: controller must be 'gru' or 'lstm', got {controller!r}")
        factory = check_factory(device, dtype, owner=name)
        self.d_model = d_model
        self.bidirectional = check_bool("bidirectional", bidirectional, owner=name)
        self.batch_first = check_bool("batch_first", batch_first, owner=name)
        self.pre_encoder = pre_encoder
        self.memory = DNCMemory(d_model, **memory_options, **factory)
        self.controller = Controller(
            d_model + self.memory.read_size, d_model, 1, controller, **factory
        )
        self.backward_rnn: nn.RNNBase | None = None
        if bidirectional:
            rnn_type = nn.GRU if controller == "gru" else nn.LSTM
            self.backward_rnn = rnn_type(d_model + self.memory.read_size, d_model, **factory)
        directions = 2 if bidirectional else 1
        self.hidden_projection = nn.Linear(directions * d_model, directions * d_model, **factory)
        self.read_projection = nn.Linear(
            self.memory.read_size, directions * d_model, bias=False, **factory
        )
        self.output_projection = nn.Linear(directions * d_model, d_model, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default initialisation of every sub-layer (the pre-encoder is untouched)."""
        self.memory.reset_parameters()
        self.controller.reset_parameters()
        if self.backward_rnn is not None:
            self.backward_rnn.reset_parameters()
        for linear in (self.hidden_projection, self.read_projection, self.output_projection):
            linear.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, bidirectional={self.bidirectional}, "
            f"batch_first={self.batch_first}, recompute_steps={self.recompute_steps}"
        )

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DNCState:
        """All zeros: the memory of ``docs/dnc.md`` §1 and the forward controller's state."""
        memory = self.memory.initial_state(batch_size, device=device, dtype=dtype)
        controller = self.controller.initial_state(
            batch_size, device=memory.memory.device, dtype=memory.memory.dtype
        )
        return DNCState.combine(memory, controller)

    def check_state(self, state: Any, batch_size: int) -> DNCState:
        """Validate a user-given :class:`DNCState`."""
        name = type(self).__name__
        if not isinstance(state, DNCState):
            raise TypeError(f"{name}: state must be a DNCState, got {type(state).__name__}")
        memory = self.memory.check_state(state.memory_state, batch_size, owner=name)
        device, dtype = self.memory.factory_defaults()
        controller = self.controller.check_state(state.controller, batch_size, name, device, dtype)
        return DNCState.combine(memory, controller)

    def forward(
        self,
        input: Tensor | PackedSequence,
        state: DNCState | None = None,
        *,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor | PackedSequence, DNCState]:
        """Run the layer over a sequence.

        Args:
            input: ``[T, B, D]`` (``[B, T, D]`` with ``batch_first``) or a ``PackedSequence``.
            state: initial :class:`DNCState`; None means :meth:`initial_state`.
            lengths: optional ``[B]`` valid lengths.

        Returns:
            ``(output, final_state)``; output has the input's shape and layout.
        """
        name = type(self).__name__
        seq = prepare_sequence(input, lengths, self.batch_first, 3, name)
        d = seq.inputs  # [T, B, D]
        shown = tuple(input.shape) if isinstance(input, Tensor) else tuple(d.shape)
        if d.dim() != 3:
            raise ValueError(f"{name}: expected input of rank 3, got shape {shown}")
        device, dtype = self.memory.factory_defaults()
        check_step_input(
            name, d[0], self.d_model, device, dtype, size_name="d_model", sequence_shape=shown
        )
        steps, batch = d.shape[0], d.shape[1]
        state = self.initial_state(batch) if state is None else self.check_state(state, batch)
        x = d
        if self.pre_encoder is not None:
            encoded = self.pre_encoder(d.transpose(0, 1) if self.batch_first else d)
            if not isinstance(encoded, Tensor):
                raise TypeError(
                    f"{name}: pre_encoder must return one tensor of the input's shape, got "
                    f"{type(encoded).__name__} (nn.GRU and nn.LSTM return (output, state): "
                    "wrap such a module so that it returns the output alone)"
                )
            x = encoded.transpose(0, 1) if self.batch_first else encoded
            if x.shape != d.shape:
                raise ValueError(
                    f"{name}: pre_encoder must keep the shape {tuple(d.shape)} (time-major), "
                    f"got {tuple(x.shape)}"
                )

        fused = fused_recurrence_ok(self.memory, x, state)
        reads_before = state.read_vectors.flatten(1).unsqueeze(0)  # r_0

        def run(
            x: Tensor, state: DNCState, lengths: Tensor | None
        ) -> tuple[tuple[Tensor, Tensor], DNCState]:
            if fused:
                hiddens, reads, state = fused_recurrence(
                    self.memory, self.controller, x, state, lengths
                )
            else:
                hiddens, reads, state = self._reference_loop(x, state, lengths)
            return (hiddens, reads), state

        (hidden_seq, read_seq), state = run_recomputed(
            run, x, state, seq.lengths, self.recompute_steps
        )
        if self.backward_rnn is not None:  # only the backward direction reads z
            chi_seq = torch.cat([x, torch.cat([reads_before, read_seq[:-1]]).to(x.dtype)], dim=-1)
            reversed_z = reverse_within_lengths(chi_seq, seq.lengths)
            if fused and isinstance(self.backward_rnn, nn.GRU):  # the fused path throughout
                backward = run_gru(reversed_z, self.backward_rnn)  # [T, B, D]
            else:
                backward = self.backward_rnn(reversed_z)[0]
            hidden_seq = torch.cat(
                [hidden_seq, reverse_within_lengths(backward, seq.lengths)], dim=-1
            )  # [T, B, 2D]
        v = self.hidden_projection(hidden_seq) + self.read_projection(read_seq.to(hidden_seq.dtype))
        output = F.relu(self.output_projection(v) + d)  # [T, B, D]
        if seq.lengths is not None:
            valid = torch.arange(steps, device=d.device).unsqueeze(1) < seq.lengths  # [T, B]
            output = torch.where(valid.unsqueeze(-1), output, output.new_zeros(()))
        return finish_sequence(output, seq, self.batch_first), state

    def _reference_loop(
        self, x: Tensor, state: DNCState, lengths: Tensor | None
    ) -> tuple[Tensor, Tensor, DNCState]:
        """The step-by-step loop (the oracle of :func:`fused_recurrence`): hiddens
        ``[T, B, D]``, reads ``[T, B, s·q]`` and the final state."""
        steps = x.shape[0]
        hiddens, reads = [], []
        # every sequence is still running before its shortest length: no step needs masking
        all_active = steps if lengths is None else int(lengths.min())
        for t in range(steps):
            chi = torch.cat([x[t], state.read_vectors.flatten(1).to(x.dtype)], dim=-1)  # z_t
            hidden, controller = self.controller(chi, state.controller)  # [B, D]
            assert self.memory.interface is not None
            memory = self.memory.step(self.memory.interface(hidden), state.memory_state)
            new_state = DNCState.combine(memory, controller)
            if t >= all_active:
                assert lengths is not None  # all_active is steps without lengths
                new_state = where_active(lengths > t, new_state, state)
            state = new_state
            hiddens.append(hidden)
            reads.append(memory.read_vectors.flatten(1))
        return torch.stack(hiddens), torch.stack(reads), state
