"""The four Learning to Execute curricula and the reference's advance rule
(``docs/tasks.md`` §2.4).

A curriculum holds a level ``(length, nesting)``, starting at (1, 1), and draws each sample's
``(l, k)``:

- ``baseline``: always ``(L_max, N_max)`` (the evaluation setting);
- ``naive``: the current level; each advance adds 1 to the length up to ``L_max``, then 1 to
  the nesting up to ``N_max``;
- ``mix`` (the paper's): ``l ~ U{1..L_max}`` and ``k ~ U{1..N_max}`` independently per
  sample; it never advances;
- ``combine``: advances as naive; ``l ~ U{1..cur_l}``, ``k ~ U{1..cur_k}`` per sample.

:meth:`Curriculum.update` takes one evaluation loss. Once ``min_tries`` losses have arrived it
computes ``mean(loss[i+1] - loss[i]) / mean(loss)`` over the last ``clamp(min_tries, 5, 10)``
of them and advances (then starts counting again) when that is below ``threshold``. As in the
reference, any falling trend is below a positive threshold, so a falling loss advances;
``abs_trend`` compares ``|trend|`` instead (the loss has flattened).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

CURRICULA = ("baseline", "naive", "mix", "combine")


@dataclass
class Curriculum:
    """A curriculum's rule and state.

    Attributes:
        strategy: 'baseline', 'naive', 'mix' or 'combine'.
        max_length, max_nesting: L_max and N_max.
        min_tries: losses needed before an advance is considered (reference: 10).
        threshold: advance when the relative trend is below it (reference: 0.1).
        abs_trend: compare the trend's absolute value instead.
        length, nesting: the current level.
        losses: the recent evaluation losses (a window of ``clamp(min_tries, 5, 10)``).
        tries: losses received since the last advance.
    """

    strategy: str
    max_length: int
    max_nesting: int
    min_tries: int = 10
    threshold: float = 0.1
    abs_trend: bool = False
    length: int = 1
    nesting: int = 1
    losses: deque[float] = field(default_factory=deque)
    tries: int = 0

    def __post_init__(self) -> None:
        self.losses = deque(self.losses, maxlen=min(max(self.min_tries, 5), 10))

    @property
    def adaptive(self) -> bool:
        """Whether :meth:`update` can move the level (naive and combine)."""
        return self.strategy in ("naive", "combine")

    def ceiling(self) -> tuple[int, int]:
        """The largest ``(length, nesting)`` samples can have now."""
        if self.adaptive:
            return self.length, self.nesting
        return self.max_length, self.max_nesting

    def draw(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Each of ``n`` samples' ``(length [n], nesting [n])`` int64, on the CPU."""
        device = generator.device
        top_l, top_k = self.ceiling()
        if self.strategy in ("baseline", "naive"):
            full = torch.ones(n, dtype=torch.int64)
            return full * top_l, full * top_k
        lengths = torch.randint(1, top_l + 1, (n,), generator=generator, device=device)
        nestings = torch.randint(1, top_k + 1, (n,), generator=generator, device=device)
        return lengths.cpu(), nestings.cpu()

    def trend(self) -> float:
        """``mean(loss[i+1] - loss[i]) / mean(loss)`` over the window."""
        window = list(self.losses)
        steps = [b - a for a, b in zip(window, window[1:], strict=False)]
        return (sum(steps) / len(steps)) / (sum(window) / len(window))

    def update(self, loss: float) -> bool:
        """Record an evaluation loss; advance (naive, combine) if the rule says so.

        Returns:
            Whether the level moved.
        """
        if not self.adaptive:
            return False
        self.losses.append(float(loss))
        self.tries += 1
        if self.tries < self.min_tries or len(self.losses) < 2:
            return False
        trend = self.trend()
        if (abs(trend) if self.abs_trend else trend) >= self.threshold:
            return False
        moved = self.advance()
        self.losses.clear()
        self.tries = 0
        return moved

    def advance(self) -> bool:
        """Length +1 up to ``max_length``, then nesting +1 up to ``max_nesting``."""
        if self.length < self.max_length:
            self.length += 1
        elif self.nesting < self.max_nesting:
            self.nesting += 1
        else:
            return False
        return True

    def state_dict(self) -> dict[str, Any]:
        """The mutable state, for checkpoints (plain numbers and a list)."""
        return {
            "length": self.length,
            "nesting": self.nesting,
            "losses": list(self.losses),
            "tries": self.tries,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.length, self.nesting = int(state["length"]), int(state["nesting"])
        self.losses.clear()
        self.losses.extend(float(x) for x in state["losses"])
        self.tries = int(state["tries"])
