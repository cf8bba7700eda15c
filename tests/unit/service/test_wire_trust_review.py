"""What crosses between the service's stages and what it restores, attacked at unit level: a
checkpoint or a forwarded records body that would cost more than itself is refused as itself
(pipeline/service/state.py, pipeline/service/forwarded.py)."""

from __future__ import annotations

import zlib

import msgspec
import numpy as np
import pytest

from pipeline.engine import Engine, EngineConfig
from pipeline.errors import StateError
from pipeline.recordchecks import MAX_GPU_INDEX, MAX_LINK_INDEX
from pipeline.schema import dcgm, encode
from pipeline.service import state as st
from pipeline.service.fleet import FleetTask
from pipeline.service.state import Checkpoint, KafkaStateStore
from tests.factories import HEALTHY, T0
from tests.fleet_factories import GROUP, TOPIC, columns_body, envelope, fleet_message, mark_body

INT64_MAX = (1 << 63) - 1


class Capture:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, topic: str, value: bytes, key: bytes) -> None:
        self.sent.append((topic, value, key))


def _store(key: bytes | None) -> KafkaStateStore:
    return KafkaStateStore("127.0.0.1:1", "p.state", "g", "p.telemetry", Capture(), key=key)  # type: ignore[arg-type]


def _checkpoint(key: bytes | None, offset: int, epoch: int) -> bytes:
    env = {
        "v": st.ENVELOPE_VERSION,
        "group": "g",
        "topic": "p.telemetry",
        "partition": 0,
        "offset": offset,
        "epoch": epoch,
        "size": 3,
        "engine": zlib.compress(b"abc"),
    }
    if key is not None:
        env["mac"] = st._mac(key, env)
    return msgspec.msgpack.encode(env)


@pytest.mark.parametrize("key", [None, b"k" * 32])
@pytest.mark.parametrize(
    ("offset", "epoch"), [((1 << 64) - 1, 1), (1, (1 << 64) - 1), (INT64_MAX + 1, 1), (1, INT64_MAX)]
)
def test_a_checkpoint_past_an_int64_is_refused_not_a_crash_at_the_next_save(key, offset, epoch):
    # Unsigned (--insecure-state), an epoch of 2**64-1 was loaded, the writer's next epoch (+1)
    # could not be encoded and the partition's next checkpoint raised OverflowError out of the
    # commit protocol; an offset past an int64 is no Kafka offset to seek to.
    s = _store(key)
    with pytest.raises(StateError) as e:
        s.decode(0, _checkpoint(key, offset, epoch))
    assert e.value.context.get("reason") == "corrupt"
    latest: dict[int, Checkpoint] = {}
    s._consider(latest, 0, _checkpoint(key, offset, epoch), "p.state[0]@0")
    assert latest == {} and s.rejected == {"corrupt": 1}
    s._settle([0], latest)
    s.save(Checkpoint(0, 5, b"abc"))  # the next checkpoint still encodes
    assert s.decode(0, s.producer.sent[-1][1]).next_offset == 5


def test_the_largest_offset_and_epoch_kafka_can_hold_still_load():
    s = _store(b"k" * 32)
    cp = s.decode(0, _checkpoint(b"k" * 32, INT64_MAX, INT64_MAX - 1))
    assert (cp.next_offset, cp.epoch) == (INT64_MAX, INT64_MAX - 1)


def _engine() -> Engine:
    return Engine(EngineConfig(), row_checks=[], tick_checks=[], screened=True)


@pytest.mark.parametrize(
    ("gpu", "link"), [(MAX_GPU_INDEX + 1, -1), (-3, -1), ((1 << 31) - 1, -1), (0, MAX_LINK_INDEX + 1), (0, -2)]
)
def test_a_forwarded_row_the_host_decoder_never_passes_is_refused_not_checkpointed(gpu, link):
    # Unsigned (--insecure-state), a forged columns body with a GPU index outside 0..4095 went
    # into the fleet engine, and every later snapshot of the partition failed to restore
    # ("snapshot: GPU index"): one message cost the partition's state at each restart.
    task = FleetTask(_engine, 1, topic=TOPIC, group=GROUP, key=None)
    recs = [dcgm(T0 + i, "n1", 0, HEALTHY) for i in range(3)]
    body = columns_body(recs, gpu=np.full(3, gpu, "<i4").tobytes(), link=np.full(3, link, "<i4").tobytes())
    out = task.handle_guarded(
        [
            fleet_message(envelope(body, 0, key=None), 0),
            fleet_message(envelope(mark_body(0, T0 + 2, n=1), 0, key=None), 1),
        ]
    )
    # The mark then vouches for nothing its partition forwarded.
    assert [d.reason for d in out.dead] == ["wrong_type", "early_mark"]
    assert "GPU index" in out.dead[0].detail or "link index" in out.dead[0].detail
    assert task.totals.records == 0
    FleetTask(_engine, 1, topic=TOPIC, group=GROUP, key=None).restore(task.snapshot())


def test_forwarded_rows_at_the_decoders_bounds_are_taken():
    task = FleetTask(_engine, 1, topic=TOPIC, group=GROUP, key=None)
    recs = [dcgm(T0 + i, "n1", 0, HEALTHY) for i in range(2)]
    body = columns_body(
        recs, gpu=np.array([0, MAX_GPU_INDEX], "<i4").tobytes(), link=np.array([-1, MAX_LINK_INDEX], "<i4").tobytes()
    )
    out = task.handle_guarded([fleet_message(envelope(body, 0, key=None), 0)])
    assert out.dead == [] and task.totals.records == 2


@pytest.mark.parametrize(("gpu", "link"), [(MAX_GPU_INDEX + 1, None), (-1, None), (0, MAX_LINK_INDEX + 1), (0, -1)])
def test_a_json_array_of_records_is_bounded_as_a_columns_body_is(gpu, link):
    # The JSON records array (what earlier builds forwarded, still read) skipped the index check
    # a columns body has: unsigned, a DCGM record of GPU 5000 went into the fleet engine and the
    # partition's next snapshot failed to restore.
    task = FleetTask(_engine, 1, topic=TOPIC, group=GROUP, key=None)
    recs = [msgspec.json.decode(encode(dcgm(T0 + i, "n1", 0, HEALTHY))) for i in range(3)]
    for r in recs:
        r["gpu"] = gpu
        if link is not None:
            r["link"] = link
    out = task.handle_guarded([fleet_message(envelope(msgspec.json.encode(recs), 0, key=None), 0)])
    assert [d.reason for d in out.dead] == ["wrong_type"] and task.totals.records == 0
    FleetTask(_engine, 1, topic=TOPIC, group=GROUP, key=None).restore(task.snapshot())
    # At the bounds, taken.
    for r in recs:
        r["gpu"], r["link"] = MAX_GPU_INDEX, MAX_LINK_INDEX
    out = task.handle_guarded([fleet_message(envelope(msgspec.json.encode(recs), 0, key=None), 1)])
    assert out.dead == [] and task.totals.records == 3
