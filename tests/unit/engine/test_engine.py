import random

import numpy as np
import pytest

from pipeline.engine import Engine, EngineConfig
from pipeline.engine.checks import builtin_checks
from tests.factories import T0, THROTTLED, fleet, sample


def run(records, engine=None, batch=None):
    eng = engine or Engine()
    alerts, dead = [], []
    step = batch or max(1, len(records))
    for i in range(0, len(records), step):
        out = eng.process(records[i:i + step])
        alerts += out.alerts
        dead += out.dead
    out = eng.flush()
    return alerts + out.alerts, dead + out.dead


def key(alerts):
    return sorted((a.id, a.state, a.rule, a.host, a.gpu, a.ts, a.started_at) for a in alerts)


def throttle_gpu1_of_n1(lo, hi):
    return lambda t, h, g: THROTTLED if (h, g) == ("n1", 1) and lo <= t < hi else {}


def test_thermal_fires_after_for_and_resolves():
    recs = fleet(range(120), overrides=throttle_gpu1_of_n1(30, 80))
    alerts, dead = run(recs)
    assert dead == []
    thermal = [a for a in alerts if a.fault == "thermal_throttling"]
    assert [(a.state, a.host, a.gpu, a.ts - T0, a.started_at - T0) for a in thermal] == [
        ("firing", "n1", 1, 40.0, 30.0), ("resolved", "n1", 1, 109.0, 30.0)]  # clear for keep_firing_for 30 s
    assert thermal[0].id == thermal[1].id
    assert thermal[0].evidence["gpu_temp"] == 90 and thermal[0].evidence["sm_clock"] == 1005
    assert "GPU 1 on n1" in thermal[0].summary


def test_condition_shorter_than_for_never_fires():
    alerts, _ = run(fleet(range(60), overrides=throttle_gpu1_of_n1(10, 18)))
    assert alerts == []


def test_idle_bit_alone_is_not_throttling():
    alerts, _ = run(fleet(range(60), overrides=lambda t, h, g: {"clocks_event_reasons": 0x1, "gpu_util": 0}))
    assert alerts == []


def test_same_alerts_whatever_the_batching_and_interleaving():
    recs = fleet(range(200), hosts=3, gpus=4, overrides=throttle_gpu1_of_n1(50, 150))
    golden = key(run(recs)[0])
    assert golden
    for size in (1, 7, 100):
        assert key(run(recs, batch=size)[0]) == golden
    # Hosts arrive interleaved and lagging by up to 25 s (each host's own records in order),
    # within the allowed lateness: the result must not change.
    rng = random.Random(3)
    lag = {"n0": 0.0, "n1": 25.0, "n2": 9.0}
    mixed = sorted(recs, key=lambda r: r.ts + lag[r.host])  # stable: each host keeps its order
    alerts, dead = run(mixed, batch=16)
    assert dead == [] and key(alerts) == golden
    # A random shuffle inside every 16-record batch changes nothing either.
    shuffled = []
    for i in range(0, len(mixed), 16):
        chunk = mixed[i:i + 16]
        rng.shuffle(chunk)
        shuffled += chunk
    assert key(run(shuffled, batch=16)[0]) == golden


def test_a_host_that_starts_late_within_the_lateness_is_waited_for():
    recs = [sample(t, "early") for t in range(40)]
    late_starter = [sample(t, "late", **(THROTTLED if t >= 2 else {})) for t in range(40)]
    alerts, dead = run(recs[:20] + late_starter + recs[20:], batch=5)
    assert dead == []
    assert [(a.host, a.ts - T0) for a in alerts if a.state == "firing"] == [("late", 12.0)]


def test_record_older_than_the_watermark_is_dead_lettered_as_late():
    eng = Engine(EngineConfig(allowed_lateness=10))
    eng.process([sample(t, "n0") for t in range(100)])
    out = eng.process([sample(5, "n0", gpu=1)])
    assert [d.reason for d in out.dead] == ["late"]
    assert out.dead[0].host == "n0" and "behind the watermark" in out.dead[0].detail


def test_host_beyond_allowed_lateness_no_longer_holds_the_watermark():
    eng = Engine(EngineConfig(allowed_lateness=30))
    eng.process([sample(t, "fast") for t in range(100)] + [sample(t, "slow") for t in range(50)])
    assert eng.watermark() == pytest.approx(T0 + 99)
    eng2 = Engine(EngineConfig(allowed_lateness=30))
    eng2.process([sample(t, "fast") for t in range(100)] + [sample(t, "slow") for t in range(80)])
    assert eng2.watermark() == pytest.approx(T0 + 79)   # slow host 20 s behind: waited for


def test_counter_reset_is_not_an_increase_but_real_replays_are():
    def replays(t, h, g):
        if (h, g) != ("n0", 0):
            return {}
        if t < 40:
            return {"nvlink_replay_errors": 1000 + t // 10}      # +1 at t=10, 20, 30
        if t < 60:
            return {"nvlink_replay_errors": 0}                  # driver reload: reset to 0
        return {"nvlink_replay_errors": 0 if t < 100 else 3}    # a real increase at t=100
    alerts, _ = run(fleet(range(120), hosts=1, gpus=1, overrides=replays))
    fired = [a.ts - T0 for a in alerts if a.state == "firing" and a.fault == "nvlink_replay_errors"]
    assert fired == [10.0, 100.0]  # keep_firing_for 60 s merges 10/20/30; the reset at 40 is silent


@pytest.mark.parametrize("every", [5, 10, 30])
def test_slow_sampling_fires_each_alert_once(every):
    # Hosts sampling every `every` s, out of step with each other: most ticks hold rows of one
    # host only. The throttled GPU is the last registered one of 16 (the state arrays' last
    # slot); its alert fires once, held for `for:` (10 s), and resolves once.
    def rec(t, h, g):
        if (t + (0 if h == "n0" else 3)) % every:
            return None
        return THROTTLED if (h, g) == ("n1", 7) and 60 <= t < 300 else {}
    alerts, dead = run(fleet(range(420), gpus=8, overrides=rec), batch=37)
    assert dead == []
    thermal = [(a.state, a.ts - T0, a.started_at - T0) for a in alerts if a.fault == "thermal_throttling"]
    first = next(t for t in range(60, 300) if (t + 3) % every == 0)
    assert [s for s, *_ in thermal] == ["firing", "resolved"] and thermal[0][2] == first
    assert thermal[0][1] == next(t for t in range(first + 10, 300) if (t + 3) % every == 0)
    assert {a.fault for a in alerts} == {"thermal_throttling"}


def test_gpu_lost_while_host_reports_and_recovers():
    gone = lambda t, h, g: None if (h, g) == ("n1", 1) and 50 <= t < 150 else {}  # noqa: E731
    alerts, _ = run(fleet(range(240), overrides=gone))
    lost = [(a.state, a.host, a.gpu, a.ts - T0) for a in alerts if a.fault == "gpu_lost"]
    # last seen at 49; absent > 30 s is judged on the 1 s tick grid: 80 is the first tick past 79
    # and recovery on the first tick after it reports again
    assert lost == [("firing", "n1", 1, 80.0), ("resolved", "n1", 1, 151.0)]


def test_silent_host_is_a_telemetry_gap_not_lost_gpus():
    silent = lambda t, h, g: None if h == "n1" and 50 <= t < 200 else {}  # noqa: E731
    alerts, dead = run(fleet(range(300), overrides=silent))
    assert {a.fault for a in alerts} == {"telemetry_gap"}
    gap = [(a.state, a.host, a.ts - T0) for a in alerts]
    assert gap == [("firing", "n1", 110.0), ("resolved", "n1", 201.0)]  # last seen at 49; > 60 s
    assert dead == []


def test_snapshot_restore_continues_exactly():
    recs = fleet(range(200), hosts=2, gpus=2, overrides=throttle_gpu1_of_n1(60, 150))
    golden = key(run(recs)[0])
    eng = Engine()
    first = eng.process(recs[:300]).alerts
    blob = eng.snapshot()
    eng2 = Engine()
    eng2.restore(blob)
    rest = eng2.process(recs[300:]).alerts + eng2.flush().alerts
    assert key(first + rest) == golden
    assert eng2.entities.gpus == eng.entities.gpus


def test_snapshot_holds_buffered_rows_as_columns_and_still_reads_version_1():
    import msgspec

    recs = fleet(range(200), hosts=2, gpus=2, overrides=throttle_gpu1_of_n1(60, 150))
    golden = key(run(recs)[0])
    eng = Engine()
    first = eng.process(recs[:300]).alerts
    assert eng.pending > 0   # the start-up hold: some of what it has seen is still buffered
    data = msgspec.msgpack.decode(eng.snapshot())
    assert data["version"] == 2 and "pending" not in data
    # The same state as version 1 wrote it: buffered records as JSON, with their origins.
    released = eng.released
    buffered = [r for r in recs[:300] if r.ts >= released]
    assert len(buffered) == eng.pending
    v1 = {**{k: v for k, v in data.items() if k != "pending_columns"}, "version": 1,
          "pending": [msgspec.json.encode(r) for r in buffered], "pending_origin": ["o"] * len(buffered)}
    for blob in (eng.snapshot(), msgspec.msgpack.encode(v1)):
        eng2 = Engine()
        eng2.restore(blob)
        rest = eng2.process(recs[300:]).alerts + eng2.flush().alerts
        assert key(first + rest) == golden


def test_restore_rejects_garbage():
    from pipeline.errors import StateError
    with pytest.raises(StateError):
        Engine().restore(b"\x93not a snapshot")


def test_per_gpu_state_is_small():
    eng = Engine()
    run(fleet(range(10), hosts=64, gpus=8), engine=eng)
    assert eng.state.nbytes_per_gpu() <= 4096


def test_duplicate_check_names_rejected():
    rows, ticks = builtin_checks()
    with pytest.raises(ValueError):
        Engine(row_checks=rows + rows[:1], tick_checks=ticks)


def test_nccl_records_flow_through_in_event_time():
    from pipeline.schema import NcclRecord
    eng = Engine()
    n = NcclRecord(ts=T0 + 1, host="n0", gpu=0, comm="0x1", rank=0, nranks=8, coll="AllReduce", bytes=1 << 30,
                   exec_time_us=4000.0, busbw_gbs=460.0)
    eng.process([n, sample(0, "n0"), sample(2, "n0")])
    eng.flush()
    assert eng.stats["records.nccl"] == 1 and eng.stats["records.dcgm"] == 2
    assert np.isfinite(eng.state.last_ts[0])


def test_live_consumer_draining_partitions_unevenly_loses_nothing():
    # A consumer catching up on a backlog reads one partition far ahead of another. Hosts whose
    # records keep arriving (wall clock) hold the watermark; nothing is late, alerts unchanged.
    recs = fleet(range(300), hosts=2, gpus=2, overrides=throttle_gpu1_of_n1(100, 200))
    golden = key(run(recs)[0])
    eng = Engine(EngineConfig(allowed_lateness=30, idle_timeout=10))
    n0 = [r for r in recs if r.host == "n0"]
    n1 = [r for r in recs if r.host == "n1"]
    alerts, dead = [], []
    wall = 0.0
    for i in range(0, 600, 100):          # n0 races 200 s ahead of n1, n1 keeps trickling in
        for part in (n0[2 * i:2 * i + 200], n1[i:i + 100]):
            wall += 1.0
            out = eng.process(part, now=wall)
            alerts += out.alerts
            dead += out.dead
    out = eng.process(n1[600:], now=wall + 1)
    alerts += out.alerts + eng.flush().alerts
    assert dead == [] and key(alerts) == golden


def test_host_silent_on_the_wall_clock_stops_holding_the_watermark():
    eng = Engine(EngineConfig(allowed_lateness=30, idle_timeout=10))
    eng.process([sample(t, "a") for t in range(10)] + [sample(t, "b") for t in range(10)], now=0.0)
    eng.process([sample(t, "a") for t in range(10, 100)], now=50.0)   # b silent for 50 s of wall time
    assert eng.watermark(now=50.0) == pytest.approx(T0 + 99)


def test_rows_already_in_time_order_are_recognised_exactly_when_a_sort_would_keep_them():
    # The release skips its sort when rows are in (ts, GPU) order already; it must say so
    # exactly when a stable lexsort would leave them as they are (ties included).
    from pipeline.engine.pending import in_time_order as _in_time_order

    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(400):
        n = int(rng.integers(0, 7))
        ts = T0 + rng.integers(0, 3, n).astype(float)
        gpu = rng.integers(0, 3, n).astype(np.int32)
        if rng.random() < 0.5:   # often sorted, to hit both answers
            order = np.lexsort((gpu, ts))
            ts, gpu = ts[order], gpu[order]
        want = bool((np.lexsort((gpu, ts)) == np.arange(n)).all())
        assert _in_time_order(ts, gpu) == want, (ts, gpu)
        seen.add(want)
    assert seen == {True, False}
