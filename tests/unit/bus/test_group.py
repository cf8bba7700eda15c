"""The in-memory group consumer keeps GroupConsumer's contract (pipeline/bus/group.py)."""

from __future__ import annotations

import pytest

from pipeline.bus import MemoryBus
from pipeline.errors import BusError


def bus_with(n: int = 40, partitions: int = 4) -> MemoryBus:
    bus = MemoryBus(partitions=partitions)
    p = bus.producer()
    for i in range(n):
        p.send("t", b"%d" % i, b"host-%d" % (i % 8))
    return bus


class Member:
    def __init__(self, bus: MemoryBus, log: list) -> None:
        self.c = bus.group_consumer("t", "g")
        self.log = log
        self.c.subscribe(lambda ps: log.append((self, "assigned", ps)), lambda ps: log.append((self, "revoked", ps)))


def test_poll_assigns_in_the_poll_and_returns_batches_per_partition_in_order():
    bus, log = bus_with(), []
    a = Member(bus, log)
    assert log == []                                   # callbacks only inside poll
    got: dict[int, list[int]] = {}
    for _ in range(10):
        for p, msgs in a.c.poll(0, 7).items():
            assert all(m.partition == p for m in msgs)
            got.setdefault(p, []).extend(m.offset for m in msgs)
    assert log == [(a, "assigned", [0, 1, 2, 3])]
    assert {p: offs for p, offs in got.items()} == {p: list(range(len(bus._topic("t")[p]))) for p in got}
    assert sum(map(len, got.values())) == 40


def test_revocation_runs_before_the_next_owner_is_assigned():
    bus, log = bus_with(), []
    a = Member(bus, log)
    a.c.poll(0, 5)
    b = Member(bus, log)
    assert b.c.poll(0, 100) == {} and b.c.assignment() == set()   # A has not let go yet
    a.c.poll(0, 5)
    assert log[-1] == (a, "revoked", [1, 3])
    b.c.poll(0, 5)
    assert log[-1] == (b, "assigned", [1, 3])
    assert a.c.assignment() == {0, 2} and b.c.assignment() == {1, 3}


def test_a_new_owner_starts_at_the_committed_offset_and_commits_need_ownership():
    bus, log = bus_with(), []
    a = Member(bus, log)
    a.c.poll(0, 100)
    a.c.commit({1: 3})
    with pytest.raises(BusError):
        bus.group_consumer("t", "g").commit({1: 4})
    a.c.crash()                                        # kill -9: no callback
    assert log[-1][1] == "assigned"
    b = Member(bus, log)
    batch = b.c.poll(0, 100)
    assert batch[1][0].offset == 3 and batch[0][0].offset == 0


def test_pause_resume_seek_and_end_offsets():
    bus, log = bus_with(), []
    a = Member(bus, log)
    a.c.poll(0, 0)
    a.c.pause([0])
    assert 0 not in a.c.poll(0, 100)
    a.c.resume([0])
    a.c.seek(0, 2)
    assert a.c.poll(0, 100)[0][0].offset == 2
    ends = a.c.end_offsets([0, 1, 2, 3])
    assert ends == {p: len(bus._topic("t")[p]) for p in range(4)}
    with pytest.raises(ValueError):
        bus.group_consumer("t", "other").seek(0, 1)


def test_close_revokes_and_hands_partitions_on():
    bus, log = bus_with(), []
    a, b = Member(bus, log), Member(bus, log)
    a.c.poll(0, 1)
    b.c.poll(0, 1)
    a.c.close()
    assert (a, "revoked", [0, 2]) in log
    b.c.poll(0, 1)
    assert b.c.assignment() == {0, 1, 2, 3}
    with pytest.raises(RuntimeError):
        a.c.poll(0, 1)
