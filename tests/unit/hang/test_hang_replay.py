"""From training logs to the alert: ``gpuwarden produce torch-watchdog`` on two nodes' logs, then
``gpuwarden replay`` of what it wrote, names the one rank behind; ``produce ncclras`` of a stuck
RAS mismatch queried twice does the same. Records come back through the decoder here, as in
production (its checked types are subclasses of the schema's)."""

from __future__ import annotations

import json
import os

from pipeline.cli import main

T_LOG = 1764403200.0  # the logs' modification time: their untimed lines' time

LINE = ("[rank{r}]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank {r}] Timeout at NCCL work: 547, last enqueued NCCL "
        "work: 547, last completed NCCL work: {done}.")
RAS = """Warnings
========

#0-0 (27a079b828ff1a75) MISMATCH
  Communicator ranks have different collective operation counts
  30 ranks have launched up to operation 6650
  2 ranks have launched up to operation 6649
  Rank 9 -- GPU 1 managed by process 483072 on node 172.16.64.211
  Rank 10 -- GPU 2 managed by process 483074 on node 172.16.64.211
"""


def _alerts(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_watchdog_logs_of_two_nodes_replay_into_one_alert_naming_the_rank_behind(tmp_path, capsys):
    outs = []
    for node in range(2):
        log = tmp_path / f"node{node}.log"
        # A log as the job wrote it, its last line ended (one without its newline is cut).
        log.write_text("".join(LINE.format(r=r, done=500 if r == 6 else 546) + "\n" for r in range(node * 4, node * 4 + 4)))
        os.utime(log, (T_LOG + node, T_LOG + node))
        out = tmp_path / f"p{node}.jsonl"
        assert main(["produce", "torch-watchdog", "--file", str(log), "--job", "4242", "--host", f"node{node}",
                     "--gpus-per-node", "4", "--out", str(out)]) == 0  # fmt: skip
        outs.append(out)
    both = tmp_path / "progress.jsonl"
    both.write_text("".join(p.read_text() for p in outs))
    alerts = tmp_path / "alerts.jsonl"
    assert main(["replay", str(both), "--alerts-out", str(alerts), "-q"]) == 0
    (a,) = _alerts(alerts)
    assert (a["state"], a["rule"], a["fault"], a["host"], a["gpu"], a["job"]) == (
        "firing", "hang_collective", "hang_collective", "node1", 2, "4242")
    assert [s["rank"] for s in a["evidence"]["suspects"]] == [6]
    assert "rank 6 on node1 GPU 2 (last completed 500, peers 546)" in a["summary"]


def test_a_ras_mismatch_that_does_not_move_across_queries_replays_into_an_alert(tmp_path):
    outs = []
    for i, t in enumerate((T_LOG, T_LOG + 180)):
        f = tmp_path / f"ras{i}.txt"
        f.write_text(RAS)
        os.utime(f, (t, t))
        out = tmp_path / f"r{i}.jsonl"
        assert main(["produce", "ncclras", "--file", str(f), "--job", "4242", "--out", str(out)]) == 0
        outs.append(out)
    both = tmp_path / "progress.jsonl"
    both.write_text("".join(p.read_text() for p in outs))
    alerts = tmp_path / "alerts.jsonl"
    assert main(["replay", str(both), "--alerts-out", str(alerts), "-q"]) == 0
    (a,) = _alerts(alerts)
    assert (a["rule"], a["host"], a["gpu"]) == ("hang_collective", "172.16.64.211", 1)
    assert [s["rank"] for s in a["evidence"]["suspects"]] == [9, 10]
    assert a["started_at"] == T_LOG + 180 and a["ts"] == T_LOG + 210


def test_one_ras_query_alone_is_no_alert(tmp_path):
    f = tmp_path / "ras.txt"
    f.write_text(RAS)
    out, alerts = tmp_path / "r.jsonl", tmp_path / "alerts.jsonl"
    assert main(["produce", "ncclras", "--file", str(f), "--out", str(out)]) == 0
    assert main(["replay", str(out), "--alerts-out", str(alerts), "-q"]) == 0
    assert _alerts(alerts) == []
