"""Models inside the engine: snapshot/restore, warm-up, rules using score(), NCCL hand-over."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from pipeline.engine import Engine
from pipeline.errors import StateError
from pipeline.models import load_models
from pipeline.models.findings import lane_of
from pipeline.rules import load_rules
from tests.unit.models.factories import one_model, run_scores


def test_snapshot_restore_gives_identical_scores_and_alerts(sim_streams):
    sim, batches = sim_streams("nccl_straggler", hosts=4, duration=500.0, onset=250.0)
    half = 240
    # One engine straight through.
    ms_a = load_models()
    _, seen_a, alerts_a = run_scores(ms_a, batches, name="nccl_rank_straggler")
    # Another stopped half-way, snapshotted, restored into a brand-new engine and model set.
    ms_b = load_models()
    eng_b = Engine(row_checks=[], tick_checks=[], models=ms_b)
    for b in batches[:half]:
        eng_b.process(b)
    blob = eng_b.snapshot()
    ms_c = load_models()
    eng_c = Engine(row_checks=[], tick_checks=[], models=ms_c)
    eng_c.restore(blob)
    _, seen_c, alerts_c = run_scores(ms_c, batches[half:], name="nccl_rank_straggler", engine=eng_c)
    tail_a = seen_a[-len(seen_c):]
    assert len(seen_c) > 200
    for (ta, ga, _, sa), (tc, gc, _, sc) in zip(tail_a, seen_c):
        assert np.array_equal(ta, tc) and np.array_equal(ga, gc)
        np.testing.assert_array_equal(sa, sc)
    # Every model, not just the one spied on: their scores after the restore match too.
    for name in ms_a.scores:
        np.testing.assert_array_equal(ms_a.scores[name], ms_c.scores[name])
    firing_c = [(a.rule, a.host, a.gpu, a.started_at) for a in alerts_c if a.state == "firing"]
    firing_a = [(a.rule, a.host, a.gpu, a.started_at) for a in alerts_a if a.state == "firing"
                and a.ts >= batches[half][0].ts]
    assert firing_c == firing_a and any(r == "nccl_rank_straggler" for r, *_ in firing_c)
    # Each NCCL lane's decider comes back (4 hosts: lanes of 4 and 8 ranks), with the straggler's
    # hysteresis bit up: it decides the next ticks.
    ms_d = load_models()
    ms_d.restore(ms_a.snapshot())
    for name in ("nccl_rank_straggler", "nccl_comm_busbw"):
        a, d = ms_a.models[name].lane_deciders, ms_d.models[name].lane_deciders
        assert sorted(d) == sorted(a) and len(a) == 2
        for k in a:
            np.testing.assert_array_equal(d[k].up, a[k].up)
    assert any(d.up.any() for d in ms_d.models["nccl_rank_straggler"].lane_deciders.values())


def test_restore_rejects_garbage_model_state():
    ms = load_models()
    with pytest.raises(StateError):
        ms.restore(b"\x93not msgpack of a model state")


def test_no_model_alert_before_warm_up(sim_streams):
    # The straggler starts at t=30 s; with a warm-up longer than the run nothing may fire, and
    # the score a rule sees is unknown (NaN) until then.
    sim, batches = sim_streams("nccl_straggler", hosts=2, duration=300.0, onset=30.0)
    ms = one_model("nccl_straggler", warmup=10_000)
    _, seen, alerts = run_scores(ms, batches)
    assert alerts == []
    assert all(np.isnan(s).all() for *_, s in seen)
    # Same stream, short warm-up: it does fire (the test above can fail).
    ms2 = one_model("nccl_straggler", warmup=20, **{"for": "10s"})
    _, _, alerts2 = run_scores(ms2, batches)
    lab = next(lb for lb in sim.labels() if lb["fault"])
    fired = [a for a in alerts2 if a.state == "firing"]
    assert fired and all((a.host, a.gpu) == (lab["host"], lab["gpu"]) for a in fired)
    ev = fired[0].evidence
    assert ev["score"] >= ev["threshold"] and ev["observed"] < ev["expected"] and "drivers" in ev
    assert fired[0].fault == "gpu_test_anomaly" and fired[0].labels["source"] == "model"


def test_rules_can_use_model_scores(tmp_path, sim_streams):
    sim, batches = sim_streams("nccl_straggler", hosts=2, duration=300.0, onset=100.0)
    ms = one_model("nccl_straggler", warmup=20, alert=False)
    (tmp_path / "r.yaml").write_text(textwrap.dedent("""
        rules:
          - name: slow_and_busy
            fault: nccl_slow_rank
            severity: warning
            condition: score(m) > 10 and gpu_util >= 0
            for: 10s
            values:
              s: score(m)
            summary: "GPU {gpu} on {host}: straggler score {s:.0f}"
    """))
    rules, diags = load_rules([tmp_path], models=ms.names)
    assert rules is not None, [str(d) for d in diags]
    eng = Engine(row_checks=[], tick_checks=[], rules=rules, models=ms)
    alerts = []
    for b in batches:
        alerts += eng.process(b).alerts
    fired = [a for a in alerts if a.state == "firing"]
    lab = next(lb for lb in sim.labels() if lb["fault"])
    assert [(a.rule, a.host, a.gpu) for a in fired] == [("slow_and_busy", lab["host"], lab["gpu"])]
    assert fired[0].evidence["s"] > 10 and fired[0].ts >= lab["onset"]


def test_score_of_an_unknown_model_is_a_load_error(tmp_path):
    (tmp_path / "r.yaml").write_text("rules:\n  - name: x\n    fault: gpu_x\n    severity: info\n"
                                     "    condition: score(nope) > 1\n")
    rules, diags = load_rules([tmp_path], models={"m"})
    assert rules is None and any("unknown model 'nope'" in str(d) for d in diags)


def test_job_wide_slowdown_names_no_culprit():
    from pipeline.models.detectors.nccl import RankStraggler
    det = RankStraggler()
    for t in range(50):
        slow = 2.0 if t >= 25 else 1.0   # the whole job slows down at t=25
        for r in range(8):
            x = {"ts": float(t), "comm": "tp0", "rank": r, "entity": r, "nranks": 8, "bytes": 1 << 30,
                 "exec_time_us": 1000.0 * slow * (1 + 0.003 * ((r * 7 + t) % 5 - 2))}
            assert det.score_one(x) < 3.0
            det.learn_one(x)
    # One rank that the others wait for stands out at once.
    scores = {}
    for r in range(8):
        x = {"ts": 50.0, "comm": "tp0", "rank": r, "entity": r, "nranks": 8, "bytes": 1 << 30,
             "exec_time_us": 1200.0 if r == 3 else 2000.0}
        scores[r] = det.score_one(x)
        det.learn_one(x)
    assert max(scores, key=scores.get) == 3 and scores[3] > 10


def test_fault_free_run_raises_no_model_alert(sim_streams):
    sim, batches = sim_streams(None, hosts=4, duration=1200.0)
    ms = load_models()
    for spec in ms.specs:   # short run: shorten warm-ups so every model is judging for most of it
        spec.warmup = min(spec.warmup, 200)
        if "warmup" in spec.params:
            spec.params["warmup"] = spec.warmup
    ms = type(ms)(ms.specs)
    eng, seen, alerts = run_scores(ms, batches, name="thermal_hotter_than_load")
    assert [a.rule for a in alerts if a.state == "firing"] == []
    assert sum(np.isfinite(s).sum() for *_, s in seen) > 10_000   # it was really judging
    # docs/models.md (placement and cost): per-GPU model state stays small; heavy state is per cohort, not per GPU.
    per_gpu = ms.nbytes_per_gpu(eng.entities.n_gpus)
    assert 0 < sum(per_gpu.values()) <= 4096, per_gpu
    assert len(ms.models["gpu_multivariate"].dets) == 1     # one HalfSpaceTrees for the cohort


def _alerts(eng, batches):
    out = []
    for b in batches:
        out += eng.process(b).alerts
    out += eng.flush().alerts
    return [(a.rule, a.state, a.host, a.gpu, a.ts, a.started_at) for a in out]


def test_models_do_not_change_what_rules_find(sim_streams):
    from pipeline.rules import load_rules
    _, batches = sim_streams("thermal_throttling", hosts=2, duration=600.0, onset=300.0)
    rules, _ = load_rules(["rules"])
    alone = _alerts(Engine(rules=rules), batches)
    rules2, _ = load_rules(["rules"])
    both = _alerts(Engine(rules=rules2, models=load_models()), batches)
    assert alone and [a for a in both if not a[0].startswith(tuple(load_models().names))] == alone


def test_model_alerts_do_not_depend_on_batching(sim_streams):
    _, batches = sim_streams("nccl_straggler", hosts=4, duration=500.0, onset=250.0)
    flat = [r for b in batches for r in b]
    one_by_one = _alerts(Engine(row_checks=[], tick_checks=[], models=load_models()), batches)
    chunks = [flat[i:i + 997] for i in range(0, len(flat), 997)]
    chunked = _alerts(Engine(row_checks=[], tick_checks=[], models=load_models()), chunks)
    assert one_by_one and chunked == one_by_one


def test_a_host_behind_in_all_its_communicators_names_no_gpu():
    """Power capping slows a whole host: its rank is last in every data-parallel communicator.
    That is a host-wide condition; a single slow GPU on a host is still named."""
    from pipeline.engine.frame import NcclFrame
    from pipeline.models.detectors.nccl import RankStraggler

    def frame(slow_host: int | None, slow_gpu: tuple[int, int] | None) -> NcclFrame:
        rows = []
        for g in range(8):                       # dp<g>: local GPU g of each of 6 hosts
            for h in range(6):
                late = (h == slow_host) or ((h, g) == slow_gpu)
                others_wait = (slow_host is not None and h != slow_host) or \
                    (slow_gpu is not None and g == slow_gpu[1] and h != slow_gpu[0])
                rows.append((f"dp{g}", h, h * 8 + g, h, 1000.0 if late else (1800.0 if others_wait else 1000.0)))
        n = len(rows)
        return NcclFrame(ts=np.full(n, 5.0), host=np.array([r[1] for r in rows], np.int32),
                         gpu=np.array([r[2] for r in rows], np.int32), comm=[r[0] for r in rows],
                         rank=np.array([r[3] for r in rows], np.int32), nranks=np.full(n, 6, np.int32),
                         bytes=np.full(n, 64.0 * 2**20), exec_time_us=np.array([r[4] for r in rows]),
                         busbw_gbs=np.full(n, 40.0))

    det = RankStraggler()
    capped = frame(slow_host=2, slow_gpu=None)
    assert det.score_frame(capped).max() < 3.0
    one = frame(slow_host=None, slow_gpu=(2, 5))
    s = det.score_frame(one)
    assert int(one.gpu[int(np.argmax(s))]) == 2 * 8 + 5 and s.max() > 10


@pytest.mark.parametrize("comm", ["__pickle__", "__nd__"])
def test_state_keyed_by_telemetry_strings_restores_whatever_they_are(comm):
    # Communicator ids come from telemetry and key the NCCL detectors' state; one spelled like
    # the snapshot's own type markers must restore as the plain key it is (and never be read as
    # a pickle or an array).
    ms = load_models()
    det = ms.models["nccl_rank_straggler"].lane(lane_of(8))[0]
    det.latest = {comm: {3: (1.0, 2.0, 4)}}
    det.codes = {comm: 0}
    blob = ms.snapshot()
    back = load_models()
    back.restore(blob)
    got = back.models["nccl_rank_straggler"].lane(lane_of(8))[0]
    assert got.latest == {comm: {3: (1.0, 2.0, 4)}} and got.codes == {comm: 0}


def test_invented_gpu_models_share_one_overflow_cohort() -> None:
    from pipeline.engine import Engine
    from pipeline.models.modelset import MAX_COHORTS, OVERFLOW_COHORT, load_models
    from pipeline.schema import dcgm
    from tests.factories import HEALTHY, T0

    models = load_models()
    eng = Engine(models=models)
    recs = [dcgm(T0, f"h{i // 8}", i % 8, HEALTHY, model=f"junk-{i}") for i in range(1000)]
    eng.process(recs)
    assert len(models.cohort_names) == MAX_COHORTS and models.cohort_names[-1] == OVERFLOW_COHORT
    assert len(eng.snapshot()) < 8 << 20
