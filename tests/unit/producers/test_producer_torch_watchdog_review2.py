"""``torch-watchdog``, a second review: the host of a Ray worker on another node, the prefixes a
launcher or log shipper puts before torchrun's and c10's (``srun --label``'s ``0: ``, ``kubectl logs
--timestamps``' RFC 3339 time), and PG descriptions that hold parentheses or brackets.

Layouts: Ray's tag is ``"({name} pid={pid}[, ip={ip}])"``, the ip only for a worker on another node
than the driver's (ray-project/ray ``python/ray/_private/worker.py``, ``print_worker_logs``);
torchrun's ``--tee`` prefix is ``[{role}{local_rank}]:``; c10's header without glog is
``[E{month*100+day} HH:MM:SS.{ns} file:line]`` (``c10/util/Logging.cpp``), glog's own
``E1203 12:00:00.123456 1234 file:line]``; the log prefix since 2.5 is ``[PG ID {id} PG GUID
{guid}({pg_desc}) Rank {rank}]`` (``ProcessGroupNCCL::createLogPrefix``), ``pg_desc`` being what
the job passed as ``group_desc``. The numbers are made up. Each test failed before its fix.
"""

from __future__ import annotations

import io
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.torch_watchdog import WatchdogStats, parse

DEC_2025 = 1767139200.0  # 2025-12-31: the logs' year
TIMEOUT = (
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=1800000) ran for {} milliseconds before timing out."
)
STATUS = "Timeout at NCCL work: 6463, last enqueued NCCL work: {}, last completed NCCL work: {}."


def _parse(text: str, **kw):
    stats = WatchdogStats()
    recs = parse(io.StringIO(text), job="pretrain", year=2025, default_ts=DEC_2025, stats=stats, **kw)
    return recs, stats


def _ray(tag: str, glob: int, enq: int, done: int) -> str:
    return (
        f"{tag} [rank{glob}]:[E1203 18:37:01.833625119 ProcessGroupNCCL.cpp:1709] [PG ID 0 PG GUID "
        f"0(default_pg) Rank {glob}] " + STATUS.format(enq, done)
    )


def test_a_ray_worker_on_another_node_is_on_the_host_its_tag_names(monkeypatch):
    # Rank 0's worker ran on 10.0.0.5 (Ray printed its ip), rank 1's on the driver's node (no ip).
    # Before: every record was on the driver's host, so the hang was blamed on the wrong node.
    monkeypatch.setattr(socket, "gethostname", lambda: "driver-node")
    far = "(RayTrainWorker pid=3490362, ip=" + "a" * 254 + ")"  # not a host name: the driver's stays
    log = "\n".join([_ray("(RayTrainWorker pid=3490362, ip=10.0.0.5)", 0, 6463, 6462),
                     _ray("(RayTrainWorker pid=3490363)", 1, 6464, 6463), _ray(far, 2, 6464, 6463)])  # fmt: skip
    recs, _ = _parse(log)
    assert {r.rank: r.host for r in recs} == {0: "10.0.0.5", 1: "driver-node", 2: "driver-node"}
    assert recs[0].labels["ray_ip"] == "10.0.0.5"
    # --host still says where every record is
    recs, _ = _parse(log, host="node7")
    assert {r.host for r in recs} == {"node7"}


@pytest.mark.parametrize("before", ["0: ", "  12: ", "2025-12-03T18:37:01.833625119Z ", "\x1b[0m"])
def test_torchruns_local_rank_is_read_after_a_launchers_prefix(before):
    # Two processes of one node, each Rank 0 of its tensor-parallel group, time out at their groups'
    # seq 6463 (PyTorch 2.1: no [rankN]:, no time); each repeats it in its exception. Before: after
    # srun --label's "0: " or kubectl's time, "[default4]:" was not read: the lines named no
    # process, the four became one record, and local rank 4's timeout (ran 1800085) was lost.
    def line(local: int, ran: int, exc: bool) -> str:
        head = "RuntimeError: " if exc else "[E ProcessGroupNCCL.cpp:475] "
        return f"{before}[default{local}]:{head}[Rank 0] " + TIMEOUT.format(ran)

    log = [line(0, 1800017, False), line(4, 1800085, False), line(0, 1800017, True), line(4, 1800085, True)]
    recs, stats = _parse("\n".join(log), host="node7")
    got = {r.labels.get("local_rank"): (r.rank, r.gpu, r.seq, r.ran_ms) for r in recs}
    assert got == {"0": (0, 0, 6463, 1800017), "4": (0, 4, 6463, 1800085)}
    assert stats.records == 2


def test_glogs_own_header_after_srun_label_gives_the_time():
    # Before: the time was not read (the file's was used), so the report lost when it happened.
    line = "3: E1203 18:37:01.833625 41234 ProcessGroupNCCL.cpp:1709] [Rank 3] " + STATUS.format(6463, 6462)
    recs, stats = _parse(line, host="node7")
    assert [(r.rank, r.seq, r.last_completed) for r in recs] == [(3, 6463, 6462)]
    assert recs[0].ts == time.mktime((2025, 12, 3, 18, 37, 1, 0, 0, -1))
    assert stats.no_timestamp == 0


@pytest.mark.parametrize("desc", ["tp (layer 0)", "tp[0]", "mesh(dp, tp)[1]", "a)"])
def test_a_pg_description_with_parentheses_or_brackets_keeps_its_pg_and_rank(desc):
    # Before: the log prefix did not match, so the line was taken for global rank 3 (its [rank3]:)
    # on no PG: PG 5's rank 1 and its seq went to the default PG's rank 3.
    line = (
        f"[rank3]:[E1203 18:37:01.833625119 ProcessGroupNCCL.cpp:1709] [PG ID 1 PG GUID 5({desc}) Rank 1] "
        + STATUS.format(6463, 6462)
    )
    recs, _ = _parse(line, host="node7", gpus_per_node=8)
    got = [(r.rank, r.comm, r.comm_name, r.labels.get("global_rank"), r.gpu) for r in recs]
    assert got == [(1, "5", desc, "3", 3)]


@settings(max_examples=50, deadline=None)
@given(desc=st.text(alphabet="ab_ ()[],:0", min_size=1, max_size=40), pg24=st.booleans())
def test_any_pg_description_is_read_whole(desc, pg24):
    # 2.4's "[PG 5 (desc) Rank 1]" and 2.5's "[PG ID 1 PG GUID 5(desc) Rank 1]": whatever the job
    # named its group, the PG, its name and the PG rank come out as printed.
    pfx = f"[PG 5 ({desc}) Rank 1]" if pg24 else f"[PG ID 1 PG GUID 5({desc}) Rank 1]"
    line = f"[rank3]:[E1203 18:37:01.833625119 ProcessGroupNCCL.cpp:1709] {pfx} " + STATUS.format(6463, 6462)
    recs, _ = _parse(line, host="node7")
    assert [(r.rank, r.comm, r.comm_name) for r in recs] == [(1, "5", desc)]


def test_colors_around_the_whole_line_leave_its_last_number_readable():
    # A wrapper colored the rank's stderr red; 2.4's PG status ends with its number, no period.
    # Before: "4\x1b[0m" was not a number and the line was dropped (dropped.bad_number).
    line = (
        "\x1b[1;31m[rank3]:[E1203 18:37:01.833625119 ProcessGroupNCCL.cpp:1709] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 3] failure detected by watchdog at work sequence id: 6463 PG status: last enqueued work: 6463, "
        "last completed work: 6462\x1b[0m"
    )
    recs, stats = _parse(line, host="node7")
    assert [(r.rank, r.comm, r.seq, r.last_enqueued, r.last_completed) for r in recs] == [(3, "0", 6463, 6463, 6462)]
    assert stats.bad_number == 0
