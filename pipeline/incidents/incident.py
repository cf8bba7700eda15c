"""An open incident as the stage holds it (``_Incident``): its root, place, members and what they
say, and its latest event. Shared by the stage that groups alerts into it
(pipeline/incidents/stage.py), its lookup indexes (index.py) and its checkpoint (stagestate.py);
internal to the package (the stage's output is ``IncidentEvent``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.incidents.events import OPENED, IncidentRoot


@dataclass
class _Incident:
    id: str
    root: IncidentRoot
    host: str | None
    gpu: int | None
    opened_at: float
    severity: str
    action: str
    members: list[str] = field(default_factory=list)
    more: int = 0
    firing: set[str] = field(default_factory=set)
    rules: set[str] = field(default_factory=set)
    families: set[str] = field(default_factory=set)
    comms: set[str] = field(default_factory=set)
    # The ``causality`` entries its rules are a cause of (derived from ``rules``, not kept in the
    # state): under these alone it is indexed for the alerts it may explain.
    causes: set[str] = field(default_factory=set)
    last_join: float = 0.0
    # Per ``causality`` entry it causes, when the latest of its alerts of a cause rule started:
    # what an entry's ``within`` is measured from (an entry missing, from an older state: last_join).
    cause_at: dict[str, float] = field(default_factory=dict)
    # Which component of its host its root alert names (``WHERE_LABELS``: a NIC port), as
    # ``(label, value)`` pairs: a host-level alert of its root's rule rejoins it only from there.
    where: tuple[tuple[str, str], ...] = ()
    quiet_due: float | None = None
    job: str | None = None
    pod: str | None = None
    namespace: str | None = None
    mig_instance: str | None = None
    mig_profile: str | None = None
    # What its latest event said (``open_incidents``), and the latest escalation's reason: an
    # alert joining later must not hide from the live view why the action climbed. None: not
    # known (an incident built from state that does not hold it), its last alert's time stands in.
    state: str = OPENED
    updated_at: float | None = None
    changes: list[str] = field(default_factory=list)
    reason: str = ""
    policy: str | None = None
