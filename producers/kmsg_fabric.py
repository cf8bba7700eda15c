"""The kernel log beyond the GPU: NIC (mlx5 and netdev), PCIe AER and NCCL crash lines, as event counters.

The kmsg producer (``producers/kmsg.py``) hands every message that is not an XID or SXid to
``FabricEvents.apply``, which recognises the lines the kernel prints and counts them per host
since the producer started (catalogue fields 9512-9519, docs/producers.md#kernel-log):

- mlx5 port module events (``drivers/net/ethernet/mellanox/mlx5/core/events.c``,
  ``port_module()``; ``port.c``'s ``mlx5_port_module_event()`` before 4.20):
  ``Port module event: module %u, Cable unplugged``, ``... Cable disabled`` (a module plugged but
  shut off, ``MLX5_MODULE_STATUS_DISABLED``) and ``Port module event[error]: module %u, Cable
  error, <reason>`` -> ``nic_module_errors`` (``Cable plugged`` and ``Unknown status`` are not errors);
- mlx5 health (``health.c``, ``poll_health()``; ``cmd.c``): ``device's health compromised -
  reached miss count``, ``Fatal error %u detected`` and ``... timeout. Will cause a leak of a
  command resource`` -> ``nic_health_errors``; the ``synd 0x..: unrecoverable hardware error``
  detail line that ``print_health_info()`` prints after them is the same event, not counted;
- link down: mlx5e's ``<ifname>: Link down`` (``en_main.c``), other drivers' ``NIC Link is
  Down`` / ``Link is Down``, IPoIB and network managers' ``lost carrier`` -> ``nic_link_down_events``
  (PCIe hot-plug's ``pciehp: Slot(N): Link Down`` is a slot and libata's ``ataN: SATA link down``
  a disk port, not NICs, and are not counted);
- NIC driver warnings (non-fatal: the NIC still works, degraded) -> ``nic_driver_warnings``: a
  transmit timeout of any netdev, one per event, and mlx5's ``Detected insufficient power on the
  PCIe slot (%uW).`` (``events.c``, ``mlx5_pcie_event()``; NVSentinel's and GPUd's non-fatal NIC
  errors), one per line (a line per PCI function). A timeout is the stack's watchdog
  (``net/sched/sch_generic.c``, ``dev_watchdog()``): ``NETDEV WATCHDOG: <ifname> (<driver>):
  transmit queue %u timed out[ %u ms]`` through ``WARN_ONCE`` (no device prefix, once a boot), or
  ``<prefix>: NETDEV WATCHDOG: CPU: %d: transmit queue %u timed out %u ms`` through ``netdev_crit``
  (every time); and the driver's own report from ``ndo_tx_timeout``, mlx5e's ``TX timeout
  detected`` and per stuck queue ``TX timeout on queue: %d, SQ: 0x%x, ...`` (``en_main.c``,
  ``en/reporter_tx.c``). The driver's lines after a watchdog line of the same interface are that
  event, not counted again; without one (``WARN_ONCE`` has already printed) ``TX timeout detected``
  counts the event, or else its first queue line. mlx5's ``PCIe slot power capability was not
  advertised.`` (info: the slot's power could not be read), ``PCIe slot advertised sufficient
  power`` and ``ACCESS_REG(...) failed`` (register reads a restricted function may not make, noise
  per GPUd) count nothing;
- a process killed by a fatal fault in NCCL's code (GPUd's ``RegexSegfaultInLibnccl``: repeated,
  a sign of the GPUs' communication failing, such as Fabric Manager's) -> ``nccl_crashes``, one
  per line: x86's ``<comm>[<pid>]: segfault at %lx ip %px sp %px error %lx in <file>[<start>+<size>]``
  (``arch/x86/mm/fault.c``, ``show_signal_msg()``; `` likely on CPU %d (core %d, socket %d)``
  after it since 6.2) and ``traps: <comm>[<pid>] general protection ip:%lx sp:%lx error:%lx in
  ...`` / ``... trap <name> ip:...`` (``arch/x86/kernel/traps.c``), ``<comm>[<pid>] control protection
  ip:%lx sp:%lx ssp:%lx error:%lx(<kind>)[ in enclave] in ...`` (a shadow-stack or indirect-branch
  violation, ``arch/x86/kernel/cet.c``, 6.6+), arm64's ``<comm>[<pid>]:
  unhandled exception: <class>, ESR 0x%016lx, <reason> in ...`` (``arch/arm64/kernel/traps.c``,
  ``arm64_show_signal()``; Grace hosts) and others' ``unhandled signal``; ``<file>`` (from
  ``print_vma_addr()``: ``<file>[<offset>,<start>+<size>]`` in later kernels, ``<file> (deleted)``
  for a file replaced since it was mapped in older ones) is the mapping of the faulting instruction, so
  a line counts when it is NCCL's library or a plugin of it (``libnccl.so.2``,
  ``libnccl.so.2.21.5``, ``libnccl-net.so``); a fault elsewhere in the process counts nothing;
- AER (``drivers/pci/pcie/aer.c``): the root port's ``AER: [Multiple ]<severity> error
  received: <source>`` and each reporting device's ``PCIe Bus Error: severity=<severity>,
  type=..., (<agent> ID)`` -> ``pcie_aer_log_{correctable,nonfatal,fatal}``. A "received" line
  counts its report, and the "PCIe Bus Error" line of the same severity printed by the device it
  names as the source is that report's detail, not counted again; every other "PCIe Bus Error"
  line (DPC, the other devices of a ``Multiple`` report, whichever comes first) counts on its own
  and names its device. Reports are kept per root port, so two ports' reports printed interleaved
  (each port has its own IRQ thread) pair right. A report ends at its port's next "received" line
  or any other AER line of its port or source (``can't find device of ID``, ``found no error
  details for``, recovery), or at once when the line ends in ``(no details found)`` (6.16). A
  source on bus 0 that is not the port itself is one the kernel does not trust (it then searches
  the devices' status registers, ``is_error_source()``): that "received" line counts nothing,
  the detail lines count, or else the port's ``can't find device`` / ``found no error details``
  line counts the report. The ``device [vvvv:dddd] error status/mask=``, ``[nn] <name>``,
  ``TLP Header`` and ``Error of this Agent is reported first`` lines count nothing;
- firmware-first AER (APEI GHES): the firmware's CPER record, printed by ``ghes.c``'s
  ``__ghes_print_estatus()`` and ``cper.c``'s ``cper_estatus_print()`` as a block of
  ``{N}[Hardware Error]: `` lines (``event severity: <sev>``, `` Error <n>, type: <sev>``,
  ``  section_type: PCIe error``, ``  device_id: ssss:bb:dd.f``), and the AER driver's
  ``pci_print_aer()`` (``cper_print_aer()`` before 5.x, ``aer.c``) of the same report on the
  device's own lines (``aer_status: 0x%08x, aer_mask: 0x%08x``, ``   [nn] <bit>``,
  ``aer_layer=<layer>, aer_agent=<agent>``, ``aer_uncor_severity: 0x%08x`` when uncorrectable)
  -> the same three counters. A PCIe section counts at its ``device_id`` line by the section's
  severity as ``cper_severity_to_aer()`` maps it (corrected and info: correctable, recoverable:
  non-fatal, fatal: fatal); the AER driver's print counts at its ``aer_layer`` line when
  correctable, at its ``aer_uncor_severity`` line when not (fatal when an unmasked status bit is
  in the severity register). Each rate-limits on its own (GHES: 2 records in 5 s and a repeat
  within 10 s not at all; ``pci_print_aer()`` per device from 6.16), so either may be missing:
  a printing pairs with an unpaired printing of the other kind for the same device and class
  (correctable or not) made within ``PAIR_WINDOW`` of it (one work item prints both, milliseconds
  apart), which counted the report, and else counts it. Sections of other types
  (memory, processor) count nothing, nor does a block whose section's type or severity was cut off;
- the previous boot's fatal errors (``drivers/acpi/apei/bert.c``, ``bert_print_all()``): a fatal
  error panics the kernel at once (``ghes.c``'s ``__ghes_panic()``), and at the next boot the
  firmware's Boot Error Record Table is printed, ``BERT: Error records from previous boot:`` then
  each record through ``cper_estatus_print()`` behind a bare ``[Hardware Error]: `` (no ``{N}``)
  -> ``host_fatal_errors_previous_boot``, one per record whose event or a section's severity is
  fatal, whatever its sections (memory, processor, PCIe: not counted as this boot's AER error),
  labelled ``bert.section`` and a memory error's ``bert.node`` ... ``bert.column``,
  ``bert.physical_address``, ``bert.error_type``, ``bert.dimm`` (a PCIe error's ``bert.pci``).
  A record ends at the next one, at any other ``BERT: `` line (6.0+'s ``Skipped``, 6.1+'s ``Total
  records found``, ``[Firmware Bug]``), ``BERT_SLACK_S`` after the print's last line or at the
  input's end (``previous_boot()``); records BERT skipped (6.0+: past 5, or too long) are not printed
  and count nothing, nor do those of one print past ``MAX_BERT_RECORDS``. bert.c prints once per
  boot: a host's prints whose headers come within ``BERT_COPY_S`` of the first are copies (dmesg's
  and the journal's in one file), which count the records of the copy that has the most.

>>> ev = FabricEvents()
>>> ev.apply("n1", "mlx5_core 0000:3b:00.0 ens1f0np0: Link down")
{'nic.device': '0000:3b:00.0', 'nic.netdev': 'ens1f0np0', 'nic.message': 'Link down'}
>>> ev.counts("n1")["nic_link_down_events"]
1
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypeVar

LABEL_MAX = 200  # characters of the kernel's message kept on the record

# Every counter this module keeps, by catalogue alias (pipeline/data/host_fields.csv).
FIELDS = (
    "nic_link_down_events",
    "nic_module_errors",
    "nic_health_errors",
    "nic_driver_warnings",
    "pcie_aer_log_correctable",
    "pcie_aer_log_nonfatal",
    "pcie_aer_log_fatal",
    "nccl_crashes",
    "host_fatal_errors_previous_boot",
)
PREVIOUS_BOOT = "host_fatal_errors_previous_boot"

# "[<driver> ]<bdf>[ <ifname>]: <text>" (dev_printk / netdev_printk) or "<ifname>: <text>".
_DEV = re.compile(
    r"^(?:(?:(?P<drv>[\w-]{1,32}) )?(?P<bdf>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
    r"(?: (?P<ifname>[^\s:]{1,32}))?|(?P<netdev>[\w.@-]{1,32})): (?P<text>.*)$",
    re.ASCII,
)
# An interface's name after a driver's prefix ("mlx4_en: ens1: Link Down", en_netdev.c's en_info).
_INNER = re.compile(r"([\w.@-]{1,32}): ", re.ASCII)
# mlx5_core_* prints "<func>:<line>:(pid N): " before the text on older kernels.
_FUNC = re.compile(r"^[\w]{1,64}:\d{1,6}:\(pid \d{1,10}\): ", re.ASCII)
_MODULE = re.compile(
    r"Port module event(?:\[error\])?: module (?P<mod>\d{1,4}), "
    r"(?P<status>Cable plugged|Cable unplugged|Cable error|Cable disabled)"
    r"(?:, (?P<reason>.*))?$",
    re.ASCII,
)
_HEALTH = re.compile(
    r"device's health compromised|Fatal error \d{1,10} detected|timeout\. Will cause a leak of a command resource",
    re.ASCII,
)
_LINK_DOWN = re.compile(r"(?:^|\s)(?:NIC )?Link (?:is )?down\b|\blost carrier\b", re.ASCII | re.IGNORECASE)
# A superset of what classify() reads, tested first: most kernel lines are none of these (a GHES
# line only as _HW reads it: mce's "mce: [Hardware Error]: ..." lines, a busy log's, are not one).
_WANT = re.compile(
    r"AER|PCIe Bus Error|can't find device of ID|Port module event|health compromised|Fatal error|Will cause a leak|"
    r"^\s*(?:\{\d{1,10}\})?\[Hardware Error\]|^BERT: |aer_|pci_dev for|\[\s?\d{1,2}\] |"
    r"NETDEV WATCHDOG|TX timeout|insufficient power on the PCIe slot| in libnccl|"
    r"(?i:link (?:is )?down|lost carrier)",
    re.ASCII,
)
# dev_watchdog()'s WARN_ONCE line (no device prefix; " %u ms" added later) and its netdev_crit one
# (behind the interface's prefix); netdev names hold no whitespace, ":" or "/" (dev_valid_name()).
_WATCHDOG_WARN = re.compile(
    r"NETDEV WATCHDOG: (?P<netdev>[^\s:/]{1,32}) \([\w.-]{0,32}\): transmit queue (?P<q>\d{1,6}) timed out"
    r"(?: \d{1,10} ms)?$",
    re.ASCII,
)
_WATCHDOG = re.compile(r"NETDEV WATCHDOG: CPU: \d{1,5}: transmit queue (?P<q>\d{1,6}) timed out \d{1,10} ms$", re.ASCII)
_TX_DETECTED = re.compile(r"TX timeout detected$", re.ASCII)
_TX_QUEUE = re.compile(r"TX timeout on queue: (?P<q>\d{1,6}), SQ: 0x[0-9a-f]{1,8}\b", re.ASCII)
_SLOT_POWER = re.compile(r"Detected insufficient power on the PCIe slot \((?P<w>\d{1,5})W\)\.?$", re.ASCII)
# A fatal fault's report naming the mapping of the faulting instruction (the 16-character comm of
# old kernels or the longer comm_str of newer ones, any characters: "[" and "]" included). The
# mapping is print_vma_addr()'s: "<name>[<start>+<size>]" (d_path()'s name: " (deleted)" after a
# file replaced since it was mapped), or in later kernels "%pD[<offset>,<start>+<size>]".
_NCCL_CRASH = re.compile(
    r"^(?:traps: )?(?P<comm>.{1,64}?)\[(?P<pid>\d{1,10})\]:? "
    r"(?P<fault>segfault|general protection|control protection|trap [\w -]{1,32}?(?= ip:)|unhandled exception"
    r"|unhandled signal)\b"
    r".{0,400}? in (?P<lib>libnccl[\w+-]{0,32}\.so(?:\.\w{1,16}){0,4})(?: \(deleted\))?"
    r"\[(?:[0-9a-f]{1,16},)?[0-9a-f]{1,16}\+[0-9a-f]{1,16}\]",
    re.ASCII,
)
_SEV = r"(?P<sev>Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-Fatal|Fatal)\))"
_AER_RECEIVED = re.compile(
    r"(?:AER: )?(?P<multi>Multiple )?"
    + _SEV
    + r" error (?:message )?received(?: from)?:? (?:id=)?(?P<src>[0-9a-fA-F:.]{4,16})"
    + r"(?P<none> \(no details found\))?",
    re.ASCII,
)
_AER_BUS_ERROR = re.compile(
    r"(?:AER: )?PCIe Bus Error: severity=" + _SEV + r"(?:, type=(?P<type>[^,]{1,40}))?", re.ASCII
)
# Any other AER line: the "AER: " of aer.c's dev_fmt (5.2+), and 4.19's find_source_device() word
# that no detail follows, without it. The kernel prints a report's detail right after its
# "received" line, so one of these from its port or source means that report has no more.
_AER_OTHER = re.compile(r"^AER: |^can't find device of ID", re.ASCII)
# The port's own word that it found no device with an error logged (4.19-6.7, 6.8-6.15).
_AER_NO_DEVICE = re.compile(r"^(?:AER: )?(?:can't find device of ID|found no error details for)", re.ASCII)
# A detail line's continuation: aer.c indents every one ("  device [", "   [%2d] ", "  TLP Header",
# "  Error of this Agent is reported first"), while its other lines start with a word.
_AER_CONTINUED = re.compile(r"^(?:AER: )?\s", re.ASCII)
_BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", re.ASCII)
MAX_REPORTS = 32  # AER reports awaiting their detail per host: one per root port, oldest dropped
# libata's link prefix ("ata%u: ", "ata%u.%02u: " behind a port multiplier): a disk port, not a NIC.
_ATA_LINK = re.compile(r"ata\d{1,4}(?:\.\d{1,2})?", re.ASCII)

# Firmware-first AER (docs/producers.md#kernel-log): ghes.c prefixes every line of a record with
# "{<seq>}[Hardware Error]: " (the "{<seq>}" read as optional), cper.c indents sections by one space
# and their fields by two, which is not relied on (mail clients strip it).
_HW = re.compile(r"^\s*(?:\{(?P<seq>\d{1,10})\})?\[Hardware Error\]: ?(?P<text>.*)$", re.ASCII)
_CPER_SEV = r"(?P<sev>corrected|recoverable|fatal|info|unknown)"
_CPER_HEADER = re.compile(r"Hardware error from APEI Generic Hardware Error Source: \d{1,10}$", re.ASCII)
_CPER_EVENT = re.compile(r"event severity: " + _CPER_SEV + r"$", re.ASCII)
_CPER_SECTION = re.compile(r"Error \d{1,5}, type: " + _CPER_SEV + r"$", re.ASCII)
_CPER_TYPE = re.compile(r"section[_ ]type: (?P<type>.{0,80})$", re.ASCII)
_CPER_DEVICE = re.compile(r"device_id: (?P<bdf>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$", re.ASCII)
# cper_severity_to_aer(): what the AER driver makes of a section's severity.
_CPER_WHAT = {
    "corrected": "pcie_aer_log_correctable",
    "info": "pcie_aer_log_correctable",
    "unknown": "pcie_aer_log_correctable",
    "recoverable": "pcie_aer_log_nonfatal",
    "fatal": "pcie_aer_log_fatal",
}
# pci_print_aer() / cper_print_aer() on the device's lines, after dev_fmt's "AER: " (5.2+).
_FF_STATUS = re.compile(r"aer_status: 0x(?P<status>[0-9a-f]{8}), aer_mask: 0x(?P<mask>[0-9a-f]{8})$", re.ASCII)
_FF_BIT = re.compile(r"\s{1,8}\[\s?(?P<bit>\d{1,2})\] (?P<name>[A-Za-z][\w /-]{0,40}?)\s*(?:\(First\))?\s*$", re.ASCII)
_FF_LAYER = re.compile(
    r"aer_layer=(?P<layer>Physical Layer|Data Link Layer|Transaction Layer), "
    r"aer_agent=(?P<agent>Receiver ID|Requester ID|Completer ID|Transmitter ID)$",
    re.ASCII,
)
_FF_UNCOR = re.compile(r"aer_uncor_severity: 0x(?P<sev>[0-9a-f]{8})$", re.ASCII)
# aer_recover_work_func() finds no device (5.x+ "no pci_dev for", 4.x "AER recover: Can not find
# pci_dev for") or aer_recover_queue()'s ring is full: that report has no print of its own.
_FF_GONE = re.compile(
    r"(?:no pci_dev for|Can not find pci_dev for|Buffer overflow when recovering AER for) "
    r"(?P<dom>[0-9a-f]{4}):(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{1,2})[.:](?P<fn>[0-7])$",
    re.ASCII,
)
# The AER status registers' bits (PCIe r6.0 7.8.4.2-7.8.4.5): the correctable register has only these.
_COR_BITS = 0x0000F1C1
# aer.c's AER_GET_LAYER_ERROR / AER_GET_AGENT masks, by class.
_COR_DLL, _COR_TRANSMITTER = 0x000011C0, 0x00001100
_UNC_DLL, _UNC_REQUESTER, _UNC_COMPLETER = 0x00000010, 0x00104000, 0x00008000
# Bit 13 alone reads the same layer and agent either way: its name says which register it is.
_COR_NAMES = frozenset({"NonFatalErr", "Advisory Non-Fatal"})
_UNC_NAMES = frozenset({"FCP", "Flow Control Protocol"})
MAX_CPER = 32  # GHES records, AER prints and unpaired printings kept per host, oldest dropped
MAX_UNPAIRED = 16  # printings of one device and class awaiting the other kind (AER_RECOVER_RING_SIZE)
# How far apart in time two printings of one report may be: GHES queues the section for the AER
# driver (aer_recover_queue()), whose work item prints it within milliseconds; an unpaired printing
# older than this is a report whose other printing was rate-limited, not one still to come.
PAIR_WINDOW = 5.0

# The firmware's Boot Error Record Table (drivers/acpi/apei/bert.c, bert_print_all()): at boot the
# kernel prints the records of errors the previous boot could not report (a fatal one panicked it:
# ghes.c's __ghes_panic()) with pr_fmt "BERT: ", "Error records from previous boot:" once (before
# 5.17 before the first record, then in the loop, pr_info_once), then each record through cper.c's
# cper_estatus_print() with the bare HW_ERR prefix "[Hardware Error]: " (no "{seq}": that is
# ghes.c's and acpi_extlog.c's). Every other "BERT: " line ends the print: 6.0+'s "[Hardware Error]:
# Skipped %d error records" (records past ACPI_BERT_PRINT_MAX_RECORDS or ACPI_BERT_PRINT_MAX_LEN),
# 6.1+'s "Total records found: %d", 5.17-5.19's "Max print length exceeded, table data is available
# at:", FW_BUG's "[Firmware Bug]: Invalid error record." / "Truncated status block (length: %u).".
_BERT_HEADER = re.compile(r"BERT: Error records from previous boot:?\s*$", re.ASCII)
_BERT_LINE = re.compile(r"BERT: ", re.ASCII)
_CPER_CORRECTED = "It has been corrected by h/w and requires no further action"
_CPER_SECTION_NO = re.compile(r"Error (?P<no>\d{1,5}), type: ", re.ASCII)
# cper_print_mem(): physical_address, cper_mem_err_location()'s "node:%d card:%d ..." ("node: %d "
# before 5.10), "error_type: %d, <name>" and cper_dimm_err_location()'s "DIMM location: ...".
_MEM_PA = re.compile(r"physical_address: (?P<pa>0x[0-9a-f]{1,16})$", re.ASCII)
_MEM_KEYS = (
    "node|card|module|rank|bank|bank_group|bank_address|device|row|column|bit_position|chip_id"
    "|requestor_id|responder_id|target_id"
)
_MEM_PAIR = r"(?:" + _MEM_KEYS + r"): ?(?:0x[0-9a-f]{1,16}|-?\d{1,10})"
_MEM_LOCATION = re.compile(r"(?:" + _MEM_PAIR + r" ?){1,15}$", re.ASCII)
_MEM_FIELD = re.compile(r"(?P<key>" + _MEM_KEYS + r"): ?(?P<v>0x[0-9a-f]{1,16}|-?\d{1,10})", re.ASCII)
_MEM_TYPE = re.compile(r"error_type: \d{1,3}, (?P<name>[\w /-]{1,40})$", re.ASCII)
_MEM_DIMM = re.compile(r"DIMM location: (?P<dimm>[\x20-\x7e]{1,80}?)\s*$", re.ASCII)
# The time within which a BERT print's lines come (one initcall, milliseconds apart): a bare
# "[Hardware Error]: " line later than this after the print's last line is not the print's.
BERT_SLACK_S = 10.0
MAX_BERT_SECTIONS = 8  # section types named on one record's labels
# bert.c prints each boot's table once (a late initcall), a few seconds after the boot: BERT
# headers of a host within this of the first (a dmesg copy and a journal copy of the boot in one
# file, which second-resolution times do not tell apart) are copies of one print, which counts the
# records of its copy that has the most (a copy's records count past the others' only). Two boots'
# prints are further apart (a panic, a reboot and firmware's POST).
BERT_COPY_S = 60.0
# The records one print counts (6.0+ prints at most 5, ACPI_BERT_PRINT_MAX_RECORDS; older kernels
# the table's, a few): a header followed by endless records counts no more than these.
MAX_BERT_RECORDS = 64
MAX_BERT_DONE = 64  # records of a previous boot ended but not yet taken (KernelLog takes them per line)

_K = TypeVar("_K")
_V = TypeVar("_V")


def _severity(text: str) -> str:
    if text.startswith("Correct"):
        return "pcie_aer_log_correctable"
    return "pcie_aer_log_fatal" if text.endswith("(Fatal)") else "pcie_aer_log_nonfatal"


def _source(src: str, port: str | None) -> str | None:
    """A "received" line's source as a bus id: ``0000:3b:00.0`` as printed, the older raw
    ``id=0018`` (bus 0x00, devfn 0x18) in the port's domain; ``None`` for anything else.

    >>> _source("0018", "0000:00:1c.0")
    '0000:00:03.0'
    """
    src = src.lower()
    if _BDF.fullmatch(src):
        return src
    if len(src) != 4 or not all(c in "0123456789abcdef" for c in src):
        return None
    rid = int(src, 16)
    domain = port.split(":", 1)[0] if port else "0000"
    return f"{domain}:{rid >> 8:02x}:{(rid & 0xFF) >> 3:02x}.{rid & 7}"


def _tx_kind(text: str) -> tuple[str, dict[str, str]] | None:
    """A transmit-timeout line's kind for ``_Host.tx_event`` and its labels, else ``None``.

    >>> _tx_kind("TX timeout on queue: 5, SQ: 0x10b, CQ: 0x40f, SQ Cons: 0x0 SQ Prod: 0x3")
    ('queue', {'nic.queue': '5'})
    """
    if (w := _WATCHDOG.match(text)) is not None:
        return "watchdog", {"nic.queue": w["q"]}
    if _TX_DETECTED.match(text) is not None:
        return "detected", {}
    if (q := _TX_QUEUE.match(text)) is not None:
        return "queue", {"nic.queue": q["q"]}
    return None


@dataclass
class _Report:
    """A root port's AER report whose detail may still follow."""

    source: str | None
    what: str
    labels: dict[str, str]
    counted: bool  # False: a source the kernel does not trust, counted by its detail or "no device" line


def _layer_agent(cls: str, status: int) -> tuple[str, str]:
    """The layer and agent ``pci_print_aer()`` prints for ``status`` read as ``cls`` ("cor" or
    "unc"), as aer.c's ``AER_GET_LAYER_ERROR`` and ``AER_GET_AGENT`` compute them.

    >>> _layer_agent("cor", 0x1000)
    ('Data Link Layer', 'Transmitter ID')
    """
    if cls == "cor":
        layer = "Physical Layer" if status & 1 else "Data Link Layer" if status & _COR_DLL else "Transaction Layer"
        return layer, "Transmitter ID" if status & _COR_TRANSMITTER else "Receiver ID"
    layer = "Data Link Layer" if status & _UNC_DLL else "Transaction Layer"
    agent = "Completer ID" if status & _UNC_COMPLETER else "Requester ID" if status & _UNC_REQUESTER else "Receiver ID"
    return layer, agent


def _aer_class(status: int | None, layer: str, agent: str, names: set[str]) -> str | None:
    """Whether a ``pci_print_aer()`` report was correctable ("cor") or not ("unc"), from what it
    printed; ``None`` when both read alike (bit 13 alone without its name, or a cut print)."""

    def fits(c: str) -> bool:
        if status is None:  # a print cut before its status line: only the words can tell
            if c == "cor":
                return agent not in ("Requester ID", "Completer ID")
            return layer != "Physical Layer" and agent != "Transmitter ID"
        if c == "cor" and status & ~_COR_BITS:
            return False
        return _layer_agent(c, status) == (layer, agent)

    classes = [c for c in ("cor", "unc") if fits(c)]
    cor_named, unc_named = bool(names & _COR_NAMES), bool(names & _UNC_NAMES)
    if len(classes) == 2 and cor_named != unc_named:
        classes = ["cor"] if cor_named else ["unc"]
    return classes[0] if len(classes) == 1 else None


@dataclass
class _Block:
    """The GHES record being printed under one ``{seq}``: its severities and current section."""

    event: str | None = None
    section: str | None = None
    pcie: bool = False
    counted: bool = False


@dataclass
class _BertRecord:
    """One CPER record of a BERT print: its severities, section types and labels so far."""

    event: str | None = None  # "event severity: <sev>"
    sections: list[str | None] = field(default_factory=list)  # each section's "type: <sev>"
    types: list[str] = field(default_factory=list)  # the section types, in order, once each
    current: str | None = None  # the current section's type
    labels: dict[str, str] = field(default_factory=dict)
    corrected: bool = False  # begun by cper's "It has been corrected by h/w" line

    def fatal(self) -> bool:
        return self.event == "fatal" or "fatal" in self.sections

    def done(self) -> dict[str, str] | None:
        """The record's labels when it is a fatal one (it counts), else ``None``."""
        if not self.fatal():
            return None
        labels = {"bert.severity": "fatal"}
        if self.types:
            labels["bert.section"] = ", ".join(self.types)[:LABEL_MAX]
        return labels | self.labels


@dataclass
class _Bert:
    """A host's BERT print (``bert.c``'s ``bert_print_all()``) being read."""

    last: float | None = None  # the time of its latest line, when known
    lines: int = 0  # its lines read so far
    record: _BertRecord | None = None
    flushed: bool = False  # its open record was taken: a section line without a record start is that record's
    records: int = 0  # its fatal records ended so far (at most MAX_BERT_RECORDS)


@dataclass
class _Print:
    """A device's ``pci_print_aer()`` lines so far."""

    status: int | None
    mask: int
    names: set[str] = field(default_factory=set)
    cls: str | None = None  # "unc": its aer_uncor_severity line decides; "done": the rest counts nothing
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class _Host:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    # The reports awaiting their detail, by root port (None: a line without a bus id), oldest first.
    reports: dict[str | None, _Report] = field(default_factory=dict)
    blocks: dict[str | None, _Block] = field(default_factory=dict)  # GHES records by {seq}
    prints: dict[str, _Print] = field(default_factory=dict)  # pci_print_aer() in progress, by device
    # Printings of a report that counted it, by (device, class): > 0 GHES sections awaiting their
    # AER print, < 0 AER prints awaiting their GHES section.
    unpaired: dict[tuple[str, str], int] = field(default_factory=dict)
    unpaired_at: dict[tuple[str, str], float] = field(default_factory=dict)  # the latest's time, when known
    bert: _Bert | None = None  # the BERT print being read
    bert_at: float | None = None  # the header's time of the first of the host's last print's copies
    bert_counted: int = 0  # the records those copies counted: the most any of them had
    bert_done: list[dict[str, str]] = field(default_factory=list)  # its fatal records ended, not yet taken
    # Each interface's last transmit timeout: "watchdog" (its driver's report may follow) or "driver".
    tx: dict[str, str] = field(default_factory=dict)

    def tx_event(self, netdev: str, kind: str) -> bool:
        """Whether a transmit-timeout line of ``kind`` ("watchdog", "detected" or "queue") for
        ``netdev`` is a new event (it counts) rather than a line of the event being printed.

        >>> h = _Host()
        >>> [h.tx_event("eth0", k) for k in ("watchdog", "detected", "queue", "detected", "queue")]
        [True, False, False, True, False]
        """
        last = self.tx.get(netdev)
        new = kind == "watchdog" or (kind == "detected" and last != "watchdog") or (kind == "queue" and last is None)
        self.keep(self.tx, netdev, "watchdog" if kind == "watchdog" else "driver")
        return new

    def waiting(self, key: tuple[str, str], ts: float | None) -> int:
        """The unpaired printings of ``key`` (> 0 GHES sections, < 0 AER prints) that a printing
        at ``ts`` may still pair with: none once the latest is more than ``PAIR_WINDOW`` away."""
        at = self.unpaired_at.get(key)
        if ts is not None and at is not None and abs(ts - at) > PAIR_WINDOW:
            return 0
        return self.unpaired.get(key, 0)

    def pair(self, key: tuple[str, str], kind: int, ts: float | None = None) -> bool:
        """Whether a printing of ``kind`` (1: GHES section, -1: AER print) at ``ts`` is the other
        half of an unpaired one (then it counts nothing); else it is kept unpaired itself.

        >>> h = _Host()
        >>> h.pair(("0000:3b:00.0", "cor"), 1, 100.0), h.pair(("0000:3b:00.0", "cor"), -1, 100.2)
        (False, True)
        >>> h.pair(("0000:3b:00.0", "cor"), 1, 100.0), h.pair(("0000:3b:00.0", "cor"), -1, 3700.0)
        (False, False)
        """
        n = self.waiting(key, ts)
        self.unpaired.pop(key, None)
        at = self.unpaired_at.pop(key, None)
        if n * kind < 0:
            if n + kind:
                self.unpaired[key] = n + kind
                if at is not None:
                    self.unpaired_at[key] = at
            return True
        if len(self.unpaired) >= MAX_CPER:
            oldest = next(iter(self.unpaired))
            del self.unpaired[oldest]
            self.unpaired_at.pop(oldest, None)
        self.unpaired[key] = max(-MAX_UNPAIRED, min(MAX_UNPAIRED, n + kind))
        when = ts if ts is not None else at  # an untimed printing keeps the last timed one's time
        if when is not None:
            self.unpaired_at[key] = when
        return False

    @staticmethod
    def keep(table: dict[_K, _V], key: _K, value: _V) -> _V:
        """``value`` under ``key`` as the newest of at most ``MAX_CPER`` entries."""
        table.pop(key, None)
        if len(table) >= MAX_CPER:
            del table[next(iter(table))]
        table[key] = value
        return value

    def report(self, port: str | None, rep: _Report) -> None:
        self.reports.pop(port, None)  # a port reports one error at a time (aer_isr() drains its fifo in order)
        if len(self.reports) >= MAX_REPORTS:
            del self.reports[next(iter(self.reports))]
        self.reports[port] = rep

    def detail(self, device: str | None, what: str) -> bool:
        """Whether a "PCIe Bus Error" line of ``device`` is the detail of a report it ends."""
        for port, rep in reversed(self.reports.items()):
            if rep.counted and rep.what == what and (rep.source == device or device is None):
                del self.reports[port]  # a line without a bus id can pair by severity only: the latest report
                return True
        return False

    def other(self, device: str, no_device: bool) -> tuple[str, dict[str, str]] | None:
        """End the reports of ``device`` (their port or source); an uncounted report its port says
        it found no device for is counted now: its counter and labels."""
        got = None
        for port in [p for p, r in self.reports.items() if device in (p, r.source)]:
            rep = self.reports.pop(port)
            if no_device and not rep.counted and port == device:
                got = rep.what, rep.labels
        return got


class FabricEvents:
    """Each host's NIC and AER event counters, fed one kernel message at a time."""

    def __init__(self) -> None:
        self.hosts: dict[str, _Host] = {}
        self.lines: dict[str, int] = dict.fromkeys(FIELDS, 0)  # lines counted, by field

    def counts(self, host: str) -> dict[str, int]:
        """The host's counters (zeros for a host never seen).

        >>> FabricEvents().counts("n1")["pcie_aer_log_fatal"]
        0
        """
        h = self.hosts.get(host)
        return dict(h.counts) if h is not None else dict.fromkeys(FIELDS, 0)

    def wants(self, msg: str) -> bool:
        """Whether ``msg`` may be a line ``apply`` counts (a cheap test before the regexes)."""
        # cet.c's control protection line is the one counted without a ": " (no pr_fmt).
        return (": " in msg or " in libnccl" in msg) and _WANT.search(msg) is not None

    def apply(self, host: str, msg: str, *, count: bool = True, ts: float | None = None) -> dict[str, str] | None:
        """Count ``msg`` for ``host`` when it is a NIC or AER event and return its labels;
        ``None`` for any other line and for an AER detail line its "received" line counted.
        ``count=False`` (a follower's backlog) follows the AER pairing without counting.

        >>> ev = FabricEvents()
        >>> ev.apply("n1", "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged")["nic.module"]
        '0'
        >>> ev.apply("n1", "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable plugged") is None
        True
        """
        got = self.classify(host, msg, ts)
        if got is None:
            return None
        if count:
            self.count(host, got[0])
        return got[1]

    def classify(self, host: str, msg: str, ts: float | None = None) -> tuple[str, dict[str, str]] | None:
        """The counter ``msg`` moves and its labels, without counting it; ``None`` for any other
        line, for an AER detail line of the device a pending "received" line named (which it
        ends) and for a "received" line whose source the kernel does not trust (its detail counts).
        ``ts``: the line's time, which bounds how far apart a report's two firmware-first
        printings may be (``PAIR_WINDOW``; ``None``: not bounded).

        >>> ev = FabricEvents()
        >>> ev.classify("n1", "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0")[0]
        'pcie_aer_log_correctable'
        >>> ev.classify("n1", "nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)")
        """
        if (hw := _HW.match(msg)) is not None:
            if hw["seq"] is None and self._bert_open(host, ts):
                self._bert_hw(self.hosts[host], hw["text"].strip(), ts)
                return None
            return self._ghes(host, hw["seq"], hw["text"].strip(), ts)
        if _BERT_LINE.match(msg) is not None:
            self._bert_line(host, msg, ts)
            return None
        if (gone := _FF_GONE.search(msg)) is not None:
            st = self.hosts.get(host)
            if st is not None:  # the report's section stays the one printing that counted it
                dev = f"{gone['dom']}:{gone['bus']}:{int(gone['dev'], 16):02x}.{gone['fn']}"
                for cls in ("cor", "unc"):
                    if st.waiting((dev, cls), ts) > 0:
                        st.pair((dev, cls), -1, ts)
                        break
            return None
        if "libnccl" in msg and (c := _NCCL_CRASH.match(msg)) is not None:
            return "nccl_crashes", {
                "nccl.process": c["comm"].strip(),
                "nccl.pid": c["pid"],
                "nccl.library": c["lib"],
                "nccl.fault": c["fault"].strip(),
                "nccl.message": msg[:LABEL_MAX],
            }
        if (w := _WATCHDOG_WARN.match(msg)) is not None:  # WARN_ONCE's: no device prefix
            st = self.hosts.setdefault(host, _Host())
            st.tx_event(w["netdev"], "watchdog")
            return "nic_driver_warnings", {
                "nic.netdev": w["netdev"],
                "nic.queue": w["q"],
                "nic.message": msg[:LABEL_MAX],
            }
        m = _DEV.match(msg)
        if m is None:
            return None
        text = _FUNC.sub("", m["text"], count=1)
        st = self.hosts.get(host)
        bdf = m["bdf"].lower() if m["bdf"] is not None else None
        labels: dict[str, str]
        if bdf is not None and (ff := text[5:] if text.startswith("AER: ") else text).startswith(("aer_", " ")):
            if ff.startswith("aer_") or (st is not None and bdf in st.prints):
                return self._aer_print(host, bdf, ff, ts)
        if (r := _AER_RECEIVED.search(text)) is not None:
            what = _severity(r["sev"])
            st = st or self.hosts.setdefault(host, _Host())
            labels = {"aer.severity": r["sev"], "aer.source": r["src"]}
            src = _source(r["src"], bdf)
            if r["none"]:  # 6.16 says on the line itself that no detail follows
                st.reports.pop(bdf, None)
            else:
                # A source on bus 0 other than the port is one the kernel searched the status
                # registers for (is_error_source()): the devices' own lines say which.
                trusted = src is not None and (src == bdf or src.split(":")[-2] != "00")
                labels = self._labels(m, text, "aer", labels)
                st.report(bdf, _Report(src, what, labels, trusted))
                if not trusted:
                    return None
                return what, dict(labels)
        elif (b := _AER_BUS_ERROR.search(text)) is not None:
            what = _severity(b["sev"])
            if st is not None and st.detail(bdf, what):  # the detail of the report naming this device
                return None
            labels = {"aer.severity": b["sev"], "aer.type": (b["type"] or "").strip()}
        elif (mo := _MODULE.search(text)) is not None:
            if mo["status"] == "Cable plugged":  # a module in service; "Unknown status" does not match at all
                return None
            what, labels = "nic_module_errors", {"nic.module": mo["mod"]}
        elif _HEALTH.search(text) is not None and (m["drv"] or "").startswith("mlx5"):
            what, labels = "nic_health_errors", {}
        elif (tx := _tx_kind(text)) is not None:
            st = st or self.hosts.setdefault(host, _Host())
            if not st.tx_event(m["ifname"] or m["netdev"] or bdf or "", tx[0]):
                return None  # the driver's report of the timeout a line before counted
            what, labels = "nic_driver_warnings", tx[1]
        elif (pw := _SLOT_POWER.match(text)) is not None and bdf is not None:
            what, labels = "nic_driver_warnings", {"nic.slot_power": pw["w"] + "W"}
        elif (
            _LINK_DOWN.search(text) is not None
            and "pciehp" not in text
            and "Slot(" not in text
            and _ATA_LINK.fullmatch(m["netdev"] or "") is None
        ):
            what, labels = "nic_link_down_events", {}  # pciehp's "Slot(N): Link Down" is a slot, not a NIC
        else:
            if st is None or bdf is None or _AER_CONTINUED.match(text) or not _AER_OTHER.search(text):
                return None
            got = st.other(bdf, _AER_NO_DEVICE.match(text) is not None)
            return (got[0], dict(got[1])) if got is not None else None
        return what, self._labels(m, text, "aer" if what.startswith("pcie") else "nic", labels)

    def _ghes(self, host: str, seq: str | None, text: str, ts: float | None) -> tuple[str, dict[str, str]] | None:
        """A line of a GHES record (``{seq}[Hardware Error]: <text>``): a PCIe section's counter
        and labels at its ``device_id`` line, unless its device's AER print counted it."""
        st = self.hosts.setdefault(host, _Host())
        if _CPER_HEADER.match(text):
            st.keep(st.blocks, seq, _Block())
            return None
        block = st.blocks.get(seq) or st.keep(st.blocks, seq, _Block())  # a record cut before its header
        if (e := _CPER_EVENT.match(text)) is not None:
            block.event = e["sev"]
        elif (sec := _CPER_SECTION.match(text)) is not None:
            block.section, block.pcie, block.counted = sec["sev"], False, False
        elif (t := _CPER_TYPE.match(text)) is not None:
            block.pcie = t["type"] == "PCIe error"
        elif (d := _CPER_DEVICE.match(text)) is not None and block.pcie and not block.counted:
            sev = block.section or block.event
            if sev is None:  # a record cut before its severities
                return None
            block.counted = True
            what = _CPER_WHAT[sev]
            cls = "cor" if what == "pcie_aer_log_correctable" else "unc"
            # A fatal record panics the kernel (__ghes_panic()) before any AER print.
            if block.event != "fatal" and st.pair((d["bdf"], cls), 1, ts):
                return None
            return what, {"aer.severity": sev, "aer.device": d["bdf"], "aer.message": text[:LABEL_MAX]}
        return None

    def previous_boot(self, host: str, ts: float | None = None, *, end: bool = False) -> list[dict[str, str]]:
        """The labels of each fatal record of a previous boot that ``host``'s BERT print has ended
        since the last call (``KernelLog`` counts them in ``host_fatal_errors_previous_boot``).
        ``ts``: the time of the line about to be read; a print whose last line is more than
        ``BERT_SLACK_S`` before it has ended. ``end``: the input has ended for now (a saved file's
        end, a follower's poll with nothing more of the print), so its open record ends; a section
        line that follows without a record start of its own is that record's and counts nothing.

        >>> ev = FabricEvents()
        >>> for ln in ("BERT: Error records from previous boot:", "[Hardware Error]: event severity: fatal",
        ...            "[Hardware Error]:  Error 0, type: fatal", "[Hardware Error]:   section_type: memory error",
        ...            "[Hardware Error]:   node:1 card:0 module:4 rank:0 bank:3 row:9 column:8 "):
        ...     ev.classify("n1", ln, 2.5)
        >>> [(d["bert.section"], d["bert.module"]) for d in ev.previous_boot("n1", end=True)]
        [('memory error', '4')]
        """
        st = self.hosts.get(host)
        if st is None:
            return []
        b = st.bert
        if b is not None and ts is not None and b.last is not None and ts - b.last > BERT_SLACK_S:
            self._bert_end(st)
            st.bert = None
        elif b is not None and end and b.record is not None:
            self._bert_end(st)
            b.flushed = True
        done, st.bert_done = st.bert_done, []
        return done

    def bert_lines(self, host: str) -> int | None:
        """The lines of ``host``'s open BERT print read so far; ``None`` when none is open."""
        st = self.hosts.get(host)
        return st.bert.lines if st is not None and st.bert is not None else None

    def _bert_open(self, host: str, ts: float | None) -> bool:
        """Whether a bare ``[Hardware Error]: `` line of ``host`` at ``ts`` is its BERT print's."""
        st = self.hosts.get(host)
        b = st.bert if st is not None else None
        if st is None or b is None:
            return False
        if ts is not None and b.last is not None and ts - b.last > BERT_SLACK_S:
            self._bert_end(st)  # the print ended long before: this line is no record of it
            st.bert = None
            return False
        return True

    def _bert_line(self, host: str, msg: str, ts: float | None) -> None:
        """A ``BERT: `` line: the print's header opens it, any other ends it (and its record)."""
        st = self.hosts.setdefault(host, _Host())
        if st.bert is not None:
            self._bert_end(st)
        if _BERT_HEADER.match(msg) is None:
            st.bert = None
            return
        if ts is None or st.bert_at is None or abs(ts - st.bert_at) > BERT_COPY_S:  # not a copy
            st.bert_at, st.bert_counted = ts, 0
        st.bert = _Bert(last=ts)

    def _bert_hw(self, st: _Host, text: str, ts: float | None) -> None:
        """A line of a record of the BERT print (cper.c's ``cper_estatus_print()``)."""
        b = st.bert
        assert b is not None
        b.lines += 1
        if ts is not None:
            b.last = ts
        rec = b.record
        if text == _CPER_CORRECTED:  # printed before a corrected record's "event severity" line
            self._bert_end(st)
            b.record, b.flushed = _BertRecord(corrected=True), False
            return
        if (e := _CPER_EVENT.match(text)) is not None:  # a record's first line (after the above)
            if rec is None or not (rec.corrected and rec.event is None and not rec.sections):
                self._bert_end(st)
                rec = b.record = _BertRecord()
            rec.event, b.flushed = e["sev"], False
            return
        if (sec := _CPER_SECTION.match(text)) is not None:
            no = _CPER_SECTION_NO.match(text)
            first = no is not None and int(no["no"]) == 0
            if rec is None:
                if b.flushed:
                    return  # a section of the record taken before (its event line came before the take)
                rec = b.record = _BertRecord()  # a record whose "event severity" line is missing
            elif first and rec.sections:  # the next record, its "event severity" line missing
                self._bert_end(st)
                rec = b.record = _BertRecord()
            if len(rec.sections) < MAX_BERT_SECTIONS:
                rec.sections.append(sec["sev"])
            rec.current = None
            return
        if rec is None:
            return
        if (t := _CPER_TYPE.match(text)) is not None:
            kind = t["type"].strip()
            kind = "unknown" if kind.startswith("unknown") else kind  # "section type: unknown, <guid>"
            rec.current = kind
            if kind and kind not in rec.types and len(rec.types) < MAX_BERT_SECTIONS:
                rec.types.append(kind)
            return
        labels = rec.labels
        if rec.current == "memory error":
            if (pa := _MEM_PA.match(text)) is not None:
                labels.setdefault("bert.physical_address", pa["pa"])
            elif _MEM_LOCATION.match(text) is not None:
                for f in _MEM_FIELD.finditer(text):
                    labels.setdefault("bert." + f["key"], f["v"])
            elif (mt := _MEM_TYPE.match(text)) is not None:
                labels.setdefault("bert.error_type", mt["name"].strip())
            elif (dimm := _MEM_DIMM.match(text)) is not None:
                labels.setdefault("bert.dimm", dimm["dimm"])
        elif rec.current == "PCIe error" and (d := _CPER_DEVICE.match(text)) is not None:
            labels.setdefault("bert.pci", d["bdf"])

    @staticmethod
    def _bert_end(st: _Host) -> None:
        """End the BERT print's open record: its labels among the ended ones when it was fatal."""
        b = st.bert
        if b is None or b.record is None:
            return
        labels = b.record.done()
        b.record = None
        if labels is not None and b.records < MAX_BERT_RECORDS:
            b.records += 1
            if b.records <= st.bert_counted:  # a copy's record, which an earlier copy counted
                return
            st.bert_counted = b.records
            if len(st.bert_done) >= MAX_BERT_DONE:  # nobody takes them (FabricEvents alone): bounded
                del st.bert_done[0]
            st.bert_done.append(labels)

    def _aer_print(self, host: str, bdf: str, text: str, ts: float | None) -> tuple[str, dict[str, str]] | None:
        """A line of ``pci_print_aer()`` for device ``bdf`` (its "AER: " left out): the report's
        counter and labels at the line that decides its class, unless its GHES section counted it."""
        st = self.hosts.setdefault(host, _Host())
        if (s := _FF_STATUS.match(text)) is not None:
            st.other(bdf, False)  # like any other AER line of the device: its native report has ended
            st.keep(st.prints, bdf, _Print(int(s["status"], 16), int(s["mask"], 16)))
            return None
        pr = st.prints.get(bdf)
        if (b := _FF_BIT.match(text)) is not None:
            if pr is not None and len(pr.names) < 32:
                pr.names.add(b["name"])
            return None
        if (la := _FF_LAYER.match(text)) is not None:
            if pr is None or pr.cls is not None:  # a print cut before its status line
                pr = _Print(None, 0)
            labels = {"aer.device": bdf, "aer.type": la["layer"], "aer.message": text[:LABEL_MAX]}
            cls = _aer_class(pr.status, la["layer"], la["agent"], pr.names)
            if cls == "unc":
                pr.cls, pr.labels = "unc", labels
                st.keep(st.prints, bdf, pr)
                return None
            st.prints.pop(bdf, None)
            if cls is None and st.waiting((bdf, "unc"), ts) > 0 >= st.waiting((bdf, "cor"), ts):
                pr.cls = "done"  # the GHES section of an uncorrectable report: its severity line follows
                st.keep(st.prints, bdf, pr)
                st.pair((bdf, "unc"), -1, ts)
                return None
            if cls is None:
                pr.cls = "done"  # read as correctable, the common case: a severity line after it counts nothing
                st.keep(st.prints, bdf, pr)
            if st.pair((bdf, "cor"), -1, ts):
                return None
            return "pcie_aer_log_correctable", {"aer.severity": "Corrected", **labels}
        if (u := _FF_UNCOR.match(text)) is not None and pr is not None and pr.cls is not None:
            del st.prints[bdf]
            if pr.cls == "done" or st.pair((bdf, "unc"), -1, ts):
                return None
            fatal = pr.status is not None and pr.status & ~pr.mask & int(u["sev"], 16)
            what = "pcie_aer_log_fatal" if fatal else "pcie_aer_log_nonfatal"
            return what, {"aer.severity": "Uncorrected (Fatal)" if fatal else "Uncorrected (Non-Fatal)", **pr.labels}
        return None

    @staticmethod
    def _labels(m: re.Match[str], text: str, kind: str, labels: dict[str, str]) -> dict[str, str]:
        """``labels`` with the line's device, interface and message."""
        if m["bdf"] is not None:
            labels[f"{kind}.device"] = m["bdf"]
        netdev = m["ifname"] or m["netdev"]
        if m["netdev"] and (inner := _INNER.match(text)) is not None:
            netdev = inner[1]  # "mlx4_en: ens1: Link Down": a driver's pr_info before the interface's name
        if kind == "nic" and netdev:
            labels["nic.netdev"] = netdev
        labels[f"{kind}.message"] = text[:LABEL_MAX]
        return labels

    def count(self, host: str, what: str) -> None:
        """One more ``what`` event (a name in ``FIELDS``) for ``host``."""
        st = self.hosts.setdefault(host, _Host())
        st.counts[what] += 1
        self.lines[what] += 1


__all__ = ["FIELDS", "FabricEvents"]
