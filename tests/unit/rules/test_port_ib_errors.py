"""NCCL's InfiniBand completion errors as the port checks see them (#34, ``completion_errors``):
a training log's NIC record (``gpuwarden produce torch-watchdog``) that counts them raises a
warning naming host, HCA and peer, and speaks of nothing else: the port's state, its lost-port
and active-port checks are judged by its polls alone."""

from __future__ import annotations

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
        ("network_ib_completion_errors", "firing", 605.5), ("network_ib_completion_errors", "resolved", 1210.0)]
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


def test_a_training_logs_lines_through_the_producer_raise_the_alert():
    # NVIDIA/nccl#1905's lines (NCCL 2.23+ layout, the HCA named), read by the torch-watchdog producer.
    import time

    from producers.nccl_ib import IbLog

    lines = [
        "[2025-11-09 07:39:30] h100-28:238:1219 [0] transport/net_ib.cc:180 NCCL WARN NET/IB : mlx5_ib0:1 async fatal "
        "event on QP (0x7f69f01519a8): local access violation work queue error",
        "[2025-11-09 07:39:30] h100-28:238:1313 [0] transport/net_ib.cc:2451 NCCL WARN NET/IB: Got completion from peer "
        "172.16.12.34<38081> with status=4 opcode=0 len=0 vendor err 83 (Send) hca mlx5_ib0",
    ]
    log = IbLog(host=None, default_ts=0.0)
    for line in lines:
        log.feed(line)
    when = time.mktime(time.strptime("2025-11-09 07:39:30", "%Y-%m-%d %H:%M:%S"))
    polls = port_series(1200, host="h100-28", device="mlx5_ib0")
    for r in polls:
        r.ts = r.ts - T0 + when - 600
    alerts, _ = run_ports(polls + log.records())
    (a,) = [a for a in alerts if a.state == "firing"]
    assert (a.rule, a.host, a.labels["device"], a.labels["nccl_peer"]) == (
        "network_ib_completion_errors", "h100-28", "mlx5_ib0", "172.16.12.34<38081>")
    assert a.summary == (
        "mlx5_ib0 port 1 on h100-28 got 1 InfiniBand completion error(s) (IBV_WC_LOC_PROT_ERR, vendor err 83, Send) "
        "from peer 172.16.12.34<38081> and 1 fatal async event(s) (local access violation work queue error) in NCCL")
