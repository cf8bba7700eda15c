"""Review of ``producers/nccl_ib.py`` against NCCL's source (NVIDIA/nccl, tags beside each) and
hostile logs: each case failed before its fix, and says what it did then."""

from __future__ import annotations

import time

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers import nccl_ib
from tests.factories import T0
from tests.fleet_factories import no_hang
from tests.unit.producers.factories import ib_log

# v2.23.4-1 src/transport/net_ib.cc:2121, with the hca.
V2_23 = (
    "node7:1234:1300 [3] transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer 10.0.0.8<5000> "
    "with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_3"
)


def _local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))


def test_a_64_kib_async_event_line_is_counted_in_bounded_time():
    # Before: "async fatal event(?: on \w+[^:]*)?" let \w+ and [^:]* split a long word every way:
    # one 64 KiB line (torch_watchdog's LINE_MAX) with no colon after "on" took ~40 s.
    for line in ["NET/IB : mlx5_0:1 async fatal event on " + "Q" * 65_000,
                 "h:1:2 [0] net_ib/common.cc:140 NCCL WARN NET/IB : async fatal event on " + "x" * 65_000]:  # fmt: skip
        with no_hang(5.0):
            recs, stats = ib_log([line])
        assert recs == [] and stats.unparsable == 1
    # The 2.30.7 layout, with the QP's fields before the colon, still reads.
    (r,), _ = ib_log(["n1:1:2 [0] net_ib/common.cc:140 NCCL WARN NET/IB : mlx5_1:1 async fatal event on QP "
                      "(0x7309dc3bb338) qpn=73 handle=4 send_cq=2 recv_cq=2 state=6 sq_psn=1 rq_psn=9: local work "
                      "queue catastrophic error"])  # fmt: skip
    assert (r.device, r.labels["event"]) == ("mlx5_1", "local work queue catastrophic error")


def test_long_words_in_lines_that_name_net_ib_are_read_in_linear_time():
    # Before: the host name was tried at every character of a run of name characters, reading up
    # to 253 of them each time: 0.41 s a 64 KiB line, 26 s for these 64 (7 s a MB of such log).
    lines = [f"x NET/IB {i} " + "a" * 65_000 for i in range(64)]
    with no_hang(5.0):
        recs, stats = ib_log(lines)
    assert recs == [] and stats.unparsable == 0
    # A host still starts after what cannot be part of a name, as in every layout NCCL prints.
    (r,), _ = ib_log(["[rank3]:" + V2_23])
    assert r.host == V2_23.split(":", 1)[0]

def test_a_completion_whose_peer_ncclS_socket_could_not_name_is_still_an_error():
    # src/misc/socket.cc ncclSocketToString(): an address neither AF_INET nor AF_INET6, or a
    # failed getnameinfo(), gives "" -- NCCL then prints "from peer  with" (two spaces).
    # Before: fit no layout, counted unparsable: the HCA's error made no record.
    for line in [V2_23.replace("10.0.0.8<5000>", ""),
                 "gpu-7:5150:5190 [3] transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer  with "
                 "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129  hca mlx5_4"]:  # fmt: skip
        (r,), stats = ib_log([line])
        assert r.counters == {"nccl_ib_completion_errors": 1} and stats.unparsable == 0
        assert r.labels["status"] == "12" and "peer" not in r.labels


def test_two_processes_lines_run_together_are_counted_not_put_on_either_host():
    # Ranks sharing one stdout (torchrun's default, srun) write in buffer-sized pieces, so one
    # rank's line can be cut by another's. Before: the first prefix named the line, so node9's
    # error counted on node5 (GPU 0), a healthy host blamed. Where node9's name begins is not
    # known either ("...with st" + "node9:" reads "stnode9"): the line is counted, not read.
    cut = "node5:4000:4071 [0] transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer 10.0.0.1<1> with st"
    other = V2_23.replace("node7", "node9")
    for line in [cut + other, cut + "[default3]:" + other, V2_23 + other]:
        recs, stats = ib_log([line])
        assert recs == [] and stats.unparsable == 1 and stats.completion_errors == 0, line
    # Each on a line of its own (NCCL starts every warning so), read as before.
    (r,), stats = ib_log([cut, other])
    assert (r.host, r.device, r.labels["cuda_dev"]) == ("node9", "mlx5_3", "3") and stats.unparsable == 1
    # A 64 KiB line of prefixes costs bounded time, and one count.
    with no_hang(5.0):
        recs, stats = ib_log([("h:1:2 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, "
                               "vendor err 129 " * 700)[:65_536]])  # fmt: skip
    assert recs == [] and stats.unparsable == 1


def test_counters_grow_in_time_order_when_the_log_s_times_go_backwards():
    # Processes of one host flush their buffered output out of order: a later line can carry an
    # earlier time. Before: each record took the total read so far, so the 10:00:05 record said 2
    # and the 10:00:10 one 1 -- a counter going down, which the port checks read as a new log.
    late = "[2026-01-05 10:00:10] " + V2_23
    early = "[2026-01-05 10:00:05] " + V2_23.replace(":1300 ", ":1301 ")
    recs, _ = ib_log([late, early, late.replace(":1300 ", ":1302 ")])
    assert [(r.ts, r.counters) for r in recs] == [
        (_local("2026-01-05 10:00:05"), {"nccl_ib_completion_errors": 1}),
        (_local("2026-01-05 10:00:10"), {"nccl_ib_completion_errors": 3}),
    ]
    # Two counters of one HCA, each in its own second, out of order: each total up to its time.
    event = "[2026-01-05 10:00:01] n1:1:2 [0] net_ib/common.cc:140 NCCL WARN NET/IB : mlx5_3:1 async fatal event: local catastrophic error"  # fmt: skip
    recs, _ = ib_log([late.replace("node7", "n1"), event])
    assert [r.counters for r in recs] == [
        {"nccl_ib_async_fatal_events": 1},
        {"nccl_ib_async_fatal_events": 1, "nccl_ib_completion_errors": 1},
    ]


def test_a_time_no_record_can_carry_is_no_time():
    # A node whose clock was never set prints 1970 (NCCL's time is the node's clock); a shipper
    # can write year 9999. Before: the record carried it and the decoder dead-lettered it
    # (ts_out_of_range), the HCA's error lost downstream with nothing counted here.
    for pre in ["[1970-01-01 00:05:12] ", "[9999-12-31 23:59:59] ", "1970-01-01T00:00:07Z ",
                "2150-01-01T00:00:00Z [1970-01-01 00:05:12] "]:  # fmt: skip
        recs, stats = ib_log([pre + V2_23], default_ts=T0 + 5)
        out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
        assert len(out.records) == 1 and not out.dead, (pre, out.dead)
        assert recs[0].ts == T0 + 5 and stats.no_timestamp == 1, pre
    # A good time behind a bad one is taken: the shipper's zoned time before NCCL's 1970.
    (r,), stats = ib_log(["2025-11-09 15:39:31.043 +08:00 [1970-01-01 00:05:12] " + V2_23])
    assert r.ts == 1762673971.043 and stats.no_timestamp == 0


def test_an_echo_is_known_after_more_than_max_seen_distinct_warnings(monkeypatch):
    # A large job's ranks each warn of their own peer; PyTorch's "Last error:" echo comes later.
    # Before: the set of warnings stopped growing at MAX_SEEN, so every echo after that was a
    # second error, on the reading host.
    monkeypatch.setattr(nccl_ib, "MAX_SEEN", 8)
    lines = [V2_23.replace("10.0.0.8<5000>", f"10.0.1.{i}<5000>") for i in range(20)]
    echo = "[rank3]: " + lines[-1].split("NCCL WARN ", 1)[1]
    recs, stats = ib_log([*lines, "[rank3]: Last error:", echo])
    assert [(r.host, r.counters) for r in recs] == [("node7", {"nccl_ib_completion_errors": 20})]
    assert stats.echoes == 1
