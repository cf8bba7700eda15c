"""PCIe Advanced Error Reporting counters from sysfs: one record per GPU and poll.

The kernel counts, per PCIe device, the AER errors that device has seen, by severity
(Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, ``-aer`` from 6.16; Linux 4.19 and
later)::

    /sys/bus/pci/devices/<BDF>/aer_dev_correctable   RxErr 0 / BadTLP 0 / ... / TOTAL_ERR_COR 2
    /sys/bus/pci/devices/<BDF>/aer_dev_nonfatal      Undefined 0 / DLP 0 / ... / TOTAL_ERR_NONFATAL 0
    /sys/bus/pci/devices/<BDF>/aer_dev_fatal         Undefined 0 / DLP 0 / ... / TOTAL_ERR_FATAL 0

drivers/pci/pcie/aer.c prints one ``"%s %llu\n"`` line per named error bit, zero or not (the
short names of aer_correctable_error_string / aer_uncorrectable_error_string: 8 correctable;
17 uncorrectable in 4.19, 18 with ``PoisonTLPBlocked`` (2019), 23 with the PCIe r6.0 bits
(2025)), ``dev_cor_errs_bit[<n>] <count>`` (``dev_fatal_errs_``, ``dev_nonfatal_errs_``) for a bit
with no name only when it is not zero, then ``TOTAL_ERR_COR`` / ``_FATAL`` / ``_NONFATAL``, the
number of error messages (not the sum of the bits). The ABI document's sample spells the names
with spaces (``Receiver Error 2``), which aer.c has not used since these files exist; they read
the same. The files exist on every function with an AER capability (mode 0444), also under
``pci=noaer`` or firmware-first handling, where they may stay at 0. A root port's
``aer_rootport_total_err_*`` (a bare ``"%llu\n"``: the messages it received) is not read: the
``aer_dev_*`` of each bridge are. The counters are the reliable source: the kernel's ``AER: ...
severity=...`` log lines merge errors (``Multiple ... error received``) and from 6.16 are
rate-limited (10 per 5 s a device), and an endpoint's errors are often seen by its link partner,
a bridge or the root port, not the endpoint itself (the ABI document's note).

So for each NVIDIA GPU (vendor 0x10de, class 0x0300xx or 0x0302xx; not an SR-IOV virtual
function, which has a ``physfn`` link and which nvidia-smi does not list) the producer reads its own
three totals and the sum of those of every bridge between it and its root complex (the PCI
path of the resolved ``/sys/bus/pci/devices/<BDF>`` link), and publishes them as the catalogue's
``pcie_aer_*`` and ``pcie_aer_upstream_*`` counters (pipeline/data/host_fields.csv). A bridge
shared by several GPUs charges its errors to each of them: the alert names every GPU behind it.

The InfiniBand/RoCE NICs (``sys/class/infiniband/<device>``, whose ``device`` link is the PCI
function) are read the same way: each NIC's own totals and those of the bridges above it, sent as
one ``NicRecord`` a NIC (``kind: "nic"``; ``port`` its first port, ``counters``
``pcie_aer_<severity>`` and ``pcie_aer_upstream_<severity>``, ``labels.pci_bus_id``, and ``gpus``
the GPUs that share their nearest bridge with it, as ``produce ib-sysfs`` pairs them). The NIC
port checks judge them (docs/rules.md#nic-ports), so an alert names the NIC and its GPUs.

GPU indices follow ``--pci-map`` (``nvidia-smi --query-gpu=index,pci.bus_id --format=csv``), else
the PCI bus order at the first poll that sees them, which is how nvidia-smi numbers GPUs; a GPU
keeps its index while it is gone from the tree, and one that appears later takes the next.
``--root`` reads a copy of the tree (a container's mount, a test's fixture); no link is followed
out of it. A file that is missing is a field left out (no AER capability, an older kernel); one
that cannot be read, is oversize or is not this format costs only its field and is counted by
reason.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.numeric import ascii_int
from pipeline.recordchecks import MAX_COUNTER, MAX_GPU_INDEX, MAX_NIC_PORT
from pipeline.schema import DcgmRecord, NicRecord, dcgm
from producers.ib_sysfs import gpus_behind
from producers.ibports import name_ok

log = logging.getLogger(__name__)

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers; NVSwitches are bridges (0x0680)
SEVERITIES = (
    ("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
    ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
)
MAX_FILE_BYTES = 16 * 1024  # the kernel's files are under 1 KiB; more is not sysfs
MAX_LINES = 64  # 27 error bits at most (aer.c) and the total
COUNT_DIGITS = 20  # a u64
MAX_DEVICES = 4096  # PCI functions scanned a poll; a host has a few hundred
MAX_DEPTH = 16  # bridges between a GPU and its root complex; real trees have 2-6
MAX_NICS = 256  # RDMA devices a poll; an 8-GPU node has ~10
MAX_PORT_NAME = 5  # a port number is at most 65535
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z", re.ASCII)  # \Z: no "\n" after


@dataclass(frozen=True)
class AerTotals:
    """One device's totals by severity; None where its file is missing or unreadable."""

    correctable: int | None = None
    nonfatal: int | None = None
    fatal: int | None = None


def parse_aer_file(text: str, total_key: str) -> int | None:
    """The total of one ``aer_dev_*`` file: its ``TOTAL_ERR_*`` line (the kernel always prints
    it), else the sum of its bit lines; None when a line is not ``<name> <count>``, a name comes
    twice or a number is past a u64 (the file is not this format: aer.c prints each name once,
    ``%llu``). A name may hold spaces (the ABI document's sample).

    >>> parse_aer_file("RxErr 2\\nBadTLP 0\\ndev_cor_errs_bit[9] 1\\nTOTAL_ERR_COR 2\\n", "TOTAL_ERR_COR")
    2
    >>> parse_aer_file("Receiver Error 3\\nBad TLP 1\\n", "TOTAL_ERR_COR")
    4
    >>> parse_aer_file("RxErr two\\n", "TOTAL_ERR_COR") is None
    True
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or len(lines) > MAX_LINES:
        return None
    total: int | None = None
    bits = 0
    names: set[str] = set()
    for ln in lines:
        name, _, count = ln.strip().rpartition(" ")
        name = name.strip()
        n = ascii_int(count, COUNT_DIGITS)
        if not name or n is None or n > MAX_COUNTER or name in names:
            return None
        names.add(name)
        if name == total_key:
            total = n
        else:
            bits += n
    out = total if total is not None else bits
    return out if out <= MAX_COUNTER else None


class AerSource:
    """Polls the AER counters of every GPU under ``root``; ``poll`` returns one record per GPU.

    >>> import tempfile
    >>> from producers.pcie_aer import AerSource
    >>> with tempfile.TemporaryDirectory() as root:
    ...     src = AerSource(root, host="n1", clock=lambda: 1764403200.0)
    ...     src.poll(), src.counts["gpus"]
    ([], 0)
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        host: str | None = None,
        pci_map: dict[tuple[int, int, int], int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root)
        self.real_root = self.root.resolve()
        self.host = host or socket.gethostname()
        self.pci_map = pci_map
        self.clock = clock
        self.done = False
        # Without --pci-map, the index each GPU got when first seen: one that leaves the tree (a
        # surprise down, a removal) must not hand its index, and its counters' history, to the next.
        self._order: dict[str, int] = {}
        self.counts: dict[str, int] = {
            "polls": 0,
            "gpus": 0,
            "records": 0,
            "dropped.unmapped_gpu": 0,
            "dropped.link_outside_root": 0,
            "dropped.unreadable_file": 0,
            "dropped.oversize_file": 0,
            "dropped.unparsable_file": 0,
            "dropped.too_many_devices": 0,
            "dropped.alias_link": 0,
            "dropped.counter_overflow": 0,
            "nics": 0,
            "dropped.bad_nic_name": 0,
        }

    def summary(self) -> dict[str, int]:
        return dict(self.counts)

    def close(self) -> None:
        pass

    # -- reading sysfs -----------------------------------------------------------------------

    def _read(self, path: Path) -> str | None:
        """A small sysfs file's text; None when it is missing, unreadable or oversize (counted)."""
        try:
            # A sysfs attribute is a regular file: no link at its end (it could leave the root),
            # no FIFO or device to block the poll on.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:
            self.counts["dropped.unreadable_file"] += 1
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.counts["dropped.unreadable_file"] += 1
                return None
            data = os.read(fd, MAX_FILE_BYTES + 1)
        except OSError:
            self.counts["dropped.unreadable_file"] += 1
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_FILE_BYTES:
            self.counts["dropped.oversize_file"] += 1
            return None
        return data.decode("ascii", "replace")

    def _inside(self, path: Path) -> Path | None:
        """``path`` resolved, when it stays under the root; None (counted) otherwise."""
        try:
            real = path.resolve(strict=True)
        except FileNotFoundError:
            return None
        except (OSError, RuntimeError):  # a symlink loop
            self.counts["dropped.link_outside_root"] += 1
            return None
        if real != self.real_root and self.real_root not in real.parents:
            self.counts["dropped.link_outside_root"] += 1
            return None
        return real

    def totals(self, device: Path) -> AerTotals:
        """``device``'s three totals (the directory of one PCI function)."""
        out: dict[str, int | None] = {}
        for sev, name, key in SEVERITIES:
            text = self._read(device / name)
            n = None if text is None else parse_aer_file(text, key)
            if text is not None and n is None:
                self.counts["dropped.unparsable_file"] += 1
            out[sev] = n
        return AerTotals(**out)

    def gpus(self) -> list[tuple[str, Path]]:
        """(bus id, resolved device directory) of each NVIDIA GPU, in PCI bus order; the virtual
        functions of an SR-IOV GPU (``physfn`` link, drivers/pci/iov.c) are left out."""
        devices = self.root / "sys" / "bus" / "pci" / "devices"
        try:
            names = sorted((e.name for e in os.scandir(devices) if _BDF.match(e.name)), key=_bus_order)
        except OSError:
            return []
        if len(names) > MAX_DEVICES:
            self.counts["dropped.too_many_devices"] += len(names) - MAX_DEVICES
            names = names[:MAX_DEVICES]
        out: list[tuple[str, Path]] = []
        for bdf in names:
            real = self._inside(devices / bdf)
            if real is None:
                continue
            if real.name != bdf:  # the kernel names each link after its device: another name is no device
                self.counts["dropped.alias_link"] += 1
                continue
            vendor, cls = self._read(real / "vendor"), self._read(real / "class")
            if vendor is None or cls is None or vendor.strip().lower() != NVIDIA:
                continue
            if os.path.lexists(real / "physfn"):
                continue  # an SR-IOV VF (vGPU host): same class as its GPU, not a GPU nvidia-smi lists
            if cls.strip().lower().startswith(GPU_CLASSES):
                out.append((bdf.lower(), real))
        return out

    def upstream(self, device: Path) -> list[Path]:
        """The bridges between ``device`` and its root complex: the PCI functions its resolved
        path passes through (``.../pci0000:00/0000:00:01.0/0000:01:00.0/<device>``)."""
        out: list[Path] = []
        p = device.parent
        while _BDF.match(p.name) and len(out) < MAX_DEPTH and (p == self.real_root or self.real_root in p.parents):
            out.append(p)
            p = p.parent
        return out

    def nics(self) -> list[tuple[str, Path, int]]:
        """(name, resolved PCI function, first port) of each RDMA device whose ``device`` link is
        a PCI function under the root (a software device such as ``rxe0`` has none), by name."""
        base = self.root / "sys" / "class" / "infiniband"
        try:
            names = sorted(e.name for e in os.scandir(base))
        except OSError:
            return []
        if len(names) > MAX_NICS:
            self.counts["dropped.too_many_devices"] += len(names) - MAX_NICS
            names = names[:MAX_NICS]
        out: list[tuple[str, Path, int]] = []
        for name in names:
            if not name_ok(name):
                self.counts["dropped.bad_nic_name"] += 1
                continue
            real = self._inside(base / name / "device")
            if real is None or not _BDF.match(real.name):
                continue
            try:
                ports = sorted(
                    n
                    for p in os.scandir(base / name / "ports")
                    if (n := ascii_int(p.name, MAX_PORT_NAME)) and n <= MAX_NIC_PORT  # a port a record can carry
                )
            except OSError:
                ports = []
            out.append((name, real, ports[0] if ports else 1))
        return out

    def _upstream_sum(self, totals: list[int]) -> int | None:
        """The bridges' totals summed; None when there are none or the sum is past a u64, which no
        record can carry (counted)."""
        if not totals:
            return None
        n = sum(totals)
        if n > MAX_COUNTER:
            self.counts["dropped.counter_overflow"] += 1
            return None
        return n

    def _nic_records(self, ts: float, gpu_paths: dict[int, Path]) -> list[NicRecord]:
        """One record a NIC: its own AER totals and its bridges', and the GPUs behind it."""
        nics = self.nics()
        self.counts["nics"] = len(nics)
        if not nics:
            return []
        behind = gpus_behind(
            {name: _chain(real) for name, real, _ in nics}, {i: _chain(p) for i, p in gpu_paths.items()}
        )
        out: list[NicRecord] = []
        for name, real, port in nics:
            own = self.totals(real)
            up = [self.totals(b) for b in self.upstream(real)]
            counters: dict[str, int] = {}
            for sev, _, _ in SEVERITIES:
                mine = getattr(own, sev)
                if mine is not None:
                    counters[f"pcie_aer_{sev}"] = mine
                theirs = self._upstream_sum([getattr(t, sev) for t in up if getattr(t, sev) is not None])
                if theirs is not None:
                    counters[f"pcie_aer_upstream_{sev}"] = theirs
            if counters:
                out.append(NicRecord(ts=ts, host=self.host, device=name, port=port, counters=counters,
                                     gpus=behind.get(name, []), labels={"pci_bus_id": real.name.lower()}))  # fmt: skip
        return out

    # -- one poll ----------------------------------------------------------------------------

    def _index(self, bdf: str) -> int | None:
        if self.pci_map is None:
            if bdf not in self._order and len(self._order) > MAX_GPU_INDEX:
                return None  # more GPUs than a record can number (a tree renamed each poll)
            return self._order.setdefault(bdf, len(self._order))
        dom, bus, rest = bdf.split(":")
        return self.pci_map.get((int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)))

    def poll(self) -> list[DcgmRecord | NicRecord]:
        self.counts["polls"] += 1
        ts = self.clock()
        gpus = self.gpus()
        self.counts["gpus"] = len(gpus)
        out: list[DcgmRecord | NicRecord] = []
        gpu_paths: dict[int, Path] = {}
        for bdf, real in gpus:
            idx = self._index(bdf)
            if idx is None:
                self.counts["dropped.unmapped_gpu"] += 1
                continue
            gpu_paths[idx] = real
            own = self.totals(real)
            up = [self.totals(b) for b in self.upstream(real)]
            fields: dict[str, float] = {}
            for sev, _, _ in SEVERITIES:
                mine = getattr(own, sev)
                if mine is not None:
                    fields[f"pcie_aer_{sev}"] = mine
                theirs = self._upstream_sum([getattr(t, sev) for t in up if getattr(t, sev) is not None])
                if theirs is not None:
                    fields[f"pcie_aer_upstream_{sev}"] = theirs
            if fields:
                out.append(dcgm(ts, self.host, idx, fields, labels={"pci_bus_id": bdf}))
        out += self._nic_records(ts, gpu_paths)
        self.counts["records"] += len(out)
        return out


def _bus_order(bdf: str) -> tuple[int, ...]:
    """A bus id's domain, bus, device and function as numbers: nvidia-smi's order, which a string
    sort is not where domains differ in width (``10000:`` under VMD before ``a000:``)."""
    return tuple(int(p, 16) for p in bdf.replace(".", ":").split(":"))


def _chain(real: Path) -> list[str]:
    """The PCI functions on a resolved device path, root port first, the device last."""
    return [p.lower() for p in real.parts if _BDF.match(p)]


__all__ = ["AerSource", "AerTotals", "parse_aer_file"]
