"""Rows to alerts: the checks' conditions through their lifecycles, their transitions as
``AlertEvent`` s, and host-level rows."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pipeline.engine.checks import GPU, HOST, TickCheck
from pipeline.engine.entities import Entities
from pipeline.engine.frame import DcgmFrame
from pipeline.engine.lifecycle import Lifecycle, Transition, alert_id
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


def held(conds: Sequence[tuple[Any, np.ndarray]]) -> tuple[np.ndarray, list[bool]]:
    """The stages' conditions of one tick's rows as one bool matrix (a row per check: true where
    the condition is exactly 1), and whether each holds on any row.

    >>> h, holds = held([(None, np.array([1.0, np.nan])), (None, np.array([False, False]))])
    >>> h.tolist(), holds
    ([[True, False], [False, False]], [True, False])
    """
    if not conds:
        return np.zeros((0, 0), dtype=bool), []
    h = np.stack([c for _, c in conds]) == 1
    return h, h.any(axis=1).tolist()


def stepped(
    conds: Sequence[tuple[StageCheck, np.ndarray]],
    chunk: DcgmFrame,
    lifecycles: Mapping[str, Lifecycle],
    entities: Entities,
) -> list[tuple[StageCheck, Transition]]:
    """Each check's condition on ``chunk``'s rows through its alert lifecycle (by check name),
    host-level checks per host; what changed, in (time, check, entity) order, each transition's
    ``row`` a row of ``chunk``.

    >>> from pipeline.engine.checks import CheckMeta
    >>> class C:
    ...     meta = CheckMeta(name="c", fault="gpu_x", severity="info")
    >>> ents = Entities()
    >>> ents.gpu_ids(["n1"], [0]).tolist()
    [0]
    >>> one = DcgmFrame(np.array([5.0]), np.array([0], np.int32), np.array([0], np.int32), np.empty((1, 0)))
    >>> [(c.meta.name, t.state) for c, t in stepped([(C(), np.array([True]))], one, {"c": Lifecycle(0, 0)}, ents)]
    [('c', 'firing')]
    """
    transitions: list[tuple[StageCheck, Transition]] = []
    n_gpus, n_hosts = entities.n_gpus, entities.n_hosts
    # Every condition as bool in one call, and which hold anywhere: a check whose condition
    # holds nowhere while its alerts are idle would step nothing, so the ~25 checks of a
    # healthy tick are skipped without numpy calls of their own (and host-level ones
    # without per_host's grouping, ~60 us a check).
    h, holds = held(conds)
    for i, (check, _) in enumerate(conds):
        lc = lifecycles[check.meta.name]
        level_gpu = check.meta.level == GPU
        n_ent = n_gpus if level_gpu else n_hosts
        if not holds[i] and lc.idle:
            lc.reserve(n_ent)  # as step would: the arrays (and snapshots) keep their length
            continue
        cond = h[i]
        if level_gpu:
            ts, ent, rows = chunk.ts, chunk.gpu, None
        else:
            # Host level: true for the host when true on any of its GPUs in this tick.
            ts, ent, cond, rows = per_host(chunk, cond)
        for t in lc.step(ts, ent, cond, n_ent):
            if rows is not None:
                t = Transition(t.state, t.entity, t.ts, t.started_at, int(rows[t.row]))
            transitions.append((check, t))
    transitions.sort(key=lambda ct: (ct[1].ts, ct[0].meta.name, ct[1].entity))
    return transitions
