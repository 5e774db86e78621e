"""The rmc package's shape: one-way imports, the weights as data, construction from a config."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import relmem
from relmem.cores.rmc import (
    RelationalMemory,
    RelationalMemoryCell,
    RMCConfig,
    RMCWeights,
    fast_cell_step,
)

PACKAGE = Path(relmem.__file__).parent / "cores" / "rmc"
# What each file may import from relmem.cores.rmc: config <- (reference, fast) <- module, and
# fast <- fused (the fast step's operators in C++) <- module.
ALLOWED = {
    "config": set(),
    "reference": {"config"},
    "fast": {"config"},
    "fused": {"fast"},
    "module": {"config", "reference", "fast", "fused"},
    "__init__": {"config", "reference", "fast", "module"},
}


def _package_imports(path: Path) -> set[str]:
    """The rmc submodules ``path`` imports, anywhere in the file (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("relmem.cores.rmc."):
                found.add(name.split(".")[3])
            elif name == "relmem.cores.rmc":
                found.add("__init__")
    return found


def test_every_file_of_the_package_is_listed() -> None:
    assert {path.stem for path in PACKAGE.glob("*.py")} == set(ALLOWED)


@pytest.mark.parametrize("name", list(ALLOWED))
def test_imports_run_one_way(name: str) -> None:
    imports = _package_imports(PACKAGE / f"{name}.py")
    assert imports <= ALLOWED[name], f"{name}.py imports {sorted(imports - ALLOWED[name])}"


def test_config_holds_no_modules() -> None:
    tree = ast.parse((PACKAGE / "config.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert "nn" not in imported and "Module" not in imported


def _core(**overrides) -> RelationalMemory:
    torch.manual_seed(0)
    kwargs = {"input_size": 5, "mem_slots": 3, "head_size": 4, "num_heads": 2, **overrides}
    return RelationalMemory(**kwargs, dtype=torch.float64)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"gate_style": None},
        {"num_blocks": 2, "share_attention_mlp": False},
        {"trainable_gate_biases": True, "output_gate": True},
    ],
    ids=["default", "no-gate", "per-block-mlp", "trainable-biases"],
)
def test_fast_weights_are_the_parameters_themselves(overrides) -> None:
    cell = _core(**overrides).cell
    weights = cell.fast_weights()
    assert isinstance(weights, RMCWeights) and len(weights.blocks) == cell.config.num_blocks
    leaves = [
        weights.input_w,
        weights.input_b,
        weights.input_gate_w,
        weights.input_gate_b,
        weights.memory_gate_w,
        weights.memory_gate_b,
        weights.gate_biases,
    ]
    for block in weights.blocks:
        leaves += [block.qkv_w, block.qkv_b, *block.qkv_ln, *block.attn_ln, *block.mlp_ln]
        leaves += [t for layer in block.mlp for t in layer]
    present = {id(t) for t in leaves if t is not None}
    assert present == {id(p) for p in cell.parameters()}  # every parameter, no copies
    mlps = [block.mlp[0][0] for block in weights.blocks]
    shared = cell.config.share_attention_mlp
    assert all((w is mlps[0]) == shared for w in mlps[1:])


def test_the_fast_step_reads_only_the_weights_it_is_given() -> None:
    cell = _core().cell
    rows = torch.randn(2, 1, 5, dtype=torch.float64)
    state = cell.initial_state(2)
    weights = cell.fast_weights()
    doubled = weights._replace(input_w=2 * weights.input_w)
    want, _ = fast_cell_step(cell.config, weights, rows, state)
    got, _ = fast_cell_step(cell.config, doubled, rows / 2, state)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_from_config_equals_the_argument_form() -> None:
    config = RMCConfig(5, 3, 4, num_heads=2, num_blocks=2, gate_style="memory", output_gate=True)
    torch.manual_seed(0)
    core = RelationalMemory.from_config(config, batch_first=True, implementation="reference")
    torch.manual_seed(0)
    same = RelationalMemory(
        5,
        3,
        4,
        2,
        2,
        1.0,
        0.0,
        "memory",
        2,
        None,
        None,
        True,
        output_gate=True,
        implementation="reference",
    )
    assert core.config == config == same.config
    assert core.batch_first and core.implementation == "reference"
    for (name, a), (_, b) in zip(core.state_dict().items(), same.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    cell = RelationalMemoryCell.from_config(config, dtype=torch.float64)
    assert cell.config == config and cell.input_projection.weight.dtype == torch.float64


def test_constructor_signature_is_the_configs() -> None:
    cell = inspect.signature(RelationalMemoryCell).parameters
    core = inspect.signature(RelationalMemory).parameters
    fields = list(RMCConfig.__dataclass_fields__)
    assert list(cell) == [*fields, "implementation", "device", "dtype"]
    assert list(core) == [
        *fields[:11],
        "batch_first",
        *fields[11:],
        "implementation",
        "device",
        "dtype",
    ]
    assert core["batch_first"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert core["query_rows"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="missing a required argument: 'head_size'"):
        RelationalMemory(5, 3)
    with pytest.raises(TypeError, match="too many positional arguments"):
        RelationalMemoryCell(5, 3, 4, 1, 1, 1.0, 0.0, "unit", 2, None, None, "all")
    with pytest.raises(TypeError, match="unexpected keyword argument 'mem_size'"):
        RelationalMemoryCell(5, 3, 4, mem_size=8)


def test_argument_documentation_is_the_configs() -> None:
    config_doc = inspect.getdoc(RMCConfig) or ""
    for cls in (RelationalMemoryCell, RelationalMemory):
        doc = inspect.getdoc(cls) or ""
        for name in inspect.signature(cls).parameters:
            assert f"{name}:" in doc or f"{name}," in doc, (cls.__name__, name)
        entry = "forget_bias: constant added to the forget gate's pre-activation"
        assert entry in doc and entry in config_doc
