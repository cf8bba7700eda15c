"""A review of the hang detector (pipeline/hang.py): a communicator id used again by a restarted
job, a second hang in one communicator, RAS's unnamed ranks, hostile sizes and counts of
communicators, and any batching, advancing and restores of random progress records."""

from __future__ import annotations

import random
import time

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.hang import HangDetector, Settings
from tests.factories import T0, fuzz_examples, progress
from tests.unit.hang.factories import healthy_reports, watchdog_timeouts


def _settled(records: list, config: Settings | None = None) -> list:
    det = HangDetector(config)
    return det.observe(sorted(records, key=lambda r: r.ts)) + det.advance(float("inf"))


def _timeouts(at: float, seq: int, behind: dict[int, int], op: str = "ALLREDUCE", nranks: int = 4) -> list:
    """Every rank of job ``j1``'s process group ``0`` times out at ``at`` on work ``seq``, having
    completed ``seq - 1`` or what ``behind`` says."""
    return [progress(at + 0.1 * r, f"n{r}", r, gpu=r, state="timeout", seq=seq, op=op, timeout_ms=600000,
                     last_enqueued=seq, last_completed=behind.get(r, seq - 1)) for r in range(nranks)]  # fmt: skip


# -- a communicator id used again -------------------------------------------------------------


def test_a_restarted_job_hanging_again_in_a_process_group_of_the_same_id_alerts_again():
    # The job restarts after the first hang (PyTorch numbers its process groups as before) and
    # hangs again within forget_after, another rank behind: a new hang, not the firing one.
    got = _settled(watchdog_timeouts(4, 100.0, {1: 499}) + _timeouts(1000.0, 51, {3: 40}))
    assert [(a.state, a.host) for a in got] == [("firing", "n1"), ("resolved", "n1"), ("firing", "n3")]
    assert got[1].ts == T0 + 1000.0 and got[1].evidence["resolved_by"] == "communicator restarted"
    assert "ALLREDUCE seq 51" in got[2].summary and got[2].evidence["peers_last_completed"] == 50


def test_a_restarted_job_loading_its_checkpoint_is_not_stuck_behind_its_earlier_run():
    # The first run got to work 598; the restarted one completes nothing for three minutes.
    recs = healthy_reports(4, range(0, 600))
    recs += [progress(t + 0.3, f"n{r}", r, gpu=r, last_enqueued=-1, last_completed=-1)
             for t in range(700, 900, 10) for r in range(4)]  # fmt: skip
    assert _settled(recs) == []


# -- a second hang in one communicator --------------------------------------------------------


def test_a_second_hang_in_a_communicator_says_its_own_collective_not_the_first_ones():
    recs = watchdog_timeouts(4, 100.0, {1: 499})
    recs += [progress(200.0 + r, f"n{r}", r, gpu=r, last_enqueued=600, last_completed=600) for r in range(4)]
    recs += _timeouts(1000.0, 901, {2: 850}, op="BROADCAST")
    got = _settled(recs)
    assert [(a.state, a.host) for a in got] == [("firing", "n1"), ("resolved", "n1"), ("firing", "n2")]
    assert "BROADCAST seq 901" in got[2].summary
    assert (got[2].evidence["op"], got[2].evidence["seq"]) == ("BROADCAST", 901)


# -- RAS names outliers only ------------------------------------------------------------------


def test_ras_ranks_it_did_not_name_are_not_called_never_reported():
    # RAS prints a group's ranks only when the group is an outlier: the 30 it left out of a
    # 32-rank communicator are the ones at the common count, not silent ones.
    recs = [progress(t, "172.16.64.211", r, gpu=r - 8, comm="27a0", source="ras", state="lagging", nranks=32,
                     last_enqueued=6649) for t in (0.0, 60.0, 120.0, 180.0) for r in (9, 10)]  # fmt: skip
    (fired,) = _settled(recs)
    assert [s["rank"] for s in fired.evidence["suspects"]] == [9, 10]
    assert fired.evidence["never_reported"] == [] and "never reported" not in fired.summary


def test_watchdog_ranks_of_a_known_size_that_never_reported_are_still_listed():
    recs = [
        progress(0.0, "n0", 0, gpu=0, state="progress", nranks=8, last_enqueued=5, last_completed=3),
        progress(0.1, "n1", 1, gpu=1, state="timeout", nranks=8, last_enqueued=5, last_completed=4),
    ]
    (fired,) = _settled(recs)
    assert fired.evidence["never_reported"] == [2, 3, 4, 5, 6, 7]


# -- hostile sizes and counts -----------------------------------------------------------------


def test_a_huge_nranks_costs_the_ranks_that_reported_not_the_size():
    # nranks is bounded only by the contract's 2^24: naming who never reported must not walk it.
    recs = [progress(0.1 * r, f"n{c}-{r}", r, gpu=r, comm=str(c), state="progress" if r == 0 else "timeout",
                     nranks=1 << 24, last_enqueued=5, last_completed=3 if r == 0 else 4)
            for c in range(10) for r in range(2)]  # fmt: skip
    det = HangDetector(Settings(settle_s=10))
    det.observe(recs)
    t = time.perf_counter()
    fired = det.advance(T0 + 100)
    assert time.perf_counter() - t < 1.0
    assert len(fired) == 10 and fired[0].evidence["never_reported"] == list(range(2, 18))


def test_thousands_of_jobs_hanging_at_once_settle_in_linear_time():
    # A fabric outage hangs every job at once: each settle looks at its own job, not every other.
    n = 4000
    recs = [progress(100.0 + 0.001 * r, f"n{j}-{r}", r, gpu=r, job=f"job{j}", state="timeout", seq=5,
                     last_enqueued=5, last_completed=4 if r else 3) for r in range(4) for j in range(n)]  # fmt: skip
    det = HangDetector(Settings(max_communicators=n))
    det.observe(recs)
    t = time.perf_counter()
    fired = det.advance(T0 + 200)
    assert time.perf_counter() - t < 3.0
    assert len(fired) == n and {a.host for a in fired} == {f"n{j}-0" for j in range(n)}


# -- any batching, advancing and restores: the same events ------------------------------------

_CFG = Settings(settle_s=10, stuck_after_s=40, forget_after_s=120)


def _random_records(seed: int) -> list:
    """Up to 60 records of two jobs' three communicators (one of lines naming no process group)
    of four ranks over 400 s, at random: every state and source, hosts unsaid by RAS, progress
    going forward, back (a restart) or unsaid, sizes known or not."""
    rng = random.Random(seed)
    recs = []
    for _ in range(rng.randint(1, 60)):
        t = rng.choice([rng.uniform(0, 400), float(rng.randrange(0, 400, 10))])
        r = rng.randrange(4)
        state = rng.choice(["progress", "progress", "timeout", "lagging", "missing"])
        source = "ras" if state in ("lagging", "missing") else "watchdog"
        # RAS 2.24-2.25 names some ranks by number only; lines without a process group share a key.
        host = "unknown" if source == "ras" and rng.random() < 0.2 else f"n{rng.randrange(3)}"
        recs.append(progress(t, host, r, gpu=rng.choice([None, r]), job=rng.choice(["a", "b"]),
                             comm=rng.choice(["0", "1", None]), state=state, source=source,
                             seq=rng.choice([None, 3]), nranks=rng.choice([None, 4]),
                             last_enqueued=rng.choice([None, rng.randrange(-1, 7)]),
                             last_completed=rng.choice([None, rng.randrange(-1, 6)])))  # fmt: skip
    return sorted(recs, key=lambda r: (r.ts, r.host, r.comm or "", r.rank))


def _run(records: list, cuts: list[int], restores: set[int], steps: list[float]) -> list:
    """``records`` in the pieces ``cuts`` make, each but the last followed by ``advance`` no
    later than the next piece's first record, a restored detector after each in ``restores``."""
    det = HangDetector(_CFG)
    out = []
    bounds = [0, *sorted(set(cuts)), len(records)]
    for j, (i, k) in enumerate(zip(bounds, bounds[1:])):
        out += det.observe(records[i:k])
        if k < len(records):
            last = records[k - 1].ts if k > i else -float("inf")
            out += det.advance(min(records[k].ts, max(last, last + steps[j % len(steps)])))
        if j in restores:
            again = HangDetector(_CFG)
            again.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(det.to_state())))
            det = again
    out += det.advance(float("inf"))
    return [(a.id, a.state, a.ts, a.host, a.gpu, a.summary, msgspec.json.encode(a.evidence)) for a in out]


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(
    seed=st.integers(0, 1 << 30),
    cuts=st.lists(st.integers(1, 59), max_size=8),
    restores=st.sets(st.integers(0, 8), max_size=3),
    steps=st.lists(st.floats(0.0, 200.0), min_size=1, max_size=3),
)
def test_random_records_give_the_same_events_whatever_the_batching_advancing_and_restores(seed, cuts, restores, steps):
    recs = _random_records(seed)
    cuts = [c for c in cuts if c < len(recs)]
    assert _run(recs, cuts, restores, steps) == _run(recs, [], set(), [0.0])


def test_process_groups_a_watchdog_line_does_not_name_are_no_restart():
    # Lines without a process group (comm None) of two groups share one key: a rank's completed
    # work goes 500, 40, 501, 41 ... as the groups' lines interleave, which is no restart. Taken
    # as one, each line reset the communicator and the hang's evidence went with it.
    recs = []
    for t in range(0, 600, 10):
        for r in range(4):
            recs.append(progress(t + 0.3, f"n{r}", r, gpu=r, comm=None, last_enqueued=500 + t, last_completed=499 + t))
            recs.append(progress(t + 0.4, f"n{r}", r, gpu=r, comm=None, last_enqueued=40 + t // 10,
                                 last_completed=39 + t // 10))
    recs += [progress(700.0 + 0.1 * r, f"n{r}", r, gpu=r, comm=None, state="timeout", seq=1100, op="ALLREDUCE",
                      timeout_ms=600000, last_enqueued=1100, last_completed=1000 if r == 1 else 1099)
             for r in range(4)]  # fmt: skip
    recs += [progress(700.5 + 0.1 * r, f"n{r}", r, gpu=r, comm=None, last_enqueued=101, last_completed=100)
             for r in range(4)]  # fmt: skip
    got = _settled(recs)
    # Fired (which rank is behind stays unclear where two groups' counts mix) and never reset.
    assert [a.state for a in got] == ["firing"]


def test_another_groups_rank_under_a_shared_group_id_is_no_restart():
    # Groups split from one (DeviceMesh's split_group) can share a group id: rank 0 of group B
    # (host b0) reporting less than rank 0 of group A (a0) under the same key read as a restart,
    # which resolved group A's firing hang and fired a second, hostless, alert for it.
    recs = [progress(1000.0 + 0.1 * r, f"a{r}", r, gpu=0, comm="5", state="timeout", seq=101, op="ALLREDUCE",
                     timeout_ms=600000, last_enqueued=101, last_completed=100 if r == 0 else 99)
            for r in range(2)]  # fmt: skip
    recs += [progress(1060.0 + 0.1 * r, f"b{r}", r, gpu=0, comm="5", state="timeout", seq=100, op="ALLREDUCE",
                      timeout_ms=600000, last_enqueued=100, last_completed=99) for r in range(2)]  # fmt: skip
    got = _settled(recs, Settings(settle_s=30))
    assert [(a.state, a.host) for a in got] == [("firing", "a1")]
