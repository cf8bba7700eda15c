import math

import pytest

from pipeline.evaluation.goodput import OTHER, Detection, Job, family_shares, goodput, references
from pipeline.evaluation.score import Score

FAMS = ["gpu", "hang", "hbm", "nccl", "network", "nvlink", "nvswitch", "pcie", "telemetry", "thermal"]


def detection(latency: float, recall: float = 1.0, false_rate: float = 0.0) -> Detection:
    return Detection("d", {f: (recall, latency) for f in FAMS}, false_rate)


def test_shares_follow_the_llama3_mix():
    s = family_shares()
    assert math.isclose(sum(s.values()), 1.0)
    assert set(s) == set(FAMS) | {OTHER}
    # HBM3 (17.2 %) and SRAM (4.5 %) are both memory faults: the largest telemetry-visible family.
    assert max((v, k) for k, v in s.items() if k != OTHER)[1] == "hbm"


def test_hand_computed_case():
    # Interruption rate L with L*T = ln 2: q = 1/2, so the work kept per cycle is exactly T;
    # the cycle lasts 1/L + restart + latency (every cause, other ones included, waits 300 s).
    T, R, lat = 3600.0, 600.0, 300.0
    lam = math.log(2) / T
    job = Job(gpus=1000, checkpoint_interval_s=T, restart_cost_s=R, other_latency_s=lat,
              fault_rate_per_gpu_s=lam / 1000)
    g = goodput(job, detection(lat))
    assert g.useful == pytest.approx(T / (T / math.log(2) + R + lat))        # 0.5908
    assert g.useful == pytest.approx(0.5908, abs=1e-4)
    assert g.useful + g.rollback + g.restarts + g.detecting + g.hung == pytest.approx(1.0)
    assert g.hung == 0.0 and g.false_restarts_per_day == 0.0


def test_slower_detection_and_lower_recall_cost_training_time():
    job = Job()
    useful = [goodput(job, detection(lat)).useful for lat in (0, 10, 60, 180, 600)]
    assert useful == sorted(useful, reverse=True) and len(set(useful)) == 5
    by_recall = [goodput(job, detection(30, recall=r)).useful for r in (1.0, 0.8, 0.5, 0.0)]
    assert by_recall == sorted(by_recall, reverse=True) and len(set(by_recall)) == 4
    # A fault found at the watchdog's own timeout costs the same as one missed.
    assert goodput(job, detection(job.watchdog_timeout_s)).useful == pytest.approx(
        goodput(job, detection(0, recall=0.0)).useful)


def test_false_alerts_cost_restarts_in_proportion_to_job_size():
    small, big = Job(gpus=1024), Job(gpus=16_384)
    g = goodput(big, detection(10, false_rate=0.1))
    # 0.1 per 1,000 GPU-hours on 16,384 GPUs: 1.64 an hour of running time.
    assert g.false_restarts_per_day == pytest.approx(0.1 / 1000 * 16_384 * 24 * (g.useful + g.rollback))
    assert goodput(big, detection(10, false_rate=0.1)).useful < goodput(big, detection(10)).useful
    loss_small = goodput(small, detection(10)).useful - goodput(small, detection(10, false_rate=0.1)).useful
    loss_big = goodput(big, detection(10)).useful - goodput(big, detection(10, false_rate=0.1)).useful
    assert loss_big > loss_small > 0


def test_more_frequent_checkpoints_lose_less_work():
    d = detection(30)
    useful = [goodput(Job(checkpoint_interval_s=t), d).useful for t in (300, 900, 1800, 3600)]
    assert useful == sorted(useful, reverse=True)


def test_references_bracket_a_measured_detector_and_unmeasured_families_count_as_missed():
    job = Job()
    none, ideal = (goodput(job, d).useful for d in references(FAMS))
    assert none < goodput(job, detection(60, recall=0.9)).useful < ideal
    s = Score("x", gpu_hours=100.0)
    s.family("hbm").injected, s.family("hbm").detected, s.family("hbm").latencies = 2, 2, [10.0, 30.0]
    d = Detection.from_score(s)
    assert d.families == {"hbm": (1.0, 20.0)} and d.false_per_1000_gpu_h == 0.0
    g = goodput(job, d)
    assert sorted(g.unmeasured) == ["gpu", "hang", "nccl", "network", "nvlink", "nvswitch", "pcie", "telemetry", "thermal"]
    assert g.hung > 0
