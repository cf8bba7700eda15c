"""Helpers of the producer tests: a sysfs PCI tree laid out as the kernel lays it out."""

from __future__ import annotations

import os
from pathlib import Path

# What Linux 5.x+ prints in aer_dev_* (drivers/pci/pcie/aer.c: aer_correctable_error_string and
# aer_uncorrectable_error_string, then the TOTAL_ line); the counts are filled in per device.
COR_NAMES = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
UNCOR_NAMES = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF",
               "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked",
               "TLPBlockedErr", "PoisonTLPBlocked")


def aer_text(total_key: str, names: tuple[str, ...], counts: dict[str, int] | None = None) -> str:
    """One ``aer_dev_*`` file: a line per error bit, then the total."""
    counts = counts or {}
    lines = [f"{n} {counts.get(n, 0)}" for n in names]
    lines.append(f"{total_key} {sum(counts.values())}")
    return "\n".join(lines) + "\n"


def pci_device(
    root: Path,
    path: str,
    *,
    vendor: str = "0x10de",
    cls: str = "0x030200",
    cor: dict[str, int] | None = None,
    nonfatal: dict[str, int] | None = None,
    fatal: dict[str, int] | None = None,
    aer: bool = True,
) -> Path:
    """A PCI function at ``sys/devices/<path>`` (``pci0000:00/0000:00:01.0/0000:01:00.0``) and its
    ``sys/bus/pci/devices/<BDF>`` link, relative as the kernel makes it."""
    dev = root / "sys" / "devices" / path
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(cls + "\n")
    if aer:
        (dev / "aer_dev_correctable").write_text(aer_text("TOTAL_ERR_COR", COR_NAMES, cor))
        (dev / "aer_dev_nonfatal").write_text(aer_text("TOTAL_ERR_NONFATAL", UNCOR_NAMES, nonfatal))
        (dev / "aer_dev_fatal").write_text(aer_text("TOTAL_ERR_FATAL", UNCOR_NAMES, fatal))
    bus = root / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    link = bus / dev.name
    if not link.is_symlink():
        os.symlink(os.path.relpath(dev, bus), link)
    return dev


def dgx_like(root: Path) -> dict[str, Path]:
    """Two GPUs behind one PCIe switch under root port 0000:00:01.0, a third under its own root
    port, a NIC beside the first two and an NVSwitch (a bridge-class NVIDIA function)."""
    rp = "pci0000:00/0000:00:01.0"
    up = f"{rp}/0000:01:00.0"
    out = {
        "root_port": pci_device(root, rp, vendor="0x8086", cls="0x060400"),
        "switch_up": pci_device(root, up, vendor="0x1000", cls="0x060400"),
        "switch_dn0": pci_device(root, f"{up}/0000:02:00.0", vendor="0x1000", cls="0x060400"),
        "switch_dn1": pci_device(root, f"{up}/0000:02:01.0", vendor="0x1000", cls="0x060400"),
    }
    out["gpu0"] = pci_device(root, f"{up}/0000:02:00.0/0000:03:00.0")
    out["gpu1"] = pci_device(root, f"{up}/0000:02:01.0/0000:04:00.0")
    out["nic"] = pci_device(root, f"{up}/0000:02:01.0/0000:05:00.0", vendor="0x15b3", cls="0x020700")
    out["root_port2"] = pci_device(root, "pci0000:80/0000:80:01.0", vendor="0x8086", cls="0x060400")
    out["gpu2"] = pci_device(root, "pci0000:80/0000:80:01.0/0000:81:00.0", cls="0x030000")
    out["nvswitch"] = pci_device(root, "pci0000:80/0000:80:02.0", cls="0x068000")
    return out


def ib_class(root: Path, name: str, function: Path, ports: tuple[int, ...] = (1,)) -> Path:
    """An RDMA device of PCI function ``function`` as the kernel lays it out: ``<function>/infiniband/
    <name>`` with its ``device`` link back and its ``ports/<n>``, and ``sys/class/infiniband/<name>``
    (Documentation/ABI/stable/sysfs-class-infiniband)."""
    dev = function / "infiniband" / name
    for p in ports:
        (dev / "ports" / str(p)).mkdir(parents=True, exist_ok=True)
    if not (dev / "device").is_symlink():
        os.symlink(os.path.relpath(function, dev), dev / "device")
    cls = root / "sys" / "class" / "infiniband"
    cls.mkdir(parents=True, exist_ok=True)
    if not (cls / name).is_symlink():
        os.symlink(os.path.relpath(dev, cls), cls / name)
    return dev
