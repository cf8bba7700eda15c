"""NCCL's InfiniBand completion errors as the port checks see them (#34, ``completion_errors``):
a training log's NIC record (``gpuwarden produce torch-watchdog``) that counts them raises a
warning naming host, HCA and peer, and speaks of nothing else: the port's state, its lost-port
and active-port checks are judged by its polls alone."""

from __future__ import annotations

import pytest

from pipeline.schema import NicRecord
from tests.factories import T0
from tests.unit.rules.factories import port_series, run_ports


def _log_record(t, n, host="n1", device="mlx5_0", port=1, **labels):
    base = {"source": "nccl_log", "peer": "10.0.35.1<49189>", "status": "12", "status_name": "IBV_WC_RETRY_EXC_ERR",
            "vendor_err": "129", "direction": "Send", "rank": "3"}  # fmt: skip
    base.update(labels)
    return NicRecord(ts=T0 + t, host=host, device=device, port=port,
                     counters={"nccl_ib_completion_errors": n}, labels=base)  # fmt: skip


def test_a_completion_error_names_host_hca_and_peer():
    recs = port_series(1800, gpus=[0, 1]) + [_log_record(605.5, 1), _log_record(606.5, 3)]
    alerts, _ = run_ports(recs)
    assert [(a.rule, a.state, a.ts - T0) for a in alerts] == [
        ("network_ib_completion_errors", "firing", 605.5), ("network_ib_completion_errors", "resolved", 1206.5)]
    a = alerts[0]
    assert (a.severity, a.host, a.labels["device"], a.labels["nccl_peer"], a.labels["gpus"]) == (
        "warning", "n1", "mlx5_0", "10.0.35.1<49189>", "0,1")
    assert a.evidence["nccl_errors"] == {"nccl_ib_completion_errors": 1} and a.evidence["status"] == "12"
    assert "completion error(s) (IBV_WC_RETRY_EXC_ERR, vendor err 129, Send) from peer 10.0.35.1<49189>" in a.summary


def test_a_new_log_counting_from_one_again_fires_again():
    # The port's polls (ib-sysfs) between the two jobs let the first alert resolve.
    recs = port_series(2400) + [_log_record(100, 1), _log_record(101, 2), _log_record(2000, 1, peer="10.0.0.9<1>")]
    alerts, _ = run_ports(recs)
    fire = [a for a in alerts if a.state == "firing"]
    assert [(a.ts - T0, a.labels["nccl_peer"]) for a in fire] == [(100.0, "10.0.35.1<49189>"), (2000.0, "10.0.0.9<1>")]


def test_a_fatal_async_event_is_counted_too():
    rec = NicRecord(ts=T0 + 50, host="n1", device="mlx5_1", port=1, counters={"nccl_ib_async_fatal_events": 1},
                    labels={"source": "nccl_log", "event": "local catastrophic error"})  # fmt: skip
    (a,) = [a for a in run_ports([rec])[0] if a.state == "firing"]
    assert a.labels["device"] == "mlx5_1" and "fatal async event(s) (local catastrophic error)" in a.summary


def test_a_log_record_does_not_touch_the_ports_state_checks():
    # The port is DOWN from 300 s; a log record at 400 s (no state) must not resolve port_down,
    # make the port "polled", nor count as a poll of one port for active_ports.
    recs = port_series(1200, states=lambda t: (1, 3) if t >= 300 else (4, 5)) + [_log_record(400.0, 1)]
    alerts, _ = run_ports(recs)
    down = [(a.state, a.ts - T0) for a in alerts if a.rule == "network_port_down"]
    assert down == [("firing", 300.0)]
    # A log record for an HCA the polls never name is no lost port either.
    recs = port_series(1200) + [_log_record(400.0, 1, device="mlx5_9")]
    assert {a.rule for a in run_ports(recs)[0]} == {"network_ib_completion_errors"}


def _stage():
    from pathlib import Path

    from pipeline.rules.portconfig import load_port_config
    from pipeline.rules.ports import PortStage

    cfg, _ = load_port_config(Path(__file__).resolve().parents[3] / "rules" / "fabric" / "ports.yaml")
    return PortStage(cfg)


@pytest.mark.parametrize("releases", [[], [150], [350, 701, 1001], [50, 100.5, 400.5, 699, 700.5, 2499, 2501, 3099]])
def test_a_log_only_error_resolves_once_keep_firing_for_runs_out(releases):
    # No ib-sysfs on the host: nothing follows the log's records, yet the alert resolves 10
    # minutes after the last error, at the same time whatever the watermark's steps; a later
    # error on the same HCA fires again.
    stage = _stage()
    stage.nic_arrived([_log_record(100, 1), _log_record(400, 2), _log_record(2500, 3, peer="10.0.0.9<1>"),
                       _log_record(100, 1, device="mlx5_3")])  # fmt: skip
    alerts = [a for upto in releases + [float("inf")] for a in stage.nic_release(T0 + upto)]
    got = [(a.state, a.labels["device"], a.ts - T0) for a in alerts]
    assert sorted(got, key=lambda x: x[2]) == [
        ("firing", "mlx5_0", 100.0), ("firing", "mlx5_3", 100.0), ("resolved", "mlx5_3", 700.0),
        ("resolved", "mlx5_0", 1000.0), ("firing", "mlx5_0", 2500.0), ("resolved", "mlx5_0", 3100.0)]
    resolved = [a for a in alerts if a.state == "resolved" and a.labels["device"] == "mlx5_0"]
    assert "completion error(s)" in resolved[0].summary  # the firing event's summary, kept


def test_an_error_expiry_waits_for_the_watermark_and_survives_a_restore():
    stage = _stage()
    stage.nic_arrived([_log_record(100, 1)])
    assert [a.state for a in stage.nic_release(T0 + 200)] == ["firing"]
    assert stage.nic_release(T0 + 700) == []  # the deadline (700 s) not passed yet
    again = _stage()
    again.load_state(stage.to_state())
    assert [(a.state, a.ts - T0) for a in again.nic_release(T0 + 701)] == [("resolved", 700.0)]
    assert again.nic_release(T0 + 2000) == []
