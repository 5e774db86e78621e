"""``--cpu-threads auto``: every core while more threads pay, one thread when they do not.

A small recurrent model's training step is a long chain of small ops. On an idle 2-core
machine a second intra-op thread trains the Nth Farthest CPU preset about 1.3 times faster;
but when another process holds one of the cores, every parallel region of the step waits for
a descheduled thread and a two-thread step can take tens of times longer than a one-thread
step (``docs/results.md``, Nth Farthest). No thread count is right on every machine, so
:class:`ThreadGovernor` measures. Its clock is the sum of the step times it is given, so it
behaves the same for 30 ms steps and for 5 s reinforcement-learning steps:

1. **probe**: time steps with one thread, then with every core, ``probe_steps`` of each or,
   for long steps, as many as fill ``probe_seconds`` (at least three); the faster median step
   time wins. The first step after a change of thread count is not timed (the first
   many-thread step starts the thread pool). Contention, another process holding a core, ends
   the probe at once: many-thread steps slower than ``slowdown`` times the one-thread median,
   ``patience`` of them in a row, or fewer in a row that already took longer than ``patience``
   such steps would (one 20-times-slower step of a 1.5 s reinforcement-learning update is
   contention; waiting for two more would cost a minute).
2. **run**: train with the winner; contention by the same rule, against the probe's median,
   drops to one thread. A lone slow step (the OS ran something else for a moment) does
   neither.
3. **probe again** after a wait, the machine's load changes: ``reprobe_seconds`` of steps, or
   long enough that probing takes at most ``probe_share`` of the time; a quarter of that after
   a drop. Each probe that ends in contention doubles the wait (up to 16 times), and makes it
   at least that probe's own cost over ``probe_share``, so a machine that stays busy pays for a
   few slow steps ever more rarely, and never more than about ``probe_share`` of its time.

The thread count changes the last bits of reductions and matrix products, so a run with
``auto`` is not bit-reproducible (a fixed ``--cpu-threads N`` is).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import torch

MIN_PROBE_STEPS = 3  # a median that one outlier cannot move


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


class ThreadGovernor:
    """Chooses the intra-op thread count step by step from measured step times.

    Call :meth:`before_step` before each training step and :meth:`after_step` with its
    duration after it.

    Args:
        max_threads: the many-thread setting (the trainer passes :func:`usable_cores`).
        probe_steps: timed steps per setting in a probe, at most.
        probe_seconds: a setting's probe also ends once its timed steps add up to this
            (after at least three).
        reprobe_seconds: the shortest wait from a decision to the next probe.
        probe_share: the wait is also at least the last probe's duration over this share.
        slowdown: how many times the reference step time counts as slow.
        patience: consecutive slow many-thread steps that count as contention.
        set_threads: applies a thread count (default ``torch.set_num_threads``; tests pass a
            recorder).
    """

    def __init__(
        self,
        max_threads: int,
        probe_steps: int = 20,
        probe_seconds: float = 2.0,
        reprobe_seconds: float = 30.0,
        probe_share: float = 0.05,
        slowdown: float = 3.0,
        patience: int = 3,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        if max_threads < 1 or patience < 1 or probe_steps < MIN_PROBE_STEPS:
            raise ValueError(
                f"ThreadGovernor needs max_threads >= 1, patience >= 1 and probe_steps >= "
                f"{MIN_PROBE_STEPS}; got {max_threads}, {patience}, {probe_steps}"
            )
        if not (probe_seconds > 0 and reprobe_seconds > 0 and 0 < probe_share < 1):
            raise ValueError(
                "ThreadGovernor needs probe_seconds > 0, reprobe_seconds > 0 and 0 < "
                f"probe_share < 1; got {probe_seconds}, {reprobe_seconds}, {probe_share}"
            )
        self.max_threads = max_threads
        self.probe_steps, self.probe_seconds = probe_steps, probe_seconds
        self.reprobe_seconds, self.probe_share = reprobe_seconds, probe_share
        self.slowdown, self.patience = slowdown, patience
        self._set = set_threads
        self.threads = 0  # the count in force (0: none set yet)
        self._phase = "probe_one"
        self._times: list[float] = []  # the current probe phase's timed steps
        self._one_median = float("inf")
        self._reference = float("inf")  # the chosen setting's median step time
        self._slow = 0  # consecutive slow many-thread steps
        self._slow_seconds = 0.0  # and their total time
        self._settling = False  # the step just taken was the first at a new thread count
        self._clock = 0.0  # seconds of steps seen
        self._probe_start = 0.0  # the clock when the current or last probe started
        self._next_probe = float("inf")  # the clock at which the next probe starts
        self._base_wait = reprobe_seconds  # the wait after a probe (doubled by contention)

    def _use(self, threads: int) -> None:
        if threads != self.threads:
            self._set(threads)
            self.threads = threads
            self._settling = True

    def before_step(self) -> None:
        """Apply the thread count for the coming step."""
        if self.max_threads == 1 or self._phase == "probe_one":
            self._use(1)
        elif self._phase == "probe_many":
            self._use(self.max_threads)

    def after_step(self, seconds: float) -> None:
        """Record the step's wall time and decide the next step's thread count."""
        if self.max_threads == 1:
            return
        self._clock += seconds
        settling, self._settling = self._settling, False
        if self._phase == "run":
            if self._contended(seconds, self._reference):
                self._decide(1, self._one_median, self._base_wait / 4)
            elif self._clock >= self._next_probe:
                self._phase, self._times, self._probe_start = "probe_one", [], self._clock
            return
        if settling:
            return
        self._times.append(seconds)
        if self._phase == "probe_one":
            if self._probe_done():
                self._one_median = statistics.median(self._times)
                self._phase, self._times = "probe_many", []
        elif self._contended(seconds, self._one_median):
            spent = self._clock - self._probe_start
            doubled = min(2 * self._base_wait, 16 * self.reprobe_seconds)
            self._base_wait = max(doubled, spent / self.probe_share)
            self._decide(1, self._one_median, self._base_wait)
        elif self._probe_done():
            many_median = statistics.median(self._times)
            spent = self._clock - self._probe_start
            self._base_wait = max(self.reprobe_seconds, spent / self.probe_share)
            if many_median < self._one_median:
                self._decide(self.max_threads, many_median, self._base_wait)
            else:
                self._decide(1, self._one_median, self._base_wait)

    def _probe_done(self) -> bool:
        timed = len(self._times)
        long_enough = timed >= MIN_PROBE_STEPS and sum(self._times) >= self.probe_seconds
        return timed >= self.probe_steps or long_enough

    def _contended(self, seconds: float, reference: float) -> bool:
        """Whether the slow many-thread steps in a row, this one included, are ``patience``
        steps or took longer than ``patience`` steps at the slow threshold."""
        threshold = self.slowdown * reference
        if self.threads > 1 and seconds > threshold:
            self._slow, self._slow_seconds = self._slow + 1, self._slow_seconds + seconds
        else:
            self._slow, self._slow_seconds = 0, 0.0
        return self._slow >= self.patience or self._slow_seconds > self.patience * threshold

    def _decide(self, threads: int, median: float, wait: float) -> None:
        """Run with ``threads`` (median step ``median``) and probe again after ``wait``."""
        self._phase, self._times, self._reference = "run", [], median
        self._slow, self._slow_seconds = 0, 0.0
        self._next_probe = self._clock + wait
        self._use(threads)
