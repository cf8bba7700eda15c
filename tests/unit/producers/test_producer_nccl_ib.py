"""NCCL's InfiniBand completion errors and async events in a training log (#34,
``producers/nccl_ib.py`` through ``gpuwarden produce torch-watchdog``): every layout NCCL's
``net_ib.cc`` has printed, from public logs (origins beside each), counted per HCA into NIC
records the port checks judge; hostile lines are counted, never a crash."""

from __future__ import annotations

import io
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.decode import Decoder
from pipeline.schema import NicRecord, ProgressRecord, encode
from producers.torch_watchdog import WatchdogLogSource, parse
from tests.factories import T0
from tests.unit.producers.factories import ib_log

FUZZ = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "200"))

# NVIDIA/nccl#1405 (a 2.19-era net plugin, ib_plugin.c): status=, no HCA, RoCE GIDs.
ISSUE_1405 = (
    "kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
    "10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
    "fd00:1148:9000:5000:4:200:3:ff22 remoteGidsfd00:1148:9000:5000:4:200:3:ff1f"
)
# NVIDIA/nccl#1905: a log shipper's time, NCCL's own [time] (2.23+), the HCA, and the QP's fatal event.
ISSUE_1905 = [
    "2025-11-09 15:39:31.043 +08:00 [2025-11-09 07:39:30] h100-28:238:1313 [0] transport/net_ib.cc:139 NCCL WARN "
    "communicator encountered a fatal error (detected in ncclIbTest)",
    "2025-11-09 15:39:31.043 +08:00 [2025-11-09 07:39:30] h100-28:238:1219 [0] transport/net_ib.cc:180 NCCL WARN "
    "NET/IB : mlx5_ib0:1 async fatal event on QP (0x7f69f01519a8): local access violation work queue error",
    "2025-11-09 15:39:31.043 +08:00 [2025-11-09 07:39:30] h100-28:238:1313 [0] transport/net_ib.cc:2451 NCCL WARN "
    "NET/IB: Got completion from peer 172.16.12.34<38081> with status=4 opcode=0 len=0 vendor err 83 (Send) hca "
    "mlx5_ib0",
]
# NVIDIA/nccl-tests#252 (2.12-2.20 layout, "with error N, opcode .."): a peer, no HCA.
TESTS_252 = (
    "kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer "
    "10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)"
)
# NVIDIA/nccl#928: an IPv6 link-local peer with its interface.
ISSUE_928 = (
    "H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
    "fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564, len 32564, vendor err 81 (Send)"
)
# pytorch/pytorch#81628: the process's "Using" line (three HCAs), then a completion error naming none.
TORCH_81628 = [
    "tf144:143468:143468 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [2]i40iw0:1/RoCE ; "
    "OOB enp88s0:192.168.17.144<0>",
    "tf144:143468:143535 [1] transport/net_ib.cc:1198 NCCL WARN NET/IB : Got completion from peer "
    "192.168.17.147<38560> with error 12, opcode 0, len 0, vendor err 129",
]
# NVIDIA/nccl#902 and #214: the oldest layout (no peer), with the prefix NCCL's debug.cc prints.
ISSUE_902 = "n1:3000:3100 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129"
ISSUE_214 = (
    "node-8x-v100-nvlink-1:4242:4300 [0] transport/net_ib.cu:788 NCCL WARN NET/IB : Got completion with "
    "error 4, opcode 1, len 21938, vendor err 81"
)
# NVIDIA/nccl#230: mpirun's time and rank prefix, NCCL 2.4's async event naming no HCA.
ISSUE_230 = (
    "2019-06-02T16:13:44.884Z: [1,12]<stdout>:container-e275-1553839402050-12124-01-000057:815:864 [0] "
    "transport/net_ib.cu:80 NCCL WARN NET/IB : Got async event : local catastrophic error"
)
# NVIDIA/nccl#1710 (2.21): the HCA:port on the async event; a completion with RoCE GIDs.
ISSUE_1710 = [
    "node201:127799:127863 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got async event : local access "
    "violation work queue error",
    "node023:10214:10303 [0] transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer 10.1.3.201<33057> "
    "with status=9 opcode=0 len=0 vendor err 138 (Send) localGid ::ffff:10.206.1.23 remoteGids::ffff:10.206.1.11",
]
# NVIDIA/nccl#1919 (2.25.1): the fatal QP event layout.
ISSUE_1919 = (
    "node-0:139577:139678 [0] transport/net_ib.cc:154 NCCL WARN NET/IB : mlx5_1:1 async fatal event on QP "
    "(0x7309dc3bb338): invalid request local work queue error"
)
# NVIDIA/nccl#1664: a plugin's "NET/IBP:" as the issue quotes it, the prefix cut.
ISSUE_1664 = (
    "NET/IBP:Got completion from peer 7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err 129 (Send)"
)
# NVIDIA/nccl master, net_ib/p2p.cc's format string (2.28+): names for status and opcode.
MASTER = (
    "[2026-01-05 10:00:01] gpu-7:5150:5190 [3] transport/net_ib/p2p.cc:688 (ncclIbLogCompletionWithError) "
    "NCCL WARN NET/IB: Got completion from peer 10.0.0.2<43210> with status=IBV_WC_RETRY_EXC_ERR(12) "
    "opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129  hca mlx5_4"
)
# PyTorch's rank prefix and torchrun's tee prefix around an NCCL line (their formats: the watchdog fixtures).
TORCHRUN = (
    "[default3]:[rank11]:gpu-3:700:760 [3] transport/net_ib.cc:2358 NCCL WARN NET/IB: Got completion from "
    "peer 10.0.0.7<1234> with status=5 opcode=0 len=0 vendor err 249 (Recv) hca mlx5_3"
)


def _decode(recs):
    return Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")


def test_each_completion_layout_gives_status_peer_and_hca():
    cases = [
        (ISSUE_1405, "kp-ddp-worker-0", "unknown", 0, "12", "IBV_WC_RETRY_EXC_ERR", "10.216.210.236<54862>", "Recv"),
        (ISSUE_1905[2], "h100-28", "mlx5_ib0", 1, "4", "IBV_WC_LOC_PROT_ERR", "172.16.12.34<38081>", "Send"),
        (TESTS_252, "kolyoz2", "unknown", 0, "4", "IBV_WC_LOC_PROT_ERR", "10.0.35.1<49189>", "Send"),
        (ISSUE_928, "H100-2", "unknown", 0, "4", "IBV_WC_LOC_PROT_ERR", "fe80::966d:ae03:8b:df78%ib0<53249>", "Send"),
        (ISSUE_902, "n1", "unknown", 0, "12", "IBV_WC_RETRY_EXC_ERR", None, None),
        (ISSUE_214, "node-8x-v100-nvlink-1", "unknown", 0, "4", "IBV_WC_LOC_PROT_ERR", None, None),
        (ISSUE_1710[1], "node023", "unknown", 0, "9", "IBV_WC_REM_INV_REQ_ERR", "10.1.3.201<33057>", "Send"),
        (ISSUE_1664, "here", "unknown", 0, "12", "IBV_WC_RETRY_EXC_ERR", "7.6.13.83<36315>", "Send"),
        (MASTER, "gpu-7", "mlx5_4", 1, "12", "IBV_WC_RETRY_EXC_ERR", "10.0.0.2<43210>", None),
        (TORCHRUN, "gpu-3", "mlx5_3", 1, "5", "IBV_WC_WR_FLUSH_ERR", "10.0.0.7<1234>", "Recv"),
    ]  # fmt: skip
    for line, host, hca, port, status, name, peer, way in cases:
        (r,), stats = ib_log([line])
        assert (r.host, r.device, r.port, r.counters) == (host, hca, port, {"nccl_ib_completion_errors": 1}), line
        assert (r.labels["status"], r.labels["status_name"], r.labels.get("peer"), r.labels.get("direction")) == (
            status,
            name,
            peer,
            way,
        ), line
        assert r.labels["source"] == "nccl_log" and r.state is None
        assert stats.completion_errors == 1 and stats.unparsable == 0
    (r,), _ = ib_log([TORCHRUN])
    assert (r.labels["rank"], r.labels["cuda_dev"]) == ("11", "3")


def test_fatal_async_events_count_and_non_fatal_ones_do_not():
    recs, stats = ib_log([ISSUE_1905[1], ISSUE_1710[0], ISSUE_1919, ISSUE_230,
                        "n9:1:2 [0] transport/net_ib.cc:171 NCCL WARN NET/IB : mlx5_2:1 Got async error event: port error",
                        "n9:1:2 [0] net_ib/common.cc:179 NCCL WARN NET/IB : mlx5_2:1 Got non-fatal async event: "
                        "LID change(9)",
                        "n9:1:2 [0] transport/net_ib.cc:95 NCCL WARN NET/IB : Got async event : port active"])  # fmt: skip
    got = [(r.host, r.device, r.port, r.counters, r.labels["event"]) for r in recs]
    assert sorted(got) == sorted([
        ("h100-28", "mlx5_ib0", 1, {"nccl_ib_async_fatal_events": 1}, "local access violation work queue error"),
        ("node201", "mlx5_0", 1, {"nccl_ib_async_fatal_events": 1}, "local access violation work queue error"),
        ("node-0", "mlx5_1", 1, {"nccl_ib_async_fatal_events": 1}, "invalid request local work queue error"),
        ("container-e275-1553839402050-12124-01-000057", "unknown", 0, {"nccl_ib_async_fatal_events": 1},
         "local catastrophic error")])  # fmt: skip
    assert (stats.async_fatal, stats.async_other) == (4, 3)


def test_the_using_line_names_the_hca_of_a_single_rail_process():
    single = "n5:900:900 [0] NCCL INFO NET/IB : Using [0]mlx5_2:1/IB ; OOB ib0:10.0.0.5<0>"
    (r,), _ = ib_log([single, ISSUE_902.replace("n1:3000:3100", "n5:900:901")])
    assert (r.host, r.device, r.port) == ("n5", "mlx5_2", 1)
    # Three HCAs (pytorch#81628): the line cannot say which; sent as device "unknown", port 0.
    (r,), stats = ib_log(TORCH_81628)
    assert (r.device, r.port, r.labels["peer"]) == ("unknown", 0, "192.168.17.147<38560>") and stats.no_hca == 1
    # A later HCA-naming line takes its port from the host's Using line ([0]mlx5_3:2).
    (r,), _ = ib_log(["gpu-3:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_3:2/IB [1]mlx5_4:1/IB ; OOB x", TORCHRUN])
    assert (r.device, r.port) == ("mlx5_3", 2)


def test_times_come_from_a_zoned_prefix_then_nccl_then_an_unzoned_prefix_then_the_default():
    # The event and the completion: one HCA in one second, one record counting both. The
    # shipper's time names its zone (+08:00); NCCL's [07:39:30] is the node's local time (UTC
    # there), which names none and read in another zone would be hours off.
    (r,), _ = ib_log(ISSUE_1905)
    assert r.ts == 1762673971.043  # 2025-11-09T07:39:31.043Z
    (r,), _ = ib_log([x.replace("2025-11-09 15:39:31.043 +08:00 ", "") for x in ISSUE_1905])
    assert r.ts == time.mktime(time.strptime("2025-11-09 07:39:30", "%Y-%m-%d %H:%M:%S"))
    (r,), _ = ib_log([x.replace("15:39:31.043 +08:00 [2025-11-09 07:39:30]", "07:39:31.043") for x in ISSUE_1905])
    assert r.ts == time.mktime(time.strptime("2025-11-09 07:39:31", "%Y-%m-%d %H:%M:%S")) + 0.043
    assert r.counters == {"nccl_ib_async_fatal_events": 1, "nccl_ib_completion_errors": 1}
    assert (r.labels["event"], r.labels["peer"]) == ("local access violation work queue error", "172.16.12.34<38081>")
    (r,), _ = ib_log([ISSUE_230])
    assert r.ts == 1559492024.884  # 2019-06-02T16:13:44.884Z
    (r,), stats = ib_log([TESTS_252], default_ts=T0 + 5)
    assert r.ts == T0 + 5 and stats.no_timestamp == 1


def test_errors_of_one_hca_in_one_second_are_one_record_and_counts_accumulate():
    lines = [
        TORCHRUN,
        TORCHRUN.replace("10.0.0.7<1234>", "10.0.0.8<99>"),
        "[2026-01-05 10:00:01] " + TORCHRUN.split("]:", 2)[2],
        MASTER,
        MASTER.replace("10:00:01", "10:00:09"),
    ]
    recs, _ = ib_log(lines, default_ts=time.mktime(time.strptime("2026-01-05 10:00:01", "%Y-%m-%d %H:%M:%S")))
    by = [(r.device, r.counters["nccl_ib_completion_errors"], r.labels.get("peers")) for r in recs]
    assert by == [("mlx5_3", 3, "10.0.0.7<1234>,10.0.0.8<99>"), ("mlx5_4", 1, None), ("mlx5_4", 2, None)]


def test_an_explicit_host_wins_over_ncclS_hostname():
    (r,), _ = ib_log([ISSUE_1905[2]], host="h100-28.cluster")
    assert r.host == "h100-28.cluster"


def test_the_watchdog_source_sends_both_kinds_and_counts_them(tmp_path):
    text = "\n".join([*ISSUE_1905, TESTS_252,
                      "[rank1]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
                      "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)"
                      " ran for 600081 milliseconds before timing out."]) + "\n"  # fmt: skip
    path = tmp_path / "train.log"
    path.write_text(text)
    src = WatchdogLogSource(str(path), job="j1", host=None)
    recs = src.poll()
    kinds = sorted(type(r).__name__ for r in recs)
    assert kinds == ["NicRecord", "NicRecord", "ProgressRecord"]
    s = src.summary()
    assert (s["ib_completion_errors"], s["ib_async_fatal_events"], s["ib_records"], s["records"]) == (2, 1, 2, 1)
    # Every record passes the pipeline's own decoder.
    out = _decode(recs)
    assert len(out.records) == 3 and not out.dead, out.dead
    assert {r.device for r in out.records if isinstance(r, NicRecord)} == {"mlx5_ib0", "unknown"}
    assert [r for r in out.records if isinstance(r, ProgressRecord)][0].seq == 7


def test_parse_without_an_ib_log_skips_the_lines_as_before():
    assert parse(io.StringIO("\n".join(ISSUE_1905)), job=None, host="h", default_ts=T0) == []


@pytest.mark.parametrize("line, reason", [
    ("h:1:1 [0] NCCL WARN NET/IB : Got completion from peer p<1> with status=99999999999 opcode=0 len=0 vendor err 1",
     "bad_number"),
    ("h:1:1 [0] NCCL WARN NET/IB : Got completion from peer p<1> with status=１２ opcode=0 len=0 vendor err 1",
     "unparsable"),
    ("h:1:1 [0] NCCL WARN NET/IB : Got completion from peer p<1> with status=0 opcode=0 len=0 vendor err 0", "success"),
    ("h:1:1 [0] NCCL WARN NET/IB : Got completion from peer p<1> with stat", "unparsable"),
    ("h:1:1 [0] NCCL WARN NET/IB : mlx5_0:1 async fatal event on QP (0x1)", "unparsable"),
])  # fmt: skip
def test_bad_lines_are_counted_by_reason(line, reason):
    recs, stats = ib_log([line])
    assert recs == [] and getattr(stats, reason) == 1


def test_a_hostile_peer_or_event_does_not_reach_a_label():
    line = ISSUE_1905[2].replace("172.16.12.34<38081>", "x" * 5000)
    (r,), _ = ib_log([line])
    assert len(r.labels["peer"]) == 128
    (r,), _ = ib_log([ISSUE_1919.replace("invalid request", "invalid\x07request")])
    assert r.labels["event"] == "?"


_ALPHABET = st.sampled_from(["NET/IB", " : ", "Got completion", " from peer ", "with ", "status=", "error ", "12",
                             "-1", "opcode=", ", ", "vendor err ", "(Send)", " hca ", "mlx5_0", "async fatal event",
                             ": ", "h:1:2 [0] ", "NCCL WARN ", "Using [0]mlx5_1:1/IB", "\x00", "９", "[rank3]:",
                             "[2025-13-40 99:99:99] ", "Got async event : ", "local catastrophic error", "é", " ",
                             "include/ibvwrap.h:60 ", "Call to ibv_poll_cq() returned ", "-2", "(wrap_ibv_poll_cq) "])  # fmt: skip


@settings(max_examples=FUZZ, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_ALPHABET, max_size=24).map("".join), max_size=12))
def test_any_line_is_read_or_counted_and_every_record_decodes(lines):
    recs, stats = ib_log(lines)
    assert stats.records == len(recs)
    if recs:
        out = _decode(recs)
        assert len(out.records) == len(recs) and not out.dead, out.dead
