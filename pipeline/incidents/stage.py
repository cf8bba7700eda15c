"""The incident stage: alert events in, incident events out (docs/architecture.md, "Incidents").

Fed the engine's alert events a batch at a time, it groups the alerts of one root cause into an
incident: every alert on a GPU with an open incident joins it (an NVLink belongs to its GPU), and
an alert elsewhere joins an incident whose alerts explain it by a ``causality`` entry of
``incidents.yaml`` (a link down explains its host's bandwidth alert; a GPU off the bus, the
stragglers of a communicator one of its alerts names). An incident resolves when its alerts have
all resolved and ``quiet`` passed with none joining (gone once time is ``hold`` past that: the
feed may still bring a symptom that much older, pipeline/incidents/hold.py); its action escalates
when a repeat-offender policy counts enough on its GPU or host.

Output depends on the alerts and their order only, never on how they were batched: time moves
with the alerts (the latest ``ts`` seen), timers are checked before and after each alert, and ids
hash the root alert's id.

Delivery is at least once: the same firing (alert id and ``started_at``) again is ignored, also
after its incident resolved, and a resolve that comes before its firing is held for it, which it
then resolves at once (not before its incident's last alert); both memories are bounded
(an hour of event time, ``SEEN_FOR``, and ``max_seen``, the oldest forgotten first) and kept in
the state.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict
from typing import Any, Iterable

from pipeline.incidents.config import Cause, IncidentConfig, Policy
from pipeline.incidents.events import (
    ESCALATED,
    JOINED,
    OPENED,
    RESOLVED,
    SEVERITY_ROSE,
    UPDATED,
    IncidentEvent,
    IncidentRoot,
    incident_id,
)
from pipeline.incidents.feed import MAX_BUFFER, AlertFeed
from pipeline.incidents.hold import CauseHold
from pipeline.incidents.history import RepeatHistory
from pipeline.incidents.incident import _Incident
from pipeline.incidents.index import IncidentIndex
from pipeline.schema import MIG_INSTANCE_LABEL, MIG_PROFILE_LABEL, AlertEvent, fault_family

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
MAX_MEMBERS = 256  # alert ids an incident lists; more are counted (``more_members``)
MAX_COMMS = 64  # communicator ids an incident remembers for ``reach: comm``
MAX_TEXT = 256  # characters of an id, host, rule or label an alert may carry here
# The labels that name which component of its host a host-level alert is about: a NIC port's
# checks (pipeline/rules/ports.py) label their alerts with its device and port.
WHERE_LABELS = ("device", "port")
MAX_OPEN = 10_000  # open incidents; an alert that would open one more is dropped and counted
MAX_FIRING = 100_000  # firing member alerts tracked for their resolution, all incidents together
MAX_RULES = 10_000  # rules (and fault families) an incident remembers; an alert of another still joins
MAX_GPU = 1 << 16  # GPU indexes an alert may carry here
# Past firings remembered (a redelivery is recognised) and resolves held for a firing not yet seen,
# each: as many as the firing alerts tracked, the oldest forgotten first.
MAX_SEEN = MAX_FIRING
# And for how long (event time since last touched): a redelivery comes after a restart, within the
# span not committed yet (minutes), and the drivers' alert feed drops older ones as late anyway.
SEEN_FOR = 3600.0


def _xid(a: AlertEvent) -> int | None:
    x = a.evidence.get("xid")
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0 or x != int(x):
        return None
    return int(x)


def _label(a: AlertEvent, name: str) -> str | None:
    v = a.labels.get(name, a.evidence.get(name))
    if v is None or isinstance(v, (dict, list)):
        return None
    return str(v)[:MAX_TEXT]


def _where(a: AlertEvent) -> tuple[tuple[str, str], ...]:
    """Which component of its host ``a`` names (``WHERE_LABELS``), as ``(label, value)`` pairs."""
    return tuple((k, str(a.labels[k])[:MAX_TEXT]) for k in WHERE_LABELS if k in a.labels)


def _comm(a: AlertEvent) -> str | None:
    c = a.evidence.get("comm")
    return c[:MAX_TEXT] if isinstance(c, str) and c else None


class IncidentStage:
    """Groups alert events into incidents; ``process(alerts)`` returns the incident events.

    >>> from pipeline.incidents.config import IncidentConfig
    >>> st = IncidentStage(IncidentConfig())
    >>> a = AlertEvent(id="a1", state="firing", fault="hbm_ecc_burst", severity="warning", rule="hbm_sbe_burst",
    ...                host="n1", gpu=0, ts=10.0, started_at=10.0)
    >>> [(e.state, e.members) for e in st.process([a])]
    [('opened', ['a1'])]
    """

    def __init__(
        self,
        config: IncidentConfig,
        history: RepeatHistory | None = None,
        *,
        max_open: int = MAX_OPEN,
        max_seen: int = MAX_SEEN,
    ):
        self.config = config
        self.history = history if history is not None else RepeatHistory()
        self.max_open = max_open
        self.max_seen = max_seen
        self.stats: Counter[str] = Counter()
        self._open: dict[str, _Incident] = {}
        self._by_alert: dict[str, str] = {}  # firing member alert id -> its incident's id
        # At-least-once delivery straight into the stage. The firings taken (alert id ->
        # started_at, the one touched last at the end): the same firing again, after it resolved
        # and its incident too, is a redelivery, never a new incident. And resolves that came
        # before their firing (alert id -> (started_at, ts)): the firing, when it comes, ends at once.
        self._seen: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._early: OrderedDict[str, tuple[float, float]] = OrderedDict()
        # Where to look for the incident an alert joins (pipeline/incidents/index.py): an alert
        # walks only those that may take it, never every incident of its host or communicator.
        self._index = IncidentIndex(c.name for c in config.causality if c.reach == "comm")
        # The entries with a ``within``: whose causes' start times an incident keeps (``cause_at``).
        self._timed = tuple(c for c in config.causality if c.within is not None)
        # (quiet_due, incident id) of incidents whose alerts all resolved; an entry whose incident
        # took an alert since (its quiet_due changed) is skipped when it comes up.
        self._due: list[tuple[float, str]] = []
        self._clock = -math.inf
        self._rungs: dict[tuple[str, str], int] = {}  # (rule, severity) -> its action's rung
        self._incident_policies = [p for p in config.policies if p.count == "incidents"]
        self._alert_policies = [p for p in config.policies if p.count != "incidents"]

    @property
    def open_count(self) -> int:
        """How many incidents are open."""
        return len(self._open)

    def open_incidents(self) -> list[IncidentEvent]:
        """Each open incident as its latest event said it (``opened`` or ``updated``, at that
        event's ``ts``), with the reason and policy of its latest escalation: most severe first,
        then the longest open, then by id.

        >>> from pipeline.incidents.config import IncidentConfig
        >>> st = IncidentStage(IncidentConfig())
        >>> def fire(id, host, severity, ts):
        ...     return AlertEvent(id=id, state="firing", fault="f", severity=severity, rule="r", host=host,
        ...                       gpu=0, ts=ts, started_at=ts)
        >>> _ = st.process([fire("a1", "n1", "warning", 10.0), fire("b1", "n2", "critical", 20.0),
        ...                 fire("a2", "n1", "critical", 30.0)])
        >>> for e in st.open_incidents():
        ...     print(e.host, e.state, e.severity, e.members, e.changes)
        n1 updated critical ['a1', 'a2'] ['alert_joined', 'severity_rose']
        n2 opened critical ['b1'] []
        """
        incs = sorted(self._open.values(), key=lambda i: (-SEVERITY_RANK.get(i.severity, -1), i.opened_at, i.id))
        return [
            self._event(
                i,
                i.state,
                i.last_join if i.updated_at is None else i.updated_at,
                changes=list(i.changes),
                reason=i.reason,
                policy=i.policy,
            )
            for i in incs
        ]

    def to_state(self) -> dict[str, Any]:
        """The open incidents, the clock and the repeat-offender history as plain data (lists of
        strings and numbers, ``pipeline/incidents/stagestate.py``), for a checkpoint."""
        from pipeline.incidents import stagestate

        return stagestate.dump(self)

    def load_state(self, state: Any) -> None:
        """Continue from what ``to_state`` made; anything else raises ``StateError`` naming what
        is wrong and leaves the stage as it was."""
        from pipeline.incidents import stagestate

        stagestate.load(self, state)

    def process(self, alerts: Iterable[AlertEvent]) -> list[IncidentEvent]:
        """Incident events for ``alerts`` (in the order given: event time, as ``AlertFeed``
        releases them, the alerts of one GPU at one time by ``rootness``, a cause that came just
        after its symptoms before them)."""
        out: list[IncidentEvent] = []
        for a in alerts:
            if not self._valid(a):
                continue
            self._clock = max(self._clock, a.ts)
            self._expire(out)
            if a.state == "firing":
                self._firing(a, out)
            elif a.state == "resolved":
                self._resolved(a)
            else:
                self.stats["incidents.dropped.bad_state"] += 1
            self._expire(out)
        for e in out:
            self.stats[f"incidents.{e.state}"] += 1
        return out

    def feed(self, max_buffer: int = MAX_BUFFER) -> AlertFeed:
        """The ``AlertFeed`` that puts this stage's input in its order (``rootness`` within a
        GPU's second): replay and serve feed the stage through one, so they agree.

        A possible symptom waits there ``hold`` seconds for its cause (pipeline/incidents/hold.py).

        >>> from pipeline.incidents.config import IncidentConfig
        >>> feed = IncidentStage(IncidentConfig()).feed()
        >>> feed.max_buffer, feed.hold.seconds
        (200000, 5.0)
        """
        return AlertFeed(max_buffer, rank=self.rootness, hold=CauseHold(self.config))

    def rootness(self, a: AlertEvent) -> tuple[int, int, int]:
        """How ``a`` ranks to open an incident among the alerts of its GPU at its time, first
        first: the alert calling for the highest action, then the most severe, then one that
        carries an XID (the driver's own report of the fault). A link going down raises its
        warnings, its CRC-rate alert (critical, drain_node, as XID 74) and its XID 74 at one
        time: the XID names the root, which routes act on. ``AlertFeed`` orders each released
        second by it (``rank``).

        The action is cached per (rule, severity); the XID is not a property of the rule: the
        engine puts every field a rule's condition reads in the alert's evidence (an XID
        rule's ``xid``, 0 or absent when the GPU has none), so it is tested per alert (``_xid``,
        a dict lookup).

        >>> from pipeline.incidents.config import IncidentConfig
        >>> st = IncidentStage(IncidentConfig(rule_actions=(("hbm_dbe", "drain_node"),)))
        >>> def alert(rule, severity, **evidence):
        ...     return AlertEvent(id=rule, state="firing", fault="f", severity=severity, rule=rule, host="n1",
        ...                       gpu=0, ts=10.0, started_at=10.0, evidence=evidence)
        >>> st.rootness(alert("hbm_dbe", "warning")), st.rootness(alert("x", "critical")), st.rootness(alert("y", "info"))
        ((-1, -1, 1), (0, -2, 1), (0, 0, 1))
        >>> st.rootness(alert("x", "critical", xid=74)), st.rootness(alert("x", "critical", xid=0))
        ((0, -2, 0), (0, -2, 1))
        """
        if len(a.rule) > MAX_TEXT:  # the stage drops it (bad_alert): not worth a cache entry
            return (0, 0, 1)
        return (-self._rung(a), -SEVERITY_RANK.get(a.severity, -1), 0 if _xid(a) is not None else 1)

    def _rung(self, a: AlertEvent) -> int:
        """The rung of the action ``a`` calls for (``incidents.yaml``), cached per (rule, severity)."""
        key = (a.rule, a.severity)
        rung = self._rungs.get(key)
        if rung is None:
            rung = self._rungs[key] = self.config.rank(self.config.action_for(a.rule, a.severity))
            if len(self._rungs) > MAX_RULES:  # rules are few; hostile names must not grow it for good
                self._rungs.clear()
        return rung

    # -- alerts ------------------------------------------------------------------------------

    def _valid(self, a: AlertEvent) -> bool:
        if not math.isfinite(a.ts) or not a.id or len(a.id) > MAX_TEXT or len(a.rule) > MAX_TEXT:
            self.stats["incidents.dropped.bad_alert"] += 1
            return False
        # What an incident keeps of an alert must load back from its checkpoint (stagestate.py).
        if (a.host is not None and len(a.host) > MAX_TEXT) or len(a.fault) > MAX_TEXT or len(a.severity) > MAX_TEXT:
            self.stats["incidents.dropped.bad_alert"] += 1
            return False
        if a.gpu is not None and not 0 <= a.gpu < MAX_GPU:
            self.stats["incidents.dropped.bad_alert"] += 1
            return False
        return True

    def _resolved(self, a: AlertEvent) -> None:
        if self._end(a.id, a.ts):
            self._remember(self._seen, a, (a.started_at, a.ts), "seen")
            return
        self.stats["incidents.ignored.resolved_not_member"] += 1
        if self._seen.get(a.id, (None,))[0] != a.started_at:
            # Its firing not seen yet (clock skew, out-of-order delivery): held for it, or the
            # firing would open an incident that never resolves.
            self._remember(self._early, a, (a.started_at, a.ts), "early_resolve")

    def _end(self, alert_id: str, ts: float) -> bool:
        """Resolve firing member ``alert_id`` at ``ts``; False if it is none."""
        iid = self._by_alert.pop(alert_id, None)
        inc = self._open.get(iid) if iid else None
        if inc is None:
            return False
        inc.firing.discard(alert_id)
        if not inc.firing:
            # Not before its last alert joined: a resolve dated before its firing still resolves it.
            inc.quiet_due = max(ts, inc.last_join) + self.config.quiet
            heapq.heappush(self._due, (inc.quiet_due, inc.id))
        return True

    def _remember(self, memory: OrderedDict[str, Any], a: AlertEvent, value: Any, what: str) -> None:
        """Put ``a``'s id last in ``memory`` with ``value`` ((started_at, ts)), forgetting the oldest
        past ``max_seen`` and those not touched for ``SEEN_FOR``."""
        if not math.isfinite(a.started_at):
            return  # what the state keeps must load back from its checkpoint (stagestate.py)
        memory[a.id] = value
        memory.move_to_end(a.id)
        while memory and (len(memory) > self.max_seen or next(iter(memory.values()))[1] < self._clock - SEEN_FOR):
            memory.popitem(last=False)
            self.stats[f"incidents.forgot.{what}"] += 1

    def _firing(self, a: AlertEvent, out: list[IncidentEvent]) -> None:
        seen = self._seen.get(a.id, (None,))[0] == a.started_at
        if a.id in self._by_alert or seen:
            # The same firing again (same id and started_at): at-least-once delivery. Seen now:
            # the hour it is remembered for runs from here.
            self.stats["incidents.ignored.repeated_alert"] += 1
            if seen:
                self._remember(self._seen, a, (a.started_at, self._clock), "seen")
            return
        bounded = self.stats["incidents.dropped.too_many_firing"] + self.stats["incidents.dropped.too_many_open"]
        self._take(a, out)
        # Not dropped at a bound (a redelivery, once there is room, is taken then): it was seen.
        if self.stats["incidents.dropped.too_many_firing"] + self.stats["incidents.dropped.too_many_open"] == bounded:
            self._remember(self._seen, a, (a.started_at, a.ts), "seen")
        held = self._early.get(a.id)
        if held is not None and held[0] == a.started_at:
            del self._early[a.id]
            self.stats["incidents.resolved_before_firing"] += 1
            self._end(a.id, held[1])

    def _take(self, a: AlertEvent, out: list[IncidentEvent]) -> None:
        """Open an incident for firing alert ``a``, or join it to one, and count it for the policies."""
        if len(self._by_alert) >= MAX_FIRING:
            self.stats["incidents.dropped.too_many_firing"] += 1
            return
        xid = _xid(a)
        app = self.config.application_xids
        inc = self._target(a)
        if inc is not None and self._by_time_alone(inc, a):
            # Only its GPU and the time tie it to ``inc``: a symptom stays, another fault goes.
            inc = self._reconsider(a, inc, symptom=self._rung(a) <= 0 or app.applies(a.rule, xid))
        # A symptom joined by time alone is a member, not a kind of the incident: were its rule and
        # family the incident's, the rest of another fault it began (an SBE burst in a thermal
        # incident, then the DBE) would join by family for as long as the incident stays open.
        alone = inc is not None and self._by_time_alone(inc, a)
        if inc is None and a.gpu is None and _comm(a) is None:
            inc = self._recurrence(a)  # a host-level fault back before its incident resolved
        if inc is not None and a.id in inc.members:
            # A member's firing event again after its resolution (at-least-once delivery): it
            # would fire in the incident for good, which then never resolves.
            self.stats["incidents.ignored.repeated_alert"] += 1
            return
        reason = ""
        if app.applies(a.rule, xid):
            n = self.history.note(
                (f"application_xid_{xid}", a.host or "", a.gpu), a.ts, a.id, keep=app.repeat, window=app.window
            )
            if inc is None and n < app.repeat:
                self.stats["incidents.suppressed.application_xid"] += 1
                return
            reason = f"XID {xid} {n} times in {_span(app.window)} on this GPU"
        if inc is None:
            inc = self._new(a, reason, out)
            if inc is None:
                return
        else:
            self._join(inc, a, out, alone=alone)
        # A repeat offender is a GPU or host: alerts without a host (fleet-wide ones) are none,
        # and counted under one empty host they would make a lemon of every hostless incident.
        for p in self._alert_policies if a.host is not None else ():
            if p.counts(a.rule, xid):
                self._count(p, inc, a.host or "", a.gpu if p.per == "gpu" else None, a.ts, a.id, out, xid)

    def _target(self, a: AlertEvent) -> _Incident | None:
        """The open incident that takes ``a`` (docs/architecture.md, "Incidents"): the latest one
        on its GPU that is of its family, recent (its last alert within ``join_window``) or
        explains it; else the latest one whose alerts explain it by a ``causality`` entry and that
        is still firing or recent. One that takes it by time alone ``_take`` reconsiders
        (``_reconsider``)."""
        fam = fault_family(a.fault)
        window = self.config.join_window
        same = [
            inc
            for inc in (self._index.on_gpu(a.host, a.gpu) if a.gpu is not None else {}).values()
            if fam in inc.families or a.ts - inc.last_join <= window or self._explains(inc, a, None)
        ]
        if same:
            return max(same, key=lambda inc: (inc.opened_at, inc.id))
        return self._causal(a)

    def _by_time_alone(self, inc: _Incident, a: AlertEvent) -> bool:
        """Whether ``inc`` takes ``a`` only by being on its GPU with an alert within
        ``join_window``: neither of its family nor explaining it."""
        return (
            a.gpu is not None
            and (inc.host, inc.gpu) == (a.host, a.gpu)
            and fault_family(a.fault) not in inc.families
            and not self._explains(inc, a, None)
        )

    def _reconsider(self, a: AlertEvent, inc: _Incident, *, symptom: bool) -> _Incident | None:
        """The incident ``a`` joins instead of ``inc``, which takes it by time alone
        (``_by_time_alone``): the latest opened on its GPU that is of its family or explains it
        (the latest opened there may be another fault's: an HBM error joins the GPU's HBM
        incident, not the thermal one opened since); else ``inc`` for a ``symptom`` (an alert
        calling for the ladder's lowest rung, a straggler or a link recovery, or an application's
        XID, on a GPU that just had a fault is that fault's); else, for an alert that calls for an
        action of its own (an HBM uncorrectable error minutes into a thermal incident, a fatal
        PCIe error after an SBE burst: another fault), one elsewhere whose alerts explain it
        (``_causal``), or none: it opens its own."""
        fam = fault_family(a.fault)
        own = [i for i in self._index.on_gpu(a.host, a.gpu).values() if fam in i.families or self._explains(i, a, None)]
        if own:
            return max(own, key=lambda i: (i.opened_at, i.id))
        return inc if symptom else self._causal(a)

    def _causal(self, a: AlertEvent) -> _Incident | None:
        """The latest open incident whose alerts explain ``a`` by a ``causality`` entry and that
        is still firing or recent (its last alert within ``join_window``)."""
        window = self.config.join_window
        comm = _comm(a)
        near: dict[str, _Incident] = {}
        tops: list[_Incident] = []
        for c in self.config.causality:
            if not c.explains_rule(a.rule):
                continue
            if c.reach == "host" or a.gpu is None:
                # A host-level alert: of its host's host-level incidents (every one of them, a
                # flood of telemetry gaps each its own), only those causing the entry may explain it.
                near.update(self._index.by_cause(a.host, c.name))
            else:  # what such an entry reaches on the host is on the alert's GPU
                near.update(self._index.on_gpu(a.host, a.gpu))
            if comm is not None and c.reach == "comm":
                top = self._index.comm_top(comm, c.name, a.ts, window=window, clock=self._clock)
                # (Only the latest joined is asked: one caused longer ago than ``within`` is not.)
                if top is not None and self._recent(top, c, a):
                    tops.append(top)
        best: _Incident | None = None
        for inc in near.values():
            if not inc.firing and a.ts - inc.last_join > window:
                continue
            if best is not None and (inc.last_join, inc.id) <= (best.last_join, best.id):
                continue
            if self._explains(inc, a, comm):
                best = inc
        for inc in tops:  # each explains ``a`` (it names the communicator and causes the entry)
            if best is None or (inc.last_join, inc.id) > (best.last_join, best.id):
                best = inc
        return best

    def _recurrence(self, a: AlertEvent) -> _Incident | None:
        """For a host-level alert that nothing else takes: the latest open host-level incident
        on its host rooted at an alert of its rule naming the same component (``WHERE_LABELS``:
        another NIC port's fall is another fault). A host-level fault that clears and comes
        back before its incident resolved (a telemetry gap, an NVSwitch SXid or a NIC port again
        more than ``join_window`` after its last alert joined, within ``quiet`` of its resolve)
        is that incident's, as a GPU's fault is its GPU's incident's (its family): not a second
        incident of one fault, open beside the first. Alerts naming a communicator are left to
        the communicator's causes, and one of another job than the incident's (two jobs' hung
        collectives on one host) is not a recurrence."""
        inc = self._index.latest_root(a.host, a.rule, _where(a))
        if inc is None:
            return None
        job = a.job[:MAX_TEXT] if a.job else None
        return inc if job is None or inc.job is None or job == inc.job else None

    def _explains(self, inc: _Incident, a: AlertEvent, comm: str | None) -> bool:
        for c in self.config.causality:
            if c.reach == "host":
                near = inc.host == a.host
            elif c.reach == "comm":  # its GPU, its host's host-level alerts, or a communicator it names
                near = (inc.host == a.host and (a.gpu is None or a.gpu == inc.gpu)) or (
                    comm is not None and comm in inc.comms
                )
            else:
                near = inc.host == a.host and inc.gpu == a.gpu
            if near and c.links(inc.rules, a.rule) and self._recent(inc, c, a):
                return True
        return False

    @staticmethod
    def _recent(inc: _Incident, c: Cause, a: AlertEvent) -> bool:
        """Whether ``a`` starts within entry ``c``'s ``within`` of the latest alert of a cause rule
        of ``c`` in ``inc`` (always, for an entry without one)."""
        return c.within is None or a.ts - inc.cause_at.get(c.name, inc.last_join) <= c.within

    def _new(self, a: AlertEvent, reason: str, out: list[IncidentEvent]) -> _Incident | None:
        iid = incident_id(a.id)
        if iid in self._open:
            # Its root's firing event again (delivered twice, after its resolution): a second
            # incident of the same id would replace the open one, which then never resolves.
            self.stats["incidents.ignored.repeated_alert"] += 1
            return None
        if len(self._open) >= self.max_open:
            self.stats["incidents.dropped.too_many_open"] += 1
            return None
        inc = _Incident(
            id=iid,
            root=IncidentRoot(alert=a.id, rule=a.rule, fault=a.fault),
            host=a.host,
            gpu=a.gpu,
            opened_at=a.ts,
            severity=a.severity,
            action=self.config.action_for(a.rule, a.severity),
            where=_where(a),
        )
        self._open[inc.id] = inc
        self._index.add_gpu(inc)
        self._index.add_root(inc)
        self._add(inc, a)
        self._say(out, inc, OPENED, a.ts, reason=reason)
        for p in self._incident_policies if a.host is not None else ():
            # Incidents opened within join_window of the last one counted on the host are one
            # episode: a fault whose GPUs' alerts came before its root's (an NVSwitch's links, a
            # second apart) or several GPUs failing at once is no lemon's recurrence over days.
            last = self.history.latest((p.name, a.host or "", None))
            if last is not None and abs(a.ts - last) <= self.config.join_window:
                self.stats[f"incidents.same_episode.{p.name}"] += 1
                continue
            self._count(p, inc, a.host or "", None, a.ts, inc.id, out, None)
        return inc

    def _join(self, inc: _Incident, a: AlertEvent, out: list[IncidentEvent], *, alone: bool = False) -> None:
        changes = [JOINED]
        self._add(inc, a, alone=alone)
        if SEVERITY_RANK.get(a.severity, 0) > SEVERITY_RANK.get(inc.severity, 0):
            inc.severity = a.severity
            changes.append(SEVERITY_ROSE)
        action = self.config.action_for(a.rule, a.severity)
        if self.config.rank(action) > self.config.rank(inc.action):
            inc.action = action
            changes.append(ESCALATED)
        self._say(out, inc, UPDATED, a.ts, changes=changes)

    def _add(self, inc: _Incident, a: AlertEvent, *, alone: bool = False) -> None:
        """Make ``a`` a member of ``inc``; ``alone``: joined by time alone (``_by_time_alone``), its
        rule and family are not the incident's."""
        if len(inc.members) < MAX_MEMBERS:
            inc.members.append(a.id)
        else:
            inc.more += 1
        inc.firing.add(a.id)
        self._by_alert[a.id] = inc.id
        # Rules and families are bounded as the state bounds them (stagestate.py).
        if not alone and a.rule not in inc.rules and len(inc.rules) < MAX_RULES:
            inc.rules.add(a.rule)
            causes = {c.name for c in self.config.causality if c.name not in inc.causes and c.caused_by((a.rule,))}
            inc.causes |= causes
            self._index.add_causes(inc, inc.comms, causes)
        if not alone:
            # When each entry it causes was last caused: what ``within`` is measured from.
            for c in self._timed:
                if c.name in inc.causes and c.caused_by((a.rule,)):
                    inc.cause_at[c.name] = max(inc.cause_at.get(c.name, a.ts), a.ts)
        if not alone and len(inc.families) < MAX_RULES:
            inc.families.add(fault_family(a.fault))
        comm = _comm(a)
        if comm is not None and comm not in inc.comms and len(inc.comms) < MAX_COMMS:
            inc.comms.add(comm)
            self._index.add_causes(inc, {comm}, inc.causes)
        inc.last_join = max(inc.last_join, a.ts)
        inc.quiet_due = None
        self._index.enter_comms(inc)
        inc.job = inc.job or (a.job[:MAX_TEXT] if a.job else None)
        inc.pod = inc.pod or _label(a, "pod")
        inc.namespace = inc.namespace or _label(a, "namespace")
        inc.mig_instance = inc.mig_instance or _label(a, MIG_INSTANCE_LABEL)
        inc.mig_profile = inc.mig_profile or _label(a, MIG_PROFILE_LABEL)

    # -- repeat offenders --------------------------------------------------------------------

    def _count(
        self,
        p: Policy,
        inc: _Incident,
        host: str,
        gpu: int | None,
        ts: float,
        what: str,
        out: list[IncidentEvent],
        xid: int | None,
    ) -> None:
        key = (p.name, host, gpu)
        n = self.history.note(key, ts, what, keep=p.threshold, window=p.window)
        if n < p.threshold or not self.history.escalate(key, ts, p.window):
            return
        # What was counted, by name: "link flaps" said of every rule's alerts misnamed all but NVLink's.
        counted = {"xid": f"XID {xid}", "alerts": f"{'/'.join(p.rules)} alerts", "incidents": "incidents"}[p.count]
        where = "this GPU" if p.per == "gpu" else "this host"
        reason = f"policy {p.name}: {counted} {n} times in {_span(p.window)} on {where}"
        if p.reason:
            reason += f": {p.reason}"
        if self.config.rank(p.action) > self.config.rank(inc.action):
            inc.action = p.action
        self.stats[f"incidents.escalated.{p.name}"] += 1
        self._say(out, inc, UPDATED, ts, changes=[ESCALATED], reason=reason, policy=p.name)

    # -- time --------------------------------------------------------------------------------

    def _expire(self, out: list[IncidentEvent]) -> None:
        # Not before the clock is ``hold`` past the due time: the feed puts a cause before the
        # symptoms it pulls, up to ``hold`` earlier, and a symptom that would have kept its
        # incident open had it come in time order must still find it open.
        while self._due and self._due[0][0] + self.config.hold <= self._clock:
            when, iid = heapq.heappop(self._due)
            inc = self._open.get(iid)
            if inc is None or inc.quiet_due != when:
                continue  # resolved already, or an alert joined it since
            del self._open[iid]
            self._index.remove(inc)
            self._say(out, inc, RESOLVED, when)

    def _say(
        self,
        out: list[IncidentEvent],
        inc: _Incident,
        state: str,
        ts: float,
        *,
        changes: list[str] | None = None,
        reason: str = "",
        policy: str | None = None,
    ) -> None:
        """Append an event of ``inc`` to ``out``, and remember it as the incident's latest. Never
        dated before the incident opened: a symptom the feed put after its cause (``hold``) joins
        at the cause's time."""
        ts = max(ts, inc.opened_at)
        inc.state, inc.updated_at, inc.changes = state, ts, list(changes or [])
        if reason:
            inc.reason, inc.policy = reason, policy
        out.append(self._event(inc, state, ts, changes=changes, reason=reason, policy=policy))

    def _event(
        self,
        inc: _Incident,
        state: str,
        ts: float,
        *,
        changes: list[str] | None = None,
        reason: str = "",
        policy: str | None = None,
    ) -> IncidentEvent:
        return IncidentEvent(
            incident=inc.id,
            state=state,
            ts=ts,
            opened_at=inc.opened_at,
            host=inc.host,
            gpu=inc.gpu,
            root=inc.root,
            members=list(inc.members),
            more_members=inc.more,
            severity=inc.severity,
            action=inc.action,
            changes=changes or [],
            reason=reason,
            policy=policy,
            job=inc.job,
            pod=inc.pod,
            namespace=inc.namespace,
            mig_instance=inc.mig_instance,
            mig_profile=inc.mig_profile,
        )


def _span(seconds: float) -> str:
    """``86400`` -> ``24h``: a window as the policies' reasons print it."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0 and not (unit == "d" and seconds < 2 * 86400):
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


def summary(stats: Counter[str]) -> dict[str, Any]:
    """The stage's counters as a sorted plain dict (for a driver to print or serve)."""
    return dict(sorted(stats.items()))
