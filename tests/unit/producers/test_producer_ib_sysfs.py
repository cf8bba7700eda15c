"""The InfiniBand/RoCE sysfs producer (#34): every port under ``--root`` as a ``NicRecord``, in the
layouts the kernel writes (InfiniBand and Ethernet ports, ports down, disabled and polling, a
counters or hw_counters directory absent), with the GPUs behind each NIC from the PCIe tree, and
every hostile tree answered with a counted drop, never an exception or a hang.

The values are those of leptonai/gpud's h100 capture (``factories.SOURCES``); the state strings
are the kernel's (``drivers/infiniband/core/sysfs.c``: ``"%d: %s"`` of ``DOWN``/``INIT``/
``ARMED``/``ACTIVE`` and of ``Sleep``/``Polling``/``Disabled``/``PortConfigurationTraining``/
``LinkUp``/``LinkErrorRecovery``/``Phy Test``; the rate ``"%d%s Gb/sec (%s)"``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers import ib_sysfs
from producers.ib_sysfs import IbSysfsSource, bus_ids
from producers.kmsg import parse_pci_map
from tests.factories import T0
from tests.unit.producers.factories import ABSENT, HW_COUNTERS, IB_COUNTERS, gpu_device, h100_node, port_dir, write


def poll(root: Path, **kw):
    src = IbSysfsSource(str(root), host="n1", clock=lambda: T0, **kw)
    return {(r.device, r.port): r for r in src.poll()}, src.summary()


def drops(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k.startswith("dropped.") and v}


def test_the_h100_capture_reads_whole(tmp_path):
    h100_node(tmp_path)
    recs, summary = poll(tmp_path)
    assert len(recs) == 9 and drops(summary) == {}
    r = recs[("mlx5_0", 1)]
    assert (r.state, r.state_name, r.phys_state, r.phys_state_name, r.rate_gbps, r.link_layer) == (
        4, "ACTIVE", 5, "LinkUp", 400.0, "InfiniBand")
    hw = {k: v for k, v in HW_COUNTERS.items() if k != "lifespan"}  # a setting, not a counter
    assert r.counters == {**IB_COUNTERS, **hw, "carrier_changes": 2}
    assert (r.netdev, r.host, r.ts) == ("ibp26s0", "n1", T0)
    assert recs[("mlx5_1", 1)].counters["link_downed"] == 255
    bond = recs[("mlx5_bond_0", 1)]
    assert (bond.link_layer, bond.rate_gbps, bond.netdev, bond.counters["carrier_changes"]) == (
        "Ethernet", 200.0, "bond0", 4)
    # What the producer writes, the decoder takes whole.
    out = Decoder().decode(encode(list(recs.values())), "x")
    assert out.dead == [] and len(out.records) == 9


@pytest.mark.parametrize("state, phys, want", [
    ("1: DOWN", "3: Disabled", (1, "DOWN", 3, "Disabled")),
    ("1: DOWN", "2: Polling", (1, "DOWN", 2, "Polling")),
    ("2: INIT", "5: LinkUp", (2, "INIT", 5, "LinkUp")),
    ("4: ACTIVE", "6: LinkErrorRecovery", (4, "ACTIVE", 6, "LinkErrorRecovery")),
    ("1: DOWN", "7: Phy Test", (1, "DOWN", 7, "Phy Test")),
])
def test_port_states_as_the_kernel_prints_them(tmp_path, state, phys, want):
    port_dir(tmp_path, "mlx5_3", state=state, phys_state=phys, rate="40 Gb/sec (4X QDR)")
    recs, summary = poll(tmp_path)
    r = recs[("mlx5_3", 1)]
    assert (r.state, r.state_name, r.phys_state, r.phys_state_name) == want and r.rate_gbps == 40.0
    assert drops(summary) == {}


def test_absent_directories_and_files_are_no_drops(tmp_path):
    port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    port_dir(tmp_path, "rocep1s0", counters=ABSENT, hw_counters={"rnr_nak_retry_err": 1}, rate=None,
             link_layer="Ethernet", pci=("0000:40:01.0", "0000:41:00.0"))
    recs, summary = poll(tmp_path)
    assert recs[("mlx5_0", 1)].counters == IB_COUNTERS
    r = recs[("rocep1s0", 1)]
    assert r.counters == {"rnr_nak_retry_err": 1} and r.rate_gbps is None and r.link_layer == "Ethernet"
    assert drops(summary) == {}


def test_a_two_port_device_names_each_ports_netdev_by_dev_port(tmp_path):
    pci = ("0000:00:02.0", "0000:05:00.0")
    port_dir(tmp_path, "mlx4_0", 1, pci=pci, netdev="ib0", carrier_changes=1)
    port_dir(tmp_path, "mlx4_0", 2, pci=pci, netdev="ib1", carrier_changes=7, state="1: DOWN", phys_state="2: Polling")
    recs, _ = poll(tmp_path)
    assert (recs[("mlx4_0", 1)].netdev, recs[("mlx4_0", 1)].counters["carrier_changes"]) == ("ib0", 1)
    assert (recs[("mlx4_0", 2)].netdev, recs[("mlx4_0", 2)].counters["carrier_changes"]) == ("ib1", 7)


def test_carrier_changes_under_statistics_where_only_that_exists(tmp_path):
    p = port_dir(tmp_path, "mlx5_0", netdev="ib0")
    ndev = Path(os.path.realpath(tmp_path / "sys" / "class" / "net" / "ib0"))
    write(ndev / "statistics" / "carrier_changes", "3\n")
    recs, _ = poll(tmp_path)
    assert recs[("mlx5_0", 1)].counters["carrier_changes"] == 3 and p.exists()


def test_the_gpus_behind_each_nic_are_those_under_its_nearest_bridge(tmp_path):
    # Two PCIe switches, each with a NIC and two GPUs; a fifth GPU on its own root port.
    port_dir(tmp_path, "mlx5_0", pci=("0000:00:01.0", "0000:01:00.0", "0000:02:00.0"))
    port_dir(tmp_path, "mlx5_1", pci=("0000:00:03.0", "0000:11:00.0", "0000:12:00.0"))
    gpu_device(tmp_path, "0000:04:00.0", ("0000:00:01.0", "0000:01:00.0", "0000:02:01.0"))
    gpu_device(tmp_path, "0000:05:00.0", ("0000:00:01.0", "0000:01:00.0", "0000:02:02.0"))
    gpu_device(tmp_path, "0000:14:00.0", ("0000:00:03.0", "0000:11:00.0", "0000:12:01.0"))
    gpu_device(tmp_path, "0000:15:00.0", ("0000:00:03.0", "0000:11:00.0", "0000:12:02.0"))
    pci_map = parse_pci_map("index, pci.bus_id\n0, 00000000:04:00.0\n1, 00000000:05:00.0\n"
                            "2, 00000000:14:00.0\n3, 00000000:15:00.0\n4, 00000000:99:00.0\n")
    recs, summary = poll(tmp_path, gpu_bus_ids=bus_ids(pci_map))
    assert recs[("mlx5_0", 1)].gpus == [0, 1] and recs[("mlx5_1", 1)].gpus == [2, 3]
    assert drops(summary) == {}  # GPU 4 is not in this tree: behind no NIC, nothing lost
    recs, _ = poll(tmp_path)
    assert recs[("mlx5_0", 1)].gpus == []  # without a map, not known
    # A NIC that appears later (hot-plug, a driver loaded late) is mapped when it does.
    src = IbSysfsSource(str(tmp_path), host="n1", clock=lambda: T0, gpu_bus_ids=bus_ids(pci_map))
    assert {r.device: r.gpus for r in src.poll()} == {"mlx5_0": [0, 1], "mlx5_1": [2, 3]}
    port_dir(tmp_path, "mlx5_2", pci=("0000:00:01.0", "0000:01:00.0", "0000:02:03.0"))
    assert {r.device: r.gpus for r in src.poll()} == {"mlx5_0": [0, 1], "mlx5_1": [2, 3], "mlx5_2": [0, 1]}


@pytest.mark.parametrize("value", ["abc", "٣", "-1", "1e5", "18446744073709551616", "0x10", ""])
def test_a_garbage_counter_costs_only_itself(tmp_path, value):
    port_dir(tmp_path, "mlx5_0", counters={"link_downed": 0, "symbol_error": value}, hw_counters=ABSENT)
    recs, summary = poll(tmp_path)
    assert recs[("mlx5_0", 1)].counters == {"link_downed": 0}
    assert drops(summary) == {"dropped.bad_value": 1}


@pytest.mark.parametrize("field, value", [("state", "4:"), ("state", "99: ACTIVE"), ("phys_state", "LinkUp"),
                                          ("rate", "fast"), ("rate", "nan Gb/sec"), ("link_layer", "Infini Band\x1b")])
def test_a_garbage_port_attribute_is_left_out_and_counted(tmp_path, field, value):
    port_dir(tmp_path, "mlx5_0", **{field: value})
    recs, summary = poll(tmp_path)
    r = recs[("mlx5_0", 1)]
    assert getattr(r, field if field != "rate" else "rate_gbps") is None
    assert drops(summary) == {"dropped.bad_value": 1}
    assert Decoder().decode(encode(r), "x").dead == []


def test_a_huge_file_is_not_read_whole(tmp_path):
    p = port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    write(p / "counters" / "symbol_error", "1" * (64 * 1024 * 1024))
    recs, summary = poll(tmp_path)
    assert "symbol_error" not in recs[("mlx5_0", 1)].counters and recs[("mlx5_0", 1)].counters["link_downed"] == 0
    assert drops(summary) == {"dropped.oversized_file": 1}


def test_symlink_loops_fifos_and_links_out_of_root_are_counted(tmp_path):
    root = tmp_path / "root"
    p = port_dir(root, "mlx5_0", hw_counters=ABSENT)
    (p / "counters" / "loop_a").symlink_to("loop_b")
    (p / "counters" / "loop_b").symlink_to("loop_a")
    os.mkfifo(p / "counters" / "a_fifo")  # open() would block on it
    outside = tmp_path / "elsewhere" / "infiniband" / "evil0"
    write(outside / "ports" / "1" / "state", "4: ACTIVE\n")
    (root / "sys" / "class" / "infiniband" / "evil0").symlink_to(outside)
    (root / "sys" / "class" / "infiniband" / "spin0").symlink_to("spin0")
    recs, summary = poll(root)
    assert list(recs) == [("mlx5_0", 1)] and recs[("mlx5_0", 1)].counters == IB_COUNTERS
    d = drops(summary)
    assert d["dropped.outside_root"] == 1 and d["dropped.unreadable"] == 1 and d["dropped.not_a_file"] == 3


def test_names_no_record_could_carry_are_dropped(tmp_path):
    port_dir(tmp_path, "mlx5 0")
    port_dir(tmp_path, "mlx5_\x1b1", pci=("0000:00:02.0",))
    port_dir(tmp_path, "mlx5_2", pci=("0000:00:03.0",), hw_counters={"bad name": 1, "ok": 2}, counters=ABSENT)
    recs, summary = poll(tmp_path)
    assert list(recs) == [("mlx5_2", 1)] and recs[("mlx5_2", 1)].counters == {"ok": 2}
    assert drops(summary) == {"dropped.bad_name": 3}


def test_bounds_on_devices_and_counters(tmp_path, monkeypatch):
    monkeypatch.setattr(ib_sysfs, "MAX_DEVICES", 3)
    monkeypatch.setattr(ib_sysfs, "MAX_NIC_COUNTERS", 5)
    for i in range(5):
        port_dir(tmp_path, f"mlx5_{i}", pci=(f"0000:00:0{i}.0",), hw_counters=ABSENT)
    recs, summary = poll(tmp_path)
    assert len(recs) == 3 and all(len(r.counters) == 5 for r in recs.values())
    assert summary["dropped.too_many"] >= 4


def test_an_empty_or_missing_tree_gives_nothing_and_no_error(tmp_path):
    recs, summary = poll(tmp_path)
    assert recs == {} and drops(summary) == {}


def test_cli_polls_the_tree_on_its_interval(tmp_path, capsys):
    from pipeline.cli import main

    h100_node(tmp_path / "root")
    out = tmp_path / "o.jsonl"
    rc = main(["produce", "ib-sysfs", "--root", str(tmp_path / "root"), "--out", str(out), "--count", "2",
               "--interval", "0", "--host", "gpu-node-7"])
    assert rc == 0, capsys.readouterr().err
    got = Decoder().decode_many(out.read_bytes().splitlines(), [f"o:{i}" for i in range(18)])
    assert got.dead == [] and len(got.records) == 18 and {r.host for r in got.records} == {"gpu-node-7"}
    assert "ports 18" in capsys.readouterr().err


def test_cli_bad_pci_map_is_one_line(tmp_path, capsys):
    from pipeline.cli import main

    bad = tmp_path / "map.csv"
    bad.write_text("index, pci.bus_id\n0, nonsense\n")
    rc = main(["produce", "ib-sysfs", "--root", str(tmp_path), "--pci-map", str(bad), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot start: PCI map line 2" in err[0]
