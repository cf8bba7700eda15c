"""Rows to alerts: a check's transitions as ``AlertEvent`` s, and host-level rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.engine.checks import GPU, HOST, TickCheck
from pipeline.engine.entities import Entities
from pipeline.engine.frame import DcgmFrame
from pipeline.engine.lifecycle import Transition, alert_id
from pipeline.engine.stage import StageCheck
from pipeline.schema import AlertEvent


def alert_event(
    check: StageCheck | TickCheck,
    t: Transition,
    evidence: dict[str, Any],
    entities: Entities,
    summaries: dict[str, str],
) -> AlertEvent:
    """The alert event of ``check``'s transition ``t``. ``summaries``: alert id -> summary of
    the alerts firing, kept so that a resolved event says what the alert was about."""
    meta = check.meta
    if meta.level == GPU:
        host, gpu = entities.gpus[t.entity]
        key = f"{host}/{gpu}"
    elif meta.level == HOST:
        host, gpu = entities.hosts[t.entity], None
        key = host
    else:  # pragma: no cover - levels are validated when checks are built
        raise ValueError(meta.level)
    aid = alert_id(meta.name, key, t.started_at)
    if t.state == "firing":
        summary = summaries[aid] = check.summary(host, gpu, evidence)
    else:
        # A resolved event says what the alert was about, not the (healthy) values that ended it.
        summary = summaries.pop(aid, "") or check.summary(host, gpu, evidence)
    # The job (pod, namespace) from the telemetry; the rule's own labels win a clash.
    jl = entities.job_labels(t.entity) if meta.level == GPU else entities.host_job_labels(t.entity)
    job = jl.pop("job", None)
    return AlertEvent(
        id=aid,
        state=t.state,
        fault=meta.fault,
        severity=meta.severity,
        rule=meta.name,
        host=host,
        gpu=gpu,
        job=job,
        ts=t.ts,
        started_at=t.started_at,
        summary=summary,
        evidence=evidence,
        labels={**jl, **meta.labels},
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
