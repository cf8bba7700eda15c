"""The checkpoint envelope: signed, bound to its partition, not replayable, capped (issue 18)."""

from __future__ import annotations

import zlib

import msgspec
import pytest

from pipeline.errors import StateError, StateKeyError
from pipeline.service import state as st
from pipeline.service.state import Checkpoint, KafkaStateStore, state_key

KEY = b"k" * 32


class Capture:
    def __init__(self):
        self.sent = []

    def send(self, topic, value, key):
        self.sent.append((topic, value, key))


def store(key=KEY, group="g", source="p.telemetry", max_bytes=st.DEFAULT_MAX_BYTES):
    return KafkaStateStore("127.0.0.1:1", "p.state", group, source, Capture(), key=key, max_bytes=max_bytes)


def written(s, cp):
    s.save(cp)
    return s.producer.sent[-1][1]


def resign(value: bytes, key: bytes = KEY, **change) -> bytes:
    """The envelope with fields changed and signed again (what a key holder could write)."""
    env = msgspec.msgpack.decode(value)
    env.update(change)
    env["mac"] = st._mac(key, env)
    return msgspec.msgpack.encode(env)


def test_checkpoint_round_trip_and_key_per_partition():
    s = store()
    s.save(Checkpoint(3, 1234, b"engine-bytes" * 100))
    topic, value, key = s.producer.sent[0]
    assert topic == "p.state" and key == b"g/p.telemetry/3"
    cp = store().decode(3, value)
    assert (cp.next_offset, cp.engine, cp.epoch) == (1234, b"engine-bytes" * 100, 1)


def test_unsigned_or_forged_checkpoints_are_refused_when_a_key_is_set():
    value = written(store(), Checkpoint(0, 10, b"state"))
    assert store().decode(0, value).engine == b"state"
    with pytest.raises(StateError, match="not signed with this service's key"):
        store(key=b"o" * 32).decode(0, value)
    forged = msgspec.msgpack.decode(value)
    forged["offset"] = 11                                 # tampered: the MAC covers the offset
    with pytest.raises(StateError, match="not signed"):
        store().decode(0, msgspec.msgpack.encode(forged))
    unsigned = written(store(key=None), Checkpoint(0, 10, b"state"))
    with pytest.raises(StateError, match="unsigned checkpoint"):
        store().decode(0, unsigned)
    assert store(key=None).decode(0, unsigned).engine == b"state"   # --insecure-state reads it


@pytest.mark.parametrize("key", [KEY, None])
def test_another_partitions_checkpoint_is_refused(key):
    value = written(store(key), Checkpoint(3, 10, b"state"))
    with pytest.raises(StateError, match="found under g/p.telemetry/0"):
        store(key).decode(0, value)
    if key is not None:   # relabelled without the key: the MAC no longer matches
        env = msgspec.msgpack.decode(value)
        env["partition"] = 0
        with pytest.raises(StateError, match="not signed"):
            store(key).decode(0, msgspec.msgpack.encode(env))


@pytest.mark.parametrize("other", [{"group": "g2"}, {"source": "q.telemetry"}])
def test_another_groups_or_topics_checkpoint_is_refused(other):
    value = written(store(**other), Checkpoint(0, 10, b"state"))
    with pytest.raises(StateError, match="found under"):
        store().decode(0, value)


def _bomb(mib: int) -> bytes:
    """A valid zlib stream of ~1 KB per MiB of zeros it expands to, built without compressing it
    all: one fully flushed (self-contained) deflate block repeated, then the trailer."""
    zeros = b"\0" * (1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    adler = 1
    for _ in range(mib):
        adler = zlib.adler32(zeros, adler)
    return b"\x78\xda" + block * mib + c.flush(zlib.Z_FINISH) + adler.to_bytes(4, "big")


def test_a_decompression_bomb_is_refused_cheaply():
    import time
    assert len(zlib.decompress(_bomb(3))) == 3 << 20       # the construction is a real zlib stream
    bomb = _bomb(1024)                                      # ~1 MB that expands to 1 GiB
    assert len(bomb) < 1100_000
    value = written(store(), Checkpoint(0, 10, b"x"))
    env = msgspec.msgpack.decode(value)
    t = time.perf_counter()
    for size in (1, 1 << 20):                              # says small, goes on: stops at what it said
        with pytest.raises(StateError, match="expands past"):
            store().decode(0, resign(value, engine=bomb, size=size))
    with pytest.raises(StateError, match="at most"):       # says 1 GiB: over the cap, not even tried
        store().decode(0, resign(value, engine=bomb, size=1 << 30))
    assert time.perf_counter() - t < 1.0
    with pytest.raises(StateError, match="does not expand"):
        store().decode(0, resign(value, size=env["size"] + 1))
    with pytest.raises(StateError):
        store().decode(0, resign(value, size=0))           # 0 would mean "no limit" to zlib
    small = store(max_bytes=1000)
    big = written(small, Checkpoint(0, 10, b"y" * 2000))
    with pytest.raises(StateError, match="at most 1000"):
        small.decode(0, big)


@pytest.mark.parametrize("change", [{"v": 1}, {"offset": -1}, {"epoch": "1"}, {"engine": "text"},
                                    {"size": 2.5}])
def test_malformed_envelopes_are_state_errors(change):
    value = written(store(), Checkpoint(0, 10, b"state"))
    with pytest.raises(StateError):
        store().decode(0, resign(value, **change))


@pytest.mark.parametrize("value", [b"\x01garbage", msgspec.msgpack.encode([1, 2]), msgspec.msgpack.encode({"v": 2}),
                                   msgspec.msgpack.encode({"v": 2, "group": "g"})])
def test_corrupt_checkpoint_is_a_state_error(value):
    with pytest.raises(StateError):
        store().decode(0, value)


def consider_all(s, values, partitions=(0,)):
    latest = {}
    for i, (p, v) in enumerate(values):
        s._consider(latest, p, v, f"p.state[0]@{i}")
    return s._settle(list(partitions), latest)


def test_newest_valid_checkpoint_wins_by_epoch_then_offset_not_arrival(caplog):
    old_owner, new_owner = store(), store()
    old_owner.epochs[0], new_owner.epochs[0] = 1, 2
    a = written(old_owner, Checkpoint(0, 500, b"a"))
    b = written(new_owner, Checkpoint(0, 400, b"b"))      # the new owner restarted from an earlier offset
    c = written(old_owner, Checkpoint(0, 900, b"c"))      # a late write of the old owner (or a replay)
    got = consider_all(store(), [(0, a), (0, b), (0, c), (0, a)])
    assert got[0].engine == b"b" and got[0].epoch == 2


def test_a_bad_message_costs_only_itself_and_its_partition_falls_back(caplog):
    w = store()
    good0 = written(w, Checkpoint(0, 100, b"good0"))
    good1 = written(w, Checkpoint(1, 100, b"good1"))
    forged = written(store(key=None), Checkpoint(0, 200, b"evil"))     # unsigned, newer
    r = store()
    got = consider_all(r, [(0, good0), (1, good1), (0, forged), (0, b"\x01garbage")], partitions=(0, 1, 2))
    assert got[0].engine == b"good0" and got[1].engine == b"good1" and 2 not in got
    assert r.rejected == {"unsigned": 1, "corrupt": 1}
    skipped = [rec for rec in caplog.records if "skipping the checkpoint" in rec.getMessage()]
    assert len(skipped) == 2 and {rec.partition for rec in skipped} == {0}
    assert {rec.origin for rec in skipped} == {"p.state[0]@2", "p.state[0]@3"}


def test_a_reader_never_goes_back_past_what_it_loaded(caplog):
    w = store()
    w.epochs[0] = 3
    new = written(w, Checkpoint(0, 900, b"new"))
    r = store()
    assert consider_all(r, [(0, new)])[0].engine == b"new"
    assert r.epochs[0] == 4                               # what it writes from now on: above every epoch seen
    w.epochs[0] = 2
    old = written(w, Checkpoint(0, 100, b"old"))          # compaction left only a replayed old one
    assert consider_all(r, [(0, old)]) == {}
    assert r.rejected == {"rollback": 1} and r.epochs[0] == 4
    assert any("not going back" in rec.getMessage() for rec in caplog.records)


def test_the_epoch_written_is_above_every_epoch_loaded():
    w = store()
    w.epochs[0] = 7
    r = store()
    consider_all(r, [(0, written(w, Checkpoint(0, 1, b"s")))], partitions=(0, 5))
    assert r.epochs == {0: 8, 5: 1}
    r.save(Checkpoint(0, 2, b"t"))
    assert r.decode(0, r.producer.sent[-1][1]).epoch == 8


def test_state_key_is_required_unless_insecure():
    assert state_key({"GPUWARDEN_STATE_KEY": "s" * 16}, insecure=False) == b"s" * 16
    assert state_key({}, insecure=True) is None
    with pytest.raises(StateKeyError, match="--insecure-state") as e:
        state_key({}, insecure=False)
    assert e.value.code == "GW401" and e.value.exit_code == 3
    with pytest.raises(StateKeyError, match="at least 16"):
        state_key({"GPUWARDEN_STATE_KEY": "short"}, insecure=True)


def test_serve_without_a_key_refuses_to_start_in_one_line(monkeypatch, capsys):
    from pipeline.cli import main
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    # A broker that is not there: the refusal comes before any connection is tried.
    assert main(["serve", "--kafka", "127.0.0.1:1"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPUWARDEN_STATE_KEY is not set" in err[0] and "[GW401]" in err[0]


def test_insecure_state_starts_with_a_loud_warning(monkeypatch, caplog):
    import pipeline.service.app as app
    import pipeline.service.wiring as wiring
    from pipeline.service.config import load_config_text

    class Stop(Exception):
        pass

    def no_broker(*a, **k):
        raise Stop
    monkeypatch.delenv("GPUWARDEN_STATE_KEY", raising=False)
    monkeypatch.setattr(wiring, "ensure_topics", no_broker)
    monkeypatch.setattr(wiring.connection, "transport_problem", lambda *a, **k: None)  # (as if one listened)
    cfg = load_config_text("service: {insecure_state: true}", env={})
    with pytest.raises(Stop):
        app.Service(cfg)
    assert any(r.levelname == "WARNING" and "INSECURE STATE" in r.getMessage() for r in caplog.records)
    with pytest.raises(StateKeyError):
        app.Service(load_config_text("", env={}))


def test_each_skipped_checkpoint_is_reported_with_its_reason():
    w = store()
    good = written(w, Checkpoint(0, 10, b"s" * 100))
    values = [(0, written(store(key=None), Checkpoint(0, 10, b"s"))),                 # unsigned
              (0, written(store(key=b"o" * 32), Checkpoint(0, 10, b"s"))),            # another key
              (0, written(w, Checkpoint(1, 10, b"s"))),                              # partition 1's
              (0, resign(good, size=1)),                                              # expands past
              (0, resign(good, v=1)), (0, b"\x01")]
    r = store()
    seen = []
    r.on_reject = seen.append
    consider_all(r, values)
    assert seen == ["unsigned", "bad_signature", "misplaced", "too_large", "version", "corrupt"]


def test_a_writer_that_could_not_read_the_topic_is_never_outranked_by_a_stale_checkpoint():
    # Before: a failed load left the epoch unset, the writer stamped 1, and an earlier owner's
    # checkpoint at epoch 5 won over everything it wrote: the next owner went back to it.
    earlier = store()
    earlier.epochs[0] = 5
    stale = written(earlier, Checkpoint(0, 100, b"stale"))
    cut_off = store()
    cut_off.unread([0])
    fresh = written(cut_off, Checkpoint(0, 900, b"fresh"))
    got = consider_all(store(), [(0, stale), (0, fresh)])
    assert got[0].engine == b"fresh"


def test_a_checkpoint_nested_past_the_decoders_depth_costs_itself_only():
    # Before: RecursionError out of load(), so every partition of the load started fresh.
    w = store()
    good = written(w, Checkpoint(1, 50, b"good1"))
    deep = b"\x91" * 5000 + b"\xc0"       # unsigned: anyone who can write the topic can send it
    r = store()
    got = consider_all(r, [(0, deep), (1, good)], partitions=(0, 1))
    assert got[1].engine == b"good1" and 0 not in got and r.rejected == {"corrupt": 1}
    with pytest.raises(StateError, match="corrupt checkpoint"):
        r.decode(0, deep)
