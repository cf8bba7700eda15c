"""``--peers`` against layouts the real tools print that ``test_producer_ibpeers.py`` does not hold:
nodes that share a node description (SHARP Aggregation Nodes), ``ibnetdiscover -p``'s line for a
port with no link, the switch header of iblinkinfo before 2011, and descriptions with quotes.

Sources: rdma-core ``infiniband-diags/iblinkinfo.c`` and ``ibnetdiscover.c`` @ 691953d8 (and
``ibdiags/src/iblinkinfo.c`` before 12748135 for the old header); a public capture of
``ibswitches``, ``ibhosts`` and ``iblinkinfo -S`` on a Quantum fabric with two Aggregation Nodes
(the search index's file 41237316056).
"""

from __future__ import annotations

from producers.ibpeers import End, PeerStats, parse

AN = "Mellanox Technologies Aggregation Node"
QUANTUM = "Quantum Mellanox Technologies"
MQM = "MF0;d32-03-1:MQM8700/U1"

# The Quantum switch's lines are the capture's (ports 21, 40, 41); the rest is shaped by
# print_node_header / print_port with the GUIDs and LIDs ibswitches / ibhosts printed (port GUIDs
# taken as the node GUIDs; the MQM8700's Aggregation Node's LID, 24, is made up).
AGGREGATION_NODES = f"""CA: {AN}:
      0x08c0eb0300add056     23    1[  ] ==( 4X        53.125 Gbps Active/  LinkUp)==>      10   41[  ] "{QUANTUM}" ( )
CA: {AN}:
      0x08c0eb0300f6fc2e     24    1[  ] ==( 4X        53.125 Gbps Active/  LinkUp)==>       4   41[  ] "{MQM}" ( )
CA: node3 HCA-2:
      0xe8ebd303003a3a60     40    1[  ] ==( 4X      25.78125 Gbps Active/  LinkUp)==>      10   21[  ] "{QUANTUM}" ( Could be 53.125 Gbps)
Switch: 0x08c0eb0300f6fc26 {MQM}:
           4   40[  ] ==( 4X        53.125 Gbps Active/  LinkUp)==>      10   40[  ] "{QUANTUM}" ( )
           4   41[  ] ==( 4X        53.125 Gbps Active/  LinkUp)==>      24    1[  ] "{AN}" ( )
Switch: 0x08c0eb0300add04e {QUANTUM}:
          10    1[  ] ==(                Down/ Polling)==>             [  ] "" ( )
          10   21[  ] ==( 4X      25.78125 Gbps Active/  LinkUp)==>      40    1[  ] "node3 HCA-2" ( Could be 53.125 Gbps)
          10   40[  ] ==( 4X        53.125 Gbps Active/  LinkUp)==>       4   40[  ] "{MQM}" ( )
          10   41[  ] ==( 4X        53.125 Gbps Active/  LinkUp)==>      23    1[  ] "{AN}" ( )
"""


def test_nodes_sharing_a_description_keep_their_own_switch_ports_by_guid():
    m = parse(AGGREGATION_NODES)
    assert m.stats == PeerStats(links=8)
    # Each Aggregation Node is found by its port GUID at its own switch's port 41, whatever order
    # the switches' blocks come in.
    assert m.peer(1, "0x08c0eb0300add056") == End(QUANTUM, "0x08c0eb0300add04e", 41, 10, True)
    assert m.peer(1, "0x08c0eb0300f6fc2e") == End(MQM, "0x08c0eb0300f6fc26", 41, 4, True)
    assert m.peer(1, names=["node3 HCA-2"]) == End(QUANTUM, "0x08c0eb0300add04e", 21, 10, True)
    assert m.peer(41, names=[QUANTUM]) == End(AN, "0x08c0eb0300add056", 1, 23, False)


def test_a_description_two_nodes_share_names_no_peer():
    m = parse(AGGREGATION_NODES)
    assert m.peer(1, names=[AN]) is None  # either switch would be a guess
    assert m.labels(1, names=[AN]) == {}
    assert m.peer(1, names=["node3 HCA-2"]).port == 21


def test_ibnetdiscover_ports_report_port_without_a_link_is_no_drop():
    # dump_ports_report: "%2s %5d %2d 0x%016" PRIx64 " %s %s", then "%36s'%s'\n" with no remote port.
    text = (
        "SW     2 36 0x0002c9020046c588 4x QDR - CA     3  1 0x0002c903000cc89b"
        " ( 'Infiniscale-IV Mellanox Technologies' - 'ip-210 mlx4_0' )\n"
        "SW     2 35 0x0002c9020046c588 4x SDR" + " " * 36 + "'Infiniscale-IV Mellanox Technologies'\n"
        "CA     0  2 0x0002c90300293e20 4x SDR" + " " * 36 + "'ip-211 mlx4_0'\n"
    )
    m = parse(text)
    assert m.stats == PeerStats(links=1)
    assert m.peer(1, "0x0002c903000cc89b").port == 36


def test_iblinkinfo_switch_header_before_2011_has_no_colon():
    # print_switch_header: "%sSwitch 0x%016" PRIx64 " %s:\n" and a "(%3s %9s %6s/%8s)" link.
    text = """Switch 0x0002c9020046c588 Infiniscale-IV Mellanox Technologies:
           2    1[  ] ==( 4X 10.0 Gbps Active/  LinkUp)==>       6    1[  ] "ip-211 mlx4_0" ( )
           2    2[  ] ==(                Down/ Polling)==>             [  ] "" ( )
"""
    m = parse(text)
    assert m.stats == PeerStats(links=1)
    assert m.peer(1, names=["ip-211 mlx4_0"]) == End(
        "Infiniscale-IV Mellanox Technologies", "0x0002c9020046c588", 1, 2, True
    )


def test_iblinkinfo_descriptions_are_printed_with_their_quotes():
    # print_port: "\"%s\"" and "\"%30s\"" print a node description as it is, quotes unescaped.
    text = """CA: gpu01 "rack 3" mlx5_0:
      0x0002c903000d7aad      5    1[  ] ==( 4X        106.25 Gbps Active/  LinkUp)==>       2   33[  ] "leaf "A" 7" ( )
0x0002c9020046c588 "                    leaf "A" 7"      2    9[  ] ==( 2X        106.25 Gbps Active/  LinkUp)==>  0x0002c903000d7ab1      7    1[  ] "gpu02 "rack 3" mlx5_0" ( )
"""
    m = parse(text)
    assert m.stats == PeerStats(links=2)
    assert m.peer(1, "0x0002c903000d7aad") == End('leaf "A" 7', None, 33, 2, False)
    assert m.peer(1, "0x0002c903000d7ab1") == End('leaf "A" 7', "0x0002c9020046c588", 9, 2, False)
    assert m.peer(9, names=['leaf "A" 7']).desc == 'gpu02 "rack 3" mlx5_0'
