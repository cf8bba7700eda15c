"""``gpuwarden produce nccl-tests --file F``: a file with not one line of nccl-tests output exits 3
and says so on its last stderr line, as the other file producers and ``gpuwarden report`` do; an
empty file exits 0, and a run with results (or one that stopped before any) is read as before."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from tests.factories import SHARED_DATA as DATA


def _produce(tmp_path, capsys, text: str, *argv: str) -> tuple[int, list[str]]:
    f = tmp_path / "nccl.log"
    f.write_text(text)
    rc = main(["produce", "nccl-tests", *argv, "--file", str(f), "--out", str(tmp_path / "o.jsonl")])
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "garbage",
    [
        "hello world\nthis is not nccl-tests\n",
        '{"x": 1}\n',  # JSON, but not -J output
        "{not json\n",
        "# a shell comment\nmpirun: command not found\n",
        "8 2 float sum -1 135.8 0.00 0.00 0\n",  # numbers, but no header for them
    ],
)
def test_a_file_with_no_nccl_tests_line_exits_3_and_says_so(tmp_path, capsys, garbage):
    # Before: "0 records read ... nothing counted" and exit 0.
    rc, err = _produce(tmp_path, capsys, garbage)
    assert rc == 3
    assert err[-1].startswith("gpuwarden produce nccl-tests: ") and err[-1].endswith(
        "nccl.log: not one line could be read as nccl-tests output (exit 3)"
    )
    assert sum("not one line" in ln for ln in err) == 1


def test_an_empty_file_exits_0(tmp_path, capsys):
    for text in ("", "\n \n"):
        rc, err = _produce(tmp_path, capsys, text)
        assert rc == 0 and not any("not one line" in ln for ln in err), err


def test_a_run_that_stopped_before_its_results_is_nccl_tests_output(tmp_path, capsys):
    head = (DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt").read_text().split("#       size", 1)[0]
    rc, err = _produce(tmp_path, capsys, head + "NCCL failure common.cu:1 'unhandled system error'\n")
    assert rc == 0 and not any("not one line" in ln for ln in err), err


def test_a_real_log_and_json_output_are_read_and_exit_0(tmp_path, capsys):
    rc, err = _produce(tmp_path, capsys, (DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt").read_text())
    assert rc == 0 and (tmp_path / "o.jsonl").read_text().count("\n") == 31, err
    doc = {
        "version": 2,
        "args": ["all_reduce_perf"],
        "config": {"devices": [{"rank": 0, "hostname": "n1"}]},
        "results": [{"size": 8, "out_of_place": {"time": 10.0, "alg_bw": 0.1, "bus_bw": 0.1, "nwrong": 0}}],
    }
    rc, err = _produce(tmp_path, capsys, json.dumps(doc))
    assert rc == 0 and not any("not one line" in ln for ln in err), err


def test_wrong_results_still_exit_3_as_a_finding_not_as_unreadable(tmp_path, capsys):
    text = (
        (DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt")
        .read_text()
        .replace("    0.00      0    123.5", "    0.00      7    123.5", 1)
    )
    rc, err = _produce(tmp_path, capsys, text)
    assert rc == 3 and any("CRITICAL" in ln for ln in err) and not any("not one line" in ln for ln in err)
