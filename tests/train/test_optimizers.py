"""TensorFlow 1's optimiser arithmetic (``relmem.train.optimizers``) and the ``paper`` presets
that translate TF code: each update checked against a NumPy transcription of TF's own formula
(``tensorflow/python/training/rmsprop.py``, ``adam.py``, ``clip_ops.clip_by_global_norm``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from relmem.rl.tasks import build_boxworld  # noqa: F401  (registers the RL tasks' presets)
from relmem.tasks.registry import get_preset
from relmem.train.config import OptimConfig
from relmem.train.optimizers import AdamEpsHat, TFRMSprop
from relmem.train.trainer import make_optimizer


def tf_rmsprop(param, grads, lr, decay, momentum, eps, clip=None):
    """TF1's ApplyRMSProp after ``clip_by_global_norm`` (``clip`` None: none), ``ms`` from
    ones: the parameter after each gradient of ``grads`` (each a list, one per tensor)."""
    param = [p.copy() for p in param]
    ms = [np.ones_like(p) for p in param]
    mom = [np.zeros_like(p) for p in param]
    trajectory = []
    for step in grads:
        if clip is not None:
            norm = np.sqrt(sum((g * g).sum() for g in step))
            step = [g * clip * min(1.0 / norm, 1.0 / clip) for g in step]
        for i, g in enumerate(step):
            ms[i] = decay * ms[i] + (1 - decay) * g * g
            mom[i] = momentum * mom[i] + lr * g / np.sqrt(ms[i] + eps)
            param[i] = param[i] - mom[i]
        trajectory.append([p.copy() for p in param])
    return trajectory


def tf_adam(param, grads, lr, beta1, beta2, eps_hat):
    """TF1's ApplyAdam: ``lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)``, ``eps_hat`` outside."""
    m, v, out = np.zeros_like(param), np.zeros_like(param), []
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        param = param - lr * np.sqrt(1 - beta2**t) / (1 - beta1**t) * m / (np.sqrt(v) + eps_hat)
        out.append(param.copy())
    return out


def run_torch(optimizer_of, param, grads, clip=None):
    """The same in PyTorch (float64), clipping as the trainer does."""
    tensors = [torch.tensor(p, requires_grad=True) for p in param]
    optimizer = optimizer_of(tensors)
    trajectory = []
    for step in grads:
        for t, g in zip(tensors, step, strict=True):
            t.grad = torch.tensor(g)
        if clip is not None:
            nn.utils.clip_grad_norm_(tensors, clip)
        optimizer.step()
        trajectory.append([t.detach().numpy().copy() for t in tensors])
    return trajectory


def assert_trajectories_close(got, want, rtol):
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        for a, b in zip(g, w, strict=True):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=0, err_msg=f"step {step}")


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_tf_rmsprop_takes_tensorflows_steps(momentum: float) -> None:
    rng = np.random.default_rng(0)
    param = [rng.normal(size=(3, 4)), rng.normal(size=5)]
    grads = [[rng.normal(size=p.shape) * 0.3 for p in param] for _ in range(6)]
    want = tf_rmsprop(param, grads, lr=0.01, decay=0.9, momentum=momentum, eps=0.01)
    got = run_torch(
        lambda ps: TFRMSprop(ps, lr=0.01, decay=0.9, momentum=momentum, eps=0.01), param, grads
    )
    assert_trajectories_close(got, want, rtol=1e-12)


def test_tf_rmsprop_resumes_exactly_from_its_state_dict() -> None:
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=4) for _ in range(4)]
    whole = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    optimizer = TFRMSprop([whole], lr=0.1, momentum=0.5)
    for g in grads:
        whole.grad = torch.tensor(g)
        optimizer.step()
    halves = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    first = TFRMSprop([halves], lr=0.1, momentum=0.5)
    for g in grads[:2]:
        halves.grad = torch.tensor(g)
        first.step()
    second = TFRMSprop([halves], lr=0.1, momentum=0.5)
    second.load_state_dict(first.state_dict())
    for g in grads[2:]:
        halves.grad = torch.tensor(g)
        second.step()
    assert torch.equal(whole, halves)


@pytest.mark.parametrize("task", ["boxworld", "minipacman"])
def test_rl_paper_preset_takes_impalas_steps_on_mean_losses(task: str) -> None:
    """IMPALA's TF RMSProp (ms from ones, epsilon 0.01 inside the root, global-norm clip 40) on
    losses summed over a batch's K = B·T steps, against the preset's optimiser and clip on
    TorchRL's mean losses, whose gradients are those divided by K. Gradients of a few 1e-3 per
    element leave ms near its start for hundreds of steps, and the larger ones are clipped: the
    start, the epsilon's place and the clip's scale each show: the preset's former optimiser
    (PyTorch's RMSprop from 0, epsilon sqrt(0.01) / K outside the root, clip 40) took steps of
    0.6 to 3.8 times TF's norm here, TF's RMSProp with the clip left at 40 0.5 to 3.1 times,
    and with the mean square from 0 2.0 to 5.1 times."""
    config = get_preset(task, "paper")
    k = config.batch_size * config.task.unroll
    rng = np.random.default_rng(2)
    param = [rng.normal(size=(20, 10)), rng.normal(size=30)]
    scales = [1e-3, 1e-2, 3e-4, 2e-2, 1e-3, 5e-3, 1e-4, 1e-2]  # mean-loss gradient elements
    mean_grads = [[rng.normal(size=p.shape) * s for p in param] for s in scales]
    sum_grads = [[g * k for g in step] for step in mean_grads]
    want = tf_rmsprop(param, sum_grads, lr=config.optim.lr, decay=0.99, momentum=0.0, eps=0.01,
                      clip=40.0)  # fmt: skip
    got = run_torch(
        lambda ps: make_optimizer(ps, config.optim), param, mean_grads, clip=config.optim.grad_clip
    )
    # clip_grad_norm_ divides by (norm + 1e-6), TF by max(norm, clip): 1e-6 / 0.03 relative
    assert_trajectories_close(got, want, rtol=1e-4)


def test_adam_eps_hat_takes_tensorflows_steps() -> None:
    """Gradients near epsilon, where its place shows: TF's update at every step, for the
    unfused and the fused kernel; torch.optim.Adam's differs (the check can fail)."""
    rng = np.random.default_rng(3)
    param = rng.normal(size=6)
    grads = [rng.normal(size=6) * 1e-8 for _ in range(5)]
    want = [[p] for p in tf_adam(param, grads, 1e-3, 0.9, 0.999, 1e-8)]
    for fused in (False, True):
        got = run_torch(
            lambda ps, fused=fused: AdamEpsHat(ps, lr=1e-3, eps_hat=1e-8, fused=fused),
            [param],
            [[g] for g in grads],
        )
        assert_trajectories_close(got, want, rtol=1e-10)
    plain = run_torch(
        lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1e-8), [param], [[g] for g in grads]
    )
    with pytest.raises(AssertionError):
        assert_trajectories_close(plain, want, rtol=1e-3)


@pytest.mark.parametrize(
    ("task", "preset"),
    [("nth-farthest", "paper"), ("nth-farthest", "dnc-paper"), ("lte", "paper"), ("lm", "paper")],
)
def test_paper_presets_from_tensorflow_use_its_adam(task: str, preset: str) -> None:
    """DeepMind's TF code (Sonnet's examples for Nth Farthest and Learning to Execute, the
    paper's LM) used ``tf.train.AdamOptimizer``: epsilon hat."""
    optim = get_preset(task, preset).optim
    assert optim.optimizer == "adam" and optim.eps_hat and optim.eps == 1e-8
    assert isinstance(make_optimizer([nn.Parameter(torch.zeros(2))], optim), AdamEpsHat)


def test_eps_hat_is_adams_alone() -> None:
    with pytest.raises(ValueError, match="eps_hat is Adam's"):
        OptimConfig(optimizer="rmsprop", eps_hat=True)
    with pytest.raises(ValueError, match="initial_mean_square"):
        OptimConfig(optimizer="rmsprop-tf", initial_mean_square=-1.0)
