"""Several recordings are read merged in event time (``bus.files.read_merged``): one file per
host over the same hours replays as the hosts sampled, checked against a plain stable sort."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("lines", [1, 8])
def test_a_stray_stamp_does_not_hold_back_the_rest_of_its_file(tmp_path, lines):
    # One sample dated 2100 in a host's file: keyed at its own time it would wait for every other
    # file to end, and the file's every later record would come after them (late in replay).
    # One record a line, a host's 8 GPUs at the stray time agree with each other: compared line
    # by line they took the sample for where the file now was (a reviewer's find).
    a_times: list[float | None] = []
    for t in range(0, 100, 10):
        a_times += [4102444800.0 if t == 30 else float(t)] * lines
    a = _write(tmp_path / "a.jsonl", a_times, "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(5, 100, 10)], "b")
    out = _read([a, b])
    assert out.index(("a", 4 * lines)) < out.index(("b", 4)), out  # a's t=40 before b's t=45
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
    monkeypatch.setattr(files, "merge_group_size", lambda: 2)
    paths = [_write(tmp_path / f"f{k}.jsonl", [float(k), float(k + 10)], str(k)) for k in range(3)]
    with caplog.at_level(logging.WARNING, logger="pipeline.bus.files"):
        out = _read(paths)
    assert out == [("0", 0), ("1", 0), ("0", 1), ("1", 1), ("2", 0), ("2", 1)]
    assert "merged in groups of 2" in caplog.text
    assert files.MAX_MERGED_FILES <= 1024  # each open file holds its read buffers


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


def test_a_clock_wrong_for_a_few_samples_does_not_hold_back_its_file(tmp_path):
    a_times = [float(t) for t in range(0, 200, 10)]
    a_times[5:8] = [4102444800.0, 4102444810.0, 4102444820.0]  # three samples, then back
    a = _write(tmp_path / "a.jsonl", a_times, "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(5, 200, 10)], "b")
    out = _read([a, b])
    assert out.index(("a", 10)) < out.index(("b", 10)), out  # a's t=100 before b's t=105


def test_a_first_sample_followed_by_a_stray_is_keyed_at_its_own_time(tmp_path):
    # A clock reset at boot: the second line says 1970. Keyed at the earlier of the first two,
    # the first line came before every other file's records (300 of them late in replay).
    a = _write(tmp_path / "a.jsonl", [600.0, 0.0, 601.0, 602.0], "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(0, 1200, 100)], "b")
    out = _read([a, b])
    assert out.index(("b", 5)) < out.index(("a", 0)) < out.index(("b", 7)), out  # at 600, not at 0


def test_a_stray_first_sample_is_keyed_where_the_file_goes_on(tmp_path):
    a = _write(tmp_path / "a.jsonl", [4102444800.0, 100.0, 110.0, 120.0], "a")
    b = _write(tmp_path / "b.jsonl", [float(t) for t in range(0, 200, 50)], "b")
    assert _read([a, b]) == [("b", 0), ("b", 1), ("a", 0), ("a", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3)]


def test_standard_input_named_twice_is_read_once(tmp_path, monkeypatch, caplog):
    # Two readers of one pipe each got part of it, lines cut in two (52 malformed_json).
    import io
    import sys

    data = "".join(json.dumps({"kind": "dcgm", "ts": float(t), "tag": "s", "i": t}) + "\n" for t in range(2000))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data.encode())))
    other = _write(tmp_path / "a.jsonl", [0.5, 1000.5], "a")
    with caplog.at_level(logging.WARNING, logger="pipeline.bus.files"):
        out = _read(["-", other, "-"])
    assert [i for tag, i in out if tag == "s"] == list(range(2000))
    assert "named twice" in caplog.text


def test_the_late_note_says_when_files_were_merged_in_groups(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.setattr(files, "merge_group_size", lambda: 2)
    monkeypatch.setattr("pipeline.cli.replay.merge_group_size", lambda: 2)
    recs = fleet(range(600), hosts=3, gpus=1)
    hosts = sorted({r.host for r in recs})
    paths = []
    for h in hosts:
        p = tmp_path / f"{h}.jsonl"
        p.write_bytes(b"".join(encode(r) + b"\n" for r in recs if r.host == h))
        paths.append(str(p))
    assert main(["replay", *paths, "--models", "none"]) == 0
    err = capsys.readouterr().err
    assert f"records of {paths[2]} (" in err and "in groups of 2" in err
