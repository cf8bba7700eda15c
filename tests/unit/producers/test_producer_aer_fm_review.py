"""Review of the PCIe AER and Fabric Manager producers: each test here failed before its fix.

Origins:

- a journal's copy of Fabric Manager's log: bottlerocket-os/bottlerocket-kernel-kit pull request
  #142 (``systemctl status nvidia-fabricmanager``: ``May 16 15:10:22 ip-192-168-38-187.us-west-2.
  compute.internal nv-fabricmanager[29850]: [May 16 2025 15:10:21] [INFO] [tid 30042] GPU probe
  request received ...``): Fabric Manager's own prefix after the journal's;
- Fabric Manager rolls its log over itself (``LOG_FILE_MAX_SIZE``, ``LOG_MAX_ROTATE_COUNT`` in
  the config file its family shares, e.g. nvidia-imex's: "Log is rotated upto the number of times
  specified in LOG_MAX_ROTATE_COUNT"), so lines land in the old file up to the moment it moves;
- a GPU removed from the PCI tree (pciehp surprise down, ``echo 1 > remove``) leaves no
  ``/sys/bus/pci/devices/<BDF>``; the kernel names a device ``%04x:%02x:%02x.%d`` (domain
  ``%04x``: VMD domains start at ``10000``), and nvidia-smi numbers GPUs by bus id as a number.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.catalog import FIELDS
from producers.fabric_manager import FabricManagerLog, FileFollower, classify, parse_fm_line
from producers.kmsg import KmsgFileSource, parse_pci_map
from producers.pcie_aer import AerSource
from tests.factories import T0
from tests.unit.producers.pcie_factories import dgx_like, ib_class, pci_device
from tests.unit.producers.kmsg_factories import PCI_MAP, write

FATAL = (
    "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus "
    "id 00000000:86:00.0 physical id 3 port 33"
)
NONFATAL = (
    "[Jul 09 2024 18:14:07] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch "
    "pci bus id 00000000:86:00.0 physical id 3 port 61"
)
INFO = "[Jul 09 2024 18:14:00] [INFO] [tid 1] multicast group 0 is allocated."
HOST = "ip-192-168-38-187.us-west-2.compute.internal"


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


# -- Fabric Manager: a rotation loses nothing already written -----------------------------------


def test_lines_written_to_the_old_file_before_a_rotation_are_read(tmp_path: Path) -> None:
    path = tmp_path / "fabricmanager.log"
    path.write_text(INFO + "\n")
    rd = FileFollower(str(path))
    assert rd.read() == [INFO]
    with path.open("a") as fh:  # after our read, before Fabric Manager rolls the file over
        fh.write(FATAL + "\n")
    os.rename(path, tmp_path / "fabricmanager.log.1")
    path.write_text(NONFATAL + "\n")
    got: list[str] = []
    for _ in range(3):
        got += rd.read()
    assert got == [FATAL, NONFATAL]
    rd.close()


def test_a_rotation_drains_the_old_file_over_several_reads_and_a_missing_name_too(tmp_path: Path) -> None:
    path = tmp_path / "fabricmanager.log"
    path.write_text("")
    rd = FileFollower(str(path), read_max=64)
    assert rd.read() == []
    lines = [FATAL.replace("port 33", f"port {i}") for i in range(5)]
    with path.open("a") as fh:
        fh.write("".join(ln + "\n" for ln in lines))
    os.rename(path, tmp_path / "fabricmanager.log.1")  # no new file yet
    got: list[str] = []
    for _ in range(len(lines) * 200 // 64 + 3):
        got += rd.read()
    assert got == lines
    path.write_text(NONFATAL + "\n")  # Fabric Manager's new file
    assert rd.read() + rd.read() + rd.read() == [NONFATAL]  # 64 bytes a read
    rd.close()


# -- Fabric Manager: its lines as a journal or syslog holds them --------------------------------


def test_a_journal_copy_of_the_log_is_read_as_the_log() -> None:
    for prefix in (
        f"May 16 15:10:22 {HOST} nv-fabricmanager[29850]: ",
        f"2025-05-16T15:10:22+0000 {HOST} nv-fabricmanager[29850]: ",
    ):
        ln = parse_fm_line(prefix + FATAL)
        assert ln is not None and ln.error is None, prefix
        assert ln.ts == parse_fm_line(FATAL).ts and ln.host == HOST  # Fabric Manager's own time, with its year
        assert classify(ln.msg)[0] == "fm_nvswitch_fatal_errors"
        # The continuation of a multi-line message, like a startup message without Fabric
        # Manager's prefix, is a line of no known level: it counts nothing.
        cont = parse_fm_line(prefix + "Message payload details:Team setup response", year=2025)
        assert cont is not None and classify(cont.msg) is None
    assert parse_fm_line(f"May 16 15:10:22 {HOST} systemd[1]: Starting NVIDIA fabric manager service...") is None
    # nvidia-imex logs with the same prefix: its errors are not Fabric Manager's.
    assert parse_fm_line(f"May 16 15:10:22 {HOST} nvidia-imex[812]: " + FATAL) is None


def test_a_saved_journal_counts_its_errors(tmp_path: Path) -> None:
    j = f"May 16 15:10:22 {HOST} nv-fabricmanager[29850]: "
    assert _fm_counts(tmp_path, "fm-journal.log", [j + ln for ln in (INFO, FATAL, NONFATAL)]) == (1, 1, 2)


def _fm_counts(tmp_path: Path, name: str, lines: list[str]) -> tuple[float, float, int]:
    """(fatal, non-fatal NVSwitch errors at the newest record, error lines) of a saved log."""
    p = write(tmp_path, name, "\n".join(lines) + "\n")
    pci = parse_pci_map(PCI_MAP)
    src = KmsgFileSource(
        str(p), pci, host="n1", sample=False, log=FabricManagerLog(pci, host="n1"), parse=parse_fm_line
    )
    last = max(src.poll(), key=lambda r: r.ts)
    return val(last, "fm_nvswitch_fatal_errors"), val(last, "fm_nvswitch_nonfatal_errors"), src.summary()["error_lines"]


def test_fabric_managers_own_syslog_lines_count_their_nvswitch_errors(tmp_path: Path) -> None:
    """``LOG_USE_SYSLOG=1``: Fabric Manager's messages reach syslog without its own prefix (a
    real one: ``nv-fabricmanager[5183]: detected NVSwitch non-fatal error 22013 on NodeId 0 ...``).
    They were read as continuation lines (nothing counted); the SXid lines count now, at the
    syslog's time in the file's year, and a line of unknown level about anything else does not."""
    pre = f"Mar 03 18:39:57 {HOST} nv-fabricmanager[5183]: "
    lines = [
        pre + "detected NVSwitch non-fatal error 22013 on NodeId 0 on NVSwitch pci bus id 00000000:08:00.0 "
              "physical id 3 port 60",
        pre + "Fabric Manager version 535.104.05 is running",
        "2025-03-03T18:40:01.250000+00:00 node7 nv-fabricmanager[5183]: detected NVSwitch fatal error 12028 on fid 0 "
        "on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 45",
    ]
    line = parse_fm_line(lines[0], year=2025)
    assert line is not None and line.host == HOST and line.yearless and line.error is None
    assert classify(line.msg)[1]["fm.sxid"] == "22013"
    iso = parse_fm_line(lines[2])
    assert iso is not None and iso.ts == 1741027201.25 and not iso.yearless and iso.host == "node7"
    assert _fm_counts(tmp_path, "syslog", lines) == (1, 1, 2)


# -- PCIe AER: a GPU's index is its own -----------------------------------------------------------


def _indices(src: AerSource) -> dict[str, int]:
    return {r.labels["pci_bus_id"]: r.gpu for r in src.poll() if hasattr(r, "gpu")}


def test_a_gpu_that_leaves_the_tree_does_not_renumber_the_others(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    ib_class(tmp_path, "mlx5_0", dev["nic"])
    src = AerSource(tmp_path, host="n1", clock=lambda: T0)
    first = _indices(src)
    assert first == {"0000:03:00.0": 0, "0000:04:00.0": 1, "0000:81:00.0": 2}
    # GPU 0 is removed (surprise down): its link and directory go.
    (tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:03:00.0").unlink()
    shutil.rmtree(dev["gpu0"])
    recs = src.poll()
    assert {r.labels["pci_bus_id"]: r.gpu for r in recs if hasattr(r, "gpu")} == {"0000:04:00.0": 1, "0000:81:00.0": 2}
    assert [r.gpus for r in recs if not hasattr(r, "gpu")] == [[1]]  # the NIC still names GPU 1
    # It comes back (rescan): its own index again.
    pci_device(tmp_path, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0")
    assert _indices(src) == first


def test_gpus_are_numbered_by_bus_id_as_a_number_whatever_the_domains_width(tmp_path: Path) -> None:
    # String order puts "10000:..." before "a000:..."; nvidia-smi's (00010000 > 0000a000) does not.
    for dom in ("0000", "a000", "10000"):
        pci_device(tmp_path, f"pci{dom}:00/{dom}:00:01.0", vendor="0x8086", cls="0x060400")
        pci_device(tmp_path, f"pci{dom}:00/{dom}:00:01.0/{dom}:01:00.0")
    src = AerSource(tmp_path, host="n1", clock=lambda: T0)
    assert _indices(src) == {"0000:01:00.0": 0, "a000:01:00.0": 1, "10000:01:00.0": 2}
