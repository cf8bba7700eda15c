"""One DCGM sample a tick (``HostClock.one_per_tick``) with the release promise it backs
(``HostClock.whole_bound``, docs/architecture.md §4): a host sending per-host messages that
counts as complete for its newest sample's tick loses no later in-order sample as ``late``."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.engine import EngineConfig
from tests.factories import T0, fuzz_examples
from tests.unit.engine.hostclock_factories import engine, feed, message


def _late(tick: float, times: list[float]) -> list[float]:
    """One host's per-host messages at ``times`` (ticks after T0), one ``process`` call each:
    the times (in ticks after T0) of the samples dead-lettered."""
    eng = engine(EngineConfig(tick=tick))
    dead = []
    for x in times:
        out = feed(eng, [("a", message(T0 + x * tick, "a"))])
        dead += [round((d.ts - T0) / tick, 6) for d in out.dead]
    return dead


@settings(max_examples=fuzz_examples(20), deadline=None)
@given(
    st.sampled_from([1.0, 0.5, 5.0]),
    st.floats(0.93, 0.995),
    st.floats(0.0, 1.0),
)
def test_a_steady_host_sampling_a_little_faster_than_the_tick_loses_no_sample(tick, period, phase) -> None:
    # A steady clock (every step the same) a little faster than the tick: its phase creeps back
    # through the tick's start and its samples in a tick's last tenth are moved to the next
    # tick's start. Its next sample comes one step after the time as sent, up to a tenth of a
    # tick before the moved time: the host's steps are measured as sent, and it counts as
    # complete for the moved sample's tick only where that step reaches its last tenth.
    n = math.ceil(1.2 / (1.0 - period)) + 40
    assert _late(tick, [phase + period * i for i in range(n)]) == []


def test_a_redelivered_old_message_does_not_cost_the_hosts_next_sample() -> None:
    # A host stamping whole seconds, 2 ms late, until one sample 1 ms early: that one is moved to
    # the next second, and so is each after it (each in the last tenth of the second its sample
    # before went to), the host complete for each second as its message comes. A producer's
    # retry then sends second 70's message again: late, as it should be, and not taken as the
    # host's newest sample, so the next one is still moved and lost to nothing.
    times = [k + 0.002 for k in range(79)] + [78.999, 70.002, 79.999, 80.999, 81.999]
    assert _late(1.0, times) == [70.002, 70.002]
