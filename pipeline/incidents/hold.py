"""Which alert waits for its cause: the incident stage's ``hold`` (docs/architecture.md, "Incidents").

The incident stage takes alerts in event time, so a symptom that comes a moment before its cause
opens an incident of its own: an NVSwitch fault whose GPUs' XID 74s fall a second before the
switch's SXid gave an incident (and a page) per GPU. The ``AlertFeed`` before the stage therefore
holds a *possible symptom* (a firing alert some ``causality`` entry explains on another entity of
its host) for ``hold`` seconds of event time, and puts a *cause* of it that comes in its second or
within those seconds (an alert on its host, of another GPU or the host itself, whose rule causes
that entry) just before it: the cause opens its incident and the symptom joins it, as if they had
come in that order (Alertmanager's ``group_wait``, here only where a cause may still come).

The alerts of one GPU (or of the host itself) join by entity whatever their order, so a cause on
the symptom's own entity is not moved, nor one the symptom explains in turn (they join each other
whichever comes first): the first alert stays the root. Communicators spanning hosts are not
looked at: a cause on another host stays where event time puts it.
"""

from __future__ import annotations

from typing import Any

from pipeline.incidents.config import IncidentConfig
from pipeline.schema import AlertEvent

MAX_CACHED = 10_000  # rule pairs remembered; hostile rule names must not grow the caches for good


class CauseHold:
    """What the ``AlertFeed`` asks of ``config``'s causality: ``symptom``, ``cause``, ``pulls``
    (and ``may_pull``, its part that depends on the rules only).

    >>> from pipeline.incidents.config import Cause, IncidentConfig
    >>> fabric = Cause("nvswitch_fabric", ("nvlink_nvswitch_*",), ("nvlink_*",), "host")
    >>> hold = CauseHold(IncidentConfig(causality=(fabric,), hold=5.0))
    >>> def alert(rule, gpu, ts):
    ...     return AlertEvent(id=f"{rule}{gpu}", state="firing", fault="f", severity="critical", rule=rule,
    ...                       host="n1", gpu=gpu, ts=ts, started_at=ts)
    >>> xid74, sxid = alert("nvlink_xid74", 3, 10.0), alert("nvlink_nvswitch_fatal_sxid", None, 11.0)
    >>> hold.symptom(xid74), hold.cause(sxid), hold.pulls(sxid, xid74)
    (True, True, True)
    >>> hold.pulls(alert("nvlink_nvswitch_fatal_sxid", 3, 11.0), xid74)  # its own GPU: joins by entity
    False
    """

    def __init__(self, config: IncidentConfig) -> None:
        self.seconds = config.hold
        # Entries a cause on another entity of the host may act through: ``host`` reach, and
        # ``comm`` for a host-level alert (its host's GPUs' alerts explain it, pipeline/incidents/stage.py).
        self._host = [c for c in config.causality if c.reach == "host"]
        self._comm = [c for c in config.causality if c.reach == "comm"]
        self._symptoms: dict[tuple[str, bool], bool] = {}
        self._causes: dict[str, bool] = {}
        self._pairs: dict[tuple[str, str, bool], bool] = {}

    def symptom(self, a: AlertEvent) -> bool:
        """Whether firing alert ``a`` may be explained by a cause on another entity of its host."""
        if a.state != "firing" or a.host is None:
            return False
        key = (a.rule, a.gpu is None)
        got = self._symptoms.get(key)
        if got is None:
            got = any(c.explains_rule(a.rule) for c in self._entries(a.gpu is None))
            _put(self._symptoms, key, got)
        return got

    def cause(self, a: AlertEvent) -> bool:
        """Whether firing alert ``a`` may explain an alert on another entity of its host."""
        if a.state != "firing" or a.host is None:
            return False
        got = self._causes.get(a.rule)
        if got is None:
            got = any(c.caused_by((a.rule,)) for c in (*self._host, *self._comm))
            _put(self._causes, a.rule, got)
        return got

    def pulls(self, cause: AlertEvent, symptom: AlertEvent) -> bool:
        """Whether ``cause`` goes before ``symptom`` when it comes within ``seconds`` after it:
        on its host, another entity, a cause of an entry that explains it, and not explained by
        it in turn (alerts that explain each other, a PCIe path's errors, join whichever comes
        first: the first stays the root)."""
        return (
            cause.host == symptom.host
            and cause.gpu != symptom.gpu
            and self.may_pull(cause.rule, symptom)
            and not self.may_pull(symptom.rule, cause)
        )

    def may_pull(self, rule: str, symptom: AlertEvent) -> bool:
        """Whether an alert of ``rule`` on another entity of its host goes before ``symptom``."""
        key = (rule, symptom.rule, symptom.gpu is None)
        got = self._pairs.get(key)
        if got is None:
            got = any(c.links((rule,), symptom.rule) for c in self._entries(symptom.gpu is None))
            _put(self._pairs, key, got)
        return got

    def _entries(self, host_level: bool) -> list[Any]:
        return [*self._host, *self._comm] if host_level else self._host


def _put(cache: dict[Any, bool], key: Any, value: bool) -> None:
    if len(cache) >= MAX_CACHED:
        cache.clear()
    cache[key] = value
