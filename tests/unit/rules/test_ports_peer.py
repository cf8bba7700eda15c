"""A NIC alert names the switch port at the far end of the cable (#34): the producer's
``--peers`` label rides on the ``NicRecord`` through the decoder and the port stage into the
alert's labels, which are what the ``notify-fabric`` webhook sends; a snapshot from before peers
restores."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.decode import Decoder
from pipeline.engine import Engine, EngineConfig
from pipeline.remediation.config import load_config
from pipeline.remediation.routes import RouteTree
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import encode
from producers.ib_sysfs import IbSysfsSource
from producers.ibpeers import PeerFile
from tests.factories import T0
from tests.unit.producers.factories import port_dir, write
from tests.unit.rules.factories import port_series, run_ports

ROOT = Path(__file__).resolve().parents[3]
# One link of a public ibnetdiscover output (tests/unit/producers/test_producer_ibpeers.py has the origin).
TOPOLOGY = """switchguid=0x2c9020046c588(2c9020046c588)
Switch  36 "S-0002c9020046c588"                     # "Infiniscale-IV Mellanox Technologies" base port 0 lid 2 lmc 0
[1]     "H-0002c90300293e1e"[1](2c90300293e1f)      # "ip-211 mlx4_0" lid 6 4xQDR
"""
PEER = {"peer": "Infiniscale-IV Mellanox Technologies", "peer_guid": "0x0002c9020046c588", "peer_port": "1",
        "peer_lid": "2"}


def test_a_port_down_alert_names_its_switch_port_from_producer_to_webhook_body(tmp_path):
    root = tmp_path / "root"
    p = port_dir(root, "mlx4_0", rate="40 Gb/sec (4X QDR)")
    write(p / "gids" / "0", "fe80:0000:0000:0000:0002:c903:0029:3e1f\n")
    peers = tmp_path / "ibnetdiscover.txt"
    peers.write_text(TOPOLOGY)
    now = [T0]
    src = IbSysfsSource(str(root), host="ip-211", clock=lambda: now[0], peers=PeerFile(str(peers)))
    cfg, _ = parse_port_config("")
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    dec = Decoder()
    alerts = []
    for i in range(12):
        now[0] = T0 + 10 * i
        if i == 6:  # the cable is pulled
            write(p / "state", "1: DOWN\n")
            write(p / "phys_state", "3: Disabled\n")
        out = dec.decode(encode(src.poll()), f"nic#{i}")
        assert out.dead == []
        alerts += eng.process(out.records).alerts
    alerts += eng.flush().alerts
    down = [a for a in alerts if a.rule == "network_port_down" and a.state == "firing"]
    assert len(down) == 1
    a = down[0]
    assert a.labels == {"device": "mlx4_0", "port": "1", "link_layer": "InfiniBand", **PEER}
    # The fabric route takes it, and the webhook's body (the alert JSON) names the switch port.
    tree = RouteTree.build(load_config(ROOT / "rules" / "routes.yaml").raw.route)
    assert [m.receiver for m in tree.match(a)] == ["fabric"]
    assert json.loads(encode(a))["labels"]["peer_port"] == "1"


def test_the_peer_survives_a_snapshot_and_one_from_before_peers_restores():
    recs = port_series(300, states=lambda t: (1, 3) if t >= 200 else (4, 5), peer="leaf01", peer_port=17)
    half = len(recs) // 2
    cfg, _ = parse_port_config("")
    first = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    first.process(recs[:half])
    snap = first.snapshot()
    second = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    second.restore(snap)
    alerts = second.process(recs[half:]).alerts + second.flush().alerts
    fire = [a for a in alerts if a.state == "firing"]
    assert fire and all(a.labels["peer"] == "leaf01" and a.labels["peer_port"] == "17" for a in fire)
    # A stage state written before ports had peers has none in its pasts: it restores, unlabelled,
    # and the next record labels the port again.
    stage = PortStage(cfg)
    stage.nic_arrived(recs[:half])
    stage.nic_release(float("inf"))
    old = stage.to_state()
    for past in old["past"]:
        del past["peer"]
    back = PortStage(cfg)
    back.load_state(old)
    back.nic_arrived(recs[half:])
    fired = [a for a in back.nic_release(float("inf")) if a.state == "firing"]
    assert fired and fired[0].labels["peer"] == "leaf01"


def test_ports_without_a_peer_have_no_peer_labels():
    alerts, _ = run_ports(port_series(400, states=lambda t: (1, 3) if t >= 200 else (4, 5)))
    assert alerts and not any(k.startswith("peer") for a in alerts for k in a.labels)
