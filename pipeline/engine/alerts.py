"""Rows to alerts: a check's transitions as ``AlertEvent`` s, and host-level rows."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from pipeline.engine.checks import GPU, HOST, TickCheck
from pipeline.engine.entities import Entities
from pipeline.engine.frame import DcgmFrame
from pipeline.engine.lifecycle import Transition, alert_id
from pipeline.engine.stage import StageCheck
from pipeline.schema import AlertEvent


def transition_event(
    t: Transition,
    *,
    rule: str,
    fault: str,
    severity: str,
    key: str,
    host: str,
    gpu: int | None = None,
    job: str | None = None,
    evidence: dict[str, Any],
    labels: dict[str, str],
    summary: Callable[[], str],
    summaries: dict[str, str],
) -> AlertEvent:
    """The alert event of a lifecycle's transition ``t`` of ``rule`` on the entity ``key`` names
    (its id: ``alert_id``). A firing event keeps ``summary()`` in ``summaries`` under its id; a
    resolved one says what its firing one was about, not the (healthy) values that ended it
    (``summary()`` when none was kept).

    >>> kept: dict[str, str] = {}
    >>> kw = dict(rule="r", fault="f", severity="warning", key="n1", host="n1", evidence={}, labels={}, summaries=kept)
    >>> on = transition_event(Transition("firing", 0, 12.0, 10.0, -1), summary=lambda: "hot", **kw)
    >>> off = transition_event(Transition("resolved", 0, 20.0, 10.0, -1), summary=lambda: "cool", **kw)
    >>> (on.id == off.id, off.summary, kept)
    (True, 'hot', {})
    """
    aid = alert_id(rule, key, t.started_at)
    if t.state == "firing":
        text = summaries[aid] = summary()
    else:
        text = summaries.pop(aid, "") or summary()
    return AlertEvent(
        id=aid,
        state=t.state,
        fault=fault,
        severity=severity,
        rule=rule,
        host=host,
        gpu=gpu,
        job=job,
        ts=t.ts,
        started_at=t.started_at,
        summary=text,
        evidence=evidence,
        labels=labels,
    )


def alert_event(
    check: StageCheck | TickCheck,
    t: Transition,
    evidence: dict[str, Any],
    entities: Entities,
    summaries: dict[str, str],
) -> AlertEvent:
    """The alert event of ``check``'s transition ``t`` (``transition_event``). ``summaries``:
    alert id -> summary of the alerts firing, kept so that a resolved event says what the alert
    was about."""
    meta = check.meta
    if meta.level == GPU:
        host, gpu = entities.gpus[t.entity]
        key = f"{host}/{gpu}"
    elif meta.level == HOST:
        host, gpu = entities.hosts[t.entity], None
        key = host
    else:  # pragma: no cover - levels are validated when checks are built
        raise ValueError(meta.level)
    # The job (pod, namespace) from the telemetry; the rule's own labels win a clash.
    jl = entities.job_labels(t.entity) if meta.level == GPU else entities.host_job_labels(t.entity)
    job = jl.pop("job", None)
    return transition_event(
        t,
        rule=meta.name,
        fault=meta.fault,
        severity=meta.severity,
        key=key,
        host=host,
        gpu=gpu,
        job=job,
        evidence=evidence,
        labels={**jl, **meta.labels},
        summary=lambda: check.summary(host, gpu, evidence),
        summaries=summaries,
    )


def per_host(chunk: DcgmFrame, cond: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Collapse per-GPU rows to one row per host: (ts, host id, any(cond), representative row)."""
    hosts, inv = np.unique(chunk.host, return_inverse=True)
    ts = np.full(len(hosts), -np.inf)
    np.maximum.at(ts, inv, chunk.ts)
    anyc = np.zeros(len(hosts), dtype=bool)
    np.logical_or.at(anyc, inv, cond)
    # Evidence from the first GPU where it holds, else the host's first row.
    idx = np.arange(len(chunk))
    pick = np.where(cond, idx, len(chunk) + idx)
    best = np.full(len(hosts), np.iinfo(np.int64).max)
    np.minimum.at(best, inv, pick)
    rows = np.where(best >= len(chunk), best - len(chunk), best)
    return ts, hosts.astype(np.int32), anyc, rows
