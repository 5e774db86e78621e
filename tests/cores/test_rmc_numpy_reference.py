"""The RMC against an independent float64 NumPy implementation of ``docs/rmc.md`` §4 (§12.9).

The NumPy code below is written from ``docs/rmc.md`` (§3, §4 and §9), not from
``rmc.py``: it uses explicit per-head loops, TF's ``x @ w`` weight layout and no torch ops. The
torch module's parameters (LayerNorm γ/β and every bias included) are randomised and then read
out into NumPy arrays.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relmem import RelationalMemoryCell

# ---------------------------------------------------------------- the NumPy reference


def np_layer_norm(z, gamma, beta):
    """``docs/rmc.md`` §4.8: per row over the last axis, biased variance, eps 1e-5."""
    mean = z.mean(axis=-1, keepdims=True)
    var = ((z - mean) ** 2).mean(axis=-1, keepdims=True)
    return (z - mean) / np.sqrt(var + 1e-5) * gamma + beta


def np_softmax(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def read_params(cell: RelationalMemoryCell) -> dict:
    """The module's parameters as float64 NumPy arrays in TF's layout (``y = x @ w + b``)."""

    def lin(linear):
        return (
            linear.weight.detach().double().numpy().T.copy(),
            linear.bias.detach().double().numpy().copy(),
        )

    def norm(layer_norm):
        return (
            layer_norm.weight.detach().double().numpy().copy(),
            layer_norm.bias.detach().double().numpy().copy(),
        )

    cfg = cell.config
    params = {
        "in": lin(cell.input_projection),
        "blocks": [
            {
                "qkv": lin(b.qkv),
                "ln_qkv": norm(b.qkv_norm),
                "ln_a": norm(b.attention_norm),
                "ln_m": norm(b.mlp_norm),
            }
            for b in cell.blocks
        ],
        "mlps": [[lin(layer) for layer in mlp.layers] for mlp in cell.mlps],
    }
    if cfg.gate_style is not None:
        params["gx"] = lin(cell.input_gate)
        params["gm"] = lin(cell.memory_gate)
        if cell.gate_biases is not None:
            params["gate_bias"] = [float(v) for v in cell.gate_biases.detach().double()]
        else:
            params["gate_bias"] = [cfg.input_bias, cfg.forget_bias, cfg.output_bias]
    return params


def np_step(cfg, P, u, m, h_prev=None, mutation=None):
    """One step of ``docs/rmc.md`` §4 (and §9.1–§9.4).

    Args:
        cfg: the RMCConfig (only its plain hyper-parameters are read).
        P: parameters from :func:`read_params`.
        u: ``[B, n, F]`` step input. m: ``[B, N, M]`` previous memory.
        h_prev: ``[B, N, M]`` previous hidden state (output-gate variant only).
        mutation: a deliberate bug, used to prove the comparison can fail.

    Returns:
        ``(output [B, N*M], m_new, h_new or None)``.
    """
    B, n_slots, M = m.shape
    H, D = cfg.num_heads, cfg.head_size
    K = cfg.key_size or D
    n = u.shape[1]

    w_in, b_in = P["in"]
    x = u @ w_in + b_in  # 4.1: [B, n, M]

    def block(k, rows, num_queries):
        bp = P["blocks"][k]
        w, b = bp["qkv"]
        z = np_layer_norm(rows @ w + b, *bp["ln_qkv"])  # [B, R, Q], joint LN over Q
        attended = np.zeros((B, num_queries, M))
        scale = (2 * K + D) ** -0.5 if mutation == "old_scale" else K**-0.5
        for j in range(H):  # head-major chunks [q_j k_j v_j]
            chunk = z[:, :, j * (2 * K + D) : (j + 1) * (2 * K + D)]
            q = chunk[:, :num_queries, :K]
            key = chunk[:, :, K : 2 * K]
            v = chunk[:, :, 2 * K :]
            weights = np_softmax((q * scale) @ key.transpose(0, 2, 1))  # [B, R_q, R]
            attended[:, :, j * D : (j + 1) * D] = weights @ v
        hq = np_layer_norm(rows[:, :num_queries] + attended, *bp["ln_a"])
        layers = P["mlps"][0 if cfg.share_attention_mlp else k]
        y = hq
        for index, (w_l, b_l) in enumerate(layers):
            if index > 0:
                y = np.maximum(y, 0.0)
            y = y @ w_l + b_l
        if mutation == "relu_after_last":
            y = np.maximum(y, 0.0)
        return np_layer_norm(y + hq, *bp["ln_m"])

    if cfg.query_rows == "all":
        h = np.concatenate([m, x], axis=1)  # 4.2: [B, N+n, M]
        for k in range(cfg.num_blocks):
            h = block(k, h, n_slots + n)
        m_tilde = h[:, :n_slots]  # 4.4
    else:  # 9.1: input rows are the fixed x in every block; only memory rows query
        m_tilde = m
        for k in range(cfg.num_blocks):
            m_tilde = block(k, np.concatenate([m_tilde, x], axis=1), n_slots)

    if cfg.gate_style is None:  # 4.6
        return m_tilde.reshape(B, -1), m_tilde, None

    g = M if cfg.gate_style == "unit" else 1
    w_gx, b_gx = P["gx"]
    w_gm, b_gm = P["gm"]
    flat_x = x.reshape(B, n * M)  # projected input rows, row-major
    if cfg.output_gate:
        recurrent = h_prev
    elif mutation == "raw_memory_gate":
        recurrent = m
    else:
        recurrent = np.tanh(m)
    G = recurrent @ w_gm + b_gm + (flat_x @ w_gx + b_gx)[:, None, :]  # [B, N, 2g or 3g]
    i_pre, f_pre = G[..., :g], G[..., g : 2 * g]
    if mutation == "swap_gates":
        i_pre, f_pre = f_pre, i_pre
    bias_i, bias_f, bias_o = (list(P["gate_bias"]) + [0.0])[:3]
    i_gate = np_sigmoid(i_pre + bias_i)
    f_gate = np_sigmoid(f_pre + bias_f)
    m_new = i_gate * np.tanh(m_tilde) + f_gate * m  # 4.5
    if not cfg.output_gate:
        return m_new.reshape(B, -1), m_new, None
    o_gate = np_sigmoid(G[..., 2 * g : 3 * g] + bias_o)  # 9.2
    h_new = o_gate * np.tanh(m_new)
    return h_new.reshape(B, -1), m_new, h_new


# ---------------------------------------------------------------- test set-up


def randomise_(cell: RelationalMemoryCell, seed: int) -> None:
    """Random weights, LN γ/β and biases (all non-trivial), deterministic from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in cell.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.3 * noise)  # γ
            elif name.endswith("bias") or name == "gate_biases" or "norm" in name:
                param.copy_(0.3 * noise)  # β and linear biases
            else:
                param.mul_(1.5).add_(0.05 * noise)  # weights: Sonnet init, perturbed


CASES = {
    "vector-unit-b2-K3": {"gate_style": "unit", "key_size": 3},
    "matrix2-unit-b2-K3": {"gate_style": "unit", "key_size": 3, "input_rows": 2},
    "vector-memory-b2-K5": {"gate_style": "memory", "key_size": 5},
    "matrix3-memory-b2-K1": {"gate_style": "memory", "key_size": 1, "input_rows": 3},
    "vector-none-b2-K3": {"gate_style": None, "key_size": 3},
    "matrix2-none-b2-K3-qmem": {
        "gate_style": None,
        "key_size": 3,
        "input_rows": 2,
        "query_rows": "memory",
    },
    "vector-unit-b2-K3-qmem": {"gate_style": "unit", "key_size": 3, "query_rows": "memory"},
    "matrix2-memory-b2-qmem": {"gate_style": "memory", "input_rows": 2, "query_rows": "memory"},
    "vector-unit-b2-K3-outgate": {
        "gate_style": "unit",
        "key_size": 3,
        "output_gate": True,
        "output_bias": 0.4,
    },
    "matrix2-memory-b2-outgate-qmem": {
        "gate_style": "memory",
        "input_rows": 2,
        "output_gate": True,
        "query_rows": "memory",
    },
    "vector-unit-b2-own-mlp-L3-trainable": {
        "share_attention_mlp": False,
        "attention_mlp_layers": 3,
        "trainable_gate_biases": True,
        "key_size": 3,
    },
    "matrix2-unit-b1-L1-outgate-trainable": {
        "num_blocks": 1,
        "attention_mlp_layers": 1,
        "input_rows": 2,
        "output_gate": True,
        "trainable_gate_biases": True,
    },
}


def build(
    case: str, dtype: torch.dtype, seed: int = 0, implementation: str = "auto"
) -> RelationalMemoryCell:
    kwargs = {
        "implementation": implementation,
        "input_size": 3,
        "mem_slots": 3,
        "head_size": 2,
        "num_heads": 2,
        "num_blocks": 2,
        "forget_bias": 0.7,
        "input_bias": -0.3,
        **CASES[case],
    }
    torch.manual_seed(seed)
    cell = RelationalMemoryCell(**kwargs, dtype=torch.float64)
    randomise_(cell, seed + 1)
    return cell.to(dtype)


def inputs(cell: RelationalMemoryCell, steps: int, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    n = cell.config.input_rows
    shape = (batch, cell.config.input_size) if n is None else (batch, n, cell.config.input_size)
    dtype = cell.input_projection.weight.dtype
    return [torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(steps)]


def run_both(cell, us, start, mutation=None):
    """Run torch and NumPy from the same state; return per-step (output, memory, hidden)."""
    cfg = cell.config
    state = start
    m = start.memory.detach().double().numpy()
    h = None if start.hidden is None else start.hidden.detach().double().numpy()
    P = read_params(cell)
    got, want = [], []
    for u in us:
        out, state = cell(u, state)
        got.append((out, state.memory, state.hidden))
        u_np = u.detach().double().numpy().reshape(u.shape[0], cfg.input_rows or 1, -1)
        y, m, h = np_step(cfg, P, u_np, m, h, mutation=mutation)
        want.append((y, m, h))
    return got, want


def rel_err(a: torch.Tensor, b: np.ndarray) -> float:
    a = a.detach().double().numpy()
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def assert_matches(got, want, tol):
    for step, ((out, mem, hid), (y, m, h)) in enumerate(zip(got, want, strict=True)):
        assert rel_err(out, y) <= tol, f"output differs at step {step}: {rel_err(out, y):.3e}"
        assert rel_err(mem, m) <= tol, f"memory differs at step {step}: {rel_err(mem, m):.3e}"
        assert (hid is None) == (h is None)
        if h is not None:
            assert rel_err(hid, h) <= tol, f"hidden differs at step {step}"


def random_state(cell, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = cell.input_projection.weight.dtype
    memory = torch.randn(batch, *cell.state_size, generator=gen, dtype=torch.float64).to(dtype)
    state = cell.initial_state(batch)
    hidden = None if state.hidden is None else torch.tanh(memory) * 0.5
    return type(state)(memory, hidden)


# ---------------------------------------------------------------- tests


def test_numpy_initial_state_matches_spec():
    for n_slots, d, h in [(2, 2, 1), (4, 4, 2), (5, 1, 3), (8, 8, 3)]:
        cell = RelationalMemoryCell(input_size=2, mem_slots=n_slots, head_size=d, num_heads=h)
        expected = np.zeros((n_slots, h * d))
        for i in range(min(n_slots, h * d)):
            expected[i, i] = 1.0
        np.testing.assert_array_equal(cell.initial_state(3).memory.numpy()[1], expected)


@pytest.mark.parametrize("implementation", ["auto", "reference"])
@pytest.mark.parametrize("case", list(CASES))
def test_float64_one_and_two_steps_match_numpy(case, implementation):
    """Both the fast path ('auto') and the plain reference loop against NumPy: the reference
    was checked only through the fast path (swapped gates in it were caught only there)."""
    cell = build(case, torch.float64, implementation=implementation)
    us = inputs(cell, steps=2, batch=2, seed=7)
    # From the identity initial state ...
    got, want = run_both(cell, us, cell.initial_state(2))
    assert_matches(got, want, 1e-10)
    # ... and from a random state (every memory entry non-trivial).
    got, want = run_both(cell, us, random_state(cell, 2, seed=8))
    assert_matches(got, want, 1e-10)


@pytest.mark.parametrize("case", list(CASES))
def test_float32_one_and_two_steps_match_numpy(case):
    cell = build(case, torch.float32)
    us = inputs(cell, steps=2, batch=2, seed=7)
    got, want = run_both(cell, us, random_state(cell, 2, seed=8))
    assert_matches(got, want, 1e-5)


@pytest.mark.parametrize(
    "case,mutation",
    [
        ("vector-unit-b2-K3", "old_scale"),
        ("vector-unit-b2-K3", "relu_after_last"),
        ("vector-unit-b2-K3", "swap_gates"),
        ("vector-memory-b2-K5", "raw_memory_gate"),
    ],
)
def test_reference_comparison_detects_known_port_bugs(case, mutation):
    """The comparison is sensitive: NumPy with a ``docs/rmc.md`` §11 pitfall no longer matches."""
    cell = build(case, torch.float64)
    us = inputs(cell, steps=2, batch=2, seed=7)
    got, want = run_both(cell, us, random_state(cell, 2, seed=8), mutation=mutation)
    worst = max(rel_err(out, y) for (out, _, _), (y, _, _) in zip(got, want, strict=True))
    assert worst > 1e-4
