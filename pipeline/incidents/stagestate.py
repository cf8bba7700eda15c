"""The incident stage's state as plain data, and its checked way back (``IncidentStage.to_state``
and ``load_state``): its open incidents, its clock, its repeat-offender history, the firings it
remembers (``seen``) and the resolves it holds for their firing (``early``), lists of strings and
numbers, msgpack- and JSON-able, no pickle, so a service can checkpoint it beside its other state
(docs/architecture.md, "Incidents"). A state without ``seen`` or ``early`` (written before they
were kept) loads with them empty.

Only what cannot be derived is kept: the indexes (by alert, host, communicator) and the timer
heap are rebuilt from the incidents on load.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pipeline.errors import StateError
from pipeline.incidents.events import IncidentRoot
from pipeline.incidents.history import RepeatHistory

if TYPE_CHECKING:
    from pipeline.incidents.incident import _Incident
    from pipeline.incidents.stage import IncidentStage

STATE_VERSION = 1
# _Incident's fields in the order a row holds them.
FIELDS = (
    "id", "root", "host", "gpu", "opened_at", "severity", "action", "members", "more", "firing", "rules",
    "families", "comms", "last_join", "quiet_due", "job", "pod", "namespace", "mig_instance", "mig_profile",
    "state", "updated_at", "changes", "reason", "policy", "cause_at", "where",
)  # fmt: skip
# A row of a state written before ``cause_at`` and ``where`` were kept lacks them: it loads with
# none (``within`` is then measured from the incident's last alert; no component named).
OPTIONAL = ("cause_at", "where")
MAX_REASON = 4096  # characters of the latest escalation's reason kept


def dump(stage: "IncidentStage") -> dict[str, Any]:
    """``stage``'s state (see the module docstring)."""
    rows = []
    for inc in stage._open.values():
        rows.append(
            [
                inc.id,
                [inc.root.alert, inc.root.rule, inc.root.fault],
                inc.host,
                inc.gpu,
                inc.opened_at,
                inc.severity,
                inc.action,
                list(inc.members),
                inc.more,
                sorted(inc.firing),
                sorted(inc.rules),
                sorted(inc.families),
                sorted(inc.comms),
                inc.last_join,
                inc.quiet_due,
                inc.job,
                inc.pod,
                inc.namespace,
                inc.mig_instance,
                inc.mig_profile,
                inc.state,
                inc.updated_at,
                list(inc.changes),
                inc.reason,
                inc.policy,
                sorted([name, ts] for name, ts in inc.cause_at.items()),
                [list(kv) for kv in inc.where],
            ]
        )
    return {
        "v": STATE_VERSION,
        "clock": None if math.isinf(stage._clock) else stage._clock,
        "open": rows,
        "history": stage.history.to_state(),
        # Oldest first, as the stage forgets them.
        "seen": [[i, started, ts] for i, (started, ts) in stage._seen.items()],
        "early": [[i, started, ts] for i, (started, ts) in stage._early.items()],
    }


def load(stage: "IncidentStage", state: Any) -> None:
    """Replace ``stage``'s state with ``state``; ``StateError`` naming what is wrong (a forged or
    damaged state) leaves the stage as it was."""
    from pipeline.incidents.config import MAX_ENTRIES
    from pipeline.incidents.events import CHANGES, OPENED, UPDATED
    from pipeline.incidents.incident import _Incident
    from pipeline.incidents.index import IncidentIndex
    from pipeline.incidents.stage import MAX_COMMS, MAX_FIRING, MAX_GPU, MAX_MEMBERS, MAX_RULES, MAX_TEXT

    if not isinstance(state, dict) or state.get("v") != STATE_VERSION or not isinstance(state.get("open"), list):
        raise StateError(f"incident stage state: not a version {STATE_VERSION} state")
    clock = -math.inf if state.get("clock") is None else _num(state["clock"], "clock")
    rows = state["open"]
    if len(rows) > stage.max_open:
        raise StateError(f"incident stage state: {len(rows)} open incidents, more than the limit of {stage.max_open}")
    history = RepeatHistory(stage.history.max_keys)
    history.load_state(state.get("history"))
    incidents: dict[str, _Incident] = {}
    n_firing = 0
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or not len(FIELDS) - len(OPTIONAL) <= len(row) <= len(FIELDS):
            raise StateError(f"incident stage state: incident {i} is not a row of {len(FIELDS)} fields")
        f = dict(zip(FIELDS, row))

        def text(name: str, none: bool = False) -> Any:
            v = f[name]
            if v is None and none:
                return None
            if not isinstance(v, str) or len(v) > MAX_TEXT:
                raise StateError(f"incident stage state: incident {i}: {name} is not text of at most {MAX_TEXT}")
            return v

        def texts(name: str, limit: int) -> list[str]:
            v = f[name]
            if not isinstance(v, (list, tuple)) or len(v) > limit:
                raise StateError(f"incident stage state: incident {i}: {name} is not a list of at most {limit}")
            for x in v:
                if not isinstance(x, str) or len(x) > MAX_TEXT:
                    raise StateError(f"incident stage state: incident {i}: {name} holds other than short text")
            return list(v)

        root = f["root"]
        if not isinstance(root, (list, tuple)) or len(root) != 3 or not all(isinstance(x, str) for x in root):
            raise StateError(f"incident stage state: incident {i}: root is not [alert, rule, fault]")
        gpu = f["gpu"]
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < MAX_GPU):
            raise StateError(f"incident stage state: incident {i}: gpu {gpu!r} is not an index")
        more = f["more"]
        if isinstance(more, bool) or not isinstance(more, int) or more < 0:
            raise StateError(f"incident stage state: incident {i}: more is not a count")
        firing = texts("firing", MAX_FIRING)
        n_firing += len(firing)
        if n_firing > MAX_FIRING:
            raise StateError(f"incident stage state: more than {MAX_FIRING} firing member alerts")
        inc = _Incident(
            id=text("id"),
            root=IncidentRoot(alert=root[0][:MAX_TEXT], rule=root[1][:MAX_TEXT], fault=root[2][:MAX_TEXT]),
            host=text("host", none=True),
            gpu=gpu,
            opened_at=_num(f["opened_at"], f"incident {i}: opened_at"),
            severity=text("severity"),
            action=text("action"),
            members=texts("members", MAX_MEMBERS),
            more=more,
            firing=set(firing),
            rules=set(texts("rules", MAX_RULES)),
            families=set(texts("families", MAX_RULES)),
            comms=set(texts("comms", MAX_COMMS)),
            last_join=_num(f["last_join"], f"incident {i}: last_join"),
            quiet_due=None if f["quiet_due"] is None else _num(f["quiet_due"], f"incident {i}: quiet_due"),
            job=text("job", none=True),
            pod=text("pod", none=True),
            namespace=text("namespace", none=True),
            mig_instance=text("mig_instance", none=True),
            mig_profile=text("mig_profile", none=True),
        )
        if f["state"] not in (OPENED, UPDATED):
            raise StateError(
                f"incident stage state: incident {i}: state {str(f['state'])[:32]!r} is not opened or updated"
            )
        changes = texts("changes", len(CHANGES))
        if not set(changes) <= set(CHANGES):
            raise StateError(f"incident stage state: incident {i}: changes are not of {', '.join(CHANGES)}")
        reason = f["reason"]
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise StateError(f"incident stage state: incident {i}: reason is not text of at most {MAX_REASON}")
        inc.state, inc.changes, inc.reason, inc.policy = f["state"], changes, reason, text("policy", none=True)
        inc.updated_at = None if f["updated_at"] is None else _num(f["updated_at"], f"incident {i}: updated_at")
        inc.cause_at = _cause_at(f.get("cause_at", []), i, MAX_ENTRIES, MAX_TEXT)
        inc.where = _where(f.get("where", []), i, MAX_TEXT)
        if inc.id in incidents:
            raise StateError(f"incident stage state: incident {inc.id!r} twice")
        incidents[inc.id] = inc
    by_alert: dict[str, str] = {}
    for inc in incidents.values():
        for a in inc.firing:
            if a in by_alert:
                raise StateError(f"incident stage state: alert {a!r} fires in two incidents")
            by_alert[a] = inc.id
    seen = {r[0]: (r[1], r[2]) for r in _rows(state.get("seen"), 3, "seen", stage.max_seen)}
    early = {r[0]: (r[1], r[2]) for r in _rows(state.get("early"), 3, "early", stage.max_seen)}
    # Every check passed: only now does the stage change.
    stage._open = incidents
    stage._by_alert = by_alert
    stage._index = IncidentIndex(stage._index.comm_reach)
    stage._due = []
    for inc in incidents.values():
        stage._index.add_gpu(inc)
        stage._index.add_root(inc)
        inc.causes = {c.name for c in stage.config.causality if c.caused_by(inc.rules)}
        stage._index.add_causes(inc, inc.comms, inc.causes)
        if inc.quiet_due is not None:
            stage._due.append((inc.quiet_due, inc.id))
    heapq.heapify(stage._due)
    stage._clock = clock
    stage.history = history
    stage._seen = OrderedDict(seen)
    stage._early = OrderedDict(early)


def _cause_at(v: Any, i: int, limit: int, max_text: int) -> dict[str, float]:
    """An incident's checked ``cause_at``: ``[entry name, time]`` pairs, each name once."""
    if not isinstance(v, (list, tuple)) or len(v) > limit:
        raise StateError(f"incident stage state: incident {i}: cause_at is not a list of at most {limit}")
    out: dict[str, float] = {}
    for row in v:
        if not isinstance(row, (list, tuple)) or len(row) != 2 or not isinstance(row[0], str) or len(row[0]) > max_text:
            raise StateError(f"incident stage state: incident {i}: cause_at holds other than [name, time] pairs")
        if row[0] in out:
            raise StateError(f"incident stage state: incident {i}: cause_at names {row[0][:64]!r} twice")
        out[row[0]] = _num(row[1], f"incident {i}: cause_at")
    return out


def _where(v: Any, i: int, max_text: int) -> tuple[tuple[str, str], ...]:
    """An incident's checked ``where``: ``[label, value]`` pairs of ``WHERE_LABELS``, in order."""
    from pipeline.incidents.stage import WHERE_LABELS

    if not isinstance(v, (list, tuple)) or len(v) > len(WHERE_LABELS):
        raise StateError(f"incident stage state: incident {i}: where is not a list of at most {len(WHERE_LABELS)}")
    pairs = []
    for row in v:
        if (
            not isinstance(row, (list, tuple))
            or len(row) != 2
            or row[0] not in WHERE_LABELS
            or not isinstance(row[1], str)
            or len(row[1]) > max_text
        ):
            raise StateError(f"incident stage state: incident {i}: where holds other than [label, value] pairs")
        pairs.append((row[0], row[1]))
    if [k for k, _ in pairs] != [k for k in WHERE_LABELS if k in dict(pairs)]:
        raise StateError(f"incident stage state: incident {i}: where names a label twice or out of order")
    return tuple(pairs)


def _rows(v: Any, width: int, what: str, limit: int) -> list[list[Any]]:
    """Checked ``[alert id, number, ...]`` rows of ``seen`` or ``early``, each id once; None: none."""
    from pipeline.incidents.stage import MAX_TEXT

    if v is None:
        return []
    if not isinstance(v, (list, tuple)) or len(v) > limit:
        raise StateError(f"incident stage state: {what} is not a list of at most {limit}")
    rows, ids = [], set()
    for i, row in enumerate(v):
        if not isinstance(row, (list, tuple)) or len(row) != width:
            raise StateError(f"incident stage state: {what} {i} is not a row of {width} fields")
        if not isinstance(row[0], str) or not row[0] or len(row[0]) > MAX_TEXT:
            raise StateError(f"incident stage state: {what} {i}: alert id is not text of at most {MAX_TEXT}")
        if row[0] in ids:
            raise StateError(f"incident stage state: {what}: alert {row[0]!r} twice")
        ids.add(row[0])
        rows.append([row[0], *(_num(x, f"{what} {i}: time") for x in row[1:])])
    return rows


def _num(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise StateError(f"incident stage state: {what} is not a finite number")
    return float(v)
