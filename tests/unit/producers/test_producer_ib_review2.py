"""Review of the InfiniBand/RoCE port readers (``ib-sysfs`` and ``--peers``): trees and files the
kernel or a host can present that lost a whole poll, kept a stale mapping, or dropped a value
without counting it.

The trees are those of ``factories.port_dir`` (the kernel's layout: ``/sys/class/infiniband/<dev>``
a link to ``../../devices/pci.../infiniband/<dev>``, Documentation/ABI/stable/sysfs-class-infiniband);
the links file is the iblinkinfo line of ``test_producer_ib_hostile.py`` (rdma-core
``infiniband-diags/iblinkinfo.c`` ``print_node_header``/``print_port``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers import ib_sysfs
from producers.ib_sysfs import IbSysfsSource
from producers.ibpeers import PeerFile
from tests.factories import T0
from tests.unit.producers.factories import ABSENT, gpu_device, port_dir

SWITCH = "Infiniscale-IV Mellanox Technologies"
LINK_1 = f"""CA: ip-211 mlx4_0:
      0x0002c90300293e1f      6    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       2    1[  ] "{SWITCH}" ( )
"""
LINK_2 = f"""CA: ip-212 mlx4_0:
      0x0002c90300293e2f      7    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       2    2[  ] "{SWITCH}" ( )
"""


def poll(src: IbSysfsSource) -> tuple[dict, dict]:
    recs = src.poll()
    if recs:  # what the producer writes, the decoder takes whole
        assert Decoder().decode(encode(recs), "x").dead == []
    drops = {k: v for k, v in src.summary().items() if k.startswith("dropped.") and v}
    return {(r.device, r.port): r for r in recs}, drops


def source(root: Path, **kw) -> IbSysfsSource:
    return IbSysfsSource(str(root), host="n1", clock=lambda: T0, **kw)


def test_a_chain_of_links_deeper_than_the_stack_costs_only_that_device(tmp_path):
    # The kernel stops at 40 links (ELOOP); os.path.realpath follows them by recursion, and a
    # longer chain raised RecursionError out of poll(): every port of the host lost, every poll.
    port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    chain = tmp_path / "chain"
    chain.mkdir()
    prev = "."
    for i in range(sys.getrecursionlimit() + 100):
        (chain / f"l{i}").symlink_to(prev)
        prev = f"l{i}"
    (tmp_path / "sys" / "class" / "infiniband" / "evil0").symlink_to(os.path.join("..", "..", "..", "chain", prev))
    recs, drops = poll(source(tmp_path))
    assert list(recs) == [("mlx5_0", 1)] and recs[("mlx5_0", 1)].state_name == "ACTIVE"
    assert drops == {"dropped.unreadable": 1}


def test_a_device_link_removed_while_it_is_resolved_costs_only_that_device(tmp_path, monkeypatch):
    # A device unplugged (driver unbound, firmware reset) between realpath's lstat of its class
    # link and its readlink: the FileNotFoundError lost every other device's ports of that poll.
    port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    port_dir(tmp_path, "mlx5_1", hw_counters=ABSENT, pci=("0000:00:02.0",))
    gone = os.path.join(os.path.realpath(tmp_path), "sys", "class", "infiniband", "mlx5_1")
    readlink = os.readlink

    def unplugged(path, *args, **kw):
        if os.fspath(path) == gone and os.path.lexists(gone):
            os.unlink(gone)
        return readlink(path, *args, **kw)

    monkeypatch.setattr(os, "readlink", unplugged)
    recs, drops = poll(source(tmp_path))
    assert list(recs) == [("mlx5_0", 1)] and drops == {}  # absent, as a device gone before the listing


def test_two_devices_that_swap_names_between_polls_are_mapped_again(tmp_path):
    # A driver reload can name the NICs in another order; the set of names is the same, the PCI
    # paths behind them are not. The GPUs stayed with the old names.
    port_dir(tmp_path, "mlx5_0", pci=("0000:00:01.0", "0000:01:00.0", "0000:02:00.0"), hw_counters=ABSENT)
    port_dir(tmp_path, "mlx5_1", pci=("0000:00:03.0", "0000:11:00.0", "0000:12:00.0"), hw_counters=ABSENT)
    gpu_device(tmp_path, "0000:04:00.0", ("0000:00:01.0", "0000:01:00.0", "0000:02:01.0"))
    gpu_device(tmp_path, "0000:14:00.0", ("0000:00:03.0", "0000:11:00.0", "0000:12:01.0"))
    src = source(tmp_path, gpu_bus_ids={0: "0000:04:00.0", 1: "0000:14:00.0"})
    recs, _ = poll(src)
    assert {d: r.gpus for (d, _), r in recs.items()} == {"mlx5_0": [0], "mlx5_1": [1]}
    cls = tmp_path / "sys" / "class" / "infiniband"
    to0, to1 = os.readlink(cls / "mlx5_0"), os.readlink(cls / "mlx5_1")
    for name, target in (("mlx5_0", to1), ("mlx5_1", to0)):
        (cls / name).unlink()
        (cls / name).symlink_to(target)
    recs, drops = poll(src)
    assert {d: r.gpus for (d, _), r in recs.items()} == {"mlx5_0": [1], "mlx5_1": [0]} and drops == {}


def test_carrier_changes_that_finds_the_counters_full_is_counted(tmp_path, monkeypatch):
    # Exactly MAX_NIC_COUNTERS counters: no counter was past the bound, so carrier_changes was left
    # out without a count.
    monkeypatch.setattr(ib_sysfs, "MAX_NIC_COUNTERS", 3)
    port_dir(tmp_path, "mlx5_0", counters={"a": 1, "b": 2, "c": 3}, hw_counters=ABSENT, netdev="ib0", carrier_changes=5)
    recs, drops = poll(source(tmp_path))
    r = recs[("mlx5_0", 1)]
    assert r.counters == {"a": 1, "b": 2, "c": 3} and r.netdev == "ib0"
    assert drops == {"dropped.too_many": 1}


def test_a_netdevs_garbage_dev_port_or_name_is_counted(tmp_path):
    # Two ports, each with its netdev: a dev_port that is not a number costs that port its netdev
    # and carrier_changes, a netdev name no record could carry is left out; neither was counted.
    pci = ("0000:00:02.0", "0000:05:00.0")
    port_dir(tmp_path, "mlx4_0", 1, pci=pci, netdev="ib0", carrier_changes=1, hw_counters=ABSENT)
    port_dir(tmp_path, "mlx4_0", 2, pci=pci, netdev="ib1", carrier_changes=7, hw_counters=ABSENT)
    net = Path(os.path.realpath(tmp_path / "sys" / "class" / "net" / "ib1"))
    (net / "dev_port").write_text("one\n")
    (net.parent / "ib 2").mkdir()
    (net.parent / "ib 2" / "dev_port").write_text("1\n")
    recs, drops = poll(source(tmp_path))
    assert (recs[("mlx4_0", 1)].netdev, recs[("mlx4_0", 1)].counters["carrier_changes"]) == ("ib0", 1)
    assert recs[("mlx4_0", 2)].netdev is None and "carrier_changes" not in recs[("mlx4_0", 2)].counters
    assert drops == {"dropped.bad_value": 1, "dropped.bad_name": 1}


def test_a_ports_directory_that_is_a_file_is_counted(tmp_path):
    # "ports" a regular file: its device gave no record and no count (NotADirectoryError read as absent).
    port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    p = port_dir(tmp_path, "mlx5_1", hw_counters=ABSENT, pci=("0000:00:02.0",))
    ports = p.parent
    for f in sorted(ports.rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    ports.rmdir()
    ports.write_text("1\n")
    recs, drops = poll(source(tmp_path))
    assert list(recs) == [("mlx5_0", 1)] and drops == {"dropped.not_a_file": 1}


def test_peers_file_rewritten_within_one_clock_tick_is_read_again(tmp_path):
    # ext4 and xfs stamp a write with a coarse clock (a jiffy): a poll that reads the file while
    # "iblinkinfo > links.txt" writes it, and the last write within that tick, left the mtime as
    # it was and the peers read from half a file until the next rewrite.
    f = tmp_path / "links.txt"
    f.write_text(LINK_1)
    peers = PeerFile(str(f))
    assert peers.current().stats.links == 1
    st = os.stat(f)
    with open(f, "a") as fh:
        fh.write(LINK_2)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    m = peers.current()
    assert m.stats.links == 2 and m.peer(1, "0x0002c90300293e2f").port == 2
