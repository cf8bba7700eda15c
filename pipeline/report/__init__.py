"""Pages people look at: incident reports (``gpuwarden report``) and evaluation pages.

Both are one self-contained HTML file: figures are embedded PNGs, styles are inline, nothing is
fetched when the page opens, so it can be attached to a ticket or mailed as it is.
"""

from pipeline.report.alerts import Incident, load_alerts
from pipeline.report.incidents import IncidentSpan, load_incidents
from pipeline.report.render import eval_page, flatten_evidence, incident_page, write_page
from pipeline.report.signals import Signal, evidence_signals, load_checks
from pipeline.report.telemetry import load_telemetry

__all__ = [
    "Incident",
    "IncidentSpan",
    "Signal",
    "eval_page",
    "evidence_signals",
    "flatten_evidence",
    "incident_page",
    "load_alerts",
    "load_checks",
    "load_incidents",
    "load_telemetry",
    "write_page",
]
