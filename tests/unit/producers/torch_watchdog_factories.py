"""PyTorch's ProcessGroupNCCL watchdog lines for the producer's tests, real output copied from a
public log (the whitespace and numbers as printed): ``PT24_*``, the PyTorch 2.4-2.5 layout, from the log
quoted in ../shared/reference/fabric-and-incidents.md §2b (a two-rank BROADCAST hang at seq 1)."""

from __future__ import annotations


PT24_TIMEOUT_0 = (
    "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
    "Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)
PT24_TIMEOUT_1 = (
    "[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
    "Timeout(ms)=600000) ran for 600088 milliseconds before timing out."
)
PT24_STATUS_1 = (
    "[rank1]:[E1218 20:27:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 1 Rank 1]  failure "
    "detected by watchdog at work sequence id: 1 PG status: last enqueued work: 547, last completed "
    "work: -1"
)
PT24_STATUS_0 = (
    "[rank0]:[E1218 20:27:21.484910731 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 1 Rank 0]  failure "
    "detected by watchdog at work sequence id: 1 PG status: last enqueued work: 547, last completed "
    "work: -1"
)
PT24_NOISE = (
    "[rank1]:[E1218 20:27:21.484941868 ProcessGroupNCCL.cpp:667] Stack trace of the failed collective not "
    "found, potentially because FlightRecorder is disabled. You can enable it by setting "
    "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value."
)
