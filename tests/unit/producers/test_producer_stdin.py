"""``--file -``: a producer reading standard input replaces bytes that are not UTF-8, as it does
reading a file, where a strict stdin (``PYTHONIOENCODING=utf-8:strict``, a pipe from a tool that
wrote Latin-1) raised ``UnicodeDecodeError`` out of the read and lost the whole input."""

from __future__ import annotations

import io
import sys

import pytest

from producers.dcgmi import DmonFileSource
from producers.kmsg import KmsgFileSource, load_pci_map
from producers.textinput import read_capped

XID = "[Mon Mar  3 10:00:00 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"


# Python's stdin is strict under PYTHONIOENCODING=utf-8:strict, surrogateescape by default (a C or
# UTF-8 locale): the first raised at a bad byte, the second passed it on as a lone surrogate that no
# record, label or dead letter can be encoded with.
STDIN_ERRORS = ["strict", "surrogateescape"]


def _stdin(monkeypatch, raw: bytes, errors: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors=errors))


@pytest.mark.parametrize("errors", STDIN_ERRORS)
def test_a_whole_text_input_from_stdin_replaces_bytes_that_are_not_utf8(monkeypatch, errors):
    _stdin(monkeypatch, b"\xef\xbb\xbfok \xff\xfe line\nnext\n", errors)
    assert read_capped("-", 100) == ("ok \ufffd\ufffd line\nnext\n", False)


@pytest.mark.parametrize("errors", STDIN_ERRORS)
def test_the_kernel_log_from_stdin_keeps_its_lines_past_a_byte_that_is_not_utf8(monkeypatch, errors):
    _stdin(monkeypatch, b"\xff\x80 garbage from a Latin-1 tool\n" + XID.encode(), errors)
    src = KmsgFileSource("-", {(0, 0x3B, 0): 2}, host="h", sample=False)
    recs = src.poll()
    assert src.stats.summary()["lines"] == 2
    assert [(r.gpu, r.fields.DCGM_FI_DEV_XID_ERRORS) for r in recs] == [(2, 79.0)]


def test_a_saved_file_with_a_byte_order_mark_reads_without_it(tmp_path):
    # An output saved through a Windows editor or PowerShell starts with U+FEFF, which would
    # stand before the first line's first word (ibstat's "CA '...'", a RAS header) and hide it.
    f = tmp_path / "ibstat.txt"
    f.write_bytes("\ufeffCA 'mlx5_0'\n".encode())
    assert read_capped(str(f), 100) == ("CA 'mlx5_0'\n", False)


def test_a_dmon_capture_with_a_byte_order_mark_keeps_its_header(tmp_path):
    # Before: the header's "#Entity" read as "\ufeff#Entity", no header was found, and every row
    # until dmon repeated it was an unparsable row.
    f = tmp_path / "dmon.log"
    f.write_bytes(b"\xef\xbb\xbf#Entity   TMPTR  POWER\nID        C      W\nGPU 0     41     250.5\n")
    src = DmonFileSource(str(f), host="h")
    assert [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP) for r in src.poll()] == [(0, 41)]
    assert src.summary()["dropped.unparsable_row"] == 0


def test_a_pci_map_saved_with_a_byte_order_mark_or_a_bad_byte_reads(tmp_path):
    f = tmp_path / "pci.csv"
    f.write_bytes(b"\xef\xbb\xbfindex, pci.bus_id\n0, 00000000:3B:00.0\n# note \xff\n")
    assert load_pci_map(str(f)) == {(0, 0x3B, 0): 0}


def test_a_pci_map_larger_than_any_saved_one_is_refused_unread(tmp_path):
    f = tmp_path / "pci.csv"
    f.write_text("index, pci.bus_id\n" + "# padding\n" * 200_000)
    with pytest.raises(ValueError, match="PCI map .* is over"):
        load_pci_map(str(f))
