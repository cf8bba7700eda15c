"""Hostile input for the InfiniBand/RoCE producers (``ib-sysfs``, ``ibstat``, ``--peers``): each
answered with a counted drop in bounded time and memory, the rest of the input kept.

The well-formed lines are those of the fixtures in ``test_producer_ibstat.py`` (gpud's H100
capture) and ``test_producer_ibpeers.py`` (a public QDR fabric's ``iblinkinfo``); the hostile ones
are built to cost a backtracking regex one attempt per quote, bracket or space they hold.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers import ibpeers, ibstat
from producers.ib_sysfs import IbSysfsSource
from producers.ibpeers import MAX_LINE, PeerFile, PeerStats
from producers.ibstat import IbstatSource, IbstatStats
from tests.factories import T0
from tests.unit.producers.factories import ABSENT, IB_COUNTERS, port_dir, write

IBSTAT = """CA 'mlx5_3'
\tCA type: MT4129
\tNumber of ports: 1
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tPort GUID: 0x946dae0300cde728
\t\tLink layer: InfiniBand
"""
SWITCH = "Infiniscale-IV Mellanox Technologies"
LINKINFO = f"""CA: ip-211 mlx4_0:
      0x0002c90300293e1f      6    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       2    1[  ] "{SWITCH}" ( )
"""
GID = "fe80:0000:0000:0000:0002:c903:0029:3e1f\n"  # ip-211's port GUID as sysfs gids/0 holds it
HANG_GUARD_S = 1.0  # each input below takes well under 0.05 s; a backtracking parse took seconds


def drops(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k.startswith("dropped.") and v}


def sysfs(root: Path, **kw):
    src = IbSysfsSource(str(root), clock=lambda: T0, **{"host": "n1", **kw})
    recs = src.poll()
    if recs:  # what the producer writes, the decoder takes whole
        assert Decoder().decode(encode(recs), "x").dead == []
    return {(r.device, r.port): r for r in recs}, drops(src.summary())


# -- ibstat ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("junk", [" " * 20_000 + "x", "\t\tBase lid: 4" + " " * 20_000 + "x"])
def test_ibstat_a_long_line_of_spaces_costs_one_pass(junk):
    t = time.perf_counter()
    recs = ibstat.parse(IBSTAT.replace("\t\tRate: 400\n", f"\t\tRate: 400\n{junk}\n"), ts=T0, host="n1")
    assert time.perf_counter() - t < HANG_GUARD_S
    assert [(r.device, r.port, r.state_name, r.rate_gbps) for r in recs] == [("mlx5_3", 1, "ACTIVE", 400.0)]


def test_ibstat_ports_past_the_bound_are_counted_not_held(monkeypatch):
    monkeypatch.setattr(ibstat, "MAX_PORTS", 3)
    stats = IbstatStats()
    text = IBSTAT + "".join(f"\tPort {n}:\n\t\tState: Down\n" for n in range(2, 6))
    text += "Infiniband device 'mlx5_9' port 1 status:\n\tstate:\t\t 4: ACTIVE\n"
    recs = ibstat.parse(text, ts=T0, host="n1", stats=stats)
    assert [(r.device, r.port) for r in recs] == [("mlx5_3", 1), ("mlx5_3", 2), ("mlx5_3", 3)]
    assert stats.too_many == 3


def test_ibstat_too_many_ports_is_a_counted_drop_of_the_source(tmp_path, monkeypatch):
    monkeypatch.setattr(ibstat, "MAX_PORTS", 1)
    f = tmp_path / "ibstat.txt"
    f.write_text(IBSTAT + "\tPort 2:\n\t\tState: Down\n")
    src = IbstatSource(str(f), host="n1", clock=lambda: T0)
    assert len(src.poll()) == 1 and drops(src.summary()) == {"dropped.too_many": 1}


def test_ibstat_crlf_and_blank_lines_read_as_the_tool_wrote_them():
    for text in (IBSTAT.replace("\n", "\r\n"), IBSTAT.replace("\n", "\r"), IBSTAT.replace("\n", "\n\n")):
        recs = ibstat.parse(text, ts=T0, host="n1")
        assert [(r.device, r.port, r.state_name, r.phys_state_name, r.rate_gbps, r.link_layer) for r in recs] == [
            ("mlx5_3", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")
        ]


def test_ibstat_holds_no_list_of_every_line():
    text = "xy\n" * 30_000
    tracemalloc.start()
    try:
        ibstat.parse(text, ts=T0, host="n1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(text)  # a list of its lines is ~20 times the text


# -- --peers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        ('"' + '" 1 1[] ==( )==> 1 1[] "x' * 200)[:MAX_LINE],  # iblinkinfo: a quote at each turn
        ("CA 1 1 0x1 x" + " - SW 1 1 0x1 ( ' - '" * 200)[:MAX_LINE],  # ibnetdiscover -p: a dash at each turn
        ("==(" * 2000)[:MAX_LINE],
    ],
)
def test_peers_a_hostile_line_costs_one_pass(line):
    t = time.perf_counter()
    m = ibpeers.parse(LINKINFO + (line + "\n") * 10)
    assert time.perf_counter() - t < HANG_GUARD_S
    assert m.stats.links == 1 and m.peer(1, "0x0002c90300293e1f").desc == SWITCH


def test_peers_holds_no_list_of_every_line():
    text = LINKINFO + "xy\n" * 30_000
    tracemalloc.start()
    try:
        m = ibpeers.parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert m.stats == PeerStats(links=1) and peak < len(text)


def _peers_source(tmp_path: Path) -> tuple[IbSysfsSource, Path]:
    f = tmp_path / "links.txt"
    f.write_text(LINKINFO)
    port_dir(tmp_path / "root", "mlx4_0", hw_counters=ABSENT)
    return IbSysfsSource(str(tmp_path / "root"), host="ip-211", peers=PeerFile(str(f)), clock=lambda: T0), f


def _newer(f: Path) -> None:
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_peers_file_replaced_by_a_directory_keeps_the_ports_and_their_peers(tmp_path):
    src, f = _peers_source(tmp_path)
    assert [r.peer_port for r in src.poll()] == [1]
    f.unlink()
    f.mkdir()
    _newer(f)
    recs = src.poll()  # every port of the poll was lost with an IsADirectoryError
    assert [(r.device, r.peer, r.peer_port) for r in recs] == [("mlx4_0", SWITCH, 1)]


def test_peers_file_gone_between_stat_and_read_keeps_the_ports(tmp_path, monkeypatch):
    src, f = _peers_source(tmp_path)
    src.poll()
    _newer(f)

    def vanished(path, max_chars):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(ibpeers, "read_capped", vanished)
    assert [(r.device, r.peer_port) for r in src.poll()] == [("mlx4_0", 1)]


def test_peers_file_replaced_by_a_fifo_does_not_block_the_poll(tmp_path):
    src, f = _peers_source(tmp_path)
    src.poll()
    f.unlink()
    os.mkfifo(f)
    got: list = []
    poller = threading.Thread(target=lambda: got.append(src.poll()), daemon=True)
    poller.start()
    poller.join(2)
    hung = poller.is_alive()
    if hung:  # let the blocked open() go: a writer opens the FIFO and leaves
        os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        poller.join(2)
    assert not hung
    assert [(r.device, r.peer_port) for r in got[0]] == [("mlx4_0", 1)]


def test_peers_file_that_is_a_directory_at_start_says_so(tmp_path):
    with pytest.raises(IsADirectoryError):
        PeerFile(str(tmp_path))


# -- ib-sysfs --------------------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    write(d / "0", GID)
    write(d / "dev_port", "0\n")
    write(d / "carrier_changes", "77\n")
    return d


def test_sysfs_a_gids_link_out_of_the_root_is_not_read(tmp_path, outside):
    links = tmp_path / "links.txt"
    links.write_text(LINKINFO)
    root = tmp_path / "root"
    p = port_dir(root, "mlx4_0", hw_counters=ABSENT)
    (p / "gids").symlink_to(outside)
    recs, d = sysfs(root, host="gpu-9", peers=PeerFile(str(links)))  # not found by its name
    assert recs[("mlx4_0", 1)].peer is None and recs[("mlx4_0", 1)].counters == IB_COUNTERS
    assert d == {"dropped.outside_root": 1}


def test_sysfs_a_statistics_link_out_of_the_root_is_not_read(tmp_path, outside):
    root = tmp_path / "root"
    port_dir(root, "mlx5_0", hw_counters=ABSENT, netdev="ib0")
    (Path(os.path.realpath(root / "sys" / "class" / "net" / "ib0")) / "statistics").symlink_to(outside)
    recs, d = sysfs(root)
    r = recs[("mlx5_0", 1)]
    assert r.netdev == "ib0" and "carrier_changes" not in r.counters and r.counters == IB_COUNTERS
    assert d == {"dropped.outside_root": 1}


def test_sysfs_a_netdev_link_out_of_the_root_is_not_read(tmp_path, outside):
    root = tmp_path / "root"
    port_dir(root, "mlx5_0", hw_counters=ABSENT, netdev="ib0", carrier_changes=3)
    net = Path(os.path.realpath(root / "sys" / "class" / "infiniband" / "mlx5_0" / "device" / "net"))
    (net / "evil0").symlink_to(outside)  # sorts first: its dev_port would name port 1's netdev
    recs, d = sysfs(root)
    assert recs[("mlx5_0", 1)].netdev == "ib0" and recs[("mlx5_0", 1)].counters["carrier_changes"] == 3
    assert d == {"dropped.outside_root": 1}


def test_sysfs_a_port_named_as_the_kernel_never_names_one_is_not_a_second_record(tmp_path):
    p = port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    write(p.parent / "01" / "state", "1: DOWN\n")
    recs, d = sysfs(tmp_path)
    assert list(recs) == [("mlx5_0", 1)] and recs[("mlx5_0", 1)].state_name == "ACTIVE"
    assert d == {"dropped.bad_name": 1}


@pytest.mark.parametrize(
    "value, reason",
    [
        ("99999999999999999999999", "dropped.bad_value"),  # past 2^64
        ("1\x002", "dropped.bad_value"),
        (b"\xff\xfe1", "dropped.bad_value"),
        ("", "dropped.bad_value"),
        ("x" * 5000, "dropped.oversized_file"),
    ],
)
def test_sysfs_a_garbage_counter_costs_only_itself(tmp_path, value, reason):
    p = port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    f = p / "counters" / "symbol_error"
    f.write_bytes(value if isinstance(value, bytes) else value.encode())
    recs, d = sysfs(tmp_path)
    assert recs[("mlx5_0", 1)].counters == {k: v for k, v in IB_COUNTERS.items() if k != "symbol_error"}
    assert d == {reason: 1}


def test_sysfs_dev_zero_and_a_directory_as_counters_are_not_read(tmp_path):
    p = port_dir(tmp_path, "mlx5_0", hw_counters=ABSENT)
    (p / "counters" / "symbol_error").unlink()
    (p / "counters" / "symbol_error").symlink_to("/dev/zero")
    (p / "counters" / "link_downed").unlink()
    (p / "counters" / "link_downed").mkdir()
    recs, d = sysfs(tmp_path)
    assert len(recs[("mlx5_0", 1)].counters) == len(IB_COUNTERS) - 2
    assert d == {"dropped.not_a_file": 2}


def test_a_port_header_lost_or_cut_never_gives_its_values_to_the_port_before():
    # A damaged copy: "Port 2" without its colon, or no header at all. Port 2's Down must not
    # overwrite Port 1's Active; the lost port is counted, not guessed.
    from producers.ibstat import IbstatStats, parse

    block = "\tPort {n}\n\t\tState: {state}\n\t\tPhysical state: {phys}\n\t\tRate: 400\n"
    good = ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n"
            "\t\tLink layer: InfiniBand\n")  # fmt: skip
    for lost in (block.format(n="2", state="Down", phys="Disabled"),
                 block.format(n="2", state="Down", phys="Disabled").split("\n", 1)[1]):  # fmt: skip
        st = IbstatStats()
        recs = parse(good + lost, ts=0.0, host="n1", stats=st)
        assert [(r.port, r.state_name, r.phys_state_name) for r in recs] == [(1, "ACTIVE", "LinkUp")]
        assert (st.unparsable_lines, st.unparsable_values) in ((1, 0), (0, 3))  # the cut header, or each value again


def test_a_port_printed_twice_is_one_record_with_the_later_state():
    # Two captures appended to one file (a cron job's "ibstat >> f"): one read, one record a port,
    # the latest state; the earlier block is counted, not sent as a second state of that second.
    from producers.ibstat import IbstatStats, parse

    cap = "CA 'mlx5_0'\n\tPort 1:\n\t\tState: {}\n\t\tPhysical state: {}\n\t\tRate: 400\n\t\tLink layer: InfiniBand\n"
    st = IbstatStats()
    recs = parse(cap.format("Active", "LinkUp") + cap.format("Down", "Disabled"), ts=0.0, host="n1", stats=st)
    assert [(r.device, r.port, r.state_name) for r in recs] == [("mlx5_0", 1, "DOWN")]
    assert st.duplicate_ports == 1 and st.ports == 2


@pytest.mark.parametrize("text, rc", [("hello\nnot ibstat at all\n", 3), ("", 0),
                                      ("CA 'mlx5_0'\n\tNumber of ports: 1\n", 0)])  # fmt: skip
def test_ibstat_on_a_file_that_is_not_its_output_exits_3_as_the_other_file_producers(tmp_path, capsys, text, rc):
    # Before: 0 records and exit 0, as if every port were fine. A CA with no port block read is
    # the tool's output (exit 0: nothing lost); an empty file is no error either.
    from pipeline.cli import main

    f = tmp_path / "ibstat.txt"
    f.write_text(text)
    assert main(["produce", "ibstat", "--file", str(f), "--host", "n1", "--out", str(tmp_path / "o.jsonl")]) == rc
    err = capsys.readouterr().err.strip().splitlines()
    assert (err[-1].endswith("ibstat.txt: not one line could be read as ibstat output (exit 3)")) == (rc == 3)
