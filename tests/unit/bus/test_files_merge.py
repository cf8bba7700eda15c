"""Several recordings are read merged in event time (``bus.files.read_merged``): one file per
host over the same hours replays as the hosts sampled, checked against a plain stable sort."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.bus import files
from pipeline.bus.files import read_merged
from pipeline.replay import replay
from pipeline.schema import encode
from tests.factories import THROTTLED, fleet


def _write(path: Path, times: list[float | None], tag: str) -> Path:
    """One line per time: a record-like JSON object with that ``ts`` (``None``: a line without one)."""
    lines = [
        json.dumps({"kind": "dcgm", "tag": tag, "i": i} if t is None else {"kind": "dcgm", "ts": t, "tag": tag, "i": i})
        for i, t in enumerate(times)
    ]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _read(paths: list[Path], problems: list[str] | None = None) -> list[tuple[str, int]]:
    return [(d["tag"], d["i"]) for d in (json.loads(m.value) for m in read_merged(paths, [] if problems is None else problems))]


# Wide enough that gaps past MERGE_JUMP_S come up: those are sparse files, not strays.
sorted_times = st.lists(st.integers(0, 3000).map(float), max_size=25).map(sorted)


@settings(max_examples=50, deadline=None)
@given(st.lists(sorted_times, min_size=2, max_size=5))
def test_sorted_files_merge_as_a_stable_sort_of_all_their_lines(tmp_path_factory, per_file):
    d = tmp_path_factory.mktemp("m")
    paths = [_write(d / f"f{k}.jsonl", times, str(k)) for k, times in enumerate(per_file)]
    # Reference: every line sorted by its time, ties in the order the files were given.
    reference = sorted(
        ((t, k, i) for k, times in enumerate(per_file) for i, t in enumerate(times)), key=lambda x: (x[0], x[1])
    )
    assert _read(paths) == [(str(k), i) for _, k, i in reference]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(0, 5000).map(float)), max_size=20), min_size=2, max_size=4))
def test_any_files_lose_nothing_and_keep_their_own_order(tmp_path_factory, per_file):
    d = tmp_path_factory.mktemp("m")
    paths = [_write(d / f"f{k}.jsonl", times, str(k)) for k, times in enumerate(per_file)]
    out = _read(paths)
    assert sorted(out) == sorted((str(k), i) for k, times in enumerate(per_file) for i in range(len(times)))
    for k in range(len(per_file)):
        assert [i for tag, i in out if tag == str(k)] == list(range(len(per_file[k])))


def test_a_stray_stamp_does_not_hold_back_the_rest_of_its_file(tmp_path):
    # One sample dated 2100 in a host's file: keyed at its own time it would wait for every other
    # file to end, and the file's every later record would come after them (late in replay).
    a_times: list[float | None] = [float(t) for t in range(0, 100, 10)]
    a_times.insert(3, 4102444800.0)
    a = _write(tmp_path / "a.jsonl", a_times, "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(5, 100, 10)], "b")
    out = _read([a, b])
    assert out.index(("a", 4)) < out.index(("b", 3)), out  # a's t=30 before b's t=35
    assert out[-1] == ("b", 9)


def test_a_host_back_after_an_outage_rejoins_at_its_own_time(tmp_path):
    a = _write(tmp_path / "a.jsonl", [0.0, 10.0, 3000.0, 3010.0], "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(5, 3100, 1000)], "b")  # 5, 1005, 2005, 3005
    assert _read([a, b]) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2), ("b", 3), ("a", 3)]


def test_sparse_events_hours_apart_are_not_taken_for_strays(tmp_path):
    # A kernel-log file: three XIDs hours apart, every one far from both neighbours.
    a = _write(tmp_path / "a.jsonl", [0.0, 3600.0, 7200.0], "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(1800, 9000, 1800)], "b")  # 1800 .. 7200
    assert _read([a, b]) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2), ("b", 3)]


def test_lines_without_a_time_stay_beside_their_neighbours(tmp_path):
    a = _write(tmp_path / "a.jsonl", [None, 0.0, None, 20.0], "a")
    b = _write(tmp_path / "b.jsonl", [10.0, 30.0], "b")
    assert _read([a, b]) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("a", 3), ("b", 1)]


def test_past_the_open_file_limit_files_merge_in_groups_and_lose_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(files, "_open_files_allowed", lambda: 2)
    paths = [_write(tmp_path / f"f{k}.jsonl", [float(k), float(k + 10)], str(k)) for k in range(3)]
    with caplog.at_level(logging.WARNING, logger="pipeline.bus.files"):
        out = _read(paths)
    assert out == [("0", 0), ("1", 0), ("0", 1), ("1", 1), ("2", 0), ("2", 1)]
    assert "merged in groups of 2" in caplog.text


def test_an_unreadable_file_is_named_and_the_others_still_merge(tmp_path):
    a = _write(tmp_path / "a.jsonl", [0.0, 10.0], "a")
    problems: list[str] = []
    assert _read([a, tmp_path / "missing.jsonl"], problems) == [("a", 0), ("a", 1)]
    assert len(problems) == 1 and problems[0].startswith(f"{tmp_path / 'missing.jsonl'}: ")


def test_per_host_recordings_of_the_same_hours_replay_as_one_recording(tmp_path):
    # Two hosts recorded apart (one file each, the same 15 minutes): before, the second file's
    # every record was late and its host's throttling never alerted.
    def faults(t: float, host: str, gpu: int) -> dict | None:
        return THROTTLED if host == "n1" and gpu == 1 and 120 <= t < 300 else {}

    recs = fleet(range(900), hosts=2, gpus=2, overrides=faults)
    hosts = sorted({r.host for r in recs})
    split = [tmp_path / f"{h}.jsonl" for h in hosts]
    for h, path in zip(hosts, split):
        path.write_bytes(b"".join(encode(r) + b"\n" for r in recs if r.host == h))
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(encode(r) + b"\n" for r in recs))

    def alerts(paths: list[Path], name: str) -> tuple[list[tuple], int]:
        out, dlq = tmp_path / f"{name}.alerts", tmp_path / f"{name}.dlq"
        res = replay(paths, alerts_out=str(out), dlq_out=str(dlq))
        got = [json.loads(x) for x in out.read_text().splitlines()]
        return sorted((a["rule"], a["host"], a.get("gpu"), a["state"], a["ts"]) for a in got), res.totals.records

    merged, n = alerts(list(reversed(split)), "merged")
    assert merged == alerts([whole], "whole")[0] and n == len(recs)
    assert any(a[1] == "n1" and a[2] == 1 and a[3] == "firing" for a in merged)
    assert not (tmp_path / "merged.dlq").read_text()
