"""A per-host message holds a host's whole sample (docs/architecture.md §4), and the release rule
trusts it so (``HostClock.note_whole``): a host is complete for its sample's tick once its
message came. A sample split over several messages (a recording publisher interrupted mid-sample
by another line, a third-party producer sending some GPUs at a time) must cost latency, never
the rest of the sample as ``late``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from pipeline.engine import EngineConfig
from tests.factories import T0, fuzz_examples
from tests.unit.engine.hostclock_factories import engine, message, nccl_record, process_pieces

GPUS = 8



@pytest.mark.parametrize("phase", [0.0, 0.002, 0.3, 0.7, 0.97])
def test_a_sample_split_over_two_messages_in_two_batches_loses_nothing(phase) -> None:
    # Two hosts at the same phase, each second one message of all their GPUs; at second 45 host
    # b's sample comes as two messages (GPUs 0-3, then 4-7), in separate batches, with host a's
    # message between them. Host b counted as complete for second 45 on its first half, and its
    # second half was dead-lettered late.
    eng = engine()
    dead = []
    for k in range(60):
        t = T0 + k + phase
        a, b = message(t, "a", GPUS), message(t, "b", GPUS)
        if k == 45:
            dead += process_pieces(eng, [b[:4]]).dead
            dead += process_pieces(eng, [a]).dead
            dead += process_pieces(eng, [b[4:]]).dead
        else:
            dead += process_pieces(eng, [a, b]).dead
    dead += eng.flush().dead
    assert [(d.reason, d.host, d.ts - T0) for d in dead] == []


def test_a_host_losing_a_gpu_still_completes_its_seconds() -> None:
    # A GPU that fell off the bus: the host's samples hold seven GPUs from then on. Only the
    # first of them waits for the next sample; then seven is the host's whole sample again.
    eng = engine()
    done = []
    for k in range(60):
        n = GPUS if k < 40 else GPUS - 1
        process_pieces(eng, [message(T0 + k, "a", n)])
        done.append(eng.released - T0)
    assert done[44] == 45.0  # second 44 went with its own message


def test_a_split_sample_is_whole_once_its_rest_came() -> None:
    # Each of a host's samples is complete once its message came, so its tick goes at once; a
    # sample split in two goes once its second half came, as many rows as the sample before.
    eng = engine()
    released = []
    for k in range(50):
        msg = message(T0 + k, "a", GPUS)
        if k == 45:
            process_pieces(eng, [msg[:4]])
            released.append(eng.released - T0)
            process_pieces(eng, [msg[4:]])
        else:
            process_pieces(eng, [msg])
        released.append(eng.released - T0)
    assert released[44] == 45.0  # whole samples: second 44 went with its message
    assert released[45] == 45.0  # second 45 waits for its other half...
    assert released[46] == 46.0  # ...and goes with it
    assert released[47] == 47.0



@settings(max_examples=fuzz_examples(40), deadline=None)
@given(
    st.data(),
    st.integers(1, 3),
    st.sampled_from([1.0, 5.0, 10.0, 30.0]),
)
def test_split_samples_in_any_batching_lose_no_record(data, n_hosts, step) -> None:
    # Hosts at their own phases and sampling steps, each sample one message or split into up to
    # three (consecutive GPUs), the pieces of all hosts of a round interleaved in any order that
    # keeps each host's own in order, NCCL messages among them, cut into batches anywhere:
    # no record is refused as late, whatever the split.
    hosts = [f"h{i}" for i in range(n_hosts)]
    phases = {h: data.draw(st.floats(0.0, 0.999), label=f"phase {h}") for h in hosts}
    rounds = 30
    stream: list[list] = []
    for k in range(rounds):
        queues = []
        for h in hosts:
            t = T0 + k * step + phases[h] * min(step, 1.0)
            msg = message(t, h, GPUS)
            cuts = sorted(data.draw(st.sets(st.integers(1, GPUS - 1), max_size=2), label="cuts"))
            pieces = [msg[i:j] for i, j in zip([0, *cuts], [*cuts, GPUS])]
            if data.draw(st.booleans(), label="nccl"):
                # (Before the sample: a host's other producers' records of a tick must come
                # before the sample that completes it, or within ``host_disorder``, §4.)
                pieces.insert(0, [nccl_record(t, h)])
            queues.append(pieces)
        while any(queues):
            q = data.draw(st.sampled_from([q for q in queues if q]), label="next host")
            stream.append(q.pop(0))
    eng = engine(EngineConfig())
    dead = []
    i = 0
    while i < len(stream):
        size = data.draw(st.integers(1, 6), label="batch")
        dead += process_pieces(eng, stream[i:i + size]).dead
        i += size
    dead += eng.flush().dead
    assert [(d.reason, d.host, d.ts - T0) for d in dead] == []


@pytest.mark.parametrize(("step", "phase"), [(1.0, 0.5), (5.0, 0.0), (10.0, 0.3)])
def test_another_producers_record_at_the_samples_time_does_not_complete_the_host(step, phase) -> None:
    # A host's NCCL producer sends a record stamped with the DCGM sample's time, in a message of
    # its own, just before the sample's message. The host counted as complete for the record's
    # tick as if the record were its sample, and the sample that followed was dead-lettered late.
    eng = engine()
    dead = []
    for k in range(60):
        t = T0 + step * k + phase
        if k in (40, 50):
            dead += process_pieces(eng, [[nccl_record(t, "a")]]).dead
        dead += process_pieces(eng, [message(t, "a", GPUS)]).dead
    dead += eng.flush().dead
    assert [(d.reason, d.ts - T0) for d in dead] == []
