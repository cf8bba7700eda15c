"""NIC port records in the engine (#34): screened like every record, counted as carried
(``records.nic``), never buffered as rows nor forwarded to the fleet stage, and they change no
GPU detection: a fleet's alerts are the same with and without its hosts' port records."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bus.base import Message
from pipeline.bus.telemetry import per_host_messages
from pipeline.detection import build_detector
from pipeline.engine import Engine
from pipeline.runner import Pipeline
from pipeline.schema import NicRecord, encode
from producers.sim.simulator import Simulator
from tests.factories import T0, THROTTLED, sample

RULES = str(Path(__file__).resolve().parents[3] / "rules")


def port(t: float, host: str = "n1", port: int = 1, **kw) -> NicRecord:
    """A port record at T0 + t: DOWN and its link_downed rising, the worst a port says."""
    return NicRecord(ts=T0 + t, host=host, device="mlx5_0", port=port, state=1, state_name="DOWN",
                     counters={"link_downed": int(t)}, **kw)


def _alerts(out) -> list[tuple]:
    return [(a.id, a.state, a.fault, a.host, a.gpu, a.ts) for a in out]


def test_port_records_change_no_gpu_alert_and_are_counted():
    def run(with_ports: bool):
        eng, got = Engine(), []
        for t in range(40):
            batch = [sample(t, "n1", 0, **THROTTLED), sample(t, "n1", 1)]
            if with_ports:
                batch += [port(t + 0.5), port(t, "n1", 2), port(t, "n9")]  # n9 sends nothing else
            out = eng.process(batch)
            assert out.dead == []
            got += out.alerts
        got += eng.flush().alerts
        return _alerts(got), eng

    plain, _ = run(False)
    with_ports, eng = run(True)
    assert plain and with_ports == plain
    assert eng.stats["records.nic"] == 120 and eng.stats["records.dcgm"] == 80
    assert eng.pending == 0


def test_port_records_are_not_forwarded_and_late_ones_are_dead_letters():
    eng = Engine(forwards=True)
    out = eng.process([sample(t, "n1", 0) for t in range(60)] + [port(59)])
    assert [type(r).__name__ for r in out.forwarded].count("NicRecord") == 0 and len(out.forwarded) == 60
    late = eng.process([port(0)])
    assert [d.reason for d in late.dead] == ["late"] and eng.stats["records.nic"] == 1
    eng2 = Engine()
    eng2.restore(eng.snapshot())  # nothing of them in the state to restore
    assert eng2.stats["records.nic"] == 1


def test_the_two_stage_detector_with_models_carries_port_records_from_the_wire():
    sim = Simulator(hosts=3, duration=240, seed=5, scenario="mixed")
    batches = [b for b in sim.batches() if b]

    def run(with_ports: bool):
        det, diags = build_detector([RULES], "auto")
        assert det is not None, diags
        pipe, got, off = Pipeline(det), [], 0
        for batch in batches:
            msgs = []
            for key, value in per_host_messages(batch):
                if with_ports:
                    host = key.decode() if isinstance(key, bytes) else str(key)
                    recs = json.loads(value)
                    recs = recs if isinstance(recs, list) else [recs]
                    ts = recs[0]["ts"]
                    # An H100 node's eight compute ports, ACTIVE at 400 Gb/s: what the port checks want.
                    recs += [json.loads(encode(NicRecord(ts=ts, host=host, device=f"mlx5_{i}", port=1, state=4,
                                                         state_name="ACTIVE", rate_gbps=400.0,
                                                         counters={"port_xmit_wait": int(ts)})))
                             for i in range(8)]
                    value = json.dumps(recs).encode()
                msgs.append(Message("t", 0, off, key, value))
                off += 1
            out = pipe.handle_guarded(msgs)
            assert not [d for d in out.dead if d.reason not in ("late",)], out.dead[:3]
            got += out.alerts
        got += pipe.flush().alerts
        return sorted(_alerts(got)), pipe.totals.records

    plain, n_plain = run(False)
    ported, n_ported = run(True)
    assert plain and ported == plain
    assert n_ported == n_plain + 8 * sum(len(list(per_host_messages(b))) for b in batches)
