"""The incident event: what the incident stage says, one record per change of an incident.

An incident is the group of alerts of one root cause (docs/architecture.md, "Incidents"). Its
events share the ``incident`` id, a hash of the root alert's id, so a replay and any batching of
the same alerts name it the same.
"""

from __future__ import annotations

import hashlib

import msgspec

from pipeline.schema import SCHEMA_VERSION

OPENED, UPDATED, RESOLVED = "opened", "updated", "resolved"
STATES = (OPENED, UPDATED, RESOLVED)
# What an ``updated`` event reports (``changes``), in this order when several come at once.
JOINED, SEVERITY_ROSE, ESCALATED = "alert_joined", "severity_rose", "action_escalated"
CHANGES = (JOINED, SEVERITY_ROSE, ESCALATED)


class IncidentRoot(msgspec.Struct, kw_only=True, gc=False):
    """The alert an incident started from: its id, rule and fault."""

    alert: str
    rule: str
    fault: str


class IncidentEvent(msgspec.Struct, tag="incident", tag_field="kind", kw_only=True):
    """One change of an incident: ``opened``, ``updated`` (``changes`` says what) or ``resolved``."""

    v: int = SCHEMA_VERSION
    incident: str
    state: str
    ts: float
    opened_at: float
    host: str | None
    gpu: int | None = None
    root: IncidentRoot
    members: list[str] = []  # alert ids, in the order they joined (at most MAX_MEMBERS)
    more_members: int = 0  # alerts that joined past MAX_MEMBERS: counted, not listed
    severity: str
    action: str
    changes: list[str] = []
    reason: str = ""  # why the action escalated: the policy and its count, for the audit log
    policy: str | None = None
    job: str | None = None
    pod: str | None = None
    namespace: str | None = None
    mig_instance: str | None = None
    mig_profile: str | None = None


def incident_id(root_alert_id: str) -> str:
    """The id of the incident an alert opens: the same for every run and batching.

    >>> incident_id("9d07a5a1ed71407f8b69")
    'inc-36f0f202ce7fe687'
    """
    return "inc-" + hashlib.sha256(root_alert_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
