"""The ibstat/ibstatus producer (#34): each port either tool prints as a ``NicRecord``, in every
layout they print, and hostile input counted by reason.

Fixtures are excerpts of leptonai/gpud's captures, unchanged but cut to a few CAs:
``pkg/nvidia-query/infiniband/testdata/ibstat.47.0.h100.some.down.0`` @ 4446606e (an H100 node:
InfiniBand ports Active at 400, Ethernet ports Down/Disabled at 40, tabs),
``.../ibstat.47.0.h100.some.down.with.polling.1`` @ c547ffed (a RoCE node, one port
Down/Polling), ``.../ibstat.39.0.a100.failed.ibpanic.exit-255.0`` @ c9874d34 (an A100 node,
indentation as spaces, ending in an ``ibpanic`` line) and ``.../ibstatus.39.0.a100.all.active.0``
@ c9874d34. The layouts gpud has no capture of (one port alone, a switch, ``Rate: 2.5``,
``(FDR10)``, ``Effective speed``) are written from the format strings of rdma-core
``infiniband-diags/ibstat.c`` @ 691953d8.
"""

from __future__ import annotations

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.ibstat import IbstatSource, IbstatStats, parse
from tests.factories import T0
from tests.unit.producers.ibstat_factories import A100_IBPANIC, H100_SOME_DOWN, IBSTATUS, ROCE_POLLING


def ports(text: str, **kw):
    stats = IbstatStats()
    recs = parse(text, ts=T0, host="n1", stats=stats, **kw)
    return [(r.device, r.port, r.state, r.state_name, r.phys_state, r.phys_state_name, r.rate_gbps, r.link_layer)
            for r in recs], stats, recs


def test_ibstat_with_ports_down_and_disabled():
    got, stats, recs = ports(H100_SOME_DOWN)
    assert got == [("mlx5_2", 1, 1, "DOWN", 3, "Disabled", 40.0, "Ethernet"),
                   ("mlx5_3", 1, 4, "ACTIVE", 5, "LinkUp", 400.0, "InfiniBand")]
    assert (stats.cas, stats.ports, stats.unparsable_values) == (2, 2, 0)
    assert all(r.counters == {} and r.host == "n1" and r.ts == T0 for r in recs)
    assert Decoder().decode(encode(recs), "x").dead == []


def test_ibstat_roce_port_polling():
    got, _, _ = ports(ROCE_POLLING)
    assert got == [("mlx5_10", 1, 4, "ACTIVE", 5, "LinkUp", 400.0, "Ethernet"),
                   ("mlx5_11", 1, 1, "DOWN", 2, "Polling", 40.0, "Ethernet")]


def test_ibstat_indented_with_spaces_and_its_ibpanic_counted():
    got, stats, _ = ports(A100_IBPANIC)
    assert got == [("mlx5_7", 1, 4, "ACTIVE", 5, "LinkUp", 200.0, "InfiniBand")]
    assert stats.tool_errors == 1


def test_ibstatus():
    got, stats, _ = ports(IBSTATUS)
    assert got == [("mlx5_0", 1, 4, "ACTIVE", 5, "LinkUp", 200.0, "InfiniBand"),
                   ("mlx5_8", 1, 4, "ACTIVE", 5, "LinkUp", 40.0, "Ethernet")]
    assert stats.unparsable_values == 0


def test_layouts_from_ibstat_c():
    # Two ports of one CA, 1X SDR's "2.5", FDR10's suffix, the "Effective speed" line, a switch,
    # and the states the tool names: Initializing, Armed, LinkErrorRecovery, PhyTest, ???.
    text = ("CA 'mlx4_0'\n\tCA type: MT4099\n\tNumber of ports: 2\n"
            "\tPort 1:\n\t\tState: Initializing\n\t\tPhysical state: LinkErrorRecovery\n\t\tRate: 2.5\n"
            "\t\tLink layer: InfiniBand\n"
            "\tPort 2:\n\t\tState: Armed\n\t\tPhysical state: PhyTest\n\t\tRate: 40 (FDR10)\n"
            "\t\tEffective speed: 40\n\t\tLink layer: InfiniBand\n"
            "Switch 'sw0'\n\tSwitch type: MT54000\n\tPort 0:\n\t\tState: ???\n\t\tPhysical state: ???\n"
            "\t\tRate: 100\n\t\tLink layer: InfiniBand\n")
    got, stats, _ = ports(text)
    assert got == [("mlx4_0", 1, 2, "INIT", 6, "LinkErrorRecovery", 2.5, "InfiniBand"),
                   ("mlx4_0", 2, 3, "ARMED", 7, "Phy Test", 40.0, "InfiniBand"),
                   ("sw0", 0, None, None, None, None, 100.0, "InfiniBand")]
    assert stats.unparsable_values == 0


def test_one_port_alone_needs_its_device():
    # A copy cut below its "CA: 'name'" line (ibstat prints one: test_producer_ibstat_real.py).
    alone = "Port 1:\nState: Active\nPhysical state: LinkUp\nRate: 400\nLink layer: InfiniBand\n"
    got, stats, _ = ports(alone)
    assert got == [] and stats.no_device == 1
    got, stats, _ = ports(alone, device="mlx5_0")
    assert got == [("mlx5_0", 1, 4, "ACTIVE", 5, "LinkUp", 400.0, "InfiniBand")] and stats.no_device == 0


@pytest.mark.parametrize("line", ["\t\tRate: ²", "\t\tRate: 1e999", "\t\tState: Sleepy", "\t\tPhysical state: ٣: LinkUp",
                                  "\t\tLink layer: Infini\x1bBand"])
def test_a_garbage_value_costs_only_itself(line):
    text = H100_SOME_DOWN.replace("\t\tBase lid: 143\n", line + "\n")
    got, stats, recs = ports(text)
    assert len(got) == 2 and stats.unparsable_values == 1
    assert Decoder().decode(encode(recs), "x").dead == []


@pytest.mark.parametrize("header", ["CA 'mlx5 3'", "CA 'mlx5_\x003'", "\tPort ١:", "\tPort 99999999:", "\tPort 70000:"])
def test_a_garbage_header_drops_its_ports_and_says_so(header):
    text = H100_SOME_DOWN.replace("CA 'mlx5_3'" if header.startswith("CA") else "\tPort 1:\n\t\tState: Active",
                                  header if header.startswith("CA") else header + "\n\t\tState: Active")
    got, stats, _ = ports(text)
    assert [g[0] for g in got] == ["mlx5_2"]
    assert stats.unparsable_lines + stats.no_device == 1


def test_binary_junk_is_no_port():
    got, stats, _ = ports("\x00\xff garbage\n" * 1000 + "Port : \n State: Active\n")
    assert got == [] and stats.ports == 0


def test_a_huge_file_is_read_up_to_the_bound(tmp_path):
    f = tmp_path / "ibstat.txt"
    f.write_text(H100_SOME_DOWN + "\t\tx: y\n" * 200_000)
    src = IbstatSource(str(f), host="n1", max_chars=len(H100_SOME_DOWN) + 100, clock=lambda: T0)
    assert len(src.poll()) == 2 and src.done
    assert src.summary()["dropped.truncated"] == 1


def test_cli_reads_a_saved_ibstat_and_exits_3_on_an_ibpanic(tmp_path, capsys):
    from pipeline.cli import main

    good, bad, out = tmp_path / "good.txt", tmp_path / "bad.txt", tmp_path / "o.jsonl"
    good.write_text(H100_SOME_DOWN)
    bad.write_text(A100_IBPANIC)
    assert main(["produce", "ibstat", "--file", str(good), "--out", str(out), "--host", "n7"]) == 0
    got = Decoder().decode_many(out.read_bytes().splitlines(), ["a", "b"])
    assert got.dead == [] and [(r.host, r.device, r.state_name) for r in got.records] == [
        ("n7", "mlx5_2", "DOWN"), ("n7", "mlx5_3", "ACTIVE")]
    capsys.readouterr()
    assert main(["produce", "ibstat", "--file", str(bad), "--out", str(tmp_path / "o2.jsonl")]) == 3
    assert "dropped.tool_error 1" in capsys.readouterr().err
