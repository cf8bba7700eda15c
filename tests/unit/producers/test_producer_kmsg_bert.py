"""Fatal hardware errors of the previous boot: the firmware's Boot Error Record Table (BERT) as the
kernel prints it at boot, counted in ``host_fatal_errors_previous_boot`` (one per fatal CPER record).

Every line is built from torvalds/linux's format strings:

- ``drivers/acpi/apei/bert.c``, ``bert_print_all()`` (pr_fmt ``"BERT: "``):
  ``pr_info_once("Error records from previous boot:\\n")`` before the records (4.19-5.16: before
  the first; 5.17+: inside the loop, still once), 6.0+'s ``pr_info(HW_ERR "Skipped %d error
  records\\n")`` (past ``ACPI_BERT_PRINT_MAX_RECORDS`` / ``_MAX_LEN``), 6.1+'s ``pr_info("Total
  records found: %d\\n")``, ``pr_err(FW_BUG "Invalid error record.\\n")``;
- ``drivers/firmware/efi/cper.c``: ``cper_estatus_print(KERN_INFO HW_ERR, ...)`` (``"%s""event
  severity: %s\\n"``, a corrected record's ``"It has been corrected by h/w and requires no further
  action"`` before it), ``cper_estatus_print_section()`` (prefix plus one space: ``"Error %d, type:
  %s"``, ``"fru_text: %.20s"``, ``cper_print_tstamp()``'s ``"%s%ststamp: ..."``; plus two spaces:
  ``"section_type: memory error"`` / ``"general processor error"`` / ``"PCIe error"``),
  ``cper_print_mem()`` (``"error_status: %s (0x%016llx)"``, ``"physical_address: 0x%016llx"``,
  ``cper_mem_err_location()``'s ``"node:%d card:%d ..."`` -- ``"node: %d card: %d ..."`` before
  5.10 --, ``"error_type: %d, %s"``, ``cper_dimm_err_location()``'s ``"DIMM location: %s %s "``),
  ``cper_print_proc_generic()`` and ``cper_print_pcie()``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.catalog import FIELDS
from producers import kmsg
from producers.kmsg import KmsgFileSource, KmsgFollower, parse_pci_map
from producers.kmsg_fabric import MAX_BERT_DONE, MAX_BERT_RECORDS, FabricEvents
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import PCI_MAP, XID_13, FakeReader, dmesg, produce_and_replay, write

FUZZ = settings(max_examples=fuzz_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
PCI = parse_pci_map(PCI_MAP)
FIELD = "host_fatal_errors_previous_boot"
HW = "[Hardware Error]: "  # HW_ERR; cper_estatus_print()'s prefix under bert.c (no ghes.c "{seq}")
HEADER = "BERT: Error records from previous boot:"
BOOT_1 = "0f2b7c1e-4c1a-4f53-9d7e-2b8f3a6c9e01"  # /proc/sys/kernel/random/boot_id of two boots
BOOT_2 = "7d3e9a40-1b2c-4d5e-8f60-718293a4b5c6"

# cper_estatus_print() of a fatal memory error (6.x: cper_mem_err_location() without spaces).
MEM_FATAL = [
    HW + "event severity: fatal",
    HW + " precise tstamp: 2026-12-01 20:30:05",
    HW + " Error 0, type: fatal",
    HW + " fru_text: Card03, ChnB, DIMM0",
    HW + "  section_type: memory error",
    HW + "  error_status: Storage error in DRAM memory (0x0000000000000400)",
    HW + "  physical_address: 0x0000004a3c5f1000",
    HW + "  node:0 card:3 module:0 rank:1 bank:13 bank_group:3 bank_address:1 device:0 row:38415 column:1016 ",
    HW + "  error_type: 3, multi-bit ECC",
    HW + "  DIMM location: CPU0 DIMM_B1 ",
]
# cper_print_proc_generic() of a fatal processor error.
PROC_FATAL = [
    HW + "event severity: fatal",
    HW + " Error 0, type: fatal",
    HW + "  section_type: general processor error",
    HW + "  processor_type: 0, IA32/X64",
    HW + "  processor_isa: 2, X64",
    HW + "  error_type: 0x01",
    HW + "  cache error",
    HW + "  operation: 0, unknown or generic",
    HW + "  flags: 0x00",
    HW + "  processor_id: 0x0000000000000016",
]
# A corrected record: BERT prints it too, and it is no fatal error.
MEM_CORRECTED = [
    HW + "It has been corrected by h/w and requires no further action",
    HW + "event severity: corrected",
    HW + " Error 0, type: corrected",
    HW + "  section_type: memory error",
    HW + "  physical_address: 0x0000000123456000",
]
# cper_print_pcie() of a fatal PCIe error of GPU 0's bus id (with the AER info a fatal one prints).
PCIE_FATAL = [
    HW + "event severity: fatal",
    HW + " Error 0, type: fatal",
    HW + "  section_type: PCIe error",
    HW + "  port_type: 0, PCIe end point",
    HW + "  version: 3.0",
    HW + "  command: 0x0546, status: 0x4010",
    HW + "  device_id: 0000:3b:00.0",
    HW + "  slot: 0",
    HW + "  secondary_bus: 0x00",
    HW + "  vendor_id: 0x10de, device_id: 0x2330",
    HW + "  class_code: 030200",
    HW + "  aer_uncor_status: 0x00040000, aer_uncor_mask: 0x00000000",
    HW + "  aer_uncor_severity: 0x00062030",
    HW + "  TLP Header: 4a000001 01000004 3b000000 00000000",
]
# 4.19's cper_print_mem(): "error_status: 0x%016llx" and "node: %d card: %d ...".
MEM_FATAL_4_19 = [
    HW + "event severity: fatal",
    HW + " Error 0, type: fatal",
    HW + "  section_type: memory error",
    HW + "  error_status: 0x0000000000000400",
    HW + "  physical_address: 0x0000000f8a3b2000",
    HW + "  node: 1 card: 0 module: 2 rank: 1 bank: 5 row: 4660 column: 40 ",
    HW + "  error_type: 3, multi-bit ECC",
]
# 6.1+: up to 5 records printed, the rest skipped, and the total.
PRINT_6_1 = [HEADER, *MEM_FATAL, *PROC_FATAL, *MEM_CORRECTED]
PRINT_6_1 += ["BERT: [Hardware Error]: Skipped 1 error records", "BERT: Total records found: 4"]


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


def from_file(tmp_path, text, name="k.log"):
    recs = KmsgFileSource(str(write(tmp_path, name, text)), PCI, host="n1", boot_time=0.0, sample=False).poll()
    return recs, [r for r in recs if r.gpu == 0 and "bert.severity" in r.labels]


def last(recs, alias=FIELD):
    """The host's count in its latest record (the last of those at the latest time)."""
    return val(max(enumerate(recs), key=lambda p: (p[1].ts, p[0]))[1], alias)


def test_a_6_1_print_counts_each_fatal_record_once_with_its_section_and_memory_location(tmp_path):
    recs, events = from_file(tmp_path, dmesg(PRINT_6_1, start=2.5, step=0.001))
    assert last(recs) == 2  # the memory and the processor error; the corrected record and the skipped one: no
    mem, proc = (e.labels for e in events)
    assert mem["bert.section"] == "memory error"
    assert (mem["bert.node"], mem["bert.card"], mem["bert.module"], mem["bert.rank"], mem["bert.bank"]) == (
        "0", "3", "0", "1", "13",
    )  # fmt: skip
    assert (mem["bert.row"], mem["bert.column"], mem["bert.physical_address"]) == (
        "38415",
        "1016",
        "0x0000004a3c5f1000",
    )
    assert (mem["bert.error_type"], mem["bert.dimm"]) == ("multi-bit ECC", "CPU0 DIMM_B1")
    assert proc["bert.section"] == "general processor error" and "bert.node" not in proc
    assert [val(e, FIELD) for e in events] == [1, 2]


def test_a_4_19_print_without_a_trailer_ends_with_the_log_and_reads_the_old_location(tmp_path):
    # 4.19-5.16: the header, the records, nothing after them; the log ends (or other lines follow).
    recs, events = from_file(tmp_path, dmesg([HEADER, *MEM_FATAL_4_19, *PROC_FATAL], start=3.0, step=0.001))
    assert last(recs) == 2
    mem = events[0].labels
    assert (mem["bert.node"], mem["bert.module"], mem["bert.bank"], mem["bert.row"]) == ("1", "2", "5", "4660")
    # The print ended by a later line of the host: the records count then, once.
    later = (
        dmesg([HEADER, *MEM_FATAL_4_19], start=3.0, step=0.001)
        + "[   60.000000] mlx5_core 0000:5e:00.0 ens1: Link down\n"
    )
    recs, events = from_file(tmp_path, later, "later.log")
    assert last(recs) == 1 and last(recs, "nic_link_down_events") == 1


def test_a_pcie_record_of_the_previous_boot_counts_there_not_as_this_boots_aer_error(tmp_path):
    recs, events = from_file(tmp_path, dmesg([HEADER, *PCIE_FATAL], start=2.0, step=0.001))
    assert last(recs) == 1 and last(recs, "pcie_aer_log_fatal") == 0
    assert (events[0].labels["bert.section"], events[0].labels["bert.pci"], events[0].labels["bert.gpu"]) == (
        "PCIe error", "0000:3b:00.0", "0",
    )  # fmt: skip
    # The same lines from ghes.c ("{N}" before HW_ERR, no BERT header) are this boot's AER error.
    ghes = [ln.replace(HW, "{3}" + HW) for ln in PCIE_FATAL]
    recs, _ = from_file(tmp_path, dmesg(ghes, start=2.0, step=0.001), "ghes.log")
    assert last(recs) == 0 and last(recs, "pcie_aer_log_fatal") == 1


def test_a_hostile_print_never_double_counts():
    def count(lines, ts_step=0.001):
        ev = FabricEvents()
        got = []
        for i, ln in enumerate(lines):
            got += ev.previous_boot("n1", i * ts_step)
            ev.classify("n1", ln, i * ts_step)
            got += ev.previous_boot("n1")
        return got + ev.previous_boot("n1", end=True)

    # Cut before any severity: nothing to count; cut right after "event severity: fatal": one.
    assert count([HEADER, HW + "  section_type: memory error"]) == []
    assert [d["bert.severity"] for d in count([HEADER, MEM_FATAL[0]])] == ["fatal"]
    # Interleaved with other lines (an XID, a NIC line, a GHES record of this boot): one record.
    mixed = [
        HEADER,
        *MEM_FATAL[:4],
        XID_13,
        "mlx5_core 0000:5e:00.0 ens1: Link down",
        "{1}" + HW + "event severity: corrected",
    ]
    got = count(mixed + MEM_FATAL[4:])
    assert len(got) == 1 and got[0]["bert.row"] == "38415"
    # A record whose "event severity" line is missing: its section's severity decides; two such records are two.
    assert len(count([HEADER, *MEM_FATAL[2:]])) == 1
    assert len(count([HEADER, *MEM_FATAL[2:], *PROC_FATAL[1:]])) == 2
    assert len(count([HEADER, *MEM_FATAL, *PROC_FATAL, *MEM_CORRECTED, *PCIE_FATAL])) == 3
    # Huge numbers: a section number or a field past its digits is no section or field.
    huge = [HEADER, HW + "event severity: fatal", HW + " Error 99999999999, type: fatal", HW + "  section_type: memory error",
            HW + "  node:99999999999999999999 card:0 ", "BERT: [Hardware Error]: Skipped 99999999999999999999 error records"]  # fmt: skip
    got = count(huge)
    assert len(got) == 1 and "bert.node" not in got[0] and got[0]["bert.section"] == "memory error"
    # The bare lines long after a print are no record of it.
    assert count([HEADER, *PROC_FATAL[:0], "x: y"] + [""] * 20_000 + PROC_FATAL, ts_step=0.01) == []
    # Bare records without a BERT header count nothing here (ghes.c always prints "{N}").
    assert count(PROC_FATAL) == []


def test_every_layout_the_producer_reads_counts_the_print_once(tmp_path):
    boot = 1_800_000_000
    us = [3_000_000 + i * 137 for i in range(len(PRINT_6_1))]
    layouts = {
        "dmesg": [f"[{u / 1e6:12.6f}] {m}" for m, u in zip(PRINT_6_1, us)],
        "dev-kmsg": [f"6,{i},{u},-;{m}" for i, (m, u) in enumerate(zip(PRINT_6_1, us))],
        "short-monotonic": [f"[{u / 1e6:12.6f}] n1 kernel: {m}" for m, u in zip(PRINT_6_1, us)],
        "short": [f"Dec 01 20:30:{5 + i // 20:02d} n1 kernel: {m}" for i, m in enumerate(PRINT_6_1)],
        "json": [
            json.dumps(
                {
                    "__REALTIME_TIMESTAMP": str(boot * 10**6 + u),
                    "_SOURCE_MONOTONIC_TIMESTAMP": str(u),
                    "_TRANSPORT": "kernel",
                    "SYSLOG_FACILITY": "0",
                    "_HOSTNAME": "n1",
                    "MESSAGE": m,
                }
            )
            for m, u in zip(PRINT_6_1, us)
        ],  # fmt: skip
    }
    for name, lines in layouts.items():
        recs, events = from_file(tmp_path, "\n".join(lines) + "\n", f"{name}.log")
        assert (last(recs), [e.labels["bert.section"] for e in events]) == (
            2, ["memory error", "general processor error"],
        ), name  # fmt: skip
    # One log holding the dmesg and the journal's copies of one boot: counted once.
    both = layouts["dmesg"] + layouts["short-monotonic"] + layouts["json"]
    recs, _ = from_file(tmp_path, "\n".join(both) + "\n", "both.log")
    assert last(recs) == 2


def follower(reader, marker=None, boot_id=None, boot_id_path=None):
    now = [1_800_000_000.0]
    f = KmsgFollower(reader, PCI, host="n1", sample=False, clock=lambda: now[0], boot_time=now[0] - 86_400,
                     boot_marker=marker, boot_id=boot_id, boot_id_path=boot_id_path)  # fmt: skip
    return f, now


def backlog(lines, first=100):
    """``lines`` as /dev/kmsg records 3 s after boot: the ring buffer a follower reads first."""
    return [f"6,{first + i},{3_000_000 + i * 150},-;{m}" for i, m in enumerate(lines)]


def run(f, now, batches):
    f.reader.batches = list(batches)
    recs = []
    for _ in range(len(batches) + 2):
        recs += f.poll()
        now[0] += 10
    return recs


def test_a_follower_counts_the_backlogs_print_once_and_a_restart_within_the_boot_not_again(tmp_path):
    marker = str(tmp_path / "bert-boot")
    ring = backlog([HEADER, *MEM_FATAL, XID_13, *PROC_FATAL])
    f, now = follower(FakeReader(), marker, BOOT_1)
    recs = run(f, now, [ring])
    events = [r for r in recs if r.gpu == 0 and "bert.severity" in r.labels]
    assert [e.labels["bert.section"] for e in events] == ["memory error", "general processor error"]
    assert f.log.fabric.counts("n1")[FIELD] == 2 and f.summary()["backlog_events"] == 1  # the XID: state
    assert all(e.ts >= f.started for e in events)  # news now, not at the boot's time
    assert (tmp_path / "bert-boot").read_text().strip() == BOOT_1
    # The producer restarted within the boot reads the same ring buffer: nothing again.
    g, now = follower(FakeReader(), marker, BOOT_1)
    run(g, now, [ring])
    assert g.log.fabric.counts("n1")[FIELD] == 0
    # The next boot's follower counts its own print.
    h, now = follower(FakeReader(), marker, BOOT_2)
    run(h, now, [ring])
    assert h.log.fabric.counts("n1")[FIELD] == 2


def test_a_follower_reads_a_print_split_across_polls_once():
    ring = backlog([HEADER, *MEM_FATAL, *PROC_FATAL])
    for cut in (1, 3, 5, 12, 13, len(ring) - 1):
        f, now = follower(FakeReader())
        run(f, now, [ring[:cut], ring[cut:]])
        assert f.log.fabric.counts("n1")[FIELD] == 2, cut


def test_without_a_boot_marker_a_restarted_follower_counts_the_print_again():
    # The documented limit: nothing in the log tells the restart from the first start of the boot.
    ring = backlog([HEADER, *PCIE_FATAL])
    for _ in range(2):
        f, now = follower(FakeReader())
        run(f, now, [ring])
        assert f.log.fabric.counts("n1")[FIELD] == 1


def test_produce_then_replay_raises_the_previous_boot_alert(tmp_path, capsys):
    _, got = produce_and_replay(tmp_path, [HEADER, *MEM_FATAL, *PROC_FATAL], 0.001, capsys)
    fired = {a["rule"] for a in got if a["host"] == "n1"}
    assert "host_fatal_error_previous_boot" in fired and "pcie_aer_log_fatal" not in fired


PIECES = st.sampled_from(
    [
        HEADER,
        "BERT: Total records found: 3",
        "BERT: [Firmware Bug]: Invalid error record.",
        HW,
        "{2}" + HW,
        "event severity: ",
        " Error 0, type: ",
        " Error 1, type: ",
        "fatal",
        "corrected",
        "recoverable",
        "  section_type: memory error",
        "  section_type: PCIe error",
        "  device_id: 0000:3b:00.0",
        "node:1 ",
        "row:99999999999 ",
        "  physical_address: 0x00000000000000001",
        "It has been corrected by h/w and requires no further action",
        "\x00",
        "٣",
        ": ",
    ]  # fmt: skip
)


@FUZZ
@given(st.lists(st.lists(PIECES, max_size=5).map("".join), max_size=40), st.booleans())
def test_any_bert_line_never_raises_and_never_counts_more_records_than_begin(lines, split):
    ev = FabricEvents()
    got = []
    for i, ln in enumerate(lines):
        got += ev.previous_boot("n1", float(i))
        ev.classify("n1", ln, float(i))
        got += ev.previous_boot("n1", end=split and i % 3 == 0)
    got += ev.previous_boot("n1", end=True)
    begins = sum(("event severity: " in ln or "Error 0, type: " in ln or "It has been" in ln) for ln in lines)
    assert len(got) <= begins
    assert all(len(v) <= 200 for d in got for v in d.values())


# --- Review: copies of one print, bounds, GHES and programs' lines -----------------------------


def counted(lines_at):
    """The records of a previous boot ``FabricEvents`` counts of ``(time, line)`` pairs."""
    ev, got = FabricEvents(), []
    for ts, ln in lines_at:
        got += ev.previous_boot("n1", ts)
        ev.classify("n1", ln, ts)
        got += ev.previous_boot("n1")
    return got + ev.previous_boot("n1", end=True)


def at(t0, lines, step=0.001):
    return [(t0 + i * step, ln) for i, ln in enumerate(lines)]


def test_copies_of_one_boots_print_count_once_and_the_next_boots_print_again():
    one = [HEADER, *PROC_FATAL, *MEM_FATAL]
    assert len(counted(at(3.0, one) + at(3.2, one))) == 2  # a copy 0.2 s later (another layout's)
    assert len(counted(at(3.0, one) + at(3.0 + 59, one))) == 2
    # The copy that has more records (the other was cut) counts those past the other's.
    assert len(counted(at(3.0, one[:8]) + at(3.5, one))) == 2
    # The next boot's print (a panic, a reboot and POST later) counts again.
    assert len(counted(at(3.0, one) + at(3.0 + 600, one))) == 4


def test_a_dmesg_and_a_second_resolution_journal_copy_in_one_file_count_the_print_once(tmp_path):
    # `dmesg > k.log; journalctl -k -b >> k.log`: the journal's short layout has whole seconds, so
    # its lines are no microsecond copy of dmesg's (KmsgFileSource._again): the print came twice.
    boot = 1_800_000_000.0
    us = [3_250_000 + i * 137 for i in range(len(PRINT_6_1))]
    d = [f"[{u / 1e6:12.6f}] {m}" for m, u in zip(PRINT_6_1, us)]
    wall = time.strftime("%b %d %H:%M:%S", time.localtime(boot + 3))
    s = [f"{wall} n1 kernel: {m}" for m in PRINT_6_1]
    for name, lines in {"d+s": d + s, "s+d": s + d}.items():
        p = write(tmp_path, name, "\n".join(lines) + "\n", mtime=boot + 100)
        recs = KmsgFileSource(str(p), PCI, host="n1", boot_time=boot, sample=False).poll()
        assert last(recs) == 2, name


def test_a_header_followed_by_endless_records_counts_a_bounded_number(tmp_path):
    many = [HEADER] + PROC_FATAL[:2] * 5_000
    assert len(counted(at(3.0, many, 0.0001))) == MAX_BERT_RECORDS
    recs, _ = from_file(tmp_path, dmesg(many, start=3.0, step=0.0001))
    assert last(recs) == MAX_BERT_RECORDS
    f, now = follower(FakeReader())
    t0 = time.monotonic()
    recs = run(f, now, [backlog(many)])
    assert f.log.fabric.counts("n1")[FIELD] == MAX_BERT_RECORDS and time.monotonic() - t0 < 10


def test_a_follower_poll_of_many_prints_sends_a_bounded_number_of_records():
    # Prints of many boots in one poll (a hostile backlog): each counts, not each with its records.
    lines = []
    for b in range(300):
        lines += [
            f"6,{len(lines) + i},{(3 + b * 100) * 1_000_000 + i},-;{m}" for i, m in enumerate([HEADER, *PROC_FATAL])
        ]
    f, now = follower(FakeReader())
    recs = run(f, now, [lines])
    assert f.log.fabric.counts("n1")[FIELD] == 300
    gpus = len(set(PCI.values()))
    assert len([r for r in recs if val(r, FIELD) > 0]) <= (MAX_BERT_DONE + 3) * gpus  # + the sample, baseline
    assert max(val(r, FIELD) for r in recs) == 300


def test_bare_hardware_error_lines_without_a_header_cost_little_and_count_nothing(tmp_path):
    ev, t0 = FabricEvents(), time.monotonic()
    for i in range(50_000):
        ev.classify("n1", PROC_FATAL[i % len(PROC_FATAL)], i * 0.001)
        assert ev.previous_boot("n1", i * 0.001) == []
    assert ev.previous_boot("n1", end=True) == [] and time.monotonic() - t0 < 10
    assert ev.hosts["n1"].bert is None and ev.hosts["n1"].bert_done == []


def test_a_live_ghes_record_inside_a_print_is_this_boots_and_leaves_the_record_whole():
    ghes = ["{7}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0",
            "{7}" + HW + "event severity: fatal", "{7}" + HW + " Error 0, type: fatal",
            "{7}" + HW + "  section_type: memory error"]  # fmt: skip
    got = counted(at(3.0, [HEADER, *MEM_FATAL[:5], *ghes, *MEM_FATAL[5:]]))
    assert len(got) == 1 and got[0]["bert.row"] == "38415" and got[0]["bert.dimm"] == "CPU0 DIMM_B1"


def test_a_programs_lines_in_kmsg_or_the_journal_are_no_print_and_do_not_break_one():
    # A program's write to /dev/kmsg: facility user (PRI 14), the journal's SYSLOG_FACILITY 1.
    fake = [HEADER, *PROC_FATAL]
    kmsg = [f"14,{i},{3_000_000 + i},-;{m}" for i, m in enumerate(fake)]
    journal = [json.dumps({"__REALTIME_TIMESTAMP": str(1_799_990_000 * 10**6 + i), "_TRANSPORT": "kernel",
                           "SYSLOG_FACILITY": "1", "_HOSTNAME": "n1", "MESSAGE": m}) for i, m in enumerate(fake)]  # fmt: skip
    for lines in (kmsg, journal):
        f, now = follower(FakeReader())
        run(f, now, [lines])
        assert f.log.fabric.counts("n1")[FIELD] == 0
    # Inside the kernel's print, a program's line is nothing.
    real = backlog([HEADER, *MEM_FATAL[:5]]) + [f"14,900,{3_010_000},-;{HW}event severity: fatal"]
    real += backlog(MEM_FATAL[5:], first=901)
    f, now = follower(FakeReader())
    recs = run(f, now, [real])
    assert f.log.fabric.counts("n1")[FIELD] == 1
    assert [r.labels["bert.dimm"] for r in recs if "bert.severity" in r.labels][:1] == ["CPU0 DIMM_B1"]


# --- The boot marker ------------------------------------------------------------------------------

WARNING = "not counted"


def ring_follower(marker, **kw):
    f, now = follower(FakeReader(), marker, **kw)
    run(f, now, [backlog([HEADER, *PCIE_FATAL])])
    return f.log.fabric.counts("n1")[FIELD]


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_marker_that_cannot_be_written_counts_nothing_with_one_warning(tmp_path, caplog, monkeypatch):
    (tmp_path / "file").write_text("x")
    for marker in (tmp_path / "missing" / "m", tmp_path / "file" / "m"):
        caplog.clear()
        assert ring_follower(str(marker), boot_id=BOOT_1) == 0
        (w,) = warnings(caplog)
        assert str(marker) in w and WARNING in w and "--file" in w
    # A read-only directory (root writes anyway: the rename's refusal, as EROFS makes it).
    caplog.clear()

    def refuse(src, dst):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", refuse)
    assert ring_follower(str(tmp_path / "m"), boot_id=BOOT_1) == 0
    assert len(warnings(caplog)) == 1 and "Read-only" in warnings(caplog)[0]
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # no temporary file left


def test_a_marker_that_is_no_boot_id_gives_a_clear_answer_and_never_hangs(tmp_path, caplog):
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero")
    for name in ("dir", "fifo", "zero"):  # not a regular file: left alone, nothing counted
        caplog.clear()
        assert ring_follower(str(tmp_path / name), boot_id=BOOT_1) == 0, name
        (w,) = warnings(caplog)
        assert "not a regular file" in w and WARNING in w, name
    assert (tmp_path / "dir").is_dir() and stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    # Garbage, a huge file, a truncated id: no boot id, replaced by this boot's and counted.
    for text in ("garbage\n", "\x00" * 5_000_000, BOOT_1[:20], "\u0663" * 40):
        caplog.clear()
        (tmp_path / "m").write_text(text)
        assert ring_follower(str(tmp_path / "m"), boot_id=BOOT_1) == 1
        assert "holds no boot id" in warnings(caplog)[0]
        assert (tmp_path / "m").read_text() == BOOT_1 + "\n"


def test_an_empty_marker_counts_nothing_quietly_and_an_unreadable_boot_id_nothing_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert ring_follower("", boot_id=BOOT_1) == 0
    assert warnings(caplog) == [] and any(WARNING in r.getMessage() for r in caplog.records)
    (tmp_path / "bad").write_text("not-a-uuid\n")
    os.mkfifo(tmp_path / "fifo")
    for where in (tmp_path / "none", tmp_path / "bad", tmp_path / "fifo"):
        caplog.clear()
        assert ring_follower(str(tmp_path / "m"), boot_id_path=str(where)) == 0
        assert len(warnings(caplog)) == 1 and WARNING in warnings(caplog)[0]
    (tmp_path / "id").write_text(BOOT_1 + "\n")
    assert ring_follower(str(tmp_path / "m"), boot_id_path=str(tmp_path / "id")) == 1
    assert ring_follower(str(tmp_path / "m"), boot_id_path=str(tmp_path / "id")) == 0
    # Without a marker (the library's default), the boot id is not read.
    assert ring_follower(None, boot_id_path=str(tmp_path / "fifo")) == 1


# --- The CLI --------------------------------------------------------------------------------------


def produce(tmp_path, monkeypatch, boot_id, *extra, polls=3):
    """``gpuwarden produce kmsg`` following ``extra``'s input, this boot ``boot_id``: the count sent."""
    from pipeline.cli import main

    ids = tmp_path / "boot_id"
    ids.write_text(boot_id + "\n")
    monkeypatch.setattr(kmsg, "BOOT_ID_PATH", str(ids))
    out = tmp_path / "out.jsonl"
    out.unlink(missing_ok=True)
    pci = write(tmp_path, "pci.csv", PCI_MAP)
    argv = ["produce", "kmsg", "--pci-map", str(pci), "--host", "n1", "--out", str(out), "--interval", "0.15",
            "--count", str(polls), "--events-only", *extra]  # fmt: skip
    assert main(argv) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    return max((r["fields"].get("GPUWARDEN_KMSG_FATAL_ERRORS_PREVIOUS_BOOT", 0) for r in recs), default=0)


def test_cli_kmsg_follower_counts_once_per_boot_with_its_marker(tmp_path, monkeypatch, caplog):
    dev = write(tmp_path, "kmsg", "\n".join(backlog([HEADER, *MEM_FATAL_4_19, *PROC_FATAL])) + "\n")
    marker = tmp_path / "state" / "kmsg-boot-id"
    marker.parent.mkdir()
    args = ("--kmsg", str(dev), "--boot-marker", str(marker))
    assert produce(tmp_path, monkeypatch, BOOT_1, *args) == 2  # the boot's first start
    assert marker.read_text() == BOOT_1 + "\n"
    assert produce(tmp_path, monkeypatch, BOOT_1, *args) == 0  # restarted within the boot
    assert produce(tmp_path, monkeypatch, BOOT_2, *args) == 2  # the next boot
    caplog.clear()
    marker.parent.rename(tmp_path / "gone")  # the marker's directory missing: nothing, one warning
    assert produce(tmp_path, monkeypatch, BOOT_1, *args) == 0
    (w,) = warnings(caplog)
    assert str(marker) in w and WARNING in w
    assert produce(tmp_path, monkeypatch, BOOT_1, "--kmsg", str(dev), "--boot-marker", "") == 0
    # --file counts the boot's print whatever the marker.
    assert produce(tmp_path, monkeypatch, BOOT_1, "--file", str(dev), "--boot-marker", "") == 2


def test_cli_journal_follower_counts_once_per_boot_with_its_marker(tmp_path, monkeypatch):
    boot = 1_790_000_000
    lines = [json.dumps({"__REALTIME_TIMESTAMP": str(boot * 10**6 + 3_000_000 + i), "_TRANSPORT": "kernel",
                         "SYSLOG_FACILITY": "0", "_HOSTNAME": "n1", "MESSAGE": m}) for i, m in enumerate(PRINT_6_1)]  # fmt: skip
    saved = write(tmp_path, "journal.json", "\n".join(lines) + "\n")
    journalctl = tmp_path / "journalctl"
    journalctl.write_text(f"#!/bin/sh\ncat {saved}\nexec sleep 30\n")
    journalctl.chmod(0o755)
    args = ("--journal", "--journalctl", str(journalctl), "--boot-marker", str(tmp_path / "m"))
    assert produce(tmp_path, monkeypatch, BOOT_1, *args, polls=6) == 2  # journalctl's lines come by a thread
    assert produce(tmp_path, monkeypatch, BOOT_1, *args, polls=6) == 0
    assert produce(tmp_path, monkeypatch, BOOT_2, *args, polls=6) == 2


def test_cli_kmsg_help_names_the_boot_marker(capsys):
    from pipeline.cli import main

    try:
        main(["produce", "kmsg", "--help"])
    except SystemExit:
        pass
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--boot-marker PATH" in help_text and "/var/lib/gpuwarden/kmsg-boot-id" in help_text
