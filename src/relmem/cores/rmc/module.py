"""The Relational Memory Core's modules: they own the parameters and pick the implementation.

:class:`RelationalMemoryCell` (one step) and :class:`RelationalMemory` (a sequence, shaped like
``nn.LSTM``) take :class:`RMCConfig`'s arguments (or a config, :meth:`from_config`), run the
reference step of :mod:`relmem.cores.rmc.reference` or the fast path of
:mod:`relmem.cores.rmc.fast`, and validate inputs and states. :class:`FastRelationalMemory`
wraps a :class:`RelationalMemory` with the fast path's opt-in accelerations.
``'auto'`` runs the fused step where it can run (:func:`relmem.cores.rmc.fused.auto_fused`);
:func:`prefer_fused` is the trainer's stricter choice for cores left on ``'auto'``: built before
the first step, said in the log, and an error rather than the fast path if a step cannot run it.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import MISSING, fields
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from relmem.cores.base import (
    SequenceInput,
    check_state_tensor,
    finish_sequence,
    prepare_sequence,
    run_cell_loop,
)
from relmem.cores.rmc.config import (
    Implementation,
    RMCConfig,
    RMCState,
    RMCStepDetails,
    check_implementation,
    config_arguments_doc,
)
from relmem.cores.rmc.fast import (
    BlockWeights,
    RMCWeights,
    StepFn,
    fast_cell_step,
    fast_sequence,
    recurrent_step,
)
from relmem.cores.rmc.fused import load_fused_ops, step_for
from relmem.cores.rmc.reference import AttentionBlock, AttentionMLP, reference_step
from relmem.validation import (
    allocation_errors,
    check_bool,
    check_device,
    check_factory,
    check_int,
)

_ARGUMENTS_MARKER = "        <RMCConfig arguments>\n"
_POSITIONAL_UNTIL = "input_rows"  # RMCConfig's fields up to this one may be given positionally


def _constructor_signature(*extras: inspect.Parameter) -> inspect.Signature:
    """``(self, <RMCConfig's fields>, *extras)``: ``input_size`` to ``input_rows`` positional,
    then the positional ``extras``, then the other fields and the keyword-only ``extras``."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    kind: inspect._ParameterKind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    for field in fields(RMCConfig):
        default = inspect.Parameter.empty if field.default is MISSING else field.default
        params.append(inspect.Parameter(field.name, kind, default=default, annotation=field.type))
        if field.name == _POSITIONAL_UNTIL:
            params += [p for p in extras if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
            kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(params + [p for p in extras if p.kind is kind])


def _keyword(name: str, default: Any, annotation: str) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


_FACTORY = (
    _keyword("implementation", "auto", "Implementation"),
    _keyword("device", None, "torch.device | str | None"),
    _keyword("dtype", None, "torch.dtype | None"),
)


def _bind(signature: inspect.Signature, args: tuple, kwargs: dict) -> tuple[RMCConfig, dict]:
    """Bind a constructor call to ``signature``: ``(config, the other arguments by name)``."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    del values["self"]
    config = RMCConfig(**{field.name: values.pop(field.name) for field in fields(RMCConfig)})
    return config, values


def _document_arguments(cls: type) -> type:
    """Replace the ``<RMCConfig arguments>`` line of ``cls``'s docstring with RMCConfig's."""
    assert cls.__doc__ is not None and _ARGUMENTS_MARKER in cls.__doc__
    cls.__doc__ = cls.__doc__.replace(_ARGUMENTS_MARKER, config_arguments_doc() + "\n")
    return cls


def _truncated_normal_(weight: Tensor, fan_in: int) -> None:
    """Sonnet's initialiser: N(0, 1/fan_in) re-drawn outside ±2σ (``docs/rmc.md`` §7)."""
    std = 1.0 / math.sqrt(fan_in)
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2 * std, b=2 * std)


@_document_arguments
class RelationalMemoryCell(nn.Module):
    """One time step of the Relational Memory Core (``docs/rmc.md`` §4).

    The memory is a matrix of N slots of width M = H·D. At each step the input is projected to
    M features, appended to the memory as extra rows, and ``num_blocks`` times the rows attend
    to each other with multi-head dot-product attention (joint LayerNorm over q, k and v; scale
    K^-1/2; no output projection), then pass a residual LayerNorm, a shared row-wise MLP and a
    second residual LayerNorm. The updated memory rows are blended with the old memory through
    LSTM-style input and forget gates.

    The arguments are :class:`RMCConfig`'s (``input_size`` to ``input_rows`` may be given
    positionally) and three keyword-only ones; :meth:`from_config` builds a cell from a config.

    Args:
        <RMCConfig arguments>
        implementation: 'reference' (the plain step of ``docs/rmc.md`` §4), 'fast' (the same
            function with the exact rewrites of ``docs/rmc.md`` §10 that apply to one step: E4,
            E5, E6, E7; see :mod:`relmem.cores.rmc.fast`), 'fused' (the fast step with its small
            ops joined in C++ operators, CPU only, compiled on first use; see
            :mod:`relmem.cores.rmc.fused`) or 'auto' (default: 'fused' on float32 and float64
            CPU input, built on the first call, 'fast' elsewhere and where the build fails;
            ``return_details=True`` needs every row's attention weights and always runs the
            reference).
        device, dtype: factory arguments for every parameter.

    Shapes:
        - input: ``[B, F]`` (vector mode; trailing dims are flattened) or ``[B, n, F]``.
        - state: :class:`RMCState` with ``memory [B, N, M]`` (and ``hidden [B, N, M]`` with
          ``output_gate=True``); None means :meth:`initial_state`.
        - output: ``[B, N·M]``, the new memory (or hidden) flattened row-major.
    """

    _signature = _constructor_signature(*_FACTORY)

    @allocation_errors
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        config, options = _bind(self._signature, (self, *args), kwargs)
        self.config = config
        self.implementation = check_implementation(type(self).__name__, options["implementation"])
        factory = check_factory(options["device"], options["dtype"], owner=type(self).__name__)
        m, n = config.mem_size, config.num_input_rows
        self.input_projection = nn.Linear(config.input_size, m, **factory)
        self.blocks = nn.ModuleList(
            AttentionBlock(config, **factory) for _ in range(config.num_blocks)
        )
        num_mlps = 1 if config.share_attention_mlp else config.num_blocks
        self.mlps = nn.ModuleList(
            AttentionMLP(m, config.attention_mlp_layers, **factory) for _ in range(num_mlps)
        )
        self.input_gate: nn.Linear | None = None
        self.memory_gate: nn.Linear | None = None
        if config.gate_style is not None:
            width = config.num_gates * config.gate_size
            self.input_gate = nn.Linear(n * m, width, **factory)
            self.memory_gate = nn.Linear(m, width, **factory)
        self.gate_biases: nn.Parameter | None = None
        if config.trainable_gate_biases:
            self.gate_biases = nn.Parameter(torch.empty(config.num_gates, **factory))
        self.reset_parameters()

    __init__.__signature__ = _signature  # type: ignore[attr-defined]

    @classmethod
    def from_config(
        cls,
        config: RMCConfig,
        *,
        implementation: Implementation = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RelationalMemoryCell:
        """A cell with ``config``'s hyper-parameters (the other arguments as in the class)."""
        return cls(**config.to_dict(), implementation=implementation, device=device, dtype=dtype)

    # ------------------------------------------------------------------ parameters

    def reset_parameters(self) -> None:
        """Sonnet's initialisation (``docs/rmc.md`` §7): truncated normal weights, zero biases,
        LN γ=1, β=0."""
        blocks = cast("Iterable[AttentionBlock]", self.blocks)
        mlps = cast("Iterable[AttentionMLP]", self.mlps)
        linears = [self.input_projection, *(b.qkv for b in blocks)]
        linears += [layer for mlp in mlps for layer in cast("Iterable[nn.Linear]", mlp.layers)]
        linears += [g for g in (self.input_gate, self.memory_gate) if g is not None]
        for linear in linears:
            _truncated_normal_(linear.weight, linear.in_features)
            nn.init.zeros_(linear.bias)
        for block in blocks:
            for norm in (block.qkv_norm, block.attention_norm, block.mlp_norm):
                norm.reset_parameters()
        if self.gate_biases is not None:
            with torch.no_grad():
                biases = self.gate_biases
                # Build the constants in the parameter's dtype: torch.tensor(list of floats)
                # would round them to float32 first, even for a float64 module.
                biases.copy_(
                    torch.tensor(
                        self.config.gate_bias_constants, dtype=biases.dtype, device=biases.device
                    )
                )

    def mlp_for_block(self, index: int) -> AttentionMLP:
        """The MLP used by block ``index`` (the shared one unless ``share_attention_mlp=False``)."""
        return cast(AttentionMLP, self.mlps[0 if self.config.share_attention_mlp else index])

    def fast_weights(self) -> RMCWeights:
        """The parameters as the tensors the fast path reads (no copies: they keep autograd).

        Returns:
            :class:`RMCWeights`: the input projection ``[M, F]``, per block its qkv ``[Q, M]``,
            three LayerNorms and MLP layers ``[M, M]`` (a shared MLP in every block), the gate
            weights ``[W, n·M]`` and ``[W, M]`` with their biases, and the trainable gate
            biases ``[num_gates]`` (None when constant).
        """
        blocks = tuple(
            BlockWeights(
                block.qkv.weight,
                block.qkv.bias,
                (block.qkv_norm.weight, block.qkv_norm.bias),
                (block.attention_norm.weight, block.attention_norm.bias),
                (block.mlp_norm.weight, block.mlp_norm.bias),
                tuple(
                    (layer.weight, layer.bias)
                    for layer in cast("Iterable[nn.Linear]", self.mlp_for_block(index).layers)
                ),
            )
            for index, block in enumerate(cast("Iterable[AttentionBlock]", self.blocks))
        )
        input_gate, memory_gate = self.input_gate, self.memory_gate
        return RMCWeights(
            self.input_projection.weight,
            self.input_projection.bias,
            blocks,
            None if input_gate is None else input_gate.weight,
            None if input_gate is None else input_gate.bias,
            None if memory_gate is None else memory_gate.weight,
            None if memory_gate is None else memory_gate.bias,
            self.gate_biases,
        )

    @property
    def state_size(self) -> torch.Size:
        """``[N, M]``, the per-example memory shape."""
        return torch.Size([self.config.mem_slots, self.config.mem_size])

    @property
    def output_size(self) -> int:
        """N·M."""
        return self.config.output_size

    def extra_repr(self) -> str:
        cfg = self.config
        return (
            f"input_size={cfg.input_size}, mem_slots={cfg.mem_slots}, head_size={cfg.head_size}, "
            f"num_heads={cfg.num_heads}, num_blocks={cfg.num_blocks}, gate_style={cfg.gate_style!r}"
            f", key_size={cfg.resolved_key_size}, input_rows={cfg.input_rows}"
        )

    # ------------------------------------------------------------------ state

    def _factory_defaults(self) -> tuple[torch.device, torch.dtype]:
        weight = self.input_projection.weight
        return weight.device, weight.dtype

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RMCState:
        """The identity initial memory of ``docs/rmc.md`` §3.

        ``m0[b, i, j] = 1 if i == j else 0`` for i < N, j < M: the N×N identity padded with zero
        columns when M > N, or cut to M columns when M < N. With ``output_gate=True`` the hidden
        state starts as ``tanh(m0)``.

        Args:
            batch_size: B.
            device, dtype: default to the module's parameters'.

        Returns:
            :class:`RMCState` with ``memory [B, N, M]`` (constant, no gradient).
        """
        batch_size = check_int(
            "batch_size", batch_size, owner=f"{type(self).__name__}.initial_state"
        )
        default_device, default_dtype = self._factory_defaults()
        owner = f"{type(self).__name__}.initial_state"
        device = default_device if device is None else check_device(device, owner=owner)
        dtype = default_dtype if dtype is None else dtype
        n, m = self.config.mem_slots, self.config.mem_size
        memory = torch.eye(n, m, device=device, dtype=dtype).expand(batch_size, n, m).clone()
        hidden = torch.tanh(memory) if self.config.output_gate else None
        return RMCState(memory, hidden)

    def check_state(self, state: Any, batch_size: int) -> RMCState:
        """Validate a user-given state and return it as an :class:`RMCState`."""
        name = type(self).__name__
        if isinstance(state, Tensor):
            state = RMCState(state)
        if not isinstance(state, tuple) or len(state) not in (1, 2):
            raise TypeError(
                f"{name}: state must be an RMCState (or a memory tensor [B, N, M]), "
                f"got {type(state).__name__}"
            )
        state = RMCState(*state)
        device, dtype = self._factory_defaults()
        shape = (batch_size, *self.state_size)
        check_state_tensor(name, "memory", state.memory, shape, dtype, device)
        if self.config.output_gate:
            if state.hidden is None:
                raise ValueError(
                    f"{name}: output_gate=True needs state.hidden [B, N, M]; start from "
                    "initial_state(batch_size) to get one"
                )
            check_state_tensor(name, "hidden", state.hidden, shape, dtype, device)
        elif state.hidden is not None:
            raise ValueError(
                f"{name}: state.hidden must be None unless output_gate=True; got a tensor"
            )
        return state

    # ------------------------------------------------------------------ input

    def check_step_input(self, input: Tensor, *, caller: str | None = None) -> Tensor:
        """Validate one step's input; return it as ``[B, n, F]`` (n = 1 in vector mode).

        Args:
            input: ``[B, F]`` / ``[B, n, F]``, trailing dims flattened.
            caller: the name used in error messages (default: this class's).
        """
        name = caller or type(self).__name__
        cfg = self.config
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
        if cfg.input_rows is None:
            if input.dim() < 2:
                raise ValueError(
                    f"{name}: vector mode expects input [B, F] with F={cfg.input_size} (trailing "
                    f"dims are flattened), got shape {tuple(input.shape)}"
                )
            rows = input.reshape(input.shape[0], 1, -1)
            got = f"{math.prod(input.shape[1:])} features (shape {tuple(input.shape)})"
        else:
            if input.dim() < 3 or input.shape[1] != cfg.input_rows:
                raise ValueError(
                    f"{name}: matrix mode expects input [B, n={cfg.input_rows}, F={cfg.input_size}]"
                    f" (dims after n are flattened), got shape {tuple(input.shape)}"
                )
            rows = input.reshape(input.shape[0], input.shape[1], -1)
            got = f"{rows.shape[-1]} features per row (shape {tuple(input.shape)})"
        if rows.shape[-1] != cfg.input_size:
            raise ValueError(f"{name}: expected input_size={cfg.input_size}, got {got}")
        device, dtype = self._factory_defaults()
        if not input.is_floating_point():
            raise TypeError(
                f"{name}: input must be a floating-point tensor, got {input.dtype}; "
                "convert integer tokens with an embedding or one-hot first"
            )
        if input.dtype != dtype and not torch.is_autocast_enabled(device.type):
            raise TypeError(
                f"{name}: input dtype {input.dtype} differs from the parameters' {dtype}; "
                f"convert the input with .to({dtype}) or the module with .to(dtype)"
            )
        if input.device != device:
            raise ValueError(
                f"{name}: input is on {input.device} but the module is on {device}; move one of "
                "them with .to(device)"
            )
        return rows

    # ------------------------------------------------------------------ the step

    def step(self, rows: Tensor, state: RMCState) -> tuple[Tensor, RMCState, RMCStepDetails]:
        """The reference step on validated inputs (:func:`reference_step`,
        ``docs/rmc.md`` §4.1–§4.7).

        Args:
            rows: ``[B, n, F]`` the step input, already validated.
            state: validated :class:`RMCState`.

        Returns:
            ``(output [B, N·M], new state, details)``.
        """
        return reference_step(self, rows, state)

    def forward(
        self,
        input: Tensor,
        state: RMCState | Tensor | None = None,
        *,
        return_details: bool = False,
    ) -> tuple[Tensor, RMCState] | tuple[Tensor, RMCState, RMCStepDetails]:
        """Run one time step.

        Args:
            input: ``[B, F]`` (vector mode) or ``[B, n, F]`` (matrix mode).
            state: :class:`RMCState` (or a ``[B, N, M]`` memory tensor); None starts from
                :meth:`initial_state` on the parameters' device and dtype.
            return_details: also return :class:`RMCStepDetails` (gates and attention weights).

        Returns:
            ``(output [B, N·M], new_state)``, plus the details when requested.
        """
        rows = self.check_step_input(input)
        if state is None:
            state = self.initial_state(rows.shape[0])
        else:
            state = self.check_state(state, rows.shape[0])
        if return_details or self.implementation == "reference":
            output, new_state, details = self.step(rows, state)
            return (output, new_state, details) if return_details else (output, new_state)
        sequence_fn = step_for(self.implementation, rows)
        return fast_cell_step(self.config, self.fast_weights(), rows, state, sequence_fn)


@_document_arguments
class RelationalMemory(nn.Module):
    """A Relational Memory Core over a whole sequence, shaped like ``nn.LSTM``.

    It runs :class:`RelationalMemoryCell` (available as ``.cell``) at every time step. The
    arguments are the cell's plus ``batch_first``, which may also be given positionally after
    ``input_rows``; :meth:`from_config` builds the core from an :class:`RMCConfig`.

    Args:
        <RMCConfig arguments>
        batch_first: input and output are ``[B, T, ...]`` instead of ``[T, B, ...]``
            (default False, as ``nn.LSTM``). The state is batch-leading either way.
        implementation: 'reference' (the plain time loop over ``cell.step``, the test oracle),
            'fast' (:func:`relmem.cores.rmc.fast.fast_sequence`: input-only work hoisted out of
            the loop and the step rewritten with the exact equivalences of ``docs/rmc.md`` §10;
            every option is supported), 'fused' (the same in C++: each hoisting chunk of steps
            as one operator with its own backward, GEMMs included; CPU only, compiled on first
            use, every option; :mod:`relmem.cores.rmc.fused`) or 'auto' (default: 'fused'
            where it runs, float32 and float64 on the CPU outside autocast and tracing, built
            on the first call, and 'fast' elsewhere; both match the reference to float
            rounding). bf16,
            ``torch.compile`` and CUDA graphs are opt-in through :class:`FastRelationalMemory`.
        device, dtype: factory arguments for every parameter.

    Shapes:
        - input: ``[T, B, F]`` (vector mode) or ``[T, B, n, F]`` (matrix mode), time and batch
          swapped with ``batch_first=True``; or a ``PackedSequence``.
        - state: :class:`RMCState` with ``memory [B, N, M]``; None means the identity state.
        - lengths: optional ``[B]`` integers in ``0..T``. After step ``lengths[b] - 1`` example
          b's state is frozen and its outputs are zero.
        - output: ``[T, B, N·M]`` (``[B, T, N·M]`` with ``batch_first``), or a
          ``PackedSequence`` when the input was one.
        - returned state: the state after each example's last valid step.
    """

    _signature = _constructor_signature(
        inspect.Parameter(
            "batch_first", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False, annotation="bool"
        ),
        *_FACTORY,
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        config, options = _bind(self._signature, (self, *args), kwargs)
        self.batch_first = check_bool(
            "batch_first", options["batch_first"], owner="RelationalMemory"
        )
        implementation = options["implementation"]
        self.implementation = check_implementation(type(self).__name__, implementation)
        self.cell = RelationalMemoryCell.from_config(
            config, implementation=implementation, device=options["device"], dtype=options["dtype"]
        )

    __init__.__signature__ = _signature  # type: ignore[attr-defined]

    @classmethod
    def from_config(
        cls,
        config: RMCConfig,
        *,
        batch_first: bool = False,
        implementation: Implementation = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RelationalMemory:
        """A core with ``config``'s hyper-parameters (the other arguments as in the class).

        Example::

            core = RelationalMemory.from_config(RMCConfig(16, 4, 32, 4), batch_first=True)
        """
        return cls(
            **config.to_dict(),
            batch_first=batch_first,
            implementation=implementation,
            device=device,
            dtype=dtype,
        )

    @property
    def config(self) -> RMCConfig:
        return self.cell.config

    @property
    def state_size(self) -> torch.Size:
        return self.cell.state_size

    @property
    def output_size(self) -> int:
        return self.cell.output_size

    def reset_parameters(self) -> None:
        """Re-draw every parameter with Sonnet's initialisation."""
        self.cell.reset_parameters()

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RMCState:
        """See :meth:`RelationalMemoryCell.initial_state`."""
        return self.cell.initial_state(batch_size, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"batch_first={self.batch_first}, implementation={self.implementation!r}"

    def prepare(
        self,
        input: Tensor | PackedSequence,
        state: RMCState | Tensor | None,
        lengths: Tensor | Sequence[int] | None,
    ) -> tuple[SequenceInput, Tensor, RMCState]:
        """Validate a sequence call's arguments.

        Returns:
            ``(sequence, rows [T, B, n, F], state)`` with the state validated or initial.
        """
        cell = self.cell
        min_rank = 3 if cell.config.input_rows is None else 4
        seq = prepare_sequence(input, lengths, self.batch_first, min_rank, type(self).__name__)
        steps, batch = seq.inputs.shape[:2]
        caller = f"{type(self).__name__} (each time step of the input)"
        first = cell.check_step_input(seq.inputs[0], caller=caller)  # [B, n, F]
        rows = seq.inputs.reshape(steps, batch, *first.shape[1:])  # [T, B, n, F]
        state = cell.initial_state(batch) if state is None else cell.check_state(state, batch)
        return seq, rows, state

    def forward(
        self,
        input: Tensor | PackedSequence,
        state: RMCState | Tensor | None = None,
        *,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor | PackedSequence, RMCState]:
        """Run the core over a sequence.

        Args:
            input: ``[T, B, F]`` / ``[T, B, n, F]`` (batch-first if configured), or a
                ``PackedSequence``.
            state: initial :class:`RMCState`; None means :meth:`initial_state`.
            lengths: optional ``[B]`` valid lengths in ``0..T``.

        Returns:
            ``(output [T, B, N·M], final_state)`` in the input's layout.
        """
        cell = self.cell
        seq, rows, state = self.prepare(input, state, lengths)
        if self.implementation != "reference":
            sequence_fn = step_for(self.implementation, rows)
            weights = cell.fast_weights()
            outputs, final_state = fast_sequence(
                cell.config, weights, rows, state, seq.lengths, sequence_fn=sequence_fn
            )
            return finish_sequence(outputs, seq, self.batch_first), final_state

        def step(rows_t: Tensor, state_t: RMCState) -> tuple[Tensor, RMCState]:
            output, new_state, _ = cell.step(rows_t, state_t)
            return output, new_state

        outputs, final_state = run_cell_loop(step, rows, state, seq.lengths)
        return finish_sequence(outputs, seq, self.batch_first), final_state


class _GraphedSequence(nn.Module):
    """``(rows, memory[, hidden]) -> (outputs, memory[, hidden])`` for graph capture."""

    def __init__(self, core: FastRelationalMemory) -> None:
        super().__init__()
        self.core = core

    def forward(self, rows: Tensor, memory: Tensor, *hidden: Tensor) -> tuple[Tensor, ...]:
        state = RMCState(memory, hidden[0] if hidden else None)
        outputs, final = self.core.run(rows, state, None)
        if final.hidden is None:
            return outputs, final.memory
        return outputs, final.memory, final.hidden


class FastRelationalMemory(nn.Module):
    """A :class:`RelationalMemory` run through the fast path with opt-in accelerations.

    It shares the wrapped core's parameters (``state_dict`` keys gain a ``core.`` prefix) and
    accepts the same ``forward`` arguments.

    Args:
        core: the module whose parameters to use.
        compile: ``torch.compile`` the recurrent step (the hoisted GEMMs stay eager). Exact up
            to float rounding.
        cuda_graph: on CUDA, capture the whole sequence, forward and backward, in CUDA graphs
            per input shape (``torch.cuda.make_graphed_callables``). Used only for calls
            with grad mode on and without ``lengths``; other calls run uncaptured. Parameters
            must not be replaced (in-place optimizer updates are fine), and the returned
            tensors live in the graph's static buffers: the next call of the same shape
            overwrites them, so clone what must outlive it.
        matmul_dtype: None (the parameters' dtype) or ``torch.bfloat16``/``torch.float16``:
            autocast the matmuls; LayerNorm statistics, softmax and the recurrent state stay
            fp32. Not exact (``docs/rmc.md`` §10): tests use bf16 tolerances.
        defer_weight_grads: E10 for the eager path (see
            :func:`relmem.cores.rmc.fast.fast_sequence`): None (where ``deferral_pays``), True
            (every in-loop weight) or False (none). Compiled and
            graph-captured runs never defer, so True is refused with them.

    Shapes: as :class:`RelationalMemory`.
    """

    def __init__(
        self,
        core: RelationalMemory,
        *,
        compile: bool = False,
        cuda_graph: bool = False,
        matmul_dtype: torch.dtype | None = None,
        defer_weight_grads: bool | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(core, RelationalMemory):
            raise TypeError(
                "FastRelationalMemory: core must be a relmem.RelationalMemory (it runs the "
                f"RMC's fast path on that core's parameters), got {type(core).__name__}"
            )
        if matmul_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"FastRelationalMemory: matmul_dtype must be None, torch.bfloat16 or "
                f"torch.float16, got {matmul_dtype!r}"
            )
        if defer_weight_grads not in (None, True, False):
            raise ValueError(
                f"FastRelationalMemory: defer_weight_grads must be None, True or False, got "
                f"{defer_weight_grads!r}"
            )
        if defer_weight_grads and (compile or cuda_graph):
            raise ValueError(
                "FastRelationalMemory: defer_weight_grads=True cannot be combined with "
                "compile=True or cuda_graph=True (its gradient bank lives in Python, outside "
                "a compiled or captured step); leave it None"
            )
        self.core = core
        self.compile_step = compile  # not `compile`, which would hide nn.Module.compile()
        self.cuda_graph = cuda_graph
        self.matmul_dtype = matmul_dtype
        self.defer_weight_grads = False if (compile or cuda_graph) else defer_weight_grads
        self._step_fn: StepFn = (
            torch.compile(recurrent_step, dynamic=False) if compile else recurrent_step
        )
        self._graphs: dict[tuple[Any, ...], Callable[..., Any]] = {}

    @property
    def config(self) -> RMCConfig:
        return self.core.config

    def initial_state(self, batch_size: int, **kwargs: Any) -> RMCState:
        """See :meth:`RelationalMemoryCell.initial_state`."""
        return self.core.initial_state(batch_size, **kwargs)

    def _autocast(self, device: torch.device) -> Any:
        if self.matmul_dtype is None:
            return nullcontext()
        # cache_enabled=False: cached casts would be baked into a captured graph.
        return torch.autocast(device.type, dtype=self.matmul_dtype, cache_enabled=False)

    def run(self, rows: Tensor, state: RMCState, lengths: Tensor | None) -> tuple[Tensor, RMCState]:
        """``fast_sequence`` with this wrapper's step and precision.

        Args:
            rows: ``[T, B, n, F]`` validated time-major input.
            state: validated initial state. lengths: optional ``[B]``.

        Returns:
            ``(outputs [T, B, N·M], final state)``, outputs and state in the parameters' dtype.
        """
        dtype = self.core.cell.input_projection.weight.dtype
        with self._autocast(rows.device):
            cell = self.core.cell
            outputs, final = fast_sequence(
                cell.config,
                cell.fast_weights(),
                rows,
                state,
                lengths,
                self._step_fn,
                defer_weight_grads=self.defer_weight_grads,
            )
        outputs = outputs.to(dtype)
        hidden = None if final.hidden is None else final.hidden.to(dtype)
        final = RMCState(final.memory.to(dtype), hidden)
        return outputs, final

    def _graphed(self, rows: Tensor, state: RMCState) -> Callable[..., Any]:
        args = (rows, *(s for s in state if s is not None))
        key = (tuple(rows.shape), rows.dtype, rows.device, tuple(a.requires_grad for a in args))
        if key not in self._graphs:
            sample = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
            self._graphs[key] = torch.cuda.make_graphed_callables(
                _GraphedSequence(self), sample, num_warmup_iters=3
            )
        return self._graphs[key]

    def forward(
        self,
        input: Any,
        state: RMCState | Tensor | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Any, RMCState]:
        """As :meth:`RelationalMemory.forward`."""
        core = self.core
        seq, rows, state = core.prepare(input, state, lengths)
        use_graph = (
            self.cuda_graph and rows.is_cuda and seq.lengths is None and torch.is_grad_enabled()
        )
        if use_graph:
            graphed = self._graphed(rows, state)
            result = graphed(rows, *(s for s in state if s is not None))
            outputs, final = result[0], RMCState(*result[1:])
        else:
            outputs, final = self.run(rows, state, seq.lengths)
        return finish_sequence(outputs, seq, core.batch_first), final


def prefer_fused(model: nn.Module, device: torch.device) -> str | None:
    """Run the RMC cores of ``model`` that are left on ``'auto'`` with the fused step, on the CPU.

    ``'auto'`` already runs the fused step wherever it can, building it on the first call; a
    training run on the CPU builds it before its first step, so that the log says how long that
    took, or why the cores stay on the fast path, and then holds the cores to it
    (``docs/performance.md`` §4.8). Cores given an explicit implementation, and every core off
    the CPU, are left alone.

    Args:
        model: any module; its :class:`RelationalMemory` and :class:`RelationalMemoryCell`
            submodules (itself included) are switched.
        device: where ``model`` runs.

    Returns:
        A line for the log, or None when nothing needed saying: the operators were built (and
        how long that took) if building them took a while, or why the cores stay on the fast
        path if they could not be built.
    """
    cores = [
        module
        for module in model.modules()
        if isinstance(module, (RelationalMemory, RelationalMemoryCell))
        and module.implementation == "auto"
    ]
    if not cores or device.type != "cpu":
        return None
    start = time.perf_counter()
    try:
        load_fused_ops()
    except RuntimeError as error:
        return f"the RMC runs the fast path: {error}"
    for module in cores:
        module.implementation = "fused"
    took = time.perf_counter() - start
    if took < 2.0:  # loaded from the build cache
        return None
    return (
        f"built the RMC's fused CPU step in {took:.0f} s (once per installation; "
        "--rmc.implementation fast runs the plain fast path)"
    )
