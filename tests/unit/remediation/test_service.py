"""The service loop on the in-process bus: malformed alerts are audited and skipped, offsets are
committed only after the audit is stored, one instance at a time."""

from __future__ import annotations

import json

import pytest

from pipeline.bus import MemoryBus, Topics
from pipeline.errors import DeliveryError, StateError
from pipeline.remediation.guardrails import StateStore
from pipeline.remediation.service import RemediationService
from pipeline.schema import encode
from tests.unit.remediation.factories import alert, config


class FailingProducer:
    """Accepts sends; ``flush`` fails while ``broken`` (a broker that does not acknowledge)."""

    def __init__(self, inner) -> None:
        self.inner, self.broken = inner, True

    def send(self, topic, value, key=None):
        self.inner.send(topic, value, key)

    def flush(self, timeout=None):
        if self.broken:
            raise DeliveryError("1 of 1 sends not acknowledged", failed=1, retriable=True)
        return self.inner.flush()

    def close(self):
        pass


def service(tmp_path, bus, producer=None, **cfg_kw):
    cfg = config(tmp_path, audit={"kafka": True, "file": str(tmp_path / "audit.jsonl")}, **cfg_kw)
    topics = Topics("t")
    return RemediationService(cfg, prefix="t", consumer=bus.consumer(topics.alerts, "rem"),
                              producer=producer or bus.producer())


def test_malformed_alerts_are_audited_and_the_rest_still_handled(tmp_path, fakes):
    bus = MemoryBus(partitions=1)
    t = Topics("t")
    for v in [b'{"kind":"alert","id":', b'{"kind":"alert","id":"x"}', b"[1,2]", encode(alert("n1"))]:
        bus.append(t.alerts, v, b"n1")
    svc = service(tmp_path, bus)
    assert svc.step(poll_timeout=0) == 4
    audit = [json.loads(m.value) for m in bus.messages(t.audit)]
    assert [a["decision"] for a in audit] == ["skipped", "skipped", "skipped", "acted"]
    assert all(a["reason"].startswith("malformed_alert:") for a in audit[:3])
    assert audit[0]["origin"] == "t.alerts[0]@0" and "missing required field" in audit[1]["reason"]
    assert audit[3]["argv"][:3] == ["scontrol", "update", "nodename=n1"]
    # the audit file holds the same records
    assert [json.loads(x)["decision"] for x in (tmp_path / "audit.jsonl").read_text().splitlines()] == \
        [a["decision"] for a in audit]
    svc.close()


def test_offsets_are_committed_only_after_the_audit_is_stored(tmp_path, fakes, monkeypatch):
    monkeypatch.setattr("pipeline.remediation.service.time.sleep", lambda s: None)
    bus = MemoryBus(partitions=1)
    t = Topics("t")
    bus.append(t.alerts, encode(alert("n1", id="c1")), b"n1")
    prod = FailingProducer(bus.producer())
    svc = service(tmp_path, bus, producer=prod)
    with pytest.raises(DeliveryError):
        svc.step(poll_timeout=0)
    svc.close()
    assert bus.consumer(t.alerts, "rem").lag() == 1          # nothing committed
    # restart with a working broker: the alert comes again, is recognised, and is not acted on twice
    svc = service(tmp_path, bus)
    assert svc.step(poll_timeout=0) == 1
    assert bus.consumer(t.alerts, "rem").lag() == 0
    assert len(fakes.updates()) == 1
    last = json.loads(bus.messages(t.audit)[-1].value)
    assert last["decision"] == "skipped" and last["reason"].startswith("duplicate: alert c1")
    svc.close()


def test_only_one_instance_runs(tmp_path, fakes):
    cfg = config(tmp_path)
    first = StateStore(cfg.state_file)
    first.lock()
    second = StateStore(cfg.state_file)
    with pytest.raises(StateError, match="only one may run"):
        second.lock()
    first.close()
    second.lock()
    second.close()


def test_run_stops_when_idle_and_handles_group_wait(tmp_path, fakes):
    bus = MemoryBus(partitions=2)
    t = Topics("t")
    for g in range(4):
        bus.append(t.alerts, encode(alert("n1", gpu=g)), b"n1")
    svc = service(tmp_path, bus, route={"receiver": "drain", "group_by": ["host"], "group_wait": "200ms"})
    stats = svc.run(idle_exit_s=1.0, poll_timeout=0.1)
    assert stats.messages == 4
    decisions = [json.loads(m.value)["decision"] for m in bus.messages(t.audit)]
    assert sorted(decisions) == ["acted", "queued", "skipped", "skipped", "skipped"]
    assert len(fakes.updates()) == 1


def test_incident_mode_with_routes_that_read_no_incident_label_says_so(tmp_path, caplog):
    # The audit of one fault at a time: `--source incidents` with the shipped alert-mode routes
    # routed each incident by its root alert's fault, and its recommended drain never ran,
    # without a word.
    bus = MemoryBus(partitions=1)
    with caplog.at_level("WARNING", logger="gpuwarden.remediation.service"):
        RemediationService(config(tmp_path), prefix="t", source="incidents", consumer=bus.consumer("t.incidents", "r"),
                           producer=bus.producer())
    assert "no route matches on action, incident, policy" in caplog.text
    caplog.clear()
    by_action = {"receiver": "drain", "routes": [{"matchers": ['action="drain_node"'], "receiver": "drain"}]}
    with caplog.at_level("WARNING", logger="gpuwarden.remediation.service"):
        RemediationService(config(tmp_path, route=by_action), prefix="t", source="incidents",
                           consumer=bus.consumer("t.incidents", "r"), producer=bus.producer())
        RemediationService(config(tmp_path), prefix="t", source="alerts", consumer=bus.consumer("t.alerts", "r"),
                           producer=bus.producer())
    assert "no route matches" not in caplog.text
