import msgspec
import pytest

from pipeline.errors import StateError
from pipeline.service.state import Checkpoint, KafkaStateStore, _decode


class Capture:
    def __init__(self):
        self.sent = []

    def send(self, topic, value, key):
        self.sent.append((topic, value, key))


def store(key):
    return KafkaStateStore("127.0.0.1:1", "p.state", "g", "p.telemetry", Capture(), key=key)


def test_checkpoint_round_trip_and_key_per_partition():
    s = store(None)
    s.save(Checkpoint(3, 1234, b"engine-bytes" * 100))
    topic, value, key = s.producer.sent[0]
    assert topic == "p.state" and key == b"g/p.telemetry/3"
    cp = _decode(3, value)
    assert (cp.next_offset, cp.engine) == (1234, b"engine-bytes" * 100)


def test_signed_checkpoints_refuse_forged_or_unsigned_ones():
    s = store(b"k1")
    s.save(Checkpoint(0, 10, b"state"))
    value = s.producer.sent[0][1]
    assert _decode(0, value, b"k1").engine == b"state"
    with pytest.raises(StateError, match="not signed"):
        _decode(0, value, b"other-key")
    forged = msgspec.msgpack.decode(value)
    forged["offset"] = 11                                  # tampered: the MAC covers the offset too
    with pytest.raises(StateError):
        _decode(0, msgspec.msgpack.encode(forged), b"k1")
    unsigned = store(None)
    unsigned.save(Checkpoint(0, 10, b"state"))
    with pytest.raises(StateError):
        _decode(0, unsigned.producer.sent[0][1], b"k1")


def test_corrupt_checkpoint_is_a_state_error():
    with pytest.raises(StateError):
        _decode(0, b"\x01garbage")
