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


ONE, FAST, SLOW = 1 / 32, 1 / 64, 2.5  # seconds a step: one thread, many free, many busy


def governor(machine: Machine, **kwargs) -> ThreadGovernor:
    """Probes of 5 timed steps a setting; the next probe 2 s of steps after a decision."""
    settings = {"probe_steps": 5, "probe_seconds": 100.0, "reprobe_seconds": 2.0}
    settings |= {"probe_share": 0.5} | kwargs
    return ThreadGovernor(4, set_threads=machine.set_threads, **settings)


def test_many_threads_win_on_a_free_machine() -> None:
    machine = Machine(one=ONE, many=FAST)
    used = machine.drive(governor(machine), 50, first=1.0)  # starting a pool takes a second
    assert used[:6] == [1] * 6 and used[6:12] == [4] * 6  # probe one, then many (+1 untimed)
    assert used[12:] == [4] * 38  # keeps the faster
    assert machine.applied == [1, 4]  # the count is applied only when it changes


def test_one_thread_wins_when_many_are_slower() -> None:
    machine = Machine(one=ONE, many=2 * ONE)
    used = machine.drive(governor(machine), 50)
    assert used[12:] == [1] * 38


def test_contention_during_the_probe_ends_it() -> None:
    # another process holds a core: many-thread steps 4x slower than one thread's, over the
    # 3x threshold; step 0 and step 6 are untimed, steps 7-9 the three slow ones in a row
    machine = Machine(one=ONE, many=4 * ONE)
    used = machine.drive(governor(machine), 20)
    assert used[:6] == [1] * 6 and used[6:10] == [4] * 4 and used[10:] == [1] * 10
    # 80x slower: step 7 alone took longer than three steps at the threshold would
    machine = Machine(one=ONE, many=SLOW)
    used = machine.drive(governor(machine), 20)
    assert used[:6] == [1] * 6 and used[6:8] == [4] * 2 and used[8:] == [1] * 12


def test_contention_while_running_drops_to_one_thread_then_reprobes() -> None:
    machine = Machine(one=ONE, many=FAST)
    g = governor(machine, reprobe_seconds=20.0)
    assert machine.drive(g, 20)[-1] == 4
    machine.times[4] = SLOW  # a second process starts
    used = machine.drive(g, 180)
    # one 160x slower step, then one thread; the probe a quarter of the wait later (5 s, 160
    # steps) finds the machine still busy and ends after its untimed step and one slow one
    assert used == [4] + [1] * 160 + [1] * 5 + [4] * 2 + [1] * 12
    machine.times[4] = FAST  # it ends: the next probe (40 s, 1,280 steps, later) finds out
    used = machine.drive(g, 1400)
    assert used[-1] == 4
    assert machine.applied == [1, 4, 1, 4, 1, 4]


def test_a_busy_machine_is_probed_ever_more_rarely() -> None:
    machine = Machine(one=ONE, many=SLOW)
    used = machine.drive(governor(machine), 1500)
    starts = [t for t, threads in enumerate(used) if threads == 4 and used[t - 1] == 1]
    lengths = [len(list(g)) for k, g in itertools.groupby(used) if k == 4]
    assert lengths == [2] * len(starts)  # each probe: one untimed step and one slow one
    # The waits: the probe's cost over probe_share (5.19 s / 0.5, then 5.16 s / 0.5: 332 and
    # 330 one-thread steps), then the doubled wait once it is longer (20.75 s, 664 steps);
    # plus the 5 steps of each one-thread probe and the 2 of each many-thread probe.
    assert [b - a for a, b in itertools.pairwise(starts)] == [339, 671]


def test_a_single_slow_step_is_not_contention() -> None:
    machine = Machine(one=ONE, many=FAST)
    g = governor(machine, reprobe_seconds=100.0)
    machine.drive(g, 20)
    # a hiccup every other step, 6.4x slow: never three in a row, and shorter than three
    # steps at the 3x threshold
    for _ in range(5):
        for seconds in (0.1, FAST):
            g.before_step()
            g.after_step(seconds)
    assert g.threads == 4 and machine.applied == [1, 4]


def test_a_busy_machine_costs_long_steps_little() -> None:
    """Reinforcement-learning updates of 1.5 s that take 30 s on two threads of a shared
    machine (an LSTM agent beside another run): the probe ends after one slow step, and the
    next waits until the probe's cost (66 s) is 5% of the time."""
    machine = Machine(one=1.5, many=30.0)
    g = ThreadGovernor(4, set_threads=machine.set_threads)  # the defaults
    used = machine.drive(g, 1000)
    runs = [(k, len(list(group))) for k, group in itertools.groupby(used)]
    # 1 untimed and 3 timed one-thread steps; 1 untimed and 1 slow many-thread step; 1320 s
    # (880 steps) of one thread and the next one-thread probe's 3
    assert runs[:3] == [(1, 4), (4, 2), (1, 883)]


def test_long_steps_probe_by_time() -> None:
    """Reinforcement-learning steps of seconds: three timed steps a setting fill the probe,
    and the next probe waits until probing is at most 5% of the time."""
    machine = Machine(one=5.0, many=3.0)
    g = ThreadGovernor(4, set_threads=machine.set_threads)  # the defaults
    used = machine.drive(g, 230)
    assert used[:4] == [1] * 4 and used[4:8] == [4] * 4
    # the probe took 32 s, so the next one starts 640 s (214 steps of 3 s) later
    assert used[8:222] == [4] * 214 and used[222] == 1


def test_one_core_never_probes() -> None:
    applied: list[int] = []
    g = ThreadGovernor(1, set_threads=applied.append)
    for _ in range(100):
        g.before_step()
        g.after_step(1.0)
    assert applied == [1] and g.threads == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="probe_steps >= 3"):
        ThreadGovernor(2, probe_steps=2)
    with pytest.raises(ValueError, match="0 < probe_share < 1"):
        ThreadGovernor(2, probe_share=1.0)


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
