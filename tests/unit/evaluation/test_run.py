"""End to end on small simulated runs: what ``gpuwarden eval`` measures and claims."""

from pipeline.evaluation.run import evaluate
from pipeline.evaluation.score import compare


def test_gpuwarden_beats_both_baselines_on_one_of_every_fault():
    scores = evaluate("mixed", seeds=1, hosts=4, duration=1200)
    assert [s.detector for s in scores] == ["gpuwarden", "community", "dcgm-health"]
    ours = scores[0]
    assert ours.families["nccl"].detected == 1          # the straggler: only the online models see it
    for other in scores[1:]:
        c = compare(ours, other)
        assert c.beats, (other.detector, c.reasons)


def test_runs_are_deterministic_per_seed():
    a, b = (evaluate("thermal_hbm", seeds=1, hosts=1, duration=600) for _ in range(2))
    for x, y in zip(a, b):
        assert {f: fs.detections for f, fs in x.families.items()} == {f: fs.detections for f, fs in y.families.items()}
        assert x.false_alerts == y.false_alerts
    assert a[0].families["thermal"].detected == 1
