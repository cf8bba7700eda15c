"""The hung-collective detector (pipeline/hang.py) through the two stages: a healthy job stays
quiet, a hang alerts once per job and communicator naming the ranks behind, and the answer does
not depend on batching, restores or how many records came."""

from __future__ import annotations

import io

import pytest

from pipeline.errors import ConfigError, StateError
from pipeline.hang import HangDetector, Settings, load_settings
from producers.torch_watchdog import parse as parse_watchdog
from tests.factories import T0, progress
from tests.unit.hang.factories import detector, hang_alerts, healthy_reports, watchdog_timeouts


def test_a_healthy_job_stays_quiet():
    assert hang_alerts(healthy_reports(16, range(600))) == []


def test_a_transient_ras_mismatch_that_moves_stays_quiet():
    # RAS's guide: a count mismatch is no concern while the counts increase across queries.
    recs = [progress(float(t), "n3", 3, gpu=3, comm="27a0", source="ras", state="lagging", nranks=32,
                     last_enqueued=6649 + t) for t in range(0, 600, 30)]  # fmt: skip
    assert hang_alerts(recs) == []


def test_watchdog_timeouts_name_the_rank_behind_once():
    got = hang_alerts(watchdog_timeouts(8, 100.0, {5: 499}))
    assert len(got) == 1
    state, host, gpu, job, ts, summary, suspects = got[0]
    assert (state, host, gpu, job, suspects) == ("firing", "n5", 5, "j1", [5])
    assert ts == pytest.approx(T0 + 130.0)  # the first timeout + settle (30 s)
    assert "rank 5 on n5 GPU 5 (last completed 499, peers 546)" in summary and "ALLREDUCE seq 547" in summary


def test_several_ranks_behind_are_all_named_and_the_alert_is_on_the_lowest():
    got = hang_alerts(watchdog_timeouts(64, 100.0, {17: 500, 40: 545, 41: 545}))
    assert [(g[0], g[1], g[6]) for g in got] == [("firing", "n17", [17, 40, 41])]


def test_when_every_rank_completed_the_same_the_ranks_that_enqueued_less_are_named():
    recs = watchdog_timeouts(4, 100.0, {})
    recs[2] = progress(100.2, "n2", 2, gpu=2, state="timeout", seq=547, last_enqueued=546, last_completed=546)
    assert [g[6] for g in hang_alerts(recs)] == [[2]]


def test_a_timeout_with_no_rank_standing_out_still_alerts_without_suspects():
    got = hang_alerts(watchdog_timeouts(2, 100.0, {}))
    assert [(g[0], g[1], g[6]) for g in got] == [("firing", None, [])]
    assert "no rank stands out" in got[0][5]


def test_a_stuck_ras_lagging_rank_alerts_after_stuck_after():
    stuck = [progress(t, f"n{r}", r, gpu=r, comm="27a0", source="ras", state="lagging", nranks=32, last_enqueued=6649)
             for t in (0.0, 60.0, 120.0, 180.0) for r in (0, 2)]  # fmt: skip
    got = hang_alerts(stuck)
    assert [(g[0], g[6]) for g in got] == [("firing", [0, 2])]
    assert got[0][4] == pytest.approx(T0 + 120.0 + 30.0)  # stuck 2 min at the third query, then settle


def test_ras_missing_and_dead_ranks_are_named():
    recs = [progress(50.0, "172.16.64.213", 21, gpu=5, comm="cf26", source="ras", state="dead", nranks=32),
            progress(50.0, "172.16.64.212", 13, gpu=6, comm="cf26", source="ras", state="error", nranks=32)]
    got = hang_alerts(recs)
    assert [(g[1], g[2], g[6]) for g in got] == [("172.16.64.212", 6, [13, 21])]


def test_two_jobs_alert_apart_and_a_second_comm_of_a_job_too():
    recs = watchdog_timeouts(4, 100.0, {1: 10}, job="a") + watchdog_timeouts(4, 100.0, {3: 10}, job="b")
    recs += [progress(r.ts - T0 + 1, r.host, r.rank, gpu=r.gpu, job="a", comm="7", state="timeout", seq=3,
                      last_enqueued=3, last_completed=2 if r.rank else 1) for r in recs[:4]]  # fmt: skip
    got = sorted((g[3], g[1], tuple(g[6])) for g in hang_alerts(recs))
    assert got == [("a", "n0", (0,)), ("a", "n1", (1,)), ("b", "n3", (3,))]


def test_it_resolves_when_the_ranks_behind_catch_up():
    recs = watchdog_timeouts(4, 100.0, {2: 500})
    recs += [progress(200.0 + r, f"n{r}", r, gpu=r, last_enqueued=600, last_completed=600) for r in range(4)]
    got = hang_alerts(recs)
    assert [(g[0], g[1]) for g in got] == [("firing", "n2"), ("resolved", "n2")]
    assert got[1][4] == pytest.approx(T0 + 202.0)


@pytest.mark.parametrize("batch", [1, 7, 64, 10_000])
def test_the_same_alerts_whatever_the_batching(batch):
    recs = watchdog_timeouts(16, 100.0, {3: 400, 9: 401}) + healthy_reports(16, range(0, 90))
    recs += [progress(100.0 + 29.9, "n3", 3, gpu=3, state="progress", last_enqueued=547, last_completed=400)]
    assert hang_alerts(recs, batch) == hang_alerts(recs, 50)


def test_a_restore_in_the_middle_gives_the_same_alerts():
    recs = sorted(watchdog_timeouts(8, 100.0, {6: 1}) + healthy_reports(8, range(0, 100)), key=lambda r: r.ts)
    whole = hang_alerts(recs)
    det = detector()
    det.process([r for r in recs if r.ts < T0 + 105])
    again = detector()
    again.restore(det.snapshot())
    assert hang_alerts([r for r in recs if r.ts >= T0 + 105], det=again) == whole


def test_real_watchdog_lines_of_a_64_rank_job_name_the_one_rank_behind():
    # PyTorch 2.3's layout (no time: the records take the log's), 8 nodes' logs of 8 ranks each.
    line_t = "[rank{r}]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank {r}] Process group watchdog thread terminated " \
             "with exception: [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=547, " \
             "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before " \
             "timing out."  # fmt: skip
    line_s = "[rank{r}]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank {r}] Timeout at NCCL work: 547, last enqueued " \
             "NCCL work: 547, last completed NCCL work: {done}."  # fmt: skip
    recs = []
    for node in range(8):
        ranks = range(node * 8, node * 8 + 8)
        text = "\n".join([line_s.format(r=r, done=500 if r == 43 else 546) for r in ranks] +
                          [line_t.format(r=r) for r in reversed(ranks)])  # fmt: skip
        recs += parse_watchdog(io.StringIO(text), job="4242", host=f"node{node}", default_ts=T0 + 100 + node,
                               gpus_per_node=8)  # fmt: skip
    got = hang_alerts(recs)
    assert [(g[0], g[1], g[2], g[3], g[6]) for g in got] == [("firing", "node5", 3, "4242", [43])]


# -- the detector alone: bounds, config, state ------------------------------------------------


def test_communicators_and_ranks_past_the_bounds_are_counted_not_kept():
    det = HangDetector(Settings(max_communicators=2, max_ranks=3))
    det.observe([progress(1.0, "n", r, comm=str(c)) for c in range(4) for r in range(5)])
    assert len(det.comms) == 2 and all(len(c.ranks) == 3 for c in det.comms.values())
    assert det.stats["dropped.communicators"] == 10 and det.stats["dropped.ranks"] == 4


def test_silent_communicators_are_forgotten_and_the_end_of_a_stream_resolves_nothing():
    det = HangDetector(Settings(settle_s=10, forget_after_s=100))
    det.observe(watchdog_timeouts(2, 0.0, {1: 3}))
    fired = det.advance(T0 + 50)
    assert [a.state for a in fired] == ["firing"]
    assert det.advance(float("inf")) == [] and det.comms
    gone = det.advance(T0 + 1000)
    assert [a.state for a in gone] == ["resolved"] and not det.comms


def test_state_round_trips_and_a_forged_one_is_a_state_error():
    det = HangDetector()
    det.observe(watchdog_timeouts(4, 0.0, {2: 1}))
    det.advance(T0 + 60)
    again = HangDetector()
    again.load_state(det.to_state())
    assert again.to_state() == det.to_state()
    for bad in (None, {"version": 2}, {**det.to_state(), "comms": [{"job": 5}]}, {**det.to_state(), "now": "x"}):
        with pytest.raises(StateError):
            again.load_state(bad)
    assert again.to_state() == det.to_state()  # a refused state leaves it as it was


@pytest.mark.parametrize(
    "text, key",
    [
        ("hang:\n  settle: soon\n", "hang.settle"),
        ("hang:\n  stuck_after: -5\n", "hang.stuck_after"),
        ("hang:\n  max_ranks: 0\n", "hang.max_ranks"),
        ("hang:\n  severity: loud\n", "hang.severity"),
        ("hang:\n  setle: 10s\n", "hang.setle"),
        ("hang: [1, 2]\n", "hang"),
        ("hang:\n  settle: !!python/object:os.system echo\n", "(yaml)"),
    ],
)
def test_a_bad_hang_yaml_is_a_config_error_naming_the_key(tmp_path, text, key):
    p = tmp_path / "hang.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    assert key in str(e.value)


def test_the_shipped_hang_yaml_loads():
    from tests.unit.hang.factories import RULES

    s = load_settings(f"{RULES}/hang.yaml")
    assert (s.settle_s, s.stuck_after_s, s.forget_after_s) == (30.0, 120.0, 3600.0)
