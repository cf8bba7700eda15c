"""The engine's snapshot: all its state as msgpack of numbers, strings and numeric arrays.

Restoring one never runs anything (docs/architecture.md §5): arrays are rebuilt by
``pipeline.engine.arrays``, numbers only. A snapshot is the parts' own ``to_state`` maps merged
into one, in the order ``LAYOUT`` gives (a key it does not name goes after those), then each
stage's ``to_state()`` under its ``state_key`` (the rules' windows under ``windows``, the models'
state under ``models``). Version 2 holds the buffered rows as columns (``pending_columns``);
version 1 held the buffered records themselves, as JSON, and is still read.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import msgspec

from pipeline.engine.stage import Stage
from pipeline.errors import StateError
from pipeline.schema import DcgmRecord, NcclRecord

SNAPSHOT_VERSION = 2  # 2: buffered rows as columns; version 1 (records as JSON) is still read
READS = (1, SNAPSHOT_VERSION)
# The order of the parts' keys in a snapshot: the one version 2 has always had, so that equal
# states give equal bytes.
LAYOUT = (
    "config",
    "entities",
    "last",
    "last_ts",
    "host_last_ts",
    "host_back",
    "host_hwm",
    "host_seen",
    "host_jump",
    "host_step",
    "host_min_step",
    "released_step",
    "host_jitter",
    "host_jitter_n",
    "host_done",
    "released",
    "next_tick",
    "first_ts",
    "lifecycles",
    "pending_columns",
    "stats",
    "summaries",
    "seen",
)
# The stages' keys and what an engine without that stage writes there, so that a snapshot has
# the same keys, in the same order, whichever stages an engine runs.
_STAGE_DEFAULTS: dict[str, Any] = {"windows": {}, "models": None}

TelemetryRecordT = DcgmRecord | NcclRecord


def write_snapshot(parts: Iterable[Mapping[str, Any]], stages: Sequence[Stage]) -> bytes:
    """The parts' ``to_state`` maps and the stages' state as snapshot bytes (``Engine.snapshot``)."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    data: dict[str, Any] = {"version": SNAPSHOT_VERSION}
    data.update((k, merged.pop(k)) for k in LAYOUT if k in merged)
    data.update(merged)
    data.update(_STAGE_DEFAULTS)
    for stage in stages:
        if stage.state_key is not None:
            data[stage.state_key] = stage.to_state()
    return msgspec.msgpack.encode(data)


def read_snapshot(blob: bytes, loads: Iterable[Callable[[dict[str, Any]], None]], stages: Sequence[Stage]) -> None:
    """Decode ``blob`` and hand it to each of ``loads`` in order, then each stage its state
    (``Engine.restore``); anything malformed is a ``StateError``."""
    try:
        data = msgspec.msgpack.decode(blob)
        if not isinstance(data, dict):
            raise StateError(f"snapshot is a {type(data).__name__}, not a map")
        if data.get("version") not in READS:
            raise StateError(f"snapshot version {data.get('version')} (this build reads {SNAPSHOT_VERSION})")
        for load in loads:
            load(data)
        for stage in stages:
            if stage.state_key is not None:
                stage.load_state(data.get(stage.state_key))
    # AttributeError: a list or a number where a map belongs (``lifecycles``); RecursionError:
    # nesting past msgspec's depth; IndexError, OverflowError: a number out of any index's range.
    except (
        msgspec.DecodeError,
        msgspec.ValidationError,
        AttributeError,
        KeyError,
        TypeError,
        ValueError,
        RecursionError,
        IndexError,
        OverflowError,
    ) as e:
        raise StateError(f"cannot restore engine snapshot: {e}") from e


def decode_records(blob: list[bytes]) -> list[TelemetryRecordT]:
    """A version-1 snapshot's buffered records (JSON each)."""
    dec = msgspec.json.Decoder(TelemetryRecordT)
    return [dec.decode(b) for b in blob]
