"""``ibstat``/``ibstatus`` layouts the tools really print that the first fixtures lacked: the one-port
header ``CA: 'mlx5_0'``, and the tool's own error lines (rdma-core ``infiniband-diags/ibstat.c``,
``libibmad/mad.h``'s ``IBWARN``/``IBPANIC`` and ``infiniband-diags/scripts/ibstatus``, all @ 691953d8).
"""

from __future__ import annotations

from producers.ibstat import IbstatStats, parse
from tests.factories import T0
from tests.unit.producers.ibstat_factories import H100_SOME_DOWN, ONE_PORT


def ports(text: str, **kw):
    stats = IbstatStats()
    recs = parse(text, ts=T0, host="n1", stats=stats, **kw)
    return [(r.device, r.port, r.state_name, r.phys_state_name, r.rate_gbps, r.link_layer) for r in recs], stats


def test_ibstat_of_one_port_names_its_ca():
    got, stats = ports(ONE_PORT)
    assert got == [("mlx5_3", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")]
    assert (stats.cas, stats.no_device, stats.unparsable_lines) == (1, 0, 0)
    got, _ = ports(ONE_PORT.replace("CA: 'mlx5_3'", "Switch: 'sw0'").replace("Port 1:", "Port 0:"))
    assert got == [("sw0", 0, "ACTIVE", "LinkUp", 400.0, "InfiniBand")]


def test_ibwarn_of_a_device_or_port_that_failed_is_a_tool_error():
    # rdma-core v54 on (commit 703b52c6): IBWARN("stat of IB device '%s' failed") and the next CA;
    # IBWARN("%s: '%s' has no port number %d - max (%d)") from ca_stat for `ibstat CA PORT`.
    text = H100_SOME_DOWN.replace("CA 'mlx5_3'", "ibwarn: [1400444] main: stat of IB device 'mlx5_8' failed\nCA 'mlx5_3'")
    got, stats = ports(text)
    assert [g[0] for g in got] == ["mlx5_2", "mlx5_3"] and stats.tool_errors == 1
    got, stats = ports("ibwarn: [2211] ca_stat: CA: 'mlx5_0' has no port number 2 - max (1)\n"
                       "ibwarn: [2211] main: stat of IB device 'mlx5_0' failed\n")
    assert got == [] and stats.tool_errors == 2


def test_ibstatus_fatal_error_is_a_tool_error():
    # ibstatus's fatal(): echo "Fatal error: " $* -> two spaces, then it exits.
    got, stats = ports("Fatal error:  device 'mlx5_9': sys files not found (/sys/class/infiniband/mlx5_9/ports)\n")
    assert got == [] and stats.tool_errors == 1
