"""Collective-progress records in the engine and the two stages: accepted, counted and
forwarded, never a crash, and no GPU alert changes for them (docs/architecture.md §3); only the
fleet stage's hang detector reads them (tests/unit/hang)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.decode import Decoder
from pipeline.detection import build_detector
from pipeline.engine import Engine
from pipeline.canonical import canonical_order
from pipeline.fleetstage import records_decoder
from pipeline.topology import Topology
from pipeline.schema import encode
from tests.factories import THROTTLED, fleet, progress, run_batched

RULES = str(Path(__file__).resolve().parents[3] / "rules")


def _throttled_fleet() -> list:
    # n1's GPU 0 throttles from second 30: one thermal alert, the rest stays quiet.
    return fleet(range(90), overrides=lambda t, h, g: THROTTLED if (h, g, t >= 30) == ("n1", 0, True) else {})


def _with_progress(recs: list) -> list:
    extra = [progress(t + 0.5, f"n{h}", h, nranks=2, last_enqueued=t, last_completed=t - 1)
             for t in range(0, 90, 5) for h in range(2)]
    extra.append(progress(60.5, "n1", 1, nranks=2, state="timeout", seq=12, op="ALLREDUCE", timeout_ms=600000))
    return sorted(recs + extra, key=lambda r: r.ts)


def _alerts(out) -> list[tuple]:
    return [(a.state, a.rule, a.host, a.gpu, a.ts) for a in out.alerts]


def test_an_engine_counts_progress_records_and_alerts_as_without_them():
    base = _throttled_fleet()
    plain = run_batched(base, 37, Engine())
    mixed_engine = Engine()
    mixed = run_batched(_with_progress(base), 37, mixed_engine)
    assert _alerts(plain) and _alerts(mixed) == _alerts(plain)
    assert not mixed.dead
    assert mixed_engine.stats["records.progress"] == 37
    assert mixed_engine.stats["records.dcgm"] == len(base)


def _decoded(recs: list) -> list:
    """``recs`` as the decoder gives them: its checked types are subclasses of the schema's."""
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
    assert not out.dead
    return out.records


def test_decoded_records_go_through_the_engine_and_the_two_stages():
    base = _throttled_fleet()
    recs = _decoded(_with_progress(base))
    assert type(recs[0]) is not type(base[0])  # the decoder's own types
    eng = Engine()
    run_batched(recs, 37, eng)
    assert eng.stats["records.progress"] == 37
    det, _ = build_detector([RULES], "auto")
    out = run_batched(recs, 50, det)
    assert det.fleet.engine().stats["records.progress"] == 37 and not out.dead


def test_a_batch_of_progress_records_alone_is_accepted():
    eng = Engine()
    out = eng.process([progress(1.0, "n1", 0), progress(1.0, "n2", 1)])
    out.extend(eng.flush())
    assert not out.dead and not out.alerts and eng.stats["records.progress"] == 2


def test_a_late_progress_record_is_a_dead_letter_like_any_other():
    eng = Engine()
    run_batched(fleet(range(60)), 100, eng)
    out = eng.process([progress(1.0, "n0", 0)])
    assert [d.reason for d in out.dead] == ["late"]


def test_the_two_stages_forward_them_and_alert_as_without_them():
    base = _throttled_fleet()
    det, _ = build_detector([RULES], "auto")
    assert isinstance(det, Topology)
    plain = run_batched(base, 50, det)
    det2, _ = build_detector([RULES], "auto")
    mixed = run_batched(_with_progress(base), 50, det2)
    gpu_alerts = [a for a in _alerts(mixed) if a[1] != "hang_collective"]
    assert gpu_alerts == _alerts(plain)
    # The one timeout among the reports is the fleet stage's hang detector's (pipeline/hang.py).
    assert [a[1] for a in _alerts(mixed) if a not in gpu_alerts] == ["hang_collective"]
    assert det2.fleet.engine().stats["records.progress"] == 37


def test_a_snapshot_with_progress_records_buffered_restores():
    det, _ = build_detector([RULES], "auto")
    det.process(_with_progress(fleet(range(20))))
    assert det.fleet.pending  # the fleet stage holds progress records past the last DCGM second
    again, _ = build_detector([RULES], "auto")
    again.restore(det.snapshot())
    out = again.flush()
    assert not out.dead
    assert again.fleet.engine().stats["records.progress"] == 37


def test_canonical_order_places_progress_after_nccl_and_drops_a_duplicate():
    a, b = progress(1.0, "n1", 0), progress(1.0, "n1", 1)
    recs = [b, a, a]
    order, dup = canonical_order(recs, np.array([r.ts for r in recs]))
    assert [recs[i].rank for i in order] == [0, 1] and dup == 1


def test_the_fleet_topic_decoder_reads_them_back():
    recs = [progress(1.0, "n1", 0, last_completed=-1), fleet([1.0], 1, 1)[0]]
    blob = b"[" + b",".join(encode(r) for r in recs) + b"]"
    back = records_decoder(())(blob)
    assert [type(r).__name__ for r in back][0] == "ProgressRecord" and back[0].last_completed == -1
