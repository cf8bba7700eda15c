"""The kernel's NIC and AER lines across kernel versions (4.19 to 6.16), checked against the
source that prints them (producers/kmsg_fabric.py, docs/producers.md#nic-aer-and-nccl-crash-lines).

Origins of the lines below:

- ``drivers/pci/pcie/aer.c`` (torvalds/linux): ``aer_print_port_info()`` prints the root port's
  ``%s%s error received: %04x:%02x:%02x.%d`` ("AER: " inside the format in 4.19, from ``dev_fmt``
  since 5.2), ``%s%s error message received from ...`` since the December 2023 change, and
  ``aer_print_source()``'s `` (no details found)`` suffix since the 2025 ratelimit series (6.16).
  ``find_source_device()`` says the same on a line of its own before that: ``can't find device of
  ID%04x`` (``pci_printk(KERN_DEBUG, ...)`` without "AER: " in 4.19, ``pci_info`` with it from 5.2)
  and ``found no error details for %04x:%02x:%02x.%d`` (Bjorn Helgaas's 2023 patch, whose commit
  message quotes ``pcieport 0000:00:1c.5: AER: found no error details for 0000:00:1c.5``).
  ``aer_get_device_error_info()`` returns 0 without a word when the device's status register holds
  no unmasked bit (a device that fell off the bus reads all ones: status & ~mask == 0), so a
  "received" line can have no detail line at all.
- ``drivers/pci/pcie/dpc.c``, ``dpc_process_error()``: a DPC containment calls ``aer_print_error()``
  directly, a ``PCIe Bus Error`` line with no "received" line before it.
- The 5.4 sequence ``AER: Multiple Corrected error received: 0000:00:1c.4`` / ``AER: can't find
  device of ID00e4`` is a public capture (Thomas-Krenn wiki, "AER Multiple Corrected error
  received"); ``AER: device recovery failed`` is from Red Hat's solution 7128107 (RHEL 9).
- ``aer.c`` again: ``aer_print_error()`` prints each device's detail on that device, in
  ``find_source_device()``'s walk order (the root port, then its hierarchy); ``is_error_source()``
  searches the status registers when the source is on bus 0 or the report is ``Multiple``; each
  root port has its own threaded IRQ (``aer_probe()``, ``aer_isr()``), so ports' lines interleave.
- mlx5, ``drivers/net/ethernet/mellanox/mlx5/core/events.c``: ``port_module()`` prints
  ``Port module event: module %u, %s`` with ``mlx5_pme_status_to_string()``'s ``Cable plugged``,
  ``Cable unplugged``, ``Cable disabled`` or ``Unknown status`` (``Port module event[error]: ...``
  for ``Cable error``).
- libata, ``drivers/ata/libata-core.c`` ``sata_print_link_status()``: ``ata%u: SATA link down
  (SStatus %X SControl %X)`` (``ata%u.%02u:`` behind a port multiplier), every boot for each empty
  port; the lines are Red Hat solution 38805's capture.
"""

from __future__ import annotations

from pipeline.catalog import FIELDS
from producers.kmsg import KmsgFileSource, parse_pci_map
from producers.kmsg_fabric import FabricEvents
from tests.unit.producers.kmsg_factories import PCI_MAP, dmesg, write

# A DPC containment's own report (dpc.c -> aer_print_error, 6.x severity spelling).
DPC_NONFATAL = (
    "pcieport 0000:3a:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
    "(Requester ID)"
)
# The same in 4.19: no dev_fmt "AER: " prefix, the pre-2023 severity spelling.
DPC_NONFATAL_419 = (
    "pcieport 0000:3a:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)"
)


def counted(*lines: str, host: str = "n1") -> dict[str, int]:
    ev = FabricEvents()
    for ln in lines:
        ev.apply(host, ln)
    return {k: v for k, v in ev.counts(host).items() if v}


def test_a_received_line_the_kernel_found_no_details_for_leaves_nothing_to_pair():
    # Each kernel's way of saying that no "PCIe Bus Error" line follows; the DPC report after it
    # is an error of its own and counts.
    v6_16 = "pcieport 0000:3a:00.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:3b:00.0 (no details found)"
    v6_8 = [
        "pcieport 0000:3a:00.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:3b:00.0",
        "pcieport 0000:3a:00.0: AER: found no error details for 0000:3b:00.0",
    ]
    v5_4 = [
        "pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
        "pcieport 0000:3a:00.0: AER: can't find device of ID3b00",
    ]
    v4_19 = [
        "pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
        "pcieport 0000:3a:00.0: can't find device of ID3b00",
    ]
    assert counted(v6_16, DPC_NONFATAL) == {"pcie_aer_log_nonfatal": 2}
    assert counted(*v6_8, DPC_NONFATAL) == {"pcie_aer_log_nonfatal": 2}
    assert counted(*v5_4, DPC_NONFATAL) == {"pcie_aer_log_nonfatal": 2}
    assert counted(*v4_19, DPC_NONFATAL_419) == {"pcie_aer_log_nonfatal": 2}
    # The 6.16 line still names its source, and the marker lines are kept by a saved file's filter.
    assert FabricEvents().apply("n1", v6_16)["aer.source"] == "0000:3b:00.0"
    assert all(FabricEvents().wants(ln) for ln in (v6_8[1], v5_4[1], v4_19[1]))


def test_a_received_line_with_no_detail_at_all_is_not_paired_with_a_later_report():
    # A GPU off the bus: the root port's "received" line and nothing else (its status reads all
    # ones). A later correctable report pairs as usual, and the DPC report after it still counts.
    lines = [
        "pcieport 0000:3a:00.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:3b:00.0",
        "pcieport 0000:00:1c.5: AER: Correctable error message received from 0000:00:1c.5",
        "pcieport 0000:00:1c.5: AER: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)",
        "pcieport 0000:00:1c.5: AER:   device [8086:a33c] error status/mask=00000001/00002000",
        "pcieport 0000:00:1c.5: AER:    [ 0] RxErr                  (First)",
        DPC_NONFATAL,
    ]
    assert counted(*lines) == {"pcie_aer_log_nonfatal": 2, "pcie_aer_log_correctable": 1}
    # Recovery's own lines end a report too (err.c, "AER: device recovery failed").
    assert counted(lines[0], "pcieport 0000:3a:00.0: AER: device recovery failed", DPC_NONFATAL) == {
        "pcie_aer_log_nonfatal": 2
    }


def test_the_54_capture_still_counts_each_received_line_once():
    # Thomas-Krenn's 5.4 capture: a report with its detail, then one the kernel found no device for.
    lines = [
        "pcieport 0000:00:1c.4: AER: Multiple Corrected error received: 0000:00:1c.4",
        "pcieport 0000:00:1c.4: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
        "pcieport 0000:00:1c.4: AER:   device [8086:9d14] error status/mask=00000001/00002000",
        "pcieport 0000:00:1c.4: AER:    [ 0] RxErr",
        "pcieport 0000:00:1c.4: AER: Multiple Corrected error received: 0000:00:1c.4",
        "pcieport 0000:00:1c.4: AER: can't find device of ID00e4",
    ]
    assert counted(*lines) == {"pcie_aer_log_correctable": 2}


def test_a_saved_419_log_keeps_the_no_details_line(tmp_path):
    # Through the file reader, which keeps only the lines FabricEvents.wants: 4.19's "can't find
    # device" line has no "AER" in it.
    lines = [
        "pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
        "pcieport 0000:3a:00.0: can't find device of ID3b00",
        DPC_NONFATAL_419,
    ]
    p = write(tmp_path, "dmesg.txt", dmesg(lines))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False)
    recs = src.poll()
    last = max(recs, key=lambda r: r.ts)
    assert getattr(last.fields, FIELDS.by_alias("pcie_aer_log_nonfatal").names[0]) == 2


def test_libata_sata_link_down_is_a_disk_port_not_a_nic():
    # Every boot prints one per empty SATA port; a port multiplier's links are "ataN.MM".
    assert (
        counted(
            "ata3: SATA link down (SStatus 0 SControl 300)",
            "ata2: SATA link down (SStatus 1 SControl 310)",
            "ata5.01: SATA link down (SStatus 0 SControl 300)",
        )
        == {}
    )
    # NIC lines around them still count.
    assert counted(
        "ata4: SATA link down (SStatus 0 SControl 300)", "mlx5_core 0000:c1:00.0 enp193s0f0np0: Link down"
    ) == {"nic_link_down_events": 1}


def test_a_drivers_prefix_before_the_interface_names_the_interface():
    # mlx4_en's en_info(): "mlx4_en: <ifname>: Link Down" (drivers/net/ethernet/mellanox/mlx4/en_netdev.c).
    from producers.kmsg_fabric import FabricEvents

    got = FabricEvents().classify("n1", "mlx4_en: ens1: Link Down")
    assert got is not None and got[0] == "nic_link_down_events" and got[1]["nic.netdev"] == "ens1"
    got = FabricEvents().classify("n1", "ib0: Lost carrier")
    assert got is not None and got[1]["nic.netdev"] == "ib0"


# aer.c's aer_print_error() prints each device's detail on that device (pci_printk(level, dev, ...),
# "AER: " from dev_fmt since 5.2), in find_source_device()'s walk order: the root port, then its
# hierarchy depth first; the "Multiple" report's source is only the first ERR_* message's sender.
GPU_NONFATAL = [
    "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
    "(Requester ID)",
    "nvidia 0000:3b:00.0: AER:   device [10de:2330] error status/mask=00004000/00000000",
    "nvidia 0000:3b:00.0: AER:    [14] CmpltTO                (First)",
]
NIC_NONFATAL = [
    "mlx5_core 0000:3c:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
    "(Requester ID)",
    "mlx5_core 0000:3c:00.0: AER:   device [15b3:1021] error status/mask=00004000/00000000",
    "mlx5_core 0000:3c:00.0: AER:    [14] CmpltTO                (First)",
    "mlx5_core 0000:3c:00.0: AER:   Error of this Agent is reported first",
]


def aer_records(tmp_path, lines):
    p = write(tmp_path, "dmesg.txt", dmesg(lines))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False)
    recs = src.poll()
    events = [r for r in recs if r.gpu == 0 and "aer.message" in r.labels]
    last = max(recs, key=lambda r: r.ts)
    return events, getattr(last.fields, FIELDS.by_alias("pcie_aer_log_nonfatal").names[0])


def test_a_multiple_reports_gpu_detail_names_the_gpu_when_the_source_is_another_device(tmp_path):
    # 6.8-6.15 layout ("%s%s error message received from %04x:%02x:%02x.%d"): the GPU (PCI map's
    # GPU 0, 0000:3b:00.0) and the NIC behind the same root port both logged an error; the NIC's
    # message came first, so it is the source, but the walk reaches the GPU first. The GPU's line
    # is an error of its own and names the GPU; the NIC's is the report's detail.
    lines = [
        "pcieport 0000:3a:00.0: AER: Multiple Uncorrectable (Non-Fatal) error message received from 0000:3c:00.0",
        *GPU_NONFATAL,
        *NIC_NONFATAL,
    ]
    assert counted(*lines) == {"pcie_aer_log_nonfatal": 2}
    events, total = aer_records(tmp_path, lines)
    assert total == 2
    assert [(r.labels.get("aer.device"), r.labels.get("aer.gpu")) for r in events] == [
        ("0000:3a:00.0", None),
        ("0000:3b:00.0", "0"),
    ]


def test_a_source_the_kernel_does_not_trust_counts_through_the_devices_lines(tmp_path):
    # is_error_source(): a source on bus 0 "might be a bad id reported by root port" (and VMD
    # ports set PCI_BUS_FLAGS_NO_AERSID), so the kernel finds the device by its status register.
    # The GPU's detail counts the error and names the GPU; the "received" line counts nothing.
    lines = [
        "pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:00:00.0",
        *GPU_NONFATAL,
    ]
    assert counted(*lines) == {"pcie_aer_log_nonfatal": 1}
    events, total = aer_records(tmp_path, lines)
    assert total == 1 and [r.labels.get("aer.gpu") for r in events] == ["0"]
    # When the search finds nothing, the port's own line says so and counts the report: 6.8-6.15's
    # "found no error details for %04x:%02x:%02x.%d", 5.2-6.7's "can't find device of ID%04x".
    no_details = [
        "pcieport 0000:3a:00.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:00:00.0",
        "pcieport 0000:3a:00.0: AER: found no error details for 0000:00:00.0",
    ]
    assert counted(*no_details) == {"pcie_aer_log_nonfatal": 1}
    assert FabricEvents().apply("n1", no_details[0]) is None
    ev = FabricEvents()
    ev.apply("n1", "pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:00:00.0")
    got = ev.apply("n1", "pcieport 0000:3a:00.0: AER: can't find device of ID0000")
    assert got is not None and got["aer.source"] == "0000:00:00.0" and got["aer.device"] == "0000:3a:00.0"
    # 6.16 says it on the "received" line itself (" (no details found)"): counted at once.
    assert counted(
        "pcieport 0000:3a:00.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:00:00.0"
        " (no details found)"
    ) == {"pcie_aer_log_nonfatal": 1}
    # The root port's own source on bus 0 is trusted: its detail is the report's (Thomas-Krenn's 5.4 capture).
    assert counted(
        "pcieport 0000:00:1c.4: AER: Corrected error received: 0000:00:1c.4",
        "pcieport 0000:00:1c.4: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    ) == {"pcie_aer_log_correctable": 1}


def test_two_root_ports_reports_printed_interleaved_pair_each_with_its_own():
    # Each root port's AER service has its own threaded IRQ (aer_probe's devm_request_threaded_irq,
    # aer_isr), so two ports' lines can interleave. 6.8+ layout; 0000:3a:00.0 and 0000:5d:00.0
    # are the ports of GPUs 0000:3b:00.0 and 0000:5e:00.0.
    a = "pcieport 0000:3a:00.0: AER: Correctable error message received from 0000:3b:00.0"
    b = "pcieport 0000:5d:00.0: AER: Correctable error message received from 0000:5e:00.0"
    a_bus = "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)"
    b_bus = "nvidia 0000:5e:00.0: AER: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)"
    bits = "nvidia 0000:3b:00.0: AER:    [ 0] RxErr                  (First)"
    assert counted(a, b, a_bus, bits, b_bus) == {"pcie_aer_log_correctable": 2}
    assert counted(a, b, b_bus, a_bus) == {"pcie_aer_log_correctable": 2}
    # Severities apart: a correctable report and a non-fatal one, each detail after both.
    b_nf = "pcieport 0000:5d:00.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:5e:00.0"
    b_nf_bus = (
        "nvidia 0000:5e:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
        "(Requester ID)"
    )
    assert counted(a, b_nf, a_bus, b_nf_bus) == {"pcie_aer_log_correctable": 1, "pcie_aer_log_nonfatal": 1}
    # 4.19-5.x layout ("%s%s error received: %04x:%02x:%02x.%d", "Uncorrected"), the same.
    old_a = "pcieport 0000:3a:00.0: AER: Corrected error received: 0000:3b:00.0"
    old_b = "pcieport 0000:5d:00.0: AER: Corrected error received: 0000:5e:00.0"
    old_bus = "nvidia 0000:{}:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
    assert counted(old_a, old_b, old_bus.format("3b"), old_bus.format("5e")) == {"pcie_aer_log_correctable": 2}


def test_an_mlx5_module_disabled_is_a_module_error():
    # events.c mlx5_pme_status_to_string(): MLX5_MODULE_STATUS_DISABLED is "Cable disabled",
    # printed by port_module() as "Port module event: module %u, %s" (a module plugged but shut
    # off: the port is down as with a cable pulled). "Unknown status" is no status at all.
    disabled = "mlx5_core 0000:3c:00.0: Port module event: module 0, Cable disabled"
    unknown = "mlx5_core 0000:3c:00.0: Port module event: module 0, Unknown status"
    assert counted(disabled, unknown) == {"nic_module_errors": 1}
    assert FabricEvents().apply("n1", disabled) == {
        "nic.module": "0",
        "nic.device": "0000:3c:00.0",
        "nic.message": "Port module event: module 0, Cable disabled",
    }
