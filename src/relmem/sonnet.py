"""Conversion between Sonnet v1 ``RelationalMemory`` variables and relmem's RMC.

Sonnet names its variables by creation order (``docs/rmc.md`` §8)::

    linear/w, linear/b                            input projection        [F, M], [M]
    per block j = 1..b:
      linear_{j}/w, /b                            qkv (head-major)        [M, Q], [Q]
      layer_norm_{3(j-1)}/gamma, /beta            qkv LayerNorm           [Q]
      layer_norm_{3(j-1)+1}/gamma, /beta          post-attention LN       [M]
      (block 1 only) mlp/linear_{i}/w, /b         shared MLP, i < L       [M, M], [M]
      layer_norm_{3(j-1)+2}/gamma, /beta          post-MLP LN             [M]
    linear_{b+1}/w, /b                            gate from input         [n·M, 2g], [2g]
    linear_{b+2}/w, /b                            gate from memory        [M, 2g], [2g]

``layer_norm_0`` is written ``layer_norm``. A TF linear computes ``x·w``, so a PyTorch weight
is ``wᵀ``; relmem stores qkv in Sonnet's head-major order, so no column permutation is needed.

Only configurations Sonnet can express convert: a shared attention MLP, no output gate and
constant gate biases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from relmem.cores.rmc import AttentionBlock, RelationalMemory, RelationalMemoryCell

SCOPE = "relational_memory/"

# (Sonnet name, parameter, whether the TF array is the transpose of the PyTorch tensor)
_Entry = tuple[str, Tensor, bool]


def _as_cell(module: RelationalMemoryCell | RelationalMemory) -> RelationalMemoryCell:
    if isinstance(module, RelationalMemory):
        return module.cell
    if isinstance(module, RelationalMemoryCell):
        return module
    raise TypeError(
        f"expected a RelationalMemoryCell or RelationalMemory, got {type(module).__name__}"
    )


def _layer_norm_name(index: int) -> str:
    return "layer_norm" if index == 0 else f"layer_norm_{index}"


def sonnet_layout(module: RelationalMemoryCell | RelationalMemory) -> list[_Entry]:
    """The Sonnet variables of ``module`` in creation order, paired with its parameters.

    Raises:
        ValueError: if the module uses an option Sonnet v1 does not have.
    """
    cell = _as_cell(module)
    cfg = cell.config
    unsupported = [
        name
        for name, on in (
            ("share_attention_mlp=False", not cfg.share_attention_mlp),
            ("output_gate=True", cfg.output_gate),
            ("trainable_gate_biases=True", cfg.trainable_gate_biases),
        )
        if on
    ]
    if unsupported:
        raise ValueError(
            "Sonnet v1's RelationalMemory has no equivalent of "
            + ", ".join(unsupported)
            + "; only the default variants convert"
        )
    entries: list[_Entry] = []

    def linear(name: str, layer: nn.Linear) -> None:
        entries.append((f"{name}/w", layer.weight, True))
        entries.append((f"{name}/b", layer.bias, False))

    def layer_norm(index: int, norm: nn.LayerNorm) -> None:
        entries.append((f"{_layer_norm_name(index)}/gamma", norm.weight, False))
        entries.append((f"{_layer_norm_name(index)}/beta", norm.bias, False))

    linear("linear", cell.input_projection)
    for j, block in enumerate(cast("Iterable[AttentionBlock]", cell.blocks), start=1):
        linear(f"linear_{j}", block.qkv)
        layer_norm(3 * (j - 1), block.qkv_norm)
        layer_norm(3 * (j - 1) + 1, block.attention_norm)
        if j == 1:
            for i, layer in enumerate(cast("Iterable[nn.Linear]", cell.mlp_for_block(0).layers)):
                linear(f"mlp/linear_{i}", layer)
        layer_norm(3 * (j - 1) + 2, block.mlp_norm)
    if cell.input_gate is not None and cell.memory_gate is not None:
        linear(f"linear_{cfg.num_blocks + 1}", cell.input_gate)
        linear(f"linear_{cfg.num_blocks + 2}", cell.memory_gate)
    return entries


def _normalise_name(name: str, scope: str) -> str:
    """Strip a trailing ``:0``, then ``scope`` and a ``relational_memory/`` scope in front."""
    if name.endswith(":0"):
        name = name[:-2]
    for prefix in (scope, SCOPE):
        if prefix and name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _scope_hint(given: Mapping[str, np.ndarray], expected: set[str]) -> str:
    """When no expected name was found but every given one ends in one, the prefix they share,
    as a hint to pass it as ``scope``; else nothing."""
    if expected & set(given):
        return ""
    prefixes = set()
    for name in given:  # the shortest prefix: mlp/linear_0/w also ends in linear_0/w
        lengths = [len(want) for want in expected if name.endswith("/" + want)]
        if not lengths:
            return ""
        prefixes.add(name[: -max(lengths)])
    if len(prefixes) != 1:
        return ""
    return f"\n(every name carries the prefix {next(iter(prefixes))!r}: pass it as scope)"


def load_variables(
    module: RelationalMemoryCell | RelationalMemory,
    variables: Mapping[str, np.ndarray],
    scope: str = "",
) -> None:
    """Fill ``module`` from a Sonnet v1 ``RelationalMemory``'s variables.

    Args:
        module: the target core; its configuration must match the Sonnet module's.
        variables: Sonnet variable name → NumPy array of any float dtype and byte order (or
            anything ``np.asarray`` accepts). Names may carry ``scope``, a leading
            ``relational_memory/`` scope and a trailing ``:0``. Optimizer slots (names ending
            in ``/Adam`` or ``/Adam_1``) are ignored.
        scope: a prefix the names carry before the module's own (``"rnn/"`` for
            ``rnn/relational_memory/linear/w``), as :func:`dump_variables` takes it.

    Raises:
        ValueError: listing every missing, unexpected or wrongly shaped variable; nothing is
            written unless every variable matches.
    """
    given: dict[str, np.ndarray] = {}
    for raw_name, value in variables.items():
        name = _normalise_name(raw_name, scope)
        if name.endswith(("/Adam", "/Adam_1")):
            continue
        if name in given:
            raise ValueError(f"variable {name!r} is given twice (as {raw_name!r} and another name)")
        given[name] = np.asarray(value)

    layout = sonnet_layout(module)
    expected = {name for name, _, _ in layout}
    problems = [f"missing: {name}" for name, _, _ in layout if name not in given]
    problems += [f"unexpected: {name}" for name in sorted(set(given) - expected)]
    for name, param, transpose in layout:
        if name not in given:
            continue
        want = tuple(param.shape[::-1]) if transpose else tuple(param.shape)
        if given[name].shape != want:
            got = list(given[name].shape)
            problems.append(f"shape of {name}: expected {list(want)}, got {got}")
        elif not np.issubdtype(given[name].dtype, np.floating):
            problems.append(f"dtype of {name}: expected a float array, got {given[name].dtype}")
    if problems:
        raise ValueError(
            "Sonnet variables do not match this RelationalMemory configuration "
            f"({_as_cell(module).extra_repr()}):\n  "
            + "\n  ".join(problems)
            + _scope_hint(given, expected)
        )
    # Every array converted before the first parameter is written: float64 in native byte
    # order holds any float array's values (float16/32/64 exactly) and copies into any dtype.
    tensors = [torch.from_numpy(np.asarray(given[name], dtype=np.float64)) for name, _, _ in layout]
    with torch.no_grad():
        for (_, param, transpose), tensor in zip(layout, tensors, strict=True):
            param.copy_(tensor.T if transpose else tensor)


def dump_variables(
    module: RelationalMemoryCell | RelationalMemory, scope: str = ""
) -> dict[str, np.ndarray]:
    """Export ``module``'s parameters under Sonnet v1's variable names and layouts.

    Args:
        module: the core to export.
        scope: prefix for every name, e.g. ``"relational_memory/"``; empty by default.

    Returns:
        Sonnet name → NumPy array in the parameters' dtype (bfloat16, which NumPy lacks, as
        float32), in Sonnet's creation order.
    """
    out: dict[str, np.ndarray] = {}
    for name, param, transpose in sonnet_layout(module):
        value = param.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()
        out[scope + name] = np.ascontiguousarray((value.T if transpose else value).numpy())
    return out
