"""nccl-tests output (``all_reduce_perf`` and friends) -> ``NcclRecord``s, for burn-in runs.

Text tables are read by their header row, not by position: older builds have no ``root``
column and call the error column ``error``, newer ones add ``#wrong``, per-iteration columns and
a timestamp, and print ``# Collective test starting: all_reduce_perf``. The first
``time``/``cputime`` group is out-of-place, the second in-place. ``-J`` JSON output
(``{"config": {"devices": [...]}, "results": [...]}``) is read as well.

One record per message size: the out-of-place result (what NCCL's own docs quote), with the
in-place numbers, data type, reduction and wrong-element count in ``labels``. The job's ranks come
from the ``#  Rank N ... on HOST device D`` lines: the record is rank 0's, on its host and GPU.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from dataclasses import dataclass
from typing import Any

from pipeline.schema import NcclRecord

log = logging.getLogger(__name__)

_COLL = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
         "broadcast": "Broadcast", "reduce": "Reduce", "alltoall": "AllToAll", "sendrecv": "SendRecv",
         "gather": "Gather", "scatter": "Scatter", "hypercube": "HyperCube"}
_RANK = re.compile(r"#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)")


def collective_name(text: str | None) -> str | None:
    """``all_reduce_perf`` / ``/opt/nccl-tests/build/all_gather_perf`` / a file name -> ``AllReduce``..."""
    if not text:
        return None
    low = text.lower()
    # Longest names first: "reduce" is inside "all_reduce" and "reduce_scatter".
    for key in sorted(_COLL, key=len, reverse=True):
        if key in low:
            return _COLL[key]
    return None


@dataclass
class Device:
    rank: int
    host: str
    device: int
    pid: int


def _float(tok: str) -> float | None:
    try:
        x = float(tok)
    except ValueError:
        return None
    return x if x == x else None


def _records(rows: list[dict[str, Any]], devices: list[Device], coll: str, ts: float,
             host_default: str, job: str | None, fmt: str) -> list[NcclRecord]:
    d0 = min(devices, key=lambda d: d.rank) if devices else None
    nranks = max(len(devices), 1)
    nnodes = len({d.host for d in devices}) or None
    comm = f"nccl-tests:{d0.host}:{d0.pid}" if d0 else "nccl-tests"
    out = []
    for row in rows:
        t = row.get("time")
        if t is None or t < 0:
            continue
        labels = {"source": "nccl_tests", "format": fmt}
        for k in ("type", "redop", "root"):
            if row.get(k) not in (None, ""):
                labels[k] = str(row[k])
        for k in ("in_time_us", "in_algbw_gbs", "in_busbw_gbs", "wrong", "in_wrong"):
            if row.get(k) is not None:
                labels[k] = f"{row[k]:g}"
        out.append(NcclRecord(ts=ts, host=d0.host if d0 else host_default, gpu=d0.device if d0 else None, job=job,
                              comm=comm, comm_name="nccl-tests", rank=0, nranks=nranks, nnodes=nnodes, coll=coll,
                              bytes=int(row["size"]), exec_time_us=t,
                              algbw_gbs=row.get("algbw") if (row.get("algbw") or 0) >= 0 else None,
                              busbw_gbs=row.get("busbw") if (row.get("busbw") or 0) >= 0 else None, labels=labels))
    return out


def parse_text(text: str, *, ts: float | None = None, coll: str | None = None, host: str | None = None,
               job: str | None = None, name_hint: str | None = None) -> list[NcclRecord]:
    """Records from an nccl-tests text log (old or new column layout)."""
    devices: list[Device] = []
    header: list[str] | None = None
    rows: list[dict[str, Any]] = []
    started = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            m = _RANK.match(s)
            if m:
                devices.append(Device(int(m.group(1)), m.group(4), int(m.group(5)), int(m.group(3))))
                continue
            if "Collective test starting:" in s:
                started = s.split(":", 1)[1].strip()
                continue
            toks = s.lstrip("#").split()
            if "size" in toks and "count" in toks:
                header = toks
            continue
        if header is None or not s:
            continue
        toks = s.split()
        if not toks[0].isdigit() or len(toks) < len(header):
            continue
        row = _row(header, toks)
        if row is not None:
            rows.append(row)
    c = coll or collective_name(started) or collective_name(name_hint) or "unknown"
    return _records(rows, devices, c, time.time() if ts is None else ts, host or socket.gethostname(), job, "text")


def _row(header: list[str], toks: list[str]) -> dict[str, Any] | None:
    row: dict[str, Any] = {}
    groups = 0
    for name, tok in zip(header, toks):
        if name == "size":
            row["size"] = int(tok)
        elif name in ("type", "redop", "root"):
            row[name] = tok
        elif name in ("time", "cputime"):
            groups += 1
            row["time" if groups == 1 else "in_time_us"] = _float(tok)
        elif name in ("algbw", "busbw"):
            row[name if groups == 1 else f"in_{name}_gbs"] = _float(tok)
        elif name in ("#wrong", "error", "wrong"):
            row["wrong" if groups == 1 else "in_wrong"] = _float(tok)
    return row if "size" in row else None


def parse_json(doc: dict[str, Any], *, ts: float | None = None, coll: str | None = None,
               host: str | None = None, job: str | None = None) -> list[NcclRecord]:
    """Records from nccl-tests ``-J`` output."""
    cfg = doc.get("config") or {}
    devices = [Device(int(d.get("rank", 0)), str(d.get("hostname") or "unknown"), int(d.get("device", 0)),
                      int(d.get("pid", 0))) for d in cfg.get("devices") or [] if isinstance(d, dict)]
    args = doc.get("args") or []
    rows = []
    for r in doc.get("results") or []:
        if not isinstance(r, dict) or r.get("size") is None:
            continue
        oop, inp = r.get("out_of_place") or {}, r.get("in_place") or {}
        num = lambda d, *ks: next((_float(str(d[k])) for k in ks if d.get(k) is not None), None)  # noqa: E731
        rows.append({"size": int(r["size"]), "type": r.get("type"), "redop": r.get("redop"),
                     "root": str(r.get("root", "")).strip(),
                     "time": num(oop, "time", "cpu_time"), "algbw": num(oop, "alg_bw"), "busbw": num(oop, "bus_bw"),
                     "wrong": num(oop, "nwrong"), "in_time_us": num(inp, "time", "cpu_time"),
                     "in_algbw_gbs": num(inp, "alg_bw"), "in_busbw_gbs": num(inp, "bus_bw"),
                     "in_wrong": num(inp, "nwrong")})
    c = coll or collective_name(args[0] if args else None) or "unknown"
    return _records(rows, devices, c, time.time() if ts is None else ts, host or socket.gethostname(), job, "json")


def parse(text: str, **kw: Any) -> list[NcclRecord]:
    """Text or ``-J`` JSON, whichever ``text`` is."""
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            kw.pop("name_hint", None)
            return parse_json(doc, **kw)
    return parse_text(text, **kw)


class NcclTestsSource:
    """A finite source: the whole file (or stdin) in one poll."""

    def __init__(self, path: str, **kw: Any) -> None:
        self.path = path
        self.kw = kw
        self.done = False

    def poll(self) -> list[NcclRecord]:
        import sys

        self.done = True
        text = sys.stdin.read() if self.path == "-" else open(self.path, encoding="utf-8", errors="replace").read()
        recs = parse(text, name_hint=None if self.path == "-" else self.path, **self.kw)
        if not recs:
            log.warning("%s: no nccl-tests result rows found", self.path)
        return recs

    def close(self) -> None:
        pass
