"""Property tests of every core's constructor and forward call (Hypothesis).

For each core, a table gives each argument a strategy of valid values and one of invalid ones.
Hypothesis draws a valid set of arguments and, half of the time, spoils one of them:

- spoiled: the constructor raises ``ValueError`` or ``TypeError`` whose message names the
  argument;
- valid: the module builds, runs a random padded batch forward and backward, and returns
  finite outputs of the documented shape.

The forward call gets the same treatment: a bad ``input``, ``lengths`` or ``state`` raises an
error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from relmem.cores import DNC, MemoryControllerLayer, RelationalMemory

T, B = 3, 2

not_an_int = st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=2), st.just([1]))
bad_count = st.one_of(st.integers(-3, 0), not_an_int)
not_a_float = st.one_of(st.just(float("nan")), st.booleans(), st.text(max_size=2), st.none())
bad_choice = st.one_of(st.text(max_size=4).filter(lambda s: s not in VALID_WORDS), st.integers())
bad_flag = st.one_of(st.integers(2, 5), st.text(min_size=1, max_size=2), st.floats())
bad_dtype = st.sampled_from([torch.int64, torch.bool, torch.complex64, "float32", 32])
bad_device = st.sampled_from(["gpu0", "nope", "cpu:x", 3.5, [0]])
VALID_WORDS = {"unit", "memory", "all", "auto", "reference", "fast", "gru", "lstm"}
VALID_WORDS |= {"paper", "deepmind", "dense", "sparse", "none"}
factory = {
    "dtype": (st.sampled_from([None, torch.float32, torch.float64]), bad_dtype),
    "device": (st.sampled_from([None, "cpu", torch.device("cpu")]), bad_device),
}


@dataclass(frozen=True)
class CoreSpec:
    """A core's constructor, its arguments' strategies and how to check a forward call.

    Attributes:
        build: the constructor.
        arguments: name -> (valid strategy, invalid strategy).
        fix: makes a drawn valid set consistent (arguments that constrain each other).
        check: runs a forward and backward on a built module and checks the result.
    """

    build: Callable[..., nn.Module]
    arguments: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]
    fix: Callable[[dict[str, Any]], dict[str, Any]]
    check: Callable[[nn.Module, dict[str, Any]], None]


def run_padded(module: nn.Module, inputs: torch.Tensor, width: int) -> None:
    """Forward ``inputs [T, B, ...]`` with random lengths, check ``[T, B, width]``, backward."""
    lengths = torch.randint(0, T + 1, (B,))
    outputs, _ = module(inputs, lengths=lengths)
    assert outputs.shape == (T, B, width)
    assert torch.isfinite(outputs).all()
    outputs.sum().backward()


def dtype_of(args: dict[str, Any]) -> torch.dtype:
    return args.get("dtype") or torch.get_default_dtype()


def rmc_fix(args: dict[str, Any]) -> dict[str, Any]:
    if args["gate_style"] is None:
        args["output_gate"] = args["trainable_gate_biases"] = False
    return args


def rmc_check(module: nn.Module, args: dict[str, Any]) -> None:
    rows = () if args["input_rows"] is None else (args["input_rows"],)
    inputs = torch.randn(T, B, *rows, args["input_size"], dtype=dtype_of(args))
    run_padded(module, inputs, args["mem_slots"] * args["num_heads"] * args["head_size"])


def dnc_fix(args: dict[str, Any]) -> dict[str, Any]:
    args["link_topk"] = min(args["link_topk"], args["memory_size"])
    return args


def dnc_check(module: nn.Module, args: dict[str, Any]) -> None:
    inputs = torch.randn(T, B, args["input_size"], dtype=dtype_of(args))
    run_padded(module, inputs, args["output_size"] or args["hidden_size"])


def layer_check(module: nn.Module, args: dict[str, Any]) -> None:
    inputs = torch.randn(T, B, args["d_model"], dtype=dtype_of(args))
    run_padded(module, inputs, args["d_model"])


def count(low: int, high: int) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]:
    return st.integers(low, high), bad_count


def real(low: float, high: float) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]:
    return st.floats(low, high), not_a_float


def choice(*values: Any) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]:
    return st.sampled_from(values), bad_choice


FLAG = (st.booleans(), bad_flag)

CORES: dict[str, CoreSpec] = {
    "RelationalMemory": CoreSpec(
        RelationalMemory,
        {
            "input_size": count(1, 4),
            "mem_slots": count(1, 3),
            "head_size": count(1, 3),
            "num_heads": count(1, 2),
            "num_blocks": count(1, 2),
            "attention_mlp_layers": count(1, 2),
            "forget_bias": real(-3, 3),
            "input_bias": real(-3, 3),
            "output_bias": real(-3, 3),
            "gate_style": choice("unit", "memory", None),
            "key_size": (st.one_of(st.none(), st.integers(0, 3)), not_an_int),
            "input_rows": (st.one_of(st.none(), st.integers(1, 2)), bad_count.filter(bool)),
            "query_rows": choice("all", "memory"),
            "output_gate": FLAG,
            "share_attention_mlp": FLAG,
            "trainable_gate_biases": FLAG,
            "implementation": choice("auto", "reference", "fast"),
            **factory,
        },
        rmc_fix,
        rmc_check,
    ),
    "DNC": CoreSpec(
        DNC,
        {
            "input_size": count(1, 4),
            "hidden_size": count(1, 6),
            "memory_size": count(1, 4),
            "word_size": count(1, 3),
            "num_read_heads": count(1, 2),
            "num_write_heads": count(1, 2),
            "output_size": (st.one_of(st.none(), st.integers(1, 3)), bad_count),
            "num_layers": count(1, 2),
            "compat": choice("paper", "deepmind"),
            # None is valid here: the compat's default clip (20 for 'deepmind', 0 for 'paper')
            "clip_value": (
                st.one_of(st.none(), st.floats(0, 30)),
                not_a_float.filter(lambda v: v is not None),
            ),
            "link": choice("dense", "sparse", "none"),
            "link_topk": count(1, 3),
            "usage_write_grad": FLAG,
            "dealloc_content": FLAG,
            "key_mask": FLAG,
            "link_sharpness": FLAG,
            "interface_clip": real(0, 30),
            **factory,
        },
        dnc_fix,
        dnc_check,
    ),
    "MemoryControllerLayer": CoreSpec(
        MemoryControllerLayer,
        {
            "d_model": count(1, 4),
            "memory_slots": count(1, 4),
            "word_size": count(1, 3),
            "read_heads": count(1, 2),
            "controller": choice("gru", "lstm"),
            "bidirectional": FLAG,
            "link": choice("dense", "sparse", "none"),
            "link_topk": count(1, 3),
            "interface_clip": real(0, 30),
            **factory,
        },
        lambda args: args | {"link_topk": min(args["link_topk"], args["memory_slots"])},
        layer_check,
    ),
}


@st.composite
def arguments(draw: st.DrawFn, spec: CoreSpec) -> tuple[dict[str, Any], str | None]:
    """A valid argument set, and (half of the time) one argument replaced by a bad value."""
    args = spec.fix({name: draw(valid) for name, (valid, _) in spec.arguments.items()})
    spoiled = draw(st.one_of(st.none(), st.sampled_from(sorted(spec.arguments))))
    if spoiled is not None:
        args[spoiled] = draw(spec.arguments[spoiled][1])
    return args, spoiled


@pytest.mark.parametrize("name", sorted(CORES))
def test_constructor_and_forward(name: str) -> None:
    spec = CORES[name]

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(arguments(spec))
    def check(drawn: tuple[dict[str, Any], str | None]) -> None:
        args, spoiled = drawn
        if spoiled is None:
            torch.manual_seed(0)
            spec.check(spec.build(**args), args)
            return
        with pytest.raises((ValueError, TypeError)) as info:
            spec.build(**args)
        assert spoiled in str(info.value), (spoiled, args[spoiled], str(info.value))

    check()


BAD_CALLS: dict[str, st.SearchStrategy[Any]] = {
    "input": st.one_of(
        st.sampled_from(["x", None, [[1.0]]]),
        st.builds(lambda f: torch.randn(T, B, f), st.integers(5, 7)),  # wrong feature size
        st.builds(lambda: torch.randn(T, 4)),  # no batch axis
        st.builds(lambda: torch.randn(0, B, 4)),  # empty time axis
        st.builds(lambda: torch.ones(T, B, 4, dtype=torch.long)),
        st.builds(lambda: torch.randn(T, B, 4, dtype=torch.float64)),
    ),
    "lengths": st.one_of(
        st.lists(st.integers(-3, -1), min_size=B, max_size=B),
        st.lists(st.integers(T + 1, T + 3), min_size=B, max_size=B),
        st.lists(st.integers(0, T), min_size=B + 1, max_size=B + 2),
        st.just([1.5] * B),
        st.just([True] * B),
        st.just("ab"),
        st.just([[1], [2, 3]]),
    ),
    "state": st.one_of(
        st.sampled_from([3, "state", [1.0]]),
        st.builds(lambda: torch.randn(B + 1, 2, 2)),
    ),
}
CALL_CORES: dict[str, Callable[[], nn.Module]] = {
    "RelationalMemory-fast": lambda: RelationalMemory(4, 2, 2, 2),
    "RelationalMemory-reference": lambda: RelationalMemory(4, 2, 2, 2, implementation="reference"),
    "DNC": lambda: DNC(4, 5, 4, 3, 2),
    "MemoryControllerLayer": lambda: MemoryControllerLayer(4, 4, 3, 2),
}


@pytest.mark.parametrize("name", sorted(CALL_CORES))
def test_a_bad_forward_argument_is_named(name: str) -> None:
    module = CALL_CORES[name]()

    @settings(max_examples=25, deadline=None)
    @given(
        st.sampled_from(sorted(BAD_CALLS)).flatmap(lambda a: st.tuples(st.just(a), BAD_CALLS[a]))
    )
    def check(spoiled: tuple[str, Any]) -> None:
        argument, value = spoiled
        call = {"input": torch.randn(T, B, 4), "state": None, "lengths": None, argument: value}
        with pytest.raises((ValueError, TypeError)) as info:
            module(call["input"], call["state"], lengths=call["lengths"])
        assert argument in str(info.value), (argument, value, str(info.value))

    check()
