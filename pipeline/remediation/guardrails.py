"""Guardrails and their persistent state (SQLite from the standard library, one small file).

- **Once per alert id**: a decision is claimed (alert id, state, route) *before* anything runs.
  A crash between claiming and acting loses that action rather than repeating it: for a drain or
  a GPU reset, at most once is the safe side.
- **Circuit breaker**: opens when acting on one more node would make more than ``max_nodes``
  nodes, or more than ``max_percent`` of ``fleet_size``, acted on within ``window``. While open
  every disruptive action is blocked. It is stored, so it survives restarts, and only
  ``gpuwarden remediate breaker reset`` (a human) closes it; nodes acted on before the reset no
  longer count.
- **Cooldown and attempt cap** per entity and action: a node drained an hour ago is not drained
  again; a reset that keeps failing is not retried forever (NVSentinel's reset loops).
- **Ownership**: nodes gpuwarden itself took out are recorded, so an undo (uncordon, resume)
  only ever touches those; a firing alert whose route takes a node out holds it, so one alert's
  undo leaves the node out while another still fires.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import StateError

SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (alert_id TEXT NOT NULL, state TEXT NOT NULL, route TEXT NOT NULL,
    claimed_at REAL NOT NULL, outcome TEXT, PRIMARY KEY (alert_id, state, route));
CREATE TABLE IF NOT EXISTS attempts (entity TEXT NOT NULL, action TEXT NOT NULL, ts REAL NOT NULL, ok INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS attempts_by_entity ON attempts (entity, action, ts);
CREATE TABLE IF NOT EXISTS node_actions (host TEXT NOT NULL, action TEXT NOT NULL, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS owned (host TEXT NOT NULL, action TEXT NOT NULL, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS breaker (id INTEGER PRIMARY KEY CHECK (id = 1), open INTEGER NOT NULL,
    opened_at REAL, reason TEXT, reset_at REAL, reset_by TEXT, reset_note TEXT);
CREATE TABLE IF NOT EXISTS groups (group_key TEXT PRIMARY KEY, route TEXT NOT NULL, opened_at REAL NOT NULL,
    due REAL NOT NULL, dispatched_at REAL, alert BLOB);
CREATE TABLE IF NOT EXISTS group_members (group_key TEXT NOT NULL, alert_id TEXT NOT NULL, alert BLOB NOT NULL,
    PRIMARY KEY (group_key, alert_id));
CREATE TABLE IF NOT EXISTS resolved (alert_id TEXT PRIMARY KEY, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS holds (host TEXT NOT NULL, alert_id TEXT NOT NULL, PRIMARY KEY (host, alert_id));
CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ns, key));
INSERT OR IGNORE INTO breaker (id, open) VALUES (1, 0);
"""


@dataclass
class BreakerState:
    open: bool
    opened_at: float | None
    reason: str | None
    reset_at: float | None
    reset_by: str | None
    reset_note: str | None
    hosts_in_window: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "opened_at": self.opened_at,
            "reason": self.reason,
            "reset_at": self.reset_at,
            "reset_by": self.reset_by,
            "reset_note": self.reset_note,
            "hosts_in_window": self.hosts_in_window,
        }


@dataclass
class Limits:
    max_nodes: int
    max_percent: float
    fleet_size: int | None
    window: float
    cooldown: float
    max_attempts: int
    attempt_window: float


class StateStore:
    """The guardrails' memory. Every method is one short transaction, so a crash leaves it consistent."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        """Open (creating it, unless ``read_only``) the state file at ``path``.

        ``read_only``: the file must exist, and nothing is written to it or created beside it (no
        schema, no WAL switch, no -wal/-shm/-journal of its own), so it opens on a read-only file
        in a read-only directory; only the reading methods may be called (``read_breaker``).
        """
        self.path = Path(path)
        self._lock_fd: int | None = None
        if read_only:
            self.db = _connect_read_only(self.path)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # One thread at a time uses it, but not always the one that built it (the service is
            # built, then run in a worker thread).
            self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as e:
            raise StateError(f"remediation state {self.path} is unusable: {e}") from e

    # -- one active instance -----------------------------------------------------------------

    def lock(self) -> None:
        """Hold an exclusive lock for the service's lifetime: fleet-wide limits need one instance."""
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(f"another remediation instance holds {self.path}.lock; only one may run") from None
        self._lock_fd = fd

    def close(self) -> None:
        self.db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- once per alert id ---------------------------------------------------------------------

    def claim(self, alert_id: str, state: str, route: str, now: float) -> bool:
        """True when this (alert, state, route) was never decided before; it is now claimed."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO claims (alert_id, state, route, claimed_at) VALUES (?, ?, ?, ?)",
            (alert_id, state, route, now),
        )
        return cur.rowcount == 1

    def claimed(self, alert_id: str, state: str, route: str) -> tuple[float, str | None] | None:
        row = self.db.execute(
            "SELECT claimed_at, outcome FROM claims WHERE alert_id=? AND state=? AND route=?", (alert_id, state, route)
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def finish(self, alert_id: str, state: str, route: str, outcome: str) -> None:
        self.db.execute(
            "UPDATE claims SET outcome=? WHERE alert_id=? AND state=? AND route=?", (outcome, alert_id, state, route)
        )

    # -- cooldown and attempts ------------------------------------------------------------------

    def last_success(self, entity: str, action: str) -> float | None:
        row = self.db.execute(
            "SELECT MAX(ts) FROM attempts WHERE entity=? AND action=? AND ok=1", (entity, action)
        ).fetchone()
        return row[0]

    def attempts_since(self, entity: str, action: str, since: float) -> int:
        return self.db.execute(
            "SELECT COUNT(*) FROM attempts WHERE entity=? AND action=? AND ts>=?", (entity, action, since)
        ).fetchone()[0]

    def record_attempt(self, entity: str, action: str, now: float, ok: bool) -> None:
        self.db.execute(
            "INSERT INTO attempts (entity, action, ts, ok) VALUES (?, ?, ?, ?)", (entity, action, now, int(ok))
        )

    # -- ownership (for undo) -------------------------------------------------------------------

    def record_owned(self, host: str, action: str, now: float) -> None:
        self.db.execute("INSERT INTO owned (host, action, ts) VALUES (?, ?, ?)", (host, action, now))

    def owns(self, host: str) -> bool:
        return self.db.execute("SELECT 1 FROM owned WHERE host=? LIMIT 1", (host,)).fetchone() is not None

    def release(self, host: str) -> None:
        self.db.execute("DELETE FROM owned WHERE host=?", (host,))

    def hold(self, host: str, alert_id: str) -> None:
        """``alert_id`` fires and wants ``host`` out: an undo for another alert leaves it out."""
        self.db.execute("INSERT OR IGNORE INTO holds (host, alert_id) VALUES (?, ?)", (host, alert_id))

    def holders(self, host: str, but: str) -> list[str]:
        """The alerts other than ``but`` that still hold ``host`` (see ``hold``)."""
        return [
            a
            for (a,) in self.db.execute(
                "SELECT alert_id FROM holds WHERE host=? AND alert_id<>? ORDER BY alert_id", (host, but)
            )
        ]

    def unhold(self, alert_id: str) -> None:
        """``alert_id`` (an incident's id in incident mode) no longer holds any node."""
        self.db.execute("DELETE FROM holds WHERE alert_id=?", (alert_id,))

    # -- resolutions -----------------------------------------------------------------------------

    def record_resolved(self, alert_id: str, now: float) -> None:
        """``alert_id`` resolved: its holds end, and a firing of it that comes later is stale."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT OR IGNORE INTO resolved (alert_id, ts) VALUES (?, ?)", (alert_id, now))
            self.db.execute("DELETE FROM holds WHERE alert_id=?", (alert_id,))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def resolved_at(self, alert_id: str) -> float | None:
        row = self.db.execute("SELECT ts FROM resolved WHERE alert_id=?", (alert_id,)).fetchone()
        return None if row is None else row[0]

    # -- circuit breaker ------------------------------------------------------------------------

    def breaker(self, window: float, now: float | None = None) -> BreakerState:
        now = time.time() if now is None else now
        row = self.db.execute(
            "SELECT open, opened_at, reason, reset_at, reset_by, reset_note FROM breaker WHERE id=1"
        ).fetchone()
        # Not from reset_at: the reset deleted the counts before it (reset_breaker says why).
        since = now - window
        hosts = [
            h for (h,) in self.db.execute("SELECT DISTINCT host FROM node_actions WHERE ts>=? ORDER BY host", (since,))
        ]
        return BreakerState(bool(row[0]), row[1], row[2], row[3], row[4], row[5], hosts)

    def admit_node(self, host: str, action: str, limits: Limits, now: float) -> tuple[bool, str]:
        """Count ``host`` as acted on unless that would trip the breaker (then open it).

        Returns (allowed, why). One IMMEDIATE transaction, so a second process (the CLI resetting
        the breaker) never sees half of it.
        """
        self.db.execute("BEGIN IMMEDIATE")
        try:
            st = self.breaker(limits.window, now)
            if st.open:
                self.db.execute("COMMIT")
                return False, f"circuit breaker open since {iso_time(st.opened_at)}: {st.reason}"
            hosts = set(st.hosts_in_window)
            if host not in hosts:
                n = len(hosts) + 1
                why = None
                if n > limits.max_nodes:
                    why = f"acting on {host} would make {n} nodes within {limits.window:g}s (limit {limits.max_nodes})"
                elif limits.fleet_size and n * 100.0 / limits.fleet_size > limits.max_percent:
                    why = (
                        f"acting on {host} would make {n} of {limits.fleet_size} nodes "
                        f"({n * 100.0 / limits.fleet_size:.1f}%) within {limits.window:g}s "
                        f"(limit {limits.max_percent:g}%)"
                    )
                if why:
                    self.db.execute("UPDATE breaker SET open=1, opened_at=?, reason=? WHERE id=1", (now, why))
                    self.db.execute("COMMIT")
                    return False, f"circuit breaker opened: {why}"
            self.db.execute("INSERT INTO node_actions (host, action, ts) VALUES (?, ?, ?)", (host, action, now))
            self.db.execute("COMMIT")
            return True, ""
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def breaker_is_open(self) -> tuple[bool, str]:
        row = self.db.execute("SELECT open, opened_at, reason FROM breaker WHERE id=1").fetchone()
        return bool(row[0]), f"circuit breaker open since {iso_time(row[1])}: {row[2]}" if row[0] else ""

    def reset_breaker(self, by: str, note: str, now: float | None = None) -> bool:
        """Close the breaker (a human's decision); nodes acted on before now stop counting.

        Returns whether it was open.
        """
        now = time.time() if now is None else now
        self.db.execute("BEGIN IMMEDIATE")
        try:
            was_open, _ = self.breaker_is_open()
            self.db.execute(
                "UPDATE breaker SET open=0, reset_at=?, reset_by=?, reset_note=? WHERE id=1", (now, by, note)
            )
            # Deleted, not filtered by the reset's time: a clock stepped back after the reset would
            # hide the nodes acted on since, and one acted on in the reset's instant would count.
            self.db.execute("DELETE FROM node_actions")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return was_open

    def prune(self, before: float) -> int:
        """Forget attempts and breaker counts older than ``before``. Returns the rows removed.

        Claims, resolutions and holds are kept: a decision reads them at any age (a claim or a
        resolution recognises an old alert delivered again; a hold lasts until its alert resolves).
        """
        n = self.db.execute("DELETE FROM attempts WHERE ts<?", (before,)).rowcount
        return n + self.db.execute("DELETE FROM node_actions WHERE ts<?", (before,)).rowcount

    def prune_groups(self, before: float) -> int:
        """Forget groups dispatched before ``before`` (give the longest ``repeat_interval`` ago: an
        older one decides as no group would). Groups still waiting are kept. Returns the rows removed."""
        # Members go at dispatch (mark_dispatched), so only those a crash left behind remain to drop.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            gone = self.db.execute(
                "DELETE FROM groups WHERE dispatched_at IS NOT NULL AND dispatched_at<?", (before,)
            ).rowcount
            self.db.execute("DELETE FROM group_members WHERE group_key NOT IN (SELECT group_key FROM groups)")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return gone

    # -- groups (group_wait, repeat_interval) ----------------------------------------------------

    def group(self, key: str) -> tuple[float, float, float | None, bytes | None] | None:
        row = self.db.execute(
            "SELECT opened_at, due, dispatched_at, alert FROM groups WHERE group_key=?", (key,)
        ).fetchone()
        return None if row is None else (row[0], row[1], row[2], row[3])

    def open_group(self, key: str, route: str, now: float, due: float, alert: bytes) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO groups (group_key, route, opened_at, due, dispatched_at, alert) "
            "VALUES (?, ?, ?, ?, NULL, ?)",
            (key, route, now, due, alert),
        )

    def due_groups(self, now: float) -> list[tuple[str, str, bytes]]:
        return [
            (k, r, a)
            for k, r, a in self.db.execute(
                "SELECT group_key, route, alert FROM groups WHERE dispatched_at IS NULL AND due<=? ORDER BY due", (now,)
            )
        ]

    def mark_dispatched(self, key: str, now: float) -> None:
        self.db.execute("UPDATE groups SET dispatched_at=?, alert=NULL WHERE group_key=?", (now, key))
        self.db.execute("DELETE FROM group_members WHERE group_key=?", (key,))

    def add_member(self, key: str, alert_id: str, alert: bytes) -> None:
        """An alert that joined a waiting group: the group acts on it if the first one resolves."""
        self.db.execute(
            "INSERT OR IGNORE INTO group_members (group_key, alert_id, alert) VALUES (?, ?, ?)", (key, alert_id, alert)
        )

    def members(self, key: str) -> list[bytes]:
        rows = self.db.execute("SELECT alert FROM group_members WHERE group_key=? ORDER BY rowid", (key,))
        return [bytes(a) for (a,) in rows]

    # -- small keyed state of actions (the alerts firing in Alertmanager) ------------------------

    def kv_put(self, ns: str, key: str, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)", (ns, key, value))

    def kv_delete(self, ns: str, key: str) -> None:
        self.db.execute("DELETE FROM kv WHERE ns=? AND key=?", (ns, key))

    def kv_get(self, ns: str, key: str) -> bytes | None:
        row = self.db.execute("SELECT value FROM kv WHERE ns=? AND key=?", (ns, key)).fetchone()
        return None if row is None else bytes(row[0])

    def kv_all(self, ns: str) -> list[tuple[str, bytes]]:
        return [(k, bytes(v)) for k, v in self.db.execute("SELECT key, value FROM kv WHERE ns=? ORDER BY key", (ns,))]


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` that never writes to it nor creates a file beside it."""
    if not path.is_file():
        raise StateError(f"remediation state {path} does not exist")
    # A -wal (the service running, or stopped uncleanly) holds commits the main file lacks yet: read
    # through it and its -shm; without one the main file is all of it, and ``immutable`` makes
    # SQLite open no -shm (it could not create one in a read-only directory) and take no lock.
    live = any(Path(str(path) + s).exists() for s in ("-wal", "-journal"))
    uri = path.absolute().as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
    try:
        return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30.0, check_same_thread=False)
    except sqlite3.DatabaseError as e:
        raise StateError(f"remediation state {path} is unreadable: {e}") from e


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_breaker(path: str | Path, window: float, now: float | None = None) -> BreakerState:
    """The breaker's state (``StateStore.breaker``) in the existing state file at ``path``, read
    without writing: it works on a read-only file or mount and leaves the file as it was."""
    path = Path(path)
    for _ in range(5):
        stamp = _stamp(path)
        store = StateStore(path, read_only=True)
        try:
            st = store.breaker(window, now)
        except sqlite3.DatabaseError as e:
            raise StateError(f"remediation state {path} is unreadable: {e}") from e
        finally:
            store.close()
        # A checkpoint rewriting the file under an ``immutable`` read could tear it: read again.
        if _stamp(path) == stamp:
            return st
    raise StateError(f"remediation state {path} kept changing while it was read; try again")


def iso_time(ts: float | None) -> str:
    if ts is None:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
