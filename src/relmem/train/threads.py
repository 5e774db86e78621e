"""``--cpu-threads auto``: every core while more threads pay, one thread when they do not.

A small recurrent model's training step is a long chain of small ops. On an idle 2-core
machine a second intra-op thread trains the Nth Farthest CPU preset about 1.3-1.5 times
faster; but when another process holds one of the cores, every parallel region of the step
waits for a descheduled thread and a two-thread step can take tens of times longer than a
one-thread step (``docs/results.md``, Nth Farthest). No thread count is right on every
machine, so :class:`ThreadGovernor` measures:

1. **probe**: ``probe_steps`` steps with one thread, then ``probe_steps`` with every core; the
   faster median step time wins. The first step after a change of thread count is not timed
   (the first many-thread step starts the thread pool). ``patience`` consecutive
   many-thread steps slower than ``slowdown`` times the one-thread median end the probe at
   once: another process holds a core.
2. **run**: train with the winner; ``patience`` consecutive many-thread steps slower than
   ``slowdown`` times the probe's median drop to one thread. A lone slow step (the OS ran
   something else for a moment) does neither.
3. **probe again** ``reprobe_every`` steps after a decision (the machine's load changes), a
   quarter of that after a drop; each probe that ends in contention doubles the wait (up to
   16 times ``reprobe_every``), so a machine that stays busy pays for a few slow steps ever
   more rarely.

The thread count changes the last bits of reductions and matrix products, so a run with
``auto`` is not bit-reproducible (a fixed ``--cpu-threads N`` is). The probes cost about
``probe_steps / reprobe_every`` of the steps at the slower setting.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import torch


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


class ThreadGovernor:
    """Chooses the intra-op thread count step by step from measured step times.

    Call :meth:`before_step` before each training step and :meth:`after_step` with its
    duration after it. ``set_threads`` and ``max_threads`` are injectable for tests.

    Args:
        max_threads: the many-thread setting (the trainer passes :func:`usable_cores`).
        probe_steps: steps timed per setting in a probe.
        reprobe_every: steps between the starts of two probes.
        slowdown: how many times the reference step time counts as contention.
        patience: consecutive slow steps that count as contention while running.
        set_threads: applies a thread count (default ``torch.set_num_threads``).
    """

    def __init__(
        self,
        max_threads: int,
        probe_steps: int = 20,
        reprobe_every: int = 1000,
        slowdown: float = 3.0,
        patience: int = 3,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        if min(max_threads, probe_steps, patience) < 1 or reprobe_every <= 2 * probe_steps:
            raise ValueError(
                "ThreadGovernor needs max_threads, probe_steps and patience >= 1 and "
                f"reprobe_every > 2 * probe_steps; got {max_threads}, {probe_steps}, "
                f"{patience}, {reprobe_every}"
            )
        self.max_threads, self.probe_steps = max_threads, probe_steps
        self.reprobe_every, self.slowdown, self.patience = reprobe_every, slowdown, patience
        self._slow = 0  # consecutive slow many-thread steps
        self._settling = False  # the step just taken was the first at a new thread count
        self._set = set_threads
        self.threads = 0  # the count in force (0: none set yet)
        self._phase = "probe_one"
        self._times: list[float] = []
        self._one_median = float("inf")
        self._reference = float("inf")  # the chosen setting's median step time
        self._since_decision = 0  # steps since the last probe ended
        self._wait = reprobe_every  # steps from a decision to the next probe

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
        self._since_decision += 1
        settling, self._settling = self._settling, False
        if settling and self._phase != "run":
            return
        if self._phase == "probe_one":
            self._times.append(seconds)
            if len(self._times) == self.probe_steps:
                self._one_median = statistics.median(self._times)
                self._phase, self._times = "probe_many", []
        elif self._phase == "probe_many":
            self._times.append(seconds)
            if self._contended(seconds, self._one_median):
                self._choose(1, self._one_median, min(2 * self._wait, 16 * self.reprobe_every))
            elif len(self._times) == self.probe_steps:
                many_median = statistics.median(self._times)
                if many_median < self._one_median:
                    self._choose(self.max_threads, many_median, self.reprobe_every)
                else:
                    self._choose(1, self._one_median, self.reprobe_every)
        elif self.threads > 1 and self._contended(seconds, self._reference):
            self._choose(1, self._one_median, max(1, self.reprobe_every // 4))
        elif self._since_decision >= self._wait:
            self._phase, self._times = "probe_one", []

    def _contended(self, seconds: float, reference: float) -> bool:
        """Whether this is the ``patience``-th slow many-thread step in a row."""
        slow = self.threads > 1 and seconds > self.slowdown * reference
        self._slow = self._slow + 1 if slow else 0
        return self._slow >= self.patience

    def _choose(self, threads: int, median: float, wait: int) -> None:
        """Run with ``threads`` (median step time ``median``) and probe again in ``wait``."""
        self._phase, self._times, self._reference = "run", [], median
        self._slow, self._since_decision, self._wait = 0, 0, wait
        self._use(threads)
