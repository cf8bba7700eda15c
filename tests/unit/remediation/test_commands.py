"""Commands: injection attempts never reach a program; timeouts kill the whole process group."""

from __future__ import annotations

import os
import time

import pytest

from pipeline.remediation.actions import run_command
from pipeline.remediation.safety import UnsafeValue, check_value, fill, fill_argv, valid_hostname
from tests.unit.remediation.factories import alert, config

INJECTIONS = ["n1;id", "$(id)", "`id`", "-n1", "--all", "n1 n2", "n1|id", "n1&&id", "n1\nid", "../etc", "n1>x",
              "n_1", "", "a" * 64, "n1.", ".n1", "-"]


@pytest.mark.parametrize("bad", INJECTIONS)
def test_hostnames_outside_rfc1123_are_refused(bad):
    assert not valid_hostname(bad)
    with pytest.raises(UnsafeValue):
        check_value("host", bad)


@pytest.mark.parametrize("good", ["n1", "gpu-node-007", "a1.rack3.dc.example.com", "x" * 63, "7"])
def test_rfc1123_hostnames_pass(good):
    assert check_value("host", good) == good


@pytest.mark.parametrize("name,bad", [("job", "12;id"), ("job", "-1"), ("job", "$(id)"), ("labels.pool", "a b"),
                                      ("labels.pool", "-x"), ("labels.pool", "`id`"), ("fault", "x;y"),
                                      ("gpu", -1), ("gpu", "0"), ("gpu", True)])
def test_other_values_are_checked_too(name, bad):
    with pytest.raises(UnsafeValue):
        check_value(name, bad)


def test_templates_have_no_attribute_access_and_free_text_stays_out_of_argv():
    vals = {"host": "n1", "summary": "GPU 3; rm -rf /"}
    with pytest.raises(KeyError):           # a dotted name is a variable name, never attribute access
        fill("x={host.__class__}", vals)
    with pytest.raises(UnsafeValue):
        fill_argv(["reason={summary}"], vals)
    # a value with spaces is one argument, never two (there is no shell to split it)
    assert fill_argv(["scontrol", "reason=gpuwarden {fault}"], {"fault": "hbm_x"}) == ["scontrol", "reason=gpuwarden hbm_x"]


@pytest.mark.parametrize("field", ["host", "job", "label"])
def test_injection_in_alert_fields_never_reaches_a_command(tmp_path, fakes, harness, field):
    cfg = config(tmp_path, actions={
        "drain": {"type": "slurm_drain"},
        "ckpt": {"type": "checkpoint"},
        "tag": {"type": "command", "argv": ["scontrol", "update", "nodename={host}", "comment={labels.pool}"]}},
        receivers=[{"name": "r", "actions": ["ckpt", "drain", "tag"], "stop_on_failure": False}],
        route={"receiver": "r"})
    h = harness(cfg)
    for i, bad in enumerate(["n1;id", "$(id)", "-n1", "`touch /tmp/pwned`", "n1 --all"]):
        kw = {"host": "n9", "job": "77", "labels": {"pool": "p1"}}
        if field == "host":
            kw["host"] = bad
        elif field == "job":
            kw["job"] = bad
        else:
            kw["labels"] = {"pool": bad}
        h.handle(alert(kw.pop("host"), id=f"inj-{i}", **kw))
    for argv in fakes.calls():
        assert not any(s in " ".join(argv) for s in (";", "$(", "`", " -n1", "--all"))
    refused = [r for r in h.all if r.reason and r.reason.startswith("unsafe_value")]
    assert refused and all(r.decision == "skipped" and r.argv is None for r in refused)
    if field == "host":                    # drain and tag name the host; the checkpoint only the job
        assert fakes.calls("scontrol") == []
        assert len(refused) == 5 * 2 and {r.action for r in refused} == {"drain", "tag"}
    else:
        assert len(refused) == 5 and {r.action for r in refused} == {"ckpt" if field == "job" else "tag"}


def test_timeout_kills_the_whole_process_group(fakes):
    t0 = time.monotonic()
    res = run_command(["sleeper"], timeout=1.0, kill_grace=1.0)
    assert res.timed_out and "process group killed" in res.error
    assert time.monotonic() - t0 < 10
    parent, child = map(int, (fakes.dir / "sleeper-pids").read_text().split())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in (parent, child) if _alive(p)]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, f"still running: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_command_failures_and_missing_programs_are_reported(fakes):
    assert run_command(["no-such-program-xyz"], 5).error.startswith("cannot run 'no-such-program-xyz'")
    fakes.fail("scontrol", 3)
    res = run_command(["scontrol", "ping"], 5)
    assert res.returncode == 3 and "fake failure" in res.stderr


def test_command_timeout_is_audited_as_failed(tmp_path, fakes, harness):
    h = harness(config(tmp_path, actions={"hang": {"type": "command", "argv": ["sleeper", "{host}"], "timeout": 0.5}},
                       receivers=[{"name": "r", "actions": ["hang"]}], route={"receiver": "r"}))
    out = h.handle(alert("n1"))
    assert out[0].decision == "failed" and "timed out after 0.5s" in out[0].error
    assert out[0].argv == ["sleeper", "n1"]
