"""Firmware-first PCIe AER (APEI GHES) in the kernel log, counted into pcie_aer_log_* like native AER.

Layouts and their sources (each test's log is a public capture, cut where noted):

- ``LKML_5_7``: openSUSE 15.1, kernel 5.7.5, AMD EPYC root port 0000:60:03.1, two corrected
  records ``{10}`` and ``{11}``, each followed by ``pci_print_aer()``'s ``AER: aer_status`` /
  ``AER:    [12] Timeout`` / ``AER: aer_layer=`` lines (linux-kernel, "Dear hacker from the order of
  the penguins", 2020-06-27).
- ``TG3``: a Dell server's tg3 NIC at reboot (kernel 5.19/6.0): event severity recoverable, section
  fatal, the section's own ``aer_uncor_status`` / ``aer_uncor_severity`` / ``TLP Header`` lines,
  then the device's ``AER: aer_status`` ... ``AER: aer_uncor_severity`` (Kai-Heng Feng, "tg3:
  Disable tg3 device on system reboot to avoid triggering AER", netdev, 2022-08).
- ``ICE``: two recoverable records of root port 0000:c9:02.0 (kernel 6.x), the second one's AER
  print after recovery lines, the bit line without ``AER: `` (Jakub Buchocki, "ice: Fix ...
  PFR reset", intel-wired-lan).
- ``CX3``: kernel 5.1.21, a fatal record of two PCIe sections of one root port (the kernel panics:
  no AER print), cut after the second section's ``device_id`` (netdev, "kernel oops with
  Mellanox ConnectX-3 Pro", 2019-11).
- ``I40E``: a Dell PowerEdge C4140's i40e at reboot, a fatal record then ``Kernel panic - not
  syncing: Fatal hardware error!`` (linux-pci/intel-wired-lan, 2025).
- ``KRENN``: Ubuntu 18.04 (4.15) corrected record of an Intel NIC 0000:43:00.0, its German
  ``dmesg -T`` times left out (Thomas-Krenn wiki, "Hardware error from APEI Generic Hardware Error Source").
- ``MEMORY``: a corrected memory-error record (Shuai Xue, "ghes: ... memory error", linux-acpi).
- 4.19-5.1's AER print without ``AER: `` (``pci_err()`` before aer.c's ``dev_fmt``) and
  ``AER: no pci_dev for`` are aer.c's format strings (torvalds/linux ``drivers/pci/pcie/aer.c``:
  ``pci_print_aer()``, ``aer_recover_work_func()``); the line layout around them is cper.c's
  ``cper_estatus_print_section()`` / ``cper_print_pcie()`` and ghes.c's ``__ghes_print_estatus()``.
"""

from __future__ import annotations


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.catalog import FIELDS
from producers.kmsg import KmsgFileSource, parse_pci_map
from producers.kmsg_fabric import FabricEvents
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import (
    PCI_MAP,
    block,
    dmesg,
    lkml_print,
    lkml_record,
    produce_and_replay,
    write,
)

FUZZ = settings(max_examples=fuzz_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


LKML_5_7 = [ln for seq in (10, 11) for part in lkml_record(seq) for ln in part]

TG3_CPER = block(
    1,
    "Hardware error from APEI Generic Hardware Error Source: 5",
    "event severity: recoverable",
    "Error 0, type: fatal",
    "section_type: PCIe error",
    "port_type: 0, PCIe end point",
    "version: 3.0",
    "command: 0x0006, status: 0x0010",
    "device_id: 0000:04:00.0",
    "slot: 0",
    "secondary_bus: 0x00",
    "vendor_id: 0x14e4, device_id: 0x165f",
    "class_code: 020000",
    "aer_uncor_status: 0x00100000, aer_uncor_mask: 0x00010000",
    "aer_uncor_severity: 0x000ef030",
    "TLP Header: 40000001 0000030f 90028090 00000000",
)
TG3_PRINT = [
    "tg3 0000:04:00.0: AER: aer_status: 0x00100000, aer_mask: 0x00010000",
    "tg3 0000:04:00.0: AER: [20] UnsupReq (First)",
    "tg3 0000:04:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
    "tg3 0000:04:00.0: AER: aer_uncor_severity: 0x000ef030",
    "tg3 0000:04:00.0: AER: TLP Header: 40000001 0000030f 90028090 00000000",
]


def ice_cper(seq, secondary):
    return block(
        seq,
        "Hardware error from APEI Generic Hardware Error Source: 1",
        "event severity: recoverable",
        " Error 0, type: recoverable",
        "  section_type: PCIe error",
        "  port_type: 4, root port",
        "  version: 3.0",
        "  command: 0x0547, status: 0x4010",
        "  device_id: 0000:c9:02.0",
        "  slot: 25",
        "  secondary_bus: 0xca",
        "  vendor_id: 0x8086, device_id: 0x347a",
        "  class_code: 060400",
        f"  bridge: secondary_status: {secondary}, control: 0x0013",
    )


ICE_PRINT = [
    "pcieport 0000:c9:02.0: AER: aer_status: 0x00200000, aer_mask: 0x00100020",
    "pcieport 0000:c9:02.0:    [21] ACSViol                (First)",
    "pcieport 0000:c9:02.0: AER: aer_layer=Transaction Layer, aer_agent=Receiver ID",
    "pcieport 0000:c9:02.0: AER: aer_uncor_severity: 0x00463010",
]
ICE = (
    ice_cper(1, "0x2800")
    + ICE_PRINT
    + ice_cper(2, "0x0800")
    + [
        "pci 0000:ca:00.1: AER: can't recover (no error_detected callback)",
        "pcieport 0000:c9:02.0: AER: device recovery failed",
    ]
    + ICE_PRINT
)

CX3_SECTION = [
    "  section_type: PCIe error",
    "  port_type: 4, root port",
    "  version: 1.16",
    "  command: 0x6010, status: 0x0143",
    "  device_id: 0000:80:03.0",
]
CX3 = block(
    1,
    "Hardware error from APEI Generic Hardware Error Source: 1",
    "event severity: fatal",
    " Error 0, type: fatal",
    *CX3_SECTION,
    "  slot: 0",
    "  secondary_bus: 0x88",
    "  vendor_id: 0x8086, device_id: 0x2f08",
    "  class_code: 040600",
    "  bridge: secondary_status: 0x2000, control: 0x0003",
    " Error 1, type: fatal",
    *CX3_SECTION,
)

I40E = block(
    1,
    "Hardware error from APEI Generic Hardware Error Source: 5",
    "event severity: fatal",
    " Error 0, type: fatal",
    "  section_type: PCIe error",
    "  port_type: 0, PCIe end point",
    "  version: 3.0",
    "  command: 0x0006, status: 0x0010",
    "  device_id: 0000:05:00.1",
    "  slot: 0",
    "  secondary_bus: 0x00",
    "  vendor_id: 0x8086, device_id: 0x1572",
    "  class_code: 020000",
    "  aer_uncor_status: 0x00100000, aer_uncor_mask: 0x00018000",
    "  aer_uncor_severity: 0x000ef030",
    "  TLP Header: 40000001 0000000f 90028090 00000000",
) + ["Kernel panic - not syncing: Fatal hardware error!"]

KRENN = block(
    2,
    "Hardware error from APEI Generic Hardware Error Source: 514",
    "It has been corrected by h/w and requires no further action",
    "event severity: corrected",
    " Error 0, type: corrected",
    "  section_type: PCIe error",
    "  port_type: 0, PCIe end point",
    "  version: 0.2",
    "  command: 0x0406, status: 0x0010",
    "  device_id: 0000:43:00.0",
    "  slot: 0",
    "  secondary_bus: 0x00",
    "  vendor_id: 0x8086, device_id: 0x1563",
    "  class_code: 020000",
)

MEMORY = block(
    2,
    "Hardware error from APEI Generic Hardware Error Source: 2",
    "It has been corrected by h/w and requires no further action",
    "event severity: corrected",
    " Error 0, type: corrected",
    "  section_type: memory error",
    "  error_status: 0x0000000000000000",
    "  physical_address: 0x0000000898b86020",
    "  physical_address_mask: 0x0000000000000000",
    "  node: 0 card: 0 module: 0 rank: 0 bank: 513 bank_group: 2 bank_address: 1 device: 0 row: 4887 "
    "column: 1032 bit_position: 0 requestor_id: 0x0000000000000000 responder_id: 0x0000000000000000",
    "  error_type: 4, single-symbol chipkill ECC",
    "  DIMM location: not present. DMI handle: 0x0000",
)


def run(lines, host="n1"):
    ev = FabricEvents()
    got = [labels for ln in lines if (labels := ev.apply(host, ln)) is not None]
    return {k: v for k, v in ev.counts(host).items() if v}, got, ev


def counted(lines):
    return run(lines)[0]


def test_each_public_layout_counts_each_report_once_by_its_sections_severity():
    assert counted(LKML_5_7) == {"pcie_aer_log_correctable": 2}
    # Event recoverable, section fatal: cper_severity_to_aer() reads the section's.
    assert counted(TG3_CPER + TG3_PRINT) == {"pcie_aer_log_fatal": 1}
    assert counted(ICE) == {"pcie_aer_log_nonfatal": 2}
    assert counted(CX3) == {"pcie_aer_log_fatal": 2}  # two PCIe sections: two errors
    assert counted(I40E) == {"pcie_aer_log_fatal": 1}


def test_a_report_names_its_device_and_severity_like_the_native_path():
    _, got, _ = run(TG3_CPER + TG3_PRINT)
    assert got == [{"aer.severity": "fatal", "aer.device": "0000:04:00.0", "aer.message": "device_id: 0000:04:00.0"}]
    _, got, _ = run(lkml_print())  # the record rate-limited away: the AER print names the type too
    assert got == [
        {
            "aer.device": "0000:60:03.1",
            "aer.type": "Data Link Layer",
            "aer.severity": "Corrected",
            "aer.message": "aer_layer=Data Link Layer, aer_agent=Transmitter ID",
        }
    ]


def test_the_aer_print_alone_counts_by_its_registers():
    # GHES prints 2 records in 5 s and no repeat within 10 s; pci_print_aer() runs for each.
    assert counted(lkml_print() * 3) == {"pcie_aer_log_correctable": 3}
    # Uncorrectable: no unmasked status bit is in the severity register, so non-fatal.
    assert counted(TG3_PRINT + ICE_PRINT) == {"pcie_aer_log_nonfatal": 2}
    fatal = [ln.replace("0x000ef030", "0x001ef030") for ln in TG3_PRINT]
    assert counted(fatal) == {"pcie_aer_log_fatal": 1}
    # 4.19-5.1: pci_err() without dev_fmt's "AER: ".
    old = [ln.replace("AER: ", "") for ln in ICE_PRINT]
    assert counted(old) == {"pcie_aer_log_nonfatal": 1}


def test_bit_13_alone_reads_alike_in_both_registers_and_its_name_decides():
    cor = [
        "nvidia 0000:3b:00.0: AER: aer_status: 0x00002000, aer_mask: 0x00000000",
        "nvidia 0000:3b:00.0: AER:    [13] NonFatalErr            (First)",
        "nvidia 0000:3b:00.0: AER: aer_layer=Transaction Layer, aer_agent=Receiver ID",
    ]
    assert counted(cor) == {"pcie_aer_log_correctable": 1}
    unc = [
        cor[0],
        cor[1].replace("NonFatalErr", "FCP"),
        cor[2],
        "nvidia 0000:3b:00.0: AER: aer_uncor_severity: 0x00062030",
    ]
    assert counted(unc) == {"pcie_aer_log_fatal": 1}


def test_both_printings_of_two_devices_interleaved_count_once_each():
    a_cper, a_print = lkml_record(1, "0000:3b:00.0", "nvidia")
    b_cper, b_print = lkml_record(2, "0000:5e:00.0", "nvidia")
    assert counted(a_cper + b_cper + a_print + b_print) == {"pcie_aer_log_correctable": 2}
    assert counted(a_cper + b_cper + b_print + a_print) == {"pcie_aer_log_correctable": 2}
    # Two CPUs' records under their own {seq}, line by line.
    mixed = [ln for pair in zip(a_cper, b_cper) for ln in pair]
    assert counted(mixed + a_print + b_print) == {"pcie_aer_log_correctable": 2}
    # The NMI path runs the handler before printing: the AER print first.
    assert counted(a_print + a_cper) == {"pcie_aer_log_correctable": 1}
    # A correctable and an uncorrectable report of one device do not pair with each other.
    assert counted(a_cper + TG3_PRINT) == {"pcie_aer_log_correctable": 1, "pcie_aer_log_nonfatal": 1}


def test_printings_pair_only_within_seconds_of_each_other():
    # One work item prints both halves of a report, milliseconds apart. A section whose AER print
    # was rate-limited away is not the other half of a print-only report of the device an hour on.
    a_cper, a_print = lkml_record(1, "0000:3b:00.0", "nvidia")

    def at(parts):
        ev = FabricEvents()
        for t, lines in parts:
            for ln in lines:
                ev.apply("n1", ln, ts=t)
        return {k: v for k, v in ev.counts("n1").items() if v}

    assert at([(100.0, a_cper), (100.004, a_print)]) == {"pcie_aer_log_correctable": 1}
    assert at([(100.0, a_cper), (3700.0, a_print)]) == {"pcie_aer_log_correctable": 2}
    assert at([(100.0, a_print), (3700.0, a_cper)]) == {"pcie_aer_log_correctable": 2}  # the NMI order
    # A stale half does not block the next report's own pairing.
    assert at([(100.0, a_cper), (3700.0, a_cper[:-5]), (3700.0, a_cper[-5:]), (3700.01, a_print)]) == {
        "pcie_aer_log_correctable": 2
    }
    assert at([(100.0, TG3_CPER), (3700.0, TG3_PRINT)]) == {"pcie_aer_log_fatal": 1, "pcie_aer_log_nonfatal": 1}
    assert counted(a_cper + a_print) == {"pcie_aer_log_correctable": 1}  # no times: pairs as before


def test_a_report_the_aer_driver_cannot_print_leaves_nothing_to_pair():
    a_cper, a_print = lkml_record(1, "0000:3b:00.0", "nvidia")
    assert counted(a_cper + ["AER: no pci_dev for 0000:3b:00.0"] + a_print) == {"pcie_aer_log_correctable": 2}
    gone = "AER recover: Buffer overflow when recovering AER for 0000:3b:0:0"
    assert counted(a_cper + [gone] + a_print) == {"pcie_aer_log_correctable": 2}


def test_memory_and_processor_records_count_nothing():
    proc = block(
        3,
        "Hardware error from APEI Generic Hardware Error Source: 1",
        "event severity: corrected",
        " Error 0, type: corrected",
        "  section_type: general processor error",
        "  processor_type: 0, IA32/X64",
        "  device_id: 0000:3b:00.0",
    )
    assert counted(MEMORY + proc + KRENN) == {"pcie_aer_log_correctable": 1}
    # A memory section after a PCIe section of the same record is not its device's.
    both = block(
        4,
        "Hardware error from APEI Generic Hardware Error Source: 1",
        "event severity: recoverable",
        " Error 0, type: recoverable",
        "  section_type: memory error",
        "  device_id: 0000:3b:00.0",
        " Error 1, type: recoverable",
        "  section_type: PCIe error",
        "  device_id: 0000:5e:00.0",
    )
    assert counted(both) == {"pcie_aer_log_nonfatal": 1}


def test_a_cut_record_costs_only_itself():
    # Cut before its header and severities: its section cannot be read, the next record can.
    cut = [ln for ln in lkml_record(7)[0] if "section_type" in ln or "device_id" in ln]
    assert counted(cut + I40E) == {"pcie_aer_log_fatal": 1}
    # A record cut before its device_id line: its AER print counts the report.
    head = lkml_record(8)[0][:8]
    assert counted(head + lkml_print() + I40E) == {"pcie_aer_log_correctable": 1, "pcie_aer_log_fatal": 1}
    # An AER print cut before its status line still counts by its layer and agent words, not by
    # the status of the device's print before it.
    ambiguous = [
        "nvidia 0000:3b:00.0: AER: aer_status: 0x00002000, aer_mask: 0x00000000",
        "nvidia 0000:3b:00.0: AER: aer_layer=Transaction Layer, aer_agent=Receiver ID",
    ]
    requester = [
        "nvidia 0000:3b:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
        "nvidia 0000:3b:00.0: AER: aer_uncor_severity: 0x00000000",
    ]
    assert counted(ambiguous + requester) == {"pcie_aer_log_correctable": 1, "pcie_aer_log_nonfatal": 1}
    assert counted(lkml_print()[2:] + TG3_PRINT[2:4]) == {"pcie_aer_log_correctable": 1, "pcie_aer_log_nonfatal": 1}


def test_a_hostile_log_keeps_the_pending_state_bounded():
    from producers.kmsg_fabric import MAX_CPER

    lines = []
    for i in range(2000):
        bdf = f"0000:{i % 256:02x}:{i // 256 % 32:02x}.0"
        lines += block(
            i,
            "Hardware error from APEI Generic Hardware Error Source: 1",
            "event severity: corrected",
            " Error 0, type: corrected",
            "  section_type: PCIe error",
            f"  device_id: {bdf}",
        )
        lines.append(f"nvidia {bdf}: AER: aer_status: 0x00002000, aer_mask: 0x00000000")
    counts, _, ev = run(lines)
    h = ev.hosts["n1"]
    assert counts == {"pcie_aer_log_correctable": 2000}
    assert len(h.blocks) <= MAX_CPER and len(h.prints) <= MAX_CPER and len(h.unpaired) <= MAX_CPER
    # One device's unpaired records are capped too.
    _, _, ev = run(lkml_record(1)[0] * 1000)
    assert max(abs(n) for n in ev.hosts["n1"].unpaired.values()) <= 16


PIECES = st.sampled_from(
    [
        "{1}[Hardware Error]: ",
        "{99999999999}[Hardware Error]: ",
        "[Hardware Error]: ",
        "event severity: ",
        " Error 0, type: ",
        "corrected",
        "fatal",
        "recoverable",
        "  section_type: PCIe error",
        "  device_id: ",
        "0000:3b:00.0",
        "nvidia 0000:3b:00.0: ",
        "AER: ",
        "aer_status: 0x00001000, aer_mask: 0x00000000",
        "   [13] FCP",
        "aer_layer=Transaction Layer, aer_agent=Receiver ID",
        "aer_uncor_severity: 0xffffffff",
        "no pci_dev for ",
        "\x00",
        "٣",
        ": ",
    ]
)
LINES = st.lists(st.lists(PIECES, max_size=6).map("".join), max_size=40)


@FUZZ
@given(LINES)
def test_any_firmware_first_line_costs_at_most_one_count_and_never_raises(lines):
    ev = FabricEvents()
    for ln in lines:
        before = sum(ev.counts("n1").values())
        labels = ev.apply("n1", ln)
        assert sum(ev.counts("n1").values()) - before == (1 if labels is not None else 0)
        assert labels is None or all(len(v) <= 200 for v in labels.values())


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


def test_a_saved_log_counts_firmware_first_reports_and_names_the_gpu(tmp_path):
    # The PCI map's GPU 0 is 0000:3b:00.0 and GPU 1 0000:5e:00.0.
    a_cper, a_print = lkml_record(1, "0000:3b:00.0", "nvidia")
    b_cper, b_print = lkml_record(2, "0000:5e:00.0", "nvidia")
    lines = (
        a_cper + b_cper + a_print + b_print + MEMORY + [ln.replace("tg3 0000:04", "nvidia 0000:3b") for ln in TG3_PRINT]
    )
    p = write(tmp_path, "dmesg.txt", dmesg(lines, step=0.001))
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False).poll()
    events = [r for r in recs if r.gpu == 0 and "aer.message" in r.labels]
    assert [(r.labels["aer.device"], r.labels.get("aer.gpu")) for r in events] == [
        ("0000:3b:00.0", "0"),
        ("0000:5e:00.0", "1"),
        ("0000:3b:00.0", "0"),
    ]
    last = max(recs, key=lambda r: r.ts)
    assert (val(last, "pcie_aer_log_correctable"), val(last, "pcie_aer_log_nonfatal")) == (2, 1)


def test_produce_then_replay_raises_the_aer_log_alerts(tmp_path, capsys):
    lines = I40E[:-1] + ICE
    # 10 ms a line: a record and its AER print come within milliseconds of each other (PAIR_WINDOW).
    summary, got = produce_and_replay(tmp_path, lines, 0.01, capsys)
    assert "fabric_lines 3" in summary
    fired = {a["rule"] for a in got}
    assert {"pcie_aer_log_fatal", "pcie_aer_log_nonfatal"} <= fired
