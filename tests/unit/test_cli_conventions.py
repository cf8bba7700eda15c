"""The command line's conventions (README "Exit status"): a user's mistake is one line on stderr
and its own exit status, never a traceback; a bug is one line and 70, its traceback with -v
(before or after the subcommand); progress only on a terminal; - for stdin and stdout."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_FINDINGS, EXIT_INPUT, EXIT_INTERNAL, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, status, says", [
    (["sim", "--scenario", "nope", "--out", "x.jsonl"], EXIT_USAGE, "unknown scenario 'nope'"),
    (["sim", "--hosts", "lots", "--out", "x.jsonl"], EXIT_USAGE, "--hosts: expected an integer >= 1, got 'lots'"),
    # A count or a span of zero is a mistake too: before, a run of nothing (exit 0) or exit 70.
    (["sim", "--hosts", "0", "--out", "x.jsonl"], EXIT_USAGE, "--hosts: expected an integer >= 1, got 0"),
    (["sim", "--interval", "0", "--out", "x.jsonl"], EXIT_USAGE, "--interval: expected a finite number > 0"),
    (["sim", "--duration", "-5", "--out", "x.jsonl"], EXIT_USAGE, "--duration: expected a finite number > 0"),
    (["replay", "x.jsonl", "--batch", "0"], EXIT_USAGE, "--batch: expected an integer >= 1, got 0"),
    (["replay", "x.jsonl", "--batch", "-1"], EXIT_USAGE, "--batch: expected an integer >= 1, got -1"),
    (["eval", "--seeds", "0"], EXIT_USAGE, "--seeds: expected an integer >= 1, got 0"),
    (["demo", "--hosts", "0"], EXIT_USAGE, "--hosts: expected an integer >= 1, got 0"),
    (["sim", "--out", "x.jsonl", "--no-such-flag"], EXIT_USAGE, "unrecognized arguments: --no-such-flag"),
    (["eval", "--scenario", "nope"], EXIT_USAGE, "unknown scenario 'nope'"),
    (["replay", "missing.jsonl"], EXIT_INPUT, "missing.jsonl: no such file"),
    (["report", "--telemetry", "t.jsonl", "--alerts", "a.jsonl", "--out", "r.html"], EXIT_INPUT, "t.jsonl: no such file"),
    (["rules", "check", "no-rules-here"], EXIT_INPUT, "no-rules-here: no such file"),
    (["rules", "alertmanager-config", "--incidents", "none.yaml"], EXIT_INPUT, "none.yaml: no such file"),
    (["serve", "--config", "missing.yaml"], EXIT_INPUT, "cannot read missing.yaml"),
    (["remediate", "--config", "missing.yaml"], EXIT_INPUT, "cannot read"),
])
def test_a_users_mistake_is_one_line_and_its_own_status(argv, status, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == status
    err = _one_line(capsys.readouterr().err)
    assert says in err and err.startswith("gpuwarden")
    assert not (tmp_path / "x.jsonl").exists()


def test_a_bug_is_one_line_and_70_and_its_traceback_with_v_after_the_subcommand(tmp_path, monkeypatch, capsys):
    import pipeline.replay

    def broken(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(pipeline.replay, "replay", broken)
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    assert main(["replay", str(rec)]) == EXIT_INTERNAL
    said, err = capsys.readouterr().err.split("\n", 1)  # replay says what it loaded first
    assert said.startswith("loaded ")
    err = _one_line(err)
    assert "internal error: ZeroDivisionError: a bug" in err and "-v" in err
    for argv in (["replay", str(rec), "-v"], ["-v", "replay", str(rec)]):
        assert main(argv) == EXIT_INTERNAL
        err = capsys.readouterr().err
        assert "Traceback" in err and "ZeroDivisionError: a bug" in err


def test_failed_checks_exit_1(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    expr: 'no such field > 1'\n")
    assert main(["rules", "check", str(bad)]) == EXIT_FINDINGS


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("gpuwarden ")


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, env=env, timeout=120, **kw)


def test_replay_reads_stdin_and_writes_alerts_to_stdout_without_progress_in_a_pipe():
    sim = _cli("sim", "--hosts", "1", "--duration", "60", "--seed", "3", "--scenario", "gpu_lost", "--out", "-")
    assert sim.returncode == 0 and sim.stdout
    rep = _cli("replay", "-", "--alerts-out", "-", input=sim.stdout)
    assert rep.returncode == 0, rep.stderr
    alerts = [json.loads(x) for x in rep.stdout.decode().splitlines()]
    assert alerts and all(a["kind"] == "alert" for a in alerts)
    assert any(a["fault"] == "gpu_fallen_off_bus" for a in alerts)
    err = rep.stderr.decode()
    assert "\x1b[" not in err and "replaying" not in err     # no progress bar in a pipe
    assert "replayed" in err


def _in_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run the CLI with stderr (and stdout) on a pseudo-terminal; what the terminal showed."""
    pid, fd = pty.fork()
    if pid == 0:   # pragma: no cover - the child
        os.execve(sys.executable, [sys.executable, "-m", "pipeline", *argv], env)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode("utf-8", "replace")


def test_progress_on_a_terminal_only_and_not_in_ci(tmp_path):
    (tmp_path / "hot.yaml").write_text(
        "rules:\n  - name: hot\n    fault: thermal_hot\n    severity: warning\n    condition: gpu_temp > 90\n"
        "    summary: hot\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "hot.yaml").write_text(
        "tests:\n  - name: hot\n    series:\n      - {host: n1, gpu: 0, values: {gpu_temp: 95x5}}\n"
        "    alerts:\n      - {at: 2s, firing: [{rule: hot, host: n1, gpu: 0}]}\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(ROOT), "TERM": "xterm"}
    argv = ["rules", "test", str(tmp_path / "tests")]
    shown = _in_a_terminal(argv, env)
    assert "rule tests: 1/1" in shown and "1 passed, 0 failed" in shown
    for quiet_env, args in (({"CI": "true"}, argv), ({}, argv + ["-q"])):
        shown = _in_a_terminal(args, env | quiet_env)
        assert "rule tests" not in shown and "1 passed, 0 failed" in shown


def test_a_long_diagnostic_is_one_line_in_a_pipe(tmp_path, monkeypatch, capsys):
    # Before: rich cut it at 80 columns, so "file:line:col ... [E102]" could not be grepped.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "x.yaml").write_text(
        "rules:\n  - name: hot_gpu_with_a_rather_long_name_for_wrapping\n    fault: thermal_hot\n"
        "    severity: warning\n    condition: gpu_temperature_which_does_not_exist_at_all > 90\n    summary: hot\n")
    (tmp_path / "r.jsonl").write_text("")
    assert main(["replay", "r.jsonl", "--rules", "rules"]) == EXIT_INPUT
    lines = capsys.readouterr().err.splitlines()
    assert any(ln.startswith("rules/x.yaml:5:16:") and ln.endswith("[E102]") for ln in lines), lines
