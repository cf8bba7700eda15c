"""One hang, one alert (pipeline/hang.py): the communicators and sources that see the same
suspects join one alert, listed in its evidence; a new suspect or another job is a new alert; the
alert resolves when the job progresses again; ids and events are the same whatever the batching,
the detector's calls or restores in between."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.hang import HangDetector
from tests.factories import T0, fleet, fuzz_examples, progress, run_batched
from tests.unit.hang.factories import detector, tp_dp_job, watchdog_timeouts


def _hang_events(records: list, batch: int = 50) -> list:
    base = fleet(range(0, int(max(r.ts for r in records) - T0) + 30), hosts=2, gpus=1)
    out = run_batched(sorted(base + records, key=lambda r: r.ts), batch, detector())
    return [a for a in out.alerts if a.rule == "hang_collective"]


def test_a_hang_seen_by_two_communicators_and_both_sources_is_one_alert():
    got = _hang_events(tp_dp_job(4, 2, 600, hung=(2, 1), start=60, end=400))
    assert [(a.state, a.host, a.gpu) for a in got] == [("firing", "n2", 1), ("resolved", "n2", 1)]
    fired, resolved = got
    assert fired.id == resolved.id
    # The watchdog's first timeout (T0 + 180) settles first; RAS's stuck counts (the rank behind
    # since the poll at 60.5, stuck 2 min at 180.5) were evidence by then and join at once.
    assert (fired.started_at, fired.ts) == (pytest.approx(T0 + 180.0), pytest.approx(T0 + 210.0))
    seen = {(m["comm"], tuple(m["sources"]), tuple(m["suspects"])) for m in fired.evidence["communicators"]}
    assert seen == {("3", ("watchdog",), (1,)), ("6", ("watchdog",), (2,)), ("tp2", ("ras",), (1,)),
                    ("dp1", ("ras",), (2,))}  # fmt: skip
    assert fired.evidence["communicators_total"] == 4
    assert set(fired.labels["comm"].split(",")) == {"3", "6", "tp2", "dp1"}
    # The job progresses again at the first RAS poll after the hang ends.
    assert resolved.ts == pytest.approx(T0 + 420.5) and resolved.evidence["resolved_by"] == "progress resumed"


def test_a_healthy_tp_dp_job_stays_quiet():
    assert _hang_events(tp_dp_job(4, 2, 600) + [progress(599.0, "n0", 0, comm="x", last_completed=1)]) == []


def _settled(records: list) -> list:
    det = HangDetector()
    return det.observe(records) + det.advance(float("inf"))


def test_a_communicator_naming_the_same_or_fewer_suspects_joins_a_new_one_or_another_job_does_not():
    first = watchdog_timeouts(4, 100.0, {1: 10, 2: 10})
    same = [progress(r.ts - T0 + 50, r.host, r.rank, gpu=r.gpu, comm="7", state="timeout", seq=3, last_enqueued=3,
                     last_completed=2 if r.rank != 2 else 1) for r in first]  # fmt: skip
    got = _settled(first + same)
    assert [(a.state, [s["rank"] for s in a.evidence["suspects"]]) for a in got] == [("firing", [1, 2])]
    det = HangDetector()
    det.observe(first + same)
    det.advance(float("inf"))
    assert det.stats["fired"] == 1 and det.stats["joined"] == 1
    new = [progress(r.ts - T0 + 50, r.host, r.rank, gpu=r.gpu, comm="7", state="timeout", seq=3, last_enqueued=3,
                    last_completed=1 if r.rank in (2, 3) else 2) for r in first]  # fmt: skip
    other_job = watchdog_timeouts(4, 150.0, {1: 10, 2: 10}, job="j2")
    got = _settled(first + new + other_job)
    assert sorted((a.job, a.host, a.gpu) for a in got) == [("j1", "n1", 1), ("j1", "n2", 2), ("j2", "n1", 1)]
    assert len({a.id for a in got}) == 3


def test_it_resolves_only_when_the_last_communicator_of_it_is_forgotten():
    from pipeline.hang import Settings

    det = HangDetector(Settings(settle_s=10, forget_after_s=100))
    a = [progress(0.0 + r, f"n{r}", r, gpu=r, comm="a", state="timeout", last_enqueued=5, last_completed=4 if r else 3)
         for r in range(2)]  # fmt: skip
    b = [progress(50.0 + r, f"n{r}", r, gpu=r, comm="b", state="timeout", last_enqueued=5, last_completed=4 if r else 3)
         for r in range(2)]  # fmt: skip
    events = det.observe(a + b)
    events += det.advance(T0 + 120)  # "a" silent since T0 + 1: forgotten at 101, "b" still holds the alert
    assert [e.state for e in events] == ["firing"]
    events += det.advance(T0 + 1000)
    assert [(e.state, e.ts) for e in events] == [("firing", T0 + 10), ("resolved", T0 + 151)]


def _run(records: list, cuts: list[int], restores: set[int], steps: list[float]) -> list:
    """``records`` fed in the pieces ``cuts`` make, each followed by ``advance`` to a time no later
    than the next piece's first record; a restored detector after each piece in ``restores``."""
    det = HangDetector()
    out = []
    bounds = [0, *sorted(set(cuts)), len(records)]
    for j, (i, k) in enumerate(zip(bounds, bounds[1:])):
        out += det.observe(records[i:k])
        nxt = records[k].ts if k < len(records) else float("inf")
        last = records[k - 1].ts if k > i else -float("inf")
        out += det.advance(min(nxt, max(last, last + steps[j % len(steps)])))
        if j in restores:
            again = HangDetector()
            again.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(det.to_state())))
            det = again
    out += det.advance(float("inf"))
    return [(a.id, a.state, a.ts, a.host, a.gpu, a.summary, msgspec.json.encode(a.evidence)) for a in out]


RECORDS = sorted(
    tp_dp_job(4, 2, 900, hung=(2, 1), start=60, end=400)
    + tp_dp_job(4, 2, 900, hung=(0, 0), start=450, job="j2")
    + watchdog_timeouts(4, 500.0, {3: 10}, job="j1"),
    key=lambda r: r.ts,
)
WHOLE = _run(RECORDS, [], set(), [0.0])


def test_the_reference_run_has_one_alert_per_hang():
    fired = [(e[3], e[4]) for e in WHOLE if e[1] == "firing"]
    assert sorted(fired) == [("n0", 0), ("n2", 1), ("n3", 3)]


@settings(max_examples=fuzz_examples(40), deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(RECORDS) - 1), max_size=12),
    restores=st.sets(st.integers(0, 12), max_size=4),
    steps=st.lists(st.floats(0.0, 400.0), min_size=1, max_size=4),
)
def test_any_batching_advancing_and_restores_give_the_same_events(cuts, restores, steps):
    assert _run(RECORDS, cuts, restores, steps) == WHOLE


def test_a_version_1_state_restores_its_firing_communicator_as_an_alert():
    det = HangDetector()
    fired = det.observe(watchdog_timeouts(4, 0.0, {2: 1})) + det.advance(T0 + 60)
    state = det.to_state()
    # What the detector wrote before alerts were per hang: the alert inside its communicator.
    a = state["alerts"][0]
    v1 = {"version": 1, "now": state["now"], "stats": state["stats"],
          "comms": [{**{k: v for k, v in c.items() if k != "sources"},
                     "firing": c["firing"] and {"id": a["id"], "started_at": a["started_at"], "summary": a["summary"],
                                                "ranks": c["firing"]["ranks"], "waiting": c["firing"]["waiting"],
                                                "peak": c["firing"]["peak"], "host": a["host"], "gpu": a["gpu"]}}
                    for c in state["comms"]]}  # fmt: skip
    again = HangDetector()
    again.load_state(v1)
    done = again.observe([progress(100.0 + r, f"n{r}", r, gpu=r, last_enqueued=600, last_completed=600)
                         for r in range(4)])
    assert [(e.id, e.state) for e in done] == [(fired[0].id, "resolved")]


@pytest.mark.parametrize(
    "bad",
    [
        {"alerts": [{"id": 5}]},
        {"alerts": []},  # a communicator joined to an alert the state does not hold
        {"comms": [{"sources": [1]}]},
    ],
)
def test_a_forged_grouped_state_is_a_state_error_and_changes_nothing(bad):
    from pipeline.errors import StateError

    det = HangDetector()
    det.observe(watchdog_timeouts(4, 0.0, {2: 1}))
    det.advance(T0 + 60)
    state = det.to_state()
    if "comms" in bad:
        bad = {"comms": [{**state["comms"][0], **bad["comms"][0]}]}
    with pytest.raises(StateError):
        det.load_state({**state, **bad})
    assert det.to_state() == state


def test_a_communicator_naming_no_suspect_yet_when_another_fires_is_judged_at_its_own_deadline():
    first = watchdog_timeouts(4, 100.0, {1: 10})  # fires at 130, naming n1
    # Communicator "7": one rank's timeout at 120 (no rank stands out yet), the rest by 140,
    # naming n3: a hang of its own, not the one that fired.
    later = [progress(120.0 if r == 0 else 140.0 + r, f"n{r}", r, gpu=r, comm="7", state="timeout", seq=3,
                      last_enqueued=3, last_completed=1 if r == 3 else 2) for r in range(4)]  # fmt: skip
    got = _settled(sorted(first + later, key=lambda r: r.ts))
    assert [(a.state, a.host, a.labels["comm"]) for a in got] == [("firing", "n1", "0"), ("firing", "n3", "7")]
