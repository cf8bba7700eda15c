"""Builders of InfiniBand/RoCE inputs for the producer tests: sysfs trees laid out as the kernel
lays them out, with the values of public captures (origins in ``SOURCES``).

The port values and counters are those of leptonai/gpud
``components/accelerator/nvidia/infiniband/class/testdata/sys-class-infiniband-h100.0/``
@ 4a8de33a (an 8-HCA H100 node: ``mlx5_0``..``mlx5_9`` InfiniBand at ``400 Gb/sec (4X NDR)``,
``mlx5_bond_0`` Ethernet at ``200 Gb/sec (2X NDR)``; gpud's files have no final newline, the
kernel's do: both are written here). The PCI paths and netdev links follow the kernel's layout
(``/sys/class/infiniband/<dev>`` -> ``../../devices/pci.../infiniband/<dev>``,
``<dev>/device/net/<if>``, ``/sys/class/net/<if>/carrier_changes``:
Documentation/ABI/stable/sysfs-class-infiniband, Documentation/ABI/testing/sysfs-class-net).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SOURCES = {
    "sysfs": "leptonai/gpud components/accelerator/nvidia/infiniband/class/testdata/sys-class-infiniband-h100.0 @ 4a8de33a",
}

ABSENT: dict = {"<absent>": -1}  # a counters directory the driver does not create

# mlx5_0's ports/1/counters and hw_counters in gpud's h100 capture.
IB_COUNTERS = {
    "VL15_dropped": 0, "excessive_buffer_overrun_errors": 15, "link_downed": 0, "link_error_recovery": 0,
    "local_link_integrity_errors": 0, "multicast_rcv_packets": 0, "multicast_xmit_packets": 0,
    "port_rcv_constraint_errors": 0, "port_rcv_data": 230539874932483, "port_rcv_errors": 14,
    "port_rcv_packets": 317548853677, "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 1,
    "port_xmit_constraint_errors": 0, "port_xmit_data": 230442669431839, "port_xmit_discards": 0,
    "port_xmit_packets": 315487941081, "port_xmit_wait": 2489603687, "symbol_error": 0,
    "unicast_rcv_packets": 317548853677, "unicast_xmit_packets": 315487941081,
}  # fmt: skip
HW_COUNTERS = {
    "duplicate_request": 0, "implied_nak_seq_err": 0, "lifespan": 12, "local_ack_timeout_err": 0,
    "out_of_buffer": 0, "out_of_sequence": 0, "packet_seq_err": 0, "req_cqe_error": 0, "req_cqe_flush_error": 0,
    "req_remote_access_errors": 0, "req_remote_invalid_request": 0, "resp_cqe_error": 0, "resp_cqe_flush_error": 0,
    "resp_local_length_error": 0, "resp_remote_access_errors": 0, "rnr_nak_retry_err": 0, "roce_adp_retrans": 3,
    "roce_adp_retrans_to": 0, "roce_slow_restart": 0, "roce_slow_restart_cnps": 0, "roce_slow_restart_trans": 0,
    "rx_atomic_requests": 0, "rx_dct_connect": 422237, "rx_icrc_encapsulated": 0, "rx_read_requests": 9187392,
    "rx_write_requests": 3809045607,
}  # fmt: skip


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def port_dir(
    root: Path,
    device: str,
    port: int = 1,
    *,
    state: str | None = "4: ACTIVE",
    phys_state: str | None = "5: LinkUp",
    rate: str | None = "400 Gb/sec (4X NDR)",
    link_layer: str | None = "InfiniBand",
    counters: dict | None = None,
    hw_counters: dict | None = None,
    pci: tuple[str, ...] = ("0000:00:01.0", "0000:01:00.0"),
    netdev: str | None = None,
    carrier_changes: int | None = None,
    newline: bool = True,
) -> Path:
    """One device's port as the kernel lays it out under ``root``: the device directory under its
    PCI path, the class link to it, and (with ``netdev``) its net device and ``carrier_changes``.
    ``counters``/``hw_counters``: None writes gpud's capture, {} an empty directory, ``ABSENT``
    no directory; a ``state``... of None leaves that file out. Returns the port directory."""
    nl = "\n" if newline else ""
    pci_dir = root / "sys" / "devices" / "pci0000:00"
    for bdf in pci:
        pci_dir = pci_dir / bdf
    dev = pci_dir / "infiniband" / device
    p = dev / "ports" / str(port)
    for name, val in (("state", state), ("phys_state", phys_state), ("rate", rate), ("link_layer", link_layer)):
        if val is not None:
            write(p / name, val + nl)
    for sub, vals, default in (("counters", counters, IB_COUNTERS), ("hw_counters", hw_counters, HW_COUNTERS)):
        if vals is ABSENT:
            continue
        got = default if vals is None else vals
        (p / sub).mkdir(parents=True, exist_ok=True)
        for k, v in got.items():
            write(p / sub / k, f"{v}{nl}")
    cls = root / "sys" / "class" / "infiniband"
    cls.mkdir(parents=True, exist_ok=True)
    link = cls / device
    if not link.exists():
        link.symlink_to(os.path.relpath(dev, cls))
    if not (dev / "device").exists():
        (dev / "device").symlink_to(os.path.relpath(pci_dir, dev))
    if netdev is not None:
        ndev = pci_dir / "net" / netdev
        ndev.mkdir(parents=True, exist_ok=True)
        write(ndev / "dev_port", f"{port - 1}\n")
        if carrier_changes is not None:
            write(ndev / "carrier_changes", f"{carrier_changes}\n")
        ncls = root / "sys" / "class" / "net"
        ncls.mkdir(parents=True, exist_ok=True)
        if not (ncls / netdev).exists():
            (ncls / netdev).symlink_to(os.path.relpath(ndev, ncls))
    return p


def gpu_device(root: Path, bdf: str, pci: tuple[str, ...]) -> None:
    """A GPU's PCI function under its bridges, and its ``/sys/bus/pci/devices`` link."""
    d = root / "sys" / "devices" / "pci0000:00"
    for b in pci:
        d = d / b
    d = d / bdf
    d.mkdir(parents=True, exist_ok=True)
    bus = root / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / bdf).symlink_to(os.path.relpath(d, bus))


def h100_node(root: Path) -> None:
    """gpud's h100 capture: eight InfiniBand HCAs (``mlx5_1`` with ``link_downed`` 255) and the
    Ethernet bond, each on its own PCIe switch; IPoIB netdevs on the first two."""
    names = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    for i, name in enumerate(names):
        counters = {**IB_COUNTERS, "link_downed": 255} if name == "mlx5_1" else None
        port_dir(root, name, counters=counters, pci=(f"0000:{0x10 * i:02x}:01.0", f"0000:{0x10 * i + 1:02x}:00.0",
                                                     f"0000:{0x10 * i + 2:02x}:00.0"),
                 netdev={"mlx5_0": "ibp26s0", "mlx5_1": "ibp60s0"}.get(name),
                 carrier_changes={"mlx5_0": 2, "mlx5_1": 9}.get(name), newline=i % 2 == 0)
    port_dir(root, "mlx5_bond_0", rate="200 Gb/sec (2X NDR)", link_layer="Ethernet",
             pci=("0000:a0:01.0", "0000:a1:00.0"), netdev="bond0", carrier_changes=4)


def ib_log(lines: list[str], host: str | None = None, default_ts: float | None = None) -> tuple[list, Any]:
    """NCCL log ``lines`` through an ``IbLog`` (fallback host ``here``, untimed lines at
    ``default_ts``, T0 by default): its records and its ``IbStats``."""
    from producers.nccl_ib import IbLog, IbStats
    from tests.factories import T0

    stats = IbStats()
    log = IbLog(host=host, default_ts=T0 if default_ts is None else default_ts, stats=stats, fallback_host="here")
    for line in lines:
        log.feed(line)
    return log.records(), stats
