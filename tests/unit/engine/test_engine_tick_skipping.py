"""Tick skipping (issue 17): a tick with nothing due is not walked, with the alerts of the walk.

Each case runs one engine that skips and one that walks every tick of the grid (``_skip_ahead``
switched off) over the same stream, and compares the alert streams event by event; and checks
that the skipping engine walked far fewer ticks where samples are sparse.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from pipeline.bus.files import FileSink
from pipeline.detection import build_engine
from pipeline.engine import Engine
from pipeline.engine.checks import GpuLost, HwThermalSlowdown, NvlinkReplayIncrease, TelemetryGap
from pipeline.replay import replay
from pipeline.schema import AlertEvent
from producers.sim import Simulator
from tests.factories import T0, THROTTLED, sample

ROOT = Path(__file__).resolve().parents[3]


def _key(a: AlertEvent) -> tuple:
    return (a.id, a.state, a.rule, a.host, a.gpu, a.ts, a.started_at)


def _walking(eng: Engine) -> Engine:
    eng._skip_ahead = lambda limit: None  # type: ignore[method-assign]
    return eng


def _counted(eng: Engine) -> list[int]:
    ticks = [0]
    real = eng._tick

    def tick(t: float, out: object) -> None:
        ticks[0] += 1
        real(t, out)

    eng._tick = tick  # type: ignore[method-assign]
    return ticks


def _feed(eng: Engine, records: list, batch: int) -> list[tuple]:
    alerts = []
    for i in range(0, len(records), batch):
        alerts += eng.process(records[i:i + batch]).alerts
    alerts += eng.flush().alerts
    return [_key(a) for a in alerts]


# -- simulated fleets through the default rule packs and models -------------------------------

def _recording(tmp: Path, scenario: str, interval: float, duration: float, hosts: int = 3) -> Path:
    path = tmp / f"{scenario}-{interval}.jsonl"
    enc = msgspec.json.Encoder()
    sim = Simulator(hosts=hosts, gpus_per_host=4, duration=duration, interval=interval, seed=3, scenario=scenario)
    with FileSink(path, atomic=True) as sink:
        for batch in sim.batches():
            sink.write_many(enc.encode(r) for r in batch)
    return path


def _replayed(path: Path, walk: bool) -> tuple[list[tuple], int]:
    eng, diags = build_engine([str(ROOT / "rules")], "auto")
    assert eng is not None and eng.models is not None, diags
    if walk:
        _walking(eng)
    ticks = _counted(eng)
    alerts: list[tuple] = []
    replay([path], engine=eng, batch_size=500, on_batch=lambda n, out: alerts.extend(map(_key, out.alerts)))
    return alerts, ticks[0]


@pytest.mark.parametrize(("scenario", "interval", "duration"), [
    ("gpu_lost", 1, 300), ("telemetry_gap", 5, 1800), ("mixed", 10, 3600), ("telemetry_gap", 30, 7200),
    ("gpu_lost", 30, 5400)])
def test_default_packs_and_models_give_the_alerts_of_the_walk(tmp_path: Path, scenario: str, interval: float,
                                                              duration: float) -> None:
    path = _recording(tmp_path, scenario, interval, duration)
    skipped, n_skip = _replayed(path, walk=False)
    walked, n_walk = _replayed(path, walk=True)
    assert skipped == walked
    assert {a[2] for a in walked} & {"builtin_gpu_lost", "builtin_telemetry_gap"} or scenario == "mixed"
    assert n_walk >= duration - interval - 2
    if interval >= 5:
        # Absence ticks around the deadlines are walked; the quiet ones between samples are not.
        assert n_skip < n_walk / 2


# -- hand-made streams: silences, returns, lost GPUs, lifecycle holds on the tick checks -------

def _sparse(interval: float, seconds: int, hosts: int = 3, gpus: int = 2) -> list:
    """Every ``interval`` s with a per-host phase; n1 goes silent for 200 s, GPU 1 of n2 is lost
    for good at 900 s, n0/0 throttles for a while; a host joins late."""
    out = []
    for k in range(int(seconds / interval)):
        for h in range(hosts):
            t = k * interval + 0.37 * h
            if h == 1 and 400 <= t < 600:
                continue
            for g in range(gpus):
                if h == 2 and g == 1 and t >= 900:
                    continue
                fields = THROTTLED if (h, g) == (0, 0) and 300 <= t < 500 else {}
                out.append(sample(t, f"n{h}", g, **fields))
        if k * interval >= 700:
            out.append(sample(k * interval + 0.5, "late-joiner", 0))
    out.sort(key=lambda r: r.ts)
    return out


class _HeldGap(TelemetryGap):
    meta = replace(TelemetryGap.meta, name="held_gap", for_s=13.0, keep_firing_for_s=21.0)


class _HeldLost(GpuLost):
    meta = replace(GpuLost.meta, name="held_lost", for_s=7.0, keep_firing_for_s=45.0)


class _Opaque(TelemetryGap):
    """A tick check that cannot say when its condition changes: walked until all is settled."""

    meta = replace(TelemetryGap.meta, name="opaque_gap", for_s=3.0)
    changes = None


def _engines(tick_checks: list) -> tuple[Engine, Engine]:
    def make() -> Engine:
        return Engine(row_checks=[HwThermalSlowdown(), NvlinkReplayIncrease()], tick_checks=list(tick_checks))
    return make(), _walking(make())


@pytest.mark.parametrize("interval", [1, 5, 10, 30])
@pytest.mark.parametrize("checks", ["builtin", "held", "opaque"])
def test_sparse_streams_with_silences_give_the_alerts_of_the_walk(interval: int, checks: str) -> None:
    ticks = {"builtin": [GpuLost(), TelemetryGap()], "held": [GpuLost(), TelemetryGap(), _HeldGap(), _HeldLost()],
             "opaque": [GpuLost(), _Opaque()]}[checks]
    records = _sparse(interval, 1800)
    for batch in (37, 100_000):
        skip, walk = _engines(ticks)
        n = _counted(skip)
        a, b = _feed(skip, records, batch), _feed(walk, records, batch)
        assert a == b
        rules = {x[2] for x in b if x[1] == "firing"}
        assert {"builtin_gpu_lost", "builtin_hw_thermal_slowdown"} <= rules
        if checks == "opaque":
            assert n[0] >= 1800 - interval - 2   # sparse samples never settle: every tick walked
        elif interval >= 5:
            assert n[0] < 1800 / 2
        if checks == "held":
            assert {"held_gap", "held_lost"} <= rules
            # keep_firing_for: the held gap resolves 21 s after n1 is back, not at its return.
            back = min(r.ts for r in records if r.host == "n1" and r.ts > T0 + 600)
            resolved = [x for x in b if x[2] == "held_gap" and x[1] == "resolved" and x[3] == "n1"]
            assert resolved and resolved[0][5] - back >= 21 - interval


@pytest.mark.slow
def test_a_two_day_pause_costs_a_handful_of_ticks_and_keeps_the_walks_alerts() -> None:
    gap = 2 * 86400.0
    records = [sample(t + (gap if t >= 200 else 0), f"n{h}", g) for t in range(0, 400, 10)
               for h in range(2) for g in range(2)]
    skip, walk = _engines([GpuLost(), TelemetryGap(), _HeldGap()])
    n = _counted(skip)
    a = _feed(skip, records, 1000)
    assert n[0] < 300
    assert a == _feed(walk, records, 1000)
    assert {x[2] for x in a if x[1] == "firing"} == {"builtin_telemetry_gap", "held_gap"}


def test_densely_sampled_ticks_are_all_walked() -> None:
    # At 1 Hz every tick has rows: nothing to skip, and nothing is.
    records = [sample(t, "n1", 0) for t in range(120)]
    eng = Engine()
    n = _counted(eng)
    _feed(eng, records, 1000)
    assert n[0] >= 118 and math.isfinite(eng.next_tick)
