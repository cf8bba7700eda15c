"""Each port's own GUID (``port_guid``): the low 64 bits of sysfs ``ports/<n>/gids/0``, ibstat's
``Port GUID``, ibstatus's ``default gid``. A driver reload that renames ``mlx5_0`` to ``mlx5_4``
keeps it, so ``ib-sysfs`` stops sending the old name as absent and ``port_lost`` of the old name
resolves. Hostile GIDs are a counted drop, the rest of the port kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from pipeline.decode import Decoder
from pipeline.engine import Engine, EngineConfig
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import NIC_ABSENT_LABEL, NicRecord, encode
from producers.ib_sysfs import IbSysfsSource
from producers.ibstat import IbstatStats, parse
from tests.factories import T0
from tests.unit.producers.factories import port_dir, write
from tests.unit.producers.ibstat_factories import H100_SOME_DOWN, IBSTATUS

# GID 0 as the kernel prints it: an IB port's (subnet prefix, then the port GUID) and a RoCE
# port's (link-local, its interface id made from the MAC 0c:42:a1:5b:2c:1e).
IB_GID = "fe80:0000:0000:0000:0c42:a103:00a1:b2c0\n"
ROCE_GID = "fe80:0000:0000:0000:0e42:a1ff:fe5b:2c1e\n"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000\n"


def _source(root: Path, now: list[float] | None = None) -> IbSysfsSource:
    clock = (lambda: now[0]) if now is not None else (lambda: T0)
    return IbSysfsSource(str(root), host="n1", clock=clock)


def _by_name(recs: list[NicRecord]) -> dict[str, NicRecord]:
    return {r.device: r for r in recs if NIC_ABSENT_LABEL not in r.labels}


def test_sysfs_port_guid_is_gid_0s_low_64_bits_on_infiniband_and_roce(tmp_path):
    write(port_dir(tmp_path, "mlx5_0") / "gids" / "0", IB_GID)
    write(port_dir(tmp_path, "mlx5_1", link_layer="Ethernet", pci=("0000:00:02.0",)) / "gids" / "0", ROCE_GID)
    write(port_dir(tmp_path, "mlx5_2", pci=("0000:00:03.0",)) / "gids" / "0", ZERO_GID)
    port_dir(tmp_path, "mlx5_3", pci=("0000:00:04.0",))  # no gids directory (an older or odd driver)
    src = _source(tmp_path)
    recs = _by_name(src.poll())
    assert {d: r.port_guid for d, r in recs.items()} == {
        "mlx5_0": "0x0c42a10300a1b2c0", "mlx5_1": "0x0e42a1fffe5b2c1e", "mlx5_2": None, "mlx5_3": None}  # fmt: skip
    assert src.summary()["dropped.bad_value"] == 0  # no GID, or an unset one, is no drop
    assert all(r.state_name == "ACTIVE" for r in recs.values())


@pytest.mark.parametrize(
    "gid",
    [
        "not a gid\n",
        "fe80::c42:a103:a1:b2c0\n",  # the short form: the kernel never prints it
        "fe80:0000:0000:0000:0c42:a103:00a1:zzzz\n",
        "fe80:0000:0000:0000:0c42:a103:00a1:b2c0:0000\n",
        ":" * 4000,
        "fe80:0000:0000:0000:0c42:a103:00a1:b2c0\x00\n",
        "\n",
    ],
)
def test_sysfs_a_gid_that_is_no_gid_gives_no_guid_and_keeps_the_port(tmp_path, gid):
    write(port_dir(tmp_path, "mlx5_0") / "gids" / "0", gid)
    src = _source(tmp_path)
    (r,) = src.poll()
    assert r.port_guid is None and (r.state_name, r.rate_gbps) == ("ACTIVE", 400.0)
    assert src.summary()["dropped.bad_value"] == (1 if gid.strip() else 0)


def test_sysfs_a_gid_file_too_long_not_ascii_or_not_a_file_is_a_counted_drop(tmp_path):
    p = port_dir(tmp_path, "mlx5_0")
    write(p / "gids" / "0", "f" * 5000)
    (p2 := port_dir(tmp_path, "mlx5_1", pci=("0000:00:02.0",))).joinpath("gids").mkdir()
    (p2 / "gids" / "0").write_bytes("fe80:0000:0000:0000:0c42:a103:00a1:b2c0é".encode())
    port_dir(tmp_path, "mlx5_2", pci=("0000:00:03.0",)).joinpath("gids", "0").mkdir(parents=True)
    src = _source(tmp_path)
    recs = _by_name(src.poll())
    assert [r.port_guid for r in recs.values()] == [None, None, None]
    s = src.summary()
    assert (s["dropped.oversized_file"], s["dropped.bad_value"], s["dropped.not_a_file"]) == (1, 1, 1)


def test_sysfs_a_renamed_port_is_not_sent_as_absent_and_a_removed_one_is(tmp_path):
    p0 = port_dir(tmp_path, "mlx5_0")
    write(p0 / "gids" / "0", IB_GID)
    write(port_dir(tmp_path, "mlx5_1", pci=("0000:00:02.0",)) / "gids" / "0", ROCE_GID)
    src = _source(tmp_path)
    assert len(src.poll()) == 2
    # A driver reload: mlx5_0's HCA comes back as mlx5_4, mlx5_1's does not come back.
    for dev in ("mlx5_0", "mlx5_1"):
        (tmp_path / "sys" / "class" / "infiniband" / dev).unlink()
    shutil.rmtree(p0.parents[2])
    write(port_dir(tmp_path, "mlx5_4") / "gids" / "0", IB_GID)
    for _ in range(2):
        recs = src.poll()
        assert [(r.device, r.port_guid, r.labels.get(NIC_ABSENT_LABEL)) for r in recs] == [
            ("mlx5_4", "0x0c42a10300a1b2c0", None), ("mlx5_1", None, "1")]  # fmt: skip


def test_ibstat_and_ibstatus_port_guids():
    stats = IbstatStats()
    recs = parse(H100_SOME_DOWN, ts=T0, host="n1", stats=stats)
    # RoCE's GUID is made from the MAC (fffe in the middle), an IB port's is its own.
    assert [(r.device, r.port_guid) for r in recs] == [
        ("mlx5_2", "0x966daefffec2b691"),
        ("mlx5_3", "0x946dae0300cde728"),
    ]
    recs = parse(IBSTATUS, ts=T0, host="n1")
    assert [(r.device, r.port_guid) for r in recs] == [("mlx5_0", "0x00155dfffd3411eb"), ("mlx5_8", None)]


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("Port GUID: 0X946DAE0300CDE728", "0x946dae0300cde728"),
        ("Port GUID: 0x0000000000000000", None),
        ("Port GUID: 0x946dae0300cde728ff", None),
        ("Port GUID: 0xzz6dae0300cde728", None),
        ("Port GUID: " + "f" * 100_000, None),
        ("Port GUID: ", None),
        ("Port GUID: 0x946dae03\x0000cde728", None),
    ],
)
def test_ibstat_a_hostile_port_guid_gives_none_and_keeps_the_port(line, want):
    text = H100_SOME_DOWN.replace("Port GUID: 0x946dae0300cde728", line)
    recs = {r.device: r for r in parse(text, ts=T0, host="n1")}
    assert recs["mlx5_3"].port_guid == want
    assert (recs["mlx5_3"].state_name, recs["mlx5_3"].rate_gbps) == ("ACTIVE", 400.0)
    assert recs["mlx5_2"].port_guid == "0x966daefffec2b691"


def test_port_guid_rides_the_wire_and_a_record_without_it_decodes_unchanged(tmp_path):
    write(port_dir(tmp_path, "mlx5_0") / "gids" / "0", IB_GID)
    sent = _source(tmp_path).poll()
    out = Decoder().decode(encode(sent), "nic#0")
    assert out.dead == [] and [r.port_guid for r in out.records] == ["0x0c42a10300a1b2c0"]
    old = msgspec.json.decode(encode(sent))
    del old[0]["port_guid"]  # a third-party producer's record, from before the field
    back = Decoder().decode(msgspec.json.encode(old), "nic#1")
    assert back.dead == [] and back.records[0].port_guid is None
    assert msgspec.structs.replace(back.records[0], port_guid=sent[0].port_guid) == out.records[0]


def test_a_driver_reload_from_sysfs_to_alert_resolves_port_lost_of_the_old_names(tmp_path):
    root = tmp_path / "root"
    gids = {f"mlx5_{i}": f"fe80:0000:0000:0000:0c42:a103:00a1:b2c{i}\n" for i in range(3)}
    pci = {f"mlx5_{i}": (f"0000:00:0{i + 1}.0",) for i in range(3)}
    for dev, gid in gids.items():
        write(port_dir(root, dev, pci=pci[dev]) / "gids" / "0", gid)
    now = [T0]
    src = _source(root, now)
    cfg, _ = parse_port_config("")
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    dec = Decoder()
    alerts = []
    for i in range(40):
        now[0] = T0 + 10 * i
        if i == 5:  # the driver unloads mlx5_0 and mlx5_1; mlx5_2 is another driver's
            for dev in ("mlx5_0", "mlx5_1"):
                (root / "sys" / "class" / "infiniband" / dev).unlink()
        if i == 15:  # and comes back with other names for them
            for old, new in (("mlx5_0", "mlx5_4"), ("mlx5_1", "mlx5_5")):
                shutil.rmtree(root / "sys" / "devices" / "pci0000:00" / pci[old][0] / "infiniband")
                write(port_dir(root, new, pci=pci[old]) / "gids" / "0", gids[old])
        out = dec.decode(encode(src.poll()), f"nic#{i}")
        assert out.dead == []
        alerts += eng.process(out.records).alerts
    alerts += eng.flush().alerts
    lost = sorted((a.labels["device"], a.state, a.ts - T0) for a in alerts if a.rule == "network_port_lost")
    firing = [x for x in lost if x[1] == "firing"]
    assert [d for d, _, t in firing if 50 < t < 150] == ["mlx5_0", "mlx5_1"]
    assert [x for x in lost if x[1] == "resolved"] == [("mlx5_0", "resolved", 150.0), ("mlx5_1", "resolved", 150.0)]
    assert len(lost) == 4
