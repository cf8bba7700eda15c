"""The hang detector's state as plain data, and its checked way back (``HangDetector.to_state``
and ``load_state``): communicators, their ranks, firing alerts, the clock and the counts, lists
and maps of strings and numbers, msgpack- and JSON-able, no pickle. The detector's indexes and
its heap of due deadlines are rebuilt from them on load."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pipeline.errors import StateError
from pipeline.hang import MAX_LISTED, STATE_VERSION, Settings, _Alert, _Comm, _Rank

if TYPE_CHECKING:
    from pipeline.hang import HangDetector


def dump(det: "HangDetector") -> dict[str, Any]:
    """``det``'s state as plain data."""
    return {
        "version": STATE_VERSION,
        "now": det.now,
        "comms": [
            {
                "job": c.job, "comm": c.comm, "name": c.name, "nranks": c.nranks, "evidence_at": c.evidence_at,
                "reported": c.reported,
                "seq": c.seq, "op": c.op, "timeout_ms": c.timeout_ms, "last_ts": c.last_ts, "top": c.top,
                "top_since": c.top_since if c.top is not None else None,
                "watch": c.watch if math.isfinite(c.watch) else None,
                "firing": None if c.firing is None else {**c.firing, "waiting": sorted(c.firing["waiting"])},
                "untracked": c.untracked, "sources": sorted(c.sources),
                "ranks": [[i, k.host, k.gpu, k.state, k.progress, k.enqueued, k.since, k.ts]
                          for i, k in c.ranks.items()],
            }
            for c in det.comms.values()
        ],
        "alerts": [
            {"id": a.id, "job": a.job, "started_at": a.started_at, "suspects": [list(s) for s in a.suspects],
             "summary": a.summary, "host": a.host, "gpu": a.gpu, "members": a.members, "live": sorted(a.live)}
            for a in det.alerts.values()
        ],
        "stats": dict(det.stats),
    }  # fmt: skip


def load(state: Any, config: Settings) -> tuple[dict[tuple[str, str], _Comm], dict[str, _Alert], float, dict[str, int]]:
    """The communicators, firing alerts, clock and counts of ``state``, checked against
    ``config``'s bounds; a ``StateError`` for anything ``dump`` (or a version-1 state) did not write."""
    try:
        if not isinstance(state, dict) or state.get("version") not in (1, STATE_VERSION):
            raise StateError(f"hang detector state: not a version-1 or -{STATE_VERSION} state")
        v1 = state["version"] == 1
        comms: dict[tuple[str, str], _Comm] = {}
        alerts: dict[str, _Alert] = {}
        for d in state["comms"][: config.max_communicators]:
            c = _Comm(_opt_str(d["job"]), _opt_str(d["comm"]), _opt_str(d["name"]), _opt_int(d["nranks"]))
            c.evidence_at = _opt_float(d["evidence_at"])
            # A state written before the flag: as before it, the evidence stands.
            rep = d.get("reported")
            c.reported = rep if isinstance(rep, bool) else c.evidence_at is not None
            c.seq, c.op, c.timeout_ms = _opt_int(d["seq"]), _opt_str(d["op"]), _opt_int(d["timeout_ms"])
            c.last_ts, c.untracked, c.top = float(d["last_ts"]), int(d["untracked"]), _opt_int(d["top"])
            c.sources = set() if v1 else {_str(s) for s in d["sources"]}
            if c.top is not None:
                # A state written before these: the top taken as rising at the last report.
                since = _opt_float(d.get("top_since"))
                c.top_since = since if since is not None else c.last_ts
            # A watch set before any rank reported a number (a settle that found no hang) too.
            if "watch" in d or c.top is not None:
                watch = _opt_float(d.get("watch")) if "watch" in d else c.top_since + config.stuck_after_s
                c.watch = watch if watch is not None else math.inf
            for i, host, gpu, st, prog, enq, since, ts in d["ranks"][: config.max_ranks]:
                c.ranks[int(i)] = _Rank(
                    str(host), _opt_int(gpu), str(st), _opt_int(prog), _opt_int(enq), float(since), float(ts)
                )
            f = d["firing"]
            if f is not None:
                c.firing = {
                    "alert": _str(f["id"] if v1 else f["alert"]), "ranks": [int(i) for i in f["ranks"]],
                    "waiting": {int(i) for i in f["waiting"]}, "peak": _opt_int(f["peak"]),
                    "silent": [int(i) for i in f.get("silent", [])],  # none in a state written before it
                }  # fmt: skip
                if v1:  # each firing communicator was an alert of its own
                    who = [(c.ranks[i].host, c.ranks[i].gpu) for i in c.firing["ranks"] if i in c.ranks]
                    a = _Alert(c.firing["alert"], c.job, float(f["started_at"]), who, _str(f["summary"]),
                               _opt_str(f["host"]), _opt_int(f["gpu"]), [], set())  # fmt: skip
                    a.members.append({"comm": c.comm, "name": c.name, "sources": [],
                                      "suspects": c.firing["ranks"][:MAX_LISTED], "nranks": c.nranks})  # fmt: skip
                    a.live.add(c.comm or "")
                    alerts[a.id] = a
            comms[(c.job or "", c.comm or "")] = c
        for d in [] if v1 else state["alerts"][: config.max_communicators]:
            a = _Alert(
                _str(d["id"]), _opt_str(d["job"]), float(d["started_at"]),
                [(_str(h), _opt_int(g)) for h, g in d["suspects"]], _str(d["summary"]),
                _opt_str(d["host"]), _opt_int(d["gpu"]), [_member(m) for m in d["members"]],
                {_str(s) for s in d["live"]},
            )  # fmt: skip
            alerts[a.id] = a
        for c in comms.values():
            if c.firing is not None and c.firing["alert"] not in alerts:
                raise StateError(f"hang detector state: communicator {c.comm!r} joined an alert it does not hold")
        now = float(state["now"])
        stats = {str(k): int(v) for k, v in state["stats"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StateError(f"hang detector state: {e}") from e
    return comms, alerts, now, stats


def _member(m: Any) -> dict[str, Any]:
    """An alert's member communicator from a state, checked."""
    return {"comm": _opt_str(m["comm"]), "name": _opt_str(m["name"]), "sources": [_str(s) for s in m["sources"]],
            "suspects": [_int(i) for i in m["suspects"]], "nranks": _opt_int(m["nranks"])}  # fmt: skip


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return v


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise TypeError(f"expected a string, got {type(v).__name__}")


def _opt_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise TypeError(f"expected a string, got {type(v).__name__}")


def _opt_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return v


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)
