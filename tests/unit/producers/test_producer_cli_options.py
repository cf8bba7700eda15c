"""``gpuwarden produce``'s option values: a value that can never work (a zero or negative count,
interval or timeout, NaN, a port past 65535, a URL that is not http(s)) is a usage error, exit 2,
one line naming the option, before anything starts; the options each producer documents apply in
every mode it has; and nccl-tests says when no collective could be named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.factories import SHARED_DATA as DATA

URL = "http://127.0.0.1:1/metrics"  # refused at once: a poll costs nothing


def _nccl_log(tmp_path: Path) -> str:
    f = tmp_path / "nccl.log"
    f.write_text((DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt").read_text())
    return str(f)


def _pci_map(tmp_path: Path) -> str:
    f = tmp_path / "pci.csv"
    f.write_text("index, pci.bus_id\n0, 00000000:18:00.0\n")
    return str(f)


def _inspector_dir(tmp_path: Path) -> str:
    d = tmp_path / "insp"
    d.mkdir(exist_ok=True)
    (d / "node-a-pid1.jsonl").write_text((DATA / "nccl_inspector_sample.jsonl").read_text())
    return str(d)


EXPORTER = ["produce", "dcgm-exporter", "--url", URL, "--count", "1"]
BAD_VALUES = [
    (lambda t: EXPORTER + ["--interval", "-1"], "--interval"),
    (lambda t: EXPORTER + ["--interval", "nan"], "--interval"),
    (lambda t: EXPORTER + ["--interval", "inf"], "--interval"),
    (lambda t: EXPORTER + ["--count", "0"], "--count"),
    (lambda t: EXPORTER + ["--count", "-5"], "--count"),
    (lambda t: EXPORTER + ["--send-timeout", "0"], "--send-timeout"),
    (lambda t: EXPORTER + ["--send-timeout", "nan"], "--send-timeout"),
    (lambda t: EXPORTER + ["--timeout", "-1"], "--timeout"),
    (lambda t: EXPORTER + ["--timeout", "0"], "--timeout"),
    (lambda t: EXPORTER + ["--metrics-port", "99999"], "--metrics-port"),
    (lambda t: EXPORTER + ["--metrics-port", "-1"], "--metrics-port"),
    (lambda t: ["produce", "dcgm-exporter", "--url", "ftp://x/metrics", "--count", "1"], "--url"),
    (lambda t: ["produce", "dcgm-exporter", "--url", "http:///metrics", "--count", "1"], "--url"),
    (lambda t: ["produce", "nccl-tests", _nccl_log(t), "--interval", "nan"], "--interval"),
    (lambda t: ["produce", "nccl-tests", _nccl_log(t), "--metrics-port", "65536"], "--metrics-port"),
    (lambda t: ["produce", "torch-watchdog", "--file", _nccl_log(t), "--job", "1", "--gpus-per-node", "0"],
     "--gpus-per-node"),
    (lambda t: ["produce", "nccl-inspector", _inspector_dir(t), "--count", "1", "--gpus-per-node", "-1"],
     "--gpus-per-node"),
    (lambda t: ["produce", "kmsg", "--file", _nccl_log(t), "--pci-map", _pci_map(t), "--boot-time", "nan"],
     "--boot-time"),
]


@pytest.mark.parametrize("make,option", BAD_VALUES)
def test_a_value_that_can_never_work_is_a_usage_error_naming_the_option(tmp_path, capsys, make, option):
    out = tmp_path / "o.jsonl"
    rc = main([*make(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and f"argument {option}:" in err[0], err
    assert not out.exists()  # refused before anything started


def test_interval_0_on_a_live_source_without_count_is_refused_not_a_tight_loop(tmp_path):
    # A subprocess with a deadline: before the fix this polled without pause until killed.
    out = tmp_path / "o.jsonl"
    code = "import sys; from pipeline.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["produce", "dcgm-exporter", "--url", URL, "--interval", "0", "--out", str(out)]
    try:
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("--interval 0 polled without end")
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "--interval 0" in err[0], p.stderr
    assert not out.exists()


def test_interval_0_still_serves_a_bounded_run(tmp_path, capsys):
    # --count (or a file read to its end) ends the run: back-to-back polls are the user's choice.
    out = tmp_path / "o.jsonl"
    assert main(["produce", "dcgm-exporter", "--url", URL, "--interval", "0", "--count", "2", "--out", str(out)]) == 0
    assert "scrapes 2" in capsys.readouterr().err
    assert main(["produce", "nccl-tests", _nccl_log(tmp_path), "--interval", "0", "--out", str(out)]) == 0


def test_a_saved_dmon_log_needs_the_interval_its_rounds_were_taken_at(tmp_path, capsys):
    log = tmp_path / "dmon.txt"
    log.write_text("#Entity   POWER\nID        W\nGPU 0     60.5\nGPU 0     61.0\n")
    rc = main(["produce", "dcgmi", "--file", str(log), "--interval", "0", "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--interval" in err[0], err


@pytest.mark.parametrize("fields", ["-5,0", "155,99999999999999999999"])
def test_dcgmi_field_ids_outside_dcgms_range_are_a_usage_error(tmp_path, capsys, fields):
    out = tmp_path / "o.jsonl"
    rc = main(["produce", "dcgmi", f"--fields={fields}", "--dcgmi", "/bin/echo", "--no-probe", "--count", "1",
               "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--fields" in err[0], err
    assert not out.exists()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_inspector_json_mode_takes_host_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    rc = main(["produce", "nccl-inspector", _inspector_dir(tmp_path), "--host", "node-x", "--job", "j1",
               "--count", "1", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    recs = _records(out)
    assert recs and {(r["host"], r["job"]) for r in recs} == {("node-x", "j1")}


# inspector_prom.cc at v2.29.7-1: a rank label, and gpu_device_id the process's CUDA device number.
def _prom_229(rank: int) -> str:
    return "".join(
        f'{m}{{comm_id="0x5a1e",hostname="node-b",rank="{rank}",slurm_job="train",slurm_job_id="unknown",'
        f'nranks="16",n_nodes="2",gpu_device_id="GPU0",collective="AllReduce",coll_sn="17",'
        f'timestamp="2025-10-17T03:31:47Z",message_size="2.00GB"}} {v}\n'
        for m, v in (("nccl_bus_bandwidth_gbs", 15.75), ("nccl_collective_exec_time_microseconds", 238609))
    )


def _prom_dir(tmp_path):
    """A --prom folder of two ranks' files (ranks 9 and 2), each naming its GPU GPU0."""
    d = tmp_path / "prom"
    d.mkdir()
    (d / "nccl_inspector_metrics_GPU-aaaa.prom").write_text(_prom_229(9))
    (d / "nccl_inspector_metrics_GPU-bbbb.prom").write_text(_prom_229(2))
    return d


def test_inspector_prom_mode_takes_job_host_and_gpus_per_node(tmp_path, capsys):
    # A Slurm task per GPU: every file says GPU0, so only --gpus-per-node can name each rank's GPU.
    d = _prom_dir(tmp_path)
    out = tmp_path / "o.jsonl"
    rc = main(["produce", "nccl-inspector", "--prom", str(d), "--job", "j1", "--host", "node-x",
               "--gpus-per-node", "8", "--count", "1", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    got = sorted((r["rank"], r["gpu"], r["job"], r["host"]) for r in _records(out))
    assert got == [(2, 2, "j1", "node-x"), (9, 1, "j1", "node-x")]


def test_inspector_prom_mode_without_gpus_per_node_still_names_no_gpu(tmp_path, capsys):
    d = _prom_dir(tmp_path)
    out = tmp_path / "o.jsonl"
    assert main(["produce", "nccl-inspector", "--prom", str(d), "--count", "1", "--out", str(out)]) == 0
    assert {(r["gpu"], r["job"], r["host"]) for r in _records(out)} == {(None, None, "node-b")}


def test_nccl_tests_says_when_no_collective_is_named(tmp_path, capsys, caplog):
    # The burn-in recipe with a real log: no start line, no *_perf command, a file name of no collective.
    log = tmp_path / "run.log"
    log.write_text((DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt").read_text())
    out = tmp_path / "o.jsonl"
    assert main(["produce", "nccl-tests", str(log), "--out", str(out)]) == 0
    assert {r["coll"] for r in _records(out)} == {"unknown"}
    assert "coll_unknown_runs 1" in capsys.readouterr().err
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any('coll "unknown"' in m and "--coll" in m for m in warned), warned


def test_nccl_tests_named_collective_gives_no_such_warning(tmp_path, capsys, caplog):
    log = tmp_path / "run.log"
    log.write_text((DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt").read_text())
    out = tmp_path / "o.jsonl"
    assert main(["produce", "nccl-tests", str(log), "--coll", "AllReduce", "--out", str(out)]) == 0
    assert "coll_unknown_runs" not in capsys.readouterr().err
    assert not any('coll "unknown"' in r.getMessage() for r in caplog.records)


def test_a_broker_that_is_down_costs_the_sender_s_lines_not_kafka_python_s(tmp_path):
    # Found by an audit: 87 kafka-python ERROR/WARNING lines in 13 s before the one-line verdict
    # (README: every error is one line). The sender's own warnings say what happens. A process
    # of its own: the logging set-up is the command's, as an operator sees it.
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    f = tmp_path / "dmon.txt"
    f.write_text("#Entity   GPUTL  TMPTR\nID\nGPU 0     10     45\n")
    cmd = [sys.executable, "-m", "pipeline", "produce", "dcgmi", "--file", str(f), "--kafka", f"127.0.0.1:{free}",
           "--send-timeout", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "LOST input: undelivered 1 (exit 3)" in done.stderr
    assert " kafka." not in done.stderr, done.stderr
