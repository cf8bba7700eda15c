"""The kernel log beyond the GPU: NIC (mlx5 and netdev) and PCIe AER lines, as event counters.

The kmsg producer (``producers/kmsg.py``) hands every message that is not an XID or SXid to
``FabricEvents.apply``, which recognises the lines the kernel prints and counts them per host
since the producer started (catalogue fields 9512-9517, docs/producers.md#kernel-log):

- mlx5 port module events (``drivers/net/ethernet/mellanox/mlx5/core/events.c``,
  ``port_module()``): ``Port module event: module %u, Cable unplugged`` and
  ``Port module event[error]: module %u, Cable error, <reason>`` -> ``nic_module_errors``
  (``Cable plugged`` is not an error);
- mlx5 health (``health.c``, ``poll_health()``; ``cmd.c``): ``device's health compromised -
  reached miss count``, ``Fatal error %u detected`` and ``... timeout. Will cause a leak of a
  command resource`` -> ``nic_health_errors``; the ``synd 0x..: unrecoverable hardware error``
  detail line that ``print_health_info()`` prints after them is the same event, not counted;
- link down: mlx5e's ``<ifname>: Link down`` (``en_main.c``), other drivers' ``NIC Link is
  Down`` / ``Link is Down``, IPoIB and network managers' ``lost carrier`` -> ``nic_link_down_events``
  (PCIe hot-plug's ``pciehp: Slot(N): Link Down`` is a slot and libata's ``ataN: SATA link down``
  a disk port, not NICs, and are not counted);
- AER (``drivers/pci/pcie/aer.c``): the root port's ``AER: [Multiple ]<severity> error
  received: <bdf>`` and each reporting device's ``PCIe Bus Error: severity=<severity>, type=...,
  (<agent> ID)`` -> ``pcie_aer_log_{correctable,nonfatal,fatal}``. One error is one "received"
  line and, as the next AER line, a "PCIe Bus Error" line of the same severity; the pair counts
  once. Any other AER line between them (``can't find device of ID``, ``found no error details
  for``, recovery) ends the wait, as does a "received" line ending in ``(no details found)``
  (6.16): a "PCIe Bus Error" line with no "received" line just before it (DPC, a second device
  of a ``Multiple`` report) counts on its own, and the ``device [vvvv:dddd] error status/mask=``,
  ``[nn] <name>`` and ``TLP Header`` detail lines count nothing.

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
    r"Port module event(?:\[error\])?: module (?P<mod>\d{1,4}), (?P<status>Cable plugged|Cable unplugged|Cable error)"
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
# "received" line, so one of these in between means that report has none.
_AER_OTHER = re.compile(r"^AER: |^can't find device of ID", re.ASCII)
# libata's link prefix ("ata%u: ", "ata%u.%02u: " behind a port multiplier): a disk port, not a NIC.
_ATA_LINK = re.compile(r"ata\d{1,4}(?:\.\d{1,2})?", re.ASCII)


def _severity(text: str) -> str:
    if text.startswith("Correct"):
        return "pcie_aer_log_correctable"
    return "pcie_aer_log_fatal" if text.endswith("(Fatal)") else "pcie_aer_log_nonfatal"


@dataclass
class _Host:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    pending: str | None = None  # the AER severity a "received" line announced, until the next AER line


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
        line and for an AER detail line whose "received" line is pending (which it consumes).

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
        labels: dict[str, str]
        if (r := _AER_RECEIVED.search(text)) is not None:
            what = _severity(r["sev"])
            st = st or self.hosts.setdefault(host, _Host())
            st.pending = None if r["none"] else what  # 6.16 says on the line itself that no detail follows
            labels = {"aer.severity": r["sev"], "aer.source": r["src"]}
        elif (b := _AER_BUS_ERROR.search(text)) is not None:
            what = _severity(b["sev"])
            pending = st.pending if st is not None else None
            if st is not None:
                st.pending = None
            if pending == what:  # the detail of the error its root port announced
                return None
            labels = {"aer.severity": b["sev"], "aer.type": (b["type"] or "").strip()}
        elif (mo := _MODULE.search(text)) is not None:
            if mo["status"] == "Cable plugged":
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
            if st is not None and _AER_OTHER.search(text) is not None:
                st.pending = None  # the report the last "received" line announced has no detail
            return None
        kind = "aer" if what.startswith("pcie") else "nic"
        if m["bdf"] is not None:
            labels[f"{kind}.device"] = m["bdf"]
        netdev = m["ifname"] or m["netdev"]
        if m["netdev"] and (inner := _INNER.match(text)) is not None:
            netdev = inner[1]  # "mlx4_en: ens1: Link Down": a driver's pr_info before the interface's name
        if kind == "nic" and netdev:
            labels["nic.netdev"] = netdev
        labels[f"{kind}.message"] = text[:LABEL_MAX]
        return what, labels

    def count(self, host: str, what: str) -> None:
        """One more ``what`` event (a name in ``FIELDS``) for ``host``."""
        st = self.hosts.setdefault(host, _Host())
        st.counts[what] += 1
        self.lines[what] += 1


__all__ = ["FIELDS", "FabricEvents"]
