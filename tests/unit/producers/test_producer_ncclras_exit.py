"""``gpuwarden produce ncclras --file F``: a file with not one line of RAS output (the wrong file,
an error page) exits 3 and says so on its last stderr line, as the other file producers and
``gpuwarden report`` do; so do an empty input (the client never reached the daemon) and a status
cut before its communicators table (the client timed out); a status saying all is well exits 0."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from tests.unit.producers.ras_factories import DOC_HEALTHY, DOC_JSON, DOC_MISMATCH, DOC_STATUS

# What `ncclras` prints before the job summary (src/ras/client_support.cc, rasClientRunInit).
PREAMBLE = "NCCL version 2.26.2+cuda12.8 compiled with CUDA 12.8\nCUDA runtime version 12080, driver version 12080\n\n"


def _produce(tmp_path, capsys, text: str) -> tuple[int, list[str]]:
    f = tmp_path / "ras.txt"
    f.write_text(text)
    rc = main(["produce", "ncclras", "--file", str(f), "--job", "j", "--out", str(tmp_path / "o.jsonl")])
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "garbage",
    [
        "hello world\nthis is not ncclras\n",
        '{"x": 1}\n',  # JSON, but not RAS's
        "{not json at all\n",
        'Traceback (most recent call last):\n  File "x.py", line 1\nConnectionRefusedError: [Errno 111]\n',
    ],
)
def test_a_file_with_no_ras_line_exits_3_and_says_so(tmp_path, capsys, garbage):
    # Before: "0 records read ... lines 3" and exit 0, as if the job were healthy.
    rc, err = _produce(tmp_path, capsys, garbage)
    assert rc == 3
    assert err[-1].startswith("gpuwarden produce ncclras: ") and err[-1].endswith(
        "ras.txt: not one line could be read as ncclras output (exit 3)"
    )
    assert sum("not one line" in ln for ln in err) == 1 and "Traceback" not in "\n".join(err[:-1])


@pytest.mark.parametrize("text", ["", "\n\n   \n"])
def test_an_empty_input_exits_3_as_no_status(tmp_path, capsys, text):
    # Before: exit 0, "0 records read", as if the job were healthy; ncclras prints a status
    # whenever it reaches the daemon, so nothing at all means it did not.
    rc, err = _produce(tmp_path, capsys, text)
    assert rc == 3
    assert err[-1] == "gpuwarden produce ncclras: LOST input: dropped.empty_status 1 (exit 3)"


HEALTHY_FULL = PREAMBLE + DOC_HEALTHY + "\nErrors\n======\n\nWarnings\n========\n\n"


@pytest.mark.parametrize(
    "text",
    [
        PREAMBLE,  # the client's first lines only: the job summary never came
        PREAMBLE + DOC_HEALTHY.split("Communicators")[0],  # the job summary, then nothing
        PREAMBLE + DOC_HEALTHY.split("Communicators")[0] + "Communicators...",  # the client timed out here
        HEALTHY_FULL + PREAMBLE + "Job summary\n===========\n",  # captures appended: the last one cut
    ],
)
def test_a_status_cut_before_its_communicators_exits_3(tmp_path, capsys, text):
    # Before: exit 0, read as a healthy job, though RAS never said what its communicators were doing.
    rc, err = _produce(tmp_path, capsys, text)
    assert rc == 3, err
    assert err[-1] == "gpuwarden produce ncclras: LOST input: dropped.cut_status 1 (exit 3)"


@pytest.mark.parametrize(
    "text",
    [
        DOC_HEALTHY,  # all is well: recognised, nothing to report
        PREAMBLE + DOC_HEALTHY,
        HEALTHY_FULL,  # as the client prints it: the Errors and Warnings heads even when empty
        HEALTHY_FULL + HEALTHY_FULL,  # captures appended
        PREAMBLE + DOC_HEALTHY.split("Group")[0] + "No communicator data collected!\n",
        DOC_STATUS,  # a block with no section head above it, ranks in transition only
        json.dumps({"nccl_version": "2.29.1", "timestamp": "2025-12-19 13:06:53", "communicators": []}),
    ],
)
def test_an_empty_file_or_a_healthy_status_exits_0(tmp_path, capsys, text):
    rc, err = _produce(tmp_path, capsys, text)
    assert rc == 0, err
    assert not any("not one line" in ln for ln in err)


@pytest.mark.parametrize("text", [DOC_MISMATCH, DOC_JSON])
def test_a_status_naming_ranks_is_read_and_exits_0(tmp_path, capsys, text):
    rc, err = _produce(tmp_path, capsys, "garbage before it\n" + text if text is DOC_MISMATCH else text)
    assert rc == 0, err
    assert (tmp_path / "o.jsonl").read_text().count("\n") >= 2
