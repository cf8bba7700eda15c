"""The PCIe AER producer against sysfs trees laid out as the kernel lays them out, and hostile ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from producers.pcie_aer import AerSource, parse_aer_file
from tests.factories import T0
from tests.unit.producers.pcie_factories import COR_NAMES, UNCOR_NAMES, aer_text, dgx_like, pci_device


def _poll(root: Path, **kw) -> dict[int, dict[str, float]]:
    src = AerSource(root, host="n1", clock=lambda: T0, **kw)
    out = {}
    for r in src.poll():
        assert r.host == "n1" and r.ts == T0
        out[r.gpu] = _fields(r)
    return out


def _fields(rec) -> dict[str, float]:
    import math

    from pipeline.catalog import FIELDS

    vals = {}
    for f in FIELDS:
        for n in f.names:
            v = getattr(rec.fields, n, math.nan)
            if v == v:
                vals[f.alias] = v
    return vals


def test_a_healthy_tree_reads_zero_everywhere_and_skips_what_is_not_a_gpu(tmp_path: Path) -> None:
    dgx_like(tmp_path)
    got = _poll(tmp_path)
    assert sorted(got) == [0, 1, 2]  # the NIC, the NVSwitch and the bridges are no GPU
    for g in got.values():
        assert g == {f"pcie_aer_{p}{s}": 0 for p in ("", "upstream_") for s in ("correctable", "nonfatal", "fatal")}


def test_a_gpus_own_errors_and_its_bridges_errors_are_apart(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    (dev["gpu0"] / "aer_dev_correctable").write_text(aer_text("TOTAL_ERR_COR", COR_NAMES, {"RxErr": 5, "BadTLP": 2}))
    # The root port above both switch legs saw a fatal Surprise Down: both GPUs under it carry it.
    (dev["root_port"] / "aer_dev_fatal").write_text(aer_text("TOTAL_ERR_FATAL", UNCOR_NAMES, {"SDES": 1}))
    (dev["switch_dn1"] / "aer_dev_nonfatal").write_text(aer_text("TOTAL_ERR_NONFATAL", UNCOR_NAMES, {"CmpltTO": 3}))
    got = _poll(tmp_path)
    assert got[0]["pcie_aer_correctable"] == 7 and got[0]["pcie_aer_upstream_correctable"] == 0
    assert got[0]["pcie_aer_upstream_fatal"] == 1 and got[1]["pcie_aer_upstream_fatal"] == 1
    assert got[0]["pcie_aer_upstream_nonfatal"] == 0 and got[1]["pcie_aer_upstream_nonfatal"] == 3
    assert got[2]["pcie_aer_upstream_fatal"] == 0  # another root port


def test_gpu_indices_follow_the_pci_map_and_an_unmapped_gpu_is_counted(tmp_path: Path) -> None:
    dgx_like(tmp_path)
    pci = {(0, 0x81, 0): 0, (0, 0x03, 0): 1}  # GPU at 04:00.0 not in the map
    src = AerSource(tmp_path, host="n1", clock=lambda: T0, pci_map=pci)
    recs = src.poll()
    assert sorted((r.gpu, r.labels["pci_bus_id"]) for r in recs) == [(0, "0000:81:00.0"), (1, "0000:03:00.0")]
    assert src.counts["dropped.unmapped_gpu"] == 1


@pytest.mark.parametrize(
    "text,expected",
    [
        ("RxErr 2\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 2\n", 2),
        # The ABI document's sample spelling (names with spaces; aer.c prints the short names).
        ("Receiver Error 2\nBad TLP 0\nBad DLLP 0\nRELAY_NUM Rollover 0\nReplay Timer Timeout 0\nTOTAL_ERR_COR 2\n", 2),
        # A bit with no name (aer.c prints "dev_cor_errs_bit[<n>]") and no total line (never printed): the sum.
        ("RxErr 1\ndev_cor_errs_bit[9] 4\n", 5),
        ("TOTAL_ERR_COR 18446744073709551615\n", 18446744073709551615),
    ],
)
def test_each_layout_the_kernel_prints_reads(text: str, expected: int) -> None:
    assert parse_aer_file(text, "TOTAL_ERR_COR") == expected


@pytest.mark.parametrize(
    "text",
    ["", "RxErr\n", "RxErr -1\n", "RxErr ٣\n", "RxErr 1e3\n", "RxErr " + "9" * 21 + "\n", "x 1\n" * 65, " 3\n"],
)
def test_a_file_not_in_the_format_is_no_number(text: str) -> None:
    assert parse_aer_file(text, "TOTAL_ERR_COR") is None


def test_hostile_files_cost_only_their_field(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    (dev["gpu0"] / "aer_dev_correctable").write_text("RxErr lots\n")
    (dev["gpu0"] / "aer_dev_fatal").write_bytes(b"1" * 100_000)
    (dev["gpu1"] / "aer_dev_nonfatal").unlink()
    os.mkfifo(dev["gpu1"] / "aer_dev_nonfatal")  # would block a plain read for ever
    (dev["gpu2"] / "aer_dev_fatal").unlink()
    (dev["gpu2"] / "aer_dev_fatal").symlink_to("/etc/hostname")  # a link out of the tree
    src = AerSource(tmp_path, host="n1", clock=lambda: T0)
    got = {r.gpu: _fields(r) for r in src.poll()}
    assert "pcie_aer_correctable" not in got[0] and "pcie_aer_fatal" not in got[0]
    assert got[0]["pcie_aer_nonfatal"] == 0
    assert "pcie_aer_nonfatal" not in got[1] and got[1]["pcie_aer_fatal"] == 0
    assert "pcie_aer_fatal" not in got[2] and got[2]["pcie_aer_correctable"] == 0
    assert src.counts["dropped.unparsable_file"] == 1
    assert src.counts["dropped.oversize_file"] == 1
    assert src.counts["dropped.unreadable_file"] == 2  # the FIFO and the link


def test_no_link_is_followed_out_of_the_root_and_loops_end(tmp_path: Path) -> None:
    root = tmp_path / "root"
    dgx_like(root)
    pci_device(tmp_path / "elsewhere-root", "pci0000:00/0000:09:00.0")  # a GPU outside the root
    bus = root / "sys" / "bus" / "pci" / "devices"
    (bus / "0000:09:00.0").symlink_to(tmp_path / "elsewhere-root" / "sys" / "devices" / "pci0000:00" / "0000:09:00.0")
    (bus / "0000:0a:00.0").symlink_to(bus / "0000:0a:00.0")  # a loop
    src = AerSource(root, host="n1", clock=lambda: T0)
    assert sorted(r.gpu for r in src.poll()) == [0, 1, 2]
    assert src.counts["dropped.link_outside_root"] == 2


def test_a_gpu_without_aer_sends_nothing_and_a_missing_tree_sends_nothing(tmp_path: Path) -> None:
    pci_device(tmp_path, "pci0000:00/0000:00:01.0", vendor="0x8086", cls="0x060400", aer=False)
    pci_device(tmp_path, "pci0000:00/0000:00:01.0/0000:01:00.0", aer=False)
    assert AerSource(tmp_path, host="n1", clock=lambda: T0).poll() == []
    assert AerSource(tmp_path / "nothing", host="n1", clock=lambda: T0).poll() == []


def test_the_cli_publishes_records_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    dgx_like(tmp_path / "root")
    out = tmp_path / "aer.jsonl"
    rc = main(["produce", "pcie-aer", "--root", str(tmp_path / "root"), "--host", "n7", "--count", "2",
               "--interval", "0.01", "--out", str(out)])
    assert rc == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 6 and all('"host":"n7"' in ln and "GPUWARDEN_PCIE_AER_DEV_FATAL" in ln for ln in lines)
