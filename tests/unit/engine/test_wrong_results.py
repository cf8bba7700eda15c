"""nccl-tests wrong results (silent data corruption) become a ``nccl_wrong_results`` alert: from
the producer's records through the engine and both stages of the topology, the same whatever the
batching, across a snapshot, and on hostile labels (pipeline/engine/wrongresults.py)."""

from __future__ import annotations

import json

import msgspec
import pytest

from pipeline.cli import main
from pipeline.detection import build_detector, shipped_faults
from pipeline.engine import Engine
from pipeline.engine.wrongresults import KEEP_FIRING_FOR, WrongResults
from pipeline.errors import StateError
from pipeline.schema import NcclRecord
from producers.nccl_tests import parse_text
from tests.factories import fleet, nccl_tests_log, run_batched

T = 1764403200.0
RULES = "rules"


def burn_in(t: float, host: str = "n1", **kw) -> list[NcclRecord]:
    return parse_text(nccl_tests_log(host, **kw), ts=t)


def rows(alerts) -> list[tuple]:
    return [(a.state, a.fault, a.host, a.ts, a.started_at) for a in alerts if a.fault == "nccl_wrong_results"]


def test_a_burn_in_with_wrong_results_fires_once_per_host_and_resolves_an_hour_after():
    eng = Engine()
    recs = fleet(range(0, 7300, 10), hosts=2, gpus=1) + burn_in(T + 100, wrong=3) + burn_in(T + 200, "n2")
    recs.sort(key=lambda r: r.ts)
    out = run_batched(recs, 500, eng)
    got = rows(out.alerts)
    assert got == [
        ("firing", "nccl_wrong_results", "n1", T + 100, T + 100),
        ("resolved", "nccl_wrong_results", "n1", T + 100 + KEEP_FIRING_FOR, T + 100),
    ]
    fired = next(a for a in out.alerts if a.fault == "nccl_wrong_results")
    assert fired.severity == "critical" and fired.gpu is None
    assert fired.evidence["wrong_elements"] == 6 and fired.evidence["wrong_sizes"] == [1024, 1048576]
    assert "wrong results" in fired.summary and "n1" in fired.summary and "take the node out" in fired.summary
    resolved = [a for a in out.alerts if a.fault == "nccl_wrong_results" and a.state == "resolved"][0]
    assert resolved.id == fired.id and resolved.summary == fired.summary


def test_out_of_bounds_alone_is_wrong_results_and_a_multi_node_run_says_so():
    recs = burn_in(T + 5, oob=6, nodes=2)
    assert all(r.labels.get("out_of_bounds") == "6" for r in recs)
    out = run_batched(fleet(range(0, 60, 10), hosts=1, gpus=1) + recs, 1000, Engine())
    (fired,) = [a for a in out.alerts if a.fault == "nccl_wrong_results"]
    assert fired.evidence["out_of_bounds"] == 6 and fired.labels["nnodes"] == "2"
    assert "2-node run logged on n1 (n1, n1-peer1)" in fired.summary
    assert fired.evidence["run_hosts"] == ["n1", "n1-peer1"]


def test_wrong_records_while_firing_keep_it_firing():
    # The burn-in's host sends its GPUs' telemetry too: its clock is the fleet's.
    recs = fleet(range(0, 9000, 30), hosts=1, gpus=1) + burn_in(T + 100, "n0", wrong=1) + burn_in(T + 3000, "n0", wrong=1)
    recs.sort(key=lambda r: r.ts)
    got = rows(run_batched(recs, 20, Engine()).alerts)
    assert got == [
        ("firing", "nccl_wrong_results", "n0", T + 100, T + 100),
        ("resolved", "nccl_wrong_results", "n0", T + 3000 + KEEP_FIRING_FOR, T + 100),
    ]


@pytest.mark.parametrize("batch", [1, 7, 64, 100_000])
def test_the_alerts_do_not_depend_on_the_batching(batch):
    recs = fleet(range(0, 4000, 10), hosts=3, gpus=1) + burn_in(T + 50, "n2", wrong=2) + burn_in(T + 60, "n1")
    recs.sort(key=lambda r: r.ts)
    assert rows(run_batched(recs, batch, Engine()).alerts) == rows(run_batched(recs, 10_000, Engine()).alerts) != []


def test_both_stages_raise_it_once():
    det, diags = build_detector([RULES])
    assert det is not None, diags
    recs = fleet(range(0, 120, 10), hosts=2, gpus=2) + burn_in(T + 30, wrong=4)
    recs.sort(key=lambda r: r.ts)
    out = det.process(recs)
    out.extend(det.flush())
    assert rows(out.alerts) == [("firing", "nccl_wrong_results", "n1", T + 30, T + 30)]
    assert "nccl_wrong_results" in shipped_faults()


def test_a_snapshot_keeps_the_held_records_and_the_firing_alert():
    first, second = Engine(), Engine()
    recs = fleet(range(0, 3800, 20), hosts=1, gpus=1) + burn_in(T + 100, wrong=1)
    recs.sort(key=lambda r: r.ts)
    out = first.process([r for r in recs if r.ts < T + 120])  # the wrong records are still held
    assert rows(out.alerts) == []
    second.restore(first.snapshot())
    later = second.process([r for r in recs if r.ts >= T + 120])
    later.extend(second.flush())
    got = rows(later.alerts)
    assert got == [
        ("firing", "nccl_wrong_results", "n1", T + 100, T + 100),
        ("resolved", "nccl_wrong_results", "n1", T + 100 + KEEP_FIRING_FOR, T + 100),
    ]
    ids = {a.id for a in later.alerts if a.fault == "nccl_wrong_results"}
    assert len(ids) == 1


def test_a_bad_state_is_a_state_error():
    st = WrongResults()
    for bad in (b"\x00garbage", msgspec.msgpack.encode({"version": 9, "held": [], "firing": {}})):
        with pytest.raises(StateError):
            st.load_state(bad)
    st.load_state(None)  # a snapshot from before the stage: nothing to take back
    assert st.firing == {} and len(st._hold) == 0


@pytest.mark.parametrize("wrong", ["nan", "-5", "1e400", "²", "", "0x10"])
def test_hostile_counts_still_alert_and_never_raise(wrong):
    st = WrongResults()
    r = NcclRecord(ts=T, host="n1", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=8, exec_time_us=1.0,
                   labels={"wrong_results": "true", "wrong": wrong, "out_of_bounds": wrong})
    (fired,) = _release(st, [r])
    assert fired.state == "firing" and fired.evidence["wrong_elements"] >= 0
    json.dumps(fired.evidence, allow_nan=False)  # an alert's evidence is JSON all the same


def _release(st: WrongResults, recs: list[NcclRecord]):
    st.nccl_arrived(recs)
    return st.nccl_release(max(r.ts for r in recs) + 1)


def test_replay_of_a_burn_in_log_alerts(tmp_path, capsys):
    log = tmp_path / "all_reduce.log"
    log.write_text(nccl_tests_log(wrong=2))
    rec = tmp_path / "burn_in.jsonl"
    assert main(["produce", "nccl-tests", str(log), "--out", str(rec)]) == 3
    alerts = tmp_path / "alerts.jsonl"
    assert main(["replay", str(rec), "--rules", RULES, "--alerts-out", str(alerts)]) == 0
    events = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [(e["state"], e["fault"], e["host"]) for e in events] == [("firing", "nccl_wrong_results", "n1")]


@pytest.mark.parametrize("nnodes,receiver", [("1", "drain-node"), ("2", "page")])
def test_the_shipped_routes_drain_a_one_node_burn_in_and_page_for_a_wider_run(nnodes, receiver, capsys):
    # A run across nodes is logged on one of them: draining that one may take out the wrong node.
    args = ["routes", "test", "fault=nccl_wrong_results", "severity=critical", "host=gpu-node-007",
            f"nnodes={nnodes}", "--config", f"{RULES}/routes.yaml", "--expect", receiver]
    assert main(args) == 0, capsys.readouterr().err


def test_a_log_without_rank_lines_does_not_blame_one_node():
    recs = burn_in(T + 5, wrong=1)
    for r in recs:
        r.nnodes = None  # nccl-tests printed no "Using devices" ranks: the nodes are unknown
    (fired,) = _release(WrongResults(), recs)
    assert "names none of its nodes" in fired.summary and "nnodes" not in fired.labels


def test_the_incident_of_a_wrong_result_recommends_drain_and_inspect():
    from pipeline.incidents.config import load_config

    cfg, diags = load_config(f"{RULES}/incidents.yaml")
    assert cfg is not None, diags
    assert cfg.action_for("builtin_nccl_wrong_results", "critical") == "drain_and_inspect"
    # A run across nodes is logged on one of them, which may be healthy: nothing is done to it.
    assert cfg.action_for("builtin_nccl_wrong_results_nodes", "critical") == "watch"
    (multi,) = _release(WrongResults(), burn_in(T, wrong=1, nodes=2))
    (one,) = _release(WrongResults(), burn_in(T, wrong=1))
    assert (multi.rule, one.rule) == ("builtin_nccl_wrong_results_nodes", "builtin_nccl_wrong_results")


def test_a_record_out_of_order_never_moves_the_deadline_back():
    st = WrongResults()
    st.nccl_arrived(burn_in(T + 1000, wrong=1))
    assert [a.state for a in st.nccl_release(T + 1001)] == ["firing"]
    st.nccl_arrived(burn_in(T + 500, wrong=1))
    assert st.nccl_release(T + 500 + KEEP_FIRING_FOR + 10) == []
    assert [(a.state, a.ts) for a in st.nccl_release(T + 1000 + KEEP_FIRING_FOR + 1)] == [
        ("resolved", T + 1000 + KEEP_FIRING_FOR)
    ]


def test_the_alerts_come_out_in_event_time_whatever_the_batching():
    # One release spanning the stream put the burn-in's alert (held until the watermark) after
    # every tick's alert; the incident stage reads them in order.
    silent = fleet(range(0, 400, 10), hosts=2, gpus=1, overrides=lambda t, h, g: None if h == "n1" and t > 200 else {})
    recs = sorted(silent + burn_in(T + 100, "n0", wrong=1), key=lambda r: r.ts)
    orders = [[(a.state, a.fault, a.host, a.ts) for a in run_batched(recs, b, Engine()).alerts] for b in (1, 100_000)]
    assert orders[0] == orders[1]
    assert [f for _, f, _, _ in orders[0]] == ["nccl_wrong_results", "telemetry_gap"]
