"""A saved kernel log holding two copies of the same boot (``dmesg > k.log; journalctl -k -b >> k.log``,
or a support bundle with both) counts each kernel record once, and a journal export's program
entries are not the kernel's.

Sources of what the copies share:

- The kernel's time of a record, microseconds since boot: ``/dev/kmsg``'s third field, which util-linux
  ``sys-utils/dmesg.c`` (master at 01a424f5, ``print_record``) prints as ``"[%5ld.%06ld] "``;
  systemd ``src/journal/journald-kmsg.c`` (main, ``dev_kmsg_record``) stores the same number as
  ``_SOURCE_MONOTONIC_TIMESTAMP`` (and sets ``_TRANSPORT=kernel``), which ``src/shared/logs-show.c``
  (main at 002951ce, ``get_display_timestamp``) prints for ``-o short-monotonic``; rsyslog's kern.log
  keeps the kernel's ``[secs]`` after ``kernel:``.
- The journal entry's time (``__REALTIME_TIMESTAMP``, journald's time of receipt, not the
  kernel's): ``-o short-precise``, ``short-iso-precise``, ``short-unix`` and json print it to the
  microsecond; ``-o short`` only to the second, which is no identity (see the last test).
- The driver prints the same XID line again for every new event (open-gpu-kernel-modules 595.45.04,
  ``kernel_rc.c``, ``krcReportXid``): a new record, at its own microsecond.
"""

from __future__ import annotations

import json

from producers.kmsg import KmsgFileSource, parse_line, parse_pci_map
from tests.unit.producers.kmsg_factories import PCI_MAP, XID, XID_13, XID_79, val, write

BOOT = 1_800_000_000.0  # the boot's epoch (--boot-time)
LAG_US = 3_000  # journald receives a kernel record a few milliseconds after the kernel stamps it


def events(recs):
    return [(r.ts, r.host, r.gpu, val(r, XID)) for r in recs if "xid.message" in r.labels]


def journal_json(mono_us, msg, host="gpu-7", **extra):
    entry = {
        "__REALTIME_TIMESTAMP": str(int(BOOT * 1e6) + mono_us + LAG_US),
        "_HOSTNAME": host,
        "_SOURCE_MONOTONIC_TIMESTAMP": str(mono_us),
        "_TRANSPORT": "kernel",
        "MESSAGE": msg,
    }
    return json.dumps({**entry, **extra})


# Two XID 13 events on one GPU in the same second (the driver prints the same line for each),
# then an XID 79: kernel times in microseconds since boot.
BOOT_LOG = [(1_000_000_200, XID_13), (1_000_400_900, XID_13), (1_002_000_000, XID_79)]


def test_a_dmesg_capture_and_a_journal_export_of_the_same_boot_count_each_xid_once(tmp_path):
    # Before: every XID was counted twice (the dmesg copy at --boot-time + secs, the journal's at
    # its own time), and each copy of the two genuine XID 13s was a record of its own.
    dmesg = [f"[{us // 1_000_000:5d}.{us % 1_000_000:06d}] {m}" for us, m in BOOT_LOG]
    mono = [f"[{us // 1_000_000:5d}.{us % 1_000_000:06d}] gpu-7 kernel: {m}" for us, m in BOOT_LOG]
    jsn = [journal_json(us, m) for us, m in BOOT_LOG]
    wall = [BOOT + (us + LAG_US) / 1e6 for us, _ in BOOT_LOG]  # the journal's time: kept over a placed one
    placed = [BOOT + us / 1e6 for us, _ in BOOT_LOG]
    for name, lines, ts in (
        ("json", dmesg + jsn, wall),
        ("json-first", jsn + dmesg, wall),
        ("short-monotonic", dmesg + mono, placed),
    ):
        p = write(tmp_path, f"{name}.log", "\n".join(lines) + "\n")
        src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), boot_time=BOOT, sample=False)
        got = events(src.poll())
        assert [(g, x) for _, _, g, x in got] == [(2, 13), (2, 13), (0, 79)], name  # the repeat stays
        assert [t for t, _, _, _ in got] == ts, name
        assert {h for _, h, _, _ in got} == {"gpu-7"}, name  # the journal names the host
        s = src.summary()
        assert (s["xid_lines"], s["duplicate_lines"], s["records"]) == (6, 3, 3), name


def test_rsyslogs_kern_log_and_dmesg_share_the_kernels_time(tmp_path):
    # Ubuntu's /var/log/kern.log (rsyslog imklog) keeps the kernel's "[secs]" after "kernel:";
    # before, it was skipped, so a bundle with kern.log and dmesg counted each XID twice.
    kern = f"Mar  3 10:00:00 n1 kernel: [ 1000.000200] {XID_79}"
    text = f"[ 1000.000200] {XID_79}\n{kern}\n[ 1000.000300] {XID_79}\n"
    p = write(tmp_path, "bundle.log", text, mtime=BOOT)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), boot_time=BOOT, sample=False)
    recs = src.poll()
    assert len(events(recs)) == 2 and src.summary()["duplicate_lines"] == 1
    assert parse_line(kern, year=2027).mono_us == 1_000_000_200


def test_overlapping_journal_exports_to_the_microsecond_are_read_once(tmp_path):
    # "journalctl -k --since -1h -o short-precise >> k.log" every 30 minutes: each entry twice,
    # at the journal's own microsecond. Before: both copies counted.
    lines = [f"2027-01-15T08:00:00.{us:06d}+00:00 n1 kernel: {XID_13}" for us in (100, 200)]
    unix = f"1800000000.000300 n1 kernel: {XID_79}"
    p = write(tmp_path, "k.log", "\n".join(lines + [unix] + lines + [unix]) + "\n")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert [(g, x) for _, _, g, x in events(src.poll())] == [(2, 13), (2, 13), (0, 79)]
    assert src.summary()["duplicate_lines"] == 3


def test_another_hosts_record_at_the_same_kernel_time_is_not_a_copy(tmp_path):
    p = write(
        tmp_path,
        "two.json",
        journal_json(1_000_000_200, XID_79, host="a") + "\n" + journal_json(1_000_000_200, XID_79, host="b") + "\n",
    )
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert sorted(h for _, h, _, _ in events(src.poll())) == ["a", "b"]
    assert src.summary()["duplicate_lines"] == 0


def test_second_resolution_copies_are_no_identity_and_stay_two(tmp_path):
    # journalctl -o short prints journald's time of receipt to the second, dmesg the kernel's
    # time since boot: no shared identity, and two XIDs with the same text in the same second are
    # common. Such copies are both counted (docs/producers.md#kernel-log); this pins that.
    text = f"[ 1000.000200] {XID_79}\nJan 15 08:00:00 n1 kernel: {XID_79}\n"
    p = write(tmp_path, "k.log", text, mtime=BOOT)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), boot_time=BOOT, sample=False)
    assert len(events(src.poll())) == 2 and src.summary()["duplicate_lines"] == 0


def test_a_journal_exports_program_entry_quoting_an_xid_is_not_the_kernels(tmp_path):
    # journalctl -o json without -k holds every program's entries; a health monitor re-logging the
    # kernel's line (NVIDIA/NVSentinel#1270) has _TRANSPORT=syslog/stdout, journald-kmsg.c sets
    # "kernel" on the kernel's own. Before: the quote was a second XID 79.
    quote = json.dumps(
        {
            "__REALTIME_TIMESTAMP": "1800000005000000",
            "_HOSTNAME": "n1",
            "_TRANSPORT": "stdout",
            "SYSLOG_IDENTIFIER": "gpud",
            "MESSAGE": f"kernel: [ 1000.000200] {XID_79}",
        }
    )
    p = write(tmp_path, "all.json", journal_json(1_000_000_200, XID_79, host="n1") + "\n" + quote + "\n")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False)
    assert [(h, g, x) for _, h, g, x in events(src.poll())] == [("n1", 0, 79)]
    s = src.summary()
    assert (s["xid_lines"], s["lines_without_time"]) == (1, 0)


def test_three_copies_make_one_record_in_any_order(tmp_path):
    # Found in review: a dmesg copy (kernel time only) and a short-iso-precise one (journal time
    # only) before the json copy (both) stayed two records; four of the six orders gave one.
    import datetime
    import itertools

    out = []
    for us, m in BOOT_LOG:
        at = datetime.datetime.fromtimestamp(BOOT, datetime.timezone.utc) + datetime.timedelta(microseconds=us + LAG_US)
        out.append({
            "dmesg": f"[{us // 1_000_000:5d}.{us % 1_000_000:06d}] {m}",
            "precise": at.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00") + f" gpu-7 kernel: {m}",
            "json": journal_json(us, m),
        })  # fmt: skip
    for order in itertools.permutations(["dmesg", "precise", "json"]):
        p = write(tmp_path, "k.log", "\n".join(rec[name] for name in order for rec in out) + "\n")
        src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), boot_time=BOOT, sample=False)
        got = events(src.poll())
        assert [(g, x) for _, _, g, x in got] == [(2, 13), (2, 13), (0, 79)], order
        s = src.summary()
        assert (s["xid_lines"], s["duplicate_lines"], s["records"]) == (9, 6, 3), order


def test_a_chain_of_merged_copies_is_read_in_linear_time(tmp_path):
    # Found in review: copies that each merged the record kept before into a new one built a chain
    # walked from its far end for every line (32,000 pairs: 12.7 s); the walk now shortens it.
    from tests.fleet_factories import no_hang

    lines = []
    for i in range(1, 64_001):
        lines.append(f"[{i}.000000] {XID_79}")
        lines.append(journal_json(i * 1_000_000, XID_79, __REALTIME_TIMESTAMP=str(int(BOOT * 1e6))))
    p = write(tmp_path, "chain.log", "\n".join(lines) + "\n")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), boot_time=BOOT, sample=False)
    with no_hang(30):
        src.poll()
    assert src.summary()["duplicate_lines"] == 128_000 - 1
