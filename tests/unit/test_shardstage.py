"""Model shards that meet only through what they send each other give one fleet stage's alerts
(pipeline/shardstage.py): the service's dataflow between fleet partitions, run without a broker,
with the messages delayed, cut and read twice at random."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from pipeline.detection import build_stages
from pipeline.models.findings import from_wire, lane_of, to_wire
from pipeline.models.statecodec import decode_state, encode_state
from pipeline.resources import rules_dir
from pipeline.schema import DcgmRecord, DcgmSample, NcclRecord, NicRecord, ProgressRecord
from pipeline.shards import scorer_of, shard_of
from pipeline.shardstage import ShardStage
from pipeline.fleetstage import FleetStage
from pipeline.topology import Topology
from producers.sim import Simulator

_DEC = msgspec.json.Decoder(list[DcgmRecord | NcclRecord | NicRecord | ProgressRecord])


def _wire(x):
    """What crosses the fleet topic: packed and read back (arrays as arrays, maps by name)."""
    return decode_state(encode_state(x))


class Peers:
    """``n`` shard stages behind one ``FleetStage``-shaped front (what a ``Topology`` feeds):
    records routed as the service's outbox routes them, marks to all, and each stage's outgoing
    messages delivered to the others after a random delay, sometimes twice."""

    def __init__(self, make, n: int, hang, seed: int, again: float = 0.1) -> None:
        self.n = n
        self.stages = [ShardStage(make, i, n, hang=hang() if hang is not None and i == 0 else None) for i in range(n)]
        self.rng = random.Random(seed)
        self.again = again
        self.queue: list[list[tuple]] = [[] for _ in range(n)]
        self.alerts: list = []
        self.nccl_to: set[int] = set()  # what the service's outbox names in its marks

    def engine(self, key=None):
        return self.stages[0].engine()

    def feed(self, records, **kw):
        by: dict[int, list] = {}
        for r in records:
            p = shard_of(r.host, self.n) if isinstance(r, DcgmSample) else scorer_of(r, self.n)
            by.setdefault(p, []).append(r)
            if isinstance(r, NcclRecord):
                self.nccl_to.add(p)
        for p, recs in by.items():
            self.stages[p].feed(recs, upstream=0)

    def mark(self, upstream, upto, final=False, n_upstream=None):
        for s in self.stages:
            s.nccl_sent(sorted(self.nccl_to))
            s.mark(upstream, upto, final, n_upstream)

    def _send(self, i: int) -> None:
        got = self.stages[i].outgoing()
        level = self.stages[i].models.nccl_levels()
        for j in range(self.n):
            if j == i:
                continue
            msg = ("parts", i, _wire(got["parts"])) if got["parts"] else None
            if msg:
                self.queue[j].append(msg)
            if got["scored"] is not None:
                found = [from_wire(w, level) for w in _wire([to_wire(f) for f in got["findings"].get(j, [])])]
                self.queue[j].append(("findings", i, found, got["scored"]))

    def _deliver(self, j: int, everything: bool) -> bool:
        q = self.queue[j]
        k = len(q) if everything else self.rng.randint(0, len(q))
        if not k:
            return False
        take, self.queue[j] = q[:k], q[k:]
        for m in take:
            for _ in range(2 if self.rng.random() < self.again else 1):
                if m[0] == "parts":
                    self.stages[j].accept_parts(m[1], m[2])
                else:
                    self.stages[j].accept_findings(m[1], m[2], m[3])
        return True

    def advance(self, everything: bool = False):
        from pipeline.engine import EngineOutput

        out = EngineOutput()
        for _ in range(10_000):
            for i, s in enumerate(self.stages):
                out.extend(s.advance())
                self._send(i)
            moved = [self._deliver(j, everything) for j in range(self.n)]
            if not any(moved) and (not everything or not any(self.queue)):
                if not everything:
                    return out
                break
        return out

    def flush(self):
        self.mark(0, math.inf, True)
        return self.advance(everything=True)

    @property
    def pending(self) -> int:
        return 0


def _alerts(batches, make_fleet, cut: int) -> list:
    built, diags = build_stages([str(rules_dir())], "auto")
    assert built is not None, diags
    fleet = make_fleet(built)
    det = Topology(built.host, built.fleet, fleet=fleet)
    out = []
    flat = [r for b in batches for r in b]
    step = max(1, len(flat) // cut)
    for i in range(0, len(flat), step):
        out += det.process(flat[i : i + step]).alerts
    out += det.flush().alerts
    return sorted((a.id, a.state, a.ts, a.summary, a.evidence, a.labels.get("detector")) for a in out)


def _batches(scenario: str, seed: int, interval: float = 1.0, duration: int = 900) -> list[list]:
    # 6 hosts: communicators of 8 ranks (a host's GPUs) and of 6 (one GPU of every host), two
    # NCCL lanes that 2 to 5 shards score in different places.
    sim = Simulator(hosts=6, duration=duration, seed=seed, scenario=scenario, interval=interval)
    return [_DEC.decode(msgspec.json.encode(b)) for b in sim.batches() if b]


@pytest.fixture(scope="module")
def mixed() -> list[list]:
    # NCCL-model alerts (a straggler, a host's sagging bandwidth: findings cross from the scorers)
    # and cohort-model ones (counter_rate: parts cross between every shard).
    return _batches("mixed", 3)


def _one(batches) -> list:
    return _alerts(batches, lambda b: FleetStage(b.fleet, hang=b.hang() if b.hang else None), 1)


@pytest.mark.parametrize(("n", "cut", "seed"), [(2, 9, 1), (4, 30, 2), (5, 3, 3)])
def test_shards_meeting_by_messages_give_one_fleet_stages_alerts(mixed, n, cut, seed):
    one = _one(mixed)
    assert {"nccl_busbw", "nccl_straggler", "counter_rate"} <= {a[5] for a in one}
    assert _alerts(mixed, lambda b: Peers(b.fleet, n, b.hang, seed), cut) == one


def test_shards_by_messages_with_hosts_at_their_own_phase_of_the_second(mixed):
    """Exporters sample at their own phase: no record on a tick's edge, and each shard's last
    record ends mid-tick when every upstream goes final."""
    phase = {}
    batches = [
        [msgspec.structs.replace(r, ts=r.ts + phase.setdefault(r.host, 0.05 + 0.1 * len(phase) % 0.9)) for r in b]
        for b in mixed
    ]
    one = _one(batches)
    made: list[Peers] = []
    got = _alerts(batches, lambda b: made.append(Peers(b.fleet, 3, b.hang, 5)) or made[-1], 7)
    assert got == one
    assert all(s.done == math.inf for s in made[0].stages)  # every shard flushed


@pytest.mark.slow
def test_shards_by_messages_at_30s_sampling_with_silent_hosts():
    batches = _batches("llama3", 4, interval=30.0, duration=3600)
    one = _one(batches)
    assert one
    assert _alerts(batches, lambda b: Peers(b.fleet, 3, b.hang, 7), 11) == one


def test_an_open_ended_part_lets_the_others_on_and_a_reopened_shard_counts_from_the_next_epoch():
    from pipeline.models.cohorts import LAG_EPOCHS, OPEN_ENDED, Epochs
    from pipeline.shardstage import PeerExchange

    ex = PeerExchange(["a", "b"], "a")
    made = []
    ep = Epochs(lambda k, until: made.append(k) or {"epoch": k, "until": until, "sums": k}, lambda k, parts: None)
    ep.exchange, ep.shard = ex, "b"
    ep.advance(10)
    ep.advance(12)
    ex.accept("a", {"epoch": 10, "until": 20})
    assert ex.bound() == 12 + LAG_EPOCHS
    ep.close(first=10)                       # every upstream idle: b learns nothing more
    assert ex.published["b"][-1] == {"epoch": 12, "until": OPEN_ENDED, "sums": 12}
    assert ex.bound() == 20 + LAG_EPOCHS     # only a holds the others now
    assert not ex.accept("b", {"epoch": 10, "until": 12, "sums": 10})   # read again: dropped
    ep.advance(12)                           # b's hosts send again within the closed epoch
    assert ex.published["b"][-2] == {"epoch": 12, "until": 13, "sums": 12}  # truncated, its sums kept
    assert ex.published["b"][-1] == {"epoch": 13, "until": 13}
    assert ex.bound() == 13 + LAG_EPOCHS
    assert [p["epoch"] for p in ex.parts(12)] == [10, 12] and ex.parts(13) is None


def _second_of_two(seconds: int) -> tuple[ShardStage, str]:
    """Shard 1 of 2, fed ``seconds`` of one of its hosts' samples (one upstream task)."""
    from tests.factories import sample

    built, diags = build_stages([str(rules_dir())], "auto")
    assert built is not None, diags
    host = next(h for h in (f"n{i}" for i in range(50)) if shard_of(h, 2) == 1)
    st = ShardStage(built.fleet, 1, 2, upstream=1)
    st.feed([sample(t, host) for t in range(seconds)], upstream=0)
    return st, host


def test_a_shards_lull_flush_waiting_for_the_others_parts_releases_nothing_new():
    # Every task final (a lull): shard 1 flushes once shard 0's parts allow. Should the tasks
    # resume meanwhile, marking past the lull, their records wait: released into the engine
    # before its flush, they would be taken for the end of their seconds.
    from tests.factories import T0, sample

    st, host = _second_of_two(120)
    st.mark(0, T0 + 119, final=True)
    st.advance()
    assert st.flushing and st.done < math.inf, "shard 0's parts are not in"
    released = st.stats["released"]
    st.feed([sample(t, host) for t in range(100, 120)], upstream=0)  # sent again: gone already
    assert st.stats["late"] == 20
    st.feed([sample(t, host) for t in range(120, 180)], upstream=0)
    st.mark(0, T0 + 179)
    st.advance()
    assert st.flushing and st.stats["released"] == released and st.pending >= 60


def test_two_lulls_in_one_poll_flush_as_two_polls_do():
    # The fleet task advances at each lull (pipeline/service/fleet.py): a task back from one
    # and idle again in the same poll makes a second, whose records the shard flushes too.
    from tests.factories import T0, sample

    built, diags = build_stages([str(rules_dir())], "auto")
    assert built is not None, diags

    def run(poll_between: bool) -> tuple:
        st = ShardStage(built.fleet, 0, 1, upstream=1)
        st.feed([sample(t, "n1") for t in range(120)], upstream=0)
        st.mark(0, T0 + 119, final=True)
        st.advance()
        if poll_between:
            st.advance()
        st.feed([sample(t, "n1") for t in range(120, 240)], upstream=0)
        st.mark(0, T0 + 235)
        st.mark(0, T0 + 239, final=True)
        assert st.idle()
        st.advance()
        eng = st.engine()
        return eng.pending, eng.released, eng.stats["records.dcgm"], st.released

    assert run(False) == run(True)
    assert run(False)[0] == 0 and run(False)[2] == 240


def test_after_a_lull_every_shard_finishes_its_flush_while_the_tasks_are_awaited():
    # Shard 0's hosts end sooner than shard 1's. Flushed at the lull and waiting for the task
    # to resume, the scorer must say it has done everything up to the lull: stepped to the
    # task's mark it said less, and shard 1's flush, which waits for the scorer, never ended.
    from tests.factories import T0, sample

    built, diags = build_stages([str(rules_dir())], "auto")
    assert built is not None, diags
    hosts = [next(h for h in (f"n{i}" for i in range(50)) if shard_of(h, 2) == k) for k in range(2)]
    s = [ShardStage(built.fleet, k, 2, upstream=1) for k in range(2)]
    s[0].feed([sample(t, hosts[0]) for t in range(90)], upstream=0)
    s[1].feed([sample(t, hosts[1]) for t in range(120)], upstream=0)

    def rounds(n: int) -> None:
        for _ in range(n):
            for x in s:
                x.advance()
            sent = [x.outgoing() for x in s]
            for k in range(2):
                s[1 - k].accept_parts(k, sent[k]["parts"])
                s[1 - k].accept_findings(k, sent[k]["findings"].get(1 - k, []), sent[k]["scored"])
    for x in s:
        x.nccl_sent([0])  # the marks say NCCL records went to shard 0's scorer: shard 1 waits for it
        x.mark(0, T0 + 60)
    rounds(2)
    for x in s:
        x.mark(0, T0 + 119, final=True)
    rounds(20)
    assert all(x.resuming == {0: T0 + 119} for x in s)
    assert [(x.flushing, x.done) for x in s] == [(False, math.inf)] * 2
    assert s[0].scored == s[1].scored == T0 + 120    # the lull's tick: no further until they are back


def test_a_shard_sent_no_nccl_records_keeps_no_scorer_and_its_progress_runs_with_the_marks():
    # Each shard scores its own NCCL lanes; one that is sent none holds no scorer engine (eight
    # idle scorers in one process cost the fleet stage's alerts ~0.3 s at p99 in
    # bench/service_latency.py), and what it would say of its progress is the marks'.
    from pipeline.shards import SCORER
    from tests.factories import T0

    st, host = _second_of_two(60)
    st.mark(0, T0 + 59)
    st.advance()
    assert SCORER not in st.engines and st.own_scored == st.last_watermark == T0 + 59
    size = next(k for k in range(2, 99) if lane_of(k) % 2 == 1)  # a communicator size shard 1 scores
    nccl = NcclRecord(ts=T0 + 60.0, host=host, comm="c", rank=0, nranks=size, coll="AllReduce", bytes=8,
                      exec_time_us=5.0)
    st.feed([nccl], upstream=0)
    st.mark(0, T0 + 61)
    st.advance()
    assert SCORER in st.engines and st.engines[SCORER].stats["records.nccl"] == 1
