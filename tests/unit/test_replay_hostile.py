"""Hostile records in a recording cost only themselves (issue 18): replay finishes, gives the
clean file's alerts, and names each bad record in the dead-letter output with its line."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import threading
import tracemalloc
from pathlib import Path

import msgspec
import pytest

from pipeline.bus.files import read_lines
from pipeline.cli import main
from pipeline.decode import MAX_GPU_INDEX
from pipeline.errors import EXIT_INPUT
from pipeline.replay import replay
from pipeline.schema import encode
from tests.factories import T0, THROTTLED, fleet

INSERT_AT = 40  # lines of good data before the hostile one, and plenty after it


def _good_lines() -> list[bytes]:
    """Two hosts x two GPUs for 5 minutes; GPU n1/1 throttles from t=60 to t=120."""

    def faults(t: float, host: str, gpu: int) -> dict | None:
        return THROTTLED if host == "n1" and gpu == 1 and 60 <= t < 120 else {}

    return [encode(r) for r in fleet(range(300), hosts=2, gpus=2, overrides=faults)]


def _run(tmp_path: Path, lines: list[bytes], batch: int = 50, name: str = "x.jsonl") -> tuple[list[dict], list[dict]]:
    path = tmp_path / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
    alerts, dlq = tmp_path / "alerts.jsonl", tmp_path / "dlq.jsonl"
    replay([path], alerts_out=str(alerts), dlq_out=str(dlq), batch_size=batch)
    read = lambda p: [json.loads(x) for x in p.read_text().splitlines()]  # noqa: E731
    return read(alerts), read(dlq)


def _record(**changes: object) -> dict:
    rec = json.loads(_good_lines()[INSERT_AT])
    rec.update(changes)
    return rec


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


HOSTILE = {
    "nested_1000_deep": (_deep(1000), "too_deep"),
    "nested_inside_an_unknown_key": (
        b'{"kind":"dcgm","ts":%d,"host":"n0","gpu":0,"x":' % T0 + _deep(1000) + b"}",
        "too_deep",
    ),
    "gpu_index_2_to_63": (json.dumps(_record(gpu=2**63)).encode(), "out_of_range"),
    "gpu_index_past_the_bound": (json.dumps(_record(gpu=MAX_GPU_INDEX + 1)).encode(), "out_of_range"),
    "link_index_huge": (json.dumps(_record(link=2**40)).encode(), "out_of_range"),
    "host_lone_surrogate": (json.dumps(_record(host="n\ud800")).encode(), "bad_identifier"),
    "host_with_newline": (json.dumps(_record(host="n0\nforged line")).encode(), "bad_identifier"),
    "host_7_mb": (json.dumps(_record(host="h" * 7_000_000)).encode(), "bad_identifier"),
    "model_lone_surrogate": (json.dumps(_record(model="H100\udfff")).encode(), "bad_identifier"),
    "invalid_utf8": (b'{"kind":"dcgm","ts":%d,"host":"n\xff\xfe","gpu":0}' % T0, "malformed_json"),
}

NCCL = {
    "kind": "nccl",
    "ts": T0 + 41,
    "host": "n0",
    "gpu": 0,
    "comm": "c1",
    "rank": 0,
    "nranks": 4,
    "coll": "AllReduce",
    "bytes": 1 << 20,
    "exec_time_us": 900.0,
    "busbw_gbs": 300.0,
}
HOSTILE_NCCL = {
    "nccl_gpu_minus_2000": ({**NCCL, "gpu": -2000}, "out_of_range"),
    "nccl_gpu_minus_5": ({**NCCL, "gpu": -5}, "out_of_range"),
    "nccl_rank_2_to_32": ({**NCCL, "rank": 2**32, "nranks": 2**32 + 1}, "out_of_range"),
    # Past an int64 the fleet stage's canonical order could not sort it (the replay stopped).
    "nccl_seq_2_to_64": ({**NCCL, "seq": 2**64 - 1}, "out_of_range"),
    "nccl_seq_negative": ({**NCCL, "seq": -3}, "out_of_range"),
    "nccl_comm_surrogate": ({**NCCL, "comm": "c\ud800"}, "bad_identifier"),
    "nccl_job_control_chars": ({**NCCL, "job": "j\x1b[31m"}, "bad_identifier"),
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    alerts, dlq = _run(tmp_path_factory.mktemp("clean"), _good_lines())
    assert dlq == [] and any(a["fault"] == "thermal_throttling" for a in alerts)
    return alerts


@pytest.mark.parametrize("case", sorted(HOSTILE) + sorted(HOSTILE_NCCL))
def test_a_hostile_record_costs_only_itself(tmp_path: Path, clean: list[dict], case: str) -> None:
    if case in HOSTILE:
        bad, reason = HOSTILE[case]
    else:
        rec, reason = HOSTILE_NCCL[case]
        bad = json.dumps(rec).encode()
    lines = _good_lines()
    lines.insert(INSERT_AT, bad)
    alerts, dlq = _run(tmp_path, lines)
    assert alerts == clean
    assert [(d["reason"], d["origin"].rsplit(":", 1)[1]) for d in dlq] == [(reason, str(INSERT_AT + 1))]
    # Whatever the record held, the dead letter is valid UTF-8 JSON (it was written and read back).
    assert all("\ud800" not in json.dumps(d, ensure_ascii=False).encode("utf-8", "replace").decode() for d in dlq)


def test_the_nccl_gpu_of_a_record_is_never_wrapped_onto_another_gpu(tmp_path: Path) -> None:
    # -5 used to land on GPU 3 of an 8-GPU host through numpy's negative indexing.
    lines = _good_lines()
    lines.insert(INSERT_AT, json.dumps({**NCCL, "gpu": -1}).encode())
    _, dlq = _run(tmp_path, lines)
    assert [d["reason"] for d in dlq] == ["out_of_range"]


def test_an_oversized_line_in_a_gzip_recording_is_never_read_whole(tmp_path: Path) -> None:
    import tracemalloc

    from pipeline.bus.files import read_lines

    lines = _good_lines()
    lines.insert(INSERT_AT, b'{"kind":"dcgm","host":"' + b"h" * (40 << 20) + b'"}')  # 40 MiB
    path = tmp_path / "big.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b"\n".join(lines) + b"\n")
    tracemalloc.start()
    sizes = [len(m.value) for m in read_lines(path, max_line_bytes=1 << 20)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(sizes) == len(lines) and sizes[INSERT_AT] == (1 << 20) + 1
    assert peak < 8 << 20  # bounded by the limit, not by the line

    alerts, dlq = _run(tmp_path, lines, name="again.jsonl.gz")
    assert [(d["reason"], d["origin"].rsplit(":", 1)[1]) for d in dlq] == [("too_large", str(INSERT_AT + 1))]


# Hostile and messy files (not records): each bad file or line is named, the rest replayed.

_enc = msgspec.json.Encoder()


def _lines(seconds: range, hosts: int = 2) -> bytes:
    return b"".join(_enc.encode(r) + b"\n" for r in fleet(seconds, hosts=hosts))


def _dead(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_gzip_bytes_are_gunzipped_whatever_the_name_and_on_stdin(tmp_path, monkeypatch):
    data = _lines(range(0, 20))
    path = tmp_path / "x.jsonl"  # gzip content, plain name: was hundreds of malformed_json lines
    path.write_bytes(gzip.compress(data))
    assert [m.value for m in read_lines(path)] == data.splitlines()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(data))))
    assert [m.value for m in read_lines("-")] == data.splitlines()


def test_concatenated_gzip_members_are_one_stream(tmp_path):
    data = _lines(range(0, 20))
    half = len(data.splitlines()) // 2
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(
        gzip.compress(b"\n".join(data.splitlines()[:half]) + b"\n")
        + gzip.compress(b"\n".join(data.splitlines()[half:]) + b"\n")
    )
    assert [m.value for m in read_lines(path)] == data.splitlines()


def test_a_truncated_gzip_is_named_with_its_line_and_the_cut_line_is_a_dead_letter(tmp_path):
    data = _lines(range(0, 200))
    path = tmp_path / "cut.jsonl.gz"
    z = gzip.compress(data)
    path.write_bytes(z[: len(z) // 2])
    dlq = tmp_path / "d.jsonl"
    res = replay([path], dlq_out=str(dlq))
    assert len(res.problems) == 1 and str(path) in res.problems[0] and "truncated" in res.problems[0]
    complete = int(res.problems[0].split("after line ")[1].split(" ")[0])
    assert res.totals.records == complete
    cut = [d for d in _dead(dlq) if d["reason"] == "malformed_json"]
    assert [d["origin"] for d in cut] == [f"{path}:{complete + 1}"]


def test_bytes_after_the_gzip_stream_keep_its_records_and_are_named(tmp_path):
    data = _lines(range(0, 50))
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(gzip.compress(data) + b"garbage\n")  # was "not a gzip file", nothing replayed
    res = replay([path])
    assert res.totals.records == len(data.splitlines())
    n = len(data.splitlines())
    assert res.problems == [p for p in res.problems if f"{path}: after line {n}: bytes that are not gzip" in p]
    assert len(res.problems) == 1


def test_a_bad_file_among_several_is_named_and_the_others_are_replayed(tmp_path, capsys):
    good1, bad, good2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl"
    good1.write_bytes(_lines(range(0, 30)))
    bad.write_bytes(b'{"not": "gzip"}\n')
    good2.write_bytes(_lines(range(30, 60)))
    n = len(good1.read_bytes().splitlines()) + len(good2.read_bytes().splitlines())
    rc = main(["replay", str(good1), str(bad), str(good2), "--models", "none"])
    err = capsys.readouterr().err
    assert rc == EXIT_INPUT
    assert f"replayed {n:,} records" in err
    assert f"{bad}: not a gzip file, though named .gz" in err


def test_a_read_error_mid_replay_names_the_file_and_the_rest_is_replayed(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_bytes(_lines(range(0, 30)))
    adir = tmp_path / "d"
    adir.mkdir()  # open() fails: IsADirectoryError, an OSError with a filename
    res = replay([adir, good])
    assert res.totals.records == len(good.read_bytes().splitlines())
    assert len(res.problems) == 1 and res.problems[0].startswith(f"{adir}: ")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_read_like_a_process_substitution(tmp_path, capsys):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    data = _lines(range(0, 30))

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    rc = main(["replay", str(fifo), "--models", "none"])
    t.join(timeout=10)
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"replayed {len(data.splitlines()):,} records" in err


def test_a_directory_is_named_as_one(tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--models", "none"]) == EXIT_INPUT
    assert f"{tmp_path}: a directory" in capsys.readouterr().err


def test_a_file_going_back_in_time_gets_a_note_saying_why_its_records_are_late(tmp_path, capsys):
    # The files are merged by time (bus/test_files_merge.py), so overlapping ones are not late;
    # a file that goes back by itself (two recordings concatenated out of order) still is.
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(_lines(range(0, 900), hosts=1))
    recs = [r for r in fleet(range(0, 900), hosts=2) if r.host != fleet(range(1), hosts=1)[0].host]
    back = [r for r in recs if r.ts >= T0 + 450] + [r for r in recs if r.ts < T0 + 450]
    b.write_bytes(b"".join(_enc.encode(r) + b"\n" for r in back))
    assert main(["replay", str(a), str(b), "--models", "none"]) == 0
    err = capsys.readouterr().err
    assert f"records of {b} (" in err and "go back in time within their own file" in err
    assert f"records of {a} (" not in err


def test_the_line_limit_is_measured_on_what_is_left_once_blanks_are_stripped(tmp_path):
    # Blanks around a line are not part of its record (the decoder strips them too): a record of
    # exactly the limit ended by "\r\n", or blanks before a short record, are read; a line whose
    # record itself runs past the limit is too_large whatever blanks surround it. Before: the kept
    # bytes were stripped (content past the limit cut off silently: "\t b\r}" read as "b").
    path = tmp_path / "x.jsonl"
    path.write_bytes(
        b"{}" + b" " * 50 + b"\n"  # 1: a record, then blanks past the limit
        + b" " * 50 + b"\n"  # 2: blanks only
        + b"[" + b"1" * 8 + b"]\r\n"  # 3: exactly the limit, then "\r"
        + b" " * 30 + b"[1]\n"  # 4: blanks past the limit before a short record
        + b"\t b\r}\r\t \t\n"  # 5: blanks inside the record count
        + b"[" + b"1" * 20 + b"]   \n"  # 6: past the limit
    )
    got = [(m.offset, m.value) for m in read_lines(path, max_line_bytes=10)]
    assert [(o, v) for o, v in got if len(v) <= 10] == [(1, b"{}"), (3, b"[11111111]"), (4, b"[1]"), (5, b"b\r}")]
    assert [o for o, v in got if len(v) > 10] == [6]


def test_a_long_gzipped_line_without_a_newline_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        for _ in range(64):
            fh.write(b"a" * (1 << 20))  # 64 MiB, one line
    tracemalloc.start()
    try:
        got = [len(m.value) for m in read_lines(path, max_line_bytes=1 << 20)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [(1 << 20) + 1]
    assert peak < 8 << 20


def test_zeros_after_and_between_gzip_members_are_padding(tmp_path):
    # Found in review: a .gz followed by zeros (tape blocks, a preallocated file), which gzip -t and
    # Python's gzip module accept, was named "bytes that are not gzip" and exited 3.
    path = tmp_path / "padded.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"a":1}\n') + b"\0" * 512 + gzip.compress(b'{"a":2}\n') + b"\0" * 70_000)
    problems: list[str] = []
    assert [m.value for m in read_lines(path, on_problem=problems.append)] == [b'{"a":1}', b'{"a":2}']
    assert problems == []


def test_a_single_file_going_back_in_time_gets_the_note_too(tmp_path, capsys):
    # README: records of a file that goes back in time by itself are late, and replay says so.
    b = tmp_path / "b.jsonl"
    recs = list(fleet(range(0, 900), hosts=2))
    back = [r for r in recs if r.ts >= T0 + 450] + [r for r in recs if r.ts < T0 + 450]
    b.write_bytes(b"".join(_enc.encode(r) + b"\n" for r in back))
    assert main(["replay", str(b), "--models", "none"]) == 0
    err = capsys.readouterr().err
    assert f"records of {b} (" in err and "go back in time within the file" in err
