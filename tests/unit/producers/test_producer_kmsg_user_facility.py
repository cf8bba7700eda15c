"""A line a program wrote to ``/dev/kmsg`` is not the kernel's, in every layout that shows its
facility (docs/producers.md#kernel-log).

``echo 'NVRM: Xid (PCI:0000:3b:00): 79, ...' > /dev/kmsg`` (root, or a container given /dev/kmsg)
was read as a real XID 79, which drains the node. The kernel tells the two apart:

- Linux ``kernel/printk/printk.c`` ``devkmsg_write``: a written record gets facility LOG_USER (1),
  or the nonzero facility its ``<N>`` prefix names (``LOG_FACILITY(u) = u >> 3 & 0xff``): never
  0 (LOG_KERN), the kernel's own. ``info_print_ext_header`` prints ``(facility << 3) | level`` as
  ``/dev/kmsg``'s first field, ``info_print_prefix`` the same as the syslog(2) buffer's ``<N>``.
- util-linux ``sys-utils/dmesg.c`` (master at 39465c78): ``print_record`` prints ``-r``'s
  ``"<%d>[%5ld.%06ld] "`` with ``LOG_RAW_FAC_PRI(fac, pri) ((fac << 3) | pri)`` -- the combined
  value, the facility as ``parse_faclev`` read it (glibc ``LOG_FAC``, -1 for one past the name
  table, so ``<-8>``..``<-1>``); ``-x`` prints ``facility_names`` (``kern``, ``user``, ...,
  ``ftp``, ``res0``-``res3``, ``local0``-``local7``) and ``level_names`` as ``"%-6s:%-6s: "``.
- systemd ``src/journal/journald-kmsg.c`` ``dev_kmsg_record``: ``_TRANSPORT=kernel`` on every
  record read from /dev/kmsg, ``SYSLOG_FACILITY=%i`` of ``LOG_FAC(priority)`` (current main; older
  releases set it only for a facility other than LOG_KERN), ``SYSLOG_IDENTIFIER=kernel`` for
  LOG_KERN, else the identifier parsed from the message (``syslog_parse_identifier``): a program
  that writes ``kernel: NVRM: Xid ...`` gets ``SYSLOG_IDENTIFIER=kernel`` and ``MESSAGE=NVRM: Xid``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.kmsg import KernelLog, KmsgFileSource, KmsgFollower, parse_line, parse_pci_map
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import PCI_MAP, XID, XID_79, FakeReader, val, write

BOOT = 1_800_000_000.0
USER = 1  # LOG_USER: what devkmsg_write gives a line written without a facility
WARN = 4  # default_message_loglevel: the level of `echo ... > /dev/kmsg`
# util-linux dmesg.c facility_names, by facility number (dmesg -x)
FACILITY_NAMES = ["kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv",
                  "ftp", "res0", "res1", "res2", "res3"] + [f"local{i}" for i in range(8)]  # fmt: skip
LEVEL_NAMES = ["emerg", "alert", "crit", "err", "warn", "notice", "info", "debug"]


def kmsg(fac: int, lev: int, msg: str = XID_79) -> str:
    return f"{fac * 8 + lev},812,1000000200,-;{msg}"


def dmesg_r(fac: int, lev: int, msg: str = XID_79) -> str:
    return f"<{fac * 8 + lev}>[ 1000.000200] {msg}"


def dmesg_x(fac: int, lev: int, msg: str = XID_79) -> str:
    return f"{FACILITY_NAMES[fac]:<6}:{LEVEL_NAMES[lev]:<6}: [ 1000.000200] {msg}"


def journal_json(fac: int | None, lev: int, msg: str = XID_79) -> str:
    """journalctl -o json of a /dev/kmsg record (``fac`` None: a systemd that sets no facility on
    the kernel's own); a program's line carries the identifier it wrote (``kernel: NVRM: ...``)."""
    entry = {
        "__REALTIME_TIMESTAMP": str(int(BOOT * 1e6) + 1_000_003_200),
        "_HOSTNAME": "n1",
        "_SOURCE_MONOTONIC_TIMESTAMP": "1000000200",
        "_TRANSPORT": "kernel",
        "PRIORITY": str(lev),
        "SYSLOG_IDENTIFIER": "kernel",
        "MESSAGE": msg,
    }
    if fac is not None:
        entry["SYSLOG_FACILITY"] = str(fac)
    return json.dumps(entry)


LAYOUTS = {"/dev/kmsg": kmsg, "dmesg -r": dmesg_r, "dmesg -x": dmesg_x, "journalctl -o json": journal_json}


def xids_of_file(tmp_path, text: str) -> tuple[list[int], dict[str, int]]:
    """The XID codes ``produce kmsg --file`` sends for ``text``, and its exit summary."""
    p = write(tmp_path, "k.log", text + "\n", mtime=BOOT + 2000)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=BOOT, sample=False)
    return [val(r, XID) for r in src.poll() if "xid.message" in r.labels], src.summary()


def xids_of_line(text: str) -> list[int]:
    """The XID codes ``KernelLog.apply`` makes of one parsed line."""
    ln = parse_line(text)
    return [] if ln is None else [val(r, XID) for r in KernelLog(parse_pci_map(PCI_MAP), host="n1").apply(ln, BOOT)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_line_a_program_wrote_to_dev_kmsg_is_no_xid_where_the_layout_shows_its_facility(tmp_path, layout):
    # Before: each was an XID 79 on GPU 0 (the json copy too: _TRANSPORT=kernel was all it read).
    make = LAYOUTS[layout]
    assert xids_of_file(tmp_path, make(0, 3))[0] == [79], layout  # the kernel's own: KERN_ERR
    got, summary = xids_of_file(tmp_path, make(USER, WARN))
    assert got == [] and summary["xid_lines"] == 0, layout
    assert (summary["lines"], summary["dropped.bad_timestamp"], summary["lines_without_time"]) == (1, 0, 0), layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_programs_line_keeps_its_time_and_host_but_not_its_message(layout):
    # As a program's syslog line: its time still moves a follower's clock, nothing else is read.
    ln = parse_line(LAYOUTS[layout](USER, WARN))
    assert ln is not None and ln.msg == "" and ln.error is None, layout
    assert (ln.boot, ln.ts) in ((1000.0002, None), (None, BOOT + 1000.0032)), layout
    assert ln.host in (None, "n1"), layout


def test_a_follower_of_dev_kmsg_sends_no_xid_for_a_written_line_and_one_for_the_kernels():
    r = FakeReader()
    now = [BOOT + 2000.0]
    r.batches = [[], [kmsg(USER, WARN, XID_79)], [kmsg(0, 3, XID_79)]]
    f = KmsgFollower(r, parse_pci_map(PCI_MAP), host="n1", sample=False, clock=lambda: now[0], boot_time=BOOT + 1000)
    f.poll()  # the (empty) backlog
    assert [x for x in f.poll() if "xid.message" in x.labels] == []
    got = [(x.gpu, val(x, XID)) for x in f.poll() if "xid.message" in x.labels]
    assert got == [(0, 79)]
    assert (f.summary()["xid_lines"], f.summary()["lines"]) == (1, 2)


def test_a_written_line_with_a_facility_of_its_own_is_no_xid_in_dmesg_x():
    # `logger --kmsg`-style writes name a facility: each of dmesg's names but "kern" is a program's.
    # Before: "res0".."res3" (facilities 12-15) matched no prefix and the line was a bare XID.
    for fac, name in enumerate(FACILITY_NAMES[1:], 1):
        assert xids_of_line(dmesg_x(fac, 6)) == [], name
    assert xids_of_line(dmesg_x(0, 6)) == [79]


def test_an_older_journal_without_syslog_facility_on_the_kernels_records_is_still_the_kernels(tmp_path):
    # systemd before SYSLOG_FACILITY on every record set it only for a facility other than LOG_KERN.
    assert xids_of_file(tmp_path, journal_json(None, 3))[0] == [79]
    assert xids_of_line(journal_json(USER, WARN)) == []


def test_the_journals_short_and_json_views_of_a_written_line_agree_it_is_a_programs():
    # journald parses "gpud[88]: ..." (and the echo's "NVRM: Xid ...") as a program's identifier
    # and pid; -o short prints it as the program's tag, read as a program's line already (no
    # change). Its json view said _TRANSPORT=kernel, and was an XID before.
    for text in (
        f"Dec 01 20:30:05 n1 gpud[88]: {XID_79}",
        f"Dec 01 20:30:05 gpud[88]: {XID_79}",
        "Dec 01 20:30:05 n1 NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        f"2026-12-01T20:30:05.000200+00:00 n1 gpud[88]: {XID_79}",
    ):
        ln = parse_line(text, year=2026)
        assert ln is not None and ln.msg == "" and ln.ts is not None, text
        assert xids_of_line(text) == [], text
    entry = json.loads(journal_json(USER, WARN))
    entry.update(SYSLOG_IDENTIFIER="gpud", SYSLOG_PID="88")
    assert xids_of_line(json.dumps(entry)) == []


@pytest.mark.parametrize("level", range(8))
def test_only_the_kernels_own_line_is_an_xid_at_every_level(level):
    # LOG_KERN at any level (0-7) is the kernel's; the same level written by a program is not.
    for layout in ("/dev/kmsg", "dmesg -r", "dmesg -x", "journalctl -o json"):
        assert xids_of_line(LAYOUTS[layout](0, level)) == [79], (layout, level)
        assert xids_of_line(LAYOUTS[layout](USER, level)) == [], (layout, level)
    assert parse_line(dmesg_r(0, level)).mono_us == 1_000_000_200  # still one record with its copies


@pytest.mark.parametrize(
    "prefix",
    ["<99999999999>", "<" + "9" * 5000 + ">", "<-2>", "<-8>", "<٣>", "<²>", "<>", "< 6>", "<6 >", "<0x6>", "<8>"],
)
def test_a_hostile_dmesg_r_priority_is_a_programs_line_and_no_crash(prefix):
    # Before: any prefix but "<N>" of 1-4 digits matched no layout, so the line was a bare kernel
    # message and its XID counted (with no time); "<8>" and up were the kernel's.
    ln = parse_line(f"{prefix}[ 1000.000200] {XID_79}")
    assert ln is not None and (ln.msg, ln.boot, ln.error) == ("", 1000.0002, None), prefix
    assert xids_of_line(f"{prefix}[ 1000.000200] {XID_79}") == [], prefix


@pytest.mark.parametrize("pri", ["99999999999", "9" * 5000, "-1", "٣", "2047", "1030"])
def test_a_hostile_dev_kmsg_priority_is_a_programs_line_and_no_crash(pri):
    # 1030: facility 128, which dmesg's 7-bit LOG_FAC would show as "kern"; /dev/kmsg shows it.
    text = f"{pri},812,1000000200,-;{XID_79}"
    ln = parse_line(text)
    assert ln is not None and (ln.msg, ln.boot, ln.error) == ("", 1000.0002, None), pri
    assert xids_of_line(text) == [], pri


@pytest.mark.parametrize("fac", ["1", "3", 1, "abc", ["0", "1"], "", "00", False, 0.0])
def test_a_journal_entrys_facility_is_the_kernels_only_when_it_says_0(fac):
    entry = json.loads(journal_json(0, 3))
    entry["SYSLOG_FACILITY"] = fac
    assert xids_of_line(json.dumps(entry)) == [], repr(fac)
    entry["SYSLOG_FACILITY"] = 0  # a hand-made export's number
    assert xids_of_line(json.dumps(entry)) == [79]


def test_the_syslog2_buffers_untimed_priority_shows_the_facility_too():
    # dmesg -S -r (the kernel's syslog(2) buffer) with printk.time off: "<N>" and the message.
    assert xids_of_line(f"<{USER * 8 + WARN}>{XID_79}") == []
    assert xids_of_line(f"<-2>{XID_79}") == []
    assert xids_of_line(f"<3>{XID_79}") == [79]
    assert parse_line(f"<3>{XID_79}").msg == XID_79


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    fac=st.integers(0, len(FACILITY_NAMES) - 1),
    lev=st.integers(0, 7),
)
def test_the_kernels_line_is_read_iff_its_facility_is_0(layout, fac, lev):
    assert xids_of_line(LAYOUTS[layout](fac, lev)) == ([79] if fac == 0 else [])
