"""Hostile records in a recording cost only themselves (issue 18): replay finishes, gives the
clean file's alerts, and names each bad record in the dead-letter output with its line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipeline.decode import MAX_GPU_INDEX
from pipeline.replay import replay
from pipeline.schema import encode
from tests.factories import T0, THROTTLED, fleet

INSERT_AT = 40   # lines of good data before the hostile one, and plenty after it


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
        b'{"kind":"dcgm","ts":%d,"host":"n0","gpu":0,"x":' % T0 + _deep(1000) + b"}", "too_deep"),
    "gpu_index_2_to_63": (json.dumps(_record(gpu=2 ** 63)).encode(), "out_of_range"),
    "gpu_index_past_the_bound": (json.dumps(_record(gpu=MAX_GPU_INDEX + 1)).encode(), "out_of_range"),
    "link_index_huge": (json.dumps(_record(link=2 ** 40)).encode(), "out_of_range"),
    "host_lone_surrogate": (json.dumps(_record(host="n\ud800")).encode(), "bad_identifier"),
    "host_with_newline": (json.dumps(_record(host="n0\nforged line")).encode(), "bad_identifier"),
    "host_7_mb": (json.dumps(_record(host="h" * 7_000_000)).encode(), "bad_identifier"),
    "model_lone_surrogate": (json.dumps(_record(model="H100\udfff")).encode(), "bad_identifier"),
    "invalid_utf8": (b'{"kind":"dcgm","ts":%d,"host":"n\xff\xfe","gpu":0}' % T0, "malformed_json"),
}

NCCL = {"kind": "nccl", "ts": T0 + 41, "host": "n0", "gpu": 0, "comm": "c1", "rank": 0, "nranks": 4,
        "coll": "AllReduce", "bytes": 1 << 20, "exec_time_us": 900.0, "busbw_gbs": 300.0}
HOSTILE_NCCL = {
    "nccl_gpu_minus_2000": ({**NCCL, "gpu": -2000}, "out_of_range"),
    "nccl_gpu_minus_5": ({**NCCL, "gpu": -5}, "out_of_range"),
    "nccl_rank_2_to_32": ({**NCCL, "rank": 2 ** 32, "nranks": 2 ** 32 + 1}, "out_of_range"),
    # Past an int64 the fleet stage's canonical order could not sort it (the replay stopped).
    "nccl_seq_2_to_64": ({**NCCL, "seq": 2 ** 64 - 1}, "out_of_range"),
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
    lines.insert(INSERT_AT, b'{"kind":"dcgm","host":"' + b"h" * (40 << 20) + b'"}')   # 40 MiB
    path = tmp_path / "big.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b"\n".join(lines) + b"\n")
    tracemalloc.start()
    sizes = [len(m.value) for m in read_lines(path, max_line_bytes=1 << 20)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(sizes) == len(lines) and sizes[INSERT_AT] == (1 << 20) + 1
    assert peak < 8 << 20   # bounded by the limit, not by the line

    alerts, dlq = _run(tmp_path, lines, name="again.jsonl.gz")
    assert [(d["reason"], d["origin"].rsplit(":", 1)[1]) for d in dlq] == [("too_large", str(INSERT_AT + 1))]
