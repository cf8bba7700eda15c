"""NCCL's IB error lines in the layouts of particular releases (``producers/nccl_ib.py``), built
from NVIDIA/nccl's format strings (tag and file beside each), and hostile input that must cost
only itself: counted by reason, never a crash, never unbounded memory."""

from __future__ import annotations

import time
import tracemalloc

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers import nccl_ib
from producers.nccl_ib import IbLog, IbStats
from tests.factories import T0
from tests.fleet_factories import no_hang
from tests.unit.producers.factories import ib_log

# v2.28.9-1 src/transport/net_ib.cc:2543 (the same in v2.28.7-1):
#   "NET/IB: Got completion from peer %s with status=%s(%d) opcode=%s(%d) reqSize=%d vendor_err=%u
#    req_type=%s%s%s%s%s hca %s" -- ibvWcStatusStr/ibvWcOpcodeStr (src/misc/ibvwrap.cc), reqTypeStr
#   {"Unused", "Send", "Recv", "Flush", "IPut"}, the GIDs only on RoCE (" localGid ", " remoteGids").
V2_28_9_IB = (
    "[2026-01-05 10:00:01] gpu-7:5150:5190 [3] transport/net_ib.cc:2543 NCCL WARN NET/IB: Got completion "
    "from peer 10.0.0.2<43210> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=1048576 "
    "vendor_err=129 req_type=Send hca mlx5_4"
)
V2_28_9_ROCE = (
    "gpu-8:5151:5191 [1] transport/net_ib.cc:2543 NCCL WARN NET/IB: Got completion from peer "
    "10.0.0.3<43211> with status=IBV_WC_REM_ACCESS_ERR(10) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) "
    "reqSize=0 vendor_err=136 req_type=Recv localGid ::ffff:10.0.0.8 remoteGids::ffff:10.0.0.3 hca mlx5_1"
)
# v2.20.5-1 src/transport/net_ib.cc:309-330 (NCCL_IB_MERGE_NICS, default 1; 2.22 turns it off on a
# mix of single- and dual-port NICs): a merged device prints " [%d]={" then "[%d] %s:%d/%s" joined
# by ", " then "}"; a single one " [%d]%s:%d/%s"; then "NET/IB : Using%s %s; OOB %s:%s".
USING_MIXED = (
    "n1:4000:4000 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]={[1] mlx5_1:1/IB, [2] mlx5_2:1/IB} "
    "[RO]; OOB ib0:10.0.0.1<0>"
)
# v2.20.5-1 src/transport/net_ib.cc:1696: no HCA in the completion line before 2.22.
V2_20_NO_HCA = (
    "n1:4000:4071 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
    "10.0.0.9<5000> with status=12 opcode=0 len=0 vendor err 129 (Send)"
)
# v2.23.4-1 src/transport/net_ib.cc:2121, with the hca.
V2_23 = (
    "node7:1234:1300 [3] transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer 10.0.0.8<5000> "
    "with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_3"
)


def test_the_2_28_7_to_2_28_9_layout_with_reqsize_and_req_type_is_a_completion_error():
    # Before: "reqSize=" between opcode and vendor_err fit no layout: counted unparsable, no record.
    for line, host, hca, status, name, opcode, vendor, way, peer in [
        (V2_28_9_IB, "gpu-7", "mlx5_4", "12", "IBV_WC_RETRY_EXC_ERR", "0", "129", "Send", "10.0.0.2<43210>"),
        (V2_28_9_ROCE, "gpu-8", "mlx5_1", "10", "IBV_WC_REM_ACCESS_ERR", "129", "136", "Recv", "10.0.0.3<43211>"),
    ]:  # fmt: skip
        (r,), stats = ib_log([line])
        assert (r.host, r.device, r.port, r.counters) == (host, hca, 1, {"nccl_ib_completion_errors": 1}), line
        got = tuple(r.labels.get(k) for k in ("status", "status_name", "opcode", "vendor_err", "direction", "peer"))
        assert got == (status, name, opcode, vendor, way, peer)
        assert stats.completion_errors == 1 and stats.unparsable == 0


def test_a_using_line_with_merged_nics_names_every_hca_of_the_process():
    # Before: the device list stopped at the braces, so the process seemed to use mlx5_0 alone and
    # an error naming no HCA was put on mlx5_0, one of three it may have come from.
    (r,), stats = ib_log([USING_MIXED, V2_20_NO_HCA])
    assert (r.host, r.device, r.port) == ("n1", "unknown", 0) and stats.no_hca == 1
    # Merged NICs alone: two HCAs, so the same.
    merged = USING_MIXED.replace("[0]mlx5_0:1/IB [1]={[1] mlx5_1:1/IB, [2] mlx5_2:1/IB}",
                                 "[0]={[0] mlx5_0:1/IB, [1] mlx5_1:1/IB}")  # fmt: skip
    (r,), _ = ib_log([merged, V2_20_NO_HCA])
    assert (r.device, r.port) == ("unknown", 0)
    # One plain device is still that process's HCA.
    single = USING_MIXED.replace("[0]mlx5_0:1/IB [1]={[1] mlx5_1:1/IB, [2] mlx5_2:1/IB}", "[0]mlx5_2:1/IB")
    (r,), _ = ib_log([single, V2_20_NO_HCA])
    assert (r.device, r.port) == ("mlx5_2", 1)


# PyTorch's DistBackendError text (torch/csrc/distributed/c10d NCCLUtils, getNcclErrorDetailStr:
# "\nLast error:\n" + ncclGetLastError()), as tatsu-lab/stanford_alpaca#207 quotes it; NCCL keeps
# the last WARN's message whatever NCCL_DEBUG is (v2.21.5-1 src/debug.cc:161, ncclLastError).
ECHO = ["[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275,"
        " remote process exited or there was a network error, NCCL version 2.23.4",
        "[rank3]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        "[rank3]: Last error:",
        "[rank3]: NET/IB: Got completion from peer 10.0.0.8<5000> with status=12 opcode=0 len=0 vendor err 129 (Send) "
        "hca mlx5_3"]  # fmt: skip


def test_pytorchs_echo_of_ncclS_last_warning_is_not_a_second_error_on_another_host():
    # Before: the echo, prefix-less, was a second error, on the reading host: "here"/mlx5_3.
    recs, stats = ib_log([V2_23, *ECHO, ECHO[3].replace("[rank3]: ", "") + "\r"])
    assert [(r.host, r.device, r.counters) for r in recs] == [("node7", "mlx5_3", {"nccl_ib_completion_errors": 1})]
    assert stats.completion_errors == 1 and stats.echoes == 2
    # Without NCCL_DEBUG there is no WARN line: the echo is all there is, read as before.
    (r,), stats = ib_log(ECHO)
    assert (r.host, r.device, r.labels["rank"]) == ("here", "mlx5_3", "3") and stats.echoes == 0
    # A second, prefixed warning with the same text is a second error.
    (r,), stats = ib_log([V2_23, V2_23.replace(":1300 ", ":1301 ")])
    assert r.counters == {"nccl_ib_completion_errors": 2} and stats.echoes == 0


def test_hosts_and_hcas_past_the_record_bound_cost_no_memory(monkeypatch):
    # Before: each new (host, HCA, port) kept its running total past MAX_RECORDS, and hosts come
    # from the log: 20,000 of them held ~8 MB, a GB of such lines GBs.
    monkeypatch.setattr(nccl_ib, "MAX_RECORDS", 10)
    lines = [V2_23.replace("node7:", f"n{i}:") for i in range(20_000)]
    stats = IbStats()
    log = IbLog(host=None, default_ts=T0, stats=stats)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for line in lines:
            log.feed(line)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, f"{grown} bytes kept for 10 records"
    assert len(log.records()) == 10 and stats.too_many == 19_990 and stats.completion_errors == 20_000


def test_cut_or_corrupted_real_lines_are_read_or_counted_and_every_record_decodes():
    recs = []
    for line in (V2_28_9_IB, V2_28_9_ROCE, USING_MIXED, V2_20_NO_HCA, POLL_2_30):
        for i in range(len(line) + 1):
            for bad in (line[:i], line[:i] + "\x00" + line[i:], line[:i] + "\ufffd" + line[i + 1 :],
                        line[:i] + "\r\n" + line[i:], line[:i] + "٣" + line[i + 1 :], line[:i] + "9" * 40 + line[i:]):  # fmt: skip
                got, stats = ib_log([bad])
                recs += got
                assert stats.records == len(got) <= 1
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
    assert len(out.records) == len(recs) and not out.dead, out.dead


# include/ibvwrap.h's wrap_ibv_poll_cq (inline, so __FILE__ is the header as src/Makefile's
# -Iinclude finds it): WARN("Call to ibv_poll_cq() returned %d", done) when the provider's
# poll_cq returns < 0, the same text from v2.3.5-5 (line 1076) to v2.30.7-1 (line 63); line 60
# in 2.18-2.23, 62 in 2.24-2.29.3, 58 in 2.29.7-2.30.4; "(func)" in the prefix from 2.30.7
# (src/debug.cc).
POLL_2_18 = "n1:4000:4071 [0] include/ibvwrap.h:60 NCCL WARN Call to ibv_poll_cq() returned -2"
POLL_2_26 = "[2026-01-05 10:00:01] gpu-7:5150:5190 [3] include/ibvwrap.h:62 NCCL WARN Call to ibv_poll_cq() returned -2"
POLL_2_30 = ("[default3]:[rank11]:gpu-7:5150:5190 [3] include/ibvwrap.h:63 (wrap_ibv_poll_cq) NCCL WARN "
             "Call to ibv_poll_cq() returned -22")  # fmt: skip
SINGLE = "n1:4000:4000 [0] NCCL INFO NET/IB : Using [0]mlx5_2:1/IB [RO]; OOB ib0:10.0.0.1<0>"


def test_a_failed_poll_of_the_completion_queue_is_a_completion_error_of_the_process_hca():
    # Before: no "NET/IB" on the line, so it was not read at all: the HCA in error made no record.
    (r,), stats = ib_log([SINGLE, POLL_2_18])
    assert (r.host, r.device, r.port, r.counters) == ("n1", "mlx5_2", 1, {"nccl_ib_completion_errors": 1})
    assert (r.labels["status"], r.labels["status_name"], r.labels["cuda_dev"]) == ("-2", "ibv_poll_cq_failed", "0")
    assert "opcode" not in r.labels and "peer" not in r.labels and r.labels["source"] == "nccl_log"
    assert (stats.poll_cq_failures, stats.completion_errors, stats.unparsable) == (1, 0, 0)
    assert stats.summary()["ib_poll_cq_failures"] == 1
    # NCCL's own time (2.26+), and the (func) of 2.30.7 behind torchrun's and PyTorch's prefixes.
    (r,), _ = ib_log([POLL_2_26])
    assert r.ts == time.mktime(time.strptime("2026-01-05 10:00:01", "%Y-%m-%d %H:%M:%S"))
    (r,), stats = ib_log([POLL_2_30])
    assert (r.host, r.labels["status"], r.labels["rank"], r.labels["cuda_dev"]) == ("gpu-7", "-22", "11", "3")
    # The line names no HCA: a process using several gives device "unknown", as a completion would.
    assert (r.device, r.port) == ("unknown", 0) and stats.no_hca == 1
    # The oldest layout (2.3.5-2.17, the header's line 1076-1081).
    (r,), _ = ib_log([POLL_2_18.replace("ibvwrap.h:60", "ibvwrap.h:1076")])
    assert r.counters == {"nccl_ib_completion_errors": 1}


def test_a_failed_poll_counts_with_the_hca_s_completion_errors_and_its_echo_does_not():
    completion = V2_20_NO_HCA.replace("4071", "4072")
    lines = [SINGLE, completion, POLL_2_18, "[rank0]: Last error:", "[rank0]: Call to ibv_poll_cq() returned -2"]
    (r,), stats = ib_log(lines)
    assert (r.device, r.counters, r.labels["status"]) == ("mlx5_2", {"nccl_ib_completion_errors": 2}, "12")
    assert stats.echoes == 1 and stats.poll_cq_failures == 1
    # Without NCCL_DEBUG only PyTorch's echo is there: read, on the reading host.
    (r,), stats = ib_log(lines[3:])
    assert (r.host, r.device, r.labels["status"], r.labels["rank"]) == ("here", "unknown", "-2", "0")


def test_a_cut_or_altered_failed_poll_line_is_counted_not_sent():
    for tail, reason in [("-99999999999", "bad_number"), ("-2147483649", "bad_number"), ("－２", "unparsable"),
                         ("", "unparsable"), ("-", "unparsable"), ("-2x", "unparsable"), ("-" + "9" * 30, "unparsable"),
                         ("0", "success"), ("7", "success")]:  # fmt: skip
        recs, stats = ib_log([POLL_2_18.replace("returned -2", "returned " + tail)])
        assert recs == [] and getattr(stats, reason) == 1 and stats.poll_cq_failures == 0, tail
    (r,), _ = ib_log([POLL_2_18.replace("-2", "-2147483648")])
    assert r.labels["status"] == "-2147483648"
    # Other mentions of the call (a stack frame, NCCL's INFO trace) are not this warning.
    for line in ["n1:1:2 [0] NCCL INFO include/ibvwrap.h:60 -> 2 in wrap_ibv_poll_cq",
                 "n1:1:2 [0] NCCL INFO Call to ibv_poll_cq() returned -2"]:  # fmt: skip
        recs, stats = ib_log([line])
        assert recs == [] and stats.unparsable == 0


def test_a_64_kib_line_of_failed_poll_fragments_is_counted_in_bounded_time():
    frag = "h:1:2 [0] include/ibvwrap.h:60 NCCL WARN Call to ibv_poll_cq() returned -"
    for line in [
        (frag * (65_536 // len(frag)))[:65_536],
        frag + "9" * 65_536,
        "Call to ibv_poll_cq() " * 3000,
        "a" * 65_536 + " Call to ibv_poll_cq",
    ]:
        with no_hang(5.0):
            recs, stats = ib_log([line])
        assert recs == [] and stats.unparsable == 1
