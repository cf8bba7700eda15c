"""Adversarial checks of the hang detector (pipeline/hang.py): inputs an on-call operator would
call wrong answers for."""

from __future__ import annotations

import time

import msgspec

from pipeline.hang import HangDetector, Settings
from tests.factories import T0, progress


def _run(recs, upto=None, det=None):
    det = det or HangDetector(Settings())
    out = det.observe(sorted(recs, key=lambda r: r.ts))
    out += det.advance(upto if upto is not None else max(r.ts for r in recs) + 1)
    return det, out


def test_slow_but_progressing_job_with_a_momentary_skew_stays_quiet():
    # One collective every 3 minutes, every rank reports each second; rank 1's report at the
    # instant its peer completed the next collective shows it one behind for under a second.
    recs = []
    for t in range(0, 900):
        for r in range(2):
            done = t // 180 if not (r == 1 and t % 180 == 0 and t) else t // 180 - 1
            recs.append(progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=2, last_enqueued=done + 1,
                                 last_completed=done))  # fmt: skip
    _, out = _run(recs)
    assert [(a.state, a.summary) for a in out] == []


def test_a_stall_that_ends_before_the_deadline_does_not_fire_a_suspectless_alert():
    # Rank 1 sits one behind for 130 s, then catches up within settle: no rank stands out any more
    # and nobody timed out; the alert "no rank stands out" would be about nothing.
    recs = []
    for t in range(0, 400, 5):
        for r in range(2):
            done = 100 + t if t < 100 else (200 if 100 <= t < 240 else 100 + t)
            if r == 1 and 100 <= t < 240:
                done = 199
            recs.append(progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=2, last_enqueued=done + 1,
                                 last_completed=done))  # fmt: skip
    _, out = _run(recs)
    assert [a.state for a in out] == []


def test_a_stuck_rank_still_fires_and_names_it():
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=2, last_enqueued=201,
                     last_completed=199 if r == 1 and t >= 100 else min(100 + t, 200))
            for t in range(0, 400, 5) for r in range(2)]  # fmt: skip
    _, out = _run(recs)
    assert [(a.state, a.host, [s["rank"] for s in a.evidence["suspects"]]) for a in out] == [("firing", "n1", [1])]


def test_many_communicators_ending_at_different_times_is_not_quadratic():
    # 4,000 one-rank communicators, each reporting once, a second apart: each goes silent at its
    # own time, and forgetting each must not walk every other one.
    det = HangDetector(Settings(forget_after_s=60.0))
    recs = [progress(float(i), "n0", 0, comm=f"c{i}", last_enqueued=1, last_completed=0) for i in range(4000)]
    start = time.perf_counter()
    det.observe(recs)
    det.advance(T0 + 10_000)
    assert not det.comms
    assert time.perf_counter() - start < 2.0


def test_a_restore_mid_stall_keeps_the_outcome():
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=2, last_enqueued=201,
                     last_completed=199 if r == 1 and t >= 100 else min(100 + t, 200))
            for t in range(0, 400, 5) for r in range(2)]  # fmt: skip
    _, whole = _run(recs)
    det = HangDetector(Settings())
    out = det.observe(recs[:50])  # evidence taken, not settled
    again = HangDetector(Settings())
    again.load_state(det.to_state())
    out += again.observe(recs[50:]) + again.advance(recs[-1].ts + 1)
    assert [(a.state, a.ts) for a in out] == [(a.state, a.ts) for a in whole]


def test_a_rank_behind_that_goes_silent_is_reported():
    # Rank 1 (progress records only, no watchdog) stops at 199 and its reporter dies with it; its
    # peers sit at 200 forever: its own reports never come to be judged stuck, its peers' do.
    recs = [progress(float(t), "n0", 0, gpu=0, nranks=2, last_enqueued=201, last_completed=200)
            for t in range(0, 900, 5)]  # fmt: skip
    recs.append(progress(0.1, "n1", 1, gpu=1, nranks=2, last_enqueued=200, last_completed=199))
    _, out = _run(recs)
    assert [(a.state, a.host) for a in out] == [("firing", "n1")]
    # Evidence at the first peer report once rank 1 was behind for stuck_after (120 s after its
    # report at 0.1: the report at 125), then settle (30 s).
    assert out[0].ts == T0 + 155
    assert "last completed 199, peers 200, silent 150s" in out[0].summary


def _silent_rank_1(peer_done):
    """Rank 0 reports every 5 s for 900 s, completing ``peer_done(t)``; rank 1 reports once, at
    0.1 s, one behind rank 0's first report, and never again."""
    recs = [progress(float(t), "n0", 0, gpu=0, nranks=2, last_enqueued=peer_done(t) + 1, last_completed=peer_done(t))
            for t in range(0, 900, 5)]  # fmt: skip
    recs.append(progress(0.1, "n1", 1, gpu=1, nranks=2, last_enqueued=200, last_completed=199))
    return recs


def test_a_silent_rank_whose_peers_move_on_is_a_dead_reporter_not_a_hang():
    # The collectives complete, so rank 1 took part: only its reporter stopped.
    _, out = _run(_silent_rank_1(lambda t: 200 + t // 5))
    assert out == []


def test_a_silent_rank_whose_peers_move_on_before_the_deadline_does_not_fire():
    # The peers sit still for 125 s (evidence), then move on within settle.
    _, out = _run(_silent_rank_1(lambda t: 200 if t < 140 else 200 + t))
    assert out == []


def test_a_job_that_ends_with_one_rank_a_report_behind_stays_quiet():
    # Every rank stops reporting at the end; rank 1's last report came just before its last
    # completion. Nobody is left reporting a stall, so nothing shows a hang.
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=2, last_enqueued=t + 1,
                     last_completed=t - (1 if r == 1 and t == 295 else 0))
            for t in range(0, 300, 5) for r in range(2)]  # fmt: skip
    _, out = _run(recs, upto=T0 + 3000)
    assert out == []


def test_a_silent_rank_in_a_restored_detector_is_still_reported():
    recs = sorted(_silent_rank_1(lambda t: 200), key=lambda r: r.ts)
    _, whole = _run(recs)
    for cut in (1, 10, 24, 25, 26, 40):  # before, at and after the evidence (the report at 125)
        det = HangDetector(Settings())
        out = det.observe(recs[:cut])
        again = HangDetector(Settings())
        again.load_state(msgspec.json.decode(msgspec.json.encode(det.to_state())))
        out += again.observe(recs[cut:]) + again.advance(recs[-1].ts + 1)
        assert [(a.state, a.ts, a.summary) for a in out] == [(a.state, a.ts, a.summary) for a in whole], cut


def test_a_state_written_before_the_silence_watch_still_reports_a_silent_rank():
    recs = sorted(_silent_rank_1(lambda t: 200), key=lambda r: r.ts)
    det = HangDetector(Settings())
    det.observe(recs[:10])
    state = det.to_state()
    for c in state["comms"]:
        del c["top_since"], c["watch"]
    again = HangDetector(Settings())
    again.load_state(state)
    out = again.observe(recs[10:]) + again.advance(recs[-1].ts + 1)
    assert [(a.state, a.host) for a in out] == [("firing", "n1")]


def test_a_large_stalled_communicator_is_walked_rarely():
    # 20,000 ranks, one silent behind, the rest reporting level every 5 s: the walk over ranks
    # runs at a few reports, not at each one.
    n = 20_000
    det = HangDetector(Settings())
    recs = [progress(0.0, "h1", 1, nranks=n, last_enqueued=200, last_completed=199)]
    recs += [progress(float(t), f"h{r}", r, nranks=n, last_enqueued=201, last_completed=200)
             for t in range(0, 200, 5) for r in range(n) if r != 1]  # fmt: skip
    walks = []
    walk = det._stuck_silent
    det._stuck_silent = lambda c, now: walks.append(now) or walk(c, now)  # type: ignore[method-assign]
    out = det.observe(recs) + det.advance(recs[-1].ts + 1)
    assert [(a.state, a.host) for a in out] == [("firing", "h1")]
    assert len(walks) == 1
