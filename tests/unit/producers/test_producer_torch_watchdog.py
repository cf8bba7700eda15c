"""``gpuwarden produce torch-watchdog``: PyTorch's ProcessGroupNCCL watchdog lines, in every
layout its releases print, become one progress record per rank and piece of work.

The lines are real output, copied from public logs (the whitespace and numbers as printed):

- ``PT24_*``: PyTorch 2.4-2.5 layout (``[rankN]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629]``,
  ``[PG ID 1 PG GUID 1 Rank 1]``), from the log quoted in ../shared/reference/fabric-and-incidents.md
  §2b (a two-rank BROADCAST hang at seq 1).
- ``PT23_*``: PyTorch 2.3 (``[rank2]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 2] Timeout at NCCL
  work``, a completed seq of 76280750235782912 with 1 enqueued), from argonne-lcf/alcf-nccl-tests
  ``pytests/README.md`` @ 03b44968.
- ``PT1X``: the layout before the rank prefix and time (``[E ProcessGroupNCCL.cpp:828] [Rank 1]``,
  no ``NumelIn``), as quoted in several public troubleshooting notes (repository not identified;
  layout only).
- ``WRAPPED``: MarioPasc/MU-Diff ``NCCL_TIMEOUT_FIX.md`` @ 929d505a, where the message is wrapped
  inside ``WorkNCCL(...)``.
- ``RAY``: a Ray worker's prefix ``(WorkerDict pid=3490362)`` before a 2.5 line, from a public
  verl training note (repository not identified; layout only).
- ``DUMP``: the ``Received a dump signal`` line is PyTorch's own format
  (``ProcessGroupNCCL.cpp``, ``getNCCLWatchdogTimeoutErrorMsg``) with torchrun's ``[default5]:``
  prefix; its numbers are made up.
"""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.torch_watchdog import LINE_MAX, WatchdogLogSource, WatchdogStats, parse
from tests.factories import T0, fuzz_examples
from tests.unit.producers.torch_watchdog_factories import (
    PT24_NOISE,
    PT24_STATUS_0,
    PT24_STATUS_1,
    PT24_TIMEOUT_0,
    PT24_TIMEOUT_1,
)

PT23_TIMEOUT_AT = ("[rank2]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 2] Timeout at NCCL work: 1, last enqueued NCCL "
                   "work: 1, last completed NCCL work: 76280750235782912.")
PT23_FAILED = ("[rank2]:[E ProcessGroupNCCL.cpp:577] [Rank 2] Some NCCL operations have failed or timed out. Due to "
               "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
               "data.")
PT23_EXCEPTION = ("[rank2]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 2] Process group watchdog thread terminated with "
                  "exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                  "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=120000) ran for 120094 "
                  "milliseconds before timing out.")
PT1X = ("[E ProcessGroupNCCL.cpp:828] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=15173, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802710 milliseconds before timing out.")
WRAPPED = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=668, OpType=ALLREDUCE,\n"
           "NumelIn=52, NumelOut=52, Timeout(ms)=600000) ran for 600097 milliseconds before timing out.")
RAY = ("(WorkerDict pid=3490362) [rank1]:[E1118 20:32:23.957372583 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID "
       "0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 2635 PG status: last enqueued "
       "work: 2635, last completed work: 2634")
DUMP = ("[default5]:[rank5]:[E1218 20:27:22.000000000 ProcessGroupNCCL.cpp:1390] [PG ID 1 PG GUID 1 Rank 5] "
        "Received a dump signal due to a collective timeout from rank 0 and we will try our best to dump the debug "
        "info. Last enqueued NCCL work: 547, last completed NCCL work: 546.This is most likely caused by incorrect "
        "usages of collectives")

# PyTorch 2.4-2.6 print this on the rank whose work failed (ProcessGroupNCCL.cpp, LOG(ERROR) <<
# "Exception (either an error or timeout) detected by watchdog at work: "), often its only line;
# later releases say "NCCL error is detected by watchdog at work: ".
PT25_DETECTED = ("[rank3]:[E321 02:07:08.465224069 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 3] Exception (either an "
                 "error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed "
                 "NCCL work: 1579.")
PT26_DETECTED = ("[rank1]:[E1109 16:13:20.222705810 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
                 "NCCL error is detected by watchdog at work: 811, last enqueued NCCL work: 812, last completed NCCL "
                 "work: 810.")

DEC_2025 = 1767139200.0  # 2025-12-31: the logs' year


def _parse(text: str, **kw):
    stats = WatchdogStats()
    recs = parse(io.StringIO(text), job="pretrain", host="node7", year=2025, default_ts=kw.pop("ts", DEC_2025),
                 stats=stats, **kw)
    return recs, stats


def _by_rank(recs):
    return {(r.rank, r.state): r for r in recs}


def test_the_24_layout_joins_each_ranks_timeout_and_status_into_one_record():
    recs, stats = _parse("\n".join([PT24_TIMEOUT_0, PT24_TIMEOUT_1, PT24_STATUS_1, PT24_STATUS_0, PT24_NOISE]))
    assert len(recs) == 2 and stats.summary()["dropped.unparsable_line"] == 0
    r1 = _by_rank(recs)[(1, "timeout")]
    assert (r1.seq, r1.op, r1.timeout_ms, r1.ran_ms, r1.last_enqueued, r1.last_completed, r1.comm) == (
        1, "BROADCAST", 600000, 600088, 547, -1, "1")
    assert (r1.host, r1.job, r1.source) == ("node7", "pretrain", "watchdog")
    # The earlier of its lines' times, glog's local MMDD HH:MM:SS in the log's year.
    import time
    assert time.localtime(r1.ts)[:6] == (2025, 12, 18, 20, 27, 21)


def test_the_23_layout_and_its_exception_repeat_are_one_record_without_the_garbage_completed_seq():
    recs, stats = _parse("\n".join([PT23_TIMEOUT_AT, PT23_FAILED, PT23_EXCEPTION]))
    (r,) = recs
    assert (r.rank, r.seq, r.op, r.timeout_ms, r.last_enqueued, r.comm) == (2, 1, "ALLREDUCE", 120000, 1, "0")
    assert r.last_completed is None  # 76280750235782912 completed of 1 enqueued: not progress
    assert stats.summary()["implausible_seq_cleared"] == 1
    assert stats.no_timestamp == 3 and r.ts == DEC_2025


def test_the_oldest_layout_and_a_wrapped_copy_are_read():
    recs, _ = _parse(PT1X + "\n" + WRAPPED.replace("[Rank 1]", "[Rank 4]"))
    got = {r.rank: (r.seq, r.op, r.timeout_ms, r.ran_ms) for r in recs}
    assert got == {1: (15173, "ALLREDUCE", 1800000, 1802710), 4: (668, "ALLREDUCE", 600000, 600097)}


def test_ray_and_torchrun_prefixes_and_the_dump_signal_of_a_waiting_rank():
    recs, _ = _parse(RAY + "\n" + DUMP)
    ray = _by_rank(recs)[(1, "timeout")]
    assert (ray.comm, ray.comm_name, ray.last_enqueued, ray.last_completed) == ("0", "default_pg", 2635, 2634)
    dump = _by_rank(recs)[(5, "progress")]
    assert (dump.gpu, dump.last_enqueued, dump.last_completed, dump.comm) == (5, 547, 546, "1")
    assert dump.labels["dump_from"] == "rank 0" and dump.labels["local_rank"] == "5"


def test_the_detected_by_watchdog_line_is_a_ranks_report_with_its_progress():
    # It matched no layout and no marker: the rank it alone named was missing, and the others
    # had no last enqueued / completed work, without a drop counted.
    recs, stats = _parse("\n".join([PT25_DETECTED, PT26_DETECTED]))
    got = {r.rank: (r.seq, r.last_enqueued, r.last_completed, r.comm, r.state) for r in recs}
    assert got == {3: (1580, 1582, 1579, "1", "timeout"), 1: (811, 812, 810, "0", "timeout")}
    assert stats.summary()["dropped.unparsable_line"] == 0 and stats.watchdog_lines == 2

def test_gpus_per_node_maps_ranks_to_gpus():
    recs, _ = _parse(PT24_STATUS_1.replace("Rank 1", "Rank 13").replace("rank1", "rank13"), gpus_per_node=8)
    assert recs[0].rank == 13 and recs[0].gpu == 5


def test_interleaved_ranks_of_a_big_job_stay_apart():
    lines = []
    for rank in range(64):
        lines.append(PT24_TIMEOUT_1.replace("rank1]", f"rank{rank}]").replace("Rank 1]", f"Rank {rank}]"))
    for rank in reversed(range(64)):
        done = 546 if rank != 17 else 500
        lines.append(PT24_STATUS_1.replace("rank1]", f"rank{rank}]").replace("Rank 1]", f"Rank {rank}]")
                     .replace("completed work: -1", f"completed work: {done}"))
    recs, _ = _parse("\n".join(lines))
    assert len(recs) == 64
    assert {r.rank for r in recs if r.last_completed == 500} == {17}
    assert all(r.op == "BROADCAST" and r.last_enqueued == 547 for r in recs)


def test_a_december_line_in_a_log_written_in_january_is_last_years():
    recs, _ = _parse(PT24_STATUS_1, ts=1767830400.0)  # 2026-01-08
    import time
    assert time.localtime(recs[0].ts).tm_year == 2025


def test_every_record_passes_the_decoder():
    text = "\n".join([PT24_TIMEOUT_0, PT24_STATUS_0, PT23_TIMEOUT_AT, PT23_EXCEPTION, PT1X, WRAPPED, RAY, DUMP])
    recs, _ = _parse(text, ts=T0)
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
    assert len(out.records) == len(recs) == 6 and not out.dead


def test_the_source_reads_a_file_once_and_counts(tmp_path):
    p = tmp_path / "train.log"
    p.write_text("\n".join(["epoch 3 loss 1.2", PT24_TIMEOUT_1, PT24_STATUS_1]) + "\n")
    src = WatchdogLogSource(str(p), job="j1", host="h1")
    recs = src.poll()
    assert len(recs) == 1 and recs[0].job == "j1" and src.poll() == [] and src.done
    s = src.summary()
    assert (s["lines"], s["watchdog_lines"], s["records"]) == (3, 2, 1)


# -- hostile input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, reason",
    [
        (PT24_STATUS_1.replace("work: 547", "work: ٥٤٧"), "dropped.bad_number"),  # Arabic-Indic digits
        (PT24_STATUS_1.replace("work: 547", "work: " + "9" * 25), "dropped.bad_number"),
        (PT24_STATUS_1.replace("work: 547", "work: 9223372036854775808"), "dropped.bad_number"),
        (PT24_STATUS_1.replace("work: -1", "work: -7"), "dropped.bad_number"),
        (PT24_TIMEOUT_1.replace("SeqNum=1", "SeqNum=１"), "dropped.bad_number"),  # a full-width digit
        (PT24_TIMEOUT_1.replace("ran for 600088", "ran for 6e5"), "dropped.bad_number"),
        (PT24_TIMEOUT_1.replace("Rank 1]", "Rank x]"), "dropped.bad_number"),
        (PT24_TIMEOUT_1[:140], "dropped.unparsable_line"),  # cut short inside WorkNCCL(
        (PT24_STATUS_1[:150], "dropped.unparsable_line"),  # cut before the numbers
        (PT24_TIMEOUT_1.replace("[rank1]:", "").replace("[Rank 1] ", ""), "dropped.no_rank"),
        (PT24_TIMEOUT_1.replace("Rank 1]", "Rank 99999999]").replace("rank1]", "rank99999999]"), "dropped.no_rank"),
    ],
)
def test_a_hostile_line_is_counted_by_reason_and_costs_only_itself(line, reason):
    recs, stats = _parse("\n".join([line, PT24_STATUS_0]))
    assert [r.rank for r in recs] == [0]
    assert stats.summary()[reason] == 1


def test_a_huge_line_is_skipped_whole_in_bounded_pieces():
    huge = "[rank1]: " + "Watchdog caught collective operation timeout " * (3 * LINE_MAX // 40)
    recs, stats = _parse("\n".join([huge, PT24_STATUS_0]))
    assert [r.rank for r in recs] == [0] and stats.oversize == 1


def test_garbage_and_binary_noise_make_nothing():
    noise = "\x00\xff" * 100 + "\n" + "failure detected by watchdog" + "\u202e" * 50 + "\n" + json.dumps({"a": 1})
    recs, stats = _parse(noise)
    assert recs == [] and stats.unparsable + stats.no_rank == 1


def test_an_impossible_date_leaves_the_time_to_the_file():
    recs, stats = _parse(PT24_STATUS_1.replace("E1218", "E1341"))
    assert recs[0].ts == DEC_2025


def test_an_unpadded_month_is_read_and_unicode_digits_in_a_time_are_not():
    import time

    recs, _ = _parse(PT24_STATUS_1.replace("E1218 20:27:21", "E709 17:05:38"))
    assert time.localtime(recs[0].ts)[:6] == (2025, 7, 9, 17, 5, 38)
    recs, stats = _parse(PT24_STATUS_1.replace("E1218", "E1２18"))
    assert recs[0].ts == DEC_2025


NUM = st.sampled_from(["0", "12", "-1", "²", "٣", "9" * 400, "1e400", "inf", "-7", "", "１"])
HOSTILE = st.one_of(
    st.text(max_size=80),
    st.builds(lambda r, a, b: f"[rank{r}]:[E ProcessGroupNCCL.cpp:1] [PG 0 Rank {r}] Timeout at NCCL work: {a}, "
              f"last enqueued NCCL work: {a}, last completed NCCL work: {b}.", NUM, NUM, NUM),  # fmt: skip
    st.builds(lambda r, s, t: f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={s}, "
              f"OpType=X, Timeout(ms)={t}) ran for {t} milliseconds before timing out.", NUM, NUM, NUM),  # fmt: skip
    st.builds(lambda d: f"[rank1]:[E{d} 20:27:21.4 ProcessGroupNCCL.cpp:2] [Rank 1] Some NCCL operations have "
              "failed or timed out.", st.sampled_from(["1218", "1341", "0230", "709", "٠٧٠٩", ""])),  # fmt: skip
    st.just("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType="),
)


@settings(max_examples=fuzz_examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), HOSTILE), max_size=12))
def test_fuzz_arbitrary_lines_among_good_ones(lines):
    body = []
    for i, (good, hostile) in enumerate(lines):
        body.append(PT24_STATUS_1.replace("Rank 1]", f"Rank {1000 + i}]").replace("rank1]", f"rank{1000 + i}]")
                    if good else hostile.replace("\n", " ").replace("\r", " "))  # fmt: skip
    recs, stats = _parse("\n".join(body))
    kept = {r.rank for r in recs if r.last_enqueued == 547}
    assert {1000 + i for i, (good, _) in enumerate(lines) if good} <= kept  # every good line kept
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1") if recs else None
    assert out is None or (len(out.records) == len(recs) and not out.dead)  # every record within the contract
