"""A second "break it" round on the hang detector (pipeline/hang.py), chiefly its rule for a rank
that stops reporting while behind: inputs an on-call operator would call wrong answers for."""

from __future__ import annotations

from pipeline.hang import HangDetector, Settings
from tests.factories import T0, progress


def _run(recs, upto=None, config=None):
    det = HangDetector(config or Settings())
    recs = sorted(recs, key=lambda r: r.ts)
    out = det.observe(recs) + det.advance(upto if upto is not None else recs[-1].ts + 1)
    return det, out


def _stalled_peer(until=900):
    """Rank 0 reports every 5 s, stuck at 200 with 201 enqueued (waiting on its peer)."""
    return [progress(float(t), "n0", 0, gpu=0, nranks=2, last_enqueued=201, last_completed=200)
            for t in range(0, until, 5)]  # fmt: skip


# -- a silent rank whose one report came late ---------------------------------------------------


def test_a_rank_first_reporting_behind_after_its_peers_stalled_then_silent_is_reported():
    # As test_hang_break's silent rank, but its one report comes at 130 s, after a walk of the
    # stalled communicator found nobody behind: that walk must not stop later ones.
    recs = _stalled_peer() + [progress(130.1, "n1", 1, gpu=1, nranks=2, last_enqueued=200, last_completed=199)]
    _, out = _run(recs)
    assert [(a.state, a.host) for a in out] == [("firing", "n1")]
    assert out[0].ts == T0 + 255 + 30  # the first peer report 120 s after its own, then settle


def test_a_rank_whose_progress_first_shows_late_and_behind_then_silent_is_reported():
    # Its first reports say no completed work (a layout without the numbers), the last one does.
    recs = _stalled_peer()
    recs += [progress(float(t) + 0.1, "n1", 1, gpu=1, nranks=2, state="progress") for t in range(0, 130, 5)]
    recs.append(progress(130.1, "n1", 1, gpu=1, nranks=2, last_enqueued=200, last_completed=199))
    _, out = _run(recs)
    assert [(a.state, a.host) for a in out] == [("firing", "n1")]


# -- a job ending rank by rank ------------------------------------------------------------------


def test_a_job_ending_rank_by_rank_with_one_rank_reporting_on_idle_stays_quiet():
    # Ranks 1-3 exit after their last report (at 295, a report behind); rank 0 completed the last
    # work (300 of 300 enqueued) and its watchdog reports on for minutes: nothing waits on anyone.
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=4, last_enqueued=t,
                     last_completed=t - (1 if r and t == 295 else 0))
            for t in range(0, 300, 5) for r in range(4)]  # fmt: skip
    recs += [progress(float(t), "n0", 0, gpu=0, nranks=4, last_enqueued=300, last_completed=300)
             for t in range(300, 900, 5)]  # fmt: skip
    _, out = _run(recs)
    assert out == []


def test_a_silent_rank_behind_peers_waiting_on_work_still_fires_when_the_ranks_at_the_top_wait():
    # The same end, but rank 0 enqueued work it cannot complete: it waits on the others.
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=4, last_enqueued=t,
                     last_completed=t - (1 if r and t == 295 else 0))
            for t in range(0, 300, 5) for r in range(4)]  # fmt: skip
    recs += [progress(float(t), "n0", 0, gpu=0, nranks=4, last_enqueued=301, last_completed=300)
             for t in range(300, 900, 5)]  # fmt: skip
    _, out = _run(recs)
    assert [(a.state, [s["rank"] for s in a.evidence["suspects"]]) for a in out] == [("firing", [1, 2, 3])]


# -- a job requeued onto other hosts ------------------------------------------------------------


def test_a_job_requeued_onto_other_hosts_loading_its_checkpoint_does_not_fire():
    # Slurm requeues the job (same job id, process groups numbered as before) onto other nodes:
    # no rank's fall is from its own host, so no restart is seen, and the first run's highest
    # work stayed the communicator's top; the new run's ranks, level with each other, were all
    # judged behind it and fired "no rank stands out".
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=4, last_enqueued=t, last_completed=t - 1)
            for t in range(0, 600, 10) for r in range(4)]  # fmt: skip
    recs += [progress(float(t) + 0.1 * r, f"m{r}", r, gpu=r, nranks=4, last_enqueued=-1, last_completed=-1)
             for t in range(700, 900, 10) for r in range(4)]  # fmt: skip
    recs += [progress(float(t) + 0.1 * r, f"m{r}", r, gpu=r, nranks=4, last_enqueued=t - 900, last_completed=t - 901)
             for t in range(900, 1200, 10) for r in range(4)]  # fmt: skip
    _, out = _run(recs)
    assert out == []


def test_a_job_requeued_onto_other_hosts_that_hangs_names_the_rank_behind():
    recs = [progress(float(t) + 0.1 * r, f"n{r}", r, gpu=r, nranks=4, last_enqueued=t, last_completed=t - 1)
            for t in range(0, 600, 10) for r in range(4)]  # fmt: skip
    recs += [progress(float(t) + 0.1 * r, f"m{r}", r, gpu=r, nranks=4, last_enqueued=51,
                      last_completed=49 if r == 2 else 50) for t in range(700, 1000, 10) for r in range(4)]  # fmt: skip
    _, out = _run(recs)
    assert [(a.state, a.host, [s["rank"] for s in a.evidence["suspects"]]) for a in out] == [("firing", "m2", [2])]


# -- many communicators of one job --------------------------------------------------------------


def test_many_communicators_of_one_job_each_naming_its_own_suspect_settle_in_linear_work():
    # A fabric fault hangs a 2,000-host job's TP groups, each naming a rank on its own host: each
    # alert that fires must not look at every other communicator (nor each settle every alert).
    m = 2000
    recs = [progress(100.0 + 0.001 * r, f"h{c}", r, gpu=r, comm=f"c{c}", state="timeout", seq=5,
                     last_enqueued=5, last_completed=4 if r else 3) for r in range(4) for c in range(m)]  # fmt: skip
    det = HangDetector(Settings(max_communicators=m))
    det.observe(sorted(recs, key=lambda r: r.ts))
    calls = []
    judge = det.suspects
    det.suspects = lambda c: calls.append(c) or judge(c)  # type: ignore[method-assign]
    fired = det.advance(T0 + 1000)
    assert len(fired) == m and len({a.id for a in fired}) == m
    assert len(calls) <= 2 * m


def test_a_communicator_of_one_job_still_joins_the_alert_naming_its_suspect():
    # The index behind the test above still finds the alert: the DP group of the same rank joins.
    recs = [progress(100.0 + 0.1 * r, f"h{r}", r, gpu=0, comm="tp", state="timeout", seq=5, last_enqueued=5,
                     last_completed=3 if r == 1 else 4) for r in range(4)]  # fmt: skip
    recs += [progress(150.0 + 0.1 * r, f"h{r}", r, gpu=0, comm="dp", state="timeout", seq=9, last_enqueued=9,
                      last_completed=7 if r == 1 else 8) for r in range(4)]  # fmt: skip
    recs += [progress(150.0 + 0.1 * r, f"g{r}", r, gpu=0, comm="other", state="timeout", seq=9, last_enqueued=9,
                      last_completed=7 if r == 1 else 8) for r in range(4)]  # fmt: skip
    det, out = _run(recs, upto=T0 + 400)
    assert [(a.state, a.host) for a in out] == [("firing", "h1"), ("firing", "g1")]
    assert det.stats["joined"] == 1


# -- many jobs' deadlines at their own times ----------------------------------------------------


class _CountingDict(dict):
    """A dict that counts the entries its walks (``items``, ``values``) go over."""

    walked = 0

    def items(self):  # type: ignore[override]
        _CountingDict.walked += len(self)
        return super().items()

    def values(self):  # type: ignore[override]
        _CountingDict.walked += len(self)
        return super().values()


def test_many_jobs_hanging_a_moment_apart_settle_in_linear_work():
    # Each record's advance settles one job: it must not walk every other job's communicator.
    n = 2000
    recs = [progress(100.0 + 0.05 * j + 0.001 * r, f"n{j}-{r}", r, gpu=r, job=f"job{j}", state="timeout", seq=5,
                     last_enqueued=5, last_completed=4 if r else 3) for r in range(4) for j in range(n)]  # fmt: skip
    det = HangDetector(Settings(max_communicators=n))
    det.comms = _CountingDict()
    _CountingDict.walked = 0
    out = det.observe(sorted(recs, key=lambda r: r.ts)) + det.advance(T0 + 1000)
    assert len(out) == n and len(det.comms) == n
    assert _CountingDict.walked <= 20 * n


# -- an alert on a silent rank ------------------------------------------------------------------


def test_an_alert_on_a_silent_rank_resolves_once_its_peers_complete_work_past_the_stall():
    # Rank 1's reporter died at 0.1; its peer sat at 200 for 300 s (a long barrier), then completed
    # work on and on: that needed rank 1 (the rule's own premise), so the hang is over; it stayed
    # firing for as long as the job ran, rank 1 never to report again.
    _, out = _run(_stalled_peer(300) + [
        progress(0.1, "n1", 1, gpu=1, nranks=2, last_enqueued=200, last_completed=199),
        *(progress(float(t), "n0", 0, gpu=0, nranks=2, last_enqueued=t, last_completed=t - 1)
          for t in range(300, 3000, 5)),
    ])  # fmt: skip
    assert [(a.state, a.host, a.ts) for a in out] == [("firing", "n1", T0 + 155), ("resolved", "n1", T0 + 300)]
    assert out[1].evidence["resolved_by"] == "progress resumed"


def test_an_alert_on_a_silent_rank_stays_while_its_peers_only_catch_up_to_the_stall():
    # Reports at the work they had reached when it fired show nothing past the stall.
    _, out = _run(_stalled_peer(3000) + [progress(0.1, "n1", 1, gpu=1, nranks=2, last_enqueued=200,
                                                  last_completed=199)])  # fmt: skip
    assert [(a.state, a.host) for a in out] == [("firing", "n1")]
