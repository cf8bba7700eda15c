"""Kernel logs with hostile lines (#36): a time or code that is not a number, a date that does not
exist, or lines far apart in time cost only themselves; a saved file is sampled around its
events with a cap, so work and memory follow the events, not the span of the log.

``GPUWARDEN_FUZZ_EXAMPLES`` scales the fuzz tests' examples (``factories.fuzz_examples``: 300 by
default, a few seconds in `make test`).
"""

from __future__ import annotations

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.kmsg import QUIET_S, KmsgFileSource, KmsgFollower, parse_pci_map
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import PCI_MAP, XID, XID_119, XID_13, XID_79, FakeReader, dmesg, val, write

FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
MID_2025 = 1_748_779_200.0  # 2025-06-01: syslog lines take this year, which has no Feb 29


def events(recs):
    return [(r.gpu, val(r, XID)) for r in recs if "xid.message" in r.labels]


def test_a_date_that_does_not_exist_or_a_bad_number_costs_only_its_line(tmp_path):
    # Before: strptime/fromisoformat raised ValueError for Feb 29 of 2025 or month 13, int("²")
    # and a 400-digit usec / 1e6 raised, and poll() lost every XID of the file (exit 0).
    bad = [
        f"Feb 29 10:00:00 n1 kernel: {XID_119}",                     # syslog, read in 2025
        f"[Sat Feb 29 10:00:00 2025] {XID_119}",                     # dmesg -T
        f"2025-13-01T10:00:00+0000 n1 kernel: {XID_119}",            # short-iso, month 13
        json.dumps({"__REALTIME_TIMESTAMP": "²", "MESSAGE": XID_119}),
        json.dumps({"__REALTIME_TIMESTAMP": "1" * 400, "MESSAGE": XID_119}),
        f"6,1,{'1' * 400},-;{XID_119}",                              # /dev/kmsg usec of 400 digits
        f"6,1,٣,-;{XID_119}",                                        # a Unicode digit
        f"[{'9' * 400}.000000] {XID_119}",                           # float(): inf
        f"[Mon Jun ٠٢ 10:00:00 2025] {XID_119}",                     # strptime reads Unicode digits
    ]
    good = [f"Jun 01 10:00:00 n1 kernel: {XID_79}", f"[Sun Jun  1 10:00:05 2025] {XID_13}"]
    p = write(tmp_path, "mixed.log", "\n".join(good[:1] + bad + good[1:]) + "\n", mtime=MID_2025)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", sample=False)
    assert events(src.poll()) == [(0, 79), (2, 13)]
    s = src.summary()
    assert s["dropped.bad_timestamp"] == len(bad) and s["lines"] == len(bad) + 2


def test_a_code_that_is_not_one_is_an_unparsable_xid(tmp_path):
    # Before: "٣" read as XID 3 and a 400-digit code went out as the gauge's value.
    lines = [XID_79.replace(": 79,", ": ٣,"), XID_79.replace(": 79,", ": " + "7" * 400 + ","),
             XID_79.replace("(PCI:0000:3b:00)", "(PCI:0000:3b:00 GPU-I:" + "5" * 400 + ")"), XID_13]
    p = write(tmp_path, "dmesg.txt", "\n".join(f"[{1000 + i}.000000] {m}" for i, m in enumerate(lines)) + "\n")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False)
    assert events(src.poll()) == [(2, 13)] and src.summary()["dropped.unparsable_xid"] == 3


def test_lines_far_apart_or_at_an_infinite_time_do_not_build_a_sample_per_interval(tmp_path):
    # Before: one snapshot per interval from the first XID to the last line: 10^8 of them for
    # these two lines (memory ran out), and a line at float("inf") never ended the loop.
    text = dmesg([XID_79]) + f"[{'9' * 400}.000000] {XID_13}\n[999999999.000000] {XID_13}\n"
    p = write(tmp_path, "dmesg.txt", text)
    t0 = time.monotonic()
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, max_sample_records=5_000)
    recs = src.poll()
    assert time.monotonic() - t0 < 30  # a generous 'no hang' bound: it takes well under a second
    assert events(recs) == [(0, 79), (2, 13)] and len(recs) <= 5_000 + 2
    s = src.summary()
    assert s["dropped.bad_timestamp"] == 1 and s["samples_capped"] > 0
    assert [r.ts for r in recs if r.gpu == 2][-1] == 999999999.0  # the capped samples do not hide the event


def test_a_week_on_eight_gpus_samples_around_events_and_keeps_every_xid(tmp_path):
    # Before: 60,480 snapshots x 8 GPUs = 483,840 records for a week of dmesg at --interval 10,
    # all held in memory (and in the send buffer, which dropped the oldest, XIDs among them).
    pci = "index, pci.bus_id\n" + "".join(f"{g}, 00000000:{0x10 + g:02X}:00.0\n" for g in range(8))
    week, lines = 7 * 86400, []
    xids = {2 * 86400: 0x13, 5 * 86400: 0x15}
    for t in range(0, week, 60):  # a line a minute of kernel noise
        lines.append(f"[{t:12.6f}] eth0: link is up")
        if t in xids:
            lines.append(f"[{t:12.6f}] NVRM: Xid (PCI:0000:{xids[t]:02x}:00): 79, pid=1, name=x, fallen off the bus")
    p = write(tmp_path, "week.txt", "\n".join(lines) + "\n")
    src = KmsgFileSource(str(p), parse_pci_map(pci), host="n1", boot_time=0.0, interval_s=10)
    recs = src.poll()
    assert events(recs) == [(3, 79), (5, 79)]
    assert len(recs) < 30_000 and src.summary()["samples_capped"] == 0
    ts = sorted({r.ts for r in recs})
    assert max(b - a for a, b in zip(ts, ts[1:])) <= QUIET_S  # no stretch the engine would call silent
    assert week - 60 - QUIET_S < ts[-1] <= week - 60  # sampled to the log's last line


def test_a_follower_counts_a_bad_time_and_keeps_the_rest():
    r = FakeReader()
    r.batches = [[f"3,100,{'9' * 400},-;{XID_79}", f"4,101,{10_005 * 1_000_000},-;{XID_13}"]]
    f = KmsgFollower(r, parse_pci_map(PCI_MAP), host="n1", clock=lambda: 1_800_000_000.0, boot_time=1_799_990_000.0)
    assert events(f.poll()) == [(2, 13)] and f.summary()["dropped.bad_timestamp"] == 1


NUM = st.sampled_from(["0", "12", "1.5", "²", "٣", "9" * 400, "1e400", "inf", "-1", ""])
HOSTILE = st.one_of(
    st.text(max_size=80),
    st.builds(lambda n, m: f"[{n}.{m}] NVRM: Xid (PCI:0000:3b:00): {m}, x", NUM, NUM),
    st.builds(lambda n, c: f"6,{n},{n},-;NVRM: Xid (PCI:0000:5e:00): {c}, pid=1, name=y, z", NUM, NUM),
    st.builds(lambda d, c: f"{d} 10:00:00 n1 kernel: nvidia-nvswitch0: SXid (PCI:0000:c1:00.0): {c}, Fatal, x",
              st.sampled_from(["Feb 29", "Feb 30", "Jan 01", "Xyz 01", "Jan ٠١"]), NUM),
    st.builds(lambda y, mo: f"{y}-{mo}-01T00:00:00Z n1 kernel: {XID_13}", st.sampled_from(["2025", "0000", "9999", "٢٠٢٥"]),
              st.sampled_from(["01", "02", "13", "00"])),
    st.builds(lambda ts, msg: json.dumps({"__REALTIME_TIMESTAMP": ts, "MESSAGE": msg, "_HOSTNAME": "n1"}),
              st.one_of(NUM, st.integers(), st.none(), st.floats()), st.one_of(st.text(max_size=20), st.just(XID_119))),
    st.integers(1, 3000).map(lambda n: "{" + "[" * n),
)


@FUZZ
@given(st.lists(st.tuples(st.booleans(), HOSTILE), max_size=10))
def test_fuzz_arbitrary_lines_among_good_ones(tmp_path_factory, lines):
    d = tmp_path_factory.mktemp("kmsg")
    body = []
    for i, (good, hostile) in enumerate(lines):
        body.append(f"[{1000 + i:12.6f}] NVRM: Xid (PCI:0000:86:00): 13, pid={700 + i}, name=t, e" if good
                    else hostile.replace("\n", " ").replace("\r", " "))
    p = write(d, "log.txt", "\n".join(body) + "\n", mtime=MID_2025)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, max_sample_records=300)
    recs = src.poll()
    pids = {r.labels.get("xid.pid") for r in recs if r.gpu == 2}
    assert {str(700 + i) for i, (good, _) in enumerate(lines) if good} <= pids  # every good line kept
    assert len(recs) <= 300 + len(lines) * 5  # samples capped; an SXid's event snapshot is per GPU
    s = src.summary()  # every line read; each XID/SXid line sent, or dropped by reason
    assert s["lines"] == max(len(body), 1)  # an empty log is one empty line
    events_in = sum(1 for line in body if "NVRM: Xid" in line or "SXid" in line)
    assert s["xid_lines"] + s["sxid_lines"] + s["dropped.unparsable_xid"] + s["dropped.bad_timestamp"] >= events_in


def test_journalctl_lines_are_read_in_bounded_pieces(tmp_path):
    # Before: the reader thread iterated journalctl's stdout line by line, however long a line was.
    import stat as st_mode

    from producers.kmsg import LINE_MAX, JournalReader

    fake = tmp_path / "journalctl"
    good = json.dumps({"__REALTIME_TIMESTAMP": "1800000000000000", "MESSAGE": XID_13})
    fake.write_text(f"#!/bin/sh\nhead -c {3 * LINE_MAX} /dev/zero | tr '\\\\0' x\necho\necho '{good}'\nsleep 5\n")
    fake.chmod(fake.stat().st_mode | st_mode.S_IXUSR)
    rd = JournalReader(str(fake))
    try:
        got: list[str] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = rd.read()
            time.sleep(0.05)
        assert [json.loads(x)["MESSAGE"] for x in got] == [XID_13] and rd.stats.oversize == 1
    finally:
        rd.close()
