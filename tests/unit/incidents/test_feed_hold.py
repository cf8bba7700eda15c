"""The feed's hold (pipeline/incidents/hold.py): a possible symptom waits ``hold`` seconds of event
time for a cause on its host, which then goes before it; whatever the batching, watermarks and
restores, the incident stage still gets one sequence."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents.config import IncidentConfig, parse_config
from pipeline.incidents.feed import AlertFeed
from pipeline.incidents.hold import CauseHold
from tests.factories import fuzz_examples
from tests.unit.incidents.factories import T0, alert, feed_deliveries

# Causes (an SXid, a PCIe AER error: host-level), their symptoms on GPUs and the host
# (XID 74, a GPU's critical XID, the host's bandwidth), and a rule that is neither (an SBE burst).
RULES = ("nvlink_nvswitch_fatal_sxid", "pcie_aer_fatal", "nvlink_xid74", "gpu_xid_critical", "nccl_comm_busbw",
         "hbm_sbe_burst")
HOLD = 5.0


def _feed() -> AlertFeed:
    return IncidentStage(default_config()).feed()


def _run(feed: AlertFeed, steps) -> list:
    out = []
    for wave, mark in steps:
        feed.add(wave)
        out += feed.flush() if mark is None else feed.release(mark)
    return out


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(feed_deliveries(RULES))
def test_any_batching_and_watermarks_give_the_sequence_of_one_flush(d):
    items, marks, waves = d
    got = _run(_feed(), list(zip(waves, [*marks, None])))
    whole = _feed()
    whole.add(items)
    assert got == whole.flush()


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
    def pulled(c, x) -> bool:
        return hold.symptom(x) and hold.cause(c) and x.ts < c.ts <= x.ts + HOLD and hold.pulls(c, x)

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


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(feed_deliveries(RULES), st.integers(0, 8))
def test_a_restore_mid_stream_with_alerts_held_changes_nothing(d, cut):
    items, marks, waves = d
    steps = list(zip(waves, [*marks, None]))
    cut = min(cut, len(steps))
    whole = _run(_feed(), steps)
    first = _feed()
    before = _run(first, steps[:cut])
    second = _feed()
    second.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(first.to_state())))
    # The upstream replays what it sent since its own checkpoint: the first waves again.
    again = _run(second, [(w, second.released) for w, _ in steps[:cut]] + steps[cut:])
    assert before + again == whole and second.stats["late"] >= 0


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
