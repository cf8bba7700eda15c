"""sysfs layouts the kernel really writes that the first fixtures lacked: ``hw_counters/lifespan`` (a
setting, not a counter), ``counters_ext`` (the 64-bit counters of older kernels and MLNX_OFED),
and ``N/A (no PMA)`` (older kernels' counter that does not read)."""

from __future__ import annotations

from pathlib import Path

from producers.ib_sysfs import IbSysfsSource
from tests.factories import T0
from tests.unit.producers.factories import ABSENT, HW_COUNTERS, port_dir, write


def poll(root: Path):
    src = IbSysfsSource(str(root), host="n1", clock=lambda: T0)
    recs = {(r.device, r.port): r for r in src.poll()}
    return recs, {k: v for k, v in src.summary().items() if k.startswith("dropped.") and v}


def test_hw_counters_lifespan_is_no_counter(tmp_path):
    # lifespan is the stats cache period in ms, mode 0644 (drivers/infiniband/core/sysfs.c
    # setup_hw_port_stats/show_stats_lifespan); gpud's capture has it at 12 beside the counters.
    port_dir(tmp_path, "mlx5_0", counters=ABSENT)
    recs, drops = poll(tmp_path)
    assert recs[("mlx5_0", 1)].counters == {k: v for k, v in HW_COUNTERS.items() if k != "lifespan"}
    assert drops == {}


def test_counters_ext_of_older_drivers_are_read(tmp_path):
    # The names of prometheus/procfs sysfs/class_infiniband.go @ 3c943fdb (counters_ext, "pre-kernel-v4.5
    # 64-bit counters"); counters/port_xmit_data is 32 bits there and stops at 2^32-1.
    p = port_dir(tmp_path, "mlx4_0", rate="40 Gb/sec (4X QDR)", hw_counters=ABSENT,
                 counters={"port_xmit_data": 4294967295, "port_rcv_data": 4294967295, "link_downed": 0})
    ext = {"port_xmit_data_64": 26509113295, "port_rcv_data_64": 2221223609, "port_xmit_packets_64": 85734114,
           "port_rcv_packets_64": 87169372, "port_unicast_xmit_packets": 85734114,
           "port_unicast_rcv_packets": 87169372, "port_multicast_xmit_packets": 0, "port_multicast_rcv_packets": 0}
    for k, v in ext.items():
        write(p / "counters_ext" / k, f"{v}\n")
    recs, drops = poll(tmp_path)
    c = recs[("mlx4_0", 1)].counters
    assert c == {"port_xmit_data": 4294967295, "port_rcv_data": 4294967295, "link_downed": 0, **ext}
    assert drops == {}


def test_no_pma_counters_are_unreadable_not_bad_values(tmp_path):
    # An i40iw port on an older kernel: every counters/* reads "N/A (no PMA)" (show_pma_counter's
    # sprintf, prometheus/node_exporter#966); newer kernels fail the read with EINVAL instead.
    names = ["excessive_buffer_overrun_errors", "link_downed", "link_error_recovery", "port_rcv_data"]
    port_dir(tmp_path, "i40iw0", link_layer="Ethernet", hw_counters=ABSENT,
             counters=dict.fromkeys(names, "N/A (no PMA)"))
    recs, drops = poll(tmp_path)
    assert recs[("i40iw0", 1)].counters == {} and recs[("i40iw0", 1)].state_name == "ACTIVE"
    assert drops == {"dropped.unreadable": 4}
