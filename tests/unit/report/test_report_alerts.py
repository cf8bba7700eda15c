import gzip

from pipeline.report.alerts import group_events, load_alerts, most_important
from pipeline.schema import encode
from tests.factories import T0
from tests.unit.report.factories import alert, write_jsonl


def test_firing_and_resolved_events_pair_up_by_id():
    incs, orphans = group_events([
        alert(10, id="a", started=5), alert(20, id="b"), alert(40, id="a", state="resolved", started=5),
        alert(50, id="zzz", state="resolved"),
    ])
    assert [i.id for i in incs] == ["a", "b"] and orphans == 1
    a, b = incs
    assert (a.started_at, a.fired_at, a.resolved_at) == (T0 + 5, T0 + 10, T0 + 40)
    assert b.resolved_at is None and b.end(T0 + 99) == T0 + 99


def test_the_first_firing_event_is_the_one_kept():
    incs, _ = group_events([alert(30, id="a", evidence={"x": 2}), alert(10, id="a", evidence={"x": 1})])
    assert len(incs) == 1 and incs[0].event.evidence == {"x": 1}


def test_bad_lines_are_counted_and_arrays_and_gzip_are_read(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    good = encode([alert(1, id="x"), alert(2, id="y")])
    with gzip.open(path, "wb") as fh:
        fh.write(good + b"\nnot json\n" + b'{"kind":"alert","id":"q"}\n' + encode(alert(3, id="z")) + b"\n")
    log = load_alerts([path])
    assert sorted(i.id for i in log.incidents) == ["x", "y", "z"]
    assert log.bad_lines == 2 and log.lines == 4


def test_most_important_puts_severity_before_time_and_caps(tmp_path):
    incs, _ = group_events([alert(1, id="w1", severity="warning"), alert(5, id="c1", severity="critical"),
                            alert(3, id="c0", severity="critical"), alert(2, id="i", severity="info")])
    assert [i.id for i in most_important(incs, 3)] == ["c0", "c1", "w1"]
    assert most_important(incs, 0) == []


def test_write_jsonl_round_trip(tmp_path):
    log = load_alerts([write_jsonl(tmp_path / "a.jsonl", [alert(1)])])
    assert log.incidents[0].event.rule == "gpu_thermal_throttling" and log.bad_lines == 0
