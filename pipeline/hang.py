"""Hung collectives: a job's progress records -> one alert per hang, naming the ranks behind
(docs/rules.md#hung-collectives).

A communicator's ranks span hosts, so this runs where every host's records meet: the fleet stage
(``pipeline/fleetstage.py``), fed the progress records it releases, in canonical order, and told
how far event time has come. A communicator (``job``, ``comm``) is hung when a rank reports a
watchdog timeout, RAS names a rank missing, dead or in error, or a rank behind its peers makes
no progress for ``stuck_after`` (one that stopped reporting: while its peers, reporting still,
stayed where they were with work outstanding; and behind the highest work a rank reports at the
deadline). The communicator waits ``settle`` after that first evidence, so
the other ranks' reports of the same hang are in, then names its suspects: the ranks RAS names,
the ranks whose last completed work (RAS: launched operations) lags the highest their peers
report, else the ranks that enqueued less, and ranks of a known size that never reported (not
RAS's: it names the ranks it misses, and the others only when they are outliers). A rank whose
last completed work goes back, in a named process group and on the same host and GPU, is in a new
communicator under the same key (a restarted job numbers its process groups as before): the old
one leaves its alert, the new one is judged afresh.

One hang is seen by several communicators (a rank's TP and DP groups) and by both sources (the
watchdog keys a communicator by its process group's id, RAS by its hash), so the alert is per
job and suspects (their hosts and GPUs, the one identity a rank has in every communicator): a
communicator whose suspects are all among those of a firing alert of its job joins that alert,
and any other opens one. The alert resolves when a communicator that joined it sees the
suspects (or, without suspects, any rank) report progress past what their peers had reached
(a suspect silent by then: once any rank completes work past it, which needed every rank), or
once every one of them went ``forget_after`` without a report or restarted.

The outcome depends on the records and their event times only: a communicator settles at its
deadline (evidence + ``settle``) with the records before it, whichever batches brought them, and
deadlines and silences are taken in event-time order.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Sequence

import msgspec

from pipeline import typedconfig
from pipeline.durations import duration
from pipeline.engine.lifecycle import alert_id
from pipeline.errors import ConfigError
from pipeline.schema import AlertEvent, ProgressRecord

RULE = "hang_collective"
FAULT = "hang_collective"
STATE_VERSION = 2
MAX_LISTED = 16  # suspects named in a summary and evidence; the rest counted
_RAS_SUSPECT = ("missing", "dead", "error")
# The host ncclras gives a rank RAS names without its node (2.24-2.25 list missing ranks by
# number): no host at all, so never an alert's host, nor the grounds to join alerts by host.
RAS_NO_HOST = "unknown"


class HangConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``hang.yaml``'s ``hang:`` section (durations as text: ``30s``, ``2m``)."""

    settle: str | int | float = "30s"
    stuck_after: str | int | float = "2m"
    forget_after: str | int | float = "1h"
    severity: str = "critical"
    max_communicators: int = 10_000
    max_ranks: int = 65_536


class _File(msgspec.Struct, forbid_unknown_fields=True):
    hang: HangConfig = msgspec.field(default_factory=HangConfig)


@dataclass(frozen=True)
class Settings:
    """``HangConfig`` read: seconds and bounds."""

    settle_s: float = 30.0
    stuck_after_s: float = 120.0
    forget_after_s: float = 3600.0
    severity: str = "critical"
    max_communicators: int = 10_000
    max_ranks: int = 65_536


def settings(cfg: HangConfig, source: str = "hang.yaml") -> Settings:
    """The thresholds of ``cfg``; a ``ConfigError`` naming the key for one that is not one.

    >>> settings(HangConfig(settle="10s")).settle_s
    10.0
    >>> settings(HangConfig(max_ranks=0))
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: config key 'hang.max_ranks': hang.yaml: must be 1..16777216, got 0 [GW100]
    """
    out = Settings(
        duration(cfg.settle, "hang.settle"),
        duration(cfg.stuck_after, "hang.stuck_after"),
        duration(cfg.forget_after, "hang.forget_after"),
        cfg.severity,
        cfg.max_communicators,
        cfg.max_ranks,
    )
    if out.severity not in ("critical", "warning", "info"):
        raise ConfigError("hang.severity", f"{source}: critical, warning or info, got {out.severity!r}")
    for key, val in (("max_communicators", out.max_communicators), ("max_ranks", out.max_ranks)):
        if not 1 <= val <= 1 << 24:
            raise ConfigError(f"hang.{key}", f"{source}: must be 1..{1 << 24}, got {val}")
    return out


def load_settings(path: str | Path) -> Settings:
    """``hang.yaml`` (safe YAML through ``typedconfig``), every mistake a ``ConfigError`` naming
    the key and the file."""
    return settings(typedconfig.load(path, _File).hang, str(path))


def _hostless(r: ProgressRecord) -> bool:
    """Whether ``r`` names its rank without a host (RAS_NO_HOST)."""
    return r.source == "ras" and r.host == RAS_NO_HOST


def _where(host: str) -> str:
    return "an unknown host" if host == RAS_NO_HOST else host


@dataclass
class _Rank:
    host: str
    gpu: int | None
    state: str
    progress: int | None  # last completed work (RAS: operations launched)
    enqueued: int | None
    since: float  # its last report level with its peers, or that moved ``progress``
    ts: float


@dataclass
class _Comm:
    job: str | None
    comm: str | None
    name: str | None = None
    nranks: int | None = None
    ranks: dict[int, _Rank] = field(default_factory=dict)
    evidence_at: float | None = None  # the first report that the communicator is hung
    # Whether a rank reported the hang itself (a watchdog timeout; RAS: missing, dead, error) since
    # then, not only a rank stuck behind (which may catch up before the deadline: no hang then).
    reported: bool = False
    seq: int | None = None
    op: str | None = None
    timeout_ms: int | None = None
    last_ts: float = -math.inf
    top: int | None = None  # the highest progress any rank reported
    top_since: float = -math.inf  # when ``top`` last rose
    # The earliest report at which a rank that stopped reporting may have been behind a stalled
    # communicator for ``stuck_after`` (its own reports never come to be judged): infinite if none.
    watch: float = math.inf
    # While it is part of a firing alert: the alert's id, its suspects here, those not yet caught
    # up, and the highest progress when it joined.
    firing: dict[str, Any] | None = None
    untracked: int = 0  # ranks past max_ranks
    sources: set[str] = field(default_factory=set)  # the producers that reported on it


Suspect = tuple[str, int | None]  # a suspect's host and GPU: the same rank in every communicator


@dataclass
class _Alert:
    """A firing hang alert: one job's suspects and the communicators that saw them."""

    id: str
    job: str | None
    started_at: float
    suspects: list[Suspect]
    summary: str
    host: str | None
    gpu: int | None
    members: list[dict[str, Any]]  # each communicator that joined: comm, name, sources, suspects, nranks
    live: set[str]  # the members (``comm or ""``) not forgotten since
    # The suspects as sets, made once: an alert is asked whether it covers many communicators.
    exact: set[Suspect] = field(init=False, repr=False)
    hosts: dict[str, None] = field(init=False, repr=False)  # in the suspects' order

    def __post_init__(self) -> None:
        self.exact = set(self.suspects)
        self.hosts = dict.fromkeys(h for h, _ in self.suspects)

    def covers(self, job: str | None, who: list[Suspect]) -> bool:
        """Whether a communicator of ``job`` naming ``who`` saw this hang: the same job, and each
        of its suspects one of these (a GPU left unsaid matches any GPU of the host)."""
        if (job or "") != (self.job or ""):
            return False
        exact, hosts = self.exact, self.hosts
        return all((h, g) in exact or (h, None) in exact or (g is None and h in hosts) for h, g in who)


@dataclass
class _Pending:
    """One job's communicators with evidence not yet part of an alert, during one ``advance``
    (no record comes in between, so their suspects stay as judged): in key order, each one's
    suspects judged once, and found by its first suspect's host, so that a firing reads only
    those it may cover, not every other one of a job of thousands of communicators."""

    keys: list[tuple[str, str]]
    judged: dict[tuple[str, str], list[tuple[int, _Rank, str]]] = field(default_factory=dict)
    by_host: dict[str, list[int]] | None = None  # a suspect's host -> indices into ``keys``


class HangDetector:
    """Progress records in, hang alerts out (see the module's docstring).

    >>> det = HangDetector(Settings(settle_s=10))
    >>> det.observe([ProgressRecord(ts=1764403200.0, host=f"n{r}", rank=r, job="j", comm="0", last_enqueued=9,
    ...                             last_completed=8 if r else 5, source="watchdog", state="timeout")
    ...              for r in range(4)])
    []
    >>> [(a.state, a.host, a.evidence["suspects"][0]["why"]) for a in det.advance(1764403300.0)]
    [('firing', 'n0', 'last completed 5, peers 8')]
    """

    def __init__(self, config: Settings | None = None) -> None:
        self.config = config or Settings()
        self.comms: dict[tuple[str, str], _Comm] = {}
        self.alerts: dict[str, _Alert] = {}  # firing, in the order they fired
        self._by_job: dict[str, dict[str, _Alert]] = {}  # the same, each job's apart: a settle reads its job's only
        # The same by job and suspect host: a communicator naming suspects reads only the alerts
        # naming its first one's host, not each of its job's (one per TP group in a fabric fault).
        self._by_host: dict[tuple[str, str], dict[str, _Alert]] = {}
        self.now = -math.inf
        self._next = math.inf  # the earliest time anything is due, or sooner
        # What falls due, (time, 0: a settle / 1: a silence, key), earliest first: an entry a later
        # report made stale is dropped (a settle) or put back at its new time (a silence, one a
        # communicator), so that a call reads what is due, not every communicator.
        self._heap: list[tuple[float, int, tuple[str, str]]] = []
        # Each job's communicators with evidence not yet part of an alert: those a firing can join.
        self._evidenced: dict[str, set[tuple[str, str]]] = {}
        self.stats: dict[str, int] = {"records": 0, "fired": 0, "joined": 0, "resolved": 0,
                                      "dropped.communicators": 0, "dropped.ranks": 0}  # fmt: skip

    # -- input -------------------------------------------------------------------------------

    def observe(self, records: Sequence[Any]) -> list[AlertEvent]:
        """Released records in event-time order (others than progress records are skipped);
        what fired or resolved on the way (a deadline at or before a later record's time)."""
        out: list[AlertEvent] = []
        for r in records:
            if not isinstance(r, ProgressRecord):
                continue
            self.stats["records"] += 1
            out.extend(self.advance(r.ts))
            self._apply(r, out)
        return out

    def advance(self, upto: float) -> list[AlertEvent]:
        """Every record before ``upto`` has been observed: settle what is due by then, forget
        what went silent. The end of a stream (``upto`` infinite) settles but forgets nothing."""
        out: list[AlertEvent] = []
        if upto > self.now:
            self.now = upto
        if upto < self._next:  # nothing is due: one comparison a record, not a walk of every communicator
            return out
        forget = math.isfinite(upto)
        kept: list[tuple[float, int, tuple[str, str]]] = []  # silences the end of a stream leaves
        # The job's communicators with evidence not yet part of an alert, in key order, as its
        # first settle in this call found them: those a firing can join at once (no record comes
        # in between, so none gains evidence).
        settling: dict[str, _Pending] = {}
        # In event-time order, a deadline before a silence at the same time: one communicator's
        # outcome decides another's (which alert it joins), whatever span one call covers.
        while self._heap and self._heap[0][0] <= upto:
            entry = heapq.heappop(self._heap)
            at, kind, key = entry
            cur = self.comms.get(key)
            if cur is None:
                continue
            if kind == 0:
                # Not joined at another's firing, nor a settle of evidence since dropped.
                if cur.firing is None and cur.evidence_at is not None and cur.evidence_at + self.config.settle_s == at:
                    p = settling.get(key[0])
                    if p is None:
                        p = settling[key[0]] = _Pending(sorted(self._evidenced.get(key[0], ())))
                    fired = self._settle(cur, at, p)
                    if fired is not None:
                        out.append(fired)
                continue
            due = cur.last_ts + self.config.forget_after_s
            if due > at:  # it reported since: its silence is due later
                heapq.heappush(self._heap, (due, 1, key))
                continue
            if not forget:
                kept.append(entry)
                continue
            if cur.firing is not None:
                gone = self._leave(cur, at, f"no progress report for {self.config.forget_after_s:g}s")
                if gone is not None:
                    out.append(gone)
            self._unmark(key)
            del self.comms[key]
        for entry in kept:
            heapq.heappush(self._heap, entry)
        self._next = self._heap[0][0] if self._heap else math.inf
        return out

    def _mark(self, c: _Comm, at: float) -> None:
        """``c`` has its first evidence at ``at``: due to settle ``settle`` later."""
        c.evidence_at = at
        key = (c.job or "", c.comm or "")
        self._evidenced.setdefault(key[0], set()).add(key)
        self._push((at + self.config.settle_s, 0, key))

    def _unmark(self, key: tuple[str, str]) -> None:
        """The communicator under ``key`` has no evidence pending any more (or is gone)."""
        keys = self._evidenced.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:  # a job's entry goes with its last such communicator
                del self._evidenced[key[0]]

    def _push(self, entry: tuple[float, int, tuple[str, str]]) -> None:
        heapq.heappush(self._heap, entry)
        self._next = min(self._next, entry[0])

    def _apply(self, r: ProgressRecord, out: list[AlertEvent]) -> None:
        key = (r.job or "", r.comm or "")
        c = self.comms.get(key)
        if c is None:
            if len(self.comms) >= self.config.max_communicators:
                self.stats["dropped.communicators"] += 1
                return
            c = self.comms[key] = _Comm(r.job, r.comm)
            self._push((r.ts + self.config.forget_after_s, 1, key))  # its silence: one entry, moved on as it reports
        old = c.ranks.get(r.rank)
        if (
            r.comm is not None  # lines that name no process group mix several under one key
            and old is not None
            and old.progress is not None
            and r.last_completed is not None
            and r.last_completed < old.progress
            # The same rank's own report: groups split from one (DeviceMesh's split_group) can
            # share a group id, and another group's rank of that number is not a restart.
            and old.host == r.host
            and (old.gpu is None or r.gpu is None or old.gpu == r.gpu)
        ):
            # A rank's completed work never goes back in one communicator: this is a new one under
            # the same key (a restarted job numbers its process groups as before), judged afresh.
            if c.firing is not None and (gone := self._leave(c, r.ts, "communicator restarted")) is not None:
                out.append(gone)
            self._unmark(key)
            c = self.comms[key] = _Comm(r.job, r.comm)
        c.last_ts = max(c.last_ts, r.ts)
        c.sources.add(r.source)
        c.name = c.name or r.comm_name
        c.nranks = r.nranks if r.nranks is not None else c.nranks
        prog = r.last_completed if r.last_completed is not None else (r.last_enqueued if r.source == "ras" else None)
        rk = c.ranks.get(r.rank)
        if rk is None:
            if len(c.ranks) >= self.config.max_ranks:
                c.untracked += 1
                self.stats["dropped.ranks"] += 1
                return
            rk = c.ranks[r.rank] = _Rank(r.host, r.gpu, r.state, prog, r.last_enqueued, r.ts, r.ts)
        else:
            if prog is not None and prog != rk.progress:
                rk.progress, rk.since = prog, r.ts
            if not _hostless(r):  # a RAS line without the node leaves the host another report named
                rk.host = r.host
            rk.gpu = r.gpu if r.gpu is not None else rk.gpu
            rk.state, rk.ts = r.state, r.ts
            rk.enqueued = r.last_enqueued if r.last_enqueued is not None else rk.enqueued
        if prog is not None and (c.top is None or prog > c.top):
            c.top, c.top_since = prog, r.ts
            c.watch = r.ts + self.config.stuck_after_s
        if not self._behind(c, rk):
            # Level with its peers now: a rank is stuck for how long it has been behind as its
            # reports show, not since its work last moved (a slow job's rank one behind for an
            # instant has not moved for minutes, and is not stuck).
            rk.since = r.ts
        elif rk.progress is not None and c.top is not None and rk.progress < c.top:
            # Behind without the top rising (its first report, or its first number): a walk that
            # found nobody behind must not leave it unwatched if it falls silent (RAS's word alone,
            # lagging, is no such rank: RAS leaves out a rank that caught up).
            c.watch = min(c.watch, rk.since + self.config.stuck_after_s)
        if r.state == "timeout":
            c.seq = c.seq if c.seq is not None else r.seq
            c.op = c.op or r.op
            c.timeout_ms = c.timeout_ms or r.timeout_ms
        if c.firing is not None:
            if self._caught_up(c, r.rank, rk):
                out.append(self._resolve(self.alerts[c.firing["alert"]], r.ts, "progress resumed"))
            return
        if r.state == "timeout" or r.state in _RAS_SUSPECT:
            c.reported = True
            if c.evidence_at is None:
                self._mark(c, r.ts)
        elif c.evidence_at is None and (self._stuck(c, rk, r.ts) or (r.ts >= c.watch and self._stuck_silent(c, r.ts))):
            self._mark(c, r.ts)

    # -- judging -----------------------------------------------------------------------------

    def _stuck(self, c: _Comm, k: _Rank, now: float) -> bool:
        """Whether rank ``k``, reporting now, has been behind its peers for ``stuck_after`` by
        its reports (judged as each rank reports: O(1) a record, whatever the job's size)."""
        return self._behind(c, k) and now - k.since >= self.config.stuck_after_s

    def _held(self, c: _Comm, k: _Rank, at: float, peak: int | None, waiting: bool) -> bool:
        """Whether rank ``k`` is still stuck at ``at``: by its reports, behind the highest work a
        rank reports now (``peak``), and if it stopped reporting, with its peers where they were
        for ``stuck_after`` and ``waiting`` on work."""
        stall = self.config.stuck_after_s
        # A top no rank holds any more (every rank's work fell: a job requeued onto other hosts,
        # no restart seen) shows nobody behind: ranks level with each other are not stuck.
        lags = k.state == "lagging" or (peak is not None and k.progress is not None and k.progress < peak)
        return lags and self._stuck(c, k, at) and (at - k.ts < stall or (waiting and at - c.top_since >= stall))

    @staticmethod
    def _waiting(c: _Comm, peak: int | None) -> bool:
        """Whether a rank at ``peak`` has work outstanding (or does not say): peers that completed
        all they enqueued wait on nobody (a job ending rank by rank, its last one reporting on)."""
        if "ras" in c.sources or peak is None:  # RAS counts operations launched: nothing says what is outstanding
            return True
        return any(k.progress == peak and (k.enqueued is None or k.enqueued > k.progress) for k in c.ranks.values())

    def _stuck_silent(self, c: _Comm, now: float) -> bool:
        """Whether a rank that stopped reporting has been behind for ``stuck_after`` while its
        peers, reporting still, stayed where they were (a peer moving on shows the rank did too:
        its reporter died, not its work). Sets ``c.watch`` to the next report worth the walk."""
        c.watch = math.inf
        if now - c.top_since < self.config.stuck_after_s:
            c.watch = c.top_since + self.config.stuck_after_s
            return False
        for k in c.ranks.values():
            if self._behind(c, k):
                if now - k.since >= self.config.stuck_after_s:
                    return True
                c.watch = min(c.watch, k.since + self.config.stuck_after_s)
        return False

    @staticmethod
    def _behind(c: _Comm, k: _Rank) -> bool:
        """Whether rank ``k`` is behind its peers: RAS calls it lagging, or its last completed
        work is below the highest any rank reported."""
        return k.state == "lagging" or (c.top is not None and k.progress is not None and k.progress < c.top)

    def suspects(self, c: _Comm) -> list[tuple[int, _Rank, str]]:
        """The ranks a hang is blamed on, with why, lowest rank first."""
        out: dict[int, tuple[_Rank, str]] = {}
        for i, k in c.ranks.items():
            if k.state in _RAS_SUSPECT:
                out[i] = (k, k.state)
        known = [k.progress for k in c.ranks.values() if k.progress is not None]
        top = max(known, default=None)
        if top is not None and min(known) < top:
            for i, k in c.ranks.items():
                if k.progress is not None and k.progress < top:
                    quiet = c.last_ts - k.ts
                    tail = f", silent {quiet:.0f}s" if quiet >= self.config.stuck_after_s else ""
                    out.setdefault(i, (k, f"last completed {k.progress}, peers {top}{tail}"))
        elif not out:
            enq = [k.enqueued for k in c.ranks.values() if k.enqueued is not None]
            if enq and min(enq) < max(enq):
                for i, k in c.ranks.items():
                    if k.enqueued is not None and k.enqueued < max(enq):
                        out[i] = (k, f"last enqueued {k.enqueued}, peers {max(enq)}")
        for i, k in c.ranks.items():
            if k.state == "lagging":
                out.setdefault(i, (k, "behind its peers' operation count"))
        return [(i, k, why) for i, (k, why) in sorted(out.items())]

    def _silent(self, c: _Comm) -> list[int]:
        """Ranks of a communicator of known size that never reported (at most ``MAX_LISTED``)."""
        if c.nranks is None or len(c.ranks) >= c.nranks or not any(k.state != "timeout" for k in c.ranks.values()):
            return []
        if "ras" in c.sources:  # RAS names the ranks it misses; one it left out is of the many at the common count
            return []
        # Lazily: nranks may be 2^24, the ranks that reported few.
        return list(islice((i for i in range(c.nranks) if i not in c.ranks), MAX_LISTED))

    def _caught_up(self, c: _Comm, rank: int, k: _Rank) -> bool:
        """Whether the firing hang is over, now that ``rank`` reported: every suspect has reported
        progress up to what its peers had reached (without suspects: any rank past it)."""
        f = c.firing
        assert f is not None
        peak = f["peak"]
        moved = k.state == "progress" and k.progress is not None and peak is not None
        if not f["ranks"]:
            return moved and k.progress > peak
        if moved and k.progress >= peak and rank in f["waiting"]:
            f["waiting"].discard(rank)
        if moved and k.progress > peak and f["silent"]:
            # Work completed past the stall needed every rank: the silent suspects took part
            # (their reporter stopped, not their work), as when the hang was judged.
            f["waiting"].difference_update(f["silent"])
            f["silent"] = []
        return not f["waiting"]

    # -- alerts ------------------------------------------------------------------------------

    def _judged(self, p: _Pending, key: tuple[str, str], c: _Comm) -> list[tuple[int, _Rank, str]]:
        """``suspects(c)``, once an ``advance``."""
        sus = p.judged.get(key)
        if sus is None:
            sus = p.judged[key] = self.suspects(c)
        return sus

    def _settle(self, c: _Comm, at: float, pending: _Pending) -> AlertEvent | None:
        """Communicator ``c`` at its deadline: it joins the firing alert of its job that names
        all its suspects (the first that fired), or fires one of its own, which the job's
        ``pending`` communicators naming no other suspect join at once."""
        sus = self._judged(pending, (c.job or "", c.comm or ""), c)
        if not c.reported:
            peak = max((k.progress for k in c.ranks.values() if k.progress is not None), default=None)
            waiting = self._waiting(c, peak)
            if not any(self._held(c, k, at, peak, waiting) for k in c.ranks.values()):
                # The evidence was a rank stuck behind, and it caught up before the deadline (or its
                # peers moved on, so a silent one did too): no hang (a moving job's ranks, reporting
                # at their own instants, differ by a little: not one).
                c.evidence_at = None
                self._unmark((c.job or "", c.comm or ""))
                # The walk that found the evidence stopped at it: the next report walks again.
                c.watch = min(c.watch, at)
                return None
        who: list[Suspect] = [(k.host, k.gpu) for _, k, _ in sus]
        # Only an alert naming the first suspect's host can cover them all (without suspects:
        # any of the job's), the first that fired first.
        job = c.job or ""
        alerts = self._by_host.get((job, who[0][0]), {}) if who else self._by_job.get(job, {})
        for a in alerts.values():
            if a.covers(c.job, who):
                self._join(a, c, sus)
                self.stats["joined"] += 1
                return None
        return self._fire(c, at, sus, pending)

    def _join(self, a: _Alert, c: _Comm, sus: list[tuple[int, _Rank, str]]) -> None:
        known = [k.progress for k in c.ranks.values() if k.progress is not None]
        ranks = [i for i, _, _ in sus]
        # The suspects silent by then (see ``suspects``' why): none of RAS's, whose counts are of
        # operations launched, which a rank's peers may go on with while it hangs, nor where lines
        # that name no process group mix several groups' counts.
        stall = self.config.stuck_after_s
        mixed = "ras" in c.sources or c.comm is None
        silent = [] if mixed else [i for i, k, _ in sus if c.last_ts - k.ts >= stall]
        self._unmark((c.job or "", c.comm or ""))
        c.firing = {"alert": a.id, "ranks": ranks, "waiting": set(ranks), "peak": max(known, default=None),
                    "silent": silent}  # fmt: skip
        src = sorted(c.sources)
        a.members.append({"comm": c.comm, "name": c.name, "sources": src, "suspects": ranks[:MAX_LISTED],
                          "nranks": c.nranks})  # fmt: skip
        a.live.add(c.comm or "")

    def _fire(self, c: _Comm, at: float, sus: list[tuple[int, _Rank, str]], pending: _Pending) -> AlertEvent:
        assert c.evidence_at is not None
        silent = self._silent(c)
        known = [k.progress for k in c.ranks.values() if k.progress is not None]
        listed = [
            {"rank": i, "host": k.host, "gpu": k.gpu, "why": why, "state": k.state,
             "last_completed": k.progress, "last_enqueued": k.enqueued}
            for i, k, why in sus[:MAX_LISTED]
        ]  # fmt: skip
        # The alert's host and GPU: the first suspect whose host is known (a RAS rank named by
        # number only has none; see RAS_NO_HOST).
        first = next((k for _, k, _ in sus if k.host != RAS_NO_HOST), None)
        # The engine's id scheme: the same hang found again in a replay or after a restore has the
        # same id; the job and suspects are what the alert is about, the first communicator and
        # its evidence's time which finding of them.
        who: list[Suspect] = [(k.host, k.gpu) for _, k, _ in sus]
        entity = f"{c.job or '-'}/{c.comm or '-'}/" + ",".join(f"{h}:{'-' if g is None else g}" for h, g in who)
        a = _Alert(alert_id(RULE, entity, c.evidence_at), c.job, c.evidence_at, who, "",
                   first.host if first else None, first.gpu if first else None, [], set())  # fmt: skip
        self._join(a, c, sus)
        self.alerts[a.id] = a
        self._index(a)
        self.stats["fired"] += 1
        # The job's other communicators settling now that saw the same suspects join at once, so
        # the alert lists them; any that settle later join it then.
        if pending.by_host is None:
            pending.by_host = {}
            for i, key in enumerate(pending.keys):
                o = self.comms.get(key)
                if o is not None and (osus := self._judged(pending, key, o)):
                    pending.by_host.setdefault(osus[0][1].host, []).append(i)
        near = sorted({i for h in a.hosts for i in pending.by_host.get(h, ())})
        for key in (pending.keys[i] for i in near):
            o = self.comms.get(key)
            if o is None or o is c or o.firing is not None or o.evidence_at is None:
                continue
            osus = self._judged(pending, key, o)
            # Only one that already names suspects: one that names none yet may name others by
            # its own deadline (another hang), and joins then if it does not.
            if osus and a.covers(o.job, [(k.host, k.gpu) for _, k, _ in osus]):
                self._join(a, o, osus)
                self.stats["joined"] += 1
        what = f"{c.op} seq {c.seq}" if c.op and c.seq is not None else (f"seq {c.seq}" if c.seq is not None else "")
        comms = [m["comm"] if m["comm"] is not None else "?" for m in a.members]
        where = ("communicator " if len(comms) == 1 else "communicators ") + ", ".join(comms[:4])
        where += f" and {len(comms) - 4} more" if len(comms) > 4 else ""
        head = f"Collective hang in job {c.job or '?'} ({where}{', ' + what if what else ''})"
        if sus:
            names = "; ".join(
                f"rank {i} on {_where(k.host)}{f' GPU {k.gpu}' if k.gpu is not None else ''} ({why})"
                for i, k, why in sus[:MAX_LISTED]
            )
            more = f" and {len(sus) - MAX_LISTED} more" if len(sus) > MAX_LISTED else ""
            summary = f"{head}: suspects {names}{more}"
        else:
            summary = f"{head}: {len(c.ranks)} rank(s) reported it at the same work; no rank stands out"
        if silent:
            summary += f"; never reported: rank(s) {', '.join(map(str, silent))}"
        a.summary = summary
        labels = self._labels(a)
        if c.name:
            labels["comm_name"] = c.name
        if sus:
            hosts = dict.fromkeys(k.host for _, k, _ in sus[:MAX_LISTED] if k.host != RAS_NO_HOST)
            if hosts:
                labels["suspect_hosts"] = ",".join(hosts)
        evidence = {
            "suspects": listed,
            "suspects_total": len(sus),
            "never_reported": silent,
            "ranks_reporting": len(c.ranks),
            "nranks": c.nranks,
            "seq": c.seq,
            "op": c.op,
            "timeout_ms": c.timeout_ms,
            "peers_last_completed": max(known, default=None),
            "communicators": a.members[:MAX_LISTED],
            "communicators_total": len(a.members),
        }
        return self._event(a, "firing", at, evidence, labels)

    def _index(self, a: _Alert) -> None:
        """File firing alert ``a`` under its job and under its job and each suspect's host."""
        self._by_job.setdefault(a.job or "", {})[a.id] = a
        for h in a.hosts:
            self._by_host.setdefault((a.job or "", h), {})[a.id] = a

    def _event(self, a: _Alert, state: str, at: float, evidence: dict[str, Any], labels: dict[str, str]) -> AlertEvent:
        """``a``'s event at ``at``: its id, job, suspect, start and summary are the alert's (a
        resolved event says what the firing one was about)."""
        return AlertEvent(
            id=a.id,
            state=state,
            fault=FAULT,
            severity=self.config.severity,
            rule=RULE,
            host=a.host,
            gpu=a.gpu,
            job=a.job,
            ts=at,
            started_at=a.started_at,
            summary=a.summary,
            evidence=evidence,
            labels=labels,
        )

    def _labels(self, a: _Alert) -> dict[str, str]:
        comms = dict.fromkeys(m["comm"] or "" for m in a.members[:MAX_LISTED])
        return {"comm": ",".join(comms), "source": "hang"}

    def _leave(self, c: _Comm, at: float, why: str) -> AlertEvent | None:
        """``c`` went silent while part of an alert: the alert resolves once none of its
        communicators is left."""
        assert c.firing is not None
        a = self.alerts[c.firing["alert"]]
        c.firing = None
        a.live.discard(c.comm or "")
        return self._resolve(a, at, why) if not a.live else None

    def _resolve(self, a: _Alert, at: float, why: str) -> AlertEvent:
        for comm in a.live:
            c = self.comms.get((a.job or "", comm))
            if c is not None and c.firing is not None and c.firing["alert"] == a.id:
                # The next hang here names its own collective, not this one's.
                c.firing, c.evidence_at, c.seq, c.op, c.timeout_ms = None, None, None, None, None
                c.reported = False
        del self.alerts[a.id]
        job = self._by_job[a.job or ""]
        del job[a.id]
        if not job:  # a job's entry goes with its last alert, so jobs long gone hold no memory
            del self._by_job[a.job or ""]
        for h in a.hosts:
            at_host = self._by_host[(a.job or "", h)]
            del at_host[a.id]
            if not at_host:
                del self._by_host[(a.job or "", h)]
        self.stats["resolved"] += 1
        evidence = {"resolved_by": why, "communicators": a.members[:MAX_LISTED], "communicators_total": len(a.members)}
        return self._event(a, "resolved", at, evidence, self._labels(a))

    # -- state -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain data (strings, numbers, lists, maps): msgpack- and JSON-able (``hangstate.dump``)."""
        from pipeline import hangstate

        return hangstate.dump(self)

    def load_state(self, state: Any) -> None:
        """Take back what ``to_state`` wrote (or a version-1 state, whose firing communicators
        become an alert each); anything else is a ``StateError``, leaving the detector as it was."""
        from pipeline import hangstate

        comms, alerts, now, stats = hangstate.load(state, self.config)
        self.comms, self.alerts, self.now = comms, alerts, now
        self._by_job, self._by_host = {}, {}
        for a in alerts.values():
            self._index(a)
        self.stats.update(stats)
        self._heap, self._evidenced, self._next = [], {}, math.inf
        for key, c in comms.items():
            self._push((c.last_ts + self.config.forget_after_s, 1, key))
            if c.firing is None and c.evidence_at is not None:
                self._evidenced.setdefault(key[0], set()).add(key)
                self._push((c.evidence_at + self.config.settle_s, 0, key))
