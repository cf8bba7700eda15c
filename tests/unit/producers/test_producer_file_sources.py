"""File sources (``--file``, nccl-tests): back-pressure instead of dropping while the sink takes
records, and a non-zero exit that says what was lost when input was lost."""

from __future__ import annotations

import json
import threading

import pytest

from pipeline.schema import dcgm
from producers.common import BoundedSender, run

from tests.factories import T0, ListSink, SHARED_DATA as DATA  # noqa: E402

HEADER = "#Entity   TMPTR  POWER   XIDER\nID        C      W\n"


class OnePoll:
    """A file source: everything in one poll."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, False

    def poll(self):
        self.done = True
        return [dcgm(T0 + i, "h", 0, {"gpu_temp": 50}) for i in range(self.n)]

    def close(self):
        pass


def test_backpressure_delivers_a_whole_file_through_a_small_buffer():
    # Before: submit() dropped all but the newest max_records, even with a healthy sink.
    sink = ListSink()
    sender = BoundedSender(sink, max_records=100, max_batch=64, backpressure=True)
    res = run(OnePoll(5000), sender, interval_s=0.0)
    assert len(sink.got) == 5000 and res.sender.dropped == 0 and res.sender.undelivered == 0


def test_backpressure_gives_up_only_when_the_sink_stalls():
    sink = ListSink()
    sink.down = True
    sender = BoundedSender(sink, max_records=10, backoff_s=0.01, max_backoff_s=0.05, backpressure=True, stall_s=0.3)
    sender.submit(OnePoll(50).poll())
    assert len(sender) == 50 and sender.stats.dropped == 0  # nothing dropped on submit
    sender.wait_for_room(threading.Event())
    assert len(sender) == 10 and sender.stats.dropped == 40


def test_a_live_sender_keeps_dropping_the_oldest():
    sender = BoundedSender(ListSink(), max_records=10)
    sender.submit(OnePoll(50).poll())
    assert len(sender) == 10 and sender.stats.dropped == 40


def _dmon_log(path, rounds: int, gpus: int) -> int:
    rows = [HEADER]
    for k in range(rounds):
        if k and k % 14 == 0:
            rows.append(HEADER)
        rows += [f"GPU {g}     {40 + g}     {200 + k % 50}.5   0\n" for g in range(gpus)]
    path.write_text("".join(rows))
    return rounds * gpus


def test_cli_dcgmi_file_through_a_small_buffer_loses_nothing(tmp_path, capsys):
    # Before: 8,000 records with --buffer 500: 7,500 dropped (the 12 h of dmon: 283,849
    # of 483,849), and exit 0.
    from pipeline.cli import main

    log, out = tmp_path / "dmon.txt", tmp_path / "o.jsonl"
    n = _dmon_log(log, 2000, 4)
    rc = main(["produce", "dcgmi", "--file", str(log), "--out", str(out), "--buffer", "500"])
    assert rc == 0, capsys.readouterr().err
    assert sum(1 for _ in out.open()) == n


def test_cli_file_producer_whose_poll_raised_exits_3_and_says_so(tmp_path, capsys, monkeypatch):
    # Before: "0 records read, 0 delivered, 0 dropped" and exit 0. (A disk error mid-read: the file
    # was there when the producer started.)
    from pipeline.cli import main
    from producers.dcgmi import DmonFileSource

    def fails(self):
        self.done = True  # read once, as the real poll is
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(DmonFileSource, "poll", fails)
    log = tmp_path / "dmon.log"
    log.write_text("#Entity   TMPTR\nID        C\nGPU 0     41\n")
    rc = main(["produce", "dcgmi", "--file", str(log), "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert rc == 3 and "LOST input: poll_errors 1" in err.splitlines()[-1]


@pytest.mark.parametrize("argv", [
    ["dcgmi", "--file"], ["ibstat", "--file"], ["nccl-tests"], ["dcgm-exporter", "--file"],
    ["torch-watchdog", "--job", "j", "--file"], ["ncclras", "--job", "j", "--file"],
])
@pytest.mark.parametrize("what", ["missing", "a directory"])
def test_cli_file_producer_given_no_file_says_so_in_one_line_and_exits_2(tmp_path, capsys, argv, what):
    # Before: dcgmi, ibstat and nccl-tests logged a traceback from their first poll and exited 3,
    # dcgm-exporter exited 3, the others 2: one answer for one mistake.
    from pipeline.cli import main

    path = tmp_path / "nope.txt" if what == "missing" else tmp_path
    rc = main(["produce", *argv, str(path), "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].endswith(f"cannot start: {path}: " + ("no such file" if what == "missing" else "not a file"))
    assert not (tmp_path / "o.jsonl").exists()              # said before anything was made


def test_cli_file_producer_with_counted_drops_exits_3(tmp_path, capsys):
    from pipeline.cli import main

    f = tmp_path / "s.prom"
    f.write_text((DATA / "dcgm_exporter_h100_8gpu_sampled.prom").read_text() + 'DCGM_FI_DEV_GPU_TEMP{gpu="²"} 1\n')
    rc = main(["produce", "dcgm-exporter", "--file", str(f), "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert rc == 3 and "LOST input: dropped.bad_label 1" in err
    assert sum(1 for _ in (tmp_path / "o.jsonl").open()) == 8


def test_cli_file_producer_whose_drops_are_no_value_exits_0(tmp_path, capsys):
    # The real T4 scrape has metrics the catalog does not know: left out by design, not lost; the
    # stock exporter's own (encoder, decoder, vGPU licence) are not even "unknown".
    from pipeline.cli import main

    out = tmp_path / "o.jsonl"
    rc = main(["produce", "dcgm-exporter", "--file", str(DATA / "dcgm_exporter_t4_full_format.prom"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0 and "dropped.unknown_metric 1" in err and "LOST" not in err
    assert len([json.loads(line) for line in out.open()]) == 2
    # The summary says what happened: before, a dozen reasons at 0 ("dropped.bad_label 0") beside
    # the one that was not, and "0 dropped" read as contradicting "dropped.unknown_metric 4".
    last = err.strip().splitlines()[-1]
    assert last == (
        "gpuwarden produce dcgm-exporter: scrapes 1, samples 21, records 2, samples_not_used 3, dropped.unknown_metric 1"
    )
    assert "2 records read, 2 delivered, 0 dropped unsent" in err


def test_nccl_tests_takes_its_file_as_the_other_file_producers_do(tmp_path, capsys):
    # Before: "--file X" was "unrecognized arguments: --file" (it took a positional only).
    from pipeline.cli import main

    src = str(DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["produce", "nccl-tests", "--file", src, "--out", str(a)]) == 0
    assert main(["produce", "nccl-tests", src, "--out", str(b)]) == 0
    assert a.read_text() and a.read_text().count("\n") == b.read_text().count("\n")
    capsys.readouterr()
    assert main(["produce", "nccl-tests", src, "--file", src, "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "give the output file once" in capsys.readouterr().err
