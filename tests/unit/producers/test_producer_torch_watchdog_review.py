"""``torch-watchdog`` on a Ray driver's log: Ray forwards each worker's lines with its tag,
``(WorkerDict pid=3490362)``, or ``(WorkerDict pid=3490362, ip=10.0.0.6)`` for a worker on another
node than the driver's (ray-project/ray ``python/ray/_private/worker.py``, ``print_worker_logs``:
``"{DIM}{color}({name} pid={pid}[, ip={ip}]){RESET} {line}"``; ``doc/source/ray-observability/
ray-logging.rst``), and collapses alike lines of several workers into the last one with
`` [repeated Nx across cluster]`` (``python/ray/_private/ray_logging.py``, ``LogDeduplicator`` and
``DedupState.formatted``). The watchdog lines follow PyTorch's layouts as the other test files hold
them; the numbers are made up. Each test failed before its fix.
"""

from __future__ import annotations

import io

import pytest

from producers.torch_watchdog import WatchdogStats, parse

DEC_2025 = 1767139200.0  # 2025-12-31: the logs' year


def _parse(text: str, **kw):
    stats = WatchdogStats()
    recs = parse(io.StringIO(text), job="pretrain", host="driver", year=2025, default_ts=DEC_2025, stats=stats, **kw)
    return recs, stats


def _old(tag: str, ran: int) -> str:
    """PyTorch 2.1's timeout line (``[E ProcessGroupNCCL.cpp:475]``, no ``[rankN]:``, no time) of a
    process that is ``Rank 0`` of its tensor-parallel group, at that group's seq 6463."""
    return (
        f"{tag} [E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for {ran} "
        "milliseconds before timing out."
    )


def _old_exception(tag: str, ran: int) -> str:
    """The exception that repeats it, as Python prints it: no header either."""
    return (
        f"{tag} RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, "
        f"OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for {ran} milliseconds before timing out."
    )


COLOR = "\x1b[2m\x1b[36m{}\x1b[0m"  # colorama's DIM, CYAN and RESET_ALL around the tag


@pytest.mark.parametrize(
    "tags, ids",
    [
        # two workers on two nodes that happen to have the same pid
        (("(WorkerDict pid=3490362, ip=10.0.0.5)", "(WorkerDict pid=3490362, ip=10.0.0.6)"),
         (("3490362", "10.0.0.5"), ("3490362", "10.0.0.6"))),
        # the tags as a terminal gets them: colored
        ((COLOR.format("(WorkerDict pid=3490362)"), COLOR.format("(WorkerDict pid=3490363)")),
         (("3490362", None), ("3490363", None))),
        # a worker's output through another worker's (vLLM's engine under a Ray actor, as a public log has it)
        (("(VllmAsyncGenerationWorker pid=222967, ip=10.66.3.172) (EngineCore_DP0 pid=223561) (RayWorkerWrapper "
          "pid=231743)", "(VllmAsyncGenerationWorker pid=222967, ip=10.66.3.172) (EngineCore_DP0 pid=223561) "
          "(RayWorkerWrapper pid=231744)"), (("231743", "10.66.3.172"), ("231744", "10.66.3.172"))),
    ],
)  # fmt: skip
def test_ray_workers_without_a_rank_prefix_are_told_apart_by_their_pid_and_node(tags, ids):
    # Two workers, each Rank 0 of its TP group, time out at their groups' seq 6463, and each
    # repeats it in its exception. Before: the tags were not read (or only the first of them):
    # the four lines were one record, the second worker's timeout (ran 1800085) folded in and lost.
    a, b = tags
    log = [_old(a, 1800017), _old(b, 1800085), _old_exception(a, 1800017), _old_exception(b, 1800085)]
    recs, stats = _parse("\n".join(log))
    got = {(r.labels.get("ray_pid"), r.labels.get("ray_ip")): (r.rank, r.seq, r.ran_ms) for r in recs}
    assert got == {ids[0]: (0, 6463, 1800017), ids[1]: (0, 6463, 1800085)}
    assert all(r.host == "driver" for r in recs) and stats.records == 2


def _status(pid: int, glob: int, pg: int, enq: int, done: int) -> str:
    """PyTorch 2.4's ``Timeout at NCCL work`` line of global rank ``glob`` (``Rank 0`` of PG ``pg``)."""
    return (
        f"(WorkerDict pid={pid}) [rank{glob}]:[E1003 18:37:01.833625{glob}9 ProcessGroupNCCL.cpp:1709] [PG {pg} "
        f"(mesh_tp) Rank 0] Timeout at NCCL work: 6463, last enqueued NCCL work: {enq}, last completed NCCL work: "
        f"{done}."
    )


def _exception(pid: int, ran: int) -> str:
    """Python's ``RuntimeError`` of the same timeout: Ray's tag, no ``[rankN]:``, no PG."""
    return (
        f"(WorkerDict pid={pid}) RuntimeError: [Rank 0] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for {ran} "
        "milliseconds before timing out."
    )


def test_a_line_with_only_rays_tag_joins_the_global_rank_its_worker_printed():
    # Before: the two exceptions named no process; alike, they were taken for one line and placed
    # on one rank (or left a record of their own), and rank 2 lost its ran_ms.
    log = [_status(101, 0, 1, 6463, 6462), _status(102, 2, 2, 6464, 6461), _exception(101, 1800017),
           _exception(102, 1800085)]  # fmt: skip
    recs, stats = _parse("\n".join(log), gpus_per_node=8)
    got = {r.labels.get("global_rank", "0"): (r.comm, r.ran_ms, r.last_enqueued, r.last_completed) for r in recs}
    assert got == {"0": ("1", 1800017, 6463, 6462), "2": ("2", 1800085, 6464, 6461)}
    assert sorted(r.gpu for r in recs) == [0, 2] and stats.records == 2


def test_lines_rays_deduplication_left_out_are_counted():
    # Ray printed the last of three workers' alike timeout lines with " [repeated 3x across cluster]":
    # the other two are not in the log. Before: not said anywhere.
    line = _old("(WorkerDict pid=102, ip=10.0.0.6)", 1800085) + " [repeated 3x across cluster]"
    recs, stats = _parse(_old("(WorkerDict pid=101)", 1800017) + "\n" + line)
    assert sorted(r.ran_ms for r in recs) == [1800017, 1800085]
    assert stats.summary()["ray_deduplicated_lines"] == 2
