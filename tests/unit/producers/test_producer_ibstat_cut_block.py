"""An ``ibstat``/``ibstatus`` capture cut at a line's end inside its last port block, and a
``Port GUID:`` line without a value.

``ibstat`` prints every port block through its ``Link layer:`` line (rdma-core
``infiniband-diags/ibstat.c``, ``port_dump``) and ``ibstatus`` ends each with ``link_layer:``
(``scripts/ibstatus``): a last block without it is a capture still being written or truncated.
Before the fix it was read as a whole port with values missing and the producer exited 0; now the
port is not sent, counted as ``dropped.cut_port`` and warned about, and the producer exits 3 (lost
input). A tool error after the last block, a CA without ports and a link layer line whose value is
empty or ``unknown`` are no cut. Before its fix an empty ``Port GUID:`` was read as a port header
with no number: counted as ``dropped.unparsable_line`` (exit 3) and the rest of its port (the link
layer) not read.
"""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from producers.ibstat import IbstatSource, IbstatStats, parse
from tests.factories import T0
from tests.unit.producers.ibstat_factories import A100_IBPANIC, H100_SOME_DOWN, IBSTATUS, ONE_PORT, ROCE_POLLING

CUT_PORT = "dropped.cut_port"  # spelled out: the name the exit summary and the LOST line print
IBPANIC = A100_IBPANIC.splitlines(keepends=True)[-1]
IBWARN = "ibwarn: [1400444] main: stat of IB device 'mlx5_8' failed\n"


def ports(text: str, **kw) -> tuple[list[tuple], IbstatStats]:
    stats = IbstatStats()
    recs = parse(text, ts=T0, host="n1", stats=stats, **kw)
    return [(r.device, r.port, r.state_name, r.rate_gbps, r.link_layer, r.port_guid) for r in recs], stats


def cuts_in_last_block(text: str, header: str) -> list[str]:
    """``text`` cut at each line's end from its last port block's header to before its link layer."""
    start = text.rindex(header)
    end = text.lower().rindex("link")
    return [text[: i + 1] for i in range(start, end) if text[i] == "\n"]


MLX5_2 = ("mlx5_2", 1, "DOWN", 40.0, "Ethernet", "0x966daefffec2b691")
MLX5_3 = ("mlx5_3", 1, "ACTIVE", 400.0, "InfiniBand", "0x946dae0300cde728")


def produce(tmp_path, capsys, text: str) -> tuple[int, list[dict], list[str]]:
    f, out = tmp_path / "ibstat.txt", tmp_path / "o.jsonl"
    f.write_text(text)
    rc = main(["produce", "ibstat", "--file", str(f), "--out", str(out), "--host", "n1"])
    recs = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    return rc, recs, capsys.readouterr().err.strip().splitlines()


# ---- a last port block cut before its link layer line


@pytest.mark.parametrize("text", cuts_in_last_block(H100_SOME_DOWN, "\tPort 1:"))
def test_an_ibstat_cut_at_a_line_end_in_its_last_port_is_that_port_dropped(text):
    # Before: mlx5_3 sent without the values after the cut (ending after "Rate: 400": no link
    # layer, no port GUID), nothing counted.
    got, stats = ports(text)
    assert got == [MLX5_2]
    assert (stats.cut_ports, stats.ports, stats.cut_port) == (1, 2, "mlx5_3 port 1")
    assert (stats.unparsable_lines, stats.unparsable_values, stats.no_device) == (0, 0, 0)


@pytest.mark.parametrize("text", cuts_in_last_block(IBSTATUS, "Infiniband device 'mlx5_8'"))
def test_an_ibstatus_cut_before_its_last_link_layer_is_that_port_dropped(text):
    got, stats = ports(text)
    assert [g[0] for g in got] == ["mlx5_0"] and (stats.cut_ports, stats.cut_port) == (1, "mlx5_8 port 1")


@pytest.mark.parametrize("text", cuts_in_last_block(ONE_PORT, "Port 1:"))
def test_ibstat_of_one_port_cut_is_that_port_dropped(text):
    got, stats = ports(text)
    assert got == [] and stats.cut_ports == 1


def test_a_cut_port_given_no_ca_is_counted_as_cut():
    got, stats = ports("Port 1:\nState: Active\nPhysical state: LinkUp\nRate: 400\n")
    assert got == [] and (stats.cut_ports, stats.no_device, stats.cut_port) == (1, 0, "(no CA) port 1")


def test_a_later_capture_cut_leaves_the_earlier_whole_block_of_its_port():
    # Two captures appended ("ibstat >> f"), the second still being written: its mlx5_3 is not
    # sent as a port with values missing; the whole block the first capture printed stands.
    text = H100_SOME_DOWN + H100_SOME_DOWN.replace("State: Active", "State: Down")
    got, stats = ports(text[: text.rindex("\t\tBase lid: 143\n")])
    assert got == [MLX5_3, MLX5_2]  # each port where its last block read is
    assert (stats.cut_ports, stats.duplicate_ports, stats.ports) == (1, 1, 4)


def test_only_the_last_port_block_is_judged_cut():
    # A damaged block before another is not a cut of the capture (the next header ended it).
    text = H100_SOME_DOWN.replace("\t\tLink layer: Ethernet\n", "")
    got, stats = ports(text)
    assert got == [MLX5_2[:4] + (None, MLX5_2[5]), MLX5_3] and stats.cut_ports == 0


# ---- what is no cut


@pytest.mark.parametrize("fixture", [H100_SOME_DOWN, ROCE_POLLING, A100_IBPANIC, IBSTATUS, ONE_PORT])
def test_whole_captures_have_no_cut(fixture):
    got, stats = ports(fixture)
    assert got and stats.cut_ports == 0
    got, stats = ports(fixture.rstrip("\n") + "\n\n\n")
    assert got and stats.cut_ports == 0


@pytest.mark.parametrize("error", [IBPANIC, IBWARN])
def test_a_tool_error_after_the_last_block_is_no_cut(error):
    # The tool's error, not a cut, ended the block: counted as the tool error it is.
    text = H100_SOME_DOWN[: H100_SOME_DOWN.rindex("\t\tBase lid: 143\n")] + error
    got, stats = ports(text)
    assert [g[:4] for g in got] == [MLX5_2[:4], MLX5_3[:4]]
    assert (stats.cut_ports, stats.tool_errors) == (0, 1)


def test_a_ca_without_ports_at_the_end_is_no_cut():
    got, stats = ports(H100_SOME_DOWN + "CA 'mlx5_4'\n\tCA type: MT4129\n\tNumber of ports: 0\n")
    assert got == [MLX5_2, MLX5_3] and (stats.cut_ports, stats.cas) == (0, 3)


@pytest.mark.parametrize("value", ["unknown", "", " \t"])
def test_an_ibstatus_link_layer_with_no_value_read_ends_the_block(value):
    # ibstatus prints "link_layer: unknown" (or nothing) when it cannot read the sysfs file.
    text = IBSTATUS.replace("link_layer:      Ethernet", "link_layer:" + value)
    got, stats = ports(text)
    assert [g[0] for g in got] == ["mlx5_0", "mlx5_8"] and stats.cut_ports == 0


def test_a_garbled_link_layer_value_ends_the_block():
    got, stats = ports(H100_SOME_DOWN.replace("Link layer: InfiniBand", "Link layer: Infini\x1bBand"))
    assert len(got) == 2 and (stats.cut_ports, stats.unparsable_values) == (0, 1)


# ---- through the source and the CLI


def test_the_cli_exits_3_and_names_the_cut_port(tmp_path, capsys, caplog):
    # Before: exit 0, mlx5_3 sent without its link layer and port GUID.
    rc, recs, err = produce(tmp_path, capsys, H100_SOME_DOWN[: H100_SOME_DOWN.rindex("\t\tBase lid: 143\n")])
    assert rc == 3
    assert [(r["device"], r["link_layer"]) for r in recs] == [("mlx5_2", "Ethernet")]
    assert err[-1] == f"gpuwarden produce ibstat: LOST input: {CUT_PORT} 1 (exit 3)"
    assert "the last port block (mlx5_3 port 1) ends before its link layer line" in caplog.text
    assert "the capture was cut" in caplog.text and CUT_PORT in caplog.text


def test_the_cli_reads_a_whole_capture_as_before(tmp_path, capsys, caplog):
    rc, recs, err = produce(tmp_path, capsys, H100_SOME_DOWN)
    assert rc == 0, err
    assert [r["device"] for r in recs] == ["mlx5_2", "mlx5_3"] and CUT_PORT not in caplog.text


def test_a_cut_last_line_stays_one_count_and_its_port_is_kept(tmp_path):
    # A last line without its newline is the cut already counted (dropped.cut_last_line): the
    # port keeps the values read whole, as test_producer_cut_lines.py has it, and is not
    # counted a second time.
    f = tmp_path / "ibstat.txt"
    f.write_text(H100_SOME_DOWN[: H100_SOME_DOWN.rindex("00\n\t\tBase lid: 143")])
    src = IbstatSource(str(f), host="n1", clock=lambda: T0)
    assert [(r.device, r.rate_gbps) for r in src.poll()] == [("mlx5_2", 40.0), ("mlx5_3", None)]
    summary = src.summary()
    assert (summary["dropped.cut_last_line"], summary[CUT_PORT]) == (1, 0)


# ---- a Port GUID line without a value


@pytest.mark.parametrize("line", ["\t\tPort GUID: \n", "\t\tPort GUID:\n", "Port GUID:\n", "    Port GUID:  \r\n"])
def test_an_empty_port_guid_is_a_port_without_a_guid(line):
    # Before: read as a port header with no number (dropped.unparsable_line), the link layer after
    # it not read.
    got, stats = ports(H100_SOME_DOWN.replace("\t\tPort GUID: 0x946dae0300cde728\n", line))
    assert got == [MLX5_2, MLX5_3[:5] + (None,)]
    assert (stats.unparsable_lines, stats.unparsable_values, stats.cut_ports) == (0, 0, 0)


def test_the_cli_reads_an_empty_port_guid_with_exit_0(tmp_path, capsys):
    rc, recs, err = produce(
        tmp_path, capsys, H100_SOME_DOWN.replace("Port GUID: 0x946dae0300cde728\n", "Port GUID: \n")
    )
    assert rc == 0, err
    assert [(r["device"], r["port_guid"], r["link_layer"]) for r in recs] == [
        ("mlx5_2", "0x966daefffec2b691", "Ethernet"),
        ("mlx5_3", None, "InfiniBand"),
    ]


def test_a_build_that_prints_no_link_layer_at_all_is_not_cut():
    # infiniband-diags before rdma-core printed "Link layer:" only where built with
    # HAVE_UMAD_PORT_LINK_LAYER: a capture of several ports none of which has one is whole.
    old = "".join(
        f"CA 'mlx5_{i}'\n\tCA type: MT4123\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 200\n"
        for i in range(2)
    )
    st = IbstatStats()
    recs = parse(old, ts=1764403200.0, host="n1", stats=st)
    assert [r.device for r in recs] == ["mlx5_0", "mlx5_1"] and st.cut_ports == 0
