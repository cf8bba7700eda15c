"""The engine's snapshot: all its state as msgpack of numbers, strings and numeric arrays.

Restoring one never runs anything (docs/architecture.md §5): arrays are rebuilt by
``pipeline.engine.arrays``, numbers only. Layout, version 2: the engine's own arrays and
numbers, each lifecycle, the buffered rows as columns (``pending_columns``), and each stage's
``to_state()`` under its ``state_key`` (the rules' windows under ``windows``, the models' state
under ``models``). Version 1 held the buffered records themselves, as JSON; it is still read.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from pipeline.engine.arrays import from_dict, to_dict
from pipeline.engine.entities import Entities
from pipeline.engine.pending import Pending
from pipeline.errors import StateError
from pipeline.schema import DcgmRecord, NcclRecord

if TYPE_CHECKING:
    from pipeline.engine.engine import Engine

SNAPSHOT_VERSION = 2  # 2: buffered rows as columns; version 1 (records as JSON) is still read
READS = (1, SNAPSHOT_VERSION)
# The stages' keys of the version-2 layout and what an engine without that stage writes there,
# so that a snapshot has the same keys, in the same order, whichever stages an engine runs.
_STAGE_DEFAULTS: dict[str, Any] = {"windows": {}, "models": None}

TelemetryRecordT = DcgmRecord | NcclRecord


def write_snapshot(engine: "Engine") -> bytes:
    """``engine``'s state as bytes (``Engine.snapshot``)."""
    st = engine.state
    data: dict[str, Any] = {
        "version": SNAPSHOT_VERSION,
        "config": engine.config.to_dict(),
        "entities": engine.entities.to_state(),
        "last": to_dict(st.last),
        "last_ts": to_dict(st.last_ts),
        "host_last_ts": to_dict(st.host_last_ts),
        "host_back": to_dict(st.host_back),
        "host_hwm": to_dict(engine.host_hwm),
        "host_seen": to_dict(engine.host_seen),
        "host_jump": to_dict(engine.host_jump),
        "host_step": to_dict(engine.host_step),
        "host_min_step": to_dict(engine.host_min_step),
        "released_step": to_dict(st.host_step),
        "host_jitter": to_dict(engine.host_jitter),
        "host_jitter_n": to_dict(engine.host_jitter_n),
        "host_done": to_dict(engine.host_done),
        "released": engine.released,
        "next_tick": engine.next_tick,
        "first_ts": engine.first_ts,
        "lifecycles": {n: {k: to_dict(v) for k, v in lc.to_state().items()} for n, lc in engine.lifecycles.items()},
        "pending_columns": [c.to_state() for c in engine._chunks],
        "stats": dict(engine.stats),
        "summaries": engine._summaries,
        "seen": to_dict(st.seen),
        **_STAGE_DEFAULTS,
    }
    for stage in engine.stages:
        if stage.state_key is not None:
            data[stage.state_key] = stage.to_state()
    return msgspec.msgpack.encode(data)


def read_snapshot(engine: "Engine", blob: bytes) -> None:
    """Put ``engine`` where the snapshot ``blob`` left off (``Engine.restore``), or ``StateError``."""
    try:
        data = msgspec.msgpack.decode(blob)
        if data.get("version") not in READS:
            raise StateError(f"snapshot version {data.get('version')} (this build reads {SNAPSHOT_VERSION})")
        st = engine.state
        engine.entities = Entities.from_state(data["entities"])
        st.last, st.last_ts = from_dict(data["last"]), from_dict(data["last_ts"])
        st.host_last_ts = from_dict(data["host_last_ts"])
        # Before host returns were kept: every host counts as back long ago.
        st.host_back = from_dict(data["host_back"]) if "host_back" in data else np.full(len(st.host_last_ts), -np.inf)
        engine.host_hwm = from_dict(data["host_hwm"])
        # Absent from snapshots written before hosts were screened: nothing seen, no jump.
        n = len(engine.host_hwm)
        engine.host_seen = from_dict(data["host_seen"]) if "host_seen" in data else np.full(n, np.nan)
        engine.host_jump = from_dict(data["host_jump"]) if "host_jump" in data else np.full(n, np.nan)
        engine.host_step = from_dict(data["host_step"]) if "host_step" in data else np.full(n, np.nan)
        # Before the shortest step was kept: the latest stands for it.
        engine.host_min_step = from_dict(data["host_min_step"]) if "host_min_step" in data else engine.host_step.copy()
        # Before absence took its step from released samples: the step on arrival, as it was.
        st.host_step = from_dict(data["released_step"]) if "released_step" in data else engine.host_step.copy()
        # Before a host's jitter was measured: none shown yet (the 5 % margin until it is).
        engine.host_jitter = from_dict(data["host_jitter"]) if "host_jitter" in data else np.full(n, np.nan)
        engine.host_jitter_n = from_dict(data["host_jitter_n"]) if "host_jitter_n" in data else np.zeros(n)
        # Before hosts were released early (Engine._release_hosts): none was.
        engine.host_done = from_dict(data["host_done"]) if "host_done" in data else np.full(n, -np.inf)
        engine.released, engine.next_tick = data["released"], data["next_tick"]
        engine.first_ts = data["first_ts"]
        for name, lc in data["lifecycles"].items():
            if name in engine.lifecycles:
                engine.lifecycles[name].load_state({k: from_dict(v) for k, v in lc.items()})
        if "pending_columns" in data:
            engine._chunks = [Pending.from_state(c) for c in data["pending_columns"]]
        else:  # a version-1 snapshot: buffered records as JSON; ingest them as on arrival
            dec = msgspec.json.Decoder(TelemetryRecordT)
            engine._chunks = []
            engine._ingest_buffered([dec.decode(b) for b in data["pending"]], list(data["pending_origin"]))
        engine.stats = Counter(data["stats"])
        engine._summaries = dict(data["summaries"])
        st.seen = from_dict(data["seen"])
        for stage in engine.stages:
            if stage.state_key is not None:
                stage.load_state(data.get(stage.state_key))
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError) as e:
        raise StateError(f"cannot restore engine snapshot: {e}") from e
