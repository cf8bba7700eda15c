"""The driver's message for a GPU off the bus without an XID, in every layout a log prints it.

Source: open-gpu-kernel-modules ``src/nvidia/arch/nvalloc/unix/src/osinit.c`` (``RmInitAdapter``,
the GPU's boot registers read all ones)::

    nv_printf(NV_DBG_ERRORS,
        "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\\n"
        "NVRM: (PCI ID: %04x:%04x) installed in this system has\\n"
        "NVRM: fallen off the bus and is not responding to commands.\\n", ...)

one kernel record of three lines. ``/dev/kmsg`` escapes its newlines (``devkmsg_read``:
``\\x0a``), the journal keeps them in ``MESSAGE``, util-linux ``dmesg`` and ``journalctl``'s short
layouts print the later lines indented under the first without a time, the kernel's syslog
interface (rsyslog's imklog) gives each line its own prefix, and rsyslog from the journal may
escape the newline as ``#012``. NVIDIA/NVSentinel's syslog monitor reads the same message
(``pkg/gpufallen``), with and without the PCI ID; another driver release breaks the lines after
"installed in this". The unsupported-GPU message of the same shape (``nv.c``: "... installed in
this system is not supported by the ...") is not a GPU off the bus.
"""

from __future__ import annotations

import json
import os

from pipeline.catalog import FIELDS
from producers.kmsg import KernelLog, KmsgFileSource, KmsgFollower, parse_line, parse_pci_map

PCI = parse_pci_map("index, pci.bus_id\n0, 00000000:3B:00.0\n3, 00000000:B3:00.0")
XID = FIELDS.by_alias("xid")
LINES = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)
MTIME = 1_796_157_005.0


def _file(tmp_path, text: str):
    p = tmp_path / "kern.log"
    p.write_text(text)
    os.utime(p, (MTIME, MTIME))
    return str(p)


def _xids(recs) -> dict[tuple[str, int], int]:
    """Each (host, GPU)'s last XID as the records say it."""
    out: dict[tuple[str, int], int] = {}
    for r in sorted(recs, key=lambda r: r.ts):
        out[(r.host, r.gpu)] = int(getattr(r.fields, XID.names[0]))
    return out


def _lost(tmp_path, text: str) -> tuple[KmsgFileSource, list]:
    src = KmsgFileSource(_file(tmp_path, text), PCI, host="n1", sample=False)
    return src, src.poll()


def test_dmesg_prints_the_later_lines_indented_and_the_gpu_is_off_the_bus(tmp_path):
    text = f"[ 1843.308145] {LINES[0]}\n               {LINES[1]}\n               {LINES[2]}\n"
    src, recs = _lost(tmp_path, text)
    assert _xids(recs) == {("n1", 3): 79}
    (rec,) = recs
    assert rec.labels["xid.pci"] == "0000:b3:00"
    assert rec.labels["xid.message"] == (
        "The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has "
        "fallen off the bus and is not responding to commands."
    )
    assert src.summary()["gpu_lost_lines"] == 1
    assert src.summary()["xid_lines"] == 0
    assert src.summary()["lines_without_time"] == 0


def test_each_layout_of_the_one_record_gives_one_gpu_off_the_bus(tmp_path):
    joined = "\n".join(LINES)
    layouts = {
        "dev/kmsg": "3,812,1843308145,-;" + "\\x0a".join(LINES) + "\n",
        "journal json": json.dumps(
            {"MESSAGE": joined, "__REALTIME_TIMESTAMP": "1796157005000000", "_TRANSPORT": "kernel",
             "_SOURCE_MONOTONIC_TIMESTAMP": "1843308145"}
        ) + "\n",
        "journalctl short-monotonic": f"[ 1843.308145] n1 kernel: {LINES[0]}\n"
        + "".join(f"                             {x}\n" for x in LINES[1:]),
        "syslog, a prefix a line": "".join(f"Dec  1 20:30:05 n1 kernel: [ 1843.308145] {x}\n" for x in LINES),
        "rsyslog #012": f"Dec  1 20:30:05 n1 kernel: {'#012'.join(LINES)}\n",
        "no PCI ID (NVSentinel)": f"[ 1843.308145] {LINES[0]}\n    NVRM: installed in this system has\n    {LINES[2]}\n",
        "two lines (another release)": "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) "
        "installed in this\n               NVRM: system has fallen off the bus and is not responding to commands.\n",
        "one line": "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0 installed in this system has fallen off "
        "the bus and is not responding to commands.\n",
    }
    for name, text in layouts.items():
        src, recs = _lost(tmp_path, text)
        assert _xids(recs) == {("n1", 3): 79}, name
        assert src.summary()["gpu_lost_lines"] == 1, name


def test_the_same_record_from_dmesg_and_the_journal_is_one_event(tmp_path):
    dm = f"[ 1843.308145] {LINES[0]}\n               {LINES[1]}\n               {LINES[2]}\n"
    js = json.dumps({"MESSAGE": "\n".join(LINES), "__REALTIME_TIMESTAMP": "1796157005000000",
                     "_TRANSPORT": "kernel", "_SOURCE_MONOTONIC_TIMESTAMP": "1843308145"}) + "\n"
    src, recs = _lost(tmp_path, dm + js)
    assert len(recs) == 1
    assert src.summary()["duplicate_lines"] == 1
    assert src.summary()["gpu_lost_lines"] == 2  # the record and its copy, as xid_lines counts copies


def test_the_unsupported_gpu_message_of_the_same_shape_is_nothing(tmp_path):
    text = (
        "[    5.100000] NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:1c82)\n"
        "               NVRM: installed in this system is not supported by the\n"
        "               NVRM: NVIDIA 470.82.01 driver release.\n"
        "[    6.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"
    )
    src, recs = _lost(tmp_path, text)
    assert _xids(recs) == {("n1", 0): 79}  # only the XID line's GPU
    assert src.summary()["gpu_lost_lines"] == 0


def test_an_xid_right_after_the_first_line_is_read_as_itself(tmp_path):
    # The driver's message cut after its first line (a log rotated, a lost record): the XID that
    # follows is its own event, not a continuation.
    text = (
        f"[ 1843.308145] {LINES[0]}\n"
        "[ 1844.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error\n"
    )
    src, recs = _lost(tmp_path, text)
    assert _xids(recs) == {("n1", 0): 48}
    assert src.summary()["xid_lines"] == 1 and src.summary()["gpu_lost_lines"] == 0


def test_a_gpu_the_pci_map_lacks_is_counted_unmapped(tmp_path):
    text = "[ 1843.308145] NVRM: The NVIDIA GPU 0000:c1:00.0 installed in this system has fallen off the bus and is not responding to commands.\n"
    src, recs = _lost(tmp_path, text)
    assert recs == []
    assert src.summary()["dropped.unmapped_pci"] == 1 and src.summary()["gpu_lost_lines"] == 1


def test_a_follower_reads_the_record_from_dev_kmsg():
    class Reader:
        stats = None

        def __init__(self, lines):
            self.lines = lines

        def read(self):
            out, self.lines = self.lines, []
            return out

        def close(self):
            pass

    # Stamped a second after the follower's start (boot time 0: the kernel's microseconds are epoch).
    rec = f"3,812,{int((MTIME + 1) * 1e6)},-;" + "\\x0a".join(LINES)
    f = KmsgFollower(Reader([rec]), PCI, host="n1", clock=lambda: MTIME + 2, boot_time=0.0)
    f.started = MTIME
    recs = f.poll()
    lost = [r for r in recs if r.labels.get("xid.pci") == "0000:b3:00"]
    assert len(lost) == 1 and lost[0].ts == MTIME + 1
    assert _xids(recs)[("n1", 3)] == 79
    assert f.summary()["gpu_lost_lines"] == 1


def test_parse_line_unescapes_dev_kmsg_newlines_only():
    ln = parse_line("3,1,5,-;a\\x0ab\\x09c")
    assert ln is not None and ln.msg == "a\nb\\x09c"
    assert KernelLog(PCI).wants(ln.msg) is False
