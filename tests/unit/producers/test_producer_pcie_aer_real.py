"""The PCIe AER producer against what the kernel really prints and lays out, version by version.

Each file below is shaped as drivers/pci/pcie/aer.c's show functions print it (``"%s %llu\\n"``
per named bit, ``<stats_array>_bit[<n>] <count>`` for a non-zero bit with no name, then
``TOTAL_<ERR_*> <count>``) or as a public capture shows it, cited in a clause.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from producers.pcie_aer import AerSource, parse_aer_file
from tests.factories import T0
from tests.unit.producers.pcie_factories import pci_device

# prometheus/procfs testdata/fixtures.ttar @ 3c943fdb, sys/devices/pci0000:00/0000:00:03.0/aer_dev_correctable.
PROCFS_CORRECTABLE = (
    "RxErr 0\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 0\n"
)
# Linux 4.19's aer_uncorrectable_error_string (26 bits, 17 named), as torvalds/linux drivers/pci/pcie/aer.c had it.
UNCOR_419 = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP", "ECRC",
             "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr")  # fmt: skip
# Bit 26 PoisonTLPBlocked (2019), then bits 27-31 (commit 6633875250b3 "PCI/AER: Support errors introduced by PCIe r6.0").
UNCOR_2025 = (*UNCOR_419, "PoisonTLPBlocked", "DMWrReqBlocked", "IDECheck", "MisIDETLP", "PCRC_CHECK", "TLPXlatBlocked")


def _lines(names: tuple[str, ...], counts: dict[str, int], extra: str, total: str) -> str:
    return "".join(f"{n} {counts.get(n, 0)}\n" for n in names) + extra + total + "\n"


@pytest.mark.parametrize(
    "text,key,expected",
    [
        (PROCFS_CORRECTABLE, "TOTAL_ERR_COR", 0),
        (_lines(UNCOR_419, {"CmpltTO": 2}, "", "TOTAL_ERR_NONFATAL 1"), "TOTAL_ERR_NONFATAL", 1),
        (_lines(UNCOR_2025, {"SDES": 1, "PCRC_CHECK": 1}, "", "TOTAL_ERR_FATAL 1"), "TOTAL_ERR_FATAL", 1),
        # An unnamed bit prints as "dev_cor_errs_bit[%d] %llu" (torvalds/linux aer.c @ 02a06f5f aer_stats_dev_attr).
        (PROCFS_CORRECTABLE.replace("TOTAL_ERR_COR 0", "dev_cor_errs_bit[9] 4\nTOTAL_ERR_COR 3"), "TOTAL_ERR_COR", 3),
        # Kernels before "PCI/AER: Iterate over error counters instead of error strings" (linux-pci, May 2022)
        # read past the 16 counters: bits 16-31 print the fatal counters that follow them.
        (PROCFS_CORRECTABLE.replace("TOTAL_ERR_COR 0", "dev_cor_errs_bit[21] 1\nTOTAL_ERR_COR 0"), "TOTAL_ERR_COR", 0),
    ],
)  # fmt: skip
def test_every_layout_the_kernel_prints_reads_its_total(text: str, key: str, expected: int) -> None:
    assert parse_aer_file(text, key) == expected


def test_a_root_ports_total_file_is_a_bare_number_and_not_an_aer_dev_file() -> None:
    # aer_rootport_total_err_cor is "%llu\n" (prometheus/procfs fixtures.ttar @ 3c943fdb: "0"); not read.
    assert parse_aer_file("0\n", "TOTAL_ERR_COR") is None


def test_the_virtual_functions_of_an_sriov_gpu_are_not_gpus(tmp_path: Path) -> None:
    # A vGPU host lists a GPU's VFs as more NVIDIA "3D controller"s (01:00.4, 01:00.5, ...: hyprwm/hyprland-wiki
    # content/Configuring/Advanced and Cool/Virtual-GPU.md @ 22044583); each VF has a "physfn" link to its GPU
    # (torvalds/linux drivers/pci/iov.c, pci_iov_add_virtfn). nvidia-smi numbers the physical GPUs only.
    rp = "pci0000:00/0000:00:01.0"
    pci_device(tmp_path, rp, vendor="0x8086", cls="0x060400")
    pf = pci_device(tmp_path, f"{rp}/0000:01:00.0")
    for fn in ("0000:01:00.4", "0000:01:00.5"):
        vf = pci_device(tmp_path, f"{rp}/{fn}", aer=False)
        os.symlink("../0000:01:00.0", vf / "physfn")
        os.symlink(f"../{fn}", pf / f"virtfn{fn[-1]}")
    pci_device(tmp_path, "pci0000:80/0000:80:01.0", vendor="0x8086", cls="0x060400")
    pci_device(tmp_path, "pci0000:80/0000:80:01.0/0000:81:00.0")
    src = AerSource(tmp_path, host="n1", clock=lambda: T0)
    recs = src.poll()
    assert sorted((r.gpu, r.labels["pci_bus_id"]) for r in recs) == [(0, "0000:01:00.0"), (1, "0000:81:00.0")]
    assert src.counts["gpus"] == 2
