"""TensorFlow 1's optimiser arithmetic, for the ``paper`` presets that translate TF code.

PyTorch's optimisers differ from TF1's ``tf.train`` ones in two places that the paper presets
meet (``docs/rl.md`` §4.5, ``docs/tasks.md``; the TF sources are
``tensorflow/python/training/rmsprop.py`` and ``adam.py``):

- **RMSProp**: TF1's ``RMSPropOptimizer`` starts its mean square ``ms`` at ones (its ``rms``
  slot's initialiser is ``init_ops.ones_initializer``), adds epsilon *inside* the square root
  and folds the learning rate into the momentum::

      ms  <- decay * ms + (1 - decay) * g^2
      mom <- momentum * mom + lr * g / sqrt(ms + eps)
      var <- var - mom

  ``torch.optim.RMSprop`` starts ``square_avg`` at 0 and divides by ``sqrt(square_avg) + eps``.
  :class:`TFRMSprop` computes TF's update.
- **Adam**: TF1's ``AdamOptimizer`` adds its epsilon to ``sqrt(v_t)`` before the bias
  correction (Kingma and Ba's "epsilon hat", the formula before their §2.1)::

      lr_t <- lr * sqrt(1 - beta2^t) / (1 - beta1^t)
      var  <- var - lr_t * m_t / (sqrt(v_t) + eps_hat)

  ``torch.optim.Adam`` adds it after: ``var -= lr / (1 - beta1^t) * m_t / (sqrt(v_t) /
  sqrt(1 - beta2^t) + eps)``. The two agree when ``eps = eps_hat / sqrt(1 - beta2^t)``, which
  :class:`AdamEpsHat` sets before every step (at step 1 with beta2 = 0.999, 32 times
  ``eps_hat``; the difference matters only for gradients near epsilon).

Gradient clipping by global norm needs no translation: ``nn.utils.clip_grad_norm_`` scales by
``clip / (norm + 1e-6)`` where TF's ``clip_by_global_norm`` scales by ``clip / max(norm,
clip)``, a relative difference of ``1e-6 / norm``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["AdamEpsHat", "TFRMSprop"]


class TFRMSprop(torch.optim.Optimizer):
    """TF1's ``tf.train.RMSPropOptimizer`` (not centred), see the module docstring.

    Args:
        params: the parameters or parameter groups.
        lr: the learning rate (folded into the momentum, as TF does).
        decay: the mean square's decay (TF's ``decay``; PyTorch's ``alpha``).
        momentum: TF's ``momentum``.
        eps: added to the mean square inside the square root.
        initial_mean_square: the mean square's value before the first step (TF: 1).
        weight_decay: an L2 term added to the gradient, as ``torch.optim.RMSprop`` adds it
            (TF's optimiser has none).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        decay: float = 0.9,
        momentum: float = 0.0,
        eps: float = 1e-10,
        initial_mean_square: float = 1.0,
        weight_decay: float = 0.0,
    ) -> None:
        if not lr > 0 or not eps > 0:
            raise ValueError(f"lr and eps must be positive, got lr={lr}, eps={eps}")
        if not 0 <= decay < 1 or not 0 <= momentum < 1:
            raise ValueError(f"decay and momentum must lie in [0, 1), got {decay}, {momentum}")
        if initial_mean_square < 0 or weight_decay < 0:
            raise ValueError(
                "initial_mean_square and weight_decay must be at least 0, got "
                f"{initial_mean_square}, {weight_decay}"
            )
        defaults = {
            "lr": lr,
            "decay": decay,
            "momentum": momentum,
            "eps": eps,
            "initial_mean_square": initial_mean_square,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One update of every parameter that has a gradient; ``closure`` as in PyTorch."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            decay, momentum = group["decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros(())
                    state["mean_square"] = torch.full_like(p, group["initial_mean_square"])
                    if momentum:
                        state["momentum_buffer"] = torch.zeros_like(p)
                state["step"] += 1
                ms = state["mean_square"]
                ms.mul_(decay).addcmul_(grad, grad, value=1 - decay)
                denominator = ms.add(group["eps"]).sqrt_()
                if momentum:
                    mom = state["momentum_buffer"]
                    mom.mul_(momentum).addcdiv_(grad, denominator, value=group["lr"])
                    p.sub_(mom)
                else:
                    p.addcdiv_(grad, denominator, value=-group["lr"])
        return loss


class AdamEpsHat(torch.optim.Adam):
    """``torch.optim.Adam`` whose epsilon is TF1's "epsilon hat" (module docstring): before
    each step every group's ``eps`` becomes ``eps_hat / sqrt(1 - beta2^t)``, ``t`` the step
    about to be taken (one count per group: its parameters step together).

    Args:
        params: the parameters or parameter groups.
        eps_hat: TF's epsilon.
        **kwargs: ``torch.optim.Adam``'s other arguments (not ``eps``, not ``amsgrad``).
    """

    def __init__(self, params: Iterable[Any], eps_hat: float = 1e-8, **kwargs: Any) -> None:
        if "eps" in kwargs or kwargs.get("amsgrad"):
            raise ValueError("AdamEpsHat takes eps_hat, not eps, and has no amsgrad")
        if not eps_hat > 0:
            raise ValueError(f"eps_hat must be positive, got {eps_hat}")
        super().__init__(params, eps=eps_hat, **kwargs)
        for group in self.param_groups:
            group["eps_hat"] = eps_hat

    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Set each group's ``eps`` for the coming step, then take Adam's step."""
        for group in self.param_groups:
            beta2 = group["betas"][1]
            if isinstance(beta2, Tensor):
                beta2 = beta2.item()
            t = 1 + next(
                (float(self.state[p]["step"]) for p in group["params"] if self.state.get(p)), 0.0
            )
            group["eps"] = group["eps_hat"] / math.sqrt(1.0 - beta2**t)
        return super().step(closure)
