"""``torch-watchdog`` against layouts and inputs the first tests missed: PyTorch 2.4's log prefix,
text before the prefixes, names no record may carry, a subgroup's rank on its GPU, and stdin
that is not UTF-8.

Origins of the lines (whitespace and numbers as printed):

- ``PT241``: PyTorch 2.4.1 (conda build ``pytorch_1724789560443``; ``ProcessGroupNCCL.cpp:1664``
  and ``:1709``), a two-rank ALLREDUCE timeout quoted in a public troubleshooting note (repository
  not identified). 2.4's ``createLogPrefix`` is ``"[PG ", pg_name_, " (", pg_desc_, ") Rank ",
  rank_, "] "`` (``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``, mid-2024); 2.5 brought
  ``[PG ID .. PG GUID ..(desc) Rank ..]``. The rank's timeout line came right after a Python
  traceback's ``^^^^`` markers, without a newline between (two writers on one stderr).
- ``TQDM``: a 2.5 timeout after a tqdm bar (``Epoch 10/10: 240it [05:55, ...]``), from a public
  Lance training note (repository not identified).
- ``RAY_ACTOR``: NeMo-RL's Ray actor tag ``(MegatronPolicyWorker[rank=8] pid=3098870)`` before a
  2.5 dump-signal line, from a public log (repository not identified).
- ``SUBGROUP``: NVIDIA/nccl#1610, a log shipper's ``2025-02-18 12:54`` before ``[rank14]:`` and a
  tensor-parallel PG in which global rank 14 is ``Rank 0``.
"""

from __future__ import annotations

import io
import sys
import time

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.torch_watchdog import WatchdogLogSource, WatchdogStats, parse
from tests.fleet_factories import no_hang

PT241 = [
    "                      ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^[rank1]:[E1003 18:37:01.832146912 "
    "ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.",
    "[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either an "
    "error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: "
    "6462.",
    "[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: "
    "6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.",
    "[rank1]:[E1003 18:37:01.833637681 ProcessGroupNCCL.cpp:621] [Rank 1] Some NCCL operations have failed or timed "
    "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
    "data.",
    "  what():  [PG 0 (default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.",
]
TQDM = (
    "Epoch 10/10: 240it [05:55,  1.47s/it, loss=5.46][rank0]:[E709 17:05:38.162555850 ProcessGroupNCCL.cpp:632] "
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=20585, OpType=ALLREDUCE, "
    "NumelIn=1259621, NumelOut=1259621, Timeout(ms)=600000) ran for 600000 milliseconds before timing out."
)
RAY_ACTOR = (
    "(MegatronPolicyWorker[rank=8] pid=3098870) [rank8]:[E129 16:38:47.801786726 ProcessGroupNCCL.cpp:1858] "
    "[PG ID 0 PG GUID 0(default_pg) Rank 8] Received a dump signal due to a collective timeout from  rank 9 "
    "and we will try our best to dump the debug info. Last enqueued NCCL work: 62, last completed NCCL work: "
    "62.This is most likely caused by incorrect usages of collectives"
)
SUBGROUP = (
    " 2025-02-18 12:54 [rank14]:[E218 04:54:23.220620192 ProcessGroupNCCL.cpp:1844] [PG ID 12 PG GUID 120 "
    "Rank 0] Timeout at NCCL work: 151, last enqueued NCCL work: 152, last completed NCCL work: 150."
)
# PyTorch 2.5's status line (ProcessGroupNCCL.cpp, watchdogHandler: logPrefix(), " failure detected by
# watchdog at work sequence id: ", ...), as the first tests hold it.
PT25_STATUS = (
    "[rank1]:[E1218 20:27:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 1 Rank 1]  failure "
    "detected by watchdog at work sequence id: 1 PG status: last enqueued work: 547, last completed "
    "work: -1"
)

DEC_2025 = 1767139200.0  # 2025-12-31: the logs' year


def _parse(text: str, **kw):
    stats = WatchdogStats()
    recs = parse(io.StringIO(text), job="pretrain", host="node7", year=2025, default_ts=DEC_2025, stats=stats, **kw)
    return recs, stats


def _local(ts: float) -> tuple[int, ...]:
    return tuple(time.localtime(ts)[1:6])


def test_the_24_log_prefix_names_the_pg_and_a_line_without_the_rank_prefix_is_kept():
    # Before: "[PG 0 (default_pg) Rank 1]" matched no log prefix: the PG and its name were lost,
    # and a line without "[rank1]:" was dropped as naming no rank.
    recs, stats = _parse("\n".join(PT241))
    (r,) = recs
    assert (r.rank, r.comm, r.comm_name, r.seq, r.last_enqueued, r.last_completed) == (
        1,
        "0",
        "default_pg",
        6463,
        6463,
        6462,
    )
    recs, stats = _parse(PT241[2].removeprefix("[rank1]:"))
    assert [(r.rank, r.comm, r.comm_name, r.seq) for r in recs] == [(1, "0", "default_pg", 6463)]
    assert stats.summary()["dropped.no_rank"] == 0


@pytest.mark.parametrize(
    "line, rank, when",
    [
        (PT241[0], 1, (10, 3, 18, 37, 1)),  # a traceback's carets
        (TQDM, 0, (7, 9, 17, 5, 38)),  # a progress bar
        (RAY_ACTOR, 8, (1, 29, 16, 38, 47)),  # a Ray actor's tag with brackets
        (SUBGROUP, 0, (2, 18, 4, 54, 23)),  # a log shipper's time without a zone
        ("\x00" * 40 + PT25_STATUS, 1, (12, 18, 20, 27, 21)),  # NUL bytes of a torn write
    ],
)
def test_text_before_the_prefixes_keeps_the_lines_time(line, rank, when):
    # Before: the prefixes were read only at the line's start, so the line took the file's
    # time (counted as without one) though it printed its own.
    recs, stats = _parse(line)
    assert [r.rank for r in recs] == [rank]
    assert _local(recs[0].ts) == when and stats.no_timestamp == 0


def test_the_global_rank_places_a_subgroup_rank_on_its_gpu():
    # Before: the GPU was the PG's own rank modulo --gpus-per-node (rank 0 of PG 12: GPU 0),
    # not global rank 14's GPU 6.
    recs, _ = _parse(SUBGROUP, gpus_per_node=8)
    (r,) = recs
    assert (r.rank, r.comm, r.gpu, r.labels.get("global_rank")) == (0, "120", 6, "14")
    recs, _ = _parse(PT25_STATUS, gpus_per_node=8)
    assert recs[0].gpu == 1 and "global_rank" not in recs[0].labels  # the same rank: no label


@pytest.mark.parametrize(
    "line",
    [
        PT25_STATUS.replace("PG GUID 1 Rank", "PG GUID 1\x00x Rank"),  # a control character in the GUID
        PT25_STATUS.replace("PG GUID 1 Rank", "PG GUID " + "7" * 300 + " Rank"),  # past 256 characters
        PT25_STATUS.replace("PG GUID 1 Rank", "PG GUID 1(mesh\u202etp) Rank"),  # a bidi override in the name
        PT25_STATUS.replace("PG GUID 1 Rank", "PG GUID 1(" + "n" * 300 + ") Rank"),
        TQDM.replace("OpType=ALLREDUCE", "OpType=ALL\x07REDUCE"),
    ],
)
def test_a_name_no_record_may_carry_is_left_out_and_counted(line):
    # Before: the record kept it and the decoder dead-lettered the whole record (bad_identifier).
    recs, stats = _parse(line)
    assert len(recs) == 1 and stats.summary()["bad_name_cleared"] == 1
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
    assert len(out.records) == 1 and not out.dead


def test_stdin_that_is_not_utf8_is_read_with_replacement(monkeypatch, tmp_path):
    # Before: a strict stdin raised UnicodeDecodeError out of poll(), and the whole log was lost.
    raw = b"\xff\xfe\x80 garbage\n" + PT25_STATUS.encode() + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="strict"))
    src = WatchdogLogSource("-", job="j", host="h")
    recs = src.poll()
    assert [(r.rank, r.last_enqueued) for r in recs] == [(1, 547)]
    assert src.summary()["lines"] == 2


# PyTorch 2.7's heartbeat monitor on a rank whose own watchdog found the timeout (shouldDump_:
# "from this local rank"), a minute before that watchdog's exception line, from a public DDP log.
SELF_DUMP = (
    "[rank3]:[E606 09:09:08.172519935 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
    "Received a dump signal due to a collective timeout from this local rank and we will try our best to "
    "dump the debug info. Last enqueued NCCL work: 1, last completed NCCL work: -1.This is most likely "
    "caused by incorrect usages of collectives"
)
SELF_TIMEOUT = (
    "[rank3]:[E606 09:10:08.365403032 ProcessGroupNCCL.cpp:2197] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
    "Process group watchdog thread terminated with exception: [Rank 3] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLGATHER, NumelIn=1, NumelOut=4, Timeout(ms)=600000) "
    "ran for 600004 milliseconds before timing out."
)


def test_a_dump_signal_from_the_ranks_own_timeout_is_that_timeout_not_progress():
    # Before: a progress record beside the rank's timeout, as if a peer had asked it to dump.
    recs, _ = _parse(SELF_DUMP + "\n" + SELF_TIMEOUT + "\n")
    assert [(r.rank, r.state, r.seq, r.last_enqueued, r.op) for r in recs] == [(3, "timeout", 1, 1, "ALLGATHER")]
    assert _local(recs[0].ts) == (6, 6, 9, 9, 8)            # known at the dump signal, a minute before
    assert recs[0].labels["dump_from"] == "this local rank"


@pytest.mark.parametrize("tail", ["[PG 0 (", "[PG ID 0 PG GUID 0(", "[default", "[Rank "])
def test_a_line_of_open_prefixes_costs_linear_time(tail):
    # Before: each "[" of a 64 KiB line started an unbounded repeat of the log prefix's or the
    # embedded prefix's pattern: 2-4 s for one line (a few ms now).
    head = "[rank1]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] Watchdog caught collective operation timeout "
    line = (head + tail * (64_000 // len(tail)))[:64_000]
    with no_hang(1.5):
        recs, stats = _parse(line + "\n")
    assert recs == [] and stats.summary()["dropped.unparsable_line"] == 1
