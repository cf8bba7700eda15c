"""Kernel-log layouts as the tools print them, beyond those ``test_producer_kmsg.py`` covers.

Sources of the layouts:

- journalctl: systemd ``src/shared/logs-show.c`` (main at 002951ce), ``output_timestamp_realtime``
  (short: ``"%b %d %H:%M:%S"``, short-precise: the same and ``".%06"``, short-unix:
  ``"%10"PRI_TIME".%06"``), ``output_timestamp_monotonic`` (short-monotonic: ``"[%5"PRI_USEC".%06"
  PRI_USEC"]"``, short-delta: the same and ``" <%5"PRI_USEC".%06"PRI_USEC"%s>"`` with ``" "`` or
  ``"*"``) and ``output_short`` (``" %s"`` hostname unless ``--no-hostname``, then the identifier,
  ``"[%s]"`` its pid, ``": "``).
- dmesg: util-linux ``sys-utils/dmesg.c`` (master at 01a424f5), ``print_record``: ``-r``
  ``"<%d>[%5ld.%06ld] "``, ``-d`` ``"[%5ld.%06ld <%12.06f>] "``, ``-T -d`` ``"[%s <%12.06f>] "``,
  and the caller id (kernels with ``CONFIG_PRINTK_CALLER``) ``"[%*s] "`` after the time.
- The driver prints ``"NVRM: Xid (...): %d, ..."`` (open-gpu-kernel-modules 595.45.04,
  ``src/nvidia/src/kernel/gpu/rc/kernel_rc.c``) and ``"...SXid (PCI:...): %05d, "``
  (``src/common/nvswitch/kernel/inc/common_nvswitch.h``): a comma always follows the code.
- Monitors re-log the kernel's XID lines verbatim under their own name (NVIDIA/NVSentinel
  https://github.com/NVIDIA/NVSentinel/pull/1270: ``... kernel: [16450076.435595] NVRM: Xid
  (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver], Timeout after 6s ...``).
"""

from __future__ import annotations

import time

from producers.kmsg import KernelLog, KmsgFileSource, parse_line, parse_pci_map
from tests.unit.producers.kmsg_factories import PCI_MAP, XID, XID_13, XID_79, val, write

NIC_DOWN = "mlx5_core 0000:3b:00.0 ens1f0np0: Link down"  # mlx5e en_main.c, as test_producer_kmsg_fabric.py
SXID = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"


def local(text: str, fmt: str = "%Y %b %d %H:%M:%S") -> float:
    return time.mktime(time.strptime(text, fmt))


def fabric_of(line):
    return KernelLog({}, host="n1").fabric.classify("n1", line.msg)


def test_journalctl_short_precise_is_read_like_short():
    # Before: no layout matched (the microseconds), so the XID took the file's time and no host,
    # and a NIC line (which must start the message) was not counted at all.
    for text in (f"Mar 03 10:00:00.123456 gpu-7 kernel: {XID_79}", f"Mar  3 10:00:00.123456 gpu-7 kernel: {NIC_DOWN}"):
        ln = parse_line(text, year=2025)
        assert (ln.ts, ln.host, ln.error) == (local("2025 Mar 03 10:00:00") + 0.123456, "gpu-7", None), text
        assert ln.msg in (XID_79, NIC_DOWN)
    assert fabric_of(parse_line(f"Mar 03 10:00:00.123456 gpu-7 kernel: {NIC_DOWN}", year=2025))[0] == (
        "nic_link_down_events"
    )


def test_journalctl_short_monotonic_and_delta_name_the_host_and_keep_the_message():
    # Before: read as dmesg with "gpu-7 kernel: " left in the message: no host, no NIC line.
    for pfx in ("[ 1234.567890] gpu-7 kernel: ", "[ 1234.567890 <    0.000123 >] gpu-7 kernel: ",
                "[ 1234.567890 <    3.000000*>] gpu-7 kernel: "):
        for msg in (XID_79, NIC_DOWN):
            ln = parse_line(pfx + msg)
            assert (ln.msg, ln.boot, ln.host, ln.error) == (msg, 1234.56789, "gpu-7", None), pfx
    assert fabric_of(parse_line(f"[ 1234.567890] gpu-7 kernel: {NIC_DOWN}"))[0] == "nic_link_down_events"


def test_journalctl_without_hostname_and_short_unix():
    # journalctl --no-hostname drops the host; -o short-unix writes epoch seconds. Before: no layout.
    ln = parse_line(f"Mar 03 10:00:00 kernel: {NIC_DOWN}", year=2025)
    assert (ln.msg, ln.ts, ln.host) == (NIC_DOWN, local("2025 Mar 03 10:00:00"), None)
    ln = parse_line(f"1741000000.123456 gpu-7 kernel: {XID_79}")
    assert (ln.msg, ln.ts, ln.host) == (XID_79, 1741000000.123456, "gpu-7")


def test_dmesg_raw_delta_and_caller_id_layouts_keep_their_time():
    # Before: dmesg -r, -d and -T -d matched no layout (the file's time for the XID, no NIC line),
    # and a caller id stayed in the message, where a NIC line must start.
    for text in (f"<3>[ 1234.567890] {NIC_DOWN}", f"[ 1234.567890 <    0.000123>] {NIC_DOWN}",
                 f"[ 1234.567890] [  T1234] {NIC_DOWN}", f"<4>[ 1234.567890] [    C3] {NIC_DOWN}"):
        ln = parse_line(text)
        assert (ln.msg, ln.boot, ln.error) == (NIC_DOWN, 1234.56789, None), text
        assert fabric_of(ln)[0] == "nic_link_down_events"
    ln = parse_line(f"[Mon Mar  3 10:00:00 2025 <    0.000123>] {XID_79}")
    assert (ln.msg, ln.ts) == (XID_79, local("2025 Mar 3 10:00:00"))


def test_a_syslog_file_across_new_year_puts_decembers_lines_in_the_year_before(tmp_path):
    # Before: every line took the mtime's year, so December's XID was placed eleven months
    # after the file was written (and sorted after January's).
    text = f"Dec 31 23:59:00 n1 kernel: {XID_79}\nJan  1 00:01:00 n1 kernel: {XID_13}\n"
    p = write(tmp_path, "kern.log", text, mtime=local("2026 Jan 02 12:00:00"))
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False).poll()
    assert [(r.ts, r.gpu, val(r, XID)) for r in recs] == [
        (local("2025 Dec 31 23:59:00"), 0, 79), (local("2026 Jan 01 00:01:00"), 2, 13)]
    # Feb 29 read in a common year is a leap year's, the year before.
    p = write(tmp_path, "leap.log", f"Feb 29 10:00:00 n1 kernel: {XID_79}\n", mtime=local("2029 Jan 10 00:00:00"))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert [r.ts for r in src.poll()] == [local("2028 Feb 29 10:00:00")]
    assert src.summary()["dropped.bad_timestamp"] == 0


def test_a_line_cut_inside_its_code_is_not_a_shorter_code(tmp_path):
    # The driver always writes ", " after the code; a file cut (or wrapped) after "7" of "79"
    # was read as XID 7, and an SXid cut after "1202" as SXid 1202.
    p = write(tmp_path, "dmesg.txt", f"[ 1.000000] {XID_13}\n[ 2.000000] NVRM: Xid (PCI:0000:3b:00): 7\n"
                                     "[ 3.000000] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 1202")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False)
    assert [(r.gpu, val(r, XID)) for r in src.poll()] == [(2, 13)]
    assert src.summary()["dropped.unparsable_xid"] == 2
    kl = KernelLog(parse_pci_map(PCI_MAP), host="n1")   # a comma with nothing after it is whole
    assert [val(r, XID) for r in kl.apply(parse_line("NVRM: Xid (PCI:0000:3b:00): 79,"), 1.0)] == [79]


def test_a_programs_syslog_line_quoting_an_xid_is_not_the_kernels(tmp_path):
    # /var/log/syslog and messages hold every program's lines; a monitor that re-logs the
    # kernel's line (NVSentinel #1270) was counted as a second XID, at the file's time.
    quoted = f"ErrorCode:119 PCI:0000:5e:00 kernel: [16450076.435595] {XID_79}"
    lines = [f"Mar  3 10:00:00 n1 kernel: {XID_13}", f"Mar  3 10:00:05 n1 syslog-health-monitor[812]: {quoted}",
             f"2025-03-03T10:00:06.000001+00:00 n1 gpud: {quoted}", f"Mar  3 10:00:07 n1 gpud: {SXID}"]
    p = write(tmp_path, "syslog", "\n".join(lines) + "\n", mtime=local("2025 Mar 03 11:00:00"))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert [(r.host, r.gpu, val(r, XID)) for r in src.poll()] == [("n1", 2, 13)]
    s = src.summary()
    assert (s["xid_lines"], s["sxid_lines"], s["dropped.unparsable_xid"], s["lines_without_time"]) == (1, 0, 0, 0)
    ln = parse_line(f"Mar  3 10:00:05 n1 syslog-health-monitor[812]: {quoted}", year=2025)
    assert (ln.ts, ln.host) == (local("2025 Mar 3 10:00:05"), "n1")   # its time still counts
    # dmesg's iso layout (a comma before the microseconds) has no host or program: all kernel.
    ln = parse_line("2025-01-25T10:34:54,859532+00:00 r8169: eth0: link down")
    assert ln.msg == "r8169: eth0: link down"


def test_nul_bytes_a_crash_left_before_the_next_line_do_not_hide_its_layout(tmp_path):
    # A host that crashed (an XID 79 often ends in one) leaves NUL bytes where the log's
    # unwritten blocks were; the first line written after the reboot follows them.
    text = f"Mar  3 09:00:00 n1 kernel: {XID_13}\n" + "\0" * 4096 + f"Mar  3 10:00:00 n1 kernel: {XID_79}\n"
    p = write(tmp_path, "kern.log", text, mtime=local("2025 Mar 03 11:00:00"))
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False).poll()
    assert [(r.ts, r.host, val(r, XID)) for r in recs] == [
        (local("2025 Mar 3 09:00:00"), "n1", 13), (local("2025 Mar 3 10:00:00"), "n1", 79)]
