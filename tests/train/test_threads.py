"""``--cpu-threads auto``: the ThreadGovernor's decisions on scripted step times, and a run."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from relmem.train.loop import run
from relmem.train.threads import ThreadGovernor


class Machine:
    """Scripted step times: ``times[threads]`` seconds per step, changeable mid-run."""

    def __init__(self, one: float, many: float) -> None:
        self.times = {1: one, 4: many}
        self.applied: list[int] = []

    def set_threads(self, threads: int) -> None:
        self.applied.append(threads)

    def drive(self, governor: ThreadGovernor, steps: int, first: float = 0.0) -> list[int]:
        """Run ``steps`` steps; return the thread count of each. The first step after a
        change of thread count takes ``first`` seconds more."""
        used = []
        for _ in range(steps):
            governor.before_step()
            changed = not used or used[-1] != governor.threads
            used.append(governor.threads)
            governor.after_step(self.times[governor.threads] + (first if changed else 0.0))
        return used


def governor(machine: Machine, **kwargs) -> ThreadGovernor:
    settings = {"probe_steps": 5, "reprobe_every": 50} | kwargs
    return ThreadGovernor(4, set_threads=machine.set_threads, **settings)


def test_many_threads_win_on_a_free_machine() -> None:
    machine = Machine(one=0.04, many=0.025)
    g = governor(machine)
    used = machine.drive(g, 50, first=1.0)  # starting a thread pool takes a second
    assert used[:6] == [1] * 6 and used[6:12] == [4] * 6  # probe one, then many (+1 untimed)
    assert used[12:] == [4] * 38  # keeps the faster
    assert machine.applied == [1, 4]  # the count is applied only when it changes


def test_one_thread_wins_when_many_are_slower() -> None:
    machine = Machine(one=0.04, many=0.05)
    used = machine.drive(governor(machine), 50)
    assert used[12:] == [1] * 38


def test_contention_during_the_probe_ends_it() -> None:
    machine = Machine(one=0.04, many=2.5)  # another process holds a core: 60x slower
    used = machine.drive(governor(machine), 20)
    # step 0 and step 6 are untimed; steps 7-9 are the three slow ones in a row
    assert used[:6] == [1] * 6 and used[6:10] == [4] * 4 and used[10:] == [1] * 10


def test_contention_while_running_drops_to_one_thread_then_reprobes() -> None:
    machine = Machine(one=0.04, many=0.025)
    g = governor(machine)
    assert machine.drive(g, 20)[-1] == 4
    machine.times[4] = 2.5  # a second process starts
    used = machine.drive(g, 30)
    # three slow steps, then one thread; the probe a quarter of reprobe_every (12 steps) later
    # finds the machine still busy and ends after its own three slow steps
    assert used == [4] * 3 + [1] * 17 + [4] * 4 + [1] * 6
    machine.times[4] = 0.025  # it ends: the next probe finds out
    used = machine.drive(g, 60)
    assert used[-1] == 4
    assert machine.applied == [1, 4, 1, 4, 1, 4]


def test_a_busy_machine_is_probed_ever_more_rarely() -> None:
    machine = Machine(one=0.04, many=2.5)
    used = machine.drive(governor(machine), 800)
    starts = [t for t, threads in enumerate(used) if threads == 4 and used[t - 1] == 1]
    lengths = [len(list(g)) for k, g in itertools.groupby(used) if k == 4]
    assert lengths == [4] * len(starts)  # each probe: one untimed step and three slow ones
    # waits of 100, 200, 400 steps from each decision, plus the 5 one-thread probe steps
    assert [b - a for a, b in itertools.pairwise(starts)] == [109, 209, 409]


def test_a_single_slow_step_is_not_contention() -> None:
    machine = Machine(one=0.04, many=0.025)
    g = governor(machine)
    machine.drive(g, 20)
    for _ in range(5):  # a hiccup every other step: never three in a row
        for seconds in (1.0, 0.025):
            g.before_step()
            g.after_step(seconds)
    assert g.threads == 4 and machine.applied == [1, 4]


def test_one_core_never_probes() -> None:
    applied: list[int] = []
    g = ThreadGovernor(1, probe_steps=5, reprobe_every=50, set_threads=applied.append)
    for _ in range(100):
        g.before_step()
        g.after_step(1.0)
    assert applied == [1] and g.threads == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="reprobe_every > 2 \\* probe_steps"):
        ThreadGovernor(2, probe_steps=10, reprobe_every=20)


def test_auto_threads_in_a_run(tiny) -> None:
    before = torch.get_num_threads()
    try:
        result = run(tiny(steps=4, log_every=2, cpu_threads="auto"), "nth-farthest")
        records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
        assert [r["perf/cpu_threads"] for r in records if "train/loss" in r] == [1.0, 1.0]
        config = json.loads((result.run_dir / "config.json").read_text())
        assert config["cpu_threads"] == "auto"
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads must be one of"):
        tiny(cpu_threads="all").__post_init__()
