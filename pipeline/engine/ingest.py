"""A screened batch's ingest: records or columnar messages -> the rows the engine buffers.

The engine (``engine.py``) screens a batch and hands what it accepts to ``Ingest.batch``, which
turns it into ``Pending`` columns at once, on arrival (docs/architecture.md §4): DCGM samples
become GPU ids and a value matrix (fields dropped as bad data are dead-lettered here), NCCL
records their times (and columns, when a stage reads them), collective progress is counted and
NIC port records go to the stages that read them. A batch comes in one of two encodings, a list
of records or the decoder's ``colwire.DcgmColumns`` (or a ``colwire.Combined`` of both), and
each is read as it is: columns stay arrays, a list is split by type in C.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from itertools import compress
from typing import Sequence, cast

import numpy as np

from pipeline.rows import Combined, DcgmColumns, take
from pipeline.deadletters import take_origins
from pipeline.engine.entities import Entities
from pipeline.engine.frame import Columnizer, NcclFrame, joined, nccl_frame
from pipeline.engine.output import EngineOutput
from pipeline.engine.pending import Pending
from pipeline.engine.stage import NcclReader, NicReader, Stage
from pipeline.schema import (
    DcgmRecord,
    DcgmSample,
    NcclRecord,
    NicRecord,
    ProgressRecord,
    TelemetryRecord,
)

__all__ = ["Ingest"]

_HOST, _GPU = operator.attrgetter("host"), operator.attrgetter("gpu")


@dataclass(frozen=True, slots=True)
class Ingest:
    """The ingest of one batch: the engine's parts it reads and tells (taken as they are at the
    call: a restore or a stage swap replaces them), and the output its dead letters go to.

    >>> from pipeline.schema import dcgm
    >>> from pipeline.catalog import FIELDS
    >>> entities, chunks = Entities(), []
    >>> ing = Ingest(entities, [], Columnizer([FIELDS.resolve("gpu_util").column]), Counter(), EngineOutput())
    >>> recs = [dcgm(10.0, "n1", 0, {"gpu_util": 60}), dcgm(10.0, "n1", 1, {"gpu_util": -5})]
    >>> kept = ing.batch(recs, ["m@0", "m@1"], np.array([10.0, 10.0]), entities.host_ids(["n1", "n1"]), chunks)
    >>> kept == recs, chunks[0].gpu.tolist(), chunks[0].values.tolist()
    (True, [0, 1], [[60.0], [nan]])
    >>> [(d.reason, d.origin) for d in ing.out.dead], dict(ing.stats)
    ([('negative_value', 'm@1')], {'dead.negative_value': 1})
    """

    entities: Entities
    stages: Sequence[Stage]
    columnizer: Columnizer
    stats: Counter[str]
    out: EngineOutput
    # Columns only a later stage reads, screened for their dead letters (``Engine.screen_for``).
    screen: Columnizer | None = None

    def batch(
        self,
        records: Sequence[TelemetryRecord],
        origins: Sequence[str],
        ts: np.ndarray,
        hosts: np.ndarray,
        chunks: list[Pending],
    ) -> Sequence[TelemetryRecord]:
        """Ingest a screened batch (``ts``, ``hosts``: its records' event times and host ids):
        its rows are appended to ``chunks`` (one chunk per encoding the batch holds); returns
        the records to forward, which are all but the NIC port records."""
        records, origins, ts, hosts = self._carry_nic(records, origins, ts, hosts)
        if len(ts) and isinstance(records, Combined):
            # Columnar rows and JSON records: each part ingested as it is (one chunk each).
            nc = len(records.cols)
            for part, sl in ((records.cols, slice(0, nc)), (records.others, slice(nc, len(ts)))):
                if len(part):
                    idx = np.arange(len(ts))[sl]
                    chunks.append(self._records(part, take_origins(origins, idx), ts[sl], hosts[sl]))
        elif len(ts):
            chunks.append(self._records(records, origins, ts, hosts))
        return records

    def buffered(self, records: Sequence[TelemetryRecord], origins: Sequence[str]) -> list[Pending]:
        """The rows of the records a version-1 snapshot buffered (JSON, decoded into a list),
        ingested as on arrival: one chunk, none for no records."""
        if not records:
            return []
        ts = np.array([r.ts for r in records], dtype=np.float64)
        hosts = self.entities.host_ids([r.host for r in records])
        return [self._records(records, origins, ts, hosts)]

    @property
    def _reads_nccl(self) -> bool:
        return any(s.reads_nccl for s in self.stages)

    def _records(
        self, records: Sequence[TelemetryRecord], origins: Sequence[str], ts: np.ndarray, hosts: np.ndarray
    ) -> Pending:
        """Arriving records -> the columns the engine keeps until the watermark passes them.

        Done on arrival, not on release: the record objects are freed at once (the start-up hold
        buffers ~30 s of the fleet, and a checkpoint carries what is buffered), and a release
        works on arrays only. Fields dropped as bad data are dead-lettered here.
        """
        k = len(records)
        if isinstance(records, DcgmColumns):
            return self._ingest_dcgm(records, origins, ts, hosts, records.gpu)
        # By type, not isinstance(): a type's membership in a set is ~3x cheaper per record.
        types = list(map(type, records))
        # Subclasses too: the decoder's checked types are (pipeline/decode.py).
        progress = {t for t in set(types) if issubclass(t, ProgressRecord)}
        if progress:
            # Collective progress is read by no stage of the engine: counted, and forwarded with
            # the rest (docs/architecture.md §3); the GPU and NCCL rows go on as without it.
            keep = np.array([t not in progress for t in types], dtype=bool)
            self.stats["records.progress"] += k - int(keep.sum())
            records = list(compress(records, keep.tolist()))
            origins, ts, hosts = take_origins(origins, keep), ts[keep], hosts[keep]
            types = list(map(type, records))
            k = len(records)
            if not k:
                return Pending.empty(self.columnizer.columns)
        dcgm_types = {t for t in set(types) if issubclass(t, DcgmSample)}
        kinds = list(map(dcgm_types.__contains__, types))
        is_dcgm = np.array(kinds, dtype=bool)
        n = int(is_dcgm.sum())
        # The casts say what the type test above found: compact() reads any DcgmSample's fields.
        if n == k:
            drecs, dorig, dts, dhost = cast("list[DcgmRecord]", records), origins, ts, hosts
            nrecs: list[NcclRecord] = []
        else:  # compress(): the split in C, not a Python loop over the batch
            drecs, dorig = cast("list[DcgmRecord]", list(compress(records, kinds))), take_origins(origins, is_dcgm)
            dts, dhost = ts[is_dcgm], hosts[is_dcgm]
            nrecs = cast("list[NcclRecord]", list(compress(records, map(operator.not_, kinds))))
        cols = self.columnizer.columns
        if n:
            if n == k:
                return self._ingest_dcgm(drecs, dorig, dts, dhost, np.fromiter(map(_GPU, drecs), np.int64, n))
            gpu, values = self._dcgm_rows(drecs, dorig, dhost, np.fromiter(map(_GPU, drecs), np.int64, n))
        else:
            gpu, values = np.empty(0, np.int32), np.empty((0, len(cols)))
        nts = ts[~is_dcgm] if n < k else np.empty(0)
        if nrecs:
            self.entities.note_nccl(nrecs)
            for stage in self.stages:
                if getattr(stage, "reads_nccl_records", False):
                    cast(NcclReader, stage).nccl_arrived(nrecs)
        # The models' NCCL detectors need the records' columns; without such a stage they are counted.
        nccl = self._nccl_frame(nrecs, hosts[~is_dcgm]) if nrecs and self._reads_nccl else None
        return Pending(dts, dhost, gpu, values, cols, nts, nccl, float(ts.min()), float(ts.max()))

    def _dcgm_rows(
        self, drecs: Sequence[DcgmSample], origins: Sequence[str], hosts: np.ndarray, index: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """DCGM samples (records or ``DcgmColumns``) -> their GPU ids and value matrix; the
        stages and the GPUs' labels learn of them, dropped fields are dead-lettered."""
        gpu = self.entities.gpu_ids_of(hosts, index)
        self.entities.note_labels(gpu, drecs)  # the job on each GPU, for its alerts
        for stage in self.stages:
            stage.ingest(gpu, drecs)
        values, dead = self.columnizer.compact(drecs, origins)
        if self.screen is not None:
            dead = joined(dead, self.screen.compact(drecs, origins)[1])
        for d in dead:
            self.stats["dead." + d.reason] += 1
        self.out.dead.extend(dead)
        return gpu, values

    def _ingest_dcgm(
        self, drecs: Sequence[DcgmSample], origins: Sequence[str], ts: np.ndarray, hosts: np.ndarray, index: np.ndarray
    ) -> Pending:
        """``_records`` of a batch of DCGM samples only (the usual one)."""
        gpu, values = self._dcgm_rows(drecs, origins, hosts, index)
        return Pending(
            ts, hosts, gpu, values, self.columnizer.columns, np.empty(0), None, float(ts.min()), float(ts.max())
        )

    def _nccl_frame(self, nrecs: list[NcclRecord], hosts: np.ndarray) -> NcclFrame:
        idx = list(map(_GPU, nrecs))
        if None not in idx and -(1 << 63) <= min(idx) and max(idx) < 1 << 63:
            # By host id: a table lookup, where (host name, index) pairs cost a tuple and a hash each.
            gpus = self.entities.gpu_ids_of(hosts, np.array(idx, np.int64))
        else:
            names = list(map(_HOST, nrecs))
            gpus = np.fromiter(
                (-1 if g is None else self.entities.gpu(h, g) for h, g in zip(names, idx)), np.int32, len(nrecs)
            )
        return nccl_frame(nrecs, hosts, gpus)

    def _carry_nic(
        self, records: Sequence[TelemetryRecord], origins: Sequence[str], ts: np.ndarray, hosts: np.ndarray
    ) -> tuple:
        """The batch without its NIC port records: counted (``records.nic``) once screened, so
        their hosts' clocks hear them, handed to the stages that read them (``reads_nic``, which
        hold them until the engine's release), and neither buffered as rows nor forwarded."""
        if isinstance(records, DcgmColumns):
            return records, origins, ts, hosts
        rest = records.others if isinstance(records, Combined) else records
        if not any(issubclass(t, NicRecord) for t in set(map(type, rest))):
            return records, origins, ts, hosts
        keep = np.concatenate(
            [np.ones(len(records) - len(rest), bool), np.fromiter((not isinstance(r, NicRecord) for r in rest), bool)]
        )
        self.stats["records.nic"] += int((~keep).sum())
        readers = [cast(NicReader, s) for s in self.stages if getattr(s, "reads_nic", False)]
        if readers:
            nic = [records[i] for i in np.flatnonzero(~keep).tolist()]
            for stage in readers:
                stage.nic_arrived(nic)
        idx = np.flatnonzero(keep)
        return take(records, idx), take_origins(origins, idx), ts[keep], hosts[keep]
