"""The fleet stage (pipeline/fleetstage.py): its watermark is its upstream tasks' marks (after a
lull, whichever task resumes first waits for the others), its input order is canonical, a
record forwarded twice counts once, and its state survives a restore."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from pipeline.bus.telemetry import per_host_messages
from pipeline.decode import Decoder
from pipeline.detection import build_detector
from pipeline.engine import Engine, EngineConfig
from pipeline.engine.stage import StageBase
from pipeline.schema import NcclRecord, dcgm
from pipeline.canonical import canonical_order
from pipeline.fleetstage import FleetStage, records_decoder
from pipeline.topology import Topology
from producers.sim.simulator import Simulator
from tests.factories import T0, dcgm_models_file, fuzz_examples, sample

RULES = str(Path(__file__).resolve().parents[2] / "rules")


def _fleet_engine() -> Engine:
    det, _ = build_detector([RULES], "auto")
    assert isinstance(det, Topology)
    return det.make_fleet_engine()


@pytest.fixture(scope="module")
def records() -> list:
    sim = Simulator(hosts=4, duration=400, seed=3, scenario="mixed")
    values = [v for batch in sim.batches() if batch for _, v in per_host_messages(batch)]
    got = Decoder().decode_many(values, [f"m{i}" for i in range(len(values))])
    return list(got.records)


def _keys(alerts) -> set[tuple]:
    return {(a.id, a.state, a.host, a.gpu, a.ts) for a in alerts}


def _split(records: list, n: int) -> list[list]:
    """The records as ``n`` upstream tasks would forward them: by host, each in its own order."""
    parts: list[list] = [[] for _ in range(n)]
    hosts = sorted({r.host for r in records})
    for r in records:
        parts[hosts.index(r.host) % n].append(r)
    return parts


def _through(records: list, upstream: int, step: int, seed: int) -> tuple[set[tuple], FleetStage]:
    """Forward in chunks from ``upstream`` tasks in a random interleaving, each marking what it
    has sent up to (its newest record less 30 s, as a host stage's release bound trails)."""
    rng = random.Random(seed)
    st = FleetStage(_fleet_engine, upstream=upstream)
    parts = _split(records, upstream)
    pos = [0] * upstream
    alerts = []
    while any(pos[i] < len(parts[i]) for i in range(upstream)):
        i = rng.choice([k for k in range(upstream) if pos[k] < len(parts[k])])
        chunk = parts[i][pos[i]:pos[i] + step]
        pos[i] += len(chunk)
        st.feed(chunk)
        newest = max(r.ts for r in parts[i][:pos[i]])
        done = pos[i] == len(parts[i])
        st.mark(i, math.floor(newest - 30) if not done else newest + 1)
        alerts += st.advance().alerts
    alerts += st.flush().alerts
    return _keys(alerts), st


def test_the_answer_does_not_depend_on_upstream_tasks_or_their_interleaving(records):
    one, st = _through(records, 1, 500, 0)
    assert any(k for k in one), "the recording makes model alerts"
    for upstream, step, seed in [(2, 300, 1), (4, 97, 2), (3, 1000, 3)]:
        got, _ = _through(records, upstream, step, seed)
        assert got == one, (upstream, step, seed)


def test_nothing_is_released_until_every_upstream_task_has_marked():
    st = FleetStage(lambda: Engine(row_checks=[], tick_checks=[], screened=True), upstream=2)
    st.feed([sample(t, "n1") for t in range(10)])
    st.mark(0, T0 + 100)
    st.advance()
    assert st.engine().stats["records.dcgm"] == 0 and st.watermark() == -math.inf
    st.mark(1, T0 + 5)
    st.advance()
    assert st.engine().stats["records.dcgm"] == 5        # up to the slower task's mark
    st.mark(1, T0 + 50, final=True)                        # final: it holds nothing back
    st.advance()
    assert st.engine().stats["records.dcgm"] == 10


def test_a_record_forwarded_twice_counts_once():
    st = FleetStage(lambda: Engine(row_checks=[], tick_checks=[], screened=True))
    recs = [sample(t, "n1") for t in range(10)]
    st.feed(recs[:6])
    st.mark(0, T0 + 4)
    st.advance()
    st.feed(recs)              # an upstream replay after a crash: 0-3 released, 4-5 buffered
    st.flush()
    assert st.engine().stats["records.dcgm"] == 10
    assert st.stats["late"] == 4 and st.stats["duplicate"] == 2


def test_two_sources_of_a_gpus_second_both_reach_the_models_as_in_one_engine():
    # A host's DCGM exporter and its kernel-log reader each send GPU 0's second: two records
    # of one identity, not one forwarded twice; the fleet engine reads both, as one engine does.
    recs = [r for t in range(10) for r in (sample(t, "n1"), dcgm(T0 + t, "n1", 0, {"xid": 79}))]
    st = FleetStage(lambda: Engine(row_checks=[], tick_checks=[], screened=True))
    st.feed(recs)
    st.feed(recs[:4])          # an upstream replay of the first two seconds: repeats, dropped
    st.flush()
    one = Engine(row_checks=[], tick_checks=[])
    one.process(recs)
    one.flush()
    assert st.engine().stats["records.dcgm"] == one.stats["records.dcgm"] == 20
    assert st.stats["duplicate"] == 4


def _own_pack_beside_the_models(directory: Path) -> Topology:
    """Both stages of a rule author's own pack (one rule, on the temperature) beside the default
    models, whose SBE-rate model reads a field no rule does."""
    (directory / "models.yaml").write_text(Path(RULES, "models.yaml").read_text())
    (directory / "hot.yaml").write_text(
        "rules:\n  - name: hot\n    fault: thermal_hot\n    severity: warning\n    condition: gpu_temp > 90\n"
        "    summary: hot\n"
    )
    det, _ = build_detector([str(directory)], "auto")
    assert isinstance(det, Topology)
    return det


def test_a_bad_value_only_the_models_read_is_dead_lettered_once_by_the_host_stage(tmp_path):
    # A rule author's own pack: one rule (on the temperature) beside the default models, whose
    # SBE-rate model reads a field no rule does. Its negative value is the host stage's to refuse,
    # with the record's origin, not the fleet engine's to drop unsaid.
    det = _own_pack_beside_the_models(tmp_path)
    recs = [sample(t, "n1", ecc_sbe_volatile=-1 if t == 3 else 0) for t in range(6)]
    out = det.process(recs, [f"telemetry:0@{t}" for t in range(6)])
    out.extend(det.flush())
    assert [(d.reason, d.origin, d.fields) for d in out.dead] == [
        ("negative_value", "telemetry:0@3", ["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"])
    ]
    assert det.fleet.stats["dead_again"] == 1        # the fleet engine met it too: not repeated


def test_a_record_with_bad_values_for_both_stages_gets_one_dead_letter_a_reason(tmp_path):
    # The same pack: a temperature below the floor (the rule's) and a negative SBE count (the model's)
    # in one record are one record's fields dropped for one reason, as one engine would say it.
    det = _own_pack_beside_the_models(tmp_path)
    recs = [sample(t, "n1", gpu_temp=-100 if t == 3 else 60, ecc_sbe_volatile=-1 if t in (3, 4) else 0)
            for t in range(6)]
    out = det.process(recs, [f"telemetry:0@{t}" for t in range(6)])
    out.extend(det.flush())
    got = [(d.reason, d.origin, d.action, sorted(d.fields)) for d in out.dead]
    assert got == [
        ("negative_value", "telemetry:0@3", "fields_dropped", ["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_GPU_TEMP"]),
        ("negative_value", "telemetry:0@4", "fields_dropped", ["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]),
    ]
    assert "DCGM_FI_DEV_GPU_TEMP" in out.dead[0].detail and "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" in out.dead[0].detail


def test_an_upstream_task_that_never_marks_holds_only_up_to_max_buffer():
    st = FleetStage(lambda: Engine(row_checks=[], tick_checks=[], screened=True), upstream=2, max_buffer=20)
    st.feed([sample(t, "n1") for t in range(30)])
    st.mark(0, T0 + 25)
    st.advance()
    assert st.stats["forced"] >= 1 and st.engine().stats["records.dcgm"] == 25



class _Raising(StageBase):
    """A model stage that raises on every row."""

    kind, checks, columns = "raising", [], set()

    def run(self, view, entities, outputs):
        raise RuntimeError("boom")


def test_what_only_the_fleet_engine_refuses_or_fails_on_is_a_dead_letter():
    # The fleet engine keeps every host of its fleet, where a host-stage engine keeps its
    # partition's: a limit sized for a partition refuses hosts here that no host stage refused,
    # and a model that raises fails rows no host stage ran. Both reach the dead letters.
    st = FleetStage(lambda: Engine(EngineConfig(max_hosts=2), row_checks=[], tick_checks=[], stages=[_Raising()],
                                   screened=True))
    st.feed([sample(t, h) for t in range(10) for h in ("n1", "n2", "n3")])
    st.mark(0, T0 + 10, final=True)
    dead = st.advance().dead + st.flush().dead
    refused = [d for d in dead if d.reason == "entity_limit"]
    failed = [d for d in dead if d.reason == "internal"]
    assert len(refused) == 10 and {d.host for d in refused} == {"n3"} and "engine.max_hosts" in refused[0].detail
    assert len(failed) == 20 and {d.origin.split("@")[0] for d in failed} == {"n1", "n2"}
    assert "boom" in failed[0].detail
    assert st.stats["dead_again"] == 0


class _FinishRaises(StageBase):
    """A model stage whose end-of-tick hook (``Stage.finish``, outside the engine's guard of a
    tick's rows) raises at ticks 3 and 4, counting the ticks it ran."""

    kind, checks, columns = "finishing", [], set()

    def __init__(self) -> None:
        self.ticks: list[float] = []

    def run(self, view, entities, outputs):
        self.ticks.append(view.ts0)
        return []

    def finish(self):
        if self.ticks and self.ticks[-1] in (T0 + 3, T0 + 4):
            raise RuntimeError("boom")


def test_a_model_that_raises_outside_a_ticks_rows_costs_that_release_not_the_stage():
    # It left FleetStage.advance, and a service's fleet task with it: the service stopped, and
    # met the same error again at every restart from its checkpoint.
    stage = _FinishRaises()
    st = FleetStage(lambda: Engine(row_checks=[], tick_checks=[], stages=[stage], screened=True))
    dead = []
    for t in range(10):
        st.feed([sample(t, "n1")])
        st.mark(0, T0 + t + 1)
        dead += st.advance().dead
    dead += st.flush().dead
    assert [d.reason for d in dead] == ["internal", "internal"] and "boom" in dead[0].detail
    assert dead[0].origin.startswith("fleet stage@")
    assert stage.ticks == [T0 + t for t in range(10)]  # the stage went on with the later ticks

def _plain_stage(upstream: int, **kw) -> FleetStage:
    return FleetStage(lambda: Engine(row_checks=[], tick_checks=[], screened=True), upstream=upstream, **kw)


def _lull(st: FleetStage, hosts: list[str], upto: int = 10) -> None:
    """Each task ``i`` forwards host ``hosts[i]``'s seconds before ``upto`` and goes idle (its
    final mark): a lull, in which the stage releases everything."""
    for i, host in enumerate(hosts):
        st.feed([sample(t, host) for t in range(upto)], upstream=i)
    for i in range(len(hosts)):
        st.mark(i, T0 + upto - 1, final=True)
    st.advance()
    assert st.engine().stats["records.dcgm"] == upto * len(hosts)


def test_after_a_lull_the_task_that_resumes_first_waits_for_the_others():
    # The whole input paused (every task final), then task 0 sends its backlog and marks far
    # ahead before task 1 sends anything: task 1 was forwarding just before the lull, so its
    # backlog is waited for, not passed as an idle task's (whose records would all be late).
    st = _plain_stage(2)
    _lull(st, ["n1", "n2"])
    assert not st.idle() and set(st.resuming) == {0, 1}
    st.feed([sample(t, "n1") for t in range(10, 40)], upstream=0)
    st.mark(0, T0 + 39)
    st.advance()
    assert st.engine().stats["records.dcgm"] == 20, "nothing past the lull before task 1 resumes"
    st.feed([sample(t, "n2") for t in range(10, 40)], upstream=1)
    st.mark(1, T0 + 39)
    st.advance()
    assert st.engine().stats["records.dcgm"] == 20 + 2 * 29 and st.stats["late"] == 0 and not st.resuming


def test_a_task_that_resumes_and_idles_again_is_no_longer_waited_for():
    st = _plain_stage(2)
    _lull(st, ["n1", "n2"])
    st.feed([sample(t, "n2") for t in range(10, 15)], upstream=1)
    st.mark(1, T0 + 14, final=True)            # back, and idle again before its next mark
    st.feed([sample(t, "n1") for t in range(10, 40)], upstream=0)
    st.mark(0, T0 + 39)
    st.advance()
    assert st.resuming == {} and st.engine().stats["records.dcgm"] == 20 + 5 + 29


def test_a_task_not_back_within_resume_wait_of_the_lull_is_passed_as_idle():
    # Its hosts may be gone: once another task runs resume_wait seconds past the lull the stage
    # stops waiting, and what it sends later for released seconds is late.
    st = _plain_stage(2, resume_wait=20)
    _lull(st, ["n1", "n2"])
    st.feed([sample(t, "n1") for t in range(10, 40)], upstream=0)
    st.mark(0, T0 + 25)
    st.advance()
    assert st.resuming and st.engine().stats["records.dcgm"] == 20
    st.mark(0, T0 + 35)                       # 26 s past the lull at T0 + 9
    st.advance()
    assert st.stats["unresumed"] == 1 and not st.resuming
    assert st.engine().stats["records.dcgm"] == 20 + 25
    # Also when that task's backlog ends in an idle flush (a final mark is all it sends).
    st = _plain_stage(2, resume_wait=20)
    _lull(st, ["n1", "n2"])
    st.feed([sample(t, "n1") for t in range(10, 40)], upstream=0)
    st.mark(0, T0 + 39, final=True)
    st.advance()
    assert st.stats["unresumed"] == 1 and st.engine().stats["records.dcgm"] == 20 + 30


def test_after_a_lull_tasks_idle_long_before_it_or_without_records_are_not_waited_for():
    st = _plain_stage(3, resume_wait=60)
    st.feed([sample(t, "n2") for t in range(5)], upstream=1)      # idle since T0 + 4
    st.feed([sample(t, "n1") for t in range(200)], upstream=0)
    st.mark(1, T0 + 4, final=True)
    st.mark(2, -math.inf, final=True)                              # no hosts at all
    st.mark(0, T0 + 199, final=True)
    st.advance()
    assert set(st.resuming) == {0}
    st.feed([sample(t, "n1") for t in range(200, 230)], upstream=0)
    st.mark(0, T0 + 229)
    st.advance()
    assert st.engine().stats["records.dcgm"] == 205 + 29


def test_a_restored_stage_still_waits_for_the_tasks_of_its_lull():
    st = _plain_stage(2)
    _lull(st, ["n1", "n2"])
    again = _plain_stage(2)
    again.restore(st.snapshot(replayable=True), records_decoder(again.engine().decode_fields))
    assert again.resuming == st.resuming and again.lull == st.lull
    again.feed([sample(t, "n1") for t in range(10, 40)], upstream=0)
    again.mark(0, T0 + 39)
    again.advance()
    assert again.released == st.released and again.pending == 30


def test_canonical_order_is_by_time_first_so_released_slices_concatenate():
    # The fleet stage sorts each released slice on its own: that equals sorting everything at
    # once only if the order is by event time first, whichever host, GPU or kind comes first.
    recs = [sample(t % 10, f"n{(t * 3) % 4}", t // 10) for t in range(40)]  # each identity once
    recs += [NcclRecord(ts=T0 + t % 7, host=f"n{t % 3}", comm="c1", rank=t % 3, nranks=3, coll="AllReduce",
                        gpu=0, bytes=1 << 20, exec_time_us=900.0)
             for t in range(12)]
    ts = np.array([r.ts for r in recs])
    whole, _ = canonical_order(recs, ts)
    assert [recs[i].ts for i in whole] == sorted(r.ts for r in recs)
    for cut in (T0 + 2, T0 + 3.5, T0 + 6):
        parts = []
        for keep in (ts < cut, ts >= cut):
            idx = np.flatnonzero(keep)
            got, _ = canonical_order([recs[i] for i in idx], ts[idx])
            parts += [int(idx[i]) for i in got]
        assert parts == whole


def test_a_restored_fleet_stage_goes_on_exactly_as_one_that_ran_through(records):
    whole, _ = _through(records, 2, 400, 5)
    st = FleetStage(_fleet_engine, upstream=2)
    parts = _split(records, 2)
    half = [len(p) // 2 for p in parts]
    alerts = []
    for i in range(2):
        st.feed(parts[i][:half[i]])
        st.mark(i, math.floor(max(r.ts for r in parts[i][:half[i]]) - 30))
    alerts += st.advance().alerts
    blob = st.snapshot()
    again = FleetStage(_fleet_engine, upstream=2)
    again.restore(blob, records_decoder(again.engine().decode_fields))
    assert again.pending == st.pending
    for i in range(2):
        again.feed(parts[i][half[i]:])
        again.mark(i, max(r.ts for r in parts[i]) + 1, final=True)
    alerts += again.advance().alerts
    alerts += again.flush().alerts
    assert _keys(alerts) == whole


def _interleaved(records: list, upstream: int, step: int, seed: int):
    """The records as ``upstream`` tasks forward them (``_split``), ``step`` at a time from a
    task drawn at random: (task, chunk, the task's newest record so far, whether it is done)."""
    rng = random.Random(seed)
    parts = _split(records, upstream)
    pos = [0] * upstream
    while any(pos[i] < len(parts[i]) for i in range(upstream)):
        i = rng.choice([k for k in range(upstream) if pos[k] < len(parts[k])])
        chunk = parts[i][pos[i]:pos[i] + step]
        pos[i] += len(chunk)
        yield i, chunk, max(r.ts for r in parts[i][:pos[i]]), pos[i] == len(parts[i])


def _fleet_log(records: list, upstream: int, step: int, seed: int) -> list[tuple]:
    """What ``upstream`` host-stage tasks write to one fleet partition, in log order: record
    messages (with their sender) and the marks after them (as ``_through`` feeds them)."""
    log: list[tuple] = []
    for i, chunk, newest, done in _interleaved(records, upstream, step, seed):
        log.append(("records", chunk, i))
        log.append(("mark", i, newest + 1 if done else math.floor(newest - 30), done))
    return log


def _read(st: FleetStage, log: list[tuple], start: int, stop: int) -> list:
    """Feed ``log[start:stop]`` as the service's fleet task does, one advance per message."""
    alerts = []
    for offset in range(start, stop):
        m = log[offset]
        if m[0] == "records":
            st.feed(m[1], at=offset, upstream=m[2])
        else:
            st.mark(m[1], m[2], final=m[3])
        st.position = offset + 1
        alerts += st.advance().alerts
    return alerts


def _lull_log(records: list, upstream: int, lead: int, step: int = 300) -> list[tuple]:
    """The fleet log of a lull: every task forwards the first half of the recording's time and
    goes idle (final); then task ``lead`` forwards all the rest of its records, and marks,
    before any other resumes (as after a broker outage, when one partition's backlog is
    fetched first)."""
    parts = _split(records, upstream)
    mid = (min(r.ts for r in records) + max(r.ts for r in records)) // 2
    log: list[tuple] = []

    def forward(i: int, recs: list) -> None:
        for k in range(0, len(recs), step):
            log.append(("records", recs[k:k + step], i))
            newest = max(r.ts for r in recs[:k + step])
            last = k + step >= len(recs)
            log.append(("mark", i, newest if last else math.floor(newest - 30), last))
    for i, p in enumerate(parts):
        forward(i, [r for r in p if r.ts < mid])
    for i in [lead] + [k for k in range(upstream) if k != lead]:
        forward(i, [r for r in parts[i] if r.ts >= mid])
    return log


@pytest.mark.parametrize("lead", [0, 2])
def test_a_lull_with_one_task_resuming_first_gives_the_answer_of_no_lull(records, lead):
    whole, _ = _through(records, 1, 500, 0)
    st = FleetStage(_fleet_engine, upstream=3)
    log = _lull_log(records, 3, lead)
    alerts = _read(st, log, 0, len(log)) + st.flush().alerts
    assert _keys(alerts) == whole
    assert st.stats["late"] == 0 and st.stats["released"] == len(records)


@pytest.mark.parametrize("crash_at", [0.2, 0.5, 0.8])
def test_a_replayable_snapshot_leaves_the_buffer_to_a_replay_of_the_input(records, crash_at):
    log = _fleet_log(records, 3, 250, 7)
    whole = _read(FleetStage(_fleet_engine, upstream=3), log, 0, len(log))
    assert whole, "the recording makes model alerts"
    st = FleetStage(_fleet_engine, upstream=3)
    cut = int(len(log) * crash_at)
    alerts = _read(st, log, 0, cut)
    assert st.pending > 0 and st.resume_at() is not None and st.resume_at() < cut
    blob, resume = st.snapshot(replayable=True), st.resume_at()
    with_buffer = st.snapshot()
    assert len(blob) < len(with_buffer) - 1000 * 10, "the buffered records stay out"
    # A crash after the checkpoint: what the stage read since is read again, from the oldest
    # message it still held records of.
    alerts += _read(st, log, cut, min(len(log), cut + 20))
    again = FleetStage(_fleet_engine, upstream=3)
    again.restore(blob, records_decoder(again.engine().decode_fields))
    assert again.pending == 0
    alerts += _read(again, log, resume, len(log))
    assert _keys(alerts) == _keys(whole)
    assert again.stats["late"] == 0 and again.stats["replayed"] > 0
    assert again.stats["released"] + st.stats["released"] >= st.stats["fed"]


def test_records_without_a_position_ride_in_a_replayable_snapshot():
    # As after an upgrade: a stage restored from a checkpoint that carried its buffer holds
    # records it cannot read again; its next (replayable) checkpoint must keep them.
    make = lambda: Engine(row_checks=[], tick_checks=[], screened=True)  # noqa: E731
    st = FleetStage(make)
    st.feed([sample(t, "n1") for t in range(3)])            # no position
    st.feed([sample(t, "n1") for t in range(3, 6)], at=10)  # read again from offset 10
    st.position = 11
    again = FleetStage(make)
    again.restore(st.snapshot(replayable=True), records_decoder(again.engine().decode_fields))
    assert again.pending == 3 and again.resume_at() is None
    again.feed([sample(t, "n1") for t in range(3, 6)], at=10)
    again.flush()
    assert again.engine().stats["records.dcgm"] == 6


def test_a_fleet_checkpoint_with_pickled_model_state_is_refused_never_unpickled(tmp_path):
    import pickle

    import msgspec

    from pipeline.errors import StateError
    from pipeline.models.modelset import STATE_VERSION

    marker = tmp_path / "unpickled"

    class Mkdir:
        def __reduce__(self):
            return (__import__("os").mkdir, (str(marker),))
    st = FleetStage(_fleet_engine)
    st.feed([sample(t, "n1") for t in range(5)])
    st.flush()
    outer = msgspec.msgpack.decode(st.snapshot())
    eng = msgspec.msgpack.decode(outer["engines"]["fleet"])
    eng["models"] = msgspec.msgpack.encode({"version": STATE_VERSION,
                                            "cohort_names": msgspec.msgpack.Ext(2, pickle.dumps(Mkdir()))})
    outer["engines"]["fleet"] = msgspec.msgpack.encode(eng)
    again = FleetStage(_fleet_engine)
    with pytest.raises(StateError, match="pickled object"):
        again.restore(msgspec.msgpack.encode(outer), records_decoder(again.engine().decode_fields))
    assert not marker.exists()


# -- a host's rows through host-local models before the rest of the tick ----------------------


@pytest.fixture(scope="module")
def dcgm_models(tmp_path_factory) -> str:
    return dcgm_models_file(tmp_path_factory.mktemp("models"), RULES)


@pytest.fixture(scope="module")
def phased() -> list:
    # Hosts at their own phases of the second, with jitter, a skewed, a late and a joining host
    # and a fleet-wide power cap (the explain-away's cohort state): the release rule's worst case.
    sim = Simulator(hosts=6, duration=420, seed=5, scenario="mixed_fleet")
    values = [v for batch in sim.batches() if batch for _, v in per_host_messages(batch)]
    return list(Decoder().decode_many(values, [f"m{i}" for i in range(len(values))]).records)


def _stage_engine(models: str):
    det, diags = build_detector([RULES], models)
    assert isinstance(det, Topology), diags
    return det.make_fleet_engine


def _host_stage_log(records: list, models: str, upstream: int, step: int, seed: int) -> list[tuple]:
    """What ``upstream`` host-stage tasks, as the service runs them (a host's rows released as
    soon as it is complete for a tick), write to the fleet partition in a random interleaving:
    their forwarded records, then a mark with their hosts released ahead (``hosts_ahead``)."""
    tasks = []
    for _ in range(upstream):
        det, _ = build_detector([RULES], models)
        assert isinstance(det, Topology)
        remote = Topology(det.host, det.make_fleet_engine, local_fleet=False)
        remote.host.release_hosts = True
        tasks.append(remote)
    log: list[tuple] = []
    for i, chunk, _, _ in _interleaved(records, upstream, step, seed):
        log.append(("records", tasks[i].process(chunk).forwarded.joined(), i))
        log.append(("mark", i, tasks[i].released, False, tasks[i].hosts_ahead()))
    for i, t in enumerate(tasks):
        t.flush()
        log.append(("mark", i, t.released, True, {}))
    return log


def _read_early(st: FleetStage, log: list[tuple], start: int, stop: int, hosts: bool = True) -> tuple[list, int]:
    """``_read`` with each mark's hosts ahead (none: ``hosts`` false); also how many alerts
    came out before the marks had released their second (an alert's time at or past the
    stage's ``released`` when it came)."""
    alerts, early = [], 0
    for offset in range(start, stop):
        m = log[offset]
        if m[0] == "records":
            st.feed(m[1], at=offset, upstream=m[2])
        else:
            st.mark(m[1], m[2], final=m[3], hosts=m[4] if hosts else None)
        st.position = offset + 1
        got = st.advance().alerts
        early += sum(a.ts >= st.released for a in got)
        alerts += got
    return alerts, early


def _whole(log: list[tuple], make) -> tuple[list, FleetStage]:
    """The fleet stage's answer to the log's records released at once, tick by tick."""
    whole = FleetStage(make, upstream=3)
    for m in log:
        if m[0] == "records":
            whole.feed(m[1], upstream=m[2])
    return whole.flush().alerts, whole


def _sampled(interval: float) -> list:
    """``phased``'s fleet sampled every ``interval`` seconds, as long in samples, a host going
    silent for good two thirds of the way."""
    sim = Simulator(hosts=6, duration=420 * interval, interval=interval, seed=5, scenario="mixed_fleet")
    values = [v for batch in sim.batches() if batch for _, v in per_host_messages(batch)]
    recs = list(Decoder().decode_many(values, [f"m{i}" for i in range(len(values))]).records)
    gone = min(r.ts for r in recs) + 280 * interval
    return [r for r in recs if not (r.host == "gpu-node-003" and r.ts >= gone)]


@pytest.mark.parametrize("hosts", [True, False])
def test_host_local_models_score_a_hosts_rows_before_the_rest_of_the_tick_with_the_same_alerts(phased, dcgm_models,
                                                                                               hosts):
    # With the marks' hosts ahead, and without (a task marked past the tick: its hosts' rows go).
    log = _host_stage_log(phased, dcgm_models, 3, 211, 11)
    make = _stage_engine(dcgm_models)
    ref, whole = _whole(log, make)
    assert any(a.labels.get("source") == "model" for a in ref), "the recording makes model alerts"
    st = FleetStage(make, upstream=3)
    assert st.engine().host_local
    got, early = _read_early(st, log, 0, len(log), hosts=hosts)
    got += st.flush().alerts
    assert _keys(got) == _keys(ref)
    assert st.stats["early"] > 1000 and whole.stats["early"] == 0
    assert early > 0, "some alert came out before every task had marked past its second"
    # Every DCGM row reached the models once, early or with its tick.
    assert st.engine().stats["records.dcgm"] == whole.engine().stats["records.dcgm"]


@pytest.mark.parametrize("interval", [5.0, 30.0])
def test_early_rows_give_the_same_alerts_at_every_sampling_step(dcgm_models, interval):
    log = _host_stage_log(_sampled(interval), dcgm_models, 3, 97, int(interval))
    make = _stage_engine(dcgm_models)
    ref, whole = _whole(log, make)
    assert any(a.labels.get("source") == "model" for a in ref), "the recording makes model alerts"
    st = FleetStage(make, upstream=3)
    got, _ = _read_early(st, log, 0, len(log))
    got += st.flush().alerts
    assert _keys(got) == _keys(ref)
    assert st.stats["early"] > 0
    assert st.engine().stats["records.dcgm"] == whole.engine().stats["records.dcgm"]


def test_nccl_models_judge_rows_that_ran_early_once_the_tick_is_whole(phased):
    # An NCCL model's finding for a GPU comes from its communicator's ranks on other hosts, scored
    # with the tick's records: with the default models a host's rows still go early (the DCGM
    # models score them), and the NCCL models judge them when the tick's last rows have run.
    log = _host_stage_log(phased, "auto", 3, 211, 11)
    make = _stage_engine("auto")
    ref, whole = _whole(log, make)
    nccl = {"nccl_rank_straggler", "nccl_comm_busbw"}
    assert any(a.rule in nccl for a in ref), "the recording makes NCCL model alerts"
    st = FleetStage(make, upstream=3)
    assert st.engine().host_local
    got, early = _read_early(st, log, 0, len(log))
    got += st.flush().alerts
    assert _keys(got) == _keys(ref)
    assert st.stats["early"] > 1000 and early > 0
    assert st.engine().stats["records.dcgm"] == whole.engine().stats["records.dcgm"]


def test_a_rule_reading_an_nccl_models_score_keeps_the_tick_together(tmp_path):
    # A rule's score() of an NCCL model reads what the whole tick's records found: with one, no
    # host's rows go before the others'.
    rule = tmp_path / "straggling.yaml"
    rule.write_text(
        "rules:\n  - name: straggling\n    fault: nccl_straggling\n    severity: info\n"
        "    condition: score(nccl_rank_straggler) > 50\n"
    )
    det, diags = build_detector([RULES, str(rule)], "auto")
    assert det is not None and not [d for d in diags if d.severity == "error"], diags
    # (Rules that read a model's score run in the models' engine: one stage.)
    engine = det.make_fleet_engine() if isinstance(det, Topology) else det
    assert isinstance(engine, Engine) and engine.models is not None
    assert not engine.host_local
    plain, _ = build_detector([RULES], "auto")
    assert isinstance(plain, Topology) and plain.make_fleet_engine().host_local


@pytest.mark.parametrize("crash_at", [0.3, 0.7])
def test_a_restored_stage_drops_the_rows_it_ran_early_when_they_are_read_again(phased, dcgm_models, crash_at):
    log = _host_stage_log(phased, dcgm_models, 3, 173, 13)
    make = _stage_engine(dcgm_models)
    ref, whole = _whole(log, make)
    st = FleetStage(make, upstream=3)
    cut = int(len(log) * crash_at)
    alerts, _ = _read_early(st, log, 0, cut)
    assert st.stats["early"] > 0
    blob, resume = st.snapshot(replayable=True), st.resume_at()
    again = FleetStage(make, upstream=3)
    again.restore(blob, records_decoder(again.engine().decode_fields))
    more, _ = _read_early(again, log, resume, len(log))
    alerts += more + again.flush().alerts
    assert _keys(alerts) == _keys(ref)
    # What ran early before the checkpoint and was read again reached the models once (the
    # engine's counts ride in its snapshot).
    assert again.engine().stats["records.dcgm"] == whole.engine().stats["records.dcgm"]
    assert again.stats["late"] + again.stats["replayed"] > 0


PROBE_MODELS = """models:
  - name: probe_sbe_burst
    detector: counter_rate
    fault: hbm_sbe_rate_anomaly
    severity: info
    cohort: gpu_model
    features: [ecc_sbe_volatile]
    params: {warmup: 5}
    decider: {kind: threshold, threshold: 8, clear: 4}
    warmup: 5
    keep_firing_for: 5s
  - name: probe_straggler
    detector: nccl_straggler
    fault: nccl_straggler
    severity: info
    cohort: fleet
    decider: {kind: threshold, threshold: 10, clear: 5}
    warmup: 20
    keep_firing_for: 3s
"""


@pytest.fixture(scope="module")
def probe_models(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("probe") / "models.yaml"
    path.write_text(PROBE_MODELS)
    return str(path)


def _probe_fleet(slots: list[int], bursts: list[tuple], slow: list[tuple], gone: int | None) -> list:
    """70 s of four hosts of two GPUs, each host at its slot (of 20) of the second: single-bit ECC
    bursts (host, GPU, from) and spells of a rank finishing its collectives early (host, GPU,
    from, seconds) in one communicator of every GPU, reported by each rank with the interval's
    time; host 3 silent from ``gone`` on."""
    hit = {(h, g, t) for h, g, t in bursts}
    records: list = []
    for t in range(70):
        for h in range(4):
            if gone is not None and h == 3 and t >= gone:
                continue
            for g in range(2):
                count = sum(1000 for (bh, bg, bt) in hit if bh == h and bg == g and bt <= t)
                records.append(sample(t + slots[h] / 20, f"h{h}", g, ecc_sbe_volatile=count))
                slowed = any(sh == h and sg == g and st <= t < st + n for sh, sg, st, n in slow)
                records.append(
                    NcclRecord(ts=T0 + t + 0.5, host=f"h{h}", gpu=g, comm="c1", rank=2 * h + g, nranks=8,
                               coll="AllReduce", bytes=1 << 24,
                               exec_time_us=400.0 if slowed else 1000.0 + 10 * ((3 * h + g + t) % 4))
                )
    return records


def test_rows_awaiting_the_nccl_models_survive_a_restore(probe_models):
    # A checkpoint taken while rows that ran early still wait for the NCCL models' judgement
    # carries them: the restored stage judges them when their tick is whole.
    log = _host_stage_log(_probe_fleet([0, 7, 12, 18], [], [(0, 0, 21, 8), (2, 1, 40, 6)], None), probe_models, 2, 5, 3)
    make = _stage_engine(probe_models)
    ref, _ = _whole(log, make)
    assert {a.rule for a in ref} == {"probe_straggler"}
    crashes = 0
    for cut in range(len(log) // 4, len(log) * 3 // 4, 3):
        st = FleetStage(make, upstream=2)
        alerts, _ = _read_early(st, log, 0, cut)
        if not st.engine().awaiting_deferred:
            continue
        crashes += 1
        blob, resume = st.snapshot(replayable=True), st.resume_at()
        again = FleetStage(make, upstream=2)
        again.restore(blob, records_decoder(again.engine().decode_fields))
        more, _ = _read_early(again, log, resume, len(log))
        alerts += more + again.flush().alerts
        assert _keys(alerts) == _keys(ref), cut
    assert crashes > 5


@settings(max_examples=fuzz_examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slots=hs.lists(hs.integers(0, 19), min_size=4, max_size=4),
    upstream=hs.integers(1, 3),
    step=hs.integers(1, 40),
    seed=hs.integers(0, 2**16),
    bursts=hs.lists(hs.tuples(hs.integers(0, 3), hs.integers(0, 1), hs.integers(8, 60)), max_size=5),
    slow=hs.lists(hs.tuples(hs.integers(0, 3), hs.integers(0, 1), hs.integers(5, 60), hs.integers(1, 8)), max_size=3),
    gone=hs.one_of(hs.none(), hs.integers(15, 60)),
)
def test_property_rows_run_early_give_the_alerts_of_whole_ticks(probe_models, slots, upstream, step, seed, bursts,
                                                                slow, gone):
    # Four hosts of two GPUs sampling at their own phases (one of 20 slots of the second), single-
    # bit ECC bursts the DCGM probe model alerts on, spells of a rank finishing its collectives
    # early (the others wait for it) the NCCL one alerts on, judged with the whole tick's ranks;
    # host 3 going silent; any number of upstream tasks, any batching: the fleet stage's early
    # rows change no alert.
    records = _probe_fleet(slots, bursts, slow, gone)
    log = _host_stage_log(records, probe_models, upstream, step, seed)
    make = _stage_engine(probe_models)
    ref, whole = _whole(log, make)
    stage = FleetStage(make, upstream=upstream)
    got, _ = _read_early(stage, log, 0, len(log))
    got += stage.flush().alerts
    assert _keys(got) == _keys(ref)
    assert stage.engine().stats["records.dcgm"] == whole.engine().stats["records.dcgm"]
