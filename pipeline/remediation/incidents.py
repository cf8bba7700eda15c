"""Incident mode: ``<prefix>.incidents`` events as remediation sees them
(docs/remediation.md#incident-mode).

An incident event becomes one alert-shaped record (``incident_alert``) that routes, templates,
guardrails and the Alertmanager action already understand: its id is the incident's, its rule
and fault the root alert's, its labels carry ``incident`` and the recommended ``action``. Which
events act (``what_acts``): ``opened``; an ``updated`` whose ``changes`` hold
``action_escalated`` (once per rung: the claim is per incident and action); ``resolved`` runs
only a receiver's ``on_resolved``. Equivalence groups (``scope``): an action that takes a host
out covers the GPU actions on that host, and a host already taken out is not taken out again.
"""

from __future__ import annotations

import msgspec

from pipeline.bus.base import Topics
from pipeline.incidents.events import ESCALATED, JOINED, OPENED, RESOLVED, SEVERITY_ROSE, UPDATED, IncidentEvent
from pipeline.schema import MIG_INSTANCE_LABEL, MIG_PROFILE_LABEL, AlertEvent

SOURCES = ("alerts", "incidents")
INCIDENT_LABEL = "incident"
ACTION_LABEL = "action"
POLICY_LABEL = "policy"
# Labels of an incident that change while it is open: routes match on them, but they are not part
# of its Alertmanager identity (a changed label would make a second alert there).
VOLATILE_LABELS = (ACTION_LABEL, POLICY_LABEL)
HOST, GPU = "host", "gpu"

# What ``what_acts`` answers.
ACT, RESOLVE, NO = "act", "resolve", "no"


def incidents_topic(prefix: str) -> str:
    """The topic ``serve`` writes incident events to.

    >>> incidents_topic("gpuwarden")
    'gpuwarden.incidents'
    """
    return Topics(prefix).incidents


def decode_incident(value: bytes) -> IncidentEvent:
    """One message of the incidents topic; ``msgspec`` errors for anything else."""
    return msgspec.json.decode(value, type=IncidentEvent)


def incident_alert(ev: IncidentEvent) -> AlertEvent:
    """The alert-shaped record an incident event is routed and acted on as.

    >>> from pipeline.incidents.events import IncidentRoot
    >>> ev = IncidentEvent(incident="inc-1", state="opened", ts=5.0, opened_at=5.0, host="n1", gpu=3,
    ...                    root=IncidentRoot(alert="a1", rule="nvlink_xid74", fault="nvlink_xid74"),
    ...                    members=["a1"], severity="critical", action="drain_node")
    >>> a = incident_alert(ev)
    >>> (a.id, a.state, a.rule, a.family, a.labels["incident"], a.labels["action"])
    ('inc-1', 'firing', 'nvlink_xid74', 'nvlink', 'inc-1', 'drain_node')
    """
    labels = {INCIDENT_LABEL: ev.incident, ACTION_LABEL: ev.action}
    if ev.policy:
        labels[POLICY_LABEL] = ev.policy
    for name, value in (
        ("pod", ev.pod),
        ("namespace", ev.namespace),
        (MIG_INSTANCE_LABEL, ev.mig_instance),
        (MIG_PROFILE_LABEL, ev.mig_profile),
    ):
        if value:
            labels[name] = value
    where = (ev.host or "the fleet") + (f" GPU {ev.gpu}" if ev.gpu is not None else "")
    n = len(ev.members) + ev.more_members
    summary = f"incident {ev.incident}: {ev.root.fault} on {where}, {n} alert(s), action {ev.action}"
    if ev.reason:
        summary += f" ({ev.reason})"
    evidence = {
        "incident": ev.incident,
        "incident_state": ev.state,
        "action": ev.action,
        "root_alert": ev.root.alert,
        "members": n,
        "changes": list(ev.changes),
    }
    if ev.reason:
        evidence["reason"] = ev.reason
    if ev.policy:
        evidence["policy"] = ev.policy
    return AlertEvent(
        id=ev.incident,
        state="resolved" if ev.state == RESOLVED else "firing",
        fault=ev.root.fault,
        severity=ev.severity,
        rule=ev.root.rule,
        host=ev.host,
        gpu=ev.gpu,
        job=ev.job,
        ts=ev.ts,
        started_at=min(ev.opened_at, ev.ts),
        summary=summary,
        evidence=evidence,
        labels=labels,
    )


def what_acts(ev: IncidentEvent) -> tuple[str, str]:
    """(``act``, ``resolve`` or ``no``, and why not) for an incident event.

    >>> from pipeline.incidents.events import IncidentRoot
    >>> r = IncidentRoot(alert="a1", rule="hbm_dbe", fault="hbm_dbe")
    >>> ev = IncidentEvent(incident="inc-1", state="updated", ts=1.0, opened_at=0.0, host="n1", root=r,
    ...                    severity="critical", action="drain_node", changes=["alert_joined"])
    >>> what_acts(ev)[0]
    'no'
    """
    if ev.state == OPENED:
        return ACT, ""
    if ev.state == RESOLVED:
        return RESOLVE, ""
    if ev.state == UPDATED:
        if ESCALATED in ev.changes:
            return ACT, ""
        said = ", ".join(c for c in ev.changes if c in (JOINED, SEVERITY_ROSE)) or "no change"
        return NO, f"incident_update: {said}; the incident acts once, and again only when its action escalates"
    return NO, f"unknown incident state {ev.state!r} (opened, updated or resolved)"


def claim_state(ev: IncidentEvent) -> str:
    """What the once-only claim of an incident event is keyed on beside the incident id: one
    claim per rung of the ladder, so a redelivered event is a duplicate and an escalation to a
    rung acted on already does not act again.

    >>> from pipeline.incidents.events import IncidentRoot
    >>> r = IncidentRoot(alert="a1", rule="hbm_dbe", fault="hbm_dbe")
    >>> claim_state(IncidentEvent(incident="i", state="opened", ts=1.0, opened_at=1.0, host="n1", root=r,
    ...                           severity="critical", action="drain_node"))
    'firing:drain_node'
    """
    return "resolved" if ev.state == RESOLVED else f"firing:{ev.action}"


def scope(action: object) -> str | None:
    """The equivalence group of an action: ``host`` for one that takes a host out of service
    (drain, cordon, taint, a node-level command or webhook), ``gpu`` for one on a single GPU
    (a GPU reset), None for the rest (log, page, Alertmanager, a job's checkpoint, an undo)."""
    if not getattr(action, "disruptive", False) or getattr(action, "undo", False):
        return None
    entity = getattr(action, "entity", HOST)
    if entity == GPU:
        return GPU
    if entity == HOST and getattr(action, "breaker", False):
        return HOST
    return None
