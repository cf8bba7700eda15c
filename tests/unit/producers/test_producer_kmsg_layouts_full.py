"""``journalctl -o short-full`` lines, as systemd prints them.

Source of the layout: systemd ``src/shared/logs-show.c`` (main at 002951ce),
``output_timestamp_realtime``: for ``OUTPUT_SHORT_FULL`` (and ``OUTPUT_WITH_UNIT``) it prints
``format_timestamp`` (``TIMESTAMP_PRETTY``), or with ``--utc`` ``format_timestamp_style(...,
TIMESTAMP_UTC)``; ``src/basic/time-util.c`` ``format_timestamp_style`` writes the English weekday,
``" %Y-%m-%d %H:%M:%S"``, the microseconds only for ``TIMESTAMP_US``/``TIMESTAMP_US_UTC`` (so never
here), then ``" UTC"`` for the UTC styles or ``" "`` and ``tm_zone``, the local zone's abbreviation.
Older systemd wrote ``strftime("%a %Y-%m-%d %H:%M:%S %Z")``: the locale's weekday, and ``GMT``
under ``--utc`` (gmtime's zone). ``output_short`` then writes ``" %s"`` the hostname unless
``--no-hostname``, ``" %s"`` the identifier, ``"[%s]"`` its pid and ``": "``.
"""

from __future__ import annotations

import time

import pytest

from producers.kmsg import KernelLog, KmsgFileSource, parse_line, parse_pci_map
from tests.unit.producers.kmsg_factories import PCI_MAP, XID, XID_13, XID_79, val, write

NIC_DOWN = "mlx5_core 0000:3b:00.0 ens1f0np0: Link down"  # mlx5e en_main.c, as test_producer_kmsg_fabric.py
AER = "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5"  # as test_producer_kmsg_fabric.py
UTC_0 = 1796157005.0  # Tue 2026-12-01 20:30:05 UTC


def local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))


@pytest.fixture
def new_york(monkeypatch):
    """The process's local zone away from UTC (a POSIX TZ rule: no tzdata needed), so that a time
    read as local and one read as UTC differ."""
    monkeypatch.setenv("TZ", "EST5EDT,M3.2.0,M11.1.0")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_short_full_with_utc_is_read_in_utc_with_its_host():
    # Before: no layout matched, so the XID took the file's mtime and no host.
    for zone in ("UTC", "GMT"):  # --utc: "UTC" today, gmtime's "GMT" in older systemd
        ln = parse_line(f"Tue 2026-12-01 20:30:05 {zone} node7 kernel: {XID_79}")
        assert (ln.msg, ln.ts, ln.host, ln.error) == (XID_79, UTC_0, "node7", None), zone
        assert ln.wall_us is None and ln.boot is None and not ln.yearless  # seconds only: no identity


def test_short_full_in_a_local_zone_is_read_as_local_time(new_york):
    # An abbreviation is no reliable offset ("IST", "CST" name several): read as local time, as
    # the zone-less layouts are; UTC stays UTC whatever the local zone.
    ln = parse_line(f"Fri 2020-01-10 12:30:00 CET node7 kernel: {XID_79}")
    assert (ln.msg, ln.ts, ln.host) == (XID_79, local("2020-01-10 12:30:00"), "node7")
    assert ln.ts == 1578677400.0  # 12:30 in New York (EST, UTC-5)
    ln = parse_line(f"Tue 2026-12-01 20:30:05 UTC node7 kernel: {XID_79}")
    assert ln.ts == UTC_0
    for zone in ("EST", "ChST"):  # tzdata's letter abbreviations
        ln = parse_line(f"Tue 2026-12-01 20:30:05 {zone} node7 kernel: {XID_79}")
        assert (ln.msg, ln.ts, ln.host) == (XID_79, local("2026-12-01 20:30:05"), "node7"), zone
    # tzdata's numeric abbreviations are the offset itself: read exactly (found in review).
    for zone, offset in (("+04", 4 * 3600), ("-0330", -(3 * 3600 + 1800))):
        ln = parse_line(f"Tue 2026-12-01 20:30:05 {zone} node7 kernel: {XID_79}")
        assert ln.ts == UTC_0 - offset, zone
    ln = parse_line(f"Fr 2020-01-10 12:30:00 CET node7 kernel: {XID_79}")  # an older systemd's German weekday
    assert (ln.msg, ln.ts, ln.host) == (XID_79, local("2020-01-10 12:30:00"), "node7")


def test_short_full_without_hostname_and_another_programs_line():
    ln = parse_line(f"Tue 2026-12-01 20:30:05 UTC kernel: {NIC_DOWN}")  # --no-hostname
    assert (ln.msg, ln.ts, ln.host, ln.error) == (NIC_DOWN, UTC_0, None, None)
    # A monitor re-logging the kernel's line: its time counts, its message is not the kernel's.
    for text in (
        f"Tue 2026-12-01 20:30:05 UTC node7 gpud[88]: {XID_79}",
        f"Tue 2026-12-01 20:30:05 UTC node7 syslog-health-monitor: kernel: {XID_79}",
        f"Tue 2026-12-01 20:30:05 UTC gpud[88]: {XID_79}",
    ):  # and with --no-hostname
        ln = parse_line(text)
        assert (ln.msg, ln.ts, ln.error) == ("", UTC_0, None), text
        assert ln.host == (None if "UTC gpud" in text else "node7"), text


def test_a_short_full_file_gives_xids_their_time_and_host_and_counts_nic_and_aer_lines(tmp_path):
    # Before: both XIDs took the file's mtime with this host's name, and the NIC and AER lines
    # (which must start the message) were not counted.
    lines = [
        f"Tue 2026-12-01 20:30:05 UTC node7 kernel: {XID_79}",
        f"Tue 2026-12-01 20:30:06 UTC node7 kernel: {NIC_DOWN}",
        f"Tue 2026-12-01 20:30:07 UTC node7 kernel: {AER}",
        f"Tue 2026-12-01 20:30:08 UTC node7 gpud[88]: {XID_13}",  # a program's quote: not an XID
        f"Tue 2026-12-01 20:30:09 UTC node7 kernel: {XID_13}",
    ]
    p = write(tmp_path, "journal-full.txt", "\n".join(lines) + "\n", mtime=UTC_0 + 86_400)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    got = [(r.ts, r.host, r.gpu, val(r, XID)) for r in src.poll() if "xid.message" in r.labels]
    assert got == [(UTC_0, "node7", 0, 79), (UTC_0 + 4, "node7", 2, 13)]
    s = src.summary()
    assert (s["xid_lines"], s["fabric_lines"], s["lines_without_time"], s["dropped.bad_timestamp"]) == (2, 2, 0, 0)
    kl = KernelLog({}, host="n1")
    assert kl.fabric.classify("node7", parse_line(lines[1]).msg)[0] == "nic_link_down_events"


def test_hostile_short_full_lines_are_their_own_bad_timestamp(tmp_path):
    for text in (
        f"Mon 2026-02-30 20:30:05 UTC node7 kernel: {XID_79}",  # Feb 30, in UTC
        f"Mon 2026-02-30 20:30:05 CET node7 kernel: {XID_79}",  # and as local time
        f"Tue 2025-02-29 20:30:05 UTC node7 kernel: {XID_79}",  # Feb 29 of a common year
        f"Tue ٢٠٢6-12-01 20:30:05 UTC node7 kernel: {XID_79}",  # Arabic-Indic digits
        f"Tue 2026-12-01 20:30:٠٥ CET node7 kernel: {XID_79}",
        f"Tue 2026-13-01 20:30:05 UTC node7 kernel: {XID_79}",
    ):
        ln = parse_line(text)
        assert (ln.msg, ln.ts, ln.error) == (XID_79, None, "bad_timestamp"), text
    text = (
        "\n".join(
            [
                f"Mon 2026-02-30 20:30:05 UTC node7 kernel: {XID_79}",
                f"Tue 2026-12-01 20:30:05 UTC node7 kernel: {XID_13}",
            ]
        )
        + "\n"
    )
    p = write(tmp_path, "bad.txt", text, mtime=UTC_0 + 60)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert [(r.ts, r.gpu, val(r, XID)) for r in src.poll()] == [(UTC_0, 2, 13)]
    assert src.summary()["dropped.bad_timestamp"] == 1


def test_a_60_kb_short_full_line_is_read_whole_and_a_near_miss_is_not_the_layout(tmp_path):
    # Under LINE_MAX (64 KiB), so parsed: the bounded regex reads it in one pass.
    long_xid = XID_79 + " " + "x" * 60_000
    ln = parse_line(f"Tue 2026-12-01 20:30:05 UTC node7 kernel: {long_xid}")
    assert (ln.msg, ln.ts, ln.host) == (long_xid, UTC_0, "node7")
    for text in (
        "Tue 2026-12-01 20:30:05 UTC " + "a" * 60_000,  # no ": " after a tag
        "Tue 2026-12-01 20:30:05 UTC " + "a:" * 30_000,
        "Tue 2026-12-01 20:30:05 UTC " + "a " * 30_000,
        "Tuesday" * 9_000 + " 2026-12-01 20:30:05 UTC node7 kernel: x",  # a weekday past 12 letters
        "Tue 2026-12-01 20:30:05 " + "Z" * 60_000 + " node7 kernel: x",
    ):  # a zone past 10 letters
        ln = parse_line(text)
        assert (ln.ts, ln.host, ln.error) == (None, None, None), text[:40]
    p = write(tmp_path, "long.txt", f"Tue 2026-12-01 20:30:05 UTC node7 kernel: {long_xid}\n", mtime=UTC_0 + 60)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert [(r.ts, r.host, val(r, XID)) for r in src.poll()] == [(UTC_0, "node7", 79)]
    assert src.summary()["dropped.oversize_line"] == 0


@pytest.mark.parametrize(
    "line",
    [
        f"Mar 03 10:00:00 gpud[88]: {XID_79}",  # journalctl -o short --no-hostname
        f"2025-03-03T10:00:00+0000 gpud[88]: {XID_79}",  # -o short-iso --no-hostname
    ],
)
def test_another_programs_line_without_a_host_is_not_the_kernels(line):
    # Found in review: with --no-hostname a health monitor's line quoting an XID was read as a
    # kernel XID (short: at the file's time; short-iso: through dmesg's iso layout, at its time).
    ln = parse_line(line, year=2025)
    assert ln is not None and ln.msg == "" and ln.ts is not None
    # The kernel's own lines in the same layouts, and one with no host or tag at all, still are.
    for kernel in (f"Mar 03 10:00:00 kernel: {XID_79}", f"2025-03-03T10:00:00+0000 kernel: {XID_79}"):
        assert parse_line(kernel, year=2025).msg == XID_79
