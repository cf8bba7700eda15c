"""A built-in check on NCCL records: a collective that returned wrong results (silent data
corruption), as ``gpuwarden produce nccl-tests`` reports a burn-in run whose ``#wrong`` count or
``Out of bounds values`` check failed (``labels.wrong_results``, docs/producers.md#nccl-tests).

Wrong results are the worst a burn-in finds: the node computes, and its numbers are wrong. The
producer says so at CRITICAL and exits 3; this stage makes it an alert, ``nccl_wrong_results``
(critical), one per host: it fires at the event time of the first wrong record and keeps firing
until ``KEEP_FIRING_FOR`` after the last one (a clean run after it proves nothing: wrong results
in one collective and none in the next is the same faulty node). A run across several nodes is
logged on one of them (rank 0's): the alert is on that host, and says that any of the run's
nodes may be the one at fault.

Only the records that carry ``wrong_results`` are kept (``hold.Hold``), until the engine's
watermark passes them (``nccl_release``), so the alerts are the same however the stream was cut into batches.

>>> from pipeline.schema import NcclRecord
>>> st = WrongResults()
>>> bad = dict(host="n1", comm="nccl-tests:n1:7:run1", rank=0, nranks=8, nnodes=1, coll="AllReduce",
...            exec_time_us=90.0, job="j1")
>>> st.nccl_arrived([NcclRecord(ts=100.0, bytes=2**20, labels={"wrong_results": "true", "wrong": "12"}, **bad),
...                  NcclRecord(ts=100.0, bytes=2**21, labels={}, **bad)])
>>> [(a.state, a.fault, a.host, a.job, a.evidence["wrong_elements"]) for a in st.nccl_release(101.0)]
[('firing', 'nccl_wrong_results', 'n1', 'j1', 12.0)]
>>> [(a.state, a.ts) for a in st.nccl_release(100.0 + 3601.0)]
[('resolved', 3700.0)]
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import Any, Sequence

import msgspec

from pipeline.engine.alerts import transition_event
from pipeline.engine.hold import Hold
from pipeline.engine.lifecycle import Transition
from pipeline.engine.stage import StageBase
from pipeline.errors import StateError
from pipeline.numeric import finite
from pipeline.schema import AlertEvent, NcclRecord

RULE, FAULT, SEVERITY = "builtin_nccl_wrong_results", "nccl_wrong_results", "critical"
# The rule of a run across several nodes, or of a log that names none: which node is at fault is
# unknown, so incidents.yaml recommends no action on the host it was logged on (routes.yaml pages).
RULE_NODES = "builtin_nccl_wrong_results_nodes"
KEEP_FIRING_FOR = 3600.0  # seconds after the last wrong record: long enough to page and drain
MAX_HELD = 100_000  # wrong records waiting for the watermark; past it the oldest go
MAX_FIRING = 100_000  # hosts firing at once; past it the one that fired first resolves early
STATE_VERSION = 1
log = logging.getLogger(__name__)
_ORDER_KEYS = ("ts", "host", "comm", "bytes")


class _Firing(msgspec.Struct, array_like=True):
    """One host's alert while it fires: its id's start, its last wrong record's event time, and
    what its firing event said (its resolved event says the same)."""

    started: float
    last: float
    job: str | None
    summary: str
    evidence: dict[str, Any]
    labels: dict[str, str]
    rule: str = RULE


class _State(msgspec.Struct):
    version: int
    held: list[NcclRecord]
    firing: dict[str, _Firing]
    dropped: int = 0


_decode_state = msgspec.msgpack.Decoder(_State)


def wrong(r: NcclRecord) -> bool:
    """Whether ``r`` reports wrong results (``labels.wrong_results`` true).

    >>> wrong(NcclRecord(ts=1.0, host="n1", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=8,
    ...                  exec_time_us=1.0, labels={"wrong_results": "true"}))
    True
    """
    return r.labels.get("wrong_results", "").strip().lower() in ("true", "1", "yes")


class WrongResults(StageBase):
    """The ``nccl_wrong_results`` check (module docstring): a stage of the engine's built-ins,
    fed NCCL records as they arrive and judged when the watermark passes them."""

    kind = "nccl_results"
    host_local = True  # a host's alert reads its own records alone
    reads_nccl_records = True
    state_key = "nccl_results"

    def __init__(self, keep_firing_for: float = KEEP_FIRING_FOR) -> None:
        self.keep = keep_firing_for
        self.checks: list[Any] = []  # none of the engine's lifecycles: the stage keeps its own
        self.columns: set[int] = set()
        self._hold: Hold[NcclRecord] = Hold(NcclRecord, MAX_HELD, _ORDER_KEYS)
        self.firing: dict[str, _Firing] = {}
        self._summaries: dict[str, str] = {}
        self._due: list[tuple[float, str]] = []  # (deadline, host) of the firing alerts, a heap
        # How far the engine's rows ran (``advanced``): at the end of a stream (``nccl_release``
        # of inf) the deadlines before it have passed, as the rows' alerts' have.
        self._ran = -math.inf

    def run(self, view: Any, entities: Any, outputs: dict[str, Any]) -> Sequence[tuple[Any, Any]]:
        """No condition on DCGM rows: the alerts come from ``nccl_release``."""
        return ()

    @property
    def dropped(self) -> int:
        """Wrong-results records the hold let go past ``MAX_HELD``, the oldest first (a snapshot
        keeps the count)."""
        return self._hold.dropped

    def nccl_arrived(self, records: Sequence[NcclRecord]) -> None:
        """Keep the records that report wrong results until the watermark passes them."""
        # The key first: most NCCL records carry labels (``run``, ``source``), few this one.
        bad = [r for r in records if r.labels and "wrong_results" in r.labels and wrong(r)]
        if bad and (over := self._hold.arrive(bad)):
            log.warning("%d wrong-results NCCL records dropped: more than %d wait for the watermark", over, MAX_HELD)

    def advanced(self, upto: float, entities: Any) -> None:
        """Note how far the engine's rows ran (the end of a stream: its newest record)."""
        self._ran = max(self._ran, upto)

    def nccl_release(self, upto: float) -> list[AlertEvent]:
        """The alerts the held records before ``upto`` (inf: all) fire, and those whose
        ``keep_firing_for`` ran out before ``upto`` (inf: before the rows ran, ``advanced``),
        in event time."""
        go = self._hold.take(upto)
        out: list[AlertEvent] = []
        i = 0
        while i < len(go):
            ts = go[i].ts
            j = i
            while j < len(go) and go[j].ts == ts:
                j += 1
            out += self._expire(ts)  # a deadline before ``ts`` resolves; a record at it keeps firing
            out += self._fire(go[i:j])
            i = j
        out += self._expire(self._ran if math.isinf(upto) else upto)
        return out

    def _expire(self, before: float) -> list[AlertEvent]:
        """Resolve the alerts whose deadline is before ``before``, in deadline order: a heap of
        (deadline, host), an entry stale once its host's deadline moved on or it resolved, so a
        release costs the deadlines it passes, not the hosts firing."""
        out = []
        while self._due and self._due[0][0] < before:
            t, h = heapq.heappop(self._due)
            f = self.firing.get(h)
            if f is not None and f.last + self.keep == t:
                out.append(self._event("resolved", h, self.firing.pop(h), t))
        return out

    def _fire(self, recs: list[NcclRecord]) -> list[AlertEvent]:
        """One event time's wrong records: a host not firing fires, a firing one keeps firing."""
        by_host: dict[str, list[NcclRecord]] = {}
        for r in recs:
            by_host.setdefault(r.host, []).append(r)
        out = []
        for host, rs in by_host.items():
            f = self.firing.get(host)
            if f is not None:
                f.last = max(f.last, rs[0].ts)  # never earlier: a record out of order moves nothing back
                heapq.heappush(self._due, (f.last + self.keep, host))
                continue
            if len(self.firing) >= MAX_FIRING:
                first = min(self.firing, key=lambda h: self.firing[h].started)
                out.append(self._event("resolved", first, self.firing.pop(first), rs[0].ts))
            f = _firing(rs)
            self.firing[host] = f
            heapq.heappush(self._due, (f.last + self.keep, host))
            out.append(self._event("firing", host, f, f.started))
        return out

    def _event(self, state: str, host: str, f: _Firing, ts: float) -> AlertEvent:
        return transition_event(
            Transition(state, 0, ts, f.started, -1),
            rule=f.rule,
            fault=FAULT,
            severity=SEVERITY,
            key=host,
            host=host,
            job=f.job,
            evidence=f.evidence,
            labels=f.labels,
            summary=lambda: f.summary,
            summaries=self._summaries,
        )

    def to_state(self) -> bytes:
        """The held records and the firing alerts (msgpack)."""
        return msgspec.msgpack.encode(_State(STATE_VERSION, self._hold.records, self.firing, self._hold.dropped))

    def load_state(self, state: Any) -> None:
        """Take back ``to_state``'s data (None: a snapshot from before this stage: nothing)."""
        if state is None:
            return
        try:
            s = _decode_state.decode(state)
        except (TypeError, msgspec.DecodeError, msgspec.ValidationError) as e:
            raise StateError(f"nccl_results state: {e}") from None
        if s.version != STATE_VERSION:
            raise StateError(f"nccl_results state: version {s.version}, this build reads {STATE_VERSION}")
        self._hold.records, self.firing, self._hold.dropped = s.held, s.firing, s.dropped
        self._due = [(f.last + self.keep, h) for h, f in self.firing.items()]
        heapq.heapify(self._due)
        # A resolved event says what its firing one said: the summaries are the firing alerts'.
        self._summaries = {}

    def adopt(self, old: Any) -> set[str]:
        """Keep the old stage's held records and firing alerts (it has no engine lifecycles)."""
        if isinstance(old, WrongResults):
            self._hold, self.firing, self._summaries = old._hold, old.firing, old._summaries
            self._due = [(f.last + self.keep, h) for h, f in self.firing.items()]
            heapq.heapify(self._due)
        return set()


def _firing(rs: list[NcclRecord]) -> _Firing:
    """What one host's wrong records of one event time say, as its alert's firing event."""
    r0 = rs[0]
    wrong_sizes = sorted({r.bytes for r in rs if _num(r.labels.get("wrong")) or _num(r.labels.get("in_wrong"))})
    elements = sum((_num(r.labels.get("wrong")) or 0.0) + (_num(r.labels.get("in_wrong")) or 0.0) for r in rs)
    oob = max((_num(r.labels.get("out_of_bounds")) or 0.0 for r in rs), default=0.0)
    colls = sorted({r.coll for r in rs})
    runs = sorted({r.labels.get("run") or r.comm for r in rs})
    evidence: dict[str, Any] = {
        "wrong_elements": elements,
        "wrong_sizes": wrong_sizes[:16],
        "colls": colls[:8],
        "runs": runs[:8],
        "nranks": r0.nranks,
    }
    if oob:
        evidence["out_of_bounds"] = oob
    run_hosts = r0.labels.get("run_hosts", "")[:512]
    if run_hosts:
        evidence["run_hosts"] = run_hosts.split(",")
    labels = {"coll": ",".join(colls[:4]), "comm": r0.comm}
    if r0.nnodes:
        labels["nnodes"] = str(r0.nnodes)
    what = []
    if elements:
        what.append(f"{elements:g} wrong element(s) at {len(wrong_sizes)} message size(s)")
    if oob:
        what.append(f"{oob:g} out-of-bounds value(s)")
    found = f"returned wrong results ({'; '.join(what) or 'wrong_results'})"
    named = " (" + run_hosts.replace(",", ", ") + ")" if run_hosts else ""
    if r0.nnodes is None:  # a log without its rank lines: how many nodes ran it is unknown
        summary = (
            f"nccl-tests {', '.join(colls[:4])}, a run logged on {r0.host} that names none of its nodes, {found}: "
            "silent data corruption on one of its nodes; action: take them out of service and test each alone"
        )
    elif r0.nnodes > 1:
        summary = (
            f"nccl-tests {', '.join(colls[:4])}, a {r0.nnodes}-node run logged on {r0.host}{named}, {found}: silent data "
            "corruption on any of its nodes; action: take them out of service and test each alone"
        )
    else:
        summary = (
            f"nccl-tests {', '.join(colls[:4])} on {r0.host} {found}: silent data corruption; action: take the "
            "node out of service and run its diagnostics"
        )
    return _Firing(r0.ts, r0.ts, r0.job, summary, evidence, labels, RULE if r0.nnodes == 1 else RULE_NODES)


def _num(text: str | None) -> float | None:
    """A label's count (``"12"``, ``"1e+03"``), or None: not a finite number, or below zero."""
    x = finite(text)
    return x if x is not None and x >= 0 else None
