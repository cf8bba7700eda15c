"""Builders of ``dcgmi dmon`` output for the producer's tests, laid out as DCGM's
``dcgmi/DeviceMonitor.cpp`` prints it."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from producers.dcgmi import DmonParser
from tests.factories import SHARED_DATA as DATA


def dmon(entity_width: int, cols: list[tuple[str, str, int]], rows: list[tuple[str, list[str]]]) -> str:
    """Heading, units row and ``rows`` left-aligned as DeviceMonitor.cpp prints them: the entity
    cell padded to ``entity_width`` (and not cut, so a longer one touches the next cell), each
    value padded to its column's width (trailing padding kept)."""
    head = "#Entity".ljust(entity_width) + "".join(n.ljust(w) for n, _, w in cols)
    units = "ID".ljust(entity_width) + "".join(u.ljust(w) for _, u, w in cols)
    body = [e.ljust(entity_width) + "".join(v.ljust(w) for v, (_, _, w) in zip(vals, cols)) for e, vals in rows]
    return "\n".join([head, units, *body]) + "\n"


def parse_dmon(text: str) -> tuple[list, DmonParser]:
    """The records of ``text`` read by one parser (host ``h``), and the parser for its counts."""
    p = DmonParser("h", clock=lambda: 1.0e9)
    return list(p.parse(text.splitlines())), p


# The real sample the fake dcgmi prints (test_producer_dcgmi.py reads it too).
SAMPLE = DATA / "dcgmi_dmon_a100_dcgm3_sample.txt"


@pytest.fixture
def fake_dcgmi(tmp_path, monkeypatch):
    """A ``dcgmi`` on PATH: probes (-c 1) exit 250 for ids in FAKE_DCGMI_UNSUPPORTED; the stream
    prints the real sample, then waits, and records its argv."""
    exe = tmp_path / "bin" / "dcgmi"
    exe.parent.mkdir()
    exe.write_text(f"""#!{sys.executable}
import os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_DCGMI_LOG"], "a") as fh:
    fh.write(" ".join(args) + "\\n")
ids = args[args.index("-e") + 1].split(",")
bad = set(filter(None, os.environ.get("FAKE_DCGMI_UNSUPPORTED", "").split(",")))
if bad & set(ids):
    print("Error: field not supported", file=sys.stderr)
    sys.exit(250)
if "-c" in args:
    sys.exit(0)
sys.stdout.write(open({str(SAMPLE)!r}).read())
sys.stdout.flush()
time.sleep(30)
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DCGMI_LOG", str(log))
    monkeypatch.setenv("FAKE_DCGMI_UNSUPPORTED", "155,999")
    return log
