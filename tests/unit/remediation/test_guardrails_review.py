"""Guardrails under what an alert stream really does: alerts that resolve before their group acts,
a firing delivered after its resolution, a wall clock stepped back after a breaker reset, node
actions on alerts without a host, undos while another alert still wants the node out, and a hook
that exits but leaves a descendant holding its output."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.remediation.actions import CommandResult, run_command
from tests.factories import fuzz_examples
from tests.unit.remediation.factories import Harness, alert, config


def _grouped(tmp_path):
    return config(tmp_path, route={"receiver": "drain", "group_by": ["host"], "group_wait": "30s"})


def test_an_alert_that_resolves_during_group_wait_is_not_acted_on(tmp_path, fakes, harness):
    h = harness(_grouped(tmp_path))
    assert [r.decision for r in h.handle(alert("n1", id="flap"))] == ["queued"]
    h.handle(alert("n1", id="flap", state="resolved"))
    h.clock.t += 31
    h.rem.tick()
    assert fakes.updates() == []
    last = h.audit.records[-1]
    assert last.decision == "skipped" and last.reason.startswith("resolved:") and last.alert_id == "flap"


def test_a_group_whose_first_alert_resolved_acts_on_one_still_firing(tmp_path, fakes, harness):
    h = harness(_grouped(tmp_path))
    h.handle(alert("n1", gpu=0, id="g0"))
    h.handle(alert("n1", gpu=1, id="g1"))  # joins the group: skipped, grouped
    h.handle(alert("n1", gpu=0, id="g0", state="resolved"))
    h.restart()  # the members are in the state file
    h.clock.t += 31
    assert h.rem.tick() == 1
    assert len(fakes.updates()) == 1 and fakes.updates()[0][-1].endswith(" alert g1")
    assert h.audit.records[-1].decision == "acted" and h.audit.records[-1].alert_id == "g1"


def test_a_firing_delivered_after_its_resolution_is_not_acted_on(tmp_path, fakes, harness):
    h = harness(config(tmp_path))
    h.handle(alert("n1", id="late", state="resolved"))
    h.restart()
    out = h.handle(alert("n1", id="late"))
    assert [r.decision for r in out] == ["skipped"] and out[0].reason.startswith("resolved: alert late")
    assert fakes.calls() == []


def test_a_breaker_reset_counts_the_nodes_after_it_when_the_clock_steps_back(tmp_path, fakes, harness):
    h = harness(config(tmp_path, guardrails={"breaker": {"max_nodes": 2, "window": "10m"}}))
    h.store.reset_breaker("oncall", "bad rule fixed", now=h.clock.t)
    h.clock.t -= 3600  # NTP steps the clock back an hour
    for i in range(6):
        h.clock.t += 1
        h.handle(alert(f"n{i}"))
    assert len(fakes.updates()) == 2
    assert len(h.decisions("blocked")) == 4


def test_a_breaker_reset_still_forgets_the_nodes_before_it(tmp_path, fakes, harness):
    h = harness(config(tmp_path, guardrails={"breaker": {"max_nodes": 2, "window": "10m"}}))
    for i in range(3):
        h.handle(alert(f"a{i}"))
    assert h.store.breaker(600, h.clock.t).open
    h.store.reset_breaker("oncall", "ok", now=h.clock.t)
    h.clock.t += 1
    assert [r.decision for r in h.handle(alert("b0"))] == ["acted"]
    assert h.store.breaker(600, h.clock.t).hosts_in_window == ["b0"]


_STEPS = st.lists(
    st.tuples(st.sampled_from(["alert", "reset"]), st.integers(0, 11), st.integers(-3600, 60)), max_size=25
)


@settings(max_examples=fuzz_examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
def test_between_two_resets_at_most_max_nodes_are_drained_whatever_the_clock_does(steps):
    """A reference: every node acted on after the last reset counts, whatever the wall clock
    said (all of it happens well within the breaker's day-long window)."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cfg = config(
            tmp,
            guardrails={"breaker": {"max_nodes": 3, "window": "1d"}},
            actions={"drain": {"type": "command", "argv": ["true", "{host}"]}},
        )
        h = Harness(cfg)
        try:
            since_reset: set[str] = set()
            for i, (kind, host, step) in enumerate(steps):
                h.clock.t += step
                if kind == "reset":
                    h.store.reset_breaker("prop", "", now=h.clock.t)
                    since_reset = set()
                    continue
                out = h.handle(alert(f"n{host}", id=f"a{i}"))
                since_reset |= {f"n{host}" for r in out if r.decision == "acted"}
                assert len(since_reset) <= 3
        finally:
            h.close()


def test_a_node_action_on_an_alert_without_a_host_is_not_run(tmp_path, fakes, harness):
    # The breaker counts nodes: an action it counts cannot run where there is no node to count.
    h = harness(
        config(
            tmp_path,
            guardrails={"breaker": {"max_nodes": 1}},
            actions={"c": {"type": "command", "argv": ["scontrol", "notify", "{job}"]}},
            receivers=[{"name": "r", "actions": ["c"]}],
            route={"receiver": "r"},
        )
    )
    for i in range(4):
        out = h.handle(alert(None, None, id=f"j{i}", job="42"))
        assert [r.decision for r in out] == ["skipped"] and out[0].reason.startswith("missing_value: alert has no host")
    assert fakes.calls() == []


def _fatal_and_flaky(tmp_path, **route):
    return config(
        tmp_path,
        actions={"drain": {"type": "slurm_drain"}, "resume": {"type": "slurm_resume"}},
        receivers=[
            {"name": "fatal", "actions": ["drain"]},
            {"name": "flaky", "actions": ["drain"], "on_resolved": ["resume"]},
        ],
        route={"receiver": "fatal", **route, "routes": [{"matchers": ['family="nvlink"'], "receiver": "flaky"}]},
    )


def _resumes(fakes) -> list[list[str]]:
    return [c for c in fakes.updates() if "state=resume" in c]


def test_an_undo_leaves_a_node_out_while_another_alert_that_took_it_out_fires(tmp_path, fakes, harness):
    h = harness(_fatal_and_flaky(tmp_path))
    assert h.handle(alert("n1", id="hbm"))[0].decision == "acted"  # drained for the HBM fault
    h.handle(alert("n1", id="nvl", fault="nvlink_crc_errors"))  # cooldown: already out
    out = h.handle(alert("n1", id="nvl", fault="nvlink_crc_errors", state="resolved"))
    assert [r.decision for r in out] == ["skipped"] and out[0].reason.startswith("undo:") and "hbm" in out[0].reason
    assert _resumes(fakes) == []


def test_an_undo_waits_for_an_alert_that_came_after_the_drain(tmp_path, fakes, harness):
    h = harness(_fatal_and_flaky(tmp_path))
    assert h.handle(alert("n1", id="nvl", fault="nvlink_crc_errors"))[0].decision == "acted"
    h.clock.t += 60
    assert h.handle(alert("n1", id="hbm"))[0].decision == "skipped"  # already drained: left alone
    h.restart()
    h.handle(alert("n1", id="nvl", fault="nvlink_crc_errors", state="resolved"))
    assert _resumes(fakes) == []


def test_a_grouped_node_is_resumed_when_its_last_alert_resolves(tmp_path, fakes, harness):
    h = harness(
        config(
            tmp_path,
            actions={"drain": {"type": "slurm_drain"}, "resume": {"type": "slurm_resume"}},
            receivers=[{"name": "r", "actions": ["drain"], "on_resolved": ["resume"]}],
            route={"receiver": "r", "group_by": ["host"], "group_wait": "30s"},
        )
    )
    h.handle(alert("n1", gpu=0, id="g0"))
    h.handle(alert("n1", gpu=1, id="g1"))
    h.clock.t += 31
    assert h.rem.tick() == 1
    h.handle(alert("n1", gpu=0, id="g0", state="resolved"))
    assert _resumes(fakes) == []  # GPU 1 still fires
    out = h.handle(alert("n1", gpu=1, id="g1", state="resolved"))
    assert [r.decision for r in out] == ["acted"] and _resumes(fakes) == [["update", "nodename=n1", "state=resume"]]


_ESCAPING_HOOK = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
print("drained")
"""


def _run_escaping_hook(tmp_path, then: str = "") -> tuple[CommandResult, float]:
    """``_ESCAPING_HOOK`` (then ``then``) run with a 1 s timeout: its result and the seconds it took."""
    script, pidfile = tmp_path / "hook.py", tmp_path / "child.pid"
    script.write_text(_ESCAPING_HOOK + then)
    t0 = time.monotonic()
    try:
        res = run_command([sys.executable, str(script), str(pidfile)], timeout=1.0, kill_grace=0.5)
        return res, time.monotonic() - t0
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_hook_that_exits_leaving_a_descendant_with_its_output_is_not_waited_for(tmp_path):
    # The descendant left the hook's process group (setsid, a daemon): it keeps the pipes open.
    res, took = _run_escaping_hook(tmp_path)
    assert took < 10
    assert res.returncode == 0 and not res.timed_out and res.error is None
    assert res.stdout == "drained\n"


def test_a_waiting_group_whose_route_no_longer_matches_is_audited_not_raised(tmp_path, fakes):
    routed = {
        "receiver": "drain",
        "routes": [
            {
                "name": "n1-only",
                "matchers": ['host="n1"'],
                "receiver": "drain",
                "group_by": ["host"],
                "group_wait": "30s",
            }
        ],
    }
    h = Harness(config(tmp_path, route=routed))
    assert [r.decision for r in h.handle(alert("n1"))] == ["queued"]
    h.close()
    routed["routes"][0]["matchers"] = ['host="n2"']  # the config changed while the group waited
    h = Harness(config(tmp_path, route=routed), clock=h.clock)
    try:
        h.clock.t += 31
        assert h.rem.tick() == 0
        last = h.audit.records[-1]
        assert last.decision == "skipped" and last.route == "route.routes[0]" and "no longer matches" in last.reason
        assert fakes.updates() == []
    finally:
        h.close()


def test_a_hook_that_hangs_with_such_a_descendant_times_out_within_its_grace(tmp_path):
    res, took = _run_escaping_hook(tmp_path, "import time; time.sleep(60)\n")
    assert took < 10
    assert res.timed_out and "timed out after 1s" in (res.error or "")
    assert res.stdout == "drained\n"
