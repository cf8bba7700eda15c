"""The PCIe AER producer's NICs (#34): each RDMA device's PCI function and the bridges above it
read as the GPUs' are, one ``NicRecord`` a NIC naming the GPUs that share its nearest bridge;
software devices, hostile names and links out of the root cost nothing else.

The files' layout is the kernel's: drivers/pci/pcie/aer.c's names (``pcie_factories``), and the
sample output of torvalds/linux Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats
@ 0e7d29a3 (names with spaces, ``ABI_FATAL``), as in test_producer_pcie_aer.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.decode import Decoder
from pipeline.schema import NicRecord, encode
from producers.pcie_aer import AerSource
from tests.factories import T0
from tests.unit.producers.pcie_factories import UNCOR_NAMES, aer_text, dgx_like, ib_class, pci_device

# The ABI document's aer_dev_fatal sample, with one Surprise Down counted.
ABI_FATAL = """Undefined 0
Data Link Protocol 0
Surprise Down Error 1
Poisoned TLP 0
Flow Control Protocol 0
Completion Timeout 0
Completer Abort 0
Unexpected Completion 0
Receiver Overflow 0
Malformed TLP 0
ECRC 0
Unsupported Request 0
ACS Violation 0
Uncorrectable Internal Error 0
MC Blocked TLP 0
AtomicOp Egress Blocked 0
TLP Prefix Blocked Error 0
TOTAL_ERR_FATAL 1
"""
ZERO = {f"pcie_aer_{p}{s}": 0 for p in ("", "upstream_") for s in ("correctable", "nonfatal", "fatal")}


def _nics(root: Path, **kw) -> tuple[dict[str, NicRecord], AerSource]:
    src = AerSource(root, host="n1", clock=lambda: T0, **kw)
    recs = src.poll()
    return {r.device: r for r in recs if isinstance(r, NicRecord)}, src


def test_a_nic_is_read_with_its_bridges_and_names_the_gpus_beside_it(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    ib_class(tmp_path, "mlx5_0", dev["nic"], ports=(1,))
    nics, src = _nics(tmp_path)
    r = nics["mlx5_0"]
    assert (r.host, r.ts, r.port, r.labels, r.state) == ("n1", T0, 1, {"pci_bus_id": "0000:05:00.0"}, None)
    assert r.counters == ZERO
    # The NIC shares its switch's downstream port with GPU 1 and the switch with GPU 0.
    assert r.gpus == [0, 1]
    assert src.counts["nics"] == 1
    out = Decoder().decode(encode(src.poll()), "x")
    assert out.dead == [] and sum(isinstance(x, NicRecord) for x in out.records) == 1


def test_the_nics_own_errors_and_its_bridges_are_apart(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    ib_class(tmp_path, "mlx5_0", dev["nic"])
    (dev["nic"] / "aer_dev_fatal").write_text(ABI_FATAL)
    (dev["switch_dn1"] / "aer_dev_nonfatal").write_text(aer_text("TOTAL_ERR_NONFATAL", UNCOR_NAMES, {"CmpltTO": 2}))
    (dev["root_port"] / "aer_dev_nonfatal").write_text(aer_text("TOTAL_ERR_NONFATAL", UNCOR_NAMES, {"CmpltTO": 1}))
    r = _nics(tmp_path)[0]["mlx5_0"]
    assert r.counters["pcie_aer_fatal"] == 1 and r.counters["pcie_aer_upstream_fatal"] == 0
    assert r.counters["pcie_aer_nonfatal"] == 0 and r.counters["pcie_aer_upstream_nonfatal"] == 3


def test_a_nic_on_its_own_root_port_has_no_gpus_and_a_two_port_nic_is_one_record(tmp_path: Path) -> None:
    dgx_like(tmp_path)
    rp = pci_device(tmp_path, "pci0000:c0/0000:c0:01.0", vendor="0x8086", cls="0x060400")
    fn = pci_device(tmp_path, "pci0000:c0/0000:c0:01.0/0000:c1:00.0", vendor="0x15b3", cls="0x020700")
    ib_class(tmp_path, "mlx5_bond_0", fn, ports=(2, 1))
    assert rp.is_dir()
    r = _nics(tmp_path)[0]["mlx5_bond_0"]
    assert (r.port, r.gpus, r.labels["pci_bus_id"]) == (1, [], "0000:c1:00.0")


def test_gpu_indices_of_the_pci_map_name_the_nics_gpus(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    ib_class(tmp_path, "mlx5_0", dev["nic"])
    pci = {(0, 0x81, 0): 0, (0, 0x03, 0): 5, (0, 0x04, 0): 6}
    assert _nics(tmp_path, pci_map=pci)[0]["mlx5_0"].gpus == [5, 6]


def test_software_devices_hostile_names_and_links_out_of_the_root_cost_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "root"
    dev = dgx_like(root)
    ib_class(root, "mlx5_0", dev["nic"])
    cls = root / "sys" / "class" / "infiniband"
    soft = root / "sys" / "devices" / "virtual" / "infiniband" / "rxe0"  # soft RoCE: no PCI function
    soft.mkdir(parents=True)
    (cls / "rxe0").symlink_to(soft)
    outside = pci_device(tmp_path / "elsewhere", "pci0000:00/0000:09:00.0", vendor="0x15b3", cls="0x020700")
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "device").symlink_to(outside)
    (cls / "mlx5_9").symlink_to(tmp_path / "evil")
    os.mkdir(cls / "bad name")
    nics, src = _nics(root)
    assert sorted(nics) == ["mlx5_0"]
    assert src.counts["dropped.link_outside_root"] == 1 and src.counts["dropped.bad_nic_name"] == 1
