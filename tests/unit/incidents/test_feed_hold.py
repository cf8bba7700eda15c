"""The feed's hold (pipeline/incidents/hold.py, feed.py): a possible symptom waits ``hold`` seconds
of event time for a cause on its host, which then goes before it; whatever the batching, watermarks
and restores, the incident stage still gets one sequence, at bounded cost; and what the reorder
does to the incident stage."""

from __future__ import annotations

import math
from unittest import mock

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents import feed as feed_mod
from pipeline.incidents.config import IncidentConfig, parse_config
from pipeline.incidents.feed import MAX_SCAN, AlertFeed
from pipeline.incidents.hold import CauseHold
from pipeline.schema import AlertEvent
from tests.factories import fuzz_examples
from tests.unit.incidents.factories import HOST_LEVEL, T0, alert, feed_deliveries, resolved

# Causes that are symptoms too (an SXid is an NVLink alert; a GPU's XID 74 is a cause of the
# host's bandwidth), host-level causes (an SXid, a PCIe AER error), symptoms on GPUs and the host
# (a GPU's critical XID, a GPU off the bus, the host's bandwidth), and a rule that is neither.
RULES = ("nvlink_nvswitch_fatal_sxid", "pcie_aer_fatal", "nvlink_xid74", "gpu_xid_critical", "nccl_comm_busbw",
         "gpu_fallen_off_bus", "hbm_sbe_burst")
HOLD = 5.0


def _feed(max_buffer: int = feed_mod.MAX_BUFFER) -> AlertFeed:
    return IncidentStage(default_config()).feed(max_buffer)


def _ids(alerts: list[AlertEvent]) -> list[str]:
    return [a.id for a in alerts]


def _run(feed: AlertFeed, steps) -> list[AlertEvent]:
    out: list[AlertEvent] = []
    for wave, mark in steps:
        feed.add(wave)
        out += feed.flush() if mark is None else feed.release(mark)
    return out


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(feed_deliveries(RULES))
def test_each_alert_goes_once_and_only_a_cause_goes_before_a_symptom_it_came_after(d):
    # Against the plain rule: canonical order, but a cause within the hold after a symptom it
    # explains on another entity of its host goes before it; no other pair is out of order.
    items, _, _ = d
    feed = _feed()
    feed.add(items)
    got = feed.flush()
    hold = CauseHold(default_config())
    assert len(got) == len({(a.id, a.state) for a in items})
    plain = AlertFeed(rank=IncidentStage(default_config()).rootness)
    plain.add(items)
    canonical = {(a.id, a.state): i for i, a in enumerate(plain.flush())}

    def pulled(c, x) -> bool:  # a cause at or after x's ts, within the hold
        return hold.symptom(x) and hold.cause(c) and x.ts <= c.ts <= x.ts + HOLD and hold.pulls(c, x)

    rank = [canonical[(a.id, a.state)] for a in got]
    moved = [any(r < rank[i] for r in rank[i + 1:]) for i in range(len(got))]
    for i, c in enumerate(got):
        for j, x in enumerate(got[i + 1:], i + 1):
            # Out of canonical order: c is a cause pulled before a symptom y at or before x
            # (or before a cause pulled so, in turn).
            if rank[i] > rank[j]:
                assert any(pulled(c, y) and rank[k] <= rank[j] or moved[k] and pulled(c, y)
                           for k, y in enumerate(got[i + 1:], i + 1))
            # Every cause within the hold after a symptom in its canonical place goes before it.
            assert moved[i] or not pulled(x, c)


def test_a_symptom_waits_the_hold_and_everything_after_it_waits_with_it():
    feed = _feed()
    sbe = alert("hbm_sbe_burst", 0, gpu=1, id="sbe")       # neither: goes at its second
    xid74 = alert("nvlink_xid74", 1, gpu=2, id="xid74")     # a symptom of an NVSwitch's SXid
    later = alert("hbm_sbe_burst", 2, host="n2", id="later")
    feed.add([sbe, xid74, later])
    assert [a.id for a in feed.release(T0 + 3)] == ["sbe"]
    assert feed.release(T0 + 1 + HOLD) == [] and len(feed) == 2    # 6 is not past 1 + 5
    assert [a.id for a in feed.release(T0 + 6.5)] == ["xid74", "later"]


def test_a_cause_within_the_hold_goes_before_its_symptoms_and_no_further():
    feed = _feed()
    xids = [alert("nvlink_xid74", 1, gpu=g, id=f"x{g}") for g in range(3)]
    other = alert("nvlink_xid74", 2, host="n2", gpu=0, id="other")   # another host's: not its cause's
    sxid = alert("nvlink_nvswitch_fatal_sxid", 4, gpu=None, id="sxid")
    late = alert("nvlink_nvswitch_fatal_sxid", 6.5, gpu=None, id="late")  # past 1 + 5
    feed.add([*xids, other, sxid, late])
    assert [a.id for a in feed.flush()] == ["sxid", "x0", "x1", "x2", "other", "late"]
    assert feed.stats["pulled"] == 1


def test_a_cause_on_the_symptoms_own_gpu_is_not_moved():
    # An HBM fault's alerts join by GPU whatever their order: the first stays the root.
    hold = CauseHold(default_config())
    x = alert("gpu_xid_critical", 1, gpu=0)
    assert hold.symptom(x) and not hold.pulls(alert("pcie_aer_fatal", 2, gpu=0), x)
    assert hold.pulls(alert("pcie_aer_fatal", 2, gpu=None), x)


def test_no_hold_keeps_the_plain_canonical_order():
    stage = IncidentStage(IncidentConfig(causality=default_config().causality, hold=0.0))
    feed = stage.feed()
    assert feed.hold is None
    feed.add([alert("nvlink_xid74", 1, gpu=2, id="x"), alert("nvlink_nvswitch_fatal_sxid", 2, gpu=None, id="s")])
    assert [a.id for a in feed.release(T0 + 1.5)] == ["x"]


def test_a_forced_release_of_a_full_buffer_does_not_wait():
    feed = IncidentStage(default_config()).feed(max_buffer=2)
    feed.add([alert("nvlink_xid74", t, gpu=2, id=f"x{t}") for t in (1, 2, 3)])
    assert feed.stats["forced"] == 1 and [a.id for a in feed.release(T0)] == ["x1"]
    assert [a.id for a in feed.flush()] == ["x2", "x3"]


@pytest.mark.parametrize(("text", "hold"), [("hold: 2s\n", 2.0), ("hold: 0s\n", 0.0), ("", 5.0)])
def test_the_hold_is_read_from_the_incidents_file(text, hold):
    cfg, diags = parse_config(text + "actions: [watch, drain_node]\n")
    assert diags == [] and cfg is not None and cfg.hold == hold


@pytest.mark.parametrize("value", ["2m", "-1s", "soon"])
def test_a_hold_out_of_bounds_is_an_error_at_its_place(value):
    cfg, diags = parse_config(f"actions: [watch, drain_node]\nhold: {value}\n", "i.yaml")
    assert cfg is None and [(d.line, d.col, d.code) for d in diags] == [(2, 7, "I007")]
    assert "hold" in diags[0].message


def test_a_version_1_state_loads_its_forced_out_alerts_first():
    blob = msgspec.msgpack.encode([alert("hbm_sbe_burst", 0, id="early"), alert("hbm_sbe_burst", 2, id="a2")])
    feed = _feed()
    feed.load_state({"v": 1, "released": T0 + 0.5, "alerts": blob})
    assert len(feed) == 1 and [a.id for a in feed.flush()] == ["early", "a2"]
    assert feed.released == math.nextafter(T0 + 2, math.inf)


def test_a_pulled_cause_goes_after_its_own_cause_from_the_same_seconds():
    # The host's bandwidth at 0 (a symptom of GPU 0's link), GPU 0's XID 74 at 1 (a symptom of the
    # NVSwitch), the SXid at 2: the SXid opens the incident, the link and the bandwidth join it.
    feed = _feed()
    feed.add([alert("nccl_comm_busbw", 0, gpu=None, id="bw"), alert("nvlink_xid74", 1, gpu=0, id="x"),
              alert("nvlink_nvswitch_fatal_sxid", 0, gpu=None, id="s0"),
              alert("nvlink_nvswitch_fatal_sxid", 2, gpu=None, id="s2")])
    assert [a.id for a in feed.flush()] == ["s0", "s2", "x", "bw"]


# -- MAX_SCAN: what a symptom looks at must not depend on what went out before it ----------------


def _flood() -> list[AlertEvent]:
    # Two GPUs' XID 74s a second apart, then 300 SXids of the host (a flood past MAX_SCAN).
    return [
        alert("nvlink_xid74", 0, gpu=0, id="s1"),
        alert("nvlink_xid74", 1, gpu=1, id="s2"),
        *(alert("nvlink_nvswitch_fatal_sxid", 2, gpu=None, id=f"c{i:03d}") for i in range(300)),
    ]


def test_causes_a_symptom_pulled_in_an_earlier_release_do_not_change_what_the_next_pulls():
    # Was: each rule's causes after a symptom were a slice of MAX_SCAN of the buffer, taken ones
    # included: in one flush s2's slice is the 256 SXids s1 took (it pulls none), released at
    # T0+5.5 (s1 ready, s2 held) those were gone and s2 pulled the other 44.
    whole = _feed()
    whole.add(_flood())
    one = _ids(whole.flush())
    split = _feed()
    split.add(_flood())
    two = _ids(split.release(T0 + 5.5)) + _ids(split.flush())
    assert two == one
    assert 0 < one.index("s1") <= MAX_SCAN and one[: one.index("s1")] == sorted(one[: one.index("s1")])


class _Counting(CauseHold):
    """The shipped hold, counting what the feed asks it about pairs of alerts."""

    def __init__(self) -> None:
        super().__init__(default_config())
        self.asked = 0

    def pulls(self, cause: AlertEvent, symptom: AlertEvent) -> bool:
        self.asked += 1
        return super().pulls(cause, symptom)


def test_a_flood_of_alerts_each_of_its_own_rule_costs_each_at_most_max_scan_looks():
    # Forwarded alerts are checked for length only: 600 NIC alerts on one host, each of a rule of
    # its own (network_* is a cause and a symptom of nic_port). Was: every symptom looked at every
    # rule's causes, 600 x 600 questions (a 200,000-alert flood: hours).
    n = 600
    flood = [
        AlertEvent(
            id=f"a{i}",
            state="firing",
            fault="f",
            severity="warning",
            rule=f"network_r{i}",
            host="n1",
            gpu=i % 8,
            ts=T0 + i * 1e-3,
            started_at=T0,
        )
        for i in range(n)
    ]
    hold = _Counting()
    feed = AlertFeed(hold=hold)
    feed.add(flood)
    assert len(feed.flush()) == n
    assert hold.asked <= n * (MAX_SCAN + 2)


class _CountingCauses(CauseHold):
    def __init__(self) -> None:
        super().__init__(default_config())
        self.asked = 0

    def cause(self, a: AlertEvent) -> bool:
        self.asked += 1
        return super().cause(a)


def test_releases_short_of_a_held_symptoms_hold_do_not_look_at_what_waits_behind_it_again():
    # Was: every release sorted and indexed every alert waiting behind a held symptom (100,000 of
    # them: 0.14 s a release, the fleet releasing at every batch of messages).
    n = 2000
    hold = _CountingCauses()
    feed = AlertFeed(rank=IncidentStage(default_config()).rootness, hold=hold)
    feed.add([alert("nvlink_xid74", 0, gpu=0, id="x")])
    feed.add([alert("hbm_sbe_burst", 0.5 + i * 1e-3, host=f"h{i % 50}", id=f"a{i}") for i in range(n)])
    for k in range(40):
        assert feed.release(T0 + 1 + k * 0.1) == []
    assert len(feed) == n + 1 and feed.released == T0 + 4.9
    assert hold.asked <= 2 * n
    assert [a.id for a in feed.release(T0 + 5.5)][:2] == ["x", "a0"]


# -- any batching, watermarks and restores: one sequence -------------------------------------------


@st.composite
def _deliveries(draw):
    """Alerts at a few quarter seconds (many at one), on hosts n1, "" and None, some resolved,
    some twice; delivered in batches with watermarks (NaN and -inf among them) that each pass an
    alert's ts only after it came; the last release is the flush."""
    items = []
    for i in range(draw(st.integers(0, 40))):
        t = draw(st.integers(0, 48)) / 4
        rule = draw(st.sampled_from(RULES))
        gpu = None if rule in HOST_LEVEL else draw(st.integers(0, 2))
        a = alert(rule, t, draw(st.sampled_from(["n1"] * 6 + ["", None])), gpu, id=f"a{i}")
        items.append(a)
        if draw(st.integers(0, 3)) == 0:
            items.append(resolved(a, t + draw(st.integers(0, 8)) / 4))
    items += [a for a in items if draw(st.integers(0, 4)) == 0]
    marks = sorted(set(draw(st.lists(st.integers(0, 100), max_size=10))))
    upto = [T0 + m / 4 for m in marks]
    waves: list[list[AlertEvent]] = [[] for _ in range(len(upto) + 1)]
    for a in draw(st.permutations(items)):
        due = next((i for i, m in enumerate(upto) if a.ts < m), len(upto))
        waves[draw(st.integers(0, due))].append(a)
    steps = []
    for wave, m in zip(waves, [*upto, None]):
        if draw(st.integers(0, 5)) == 0:
            steps.append(([], draw(st.sampled_from([math.nan, -math.inf]))))
        steps.append((wave, m))
    return items, steps


@pytest.mark.parametrize("scan", [1, MAX_SCAN])
@settings(max_examples=fuzz_examples(80), deadline=None)
@given(d=_deliveries())
def test_any_batching_gives_the_sequence_of_one_flush_also_with_a_small_scan(scan, d):
    items, steps = d
    with mock.patch.object(feed_mod, "MAX_SCAN", scan):
        got = _run(_feed(), steps)
        whole = _feed()
        whole.add(items)
        assert _ids(got) == _ids(whole.flush())


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(_deliveries(), st.integers(0, 12))
def test_a_restore_anywhere_changes_nothing_also_with_a_small_scan(d, cut):
    items, steps = d
    cut = min(cut, len(steps))
    with mock.patch.object(feed_mod, "MAX_SCAN", 1):
        whole = _run(_feed(), steps)
        first = _feed()
        before = _run(first, steps[:cut])
        second = _feed()
        second.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(first.to_state())))
        again = _run(second, [(w, second.released) for w, _ in steps[:cut]] + steps[cut:])
        assert _ids(before + again) == _ids(whole)


def test_a_version_2_state_keeps_held_and_forced_out_alerts_apart():
    feed = _feed(max_buffer=2)
    feed.add(
        [
            alert("hbm_sbe_burst", 0, id="e0"),
            alert("nvlink_xid74", 1, gpu=2, id="x1"),
            alert("hbm_sbe_burst", 2, id="e2"),
        ]
    )  # e0 forced out: the buffer full, one beside it
    # Was: the state of a full buffer with alerts forced out beside it was refused on loading
    # (its alerts and early together counted against max_buffer).
    assert feed.stats["forced"] == 1
    again = _feed(max_buffer=2)
    again.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(feed.to_state())))
    assert _ids(again.release(T0 + 3)) == ["e0"] and len(again) == 2  # x1 held, e2 behind it
    third = _feed()
    third.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(again.to_state())))
    assert third.released == T0 + 3
    third.add([alert("hbm_sbe_burst", 2.5, id="late"), alert("nvlink_nvswitch_fatal_sxid", 4, gpu=None, id="s4")])
    assert third.stats["late"] == 1 and _ids(third.release(T0 + 6.5)) == ["s4", "x1", "e2"]


# -- a lull, and the incident stage behind the reorder -------------------------------------------


def test_a_lull_lets_held_symptoms_go_and_a_cause_after_it_comes_after_them():
    # A lull (pipeline/service/fleet.py: every telemetry partition final at once) releases
    # everything, as the fleet stage releases its records then: a held symptom goes without its
    # cause, and a cause that comes after the lull, within the hold, goes after it (not late).
    xid74 = alert("nvlink_xid74", 0, gpu=3, id="x")
    sxid = alert("nvlink_nvswitch_fatal_sxid", 1, gpu=None, id="s")
    lulled = _feed()
    lulled.add([xid74])
    assert _ids(lulled.release(math.inf)) == ["x"]  # the lull
    lulled.add([sxid])
    assert lulled.stats["late"] == 0 and _ids(lulled.flush()) == ["s"]


def test_a_symptom_pulled_behind_its_cause_still_keeps_its_gpus_incident_from_resolving():
    old = alert("nvlink_xid74", -303, gpu=0, id="old")  # resolves at -298: quiet until 2
    xid74 = alert("nvlink_xid74", 0, gpu=0, id="x")  # within that quiet, same GPU and family
    sxid = alert("nvlink_nvswitch_fatal_sxid", 3, gpu=None, id="s")
    stage = IncidentStage(default_config())
    feed = stage.feed()
    feed.add([old, resolved(old, -298), xid74, sxid])
    events = stage.process(feed.flush())
    old_inc = [e for e in events if e.root.alert == "old"]
    assert "x" in old_inc[-1].members and all(e.state != "resolved" for e in old_inc)


def test_no_incident_event_is_dated_before_its_incident_opened():
    xid = alert("gpu_xid_critical", 0, gpu=3, id="x")
    aer = alert("pcie_aer_fatal", 2, gpu=None, id="aer")
    stage = IncidentStage(default_config())
    feed = stage.feed()
    feed.add([xid, aer, alert("gpu_xid_critical", 1, gpu=1, id="g")])
    events = stage.process(feed.flush())
    assert len({e.incident for e in events}) == 1
    assert all(e.ts >= e.opened_at for e in events)


def test_a_cause_in_the_symptoms_own_second_that_sorts_after_it_goes_before_it():
    busbw = alert("nccl_comm_busbw", 0, gpu=None, id="bw", comm="c1")
    link = alert("nvlink_xid74", 0, gpu=3, id="x74")  # nvlink_down: a link down slows its host's collectives
    stage = IncidentStage(default_config())
    feed = stage.feed()
    feed.add([busbw, link])
    events = stage.process(feed.flush())
    assert [(e.state, e.root.alert) for e in events] == [("opened", "x74"), ("updated", "x74")]
