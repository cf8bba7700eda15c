"""Ports that leave sysfs: ``produce ib-sysfs`` sends each port it saw before and no longer finds
as absent (``NIC_ABSENT_LABEL``), so a driver unloaded or every NIC of a host fallen off the bus
is ``network_port_lost``, where the producer used to send nothing and the checks heard nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.decode import Decoder
from pipeline.schema import NIC_ABSENT_LABEL, dcgm, encode
from producers.ib_sysfs import IbSysfsSource
from tests.factories import T0
from tests.unit.producers.factories import h100_node
from tests.unit.rules.factories import run_ports

H100 = "NVIDIA H100 80GB HBM3"


def _polls(root: Path, seconds: range, unload_at: float | None = None, step: float = 10.0) -> list:
    """The producer's records every ``step`` s of ``seconds``, the HCAs' driver unloaded (every
    device gone from ``sys/class/infiniband``) at ``unload_at``, decoded as the service would;
    beside them the host's GPUs (DCGM every 10 s, naming their model)."""
    now = [T0]
    src = IbSysfsSource(str(root), host="n1", clock=lambda: now[0])
    recs: list = []
    for t in seconds:
        if t % step:
            continue
        if unload_at is not None and t >= unload_at and (root / "sys" / "class" / "infiniband").exists():
            shutil.rmtree(root / "sys" / "class" / "infiniband")
        now[0] = T0 + t
        out = Decoder().decode(encode(src.poll()), f"p:{t}")
        assert out.dead == []
        recs += out.records
        recs += [dcgm(T0 + t, "n1", g, {"gpu_temp": 60}, model=H100) for g in range(2)]
    return recs


def test_a_port_gone_from_sysfs_is_sent_as_absent_each_poll(tmp_path):
    h100_node(tmp_path)
    src = IbSysfsSource(str(tmp_path), host="n1", clock=lambda: T0)
    assert len(src.poll()) == 9
    (tmp_path / "sys" / "class" / "infiniband" / "mlx5_4").unlink()  # its class link, as a hot-unplug removes it
    recs = src.poll()
    gone = [r for r in recs if r.labels.get(NIC_ABSENT_LABEL) == "1"]
    assert [(r.device, r.port, r.state, r.counters) for r in gone] == [("mlx5_4", 1, None, {})]
    assert len(recs) == 9 and src.summary()["absent_ports"] == 1
    assert src.summary()["dropped.unreadable"] == 0


def test_a_driver_unloaded_is_every_port_lost(tmp_path):
    h100_node(tmp_path)
    alerts, _ = run_ports(_polls(tmp_path, range(0, 900), unload_at=300))
    lost = sorted({a.labels.get("device") or a.entity for a in alerts if a.rule == "network_port_lost"})
    firing = [a for a in alerts if a.rule == "network_port_lost" and a.state == "firing"]
    assert len(firing) == 9, (lost, [(a.rule, a.state) for a in alerts])
    assert all(a.severity == "critical" and 300 < a.ts - T0 <= 340 for a in firing)
    low = [a for a in alerts if a.rule == "network_active_ports_low" and a.state == "firing"]
    assert len(low) == 1 and low[0].evidence["active_ports"] == 0


def test_a_healthy_host_sends_no_absent_port_and_raises_nothing(tmp_path):
    h100_node(tmp_path)
    recs = _polls(tmp_path, range(0, 900))
    assert not any(getattr(r, "labels", {}).get(NIC_ABSENT_LABEL) for r in recs)
    assert run_ports(recs)[0] == []
