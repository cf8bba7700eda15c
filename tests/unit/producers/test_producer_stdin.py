"""``--file -``: a producer reading standard input replaces bytes that are not UTF-8, as it does
reading a file, where a strict stdin (``PYTHONIOENCODING=utf-8:strict``, a pipe from a tool that
wrote Latin-1) raised ``UnicodeDecodeError`` out of the read and lost the whole input."""

from __future__ import annotations

import io
import sys

from producers.kmsg import KmsgFileSource
from producers.textinput import read_capped

XID = "[Mon Mar  3 10:00:00 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"


def _strict_stdin(monkeypatch, raw: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="strict"))


def test_a_whole_text_input_from_stdin_replaces_bytes_that_are_not_utf8(monkeypatch):
    _strict_stdin(monkeypatch, b"ok \xff\xfe line\nnext\n")
    assert read_capped("-", 100) == ("ok \ufffd\ufffd line\nnext\n", False)


def test_the_kernel_log_from_stdin_keeps_its_lines_past_a_byte_that_is_not_utf8(monkeypatch):
    _strict_stdin(monkeypatch, b"\xff\x80 garbage from a Latin-1 tool\n" + XID.encode())
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
