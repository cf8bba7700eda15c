"""Checkpoints on a cadence (docs/operations.md, How it keeps its promises): kill -9 long after a
partition's last checkpoint, with alerts already out since, replays from that checkpoint and
loses no alert; the repeats carry the same ids."""

from __future__ import annotations

import time

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import ensure_topics
from tests.faults.factories import (
    ServiceProc,
    alerts_on_topic,
    golden_alerts,
    ids,
    no_conflicting_duplicates,
    published_in_background,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.kafka

INTERVAL_S = 15


def test_kill9_between_two_checkpoints_well_after_the_last_loses_no_alert(kafka_bootstrap, topic_prefix, tmp_path,
                                                                          sim_recording):
    rec = sim_recording(hosts=6, duration=900, seed=4)
    golden = golden_alerts(rec, tmp_path)
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    # flush_idle_s above the kill's moment: the only checkpoints before it are the cadence's.
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix, checkpoint_interval_s=INTERVAL_S,
                       flush_idle_s=INTERVAL_S, log_level="DEBUG")
    # ~45 s of publishing: the kill comes ~INTERVAL_S * 1.5 after the start, with records still
    # arriving after it; the INTERVAL_S / 2 before it are ~150 s of event time, alerts among them.
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=20)
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()

    def checkpoints(why: str | None = None) -> list[int]:
        return [i for i, x in enumerate(svc.lines()) if x.get("message", "").startswith("checkpointed partitions")
                and (why is None or why in x.get("why", "").split("+"))]
    wait_for(lambda: checkpoints("interval"), INTERVAL_S + 60, what="a round of checkpoints on the cadence")
    time.sleep(INTERVAL_S / 2)                      # well after that round, well before the next
    lines = svc.lines()
    last = max(checkpoints())
    assert "interval" in lines[last].get("why", "").split("+")
    alerts_since = [x for x in lines[last + 1:] if x.get("message", "").startswith("alert ")]
    assert alerts_since, "no alert was sent between the last checkpoint and the kill: the case tests nothing"
    assert not any(x.get("message", "").startswith("checkpointed") for x in lines[last + 1:])
    svc.kill9()
    svc.start()
    pub.join(150)
    wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) >= golden,
             timeout=180, step=1, what="every golden alert on the alerts topic")
    svc.term()
    got = alerts_on_topic(kafka_bootstrap, topic_prefix)
    assert ids(got) == golden
    no_conflicting_duplicates(got)
    assert any("state restored" in x.get("message", "") for x in svc.lines()[last:])
