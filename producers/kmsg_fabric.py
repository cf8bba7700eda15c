"""The kernel log beyond the GPU: NIC (mlx5 and netdev) and PCIe AER lines, as event counters.

The kmsg producer (``producers/kmsg.py``) hands every message that is not an XID or SXid to
``FabricEvents.apply``, which recognises the lines the kernel prints and counts them per host
since the producer started (catalogue fields 9512-9517, docs/producers.md#kernel-log):

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
  ``TLP Header`` and ``Error of this Agent is reported first`` lines count nothing.

>>> ev = FabricEvents()
>>> ev.apply("n1", "mlx5_core 0000:3b:00.0 ens1f0np0: Link down")
{'nic.device': '0000:3b:00.0', 'nic.netdev': 'ens1f0np0', 'nic.message': 'Link down'}
>>> ev.counts("n1")["nic_link_down_events"]
1
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LABEL_MAX = 200  # characters of the kernel's message kept on the record

# Every counter this module keeps, by catalogue alias (pipeline/data/host_fields.csv).
FIELDS = (
    "nic_link_down_events",
    "nic_module_errors",
    "nic_health_errors",
    "pcie_aer_log_correctable",
    "pcie_aer_log_nonfatal",
    "pcie_aer_log_fatal",
)

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
# A superset of what classify() reads, tested first: most kernel lines are none of these.
_WANT = re.compile(
    r"AER|PCIe Bus Error|can't find device of ID|Port module event|health compromised|Fatal error|Will cause a leak|"
    r"(?i:link (?:is )?down|lost carrier)",
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


@dataclass
class _Report:
    """A root port's AER report whose detail may still follow."""

    source: str | None
    what: str
    labels: dict[str, str]
    counted: bool  # False: a source the kernel does not trust, counted by its detail or "no device" line


@dataclass
class _Host:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    # The reports awaiting their detail, by root port (None: a line without a bus id), oldest first.
    reports: dict[str | None, _Report] = field(default_factory=dict)

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
        return ": " in msg and _WANT.search(msg) is not None

    def apply(self, host: str, msg: str, *, count: bool = True) -> dict[str, str] | None:
        """Count ``msg`` for ``host`` when it is a NIC or AER event and return its labels;
        ``None`` for any other line and for an AER detail line its "received" line counted.
        ``count=False`` (a follower's backlog) follows the AER pairing without counting.

        >>> ev = FabricEvents()
        >>> ev.apply("n1", "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged")["nic.module"]
        '0'
        >>> ev.apply("n1", "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable plugged") is None
        True
        """
        got = self.classify(host, msg)
        if got is None:
            return None
        if count:
            self.count(host, got[0])
        return got[1]

    def classify(self, host: str, msg: str) -> tuple[str, dict[str, str]] | None:
        """The counter ``msg`` moves and its labels, without counting it; ``None`` for any other
        line, for an AER detail line of the device a pending "received" line named (which it
        ends) and for a "received" line whose source the kernel does not trust (its detail counts).

        >>> ev = FabricEvents()
        >>> ev.classify("n1", "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0")[0]
        'pcie_aer_log_correctable'
        >>> ev.classify("n1", "nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)")
        """
        m = _DEV.match(msg)
        if m is None:
            return None
        text = _FUNC.sub("", m["text"], count=1)
        st = self.hosts.get(host)
        bdf = m["bdf"].lower() if m["bdf"] is not None else None
        labels: dict[str, str]
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
