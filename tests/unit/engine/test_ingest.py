"""A screened batch's ingest (pipeline/engine/ingest.py): each encoding read as it is, one chunk
per encoding, collective progress counted and forwarded, NIC port records handed to the stages
that read them and neither buffered nor forwarded, dropped fields dead-lettered with their origin.

The columnar message is gpuwarden's own format (pipeline/colwire.py), so it is built here from
the same records a JSON message carries."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import numpy as np

from pipeline import colwire, rows
from pipeline.catalog import FIELDS
from pipeline.decode import Decoder
from pipeline.engine.entities import Entities
from pipeline.engine.frame import Columnizer
from pipeline.engine.ingest import Ingest
from pipeline.engine.output import EngineOutput
from pipeline.schema import DcgmSample, NicRecord, ProgressRecord
from tests.factories import T0, progress, sample


class _NicStage:
    """The parts of a stage an ingest calls: every DCGM row, and the NIC port records."""

    kind, reads_nccl, reads_nic = "nicstub", False, True

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.nic: list[Any] = []

    def ingest(self, gpu: np.ndarray, records: Any) -> None:
        self.rows.append(gpu.tolist())

    def nic_arrived(self, records: list[Any]) -> None:
        self.nic += records


def _port(t: float, host: str) -> NicRecord:
    return NicRecord(ts=T0 + t, host=host, device="mlx5_0", port=1, state=4, state_name="ACTIVE", counters={})


def _ingest(stage: _NicStage) -> Ingest:
    cols = Columnizer([FIELDS.resolve(n).column for n in ("gpu_util", "gpu_temp")])
    return Ingest(Entities(), [stage], cols, Counter(), EngineOutput())


def test_a_batch_of_both_encodings_gives_a_chunk_each_and_forwards_all_but_nic_records() -> None:
    json_part = [sample(0, "n1", 0), progress(0, "n1"), _port(0, "n1")]
    col_part = [sample(0, "n2", 3, gpu_util=-5)]  # a negative utilisation: its field is dropped
    d = Decoder().decode_many(
        [msgspec.json.encode(json_part), colwire.encode_dcgm(col_part)], ["t[0]@0", "t[0]@1"], [False, True]
    )
    assert isinstance(d.records, rows.Combined)
    stage = _NicStage()
    ing = _ingest(stage)
    chunks: list = []
    hosts = ing.entities.host_ids(d.records.hosts)

    kept = ing.batch(d.records, d.origins, d.records.ts, hosts, chunks)

    assert [(isinstance(r, DcgmSample), r.host) for r in kept] == [(True, "n2"), (True, "n1"), (False, "n1")]
    assert isinstance(kept[2], ProgressRecord)
    assert isinstance(kept, rows.Combined) and len(kept.cols) == 1  # the columns stay columns
    assert [(c.host.tolist(), c.gpu.tolist()) for c in chunks] == [([0], [0]), ([1], [1])]  # the columns first
    util = chunks[0].cols.index(FIELDS.resolve("gpu_util").column)
    assert np.isnan(chunks[0].values[0, util]) and chunks[1].values[0, util] == 98.0
    assert [(x.reason, x.origin) for x in ing.out.dead] == [("negative_value", "t[0]@1#0")]
    assert ing.stats == Counter({"records.progress": 1, "records.nic": 1, "dead.negative_value": 1})
    assert [r.host for r in stage.nic] == ["n1"] and stage.rows == [[0], [1]]


def test_a_batch_of_nic_records_alone_buffers_nothing_and_forwards_nothing() -> None:
    stage = _NicStage()
    ing = _ingest(stage)
    chunks: list = []
    recs = [_port(0, "n1"), _port(1, "n2")]
    kept = ing.batch(recs, ["m@0", "m@1"], np.array([T0, T0 + 1]), ing.entities.host_ids(["n1", "n2"]), chunks)
    assert list(kept) == [] and chunks == [] and len(stage.nic) == 2 and stage.rows == []


def test_a_version_1_snapshots_records_are_one_chunk_and_none_is_no_chunk() -> None:
    ing = _ingest(_NicStage())
    assert ing.buffered([], []) == []
    (chunk,) = ing.buffered([sample(0, "n1", 0), sample(1, "n1", 1)], ["s@0", "s@1"])
    assert chunk.ts.tolist() == [T0, T0 + 1] and chunk.gpu.tolist() == [0, 1] and (chunk.tmin, chunk.tmax) == (T0, T0 + 1)
