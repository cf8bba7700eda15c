"""Incidents: the alerts of one root cause grouped, with repeat offenders escalated
(docs/architecture.md, "Incidents"; the YAML in docs/rules.md#incidents).

A layer above the alerts: it reads ``AlertEvent``s and never the engine, rules or models.
"""

from pipeline.incidents.config import IncidentConfig, default_config, load_config, parse_config
from pipeline.incidents.events import IncidentEvent, incident_id
from pipeline.incidents.feed import AlertFeed
from pipeline.incidents.history import RepeatHistory
from pipeline.incidents.stage import IncidentStage

__all__ = [
    "AlertFeed",
    "IncidentConfig",
    "IncidentEvent",
    "IncidentStage",
    "RepeatHistory",
    "default_config",
    "incident_id",
    "load_config",
    "parse_config",
]
