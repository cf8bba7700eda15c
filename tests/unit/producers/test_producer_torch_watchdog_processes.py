"""``torch-watchdog`` on logs that hold several processes: a job's combined log, or torchrun's
``--tee`` output of the ranks on one host. Ranks of different subgroups hold the same PG rank
(``Rank 0`` of every tensor-parallel group) and count their own sequence numbers, so two
processes can report the same PG rank and seq; each process's report stays its own.

The lines follow PyTorch's layouts as the first tests hold them (``ProcessGroupNCCL.cpp``:
``WorkNCCL::checkTimeout``'s ``[Rank N] Watchdog caught ...``, whose ``[Rank N]`` is the PG's
rank; ``createLogPrefix``'s ``[PG 1 (mesh_tp) Rank 0]`` in 2.4 and ``[PG ID 1 PG GUID 1(mesh_tp)
Rank 0]`` since 2.5; the ``what():`` repeat that std::terminate prints without the ``[rankN]:``
prefix), arranged as ``init_device_mesh`` would make them (tensor-parallel groups of two, named
``mesh_tp``, one PG per group); the numbers are made up.
"""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as hs

from producers.torch_watchdog import WatchdogStats, parse
from tests.factories import fuzz_examples

DEC_2025 = 1767139200.0  # 2025-12-31: the logs' year


def _parse(text: str, **kw):
    stats = WatchdogStats()
    recs = parse(io.StringIO(text), job="pretrain", host="node7", year=2025, default_ts=DEC_2025, stats=stats, **kw)
    return recs, stats


def _timeout(local: int, glob: int, ran: int) -> str:
    """PyTorch 2.4's timeout line of global rank ``glob``, ``Rank 0`` of its TP group, at seq 6463."""
    return (
        f"[default{local}]:[rank{glob}]:[E1003 18:37:01.83214{glob}912 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        f"Timeout(ms)=1800000) ran for {ran} milliseconds before timing out."
    )


def _status(local: int, glob: int, pg: int, enq: int, done: int) -> str:
    """PyTorch 2.4's ``Timeout at NCCL work`` line of the same rank and work."""
    return (
        f"[default{local}]:[rank{glob}]:[E1003 18:37:01.83362{glob}509 ProcessGroupNCCL.cpp:1709] [PG {pg} (mesh_tp) "
        f"Rank 0] Timeout at NCCL work: 6463, last enqueued NCCL work: {enq}, last completed NCCL work: {done}."
    )


def _what(local: int, pg: int) -> str:
    """std::terminate's repeat of the exception: torchrun's prefix, no ``[rankN]:``."""
    return (
        f"[default{local}]:  what():  [PG {pg} (mesh_tp) Rank 0] Process group watchdog thread terminated with "
        "exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out."
    )


def _summary(recs):
    """Each record by its process: torchrun's local rank (global rank 0 gets no global_rank label)."""
    return {r.labels["local_rank"]: (r.rank, r.comm, r.seq, r.ran_ms, r.last_enqueued, r.last_completed) for r in recs}


def test_two_ranks_whose_subgroups_share_a_pg_rank_and_seq_stay_apart():
    # Global ranks 0 and 2 are each Rank 0 of their TP group (PGs 1 and 2) and both time out at
    # their groups' seq 6463. Before: one record (global rank 0's), rank 2's timeout and its
    # progress (6464 enqueued, 6461 completed: the laggard) folded into it and lost.
    log = [
        _timeout(0, 0, 1800017),
        _timeout(2, 2, 1800085),
        _status(0, 0, 1, 6463, 6462),
        _status(2, 2, 2, 6464, 6461),
    ]
    recs, stats = _parse("\n".join(log), gpus_per_node=8)
    assert _summary(recs) == {
        "0": (0, "1", 6463, 1800017, 6463, 6462),
        "2": (0, "2", 6463, 1800085, 6464, 6461),
    }
    assert sorted(r.gpu for r in recs) == [0, 2] and stats.records == 2


def test_a_process_is_told_by_torchruns_local_rank_where_no_global_rank_is_printed():
    # Before 2.2 there is no "[rankN]:"; torchrun's "[defaultN]:" still names the process.
    # Before: one record, the second process's ran_ms lost.
    log = [
        "[default0]:[E ProcessGroupNCCL.cpp:828] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=15173, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802710 milliseconds before timing out.",
        "[default2]:[E ProcessGroupNCCL.cpp:828] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=15173, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800310 milliseconds before timing out.",
    ]
    recs, _ = _parse("\n".join(log))
    assert sorted((r.labels["local_rank"], r.ran_ms) for r in recs) == [("0", 1802710), ("2", 1800310)]


def test_one_processs_lines_still_join_among_anothers():
    # The what() repeat names no global rank: torchrun's local rank ties it to the process that
    # printed "[default2]:[rank2]:"; a line with no prefix at all joins the one process that can
    # have printed it (its PG, its "ran for"). One record per process, as when each log was read alone.
    log = [
        _timeout(0, 0, 1800017),
        _timeout(2, 2, 1800085),
        _status(2, 2, 2, 6464, 6461),
        _status(0, 0, 1, 6463, 6462),
        _what(2, 2),
        _what(0, 1).removeprefix("[default0]:"),
    ]
    recs, _ = _parse("\n".join(log))
    assert _summary(recs) == {
        "0": (0, "1", 6463, 1800017, 6463, 6462),
        "2": (0, "2", 6463, 1800085, 6464, 6461),
    }
    alone = {}
    for glob, local in ((0, 0), (2, 2)):
        lines = [ln for ln in log if f"[rank{glob}]:" in ln or ln.startswith(f"[default{local}]:  what()")]
        (alone[str(local)],) = _parse("\n".join(lines))[0]
    assert {lr: (r.ts, r.ran_ms, r.last_enqueued) for lr, r in alone.items()} == {
        r.labels["local_rank"]: (r.ts, r.ran_ms, r.last_enqueued) for r in recs
    }


def test_a_bare_failure_line_joins_its_own_process():
    # "Some NCCL operations have failed" carries no seq: it joins its process's latest timeout,
    # or waits for that process's numbers; another process's numbers never take it.
    failed = (
        "[default{0}]:[rank{0}]:[E1003 18:36:59.833637681 ProcessGroupNCCL.cpp:621] [Rank 0] Some NCCL "
        "operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
        "operations might run on corrupted/incomplete data."
    )
    log = [failed.format(2), _status(0, 0, 1, 6463, 6462), _status(2, 2, 2, 6464, 6461)]
    recs, _ = _parse("\n".join(log))
    assert _summary(recs) == {
        "0": (0, "1", 6463, None, 6463, 6462),
        "2": (0, "2", 6463, None, 6464, 6461),
    }
    ts = {r.labels["local_rank"]: r.ts for r in recs}
    assert ts["0"] - ts["2"] == 2  # rank 2's record kept its bare line's earlier time


def test_one_process_in_two_communicators_at_the_same_seq_makes_two_records():
    # Global rank 0 is Rank 0 of the default PG and of its TP group; both time out at seq 1.
    # Before: one record, the TP group's progress lost.
    status = (
        "[rank0]:[E1218 20:27:21.48490{0}450 ProcessGroupNCCL.cpp:2168] [PG ID {1} PG GUID {1}({2}) Rank 0]  failure "
        "detected by watchdog at work sequence id: 1 PG status: last enqueued work: {3}, last completed work: {4}"
    )
    log = [status.format(1, 0, "default_pg", 547, 546), status.format(2, 1, "mesh_tp", 12, 0)]
    recs, _ = _parse("\n".join(log))
    assert sorted((r.comm, r.comm_name, r.last_enqueued, r.last_completed) for r in recs) == [
        ("0", "default_pg", 547, 546),
        ("1", "mesh_tp", 12, 0),
    ]


def test_many_processes_with_the_same_pg_rank_and_seq_each_keep_their_own_report():
    # 64 TP groups of two: global ranks 2, 4, .., 128 are each Rank 0, all at seq 6463. The
    # timeouts come first, the statuses after in reverse, as a combined log may order them.
    lines = [_timeout(g % 8, g, 1800000 + g) for g in range(2, 130, 2)]
    lines += [_status(g % 8, g, g // 2, 6463, 6462 if g != 34 else 6400) for g in reversed(range(2, 130, 2))]
    recs, _ = _parse("\n".join(lines))
    assert len(recs) == 64
    assert all(r.ran_ms == 1800000 + int(r.labels["global_rank"]) for r in recs)
    assert all(r.comm == str(int(r.labels["global_rank"]) // 2) for r in recs)
    assert [r.labels["global_rank"] for r in recs if r.last_completed == 6400] == ["34"]


# -- any order of the lines: the same records -------------------------------------------------


def _line(kind: str, local: int | None, glob: int | None, pg: int, ran: int, enq: int, done: int) -> str:
    """One of a rank's lines (the 2.4 layouts above) with the prefixes a log may have kept: both,
    torchrun's local rank only (a multi-node --tee log's what() repeat), or none (a grep)."""
    pfx = (f"[default{local}]:" if local is not None else "") + (f"[rank{glob}]:" if glob is not None else "")
    if kind == "timeout":
        return (f"{pfx}[E1003 18:37:01.832146 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
                f"timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
                f"{ran} milliseconds before timing out.")  # fmt: skip
    if kind == "status":
        return (f"{pfx}[E1003 18:37:02.833629 ProcessGroupNCCL.cpp:1709] [PG {pg} (mesh_tp) Rank 0] Timeout at NCCL "
                f"work: 6463, last enqueued NCCL work: {enq}, last completed NCCL work: {done}.")  # fmt: skip
    if kind == "failed":
        return (f"{pfx}[E1003 18:36:50.833637 ProcessGroupNCCL.cpp:621] [Rank 0] Some NCCL operations have failed or "
                "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                "corrupted/incomplete data.")  # fmt: skip
    return (f"{pfx}  what():  [PG {pg} (mesh_tp) Rank 0] Process group watchdog thread terminated with exception: "
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, "
            f"NumelOut=1, Timeout(ms)=1800000) ran for {ran} milliseconds before timing out.")  # fmt: skip


def _records(lines: list[str]) -> list[tuple]:
    recs, _ = _parse("\n".join(lines) + "\n", gpus_per_node=8)
    return sorted(
        (
            (r.rank, r.comm, r.gpu, r.labels.get("global_rank"), r.seq, r.ran_ms, r.last_enqueued, r.last_completed, r.ts)
        for r in recs
        ),
        key=repr,
    )


# Two processes, Rank 0 of TP groups 1 and 2 (global ranks 0 and 2, or 0 and 8 on a second node
# with the same local rank 0), each with its timeout, status, bare failure and what() lines.
def _job(second: int, what_prefix: str, failed_prefix: str) -> list[str]:
    out = []
    for glob, pg, ran, enq, done in ((0, 1, 1800017, 6463, 6462), (second, 2, 1800085, 6464, 6461)):
        local = glob % 8
        out.append(_line("timeout", local, glob, pg, ran, enq, done))
        out.append(_line("status", local, glob, pg, ran, enq, done))
        out.append(_line("what", local if what_prefix == "local" else None, None, pg, ran, enq, done))
        out.append(_line("failed", local if failed_prefix != "none" else None,
                         glob if failed_prefix == "both" else None, pg, ran, enq, done))  # fmt: skip
    return out


@settings(max_examples=fuzz_examples(40), deadline=None)
@given(
    second=hs.sampled_from([2, 8]),
    what_prefix=hs.sampled_from(["local", "none"]),
    failed_prefix=hs.sampled_from(["both", "local", "none"]),
    data=hs.data(),
)
def test_property_any_order_of_the_lines_gives_the_records_of_the_log_as_written(second, what_prefix, failed_prefix,
                                                                                 data):  # fmt: skip
    # A log merged from several ranks' files, grepped or sorted, holds a process's lines in any
    # order among the others': a line naming no process (or only a local rank two nodes share)
    # must join its own process's report by what it says, not by which line came last.
    lines = _job(second, what_prefix, failed_prefix)
    written = _records(lines)
    assert data.draw(hs.permutations(lines).map(_records)) == written
    # Each process's report whole: its PG, its own numbers and its global rank's GPU.
    assert {(r[1], r[2], r[5], r[6], r[7]) for r in written} >= {
        ("1", 0, 1800017, 6463, 6462),
        ("2", second % 8, 1800085, 6464, 6461),
    }


def test_many_processes_and_lines_naming_none_are_placed_in_one_pass():
    # 5,000 processes report the same PG rank and seq, and 5,000 what() repeats and bare failure
    # lines name no process: each weighed against every process took minutes (quadratic); the
    # placing is by index. A ceiling, not a speed check: the quadratic version took over 30 s.
    import time

    lines = [_line("timeout", None, g, 0, 1_800_000 + g, 0, 0) for g in range(5000)]
    for g in range(5000):
        lines.append(_line("what", None, None, g, 1_800_000 + g, 0, 0))
        lines.append(_line("failed", None, None, g, 0, 0, 0).replace("[Rank 0]", f"[PG {g} (mesh_tp) Rank 0]"))
    t = time.monotonic()
    recs, stats = _parse("\n".join(lines) + "\n")
    assert time.monotonic() - t < 10
    assert stats.too_many == 0 and len(recs) == 15_000  # several could have printed each: their own records
