"""Each host's clock (``pipeline/engine/hostclock.py``): its arrays are declared once, and growth
and the snapshot follow from those declarations; an older snapshot without an array restores."""

from __future__ import annotations

import math

import msgspec
import numpy as np

from pipeline.engine import Engine, EngineConfig
from pipeline.engine.hostclock import HostClock, PerHost
from pipeline.engine.snapshot import write_snapshot
from tests.factories import T0, fleet


def _heard(clock: HostClock, hosts: int = 3, steps: int = 5) -> HostClock:
    clock.grow(hosts)
    for k in range(steps):
        ts = np.array([T0 + k * 1.0 + 0.01 * h for h in range(hosts)])
        clock.hear(ts, np.arange(hosts), hosts)
        clock.accepted(ts)
    return clock


def test_growth_gives_every_array_room_with_its_fill() -> None:
    clock = HostClock(EngineConfig())
    clock.grow(5)
    for a in HostClock.arrays():
        arr = getattr(clock, a.name)
        assert len(arr) >= 5, a.name
        assert np.array_equal(arr[:5], np.full(5, a.fill), equal_nan=True), a.name


def test_state_round_trips_every_kept_array_and_leaves_the_others() -> None:
    clock = _heard(HostClock(EngineConfig()))
    clock.arrived(100.0, np.array([0, 2]))
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(clock.to_state()))
    assert set(state) == {a.key for a in HostClock.arrays() if a.key} | {"first_ts"}
    back = HostClock(EngineConfig())
    back.load_state(state)
    for a in HostClock.arrays():
        if a.key:
            assert np.array_equal(getattr(back, a.name), getattr(clock, a.name), equal_nan=True), a.name
    assert len(back.arrival) == 0 and back.live_since is None  # wall-clock facts do not survive a restart
    assert back.first_ts == T0 and back.newest(3) == clock.newest(3) == T0 + 4.02


def test_a_snapshot_without_an_array_gets_its_fill_or_what_it_stands_in_for() -> None:
    clock = _heard(HostClock(EngineConfig()))
    state = clock.to_state()
    del state["host_jitter_n"], state["host_min_step"], state["host_done"]
    back = HostClock(EngineConfig())
    back.load_state(state)
    n = len(clock.hwm)
    assert np.array_equal(back.jitter_n, np.zeros(n)) and np.array_equal(back.done, np.full(n, -np.inf))
    assert np.array_equal(back.min_step, clock.step, equal_nan=True) and back.min_step is not back.step


class _Extra(HostClock):
    """A clock with one more per-host array: its declaration is the only edit."""

    extra = PerHost(7.0, "host_extra")


def test_a_new_per_host_array_needs_only_its_declaration() -> None:
    clock = _heard(_Extra(EngineConfig()), hosts=2)
    assert np.array_equal(clock.extra[:2], [7.0, 7.0])
    clock.extra[1] = 3.0
    blob = write_snapshot([clock.to_state()], [])
    data = msgspec.msgpack.decode(blob)
    assert list(data)[-3:] == ["host_extra", "windows", "models"]  # after the fixed layout, before the stages
    back = _Extra(EngineConfig())
    back.load_state(data)
    assert back.extra[1] == 3.0


def test_whole_bound_counts_a_per_host_sender_complete_up_to_its_next_sample() -> None:
    clock = HostClock(EngineConfig(tick=1.0))
    clock.grow(2)
    clock.whole[:2] = [True, False]
    clock.min_step[:2] = 1.0
    hwm = np.array([T0 + 10.2, T0 + 10.2])
    bound = clock.whole_bound(hwm, np.array([True, True]), T0 + 10.2)
    assert bound[0] == T0 + 11.0 and bound[1] == T0 + 10.2  # the bare-record sender: its newest sample only


def test_the_engine_snapshot_keeps_the_clock_under_its_keys() -> None:
    eng = Engine()
    eng.process(fleet(range(30), hosts=2, gpus=2))
    data = msgspec.msgpack.decode(eng.snapshot())
    for key, value in eng.clock.to_state().items():
        assert data[key] == value or (isinstance(value, float) and math.isnan(value) and math.isnan(data[key]))
