"""The DNC memory access module: interface vector in, read vectors and new memory state out.

One call of :class:`DNCMemory` performs steps 3–8 of ``docs/dnc.md`` §2 (§2.3–§2.8): split
and squash the interface vector, update usage, compute the write weights, erase and add,
update the link and precedence, and read. All of it runs in float32 (float64 for float64 modules),
also under autocast; the new state is cast back to the state's dtype.

Notation: B batch, N ``memory_size``, W ``word_size``, R ``num_read_heads``, Wh
``num_write_heads``, K ``link_topk``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from relmem.cores.base import check_state_tensor
from relmem.cores.dnc import addressing as A
from relmem.cores.dnc import fused as F
from relmem.validation import (
    check_bool,
    check_choice,
    check_device,
    check_factory,
    check_float,
    check_int,
)

Compat = Literal["paper", "deepmind"]
LinkKind = Literal["dense", "sparse", "none"]
Implementation = Literal["auto", "fused", "reference"]


class DNCMemoryState(NamedTuple):
    """The state of the external memory (``docs/dnc.md`` §1). Every field is batch-leading.

    Attributes:
        memory: ``[B, N, W]`` ``M_t``.
        usage: ``[B, N]`` ``u_t``.
        link: ``[B, Wh, N, N]`` dense link; ``[B, Wh, N, K]`` stored values with
            ``link='sparse'``; None with ``link='none'``.
        precedence: ``[B, Wh, N]``; None with ``link='none'``.
        read_weights: ``[B, R, N]``.
        write_weights: ``[B, Wh, N]``.
        read_vectors: ``[B, R, W]``.
        link_index: ``[B, Wh, N, K]`` int64 columns of the sparse link's values; None unless
            ``link='sparse'``.
    """

    memory: Tensor
    usage: Tensor
    link: Tensor | None
    precedence: Tensor | None
    read_weights: Tensor
    write_weights: Tensor
    read_vectors: Tensor
    link_index: Tensor | None = None


class Interface(NamedTuple):
    """The squashed interface fields of one step (``docs/dnc.md`` §3.1).

    Attributes:
        read_keys: ``[B, R, W]``. read_strengths: ``[B, R]``.
        write_keys: ``[B, Wh, W]``. write_strengths: ``[B, Wh]``.
        erase_vectors: ``[B, Wh, W]`` in [0, 1]. write_vectors: ``[B, Wh, W]``.
        free_gates: ``[B, R]``. allocation_gates: ``[B, Wh]``. write_gates: ``[B, Wh]``.
        read_modes: ``[B, R, 1 + 2·Wh]`` softmax, laid out ``[b_1..b_Wh, c, f_1..f_Wh]`` whatever
            the compat mode (deepmind's ``[b…, f…, c]`` is reordered on split); None with
            ``link='none'``.
        read_masks: ``[B, R, W]`` and write_masks ``[B, Wh, W]`` sigmoid key masks, or None.
        sharpness: ``[B, R, 2]`` oneplus link sharpness ``[backward, forward]``, or None.
    """

    read_keys: Tensor
    read_strengths: Tensor
    write_keys: Tensor
    write_strengths: Tensor
    erase_vectors: Tensor
    write_vectors: Tensor
    free_gates: Tensor
    allocation_gates: Tensor
    write_gates: Tensor
    read_modes: Tensor | None
    read_masks: Tensor | None
    write_masks: Tensor | None
    sharpness: Tensor | None


@dataclass(frozen=True)
class InterfaceLayout:
    """Where each field lives in the interface vector ξ (``docs/dnc.md`` §3.1–§3.3).

    Attributes:
        fields: ``(name, size)`` in the order of ξ.
    """

    fields: tuple[tuple[str, int], ...]

    @property
    def size(self) -> int:
        return sum(size for _, size in self.fields)

    def starts(self) -> dict[str, int]:
        """Where each field starts in ξ."""
        starts, at = {}, 0
        for field, size in self.fields:
            starts[field] = at
            at += size
        return starts

    def slice_of(self, name: str) -> slice:
        """The slice of ξ holding field ``name`` (e.g. to initialise a gate's bias)."""
        starts = self.starts()
        if name not in starts:
            names = ", ".join(field for field, _ in self.fields)
            raise KeyError(f"InterfaceLayout: no field {name!r}; the fields are {names}")
        return slice(starts[name], starts[name] + dict(self.fields)[name])

    def split(self, interface: Tensor) -> dict[str, Tensor]:
        """Cut ``[B, size]`` into named raw (unsquashed) pieces ``[B, field size]``."""
        pieces = interface.split([size for _, size in self.fields], dim=-1)
        return {name: piece for (name, _), piece in zip(self.fields, pieces, strict=True)}


def interface_layout(
    word_size: int,
    num_reads: int,
    num_writes: int,
    *,
    compat: Compat = "paper",
    link: LinkKind = "dense",
    key_mask: bool = False,
    link_sharpness: bool = False,
) -> InterfaceLayout:
    """The interface layout for the given sizes and options.

    Paper order (default): read keys, read strengths, write keys, write strengths, erase,
    write vectors, free gates, allocation gates, write gates, read modes. deepmind order: write
    vectors, erase, free gates, allocation gates, write gates, read modes, write keys, write
    strengths, read keys, read strengths. Option fields (key masks, link sharpness) follow.
    With ``link='none'`` there are no read modes.
    """
    w, r, wh = word_size, num_reads, num_writes
    modes = 0 if link == "none" else r * (1 + 2 * wh)
    sizes = {
        "read_keys": r * w,
        "read_strengths": r,
        "write_keys": wh * w,
        "write_strengths": wh,
        "erase_vectors": wh * w,
        "write_vectors": wh * w,
        "free_gates": r,
        "allocation_gates": wh,
        "write_gates": wh,
        "read_modes": modes,
    }
    if compat == "paper":
        order = list(sizes)
    else:
        order = [
            "write_vectors",
            "erase_vectors",
            "free_gates",
            "allocation_gates",
            "write_gates",
            "read_modes",
            "write_keys",
            "write_strengths",
            "read_keys",
            "read_strengths",
        ]
    fields = [(name, sizes[name]) for name in order if sizes[name] > 0]
    if key_mask:
        fields += [("read_masks", r * w), ("write_masks", wh * w)]
    if link_sharpness and link != "none":
        fields.append(("sharpness", 2 * r))
    return InterfaceLayout(tuple(fields))


_SIZES = ("memory_size", "word_size", "num_read_heads", "num_write_heads")
_FLAGS = ("usage_write_grad", "dealloc_content", "key_mask", "link_sharpness")
_IMPLEMENTATIONS = ("auto", "fused", "reference")


def check_memory_options(
    owner: str, options: Mapping[str, Any], names: Mapping[str, str] | None = None
) -> None:
    """Check :class:`DNCMemory`'s keyword arguments as a module built on the memory received
    them, so that its errors name that module and its caller's argument names.

    Args:
        owner: the class named in the errors.
        options: any of :class:`DNCMemory`'s arguments from ``memory_size`` to ``eps``, by
            name; ``link_topk`` is checked against ``memory_size`` when both are there.
        names: the caller's name of an argument where it differs (the memory-controller
            layer's ``memory_slots`` for ``memory_size``).

    Raises:
        ValueError, TypeError: the first bad value, naming ``owner``, the argument and what
        it accepts.
    """
    names = names or {}

    def named(key: str) -> str:
        return names.get(key, key)

    for key in _SIZES:
        if key in options:
            check_int(named(key), options[key], owner=owner)
    if "compat" in options:
        check_choice(named("compat"), options["compat"], ("paper", "deepmind"), owner=owner)
    if "link" in options:
        check_choice(named("link"), options["link"], ("dense", "sparse", "none"), owner=owner)
    if "link_topk" in options:  # also when unused: a typo is still one
        topk = check_int(named("link_topk"), options["link_topk"], owner=owner)
        slots = options.get("memory_size")
        if options.get("link") == "sparse" and slots is not None and topk > slots:
            raise ValueError(
                f"{owner}: {named('link_topk')} must be at most {named('memory_size')} = "
                f"{slots}, got {topk}"
            )
    if "interface_clip" in options:
        check_float(
            named("interface_clip"),
            options["interface_clip"],
            minimum=0,
            owner=owner,
            note=" (0 disables it)",
        )
    if "eps" in options:
        eps = options["eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 0.1:
            raise ValueError(f"{owner}: {named('eps')} must be a float in (0, 0.1), got {eps!r}")
    for key in _FLAGS:
        if key in options:
            check_bool(named(key), options[key], owner=owner)
    if "implementation" in options:
        check_choice(
            named("implementation"), options["implementation"], _IMPLEMENTATIONS, owner=owner
        )


class DNCMemory(nn.Module):
    """DNC memory access (``docs/dnc.md`` §3–§9): one interface vector in, reads and state out.

    Args:
        input_size: size of the vector the interface is computed from (the controller output);
            a linear layer ``W_ξ`` maps it to the interface vector. None: the input *is* the
            raw interface vector of size :attr:`interface_size` and the module has no
            parameters.
        memory_size: N, memory slots. Default 16.
        word_size: W, the width of a slot. Default 16.
        num_read_heads: R. Default 4.
        num_write_heads: Wh (the paper has 1). Default 1.
        compat: 'paper' (oneplus strengths, modes ``[b, c, f]``, one ``W_ξ`` with PyTorch's
            init) or 'deepmind' (softplus strengths, modes ``[b…, f…, c]``, deepmind's field
            order, Sonnet's truncated-normal init of ``W_ξ``; ``docs/dnc.md`` §3.3).
        link: 'dense' (default), 'sparse' (each link row keeps its ``link_topk`` largest
            entries, state and compute linear in N) or 'none' (content-only reads, no link or
            precedence state).
        link_topk: K of the sparse link, 1..N. Default 8 (the paper's choice).
        usage_write_grad: let gradients flow through ``w^w_{t−1}`` into the usage (default
            False: stopped, as in deepmind).
        dealloc_content: multiply memory rows by ψ when freeing so freed rows are erased
            (Csordás & Schmidhuber 2019). Default False.
        key_mask: learned sigmoid masks on keys and memory before the cosine (same source).
        link_sharpness: sharpen forward/backward weights as ``d^s / Σ d^s``, s = oneplus(·).
        interface_clip: clamp ξ to ±value before squashing; 0 (default) disables it.
        eps: the ε of the cosine and the usage clamp. Default 1e-6.
        implementation: 'auto' (default): on the CPU the fused C++ step
            (:mod:`relmem.cores.dnc.fused`), elsewhere, or with the sparse link (which it does
            not run), the reference step, said once; 'fused': the fused step or an error saying
            why not; 'reference': the step of ``docs/dnc.md`` in eager ops (the oracle). Both
            give the same numbers up to rounding, forward and backward.
        device, dtype: factory arguments.

    Shapes:
        - input: ``[B, input_size]`` (or ``[B, interface_size]`` when ``input_size=None``).
        - state: :class:`DNCMemoryState`; None means :meth:`initial_state`.
        - output: read vectors ``[B, R, W]`` (also stored as ``state.read_vectors``).
    """

    _anchor: Tensor  # a buffer: the module's device and dtype (see factory_defaults)

    def __init__(
        self,
        input_size: int | None,
        memory_size: int = 16,
        word_size: int = 16,
        num_read_heads: int = 4,
        num_write_heads: int = 1,
        *,
        compat: Compat = "paper",
        link: LinkKind = "dense",
        link_topk: int = 8,
        usage_write_grad: bool = False,
        dealloc_content: bool = False,
        key_mask: bool = False,
        link_sharpness: bool = False,
        interface_clip: float = 0.0,
        eps: float = A.EPSILON,
        implementation: Implementation = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if input_size is not None:
            check_int("input_size", input_size, owner=name)
        check_memory_options(
            name,
            {
                "memory_size": memory_size,
                "word_size": word_size,
                "num_read_heads": num_read_heads,
                "num_write_heads": num_write_heads,
                "compat": compat,
                "link": link,
                "link_topk": link_topk,
                "usage_write_grad": usage_write_grad,
                "dealloc_content": dealloc_content,
                "key_mask": key_mask,
                "link_sharpness": link_sharpness,
                "interface_clip": interface_clip,
                "eps": eps,
                "implementation": implementation,
            },
        )
        check_factory(device, dtype, owner=name)
        self.input_size = input_size
        self.memory_size = memory_size
        self.word_size = word_size
        self.num_read_heads = num_read_heads
        self.num_write_heads = num_write_heads
        self.compat: Compat = compat
        self.link: LinkKind = link
        self.link_topk = link_topk if link == "sparse" else None
        self.usage_write_grad = usage_write_grad
        self.dealloc_content = dealloc_content
        self.key_mask = key_mask
        self.link_sharpness = link_sharpness and link != "none"
        self.interface_clip = float(interface_clip)
        self.eps = float(eps)
        self.implementation: Implementation = implementation
        self.layout = interface_layout(
            word_size,
            num_read_heads,
            num_write_heads,
            compat=compat,
            link=link,
            key_mask=key_mask,
            link_sharpness=link_sharpness,
        )
        starts = self.layout.starts()
        # where each field starts, in the fused operator's order (-1: absent)
        self.operator_offsets = [starts.get(field, -1) for field in F.OPERATOR_FIELDS]
        self.interface: nn.Linear | None = None
        if input_size is not None:
            self.interface = nn.Linear(input_size, self.layout.size, device=device, dtype=dtype)
        # Keeps the module's device and dtype known when it has no parameters.
        anchor = torch.empty(0, device=device, dtype=dtype)
        self.register_buffer("_anchor", anchor, persistent=False)
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters

    def reset_parameters(self) -> None:
        """PyTorch's ``nn.Linear`` init for ``W_ξ``; Sonnet's (truncated normal, std
        ``1/√fan_in``, zero bias) with ``compat='deepmind'``."""
        if self.interface is None:
            return
        if self.compat == "deepmind":
            std = 1.0 / math.sqrt(self.interface.in_features)
            nn.init.trunc_normal_(self.interface.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(self.interface.bias)
        else:
            self.interface.reset_parameters()

    @property
    def interface_size(self) -> int:
        """The size of the interface vector ξ (``docs/dnc.md`` §3.1:
        R·W + 3·Wh·W + R·(3 + 2·Wh) + 3·Wh)."""
        return self.layout.size

    @property
    def read_size(self) -> int:
        """R·W, the size of the flattened read vectors."""
        return self.num_read_heads * self.word_size

    def extra_repr(self) -> str:
        parts = [
            f"input_size={self.input_size}",
            f"memory_size={self.memory_size}",
            f"word_size={self.word_size}",
            f"num_read_heads={self.num_read_heads}",
            f"num_write_heads={self.num_write_heads}",
            f"compat={self.compat!r}",
            f"link={self.link!r}",
        ]
        if self.link == "sparse":
            parts.append(f"link_topk={self.link_topk}")
        for flag in ("usage_write_grad", "dealloc_content", "key_mask", "link_sharpness"):
            if getattr(self, flag):
                parts.append(f"{flag}=True")
        if self.interface_clip:
            parts.append(f"interface_clip={self.interface_clip}")
        if self.implementation != "auto":
            parts.append(f"implementation={self.implementation!r}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ state

    def factory_defaults(self) -> tuple[torch.device, torch.dtype]:
        """The module's device and dtype (of ``W_ξ``, or of a buffer when there is none)."""
        return self._anchor.device, self._anchor.dtype

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DNCMemoryState:
        """All-zero state (``docs/dnc.md`` §1); the sparse link's columns start at ``0..K−1``.

        Args:
            batch_size: B.
            device, dtype: default to the module's.
        """
        batch_size = check_int(
            "batch_size", batch_size, owner=f"{type(self).__name__}.initial_state"
        )
        default_device, default_dtype = self.factory_defaults()
        owner = f"{type(self).__name__}.initial_state"
        device = default_device if device is None else check_device(device, owner=owner)
        dtype = default_dtype if dtype is None else dtype
        b, n, w = batch_size, self.memory_size, self.word_size
        r, wh = self.num_read_heads, self.num_write_heads

        def zeros(*shape: int) -> Tensor:
            return torch.zeros(*shape, device=device, dtype=dtype)

        link = precedence = link_index = None
        if self.link == "dense":
            link, precedence = zeros(b, wh, n, n), zeros(b, wh, n)
        elif self.link == "sparse":
            assert self.link_topk is not None
            link, precedence = zeros(b, wh, n, self.link_topk), zeros(b, wh, n)
            link_index = A.initial_sparse_link_index(b, wh, n, self.link_topk, device)
        return DNCMemoryState(
            memory=zeros(b, n, w),
            usage=zeros(b, n),
            link=link,
            precedence=precedence,
            read_weights=zeros(b, r, n),
            write_weights=zeros(b, wh, n),
            read_vectors=zeros(b, r, w),
            link_index=link_index,
        )

    def check_state(self, state: Any, batch_size: int, owner: str | None = None) -> DNCMemoryState:
        """Validate a :class:`DNCMemoryState` and return it.

        Raises errors that name the field and the expected versus given shape, dtype or device.
        """
        name = owner or type(self).__name__
        if not isinstance(state, DNCMemoryState):
            raise TypeError(
                f"{name}: state must be a DNCMemoryState (from initial_state or a previous call), "
                f"got {type(state).__name__}"
            )
        device, dtype = self.factory_defaults()
        b, n, w = batch_size, self.memory_size, self.word_size
        r, wh = self.num_read_heads, self.num_write_heads
        expected: dict[str, tuple[int, ...] | None] = {
            "memory": (b, n, w),
            "usage": (b, n),
            "link": None,
            "precedence": None,
            "read_weights": (b, r, n),
            "write_weights": (b, wh, n),
            "read_vectors": (b, r, w),
            "link_index": None,
        }
        if self.link == "dense":
            expected.update(link=(b, wh, n, n), precedence=(b, wh, n))
        elif self.link == "sparse":
            assert self.link_topk is not None
            k = self.link_topk
            expected.update(link=(b, wh, n, k), precedence=(b, wh, n), link_index=(b, wh, n, k))
        for field, shape in expected.items():
            value = getattr(state, field)
            if shape is None:
                if value is not None:
                    raise ValueError(
                        f"{name}: state.{field} must be None with link={self.link!r}, got a "
                        f"{type(value).__name__}"
                    )
                continue
            want_dtype = torch.long if field == "link_index" else dtype
            check_state_tensor(name, field, value, shape, want_dtype, device)
        if state.link_index is not None and state.link_index.numel():
            # a column outside the memory indexed out of bounds deep in the link update
            low, high = int(state.link_index.min()), int(state.link_index.max())
            if low < 0 or high >= n:
                raise ValueError(
                    f"{name}: state.link_index must hold memory columns in 0..{n - 1}, got "
                    f"values from {low} to {high}"
                )
        return state

    # ------------------------------------------------------------------ interface

    def split_interface(self, interface: Tensor) -> Interface:
        """Split and squash a raw interface vector (``docs/dnc.md`` §3).

        Args:
            interface: ``[B, interface_size]`` raw ξ (float32/float64).

        Returns:
            :class:`Interface` with read modes in paper order ``[b…, c, f…]``.
        """
        if self.interface_clip > 0:
            interface = interface.clamp(-self.interface_clip, self.interface_clip)
        raw = self.layout.split(interface)
        b = interface.shape[0]
        w, r, wh = self.word_size, self.num_read_heads, self.num_write_heads
        strength = A.oneplus if self.compat == "paper" else torch.nn.functional.softplus
        read_modes = None
        if self.link != "none":
            modes = torch.softmax(raw["read_modes"].view(b, r, 1 + 2 * wh), dim=-1)
            if self.compat == "deepmind":  # [b…, f…, c] -> [b…, c, f…]
                modes = torch.cat([modes[..., :wh], modes[..., -1:], modes[..., wh:-1]], dim=-1)
            read_modes = modes
        read_masks = write_masks = sharpness = None
        if self.key_mask:
            read_masks = torch.sigmoid(raw["read_masks"]).view(b, r, w)
            write_masks = torch.sigmoid(raw["write_masks"]).view(b, wh, w)
        if self.link_sharpness:
            sharpness = A.oneplus(raw["sharpness"]).view(b, r, 2)
        return Interface(
            read_keys=raw["read_keys"].view(b, r, w),
            read_strengths=strength(raw["read_strengths"]),
            write_keys=raw["write_keys"].view(b, wh, w),
            write_strengths=strength(raw["write_strengths"]),
            erase_vectors=torch.sigmoid(raw["erase_vectors"]).view(b, wh, w),
            write_vectors=raw["write_vectors"].view(b, wh, w),
            free_gates=torch.sigmoid(raw["free_gates"]),
            allocation_gates=torch.sigmoid(raw["allocation_gates"]),
            write_gates=torch.sigmoid(raw["write_gates"]),
            read_modes=read_modes,
            read_masks=read_masks,
            write_masks=write_masks,
            sharpness=sharpness,
        )

    def _content(
        self, memory: Tensor, keys: Tensor, strengths: Tensor, mask: Tensor | None
    ) -> Tensor:
        """Content weights ``[B, H, N]``, with the optional key mask on keys and memory."""
        if mask is None:
            return A.content_weights(memory, keys, strengths, self.eps)
        masked_memory = memory.unsqueeze(1) * mask.unsqueeze(2)  # [B, H, N, W]
        masked_keys = (keys * mask).unsqueeze(2)  # [B, H, 1, W]
        batch, heads = keys.shape[:2]
        weights = A.content_weights(
            masked_memory.flatten(0, 1),
            masked_keys.flatten(0, 1),
            strengths.reshape(-1, 1),
            self.eps,
        )  # [B·H, 1, N]
        return weights.view(batch, heads, -1)

    # ------------------------------------------------------------------ the step

    def step(self, interface: Tensor, state: DNCMemoryState) -> DNCMemoryState:
        """One memory step (``docs/dnc.md`` §2.3–§2.8) on a raw interface vector and a validated
        state.

        Args:
            interface: ``[B, interface_size]`` raw ξ, in any floating dtype.
            state: validated :class:`DNCMemoryState`.

        Returns:
            The new state; its ``read_vectors [B, R, W]`` are the step's reads.
        """
        state_dtype = state.memory.dtype
        compute = torch.float64 if state_dtype == torch.float64 else torch.float32
        with torch.autocast(interface.device.type, enabled=False):
            interface, state = interface.to(compute), _cast_state(state, compute)
            if self.runs_fused(interface):
                fields = F.memory_step(
                    interface,
                    state[:6],
                    self.operator_offsets,
                    self.compat == "deepmind",
                    self.usage_write_grad,
                    self.dealloc_content,
                    self.interface_clip,
                    self.eps,
                )
                new_state = DNCMemoryState(*fields)
            else:
                new_state = self._step(interface, state)
        return _cast_state(new_state, state_dtype)

    def unfused_reason(self) -> str | None:
        """Why this memory's options keep it on the reference step, or None when the fused
        step runs them."""
        if self.link != "sparse":
            return None
        return "the fused DNC memory step does not implement link='sparse'"

    def runs_fused(self, interface: Tensor) -> bool:
        """Whether this step runs the fused operator (see ``implementation``).

        Raises:
            ValueError: ``implementation='fused'`` and the step cannot run it, saying why.
        """
        if self.implementation == "reference":
            return False
        # off the CPU or traced, the reference step is the path there, not a fallback to note
        elsewhere = F.elsewhere_reason(interface)
        reason = self.unfused_reason() or elsewhere or F.build_reason()
        if reason is None:
            return True
        if self.implementation == "fused":
            raise ValueError(
                f"{type(self).__name__}: implementation='fused', but {reason}; use "
                "implementation='auto' or 'reference'"
            )
        if reason is not elsewhere:
            F.say_once(reason)
        return False

    def _step(self, interface: Tensor, state: DNCMemoryState) -> DNCMemoryState:
        xi = self.split_interface(interface)
        wh = self.num_write_heads

        # 4. usage, with the current free gates and the previous read/write weights
        psi = A.retention(xi.free_gates, state.read_weights)  # [B, N]
        usage = A.update_usage(
            state.usage, state.write_weights, psi, write_grad=self.usage_write_grad
        )  # [B, N]
        memory = state.memory  # [B, N, W]
        if self.dealloc_content:
            memory = memory * psi.unsqueeze(-1)

        # 5. write weights: content on the previous memory, allocation from the new usage
        write_content = self._content(
            memory, xi.write_keys, xi.write_strengths, xi.write_masks
        )  # [B, Wh, N]
        allocation = A.write_allocation_weights(
            usage, xi.allocation_gates * xi.write_gates, self.eps
        )  # [B, Wh, N]
        alloc_gate = xi.allocation_gates.unsqueeze(-1)  # [B, Wh, 1]
        write_weights = xi.write_gates.unsqueeze(-1) * (
            alloc_gate * allocation + (1.0 - alloc_gate) * write_content
        )  # [B, Wh, N]

        # 6. erase and add
        memory = A.write_memory(memory, write_weights, xi.erase_vectors, xi.write_vectors)

        # 7. link (with p_{t−1}), then precedence
        link, precedence, link_index = state.link, state.precedence, state.link_index
        if self.link == "dense":
            assert link is not None and precedence is not None
            link = A.update_link(link, precedence, write_weights)  # [B, Wh, N, N]
            backward, forward = A.directional_weights(link, state.read_weights)
        elif self.link == "sparse":
            assert link is not None and precedence is not None and link_index is not None
            link, link_index = A.update_sparse_link(link, link_index, precedence, write_weights)
            backward, forward = A.sparse_directional_weights(link, link_index, state.read_weights)
        if precedence is not None:
            precedence = A.update_precedence(precedence, write_weights)  # [B, Wh, N]

        # 8. read weights on the new memory, then read vectors
        read_content = self._content(
            memory, xi.read_keys, xi.read_strengths, xi.read_masks
        )  # [B, R, N]
        if xi.read_modes is None:
            read_weights = read_content
        else:  # backward, forward: [B, R, Wh, N]; modes [B, R, 1 + 2·Wh] = [b…, c, f…]
            if xi.sharpness is not None:
                backward = A.sharpen(backward, xi.sharpness[..., 0, None, None], self.eps)
                forward = A.sharpen(forward, xi.sharpness[..., 1, None, None], self.eps)
            modes = xi.read_modes.unsqueeze(-1)  # [B, R, 1 + 2·Wh, 1]
            read_weights = (
                (modes[:, :, :wh] * backward).sum(2)
                + modes[:, :, wh] * read_content
                + (modes[:, :, wh + 1 :] * forward).sum(2)
            )  # [B, R, N]
        read_vectors = read_weights @ memory  # [B, R, W]
        return DNCMemoryState(
            memory=memory,
            usage=usage,
            link=link,
            precedence=precedence,
            read_weights=read_weights,
            write_weights=write_weights,
            read_vectors=read_vectors,
            link_index=link_index,
        )

    def check_input(self, input: Tensor, owner: str | None = None) -> None:
        """Validate one step's input ``[B, input_size]`` (or ``[B, interface_size]``)."""
        name = owner or type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
        size = self.interface_size if self.input_size is None else self.input_size
        what = "interface_size" if self.input_size is None else "input_size"
        if input.dim() != 2 or input.shape[1] != size:
            raise ValueError(
                f"{name}: expected input [B, {what}={size}], got shape {tuple(input.shape)}"
            )
        if not input.is_floating_point():
            raise TypeError(f"{name}: input must be floating point, got {input.dtype}")
        device, dtype = self.factory_defaults()
        autocast = torch.is_autocast_enabled(device.type)
        if self.interface is not None and input.dtype != dtype and not autocast:
            raise TypeError(
                f"{name}: input dtype {input.dtype} differs from the parameters' {dtype}; "
                f"convert the input with .to({dtype}) or the module with .to(dtype)"
            )
        if input.device != device:
            raise ValueError(
                f"{name}: input is on {input.device} but the module is on {device}; move one "
                "of them with .to(device)"
            )

    def forward(
        self, input: Tensor, state: DNCMemoryState | None = None
    ) -> tuple[Tensor, DNCMemoryState]:
        """Run one memory step.

        Args:
            input: ``[B, input_size]`` controller output (or the raw ``[B, interface_size]``
                interface vector when ``input_size=None``).
            state: :class:`DNCMemoryState`; None means :meth:`initial_state`.

        Returns:
            ``(read_vectors [B, R, W], new_state)``.
        """
        self.check_input(input)
        batch = input.shape[0]
        state = self.initial_state(batch) if state is None else self.check_state(state, batch)
        interface = input if self.interface is None else self.interface(input)
        new_state = self.step(interface, state)
        return new_state.read_vectors, new_state


def _cast_state(state: DNCMemoryState, dtype: torch.dtype) -> DNCMemoryState:
    """Cast the floating fields of a state (the sparse link's int64 columns stay as they are)."""

    def cast(t: Tensor | None) -> Tensor | None:
        if t is None or not t.is_floating_point() or t.dtype == dtype:
            return t
        return t.to(dtype)

    return DNCMemoryState._make(cast(t) for t in state)
