"""The alert that opens an incident names its root: among the alerts of one GPU at one time, the
one calling for the highest action, then the most severe (``IncidentStage.rootness``, applied by
``AlertFeed`` to each second it releases, so no batching changes it)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from pipeline.incidents import IncidentStage
from pipeline.incidents.config import default_config
from pipeline.schema import AlertEvent
from tests.factories import T0

ROOT = Path(__file__).resolve().parents[3]


def _alert(rule: str, severity: str, ts: float = T0, gpu: int = 4) -> AlertEvent:
    return AlertEvent(id=f"{rule}-{gpu}-{ts}", state="firing", fault=rule, severity=severity, rule=rule,
                      host="n1", gpu=gpu, ts=ts, started_at=ts)


LINK_DOWN = [  # what a link going down raises at one time: warnings sort before the XID by name
    _alert("nvlink_crc_errors", "warning"),
    _alert("nvlink_replays", "warning"),
    _alert("nvlink_xid74", "critical"),
    _alert("nvlink_error_rate", "warning"),
]


def _opened(alerts: list[AlertEvent], batches: list[int]) -> list[tuple[str, str, str]]:
    """The opened incidents' (root rule, severity, action) of ``alerts`` added to a feed in
    ``batches`` (the rest last) and released once the watermark passed them all."""
    stage = IncidentStage(default_config())
    feed = stage.feed()
    i = 0
    for n in batches:
        feed.add(alerts[i:i + n])
        i += n
    feed.add(alerts[i:])
    events = stage.process(feed.release(T0 + 0.5)) + stage.process(feed.flush())
    return [(e.root.rule, e.severity, e.action) for e in events if e.state == "opened"]


def test_a_link_going_down_is_rooted_at_its_xid_not_its_first_warning():
    # Before: the first alert in (time, host, GPU, rule) order opened the incident, named
    # "NVLink CRC errors rising" (a warning); routes matching the root's fault did not drain.
    got = _opened(LINK_DOWN, [])
    assert got[0] == ("nvlink_xid74", "critical", "drain_node")


def test_the_root_does_not_depend_on_arrival_order():
    rng = random.Random(7)
    want = _opened(LINK_DOWN, [])
    for _ in range(20):
        alerts = LINK_DOWN[:]
        rng.shuffle(alerts)
        cuts = [rng.randrange(0, 3) for _ in range(rng.randrange(0, 3))]
        assert _opened(alerts, cuts) == want


def test_alerts_of_other_gpus_or_times_keep_the_canonical_order():
    # Only one GPU's alerts of one time are ranked: an earlier warning still opens its incident.
    alerts = [_alert("nvlink_crc_errors", "warning", ts=T0), _alert("nvlink_xid74", "critical", ts=T0 + 1)]
    assert _opened(alerts, [])[0][0] == "nvlink_crc_errors"
    stage = IncidentStage(default_config())
    feed = stage.feed()
    feed.add([_alert("nvlink_xid74", "critical", gpu=5), _alert("nvlink_crc_errors", "warning", gpu=4)])
    assert [a.gpu for a in feed.flush()] == [4, 5]


def test_replay_of_a_link_going_down_names_the_xid_and_drains(tmp_path):
    rec = tmp_path / "n.jsonl"
    run = [sys.executable, "-m", "pipeline", "-q"]
    subprocess.run([*run, "sim", "--hosts", "2", "--duration", "600", "--seed", "1", "--scenario", "nvlink_down",
                    "--out", str(rec)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    inc = tmp_path / "i.jsonl"
    subprocess.run([*run, "replay", str(rec), "--alerts-out", str(tmp_path / "a.jsonl"), "--incidents-out", str(inc)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    opened = [e for e in map(json.loads, inc.read_text().splitlines()) if e["state"] == "opened"]
    assert [(e["root"]["rule"], e["severity"], e["action"]) for e in opened] == [("nvlink_xid74", "critical", "drain_node")]


def test_hostile_rule_names_are_ranked_without_being_kept():
    # Found by review: the rank of each (rule, severity) was cached before the stage dropped an
    # alert with a rule name past its limit: 2,000 of 100 KB held 200 MB.
    stage = IncidentStage(default_config())
    feed = stage.feed()
    feed.add([_alert("r" * 100_000 + str(i), "critical", ts=T0 + i) for i in range(200)])
    stage.process(feed.flush())
    assert stage.stats["incidents.dropped.bad_alert"] == 200 and len(stage._rungs) == 0
