"""A port's link partner from a saved fabric listing (#34, ``--peers``): every layout of
``iblinkinfo`` and ``ibnetdiscover`` read into the same links, both producers labelling their
ports with it, and hostile files answered with counted drops, never an exception.

Fixtures (public outputs, cut to a few nodes, spacing as printed):

- ``LINKINFO`` and ``TOPOLOGY``: one QDR fabric (hosts ``ip-160``..``ip-213`` on one
  Infiniscale-IV switch) as ``iblinkinfo`` and ``ibnetdiscover`` print it, with the ``ibstat`` of
  ``ip-211`` (``IBSTAT_IP211``), from a public GitHub page of IB command notes (``# IB 命令``;
  the search index's file 49090933291);
- ``LINKINFO_LINE``: ``iblinkinfo --switches-only -l`` on an ibsim fabric, from a public GitHub
  lab write-up (the search index's file 70424127924);
- ``PORTS``: ``ibnetdiscover -p`` has no public capture here: written from the format string of
  rdma-core ``infiniband-diags/ibnetdiscover.c`` ``dump_ports_report`` @ 691953d8 with the values of
  ``TOPOLOGY``.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.decode import Decoder
from pipeline.schema import NicRecord, encode
from producers.ib_sysfs import IbSysfsSource
from producers.ibpeers import MAX_LINE, End, PeerFile, PeerStats, parse
from producers.ibstat import IbstatSource
from tests.factories import T0, fuzz_examples
from tests.unit.producers.factories import port_dir, write

SWITCH = "Infiniscale-IV Mellanox Technologies"

LINKINFO = """CA: ip-160 HCA-1:
      0x0002c903000d7aad      5    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       2   33[  ] "Infiniscale-IV Mellanox Technologies" ( )
CA: ip-211 mlx4_0:
      0x0002c90300293e1f      6    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       2    1[  ] "Infiniscale-IV Mellanox Technologies" ( )
Switch: 0x0002c9020046c588 Infiniscale-IV Mellanox Technologies:
           2    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       6    1[  ] "ip-211 mlx4_0" ( )
           2    2[  ] ==(                Down/ Polling)==>             [  ] "" ( )
           2   14[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       8    1[  ] "ip-212 mlx4_0" ( )
           2   33[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       5    1[  ] "ip-160 HCA-1" ( )
           2   36[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       3    1[  ] "ip-210 mlx4_0" ( )
CA: ip-210 mlx4_0:
      0x0002c903000cc89b      3    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       2   36[  ] "Infiniscale-IV Mellanox Technologies" ( )
"""

TOPOLOGY = """vendid=0x2c9
devid=0xbd36
sysimgguid=0x2c9020046c58b
switchguid=0x2c9020046c588(2c9020046c588)
Switch  36 "S-0002c9020046c588"                     # "Infiniscale-IV Mellanox Technologies" base port 0 lid 2 lmc 0
[1]     "H-0002c90300293e1e"[1](2c90300293e1f)      # "ip-211 mlx4_0" lid 6 4xQDR
[14]    "H-0002c90300293eba"[1](2c90300293ebb)      # "ip-212 mlx4_0" lid 8 4xQDR
[16]    "H-0002c903005925f0"[1](2c903005925f1)      # "ip-213 mlx4_0" lid 9 4xQDR
[33]    "H-0002c903000d7aac"[1](2c903000d7aad)      # "ip-160 HCA-1" lid 5 4xQDR
[36]    "H-0002c903000cc89a"[1](2c903000cc89b)      # "ip-210 mlx4_0" lid 3 4xQDR

vendid=0x2c9
devid=0x673c
sysimgguid=0x2c903000d7aaf
caguid=0x2c903000d7aac
Ca  1 "H-0002c903000d7aac"                          # "ip-160 HCA-1"
[1](2c903000d7aad)  "S-0002c9020046c588"[33]        # lid 5 lmc 0 "Infiniscale-IV Mellanox Technologies" lid 2 4xQDR

vendid=0x2c9
devid=0x673c
sysimgguid=0x2c90300293e21
caguid=0x2c90300293e1e
Ca  2 "H-0002c90300293e1e"                          # "ip-211 mlx4_0"
[1](2c90300293e1f)  "S-0002c9020046c588"[1]         # lid 6 lmc 0 "Infiniscale-IV Mellanox Technologies" lid 2 4xQDR
"""

IBSTAT_IP211 = """CA 'mlx4_0'
    CA type: MT26428
    Number of ports: 2
    Firmware version: 2.9.1000
    Hardware version: b0
    Node GUID: 0x0002c90300293e1e
    System image GUID: 0x0002c90300293e21
    Port 1:
        State: Active
        Physical state: LinkUp
        Rate: 40
        Base lid: 6
        LMC: 0
        SM lid: 5
        Capability mask: 0x02590868
        Port GUID: 0x0002c90300293e1f
        Link layer: InfiniBand
    Port 2:
        State: Down
        Physical state: Polling
        Rate: 10
        Base lid: 0
        LMC: 0
        SM lid: 0
        Capability mask: 0x02590868
        Port GUID: 0x0002c90300293e20
        Link layer: InfiniBand
"""

LINKINFO_LINE = """0x0000000000200002 "               hxa-su1-leaf-r1"      4    1[  ] ==( 4X           2.5 Gbps Active/  LinkUp)==>  0x0000000000100002      5    1[  ] "hxa-gpu01 mlx5_0" (Could be 12X Could be 10.0 Gbps)
0x0000000000200002 "               hxa-su1-leaf-r1"      4    2[  ] ==( 4X           2.5 Gbps Active/  LinkUp)==>  0x0000000000100006     10    1[  ] "hxa-gpu02 mlx5_0" (Could be 12X Could be 10.0 Gbps)
"""

PORTS = """CA     5  1 0x0002c903000d7aad 4x QDR - SW     2 33 0x0002c9020046c588 ( 'ip-160 HCA-1' - 'Infiniscale-IV Mellanox Technologies' )
CA     6  1 0x0002c90300293e1f 4x QDR - SW     2  1 0x0002c9020046c588 ( 'ip-211 mlx4_0' - 'Infiniscale-IV Mellanox Technologies' )
SW     2  1 0x0002c9020046c588 4x QDR - CA     6  1 0x0002c90300293e1f ( 'Infiniscale-IV Mellanox Technologies' - 'ip-211 mlx4_0' )
"""

IP211_PEER = End(SWITCH, "0x0002c9020046c588", 1, 2, True)


def test_iblinkinfo_names_each_cas_switch_port_by_guid_and_by_name():
    m = parse(LINKINFO)
    assert m.stats == PeerStats(links=7)
    # The switch's block adds its GUID to what the CA's own line said.
    assert m.peer(1, "0x0002c90300293e1f") == IP211_PEER
    assert m.peer(1, names=["ip-211 mlx4_0"]) == IP211_PEER
    assert m.peer(1, "0x0002c903000d7aad") == End(SWITCH, "0x0002c9020046c588", 33, 2, True)
    assert m.peer(1, names=["ip-160 HCA-1"]) == End(SWITCH, "0x0002c9020046c588", 33, 2, True)
    assert m.peer(1, names=["ip-212 mlx4_0"]).port == 14  # known from the switch's side alone
    assert m.peer(2, names=["ip-211 mlx4_0"]) is None and m.peer(1, names=["ip-999 mlx4_0"]) is None
    # The switch's ports know their CAs too.
    assert m.peer(36, names=[SWITCH]) == End("ip-210 mlx4_0", "0x0002c903000cc89b", 1, 3, False)


def test_ibnetdiscover_topology_names_the_same_links():
    m = parse(TOPOLOGY)
    assert m.stats == PeerStats(links=7)
    assert m.peer(1, "0x0002c90300293e1f") == IP211_PEER
    assert m.peer(1, "0x0002c903005925f1") == End(SWITCH, "0x0002c9020046c588", 16, 2, True)
    assert m.peer(1, names=["ip-160 HCA-1"]) == End(SWITCH, "0x0002c9020046c588", 33, 2, True)


def test_iblinkinfo_line_mode_and_ibnetdiscover_ports():
    m = parse(LINKINFO_LINE)
    assert m.stats.links == 2 and m.stats.unparsable_lines == 0
    assert m.peer(1, "0x0000000000100006") == End("hxa-su1-leaf-r1", "0x0000000000200002", 2, 4, False)
    assert m.peer(1, names=["hxa-gpu01 mlx5_0"]).port == 1
    p = parse(PORTS)
    assert p.stats.links == 3
    assert p.peer(1, "0x0002c90300293e1f") == IP211_PEER
    assert p.peer(1, "0x0002c903000d7aad").port == 33


def test_ibstat_ports_get_their_peer_by_port_guid(tmp_path):
    f = tmp_path / "ibstat.txt"
    f.write_text(IBSTAT_IP211)
    peers_file = tmp_path / "linkinfo.txt"
    peers_file.write_text(LINKINFO)
    src = IbstatSource(str(f), host="ip-211", clock=lambda: T0, peers=PeerFile(str(peers_file)))
    recs = {r.port: r for r in src.poll()}
    r = recs[1]
    assert (r.peer, r.peer_guid, r.peer_port, r.peer_lid) == (SWITCH, "0x0002c9020046c588", 1, 2)
    assert recs[2].peer is None  # port 2 is not cabled
    assert src.summary()["peers.links"] == 7 and src.summary()["dropped.peers_unparsable_line"] == 0
    out = Decoder().decode(encode(list(recs.values())), "x")
    assert out.dead == [] and out.records[0].peer_port == 1


def test_ib_sysfs_ports_get_their_peer_by_gid_or_node_desc(tmp_path):
    p = port_dir(tmp_path, "mlx4_0", rate="40 Gb/sec (4X QDR)")
    write(p / "gids" / "0", "fe80:0000:0000:0000:0002:c903:0029:3e1f\n")
    q = port_dir(tmp_path, "mlx5_0", pci=("0000:40:01.0", "0000:41:00.0"))  # no GID: found by its name
    write(q.parent.parent / "node_desc", "ip-212 mlx4_0\n")
    port_dir(tmp_path, "mlx5_1", pci=("0000:50:01.0", "0000:51:00.0"))  # in no link of the file
    peers_file = tmp_path / "topology.txt"
    peers_file.write_text(TOPOLOGY)
    src = IbSysfsSource(str(tmp_path / "root-is-here" / ".."), host="ip-211", clock=lambda: T0,
                        peers=PeerFile(str(peers_file)))
    recs = {r.device: r for r in src.poll()}
    assert (recs["mlx4_0"].peer, recs["mlx4_0"].peer_port, recs["mlx4_0"].peer_lid) == (SWITCH, 1, 2)
    assert recs["mlx5_0"].peer_port == 14 and recs["mlx5_0"].peer_guid == "0x0002c9020046c588"
    assert recs["mlx5_1"].peer is None
    assert {k: v for k, v in src.summary().items() if k.startswith("dropped.") and v} == {}


def test_a_peers_file_that_changes_is_read_again_and_one_that_is_missing_labels_nothing(tmp_path):
    f = tmp_path / "peers.txt"
    f.write_text(LINKINFO)
    pf = PeerFile(str(f))
    assert pf.current().peer(1, names=["ip-211 mlx4_0"]).port == 1
    f.write_text(LINKINFO.replace("2    1[  ] \"Infiniscale", "2    9[  ] \"Infiniscale").replace(
        "           2    1[  ] ==( 4X", "           2    9[  ] ==( 4X"))
    st_ = os.stat(f)
    os.utime(f, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    assert pf.current().peer(1, names=["ip-211 mlx4_0"]).port == 9
    gone = PeerFile(str(tmp_path / "absent.txt"))
    assert gone.current().peer(1, names=["ip-211 mlx4_0"]) is None and gone.summary()["peers.links"] == 0


def test_a_file_past_its_bound_is_read_that_far_and_counted(tmp_path):
    f = tmp_path / "peers.txt"
    f.write_text(LINKINFO * 2)
    pf = PeerFile(str(f), max_chars=len(LINKINFO))
    assert pf.summary()["dropped.peers_truncated"] == 1 and pf.summary()["peers.links"] == 7


@pytest.mark.parametrize("line, reason", [
    ('      0x0002c903000d7aad      5    1[  ] ==( 4X 10.0 Gbps Active/  LinkUp)==>  garbage', "unparsable_lines"),
    ("[1](zz)  \"S-0002c9020046c588\"[33]  # lid 5 lmc 0 \"sw\" lid 2 4xQDR", "unparsable_lines"),
    ('      0x0002c903000d7aad      5  999[  ] ==( 4X 10.0 Gbps Active/  LinkUp)==>  2   33[  ] "sw" ( )', "bad_values"),
    ('      0x0002c903000d7aad      5    1[  ] ==( 4X 10.0 Gbps Active/  LinkUp)==>  2   33[  ] "' + "s" * 65 + '" ( )',
     "bad_values"),
    ('      0x0002c903000d7aad  99999    1[  ] ==( 4X 10.0 Gbps Active/  LinkUp)==>  2   33[  ] "sw" ( )', "bad_values"),
    ("CA     5  1 0x0002c903000d7aad 4x QDR - SW   2 x", "unparsable_lines"),
    ("x" * (MAX_LINE + 1), "unparsable_lines"),
])
def test_hostile_lines_are_counted_by_reason(line, reason):
    m = parse("CA: n1 mlx5_0:\n" + line + "\n")
    assert m.stats.links == 0 and getattr(m.stats, reason) == 1, m.stats


def test_a_port_line_outside_any_node_is_counted():
    m = parse('      0x0002c903000d7aad      5    1[  ] ==( 4X 10.0 Gbps Active/  LinkUp)==>  2   33[  ] "sw" ( )\n'
              '[33]    "H-0002c903000d7aac"[1](2c903000d7aad)      # "ip-160 HCA-1" lid 5 4xQDR\n')
    assert m.stats == PeerStats(unparsable_lines=2)


_PIECES = [*LINKINFO.splitlines(), *TOPOLOGY.splitlines(), *LINKINFO_LINE.splitlines(), *PORTS.splitlines()]


@settings(max_examples=fuzz_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=200),
                          st.sampled_from(_PIECES).flatmap(lambda s: st.integers(0, len(s)).map(lambda i: s[:i]))),
                max_size=40))
def test_any_text_parses_to_bounded_valid_links_without_an_exception(lines):
    m = parse("\n".join(lines))
    for by_guid, index in ((True, m.by_guid), (False, m.by_name)):
        for (key, port), end in index.items():
            assert 0 <= port <= 255 and 0 <= end.port <= 255
            assert 0 < len(end.desc) <= 64 and end.desc.isprintable()
            assert end.guid is None or (len(end.guid) == 18 and end.guid.startswith("0x"))
            assert end.lid is None or 0 <= end.lid <= 0xFFFF
            labels = m.labels(port, key) if by_guid else m.labels(port, names=[key])
            assert labels["peer"] == end.desc and labels["peer_port"] == end.port
            # Whatever a file held, the record it labels passes the decoder's checks.
            rec = NicRecord(ts=T0, host="n1", device="mlx5_0", port=1, **labels)
            assert Decoder().decode(encode([rec]), "x").dead == []


def test_a_large_fabric_parses_in_bounded_time():
    sw = "".join(f'           2 {i % 250 + 1:4d}[  ] ==( 4X 53.125 Gbps Active/  LinkUp)==>  {i + 10:6d}    1[  ] '
                 f'"gpu-{i:05d} mlx5_0" ( )\n' for i in range(20_000))
    t = time.perf_counter()
    m = parse("Switch: 0x0002c9020046c588 leaf01:\n" + sw)
    assert m.stats.links == 20_000 and m.peer(1, names=["gpu-00042 mlx5_0"]).port == 43
    assert time.perf_counter() - t < 30  # a hang guard, not a speed claim
