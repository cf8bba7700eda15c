"""`remediate breaker status` is a pure read of an existing state file: it works on a read-only
file in a read-only directory, changes nothing, leaves no -wal/-shm/-journal beside it, answers
while the service holds a write transaction, and still sees what the running service has not
checkpointed yet. `breaker reset` still writes. The state the guardrails keep without a window
(resolutions, holds) survives the hourly prune, since a decision reads it at any age; dispatched
groups older than every route's repeat_interval do not."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.remediation.guardrails import Limits, StateStore
from tests.unit.remediation.factories import Clock, Harness, alert, config

LIMITS = Limits(max_nodes=1, max_percent=100, fleet_size=None, window=600, cooldown=60, max_attempts=3,
                attempt_window=600)
SIDECARS = ("-wal", "-shm", "-journal")


def _setup(tmp_path: Path) -> tuple[str, Path]:
    """A config in ``tmp_path`` and, in ``tmp_path/var``, a state file whose breaker is open
    (n1 acted on, n2 refused), as the service leaves it; returns (config path, state path)."""
    state = tmp_path / "var" / "state.sqlite"
    cfg = tmp_path / "remediate.yaml"
    cfg.write_text(yaml.safe_dump({
        "state_file": str(state), "actions": {"drain": {"type": "slurm_drain"}},
        "receivers": [{"name": "drain", "actions": ["drain"]}], "route": {"receiver": "drain"},
        "guardrails": {"breaker": {"max_nodes": 1, "window": "10m"}},
    }))
    s = StateStore(state)
    now = time.time()
    assert s.admit_node("n1", "drain", LIMITS, now) == (True, "")
    assert s.admit_node("n2", "drain", LIMITS, now)[0] is False
    s.close()
    return str(cfg), state


def _snapshot(state: Path) -> tuple[bytes, int, list[str]]:
    return state.read_bytes(), state.stat().st_mtime_ns, sorted(p.name for p in state.parent.iterdir())


def _status(cfg: str, capsys) -> dict:
    assert main(["remediate", "breaker", "status", "--config", cfg, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes")
def test_status_reads_a_read_only_state_file_in_a_read_only_directory(tmp_path, capsys):
    cfg, state = _setup(tmp_path)
    before = _snapshot(state)
    state.chmod(0o444)
    state.parent.chmod(0o555)
    try:
        st = _status(cfg, capsys)
        assert st["open"] is True and st["hosts_in_window"] == ["n1"] and st["state_file_exists"] is True
        assert main(["remediate", "breaker", "status", "--config", cfg, "--exit-code"]) == 1
        assert "breaker: OPEN" in capsys.readouterr().out
        assert _snapshot(state) == before
    finally:
        state.parent.chmod(0o755)
        state.chmod(0o644)


def test_status_changes_nothing_and_leaves_no_sidecar_files(tmp_path, capsys):
    cfg, state = _setup(tmp_path)
    assert not any(Path(str(state) + s).exists() for s in SIDECARS)
    before = _snapshot(state)
    st = _status(cfg, capsys)
    assert st["open"] is True and st["hosts_in_window"] == ["n1"]
    assert _snapshot(state) == before


def test_status_answers_while_the_service_holds_a_write_transaction(tmp_path, capsys):
    cfg, state = _setup(tmp_path)
    writer = sqlite3.connect(str(state), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE breaker SET reason='not committed' WHERE id=1")
        t0 = time.monotonic()
        st = _status(cfg, capsys)
        assert time.monotonic() - t0 < 5          # before: waited 30s for the write lock, then failed
        assert st["open"] is True and st["reason"] != "not committed"
        writer.execute("ROLLBACK")
    finally:
        writer.close()


def test_status_sees_what_the_running_service_has_not_checkpointed(tmp_path, capsys):
    cfg, state = _setup(tmp_path)
    service = StateStore(state)  # open, as the running service keeps it: its writes sit in the -wal
    try:
        service.reset_breaker("oncall", "fixed")
        assert service.admit_node("n3", "drain", LIMITS, time.time()) == (True, "")
        assert Path(str(state) + "-wal").stat().st_size > 0
        files = sorted(p.name for p in state.parent.iterdir())
        st = _status(cfg, capsys)
        assert st["open"] is False and st["reset_by"] == "oncall" and st["hosts_in_window"] == ["n3"]
        assert sorted(p.name for p in state.parent.iterdir()) == files
    finally:
        service.close()


def test_reset_still_writes_the_state_file(tmp_path, capsys):
    cfg, state = _setup(tmp_path)
    assert main(["remediate", "breaker", "reset", "--config", cfg, "--by", "oncall", "--note", "ok"]) == 0
    assert "breaker closed" in capsys.readouterr().out
    st = _status(cfg, capsys)
    assert st["open"] is False and st["reset_by"] == "oncall" and st["hosts_in_window"] == []


# -- what the hourly prune keeps ---------------------------------------------------------------------

YEAR = 366 * 86400.0


def test_a_firing_delivered_long_after_its_resolve_is_still_skipped_after_pruning(tmp_path, fakes):
    h = Harness(config(tmp_path), clock=Clock())
    try:
        h.handle(alert("n1", id="late-1", state="resolved"))
        h.clock.t += YEAR
        h.rem.tick()  # prunes: the resolution must outlive it (a replay from the topic's start)
        out = h.handle(alert("n1", id="late-1"))
        assert [r.decision for r in out] == ["skipped"] and out[0].reason.startswith("resolved:")
        assert fakes.calls("scontrol") == []
    finally:
        h.close()


def test_a_hold_outlives_the_prune_so_another_alerts_undo_leaves_the_node_out(tmp_path, fakes):
    cfg = config(tmp_path, actions={"drain": {"type": "slurm_drain"}, "resume": {"type": "slurm_resume"}},
                 receivers=[{"name": "drain", "actions": ["drain"], "on_resolved": ["resume"]}])
    h = Harness(cfg, clock=Clock())
    try:
        assert [r.decision for r in h.handle(alert("n1", gpu=0, id="a"))] == ["acted"]
        h.handle(alert("n1", gpu=1, id="b"))  # cooldown skips the second drain; it holds n1 all the same
        h.clock.t += YEAR
        h.rem.tick()
        out = h.handle(alert("n1", gpu=0, id="a", state="resolved"))
        assert [r.decision for r in out] == ["skipped"] and "stays out while alert(s) b" in out[0].reason
    finally:
        h.close()


def test_dispatched_groups_older_than_every_repeat_interval_are_pruned(tmp_path, fakes):
    cfg = config(tmp_path, route={"receiver": "drain", "group_by": ["host"], "group_wait": "30s",
                                  "repeat_interval": "1h", "routes": [
                                      {"name": "slow", "matchers": ['fault="hbm_x"'], "receiver": "drain",
                                       "repeat_interval": "4h"}]})
    h = Harness(cfg, clock=Clock())
    try:
        h.handle(alert("n1", id="g1"))
        h.clock.t += 31
        assert h.rem.tick() == 1
        h.clock.t += 2 * 3600  # past the default route's 1h, within the other route's 4h: kept
        h.rem.tick()
        rows = h.store.db.execute("SELECT COUNT(*) FROM groups").fetchone()[0]
        assert rows == 1
        h.clock.t += 3 * 3600  # past every route's repeat_interval: it can no longer skip an alert
        h.rem.tick()
        assert h.store.db.execute("SELECT COUNT(*) FROM groups").fetchone()[0] == 0
        # and the group's next alert is decided as it would have been with the row there
        assert [r.decision for r in h.handle(alert("n1", id="g2"))] == ["queued"]
    finally:
        h.close()
