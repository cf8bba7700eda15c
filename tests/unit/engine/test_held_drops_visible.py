"""Records a built-in stage holds until the watermark and lets go past its bound are counted where
an operator sees them: ``Engine.held_dropped`` by stage, the service's
``gpuwarden_held_dropped_records_total{stage}`` (once, across a restore) and replay's summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

import pipeline.engine.wrongresults as wrongresults
import pipeline.rules.ports as ports
from pipeline.bus.base import Message
from pipeline.bus.telemetry import per_host_messages
from pipeline.cli import main
from pipeline.detection import build_detector
from pipeline.engine import Engine
from pipeline.runner import Pipeline
from pipeline.schema import NcclRecord, NicRecord, encode
from tests.factories import Clock

T = 1764403200.0
RULES = str(Path(__file__).resolve().parents[3] / "rules")


@pytest.fixture
def small_holds(monkeypatch):
    """Holds of 3 records: the stages read their bound when built."""
    monkeypatch.setattr(wrongresults, "MAX_HELD", 3)
    monkeypatch.setattr(ports, "MAX_PENDING", 3)


def wrong(n: int, t: float = T, host: str = "n1") -> list[NcclRecord]:
    """``n`` nccl-tests records of one run at ``t``, each reporting wrong results."""
    return [
        NcclRecord(
            ts=t,
            host=host,
            comm=f"nccl-tests:{host}:1:run1",
            rank=0,
            nranks=8,
            coll="AllReduce",
            bytes=2**i,
            exec_time_us=90.0,
            labels={"wrong_results": "true", "wrong": "1"},
        )
        for i in range(n)
    ]


def port_records(n: int, t: float = T, host: str = "n1") -> list[NicRecord]:
    return [
        NicRecord(ts=t, host=host, device=f"mlx5_{i}", port=1, state=4, state_name="ACTIVE", rate_gbps=400.0)
        for i in range(n)
    ]


def messages(records, start: int = 0) -> list[Message]:
    return [Message("t", 0, start + i, k, v) for i, (k, v) in enumerate(per_host_messages(records))]


def test_each_holding_stage_reports_what_it_let_go(small_holds):
    st = wrongresults.WrongResults()
    st.nccl_arrived(wrong(5))
    assert st.dropped == 2
    det, diags = build_detector([RULES], "auto")
    assert det is not None, diags
    det.process([*wrong(5), *port_records(4)])  # nothing released: the watermark is behind them
    assert det.held_dropped == {"ports": 1, "nic_aer": 0, "nccl_results": 2}
    assert Engine(row_checks=[], tick_checks=[]).held_dropped == {}  # no stage holds records


def test_the_drops_are_taken_once_and_a_restored_count_is_not_taken_again(small_holds):
    pipe = Pipeline(Engine())
    pipe.handle(messages(wrong(5)))
    assert pipe.take_held_drops() == {"nccl_results": 2}
    assert pipe.take_held_drops() == {"nccl_results": 0}
    again = Pipeline(Engine())
    again.restore(pipe.snapshot())
    assert again.engine.held_dropped == {"nccl_results": 2}  # the snapshot keeps the stage's count
    assert again.take_held_drops() == {"nccl_results": 0}  # dropped by the process before
    again.handle(messages(wrong(2, T + 1), 1))
    assert again.take_held_drops() == {"nccl_results": 2}


def test_the_service_counts_held_drops_by_stage_on_metrics(small_holds):
    from tests.unit.service.service_factories import services

    clock = Clock()
    _, host, _ = services(list(per_host_messages([*wrong(5), *port_records(4)])), clock)
    for _ in range(5):
        host.step()
        clock.t += 0.5
    text = generate_latest(host.metrics.registry).decode()
    assert 'gpuwarden_held_dropped_records_total{stage="nccl_results"} 2.0' in text
    assert 'gpuwarden_held_dropped_records_total{stage="ports"} 1.0' in text
    assert 'gpuwarden_held_dropped_records_total{stage="nic_aer"} 0.0' in text


def test_replay_names_the_drops_by_stage_in_its_summary(small_holds, tmp_path, capsys):
    rec = tmp_path / "burn_in.jsonl"
    rec.write_bytes(b"\n".join(encode(r) for r in wrong(5)) + b"\n")
    assert main(["replay", str(rec), "--rules", RULES]) == 0
    err = capsys.readouterr().err
    assert "records dropped waiting for the watermark (hold full), by stage: nccl_results: 2" in err


def test_replay_says_nothing_of_drops_when_none_went(tmp_path, capsys):
    rec = tmp_path / "burn_in.jsonl"
    rec.write_bytes(b"\n".join(encode(r) for r in wrong(5)) + b"\n")
    assert main(["replay", str(rec), "--rules", RULES]) == 0
    assert "dropped waiting for the watermark" not in capsys.readouterr().err
