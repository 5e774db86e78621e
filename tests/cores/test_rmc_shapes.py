"""RMC shapes, gradients and parameter counts
(``docs/rmc.md`` §2, §6, §12.1, §12.2, §12.4, §12.8)."""

from __future__ import annotations

import itertools

import pytest
import torch

from relmem import RelationalMemory, RelationalMemoryCell, RMCState

F_IN, N, H, D, B, T = 3, 2, 2, 2, 2, 3
M = H * D


# Every combination of the options (output_gate and trainable_gate_biases need gating).
_COMBOS = [
    combo
    for combo in itertools.product(
        [None, 2],  # input_rows (vector / matrix mode)
        ["unit", "memory", None],  # gate_style
        [1, 2],  # num_blocks
        [None, 3],  # key_size (None: K = D = 2)
        ["all", "memory"],  # query_rows
        [False, True],  # output_gate
        [True, False],  # share_attention_mlp
        [False, True],  # trainable_gate_biases
    )
    if combo[1] is not None or not (combo[5] or combo[7])
]


def _combo_id(combo: tuple) -> str:
    rows, gate, blocks, key, query, out_gate, share, trainable = combo
    parts = [
        "vector" if rows is None else f"matrix{rows}",
        f"gate-{gate}",
        f"b{blocks}",
        "K=D" if key is None else f"K{key}",
        f"q-{query}",
    ]
    parts += ["outgate"] if out_gate else []
    parts += [] if share else ["own-mlp"]
    parts += ["trainable-bias"] if trainable else []
    return ",".join(parts)


def _kwargs(combo: tuple) -> dict:
    rows, gate, blocks, key, query, out_gate, share, trainable = combo
    return {
        "input_size": F_IN,
        "mem_slots": N,
        "head_size": D,
        "num_heads": H,
        "num_blocks": blocks,
        "gate_style": gate,
        "key_size": key,
        "input_rows": rows,
        "query_rows": query,
        "output_gate": out_gate,
        "share_attention_mlp": share,
        "trainable_gate_biases": trainable,
    }


def _assert_all_grads(module: torch.nn.Module) -> None:
    for name, param in module.named_parameters():
        assert param.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
        assert param.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("combo", _COMBOS, ids=[_combo_id(c) for c in _COMBOS])
def test_shapes_and_gradients_every_option_combination(combo):
    torch.manual_seed(0)
    kwargs = _kwargs(combo)
    rows = kwargs["input_rows"]
    step_shape = (B, F_IN) if rows is None else (B, rows, F_IN)

    # Cell.
    cell = RelationalMemoryCell(**kwargs)
    out, state = cell(torch.randn(step_shape))
    assert out.shape == (B, N * M)
    assert isinstance(state, RMCState)
    assert state.memory.shape == (B, N, M)
    assert (state.hidden is not None) == kwargs["output_gate"]
    if state.hidden is not None:
        assert state.hidden.shape == (B, N, M)
    out2, _ = cell(torch.randn(step_shape), state)
    (out2 * torch.randn_like(out2)).sum().backward()
    _assert_all_grads(cell)

    # Sequence, both layouts.
    for batch_first in (False, True):
        core = RelationalMemory(**kwargs, batch_first=batch_first)
        lead = (B, T) if batch_first else (T, B)
        output, final = core(torch.randn(*lead, *step_shape[1:]))
        assert output.shape == (*lead, N * M)
        assert final.memory.shape == (B, N, M)
        (output * torch.randn_like(output)).sum().backward()
        _assert_all_grads(core)


def test_sizes_properties():
    cell = RelationalMemoryCell(input_size=5, mem_slots=4, head_size=32, num_heads=2)
    assert cell.state_size == torch.Size([4, 64])
    assert cell.output_size == 4 * 64
    core = RelationalMemory(input_size=5, mem_slots=4, head_size=32, num_heads=2)
    assert core.state_size == torch.Size([4, 64])
    assert core.output_size == 256


# ---------------------------------------------------------------- `docs/rmc.md` §12.1


@pytest.mark.parametrize("mode", ["vector", "matrix"])
def test_acceptance_shapes_input_5x3x3(mode):
    """``docs/rmc.md`` §12.1: input [5, 3, 3], N=4, D=32, H=2, in both modes."""
    torch.manual_seed(0)
    n_slots, d, h = 4, 32, 2
    u = torch.randn(5, 3, 3)
    if mode == "vector":  # [B=5, 3, 3] flattened to F = 9
        cell = RelationalMemoryCell(input_size=9, mem_slots=n_slots, head_size=d, num_heads=h)
    else:  # [B=5, n=3, F=3]
        cell = RelationalMemoryCell(
            input_size=3, mem_slots=n_slots, head_size=d, num_heads=h, input_rows=3
        )
    assert cell.state_size == torch.Size([n_slots, h * d])
    assert cell.output_size == n_slots * h * d
    out, state = cell(u)
    assert out.shape == (5, n_slots * h * d)
    assert state.memory.shape == (5, n_slots, h * d)
    # The output is the new memory flattened row-major (`docs/rmc.md` §4.7).
    torch.testing.assert_close(out, state.memory.reshape(5, -1), rtol=0, atol=0)


# ---------------------------------------------------------------- `docs/rmc.md` §12.2


@pytest.mark.parametrize("n_slots,d,h", [(2, 2, 1), (4, 4, 2), (8, 8, 3), (16, 16, 4)])
def test_initial_state_and_two_steps(n_slots, d, h):
    """``docs/rmc.md`` §12.2 and §3: identity padded (M > N) or cut (M < N); two steps with b=5."""
    torch.manual_seed(0)
    m = h * d
    cell = RelationalMemoryCell(
        input_size=3, mem_slots=n_slots, head_size=d, num_heads=h, num_blocks=5
    )
    state = cell.initial_state(2)
    assert state.memory.shape == (2, n_slots, m)
    assert not state.memory.requires_grad
    expected = torch.zeros(n_slots, m)
    for i in range(min(n_slots, m)):
        expected[i, i] = 1.0
    for b in range(2):
        assert torch.equal(state.memory[b], expected)
    for _ in range(2):
        out, state = cell(torch.randn(2, 3), state)
        assert out.shape == (2, n_slots * m)
        assert state.memory.shape == (2, n_slots, m)
        assert torch.isfinite(state.memory).all()


def test_initial_state_reduction_when_m_lt_n():
    """M < N: the first M columns of the N×N identity; rows M..N-1 are all zero."""
    cell = RelationalMemoryCell(input_size=3, mem_slots=5, head_size=3, num_heads=1)
    memory = cell.initial_state(1).memory[0]
    assert torch.equal(memory[:3], torch.eye(3))
    assert torch.equal(memory[3:], torch.zeros(2, 3))


# ---------------------------------------------------------------- `docs/rmc.md` §12.4


@pytest.mark.parametrize("gate_style,g", [("unit", 8), ("memory", 1)])
@pytest.mark.parametrize("output_gate", [False, True], ids=["plain", "outgate"])
def test_gate_shapes_are_batch_slots_g(gate_style, g, output_gate):
    """``docs/rmc.md`` §12.4: gates are [B, N, g] (N=3 != H=2, unlike Sonnet's own test)."""
    torch.manual_seed(0)
    cell = RelationalMemoryCell(
        input_size=3,
        mem_slots=3,
        head_size=4,
        num_heads=2,
        num_blocks=2,
        gate_style=gate_style,
        output_gate=output_gate,
    )
    _, _, details = cell(torch.randn(5, 3), return_details=True)
    assert details.input_gate.shape == (5, 3, g)
    assert details.forget_gate.shape == (5, 3, g)
    if output_gate:
        assert details.output_gate.shape == (5, 3, g)
    else:
        assert details.output_gate is None
    assert len(details.attention) == 2
    for weights in details.attention:
        assert weights.shape == (5, 2, 4, 4)  # [B, H, N+n, N+n]
        torch.testing.assert_close(weights.sum(-1), torch.ones(5, 2, 4))
    # No gate tensors are stored on the module by forward (`docs/rmc.md` §4.9).
    assert not any(isinstance(v, torch.Tensor) for v in vars(cell).values())


def test_no_gates_when_gate_style_none():
    cell = RelationalMemoryCell(input_size=3, mem_slots=2, head_size=2, gate_style=None)
    _, _, details = cell(torch.randn(2, 3), return_details=True)
    assert details.input_gate is None and details.forget_gate is None
    assert details.output_gate is None


def test_attention_details_memory_queries_shape():
    cell = RelationalMemoryCell(
        input_size=3, mem_slots=3, head_size=2, num_heads=2, input_rows=2, query_rows="memory"
    )
    _, _, details = cell(torch.randn(4, 2, 3), return_details=True)
    assert details.attention[0].shape == (4, 2, 3, 5)  # [B, H, N, N+n]


# ---------------------------------------------------------------- `docs/rmc.md` §6.3 / §12.8


def _formula(f, m_slots, h, d, k, L, b, gate, n=1, per_block_mlp=False, out_gate=False):
    """``docs/rmc.md`` §6.2; independent of mem_slots by construction."""
    del m_slots
    m = h * d
    q = h * (2 * k + d)
    g = {"unit": m, "memory": 1, None: 0}[gate]
    gg = (3 if out_gate else 2) * g
    mlp = L * (m * m + m) * (b if per_block_mlp else 1)
    gates = (gg * n * m + gg + gg * m + gg) if gate else 0
    return f * m + m + b * (m * q + 3 * q + 4 * m) + mlp + gates


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# (id, constructor kwargs, expected P from the table)
_TABLE = [
    ("toy-unit", {"input_size": 15, "mem_slots": 2, "num_heads": 2, "head_size": 4}, 856),
    (
        "toy-memory",
        {"input_size": 15, "mem_slots": 2, "num_heads": 2, "head_size": 4, "gate_style": "memory"},
        604,
    ),
    (
        "toy-none",
        {"input_size": 15, "mem_slots": 2, "num_heads": 2, "head_size": 4, "gate_style": None},
        568,
    ),
    (
        "toy-b3",
        {"input_size": 15, "mem_slots": 2, "num_heads": 2, "head_size": 4, "num_blocks": 3},
        1448,
    ),
    (
        "toy-b3-per-block-mlp",
        {
            "input_size": 15,
            "mem_slots": 2,
            "num_heads": 2,
            "head_size": 4,
            "num_blocks": 3,
            "share_attention_mlp": False,
        },
        1736,
    ),
    (
        "nth-farthest-unit",
        {"input_size": 40, "mem_slots": 8, "num_heads": 8, "head_size": 32},
        605_184,
    ),
    (
        "nth-farthest-memory",
        {"input_size": 40, "mem_slots": 8, "num_heads": 8, "head_size": 32, "gate_style": "memory"},
        343_044,
    ),
    (
        "paper-lm-core",
        {
            "input_size": 512,
            "mem_slots": 1,
            "num_heads": 4,
            "head_size": 625,
            "attention_mlp_layers": 5,
        },
        76_337_500,
    ),
    (
        "sonnet-nth-farthest-as-run",
        {"input_size": 16, "mem_slots": 4, "num_heads": 4, "head_size": 2048, "num_blocks": 4},
        1_208_573_952,
    ),
    (
        "sonnet-nth-farthest-flags-honoured",
        {"input_size": 16, "mem_slots": 4, "num_heads": 1, "head_size": 2048, "num_blocks": 1},
        37_822_464,
    ),
]


@pytest.mark.parametrize("kwargs,expected", [t[1:] for t in _TABLE], ids=[t[0] for t in _TABLE])
def test_parameter_count_matches_spec_table(kwargs, expected):
    # Built on the meta device: no memory is allocated, even for the 1.2B-parameter row.
    cell = RelationalMemoryCell(**kwargs, device="meta")
    assert all(p.device.type == "meta" for p in cell.parameters())
    assert _count(cell) == expected
    # The `docs/rmc.md` §6.2 formula agrees with the table.
    h, d = kwargs["num_heads"], kwargs["head_size"]
    assert (
        _formula(
            kwargs["input_size"],
            kwargs["mem_slots"],
            h,
            d,
            d,
            kwargs.get("attention_mlp_layers", 2),
            kwargs.get("num_blocks", 1),
            kwargs.get("gate_style", "unit"),
            per_block_mlp=not kwargs.get("share_attention_mlp", True),
        )
        == expected
    )


def test_small_table_rows_on_cpu_and_sequence_module():
    for _, kwargs, expected in _TABLE[:5]:
        assert _count(RelationalMemoryCell(**kwargs)) == expected
        assert _count(RelationalMemory(**kwargs)) == expected


def test_vector_input_5x3_gives_f15_count():
    """The table's F=15 comes from a [B, 5, 3] input flattened in vector mode."""
    cell = RelationalMemoryCell(input_size=15, mem_slots=2, num_heads=2, head_size=4)
    out, _ = cell(torch.randn(4, 5, 3))
    assert out.shape == (4, 16)


@pytest.mark.parametrize("mem_slots", [1, 3, 7])
def test_parameter_count_independent_of_mem_slots(mem_slots):
    kwargs = {"input_size": 15, "num_heads": 2, "head_size": 4}
    assert _count(RelationalMemoryCell(mem_slots=mem_slots, **kwargs)) == 856
    assert _count(RelationalMemoryCell(mem_slots=mem_slots, input_rows=3, **kwargs)) == _formula(
        15, mem_slots, 2, 4, 4, 2, 1, "unit", n=3
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"key_size": 3},
        {"input_rows": 3, "gate_style": "memory"},
        {"output_gate": True},
        {
            "output_gate": True,
            "gate_style": "memory",
            "num_blocks": 2,
            "share_attention_mlp": False,
        },
        {"attention_mlp_layers": 1, "num_blocks": 2},
    ],
    ids=["K3", "matrix3-memory", "outgate", "outgate-memory-b2-own-mlp", "L1-b2"],
)
def test_parameter_count_formula_for_variants(extra):
    kwargs = dict(input_size=5, mem_slots=2, num_heads=2, head_size=4, **extra)
    cell = RelationalMemoryCell(**kwargs)
    expected = _formula(
        5,
        2,
        2,
        4,
        extra.get("key_size", 4),
        extra.get("attention_mlp_layers", 2),
        extra.get("num_blocks", 1),
        extra.get("gate_style", "unit"),
        n=extra.get("input_rows", 1),
        per_block_mlp=not extra.get("share_attention_mlp", True),
        out_gate=extra.get("output_gate", False),
    )
    assert _count(cell) == expected


def test_trainable_gate_biases_add_scalars_only():
    base = _count(RelationalMemoryCell(input_size=5, mem_slots=2, head_size=4))
    assert (
        _count(
            RelationalMemoryCell(input_size=5, mem_slots=2, head_size=4, trainable_gate_biases=True)
        )
        == base + 2
    )
    # The constant biases are not parameters and not in the state_dict (`docs/rmc.md` §2).
    sd = RelationalMemoryCell(input_size=5, mem_slots=2, head_size=4).state_dict()
    assert not any("bias" in k and "gate_biases" in k for k in sd)
    assert "gate_biases" not in sd
