"""The alert feed (pipeline/incidents/feed.py): whatever the sources' interleaving and batching,
and whatever the (monotone) watermarks, the incident stage gets one sequence."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import StateError
from pipeline.incidents.feed import AlertFeed, order_key
from tests.factories import fuzz_examples
from tests.unit.incidents.factories import T0, alert, feed_deliveries

RULES = ("hbm_sbe_burst", "nvlink_xid74", "gpu_xid_critical", "nccl_comm_busbw")


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(feed_deliveries(RULES))
def test_any_interleaving_batching_and_watermarks_give_one_sequence(d):
    items, marks, waves = d
    feed = AlertFeed()
    got = []
    for wave, mark in zip(waves, [*marks, None]):
        feed.add(wave)
        got += feed.flush() if mark is None else feed.release(mark)
    unique = {(a.id, a.state): a for a in items}
    assert got == sorted(unique.values(), key=order_key)
    assert feed.stats["late"] == 0 and len(feed) == 0


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(feed_deliveries(RULES), st.integers(0, 8))
def test_a_restore_from_its_state_mid_stream_changes_nothing(d, cut):
    items, marks, waves = d
    steps = list(zip(waves, [*marks, None]))
    cut = min(cut, len(steps))

    def run(feed, part):
        out = []
        for wave, mark in part:
            feed.add(wave)
            out += feed.flush() if mark is None else feed.release(mark)
        return out

    whole = run(AlertFeed(), steps)
    first = AlertFeed()
    before = run(first, steps[:cut])
    second = AlertFeed()
    second.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(first.to_state())))
    # The upstream replays what it sent since its own checkpoint: the first waves again.
    again = run(second, [(w, m) for w, _ in steps[:cut] for m in [second.released]] + steps[cut:])
    assert before + again == whole


def test_an_alert_before_what_was_released_is_dropped_and_counted():
    feed = AlertFeed()
    feed.add([alert("hbm_sbe_burst", 5, id="a")])
    assert [a.id for a in feed.release(T0 + 5)] == []          # ts 5 is not before 5
    assert [a.id for a in feed.release(T0 + 6)] == ["a"]
    feed.add([alert("hbm_sbe_burst", 5, id="a"), alert("hbm_sbe_burst", 4, id="b"),
              alert("hbm_sbe_burst", 6, id="c")])
    assert feed.stats["late"] == 2 and [a.id for a in feed.flush()] == ["c"]
    assert feed.released == math.nextafter(T0 + 6, math.inf)


def test_a_full_buffer_lets_its_oldest_go_at_the_next_release():
    feed = AlertFeed(max_buffer=3)
    feed.add([alert("hbm_sbe_burst", t, id=f"a{t}") for t in (4, 1, 3, 2, 5)])
    assert feed.stats["forced"] == 1 and len(feed) == 3
    assert [a.id for a in feed.release(T0)] == ["a1", "a2"]
    assert [a.id for a in feed.flush()] == ["a3", "a4", "a5"]


@pytest.mark.parametrize("state", [
    None, {"v": 2}, {"v": 1, "released": "x", "alerts": b""}, {"v": 1, "released": math.inf, "alerts": b""},
    {"v": 1, "released": None, "alerts": "text"}, {"v": 1, "released": None, "alerts": b"\x91\x01"},
])
def test_a_forged_state_is_refused_and_changes_nothing(state):
    feed = AlertFeed()
    feed.add([alert("hbm_sbe_burst", 5, id="a")])
    with pytest.raises(StateError):
        feed.load_state(state)
    assert [a.id for a in feed.flush()] == ["a"]
