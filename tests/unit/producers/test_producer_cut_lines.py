"""A saved input whose last line has no newline (a file still being written, or cut) is not read
as if whole: ``last completed work: 51`` (of 5122) is a wrong value sent with exit 0. The line is counted
(``dropped.cut_last_line``), warned about, and the producer exits 3 (lost input); a status of
NCCL RAS cut inside its tables or blocks, at a line's end, is a ``cut_status`` (exit 3) too.
Each case failed before its fix; the complete inputs are read as they were.
"""

from __future__ import annotations

import io
import json
import sys

import pytest

from pipeline.cli import main
from producers.common import BoundedSender, ProducerMetrics, RunResult
from producers.dcgmi import DmonFileSource
from producers.ibstat import IbstatSource
from producers.ncclras import RasStatusSource
from producers.torch_watchdog import WatchdogLogSource
from tests.factories import SHARED_DATA, ListSink
from tests.unit.producers.ras_factories import (
    DOC_HEALTHY,
    DOC_JSON,
    DOC_MISMATCH,
    NEW_INCOMPLETE,
    V226_AHEAD,
    parse_ras,
)

LOST_CUT = "LOST input: dropped.cut_last_line 1 (exit 3)"

# PyTorch 2.4+'s PG status line (ProcessGroupNCCL.cpp), as tw_cut.log of the audit holds it whole.
WATCHDOG = (
    "[rank3]:[E1206 18:55:21.427000000 ProcessGroupNCCL.cpp:1664] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
    "failure detected by watchdog at work sequence id: 5123 PG status: last enqueued work: 5124, "
    "last completed work: 5122\n"
)

IBSTAT = (
    "CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Active\n"
    "\t\tPhysical state: LinkUp\n\t\tRate: 400\n\t\tLink layer: InfiniBand\n"
)

DMON = (SHARED_DATA / "dcgmi_dmon_a100_dcgm3_sample.txt").read_text()


def _produce(tmp_path, capsys, source: str, text: str, *extra: str) -> tuple[int, list[dict], list[str]]:
    f = tmp_path / "in.txt"
    f.write_text(text)
    out = tmp_path / "o.jsonl"
    rc = main(["produce", source, "--file", str(f), "--out", str(out), *extra])
    recs = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    return rc, recs, capsys.readouterr().err.strip().splitlines()


def _warned(caplog) -> bool:
    return "last line has no newline" in caplog.text


# ---- torch-watchdog: a one-shot read of a saved log (it follows no file)


def test_a_watchdog_line_cut_short_is_not_read_as_a_smaller_count(caplog, tmp_path, capsys):
    # Before: last_completed 51 (of 5122), a false hang suspect, exit 0.
    rc, recs, err = _produce(tmp_path, capsys, "torch-watchdog", WATCHDOG[: WATCHDOG.rindex("22")], "--job", "j")
    assert rc == 3 and recs == []
    assert err[-1] == f"gpuwarden produce torch-watchdog: {LOST_CUT}" and _warned(caplog)


def test_a_whole_watchdog_log_reads_as_before(caplog, tmp_path, capsys):
    rc, recs, err = _produce(tmp_path, capsys, "torch-watchdog", WATCHDOG, "--job", "j")
    assert rc == 0, err
    assert [(r["rank"], r["last_enqueued"], r["last_completed"]) for r in recs] == [(3, 5124, 5122)]
    assert not _warned(caplog)


def test_a_log_ending_in_a_progress_bar_without_its_newline_is_whole(caplog, tmp_path, capsys):
    # A crashed job's log often ends mid-line (a progress bar, block-buffered stdout): a last line
    # that no watchdog or NCCL line could be loses nothing of ours.
    rc, recs, err = _produce(tmp_path, capsys, "torch-watchdog", WATCHDOG + " 42%|####      | 420/1000", "--job", "j")
    assert rc == 0, err
    assert [r["last_completed"] for r in recs] == [5122] and not _warned(caplog)


def test_a_log_ending_in_a_cut_nccl_info_line_is_whole(caplog, tmp_path, capsys):
    # Found by a review: NCCL_DEBUG=INFO lines, which no layout reads, end a crashed job's log at
    # a buffer boundary as often as a progress bar does.
    info = "node1:2231:2290 [0] NCCL INFO comm 0x55d1c0 rank 0 nranks 16 cudaDev 0 busId 18000 - Destroy COMPLE"
    rc, recs, err = _produce(tmp_path, capsys, "torch-watchdog", WATCHDOG + info, "--job", "j")
    assert rc == 0, err
    assert [r["last_completed"] for r in recs] == [5122] and not _warned(caplog)


def test_a_watchdog_line_cut_short_on_stdin_is_counted(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(WATCHDOG[:-3].encode()), encoding="utf-8"))
    src = WatchdogLogSource("-", job="j", host="n1")
    assert src.poll() == []
    assert src.summary()["dropped.cut_last_line"] == 1


# ---- ncclras


def test_a_ras_rank_line_cut_inside_its_host_is_not_sent(caplog, tmp_path, capsys):
    # Before: rank 10 sent on host 10.0.1.1 (it is on 10.0.1.12), exit 0.
    text = V226_AHEAD[: V226_AHEAD.rindex("2\n\n")]
    rc, recs, err = _produce(tmp_path, capsys, "ncclras", text, "--job", "j")
    assert rc == 3
    assert {r["host"] for r in recs} == {"10.0.1.12"} and [r["rank"] for r in recs] == [9]
    assert "dropped.cut_last_line 1" in err[-1] and _warned(caplog)


def _cut_at(marker: str) -> str:
    """``V226_AHEAD`` up to the end of ``marker``."""
    return V226_AHEAD[: V226_AHEAD.index(marker) + len(marker)]


@pytest.mark.parametrize(
    "text",
    [
        V226_AHEAD[:420],  # the audit's head -c 420: inside the table's second header line
        V226_AHEAD[:500],  # inside the table's row
        _cut_at("per comm  in group\n"),  # the table's heads, no row
        _cut_at("Warnings\n===="),  # head -c 560: the row says MISMATCH, no block follows
        _cut_at("Warnings\n========\n\n"),  # the same, cut at a line's end
        _cut_at("#0-0 (5d0e3c1b2a497f68) MISMATCH\n"),  # a block's header, nothing of it
        _cut_at("AllGather operation counts\n"),  # a paragraph head, none of its groups
        _cut_at("operation 512\n"),  # the majority's group only
        _cut_at("operation 513\n"),  # the two ranks' group head, before its rank lines
        _cut_at("Rank 9 -- GPU 1 managed by process 20011 on node 10.0.1.12\n"),  # one of its two ranks
    ],
)
def test_a_ras_status_cut_inside_its_tables_or_blocks_exits_3(tmp_path, capsys, text):
    # Before: 0 to 1 records and exit 0, a job read as healthy (or as one rank ahead) that is not known to be.
    rc, _, err = _produce(tmp_path, capsys, "ncclras", text, "--job", "j")
    assert rc == 3, err
    assert err[-1].startswith("gpuwarden produce ncclras: LOST input: ") and "dropped.cut_status 1" in err[-1]


@pytest.mark.parametrize(
    "text",
    [
        NEW_INCOMPLETE[: NEW_INCOMPLETE.index("  Rank 21 --")],  # a missing rank's count, not the rank
        NEW_INCOMPLETE[: NEW_INCOMPLETE.index("  Process 3487984")],  # DEAD's count, not its process
        NEW_INCOMPLETE[: NEW_INCOMPLETE.index("  Rank 13 reported")],  # an error on 1 rank, not the rank
    ],
)
def test_a_ras_block_cut_before_the_ranks_it_lists_is_a_cut_status(text):
    # RAS lists the ranks of a group of at most 10 (client_support.cc, rasCountIsOutlier) in every mode.
    _, stats = parse_ras(text)
    assert stats.cut_status == 1


@pytest.mark.parametrize(
    "text",
    [
        V226_AHEAD,  # as the client prints it
        "garbage before it\n" + DOC_MISMATCH,  # the user guide's sample: no blank line after its block
        DOC_HEALTHY,
        DOC_JSON,  # -f json without a final newline: the document is whole when it parses
    ],
)
def test_a_whole_ras_status_reads_as_before(caplog, tmp_path, capsys, text):
    rc, recs, err = _produce(tmp_path, capsys, "ncclras", text, "--job", "j")
    assert rc == 0, err
    assert not _warned(caplog)
    want = parse_ras(text)[0]
    assert [(r["rank"], r["host"], r["state"]) for r in recs] == [(r.rank, r.host, r.state) for r in want]


def test_a_ras_text_line_whole_but_without_its_newline_is_still_a_cut(tmp_path, capsys):
    # A text line without its newline cannot be told from one cut at a line's end ("10.0.1.1" of .12).
    rc, recs, err = _produce(tmp_path, capsys, "ncclras", V226_AHEAD.rstrip("\n"), "--job", "j")
    assert rc == 3 and "dropped.cut_last_line 1" in err[-1]
    assert [r["rank"] for r in recs] == [9]


def test_a_whole_status_with_blocks_of_every_kind_is_no_cut():
    _, stats = parse_ras(NEW_INCOMPLETE)
    assert stats.cut_status == 0 and stats.records == 2


# ---- ibstat


def test_an_ibstat_rate_cut_short_is_not_sent(caplog, tmp_path, capsys):
    # Before: rate_gbps 40 (of 400), exit 0.
    rc, recs, err = _produce(tmp_path, capsys, "ibstat", IBSTAT[: IBSTAT.index("0\n\t\tLink")], "--host", "n1")
    assert rc == 3
    assert [r.get("rate_gbps") for r in recs] == [None]  # the port's state is whole, its rate is not read
    assert err[-1] == f"gpuwarden produce ibstat: {LOST_CUT}" and _warned(caplog)


def test_a_whole_ibstat_output_reads_as_before(tmp_path, capsys):
    rc, recs, err = _produce(tmp_path, capsys, "ibstat", IBSTAT, "--host", "n1")
    assert rc == 0, err
    assert [(r["device"], r["rate_gbps"], r["link_layer"]) for r in recs] == [("mlx5_0", 400.0, "InfiniBand")]


def test_an_ibstat_output_ending_in_blanks_without_a_newline_is_whole(caplog, tmp_path, capsys):
    rc, recs, err = _produce(tmp_path, capsys, "ibstat", IBSTAT + "\t", "--host", "n1")
    assert rc == 0, err
    assert len(recs) == 1 and not _warned(caplog)


# ---- dcgmi (a saved dmon log; the live source reads dcgmi's own pipe)


def test_a_dmon_cell_cut_short_is_not_sent(caplog, tmp_path, capsys):
    # Before: the last row's TOTEC 110946157 sent as 1109461, exit 0.
    assert DMON.endswith("\n") and DMON.rstrip().endswith("0")
    last = DMON.rstrip("\n").rsplit("\n", 1)[1]
    assert "110946157" in last
    text = DMON[: DMON.rindex("110946157") + len("1109461")]
    rc, recs, err = _produce(tmp_path, capsys, "dcgmi", text, "--host", "n1")
    assert rc == 3
    energies = [r["fields"].get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") for r in recs]
    assert 1109461.0 not in energies and len(recs) == DMON.count("\nGPU ") - 1
    assert err[-1] == f"gpuwarden produce dcgmi: {LOST_CUT}" and _warned(caplog)


def test_the_real_dmon_sample_reads_as_before(caplog, tmp_path, capsys):
    rc, recs, err = _produce(tmp_path, capsys, "dcgmi", DMON, "--host", "n1")
    assert rc == 0, err
    assert len(recs) == DMON.count("\nGPU ") and not _warned(caplog)
    assert recs[-1]["gpu"] == 0 and recs[-1]["fields"]["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 110946157.0


def test_a_dmon_capture_stopped_by_a_signal_without_a_newline_is_whole(caplog, tmp_path, capsys):
    # The trailer is a fixed sentence, not a value: nothing of it can be lost.
    rc, recs, err = _produce(
        tmp_path, capsys, "dcgmi", DMON + "dmon was stopped due to receiving a signal.", "--host", "n1"
    )
    assert rc == 0, err
    assert len(recs) == DMON.count("\nGPU ") and not _warned(caplog)


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda f: IbstatSource(f, host="n1"), IBSTAT[:-5]),
        (lambda f: RasStatusSource(f, job="j"), V226_AHEAD[:-5]),
        (lambda f: DmonFileSource(f, host="n1"), DMON.rstrip()[:-3]),
        (lambda f: WatchdogLogSource(f, job="j", host="n1"), WATCHDOG[:-3]),
    ],
)
def test_metrics_serve_the_cut_last_line_as_a_drop_reason(tmp_path, make, text):
    f = tmp_path / "in.txt"
    f.write_text(text)
    src = make(str(f))
    src.poll()
    families = {m.name: m for m in ProducerMetrics("p", src, BoundedSender(ListSink()), RunResult()).collect()}
    dropped = {s.labels["reason"]: s.value for s in families["gpuwarden_producer_dropped"].samples}
    assert dropped["cut_last_line"] == 1


def test_a_status_cut_at_the_wait_line_is_a_cut_status_read_as_ras(tmp_path, capsys):
    # "Communicators..." is printed before its time comes with the data: read, not a cut line.
    text = V226_AHEAD[: V226_AHEAD.index("Communicators...") + len("Communicators...")]
    rc, _, err = _produce(tmp_path, capsys, "ncclras", text, "--job", "j")
    assert rc == 3
    assert err[-1] == "gpuwarden produce ncclras: LOST input: dropped.cut_status 1 (exit 3)"


def test_a_block_whose_number_is_not_one_is_no_cut_status():
    # Its lines are counted as orphans: not owed to a block that was never read.
    _, stats = parse_ras("#99999999999999999999-0 (5d0e3c1b2a497f68) MISMATCH\n  junk\n")
    assert stats.cut_status == 0 and stats.orphan == 1


def test_an_ibstat_capture_that_lost_only_its_final_newline_is_whole(caplog, tmp_path, capsys):
    # $(ibstat) or a strip() drops the final newline; the link layer, which ends every port block,
    # cannot be cut into another word (found by a review).
    rc, recs, err = _produce(tmp_path, capsys, "ibstat", IBSTAT.rstrip("\n"), "--host", "n1")
    assert rc == 0, err
    assert [(r["rate_gbps"], r["link_layer"]) for r in recs] == [(400.0, "InfiniBand")] and not _warned(caplog)
    rc, _, _ = _produce(tmp_path, capsys, "ibstat", IBSTAT.rstrip("\n")[:-4], "--host", "n1")  # "InfiniB"
    assert rc == 3
