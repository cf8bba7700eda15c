"""NIC port records end to end through a real broker and `gpuwarden serve` (#34): a healthy
simulated fleet whose hosts also send their InfiniBand ports' records (one port goes DOWN, one
counts a link_downed, one bursts symbol errors, the rest are ACTIVE and congested), published
per host through Kafka like any telemetry, gives exactly the alerts of `gpuwarden replay` of the
same file: the GPU alerts unchanged, the port alerts from the host stage, each naming its device,
port and GPUs."""

from __future__ import annotations

import json
import time

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import ensure_topics
from pipeline.schema import NicRecord, encode
from tests.faults.factories import (
    ServiceProc,
    alerts_on_topic,
    golden_alerts,
    ids,
    no_conflicting_duplicates,
    on_topic,
    published_in_background,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.kafka


def _ports(host: str, ts: float, t0: float, faulty: bool) -> list[NicRecord]:
    """A host's eight ports at ``ts``; on the faulty host mlx5_0 is DOWN from 120 s to 180 s,
    mlx5_1 counts a link_downed at 200 s and mlx5_2 bursts 200 symbol errors at 150 s (past the IBTA
    bound of 120 an hour and NVSentinel's 10 a second)."""
    t = ts - t0
    out = []
    for p in range(8):
        down = faulty and p == 0 and 120 <= t < 180
        counters = {"link_downed": 1 if faulty and p == 1 and t >= 200 else 0,
                    "symbol_error": 200 if faulty and p == 2 and t >= 150 else 0,
                    "port_xmit_wait": int(t) * 10**8, "port_xmit_discards": int(t) * 50}
        out.append(NicRecord(ts=ts, host=host, device=f"mlx5_{p}", port=1, link_layer="InfiniBand", rate_gbps=400.0,
                             state=1 if down else 4, state_name="DOWN" if down else "ACTIVE",
                             phys_state=3 if down else 5, phys_state_name="Disabled" if down else "LinkUp",
                             counters=counters, gpus=[p], netdev=f"ibp{p}s0"))
    return out


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    import subprocess
    import sys

    from tests.faults.factories import ROOT

    tmp = tmp_path_factory.mktemp("nic")
    sim = tmp / "sim.jsonl"
    subprocess.run([sys.executable, "-m", "pipeline", "sim", "--hosts", "3", "--duration", "300", "--seed", "5",
                    "--scenario", "healthy", "--out", str(sim)], check=True, cwd=ROOT, capture_output=True)
    lines = sim.read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    t0 = min(r["ts"] for r in recs)
    hosts = sorted({r["host"] for r in recs})
    seen: set[tuple[str, float]] = set()
    out = []
    for line, r in zip(lines, recs):
        out.append(line)
        key = (r["host"], float(int(r["ts"])))
        if (key[1] - int(t0)) % 10 == 0 and key not in seen:  # every 10 s, after the host's first sample
            seen.add(key)
            out += [encode(p).decode() for p in _ports(r["host"], r["ts"], t0, faulty=r["host"] == hosts[0])]
    rec = tmp / "rec.jsonl"
    rec.write_text("\n".join(out) + "\n")
    golden = golden_alerts(rec, tmp)
    got = [json.loads(x) for x in (tmp / "golden.jsonl").read_text().splitlines()]
    return rec, golden, got, hosts


def test_port_records_through_kafka_and_serve_give_the_replays_alerts(kafka_bootstrap, topic_prefix, tmp_path,
                                                                      recording):
    rec, golden, replayed, hosts = recording
    net = [a for a in replayed if a["fault"].startswith("network_") and a["state"] == "firing"]
    assert sorted((a["rule"], a["labels"]["device"]) for a in net) == [
        ("network_link_errors", "mlx5_1"), ("network_port_down", "mlx5_0"), ("network_symbol_error_rate", "mlx5_2"),
        ("network_symbol_errors", "mlx5_2")]
    assert all(a["host"] == hosts[0] and a["labels"]["gpus"] == a["labels"]["device"][-1] for a in net)
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    cfg = write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix)
    pub = published_in_background(rec, kafka_bootstrap, topic_prefix, speed=30)
    svc = ServiceProc(cfg, tmp_path / "svc.log").start()
    pub.join(120)
    wait_for(lambda: ids(alerts_on_topic(kafka_bootstrap, topic_prefix)) >= golden, timeout=180, step=2,
             what="every golden alert on the alerts topic")
    time.sleep(3)
    assert svc.term() == 0
    got = alerts_on_topic(kafka_bootstrap, topic_prefix)
    assert ids(got) == golden
    no_conflicting_duplicates(got)
    # Not one port record was refused on the way (the fleet's own blank fields may be).
    dead = on_topic(kafka_bootstrap, Topics(topic_prefix).dlq)
    assert not [d for d in dead if '"kind":"nic"' in (d.get("raw") or "")], dead[:3]
