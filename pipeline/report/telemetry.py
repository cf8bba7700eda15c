"""Recorded telemetry -> per-GPU time series of just the signals a report plots.

Files are read as ``replay`` reads them (``read_lines`` + ``Decoder``): a line may hold one
record or an array of them, and whatever cannot be decoded is counted and skipped. Only the
hosts, fields and NCCL communicators the report needs are kept, so a fleet-sized recording costs
decode time but not memory. Per-NVLink records (``link`` set) are left out: the plots are per GPU.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from pipeline.bus.files import read_lines
from pipeline.catalog import FIELDS
from pipeline.decode import Decoder
from pipeline.schema import DcgmSample, NcclRecord

GpuKey = tuple[str, int]


@dataclass
class GpuSeries:
    """One GPU's samples, sorted by event time; ``values[alias]`` is NaN where not reported."""

    ts: np.ndarray
    values: dict[str, np.ndarray]


@dataclass
class NcclSeries:
    """One rank's NCCL records of one communicator, sorted by event time."""

    ts: np.ndarray
    values: dict[str, np.ndarray]


@dataclass
class Telemetry:
    gpus: dict[GpuKey, GpuSeries] = field(default_factory=dict)
    nccl: dict[tuple[str, str, int], NcclSeries] = field(default_factory=dict)  # (comm, host, gpu)
    t_min: float = math.nan
    t_max: float = math.nan
    records: int = 0
    lines: int = 0
    dead: int = 0  # records (or lines) that could not be decoded
    hosts_seen: set[str] = field(default_factory=set)
    interval: float = 1.0  # median sampling interval of the kept DCGM series

    def host_gpus(self, host: str) -> list[int]:
        return sorted(g for h, g in self.gpus if h == host)

    def comm_ranks(self, comm: str) -> list[tuple[str, int]]:
        return sorted((h, g) for c, h, g in self.nccl if c == comm)

    def host_comms(self, host: str, gpu: int | None) -> list[str]:
        return sorted({c for c, h, g in self.nccl if h == host and (gpu is None or g == gpu)})


def load_telemetry(
    paths: Iterable[str | Path],
    *,
    hosts: set[str] | None = None,
    fields: Iterable[str] = (),
    nccl_fields: Iterable[str] = (),
    nccl_hosts: set[str] | None = None,
) -> Telemetry:
    """Read telemetry files, keeping DCGM ``fields`` (aliases) for GPUs of ``hosts`` (None: all)
    and NCCL ``nccl_fields`` of every communicator that has a rank on ``nccl_hosts``."""
    wanted = [(a, fld.names) for a in dict.fromkeys(fields) if (fld := FIELDS.by_alias(a)) is not None]
    nfields = list(dict.fromkeys(nccl_fields))
    tel = Telemetry()
    dec = Decoder()
    dts: dict[GpuKey, list[float]] = defaultdict(list)
    dvals: dict[GpuKey, list[list[float]]] = defaultdict(list)
    nts: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    nvals: dict[tuple[str, str, int], list[list[float]]] = defaultdict(list)
    lo, hi = math.inf, -math.inf
    for path in paths:
        for msg in read_lines(path):
            tel.lines += 1
            out = dec.decode(msg.value, msg.origin)
            tel.dead += len(out.dead)
            for rec in out.records:
                tel.records += 1
                lo, hi = min(lo, rec.ts), max(hi, rec.ts)
                tel.hosts_seen.add(rec.host)
                if isinstance(rec, DcgmSample):
                    if rec.link is not None or (hosts is not None and rec.host not in hosts):
                        continue
                    key = (rec.host, rec.gpu)
                    dts[key].append(rec.ts)
                    row = []
                    for _, names in wanted:
                        v = math.nan
                        for n in names:
                            v = getattr(rec.fields, n)
                            if v == v:
                                break
                        row.append(v)
                    dvals[key].append(row)
                elif isinstance(rec, NcclRecord) and nfields and rec.gpu is not None:
                    key3 = (rec.comm, rec.host, rec.gpu)
                    nts[key3].append(rec.ts)
                    nvals[key3].append([_num(getattr(rec, f, None)) for f in nfields])
    if tel.records:
        tel.t_min, tel.t_max = lo, hi
    steps: list[float] = []
    for key, ts_list in dts.items():
        ts = np.asarray(ts_list, dtype=float)
        order = np.argsort(ts, kind="stable")
        mat = np.asarray(dvals[key], dtype=float).reshape(len(ts), len(wanted))[order]
        tel.gpus[key] = GpuSeries(ts[order], {a: mat[:, i] for i, (a, _) in enumerate(wanted)})
        if len(ts) > 1:
            steps.append(float(np.median(np.diff(ts[order]))))
    if steps and np.median(steps) > 0:
        tel.interval = float(np.median(steps))
    if nccl_hosts is not None:
        # A communicator is kept whole once any of its ranks is on a wanted host, including the
        # records read before that rank showed up.
        keep = {c for c, h, _ in nts if h in nccl_hosts}
        nts = {k: v for k, v in nts.items() if k[0] in keep}
    for key3, ts_list in nts.items():
        ts = np.asarray(ts_list, dtype=float)
        order = np.argsort(ts, kind="stable")
        mat = np.asarray(nvals[key3], dtype=float).reshape(len(ts), len(nfields))[order]
        tel.nccl[key3] = NcclSeries(ts[order], {f: mat[:, i] for i, f in enumerate(nfields)})
    return tel


def _num(v: object) -> float:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
