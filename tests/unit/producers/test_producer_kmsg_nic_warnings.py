"""Non-fatal NIC driver events in the kernel log: transmit timeouts and mlx5's insufficient PCIe
slot power, counted per host as ``nic_driver_warnings`` (catalogue field 9518) and alerted on by
``network_nic_driver_warning`` (rules/kernel_log.yaml).

Every line below is built from a format string of the kernel (torvalds/linux), read in the
public mirrors and patches of the code corpus:

- ``net/sched/sch_generic.c``, ``dev_watchdog()``: ``WARN_ONCE(1, "NETDEV WATCHDOG: %s (%s):
  transmit queue %u timed out\\n", dev->name, netdev_drivername(dev), i)``, later with `` %u ms``,
  then (Jakub Kicinski's "net: don't dump stack on queue timeout", backported by Sasha Levin to
  the stable trees) ``netdev_crit(dev, "NETDEV WATCHDOG: CPU: %d: transmit queue %u timed out %u
  ms\\n", raw_smp_processor_id(), i, timedout_ms)``. ``WARN_ONCE`` prints the line with no device
  prefix between ``------------[ cut here ]------------`` and ``WARNING: CPU: ... dev_watchdog``,
  once a boot; ``netdev_crit`` behind ``<driver> <bdf> <ifname>: `` (``<ifname>: `` for a device
  without a parent), every time.
- ``drivers/net/ethernet/mellanox/mlx5/core/en_main.c``, ``mlx5e_tx_timeout()``:
  ``netdev_err(dev, "TX timeout detected\\n")``, and per stuck queue ``"TX timeout on queue: %d,
  SQ: 0x%x, CQ: 0x%x, SQ Cons: 0x%x SQ Prod: 0x%x\\n"`` (before the devlink reporter), then
  ``en/reporter_tx.c``'s ``mlx5e_reporter_tx_timeout()`` ``"TX timeout on queue: %d, SQ: 0x%x, CQ:
  0x%x, SQ Cons: 0x%x SQ Prod: 0x%x, usecs since last trans: %u"`` printed by ``en/health.c``'s
  ``mlx5e_health_report()`` (``netdev_err(priv->netdev, "%s\\n", err_str)``), and the recovery's
  ``"EQ 0x%x: Cons = 0x%x, irqn = 0x%x"``.
- ``drivers/net/ethernet/mellanox/mlx5/core/events.c``, ``mlx5_pcie_event()``:
  ``mlx5_core_warn_rl(dev, "Detected insufficient power on the PCIe slot (%uW).\\n", pci_power)``,
  ``mlx5_core_info_rl(dev, "PCIe slot power capability was not advertised.\\n")`` and ``"PCIe
  slot advertised sufficient power (%uW).\\n"``; the ``mlx5_pcie_event:299:(pid 268269): `` prefix
  of older kernels is GPUd's example (``components/accelerator/nvidia/infiniband``: ``mlx5_core
  0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot
  (27W).``).
- ``cmd.c``'s failed command (``"%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x),
  err(%d)"``): ``ACCESS_REG`` failures that GPUd calls noise (reading counters on restricted
  DGX/GB200 functions) and NVSentinel reads; not counted here.
"""

from __future__ import annotations


import pytest

from pipeline.catalog import FIELDS
from producers.kmsg import KmsgFileSource, parse_pci_map
from producers.kmsg_fabric import MAX_CPER, FabricEvents
from tests.unit.producers.kmsg_factories import PCI_MAP, dmesg, produce_and_replay, write

PFX = "mlx5_core 0000:3b:00.0 ens1f0np0: "
CUT_HERE = "------------[ cut here ]------------"
WARN_OLD = "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 5 timed out"
WARN_MS = "NETDEV WATCHDOG: eth0 (e1000e): transmit queue 0 timed out 5440 ms"
WARNING = "WARNING: CPU: 12 PID: 0 at net/sched/sch_generic.c:525 dev_watchdog+0x23a/0x250"
CRIT = PFX + "NETDEV WATCHDOG: CPU: 12: transmit queue 5 timed out 5120 ms"
CRIT_NO_PARENT = "eth1: NETDEV WATCHDOG: CPU: 0: transmit queue 2 timed out 8192 ms"
DETECTED = PFX + "TX timeout detected"
QUEUE_OLD = PFX + "TX timeout on queue: 5, SQ: 0x10b, CQ: 0x40f, SQ Cons: 0x0 SQ Prod: 0x3"
QUEUE = PFX + "TX timeout on queue: 5, SQ: 0x10b, CQ: 0x40f, SQ Cons: 0x0 SQ Prod: 0x3, usecs since last trans: 5120000"
QUEUE_7 = (
    PFX + "TX timeout on queue: 7, SQ: 0x113, CQ: 0x417, SQ Cons: 0x8 SQ Prod: 0x9, usecs since last trans: 5121000"
)
EQ = PFX + "EQ 0x7: Cons = 0x3d, irqn = 0x2f"
POWER_OLD = (
    "mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W)."
)
POWER = "mlx5_core 0000:5c:00.1: Detected insufficient power on the PCIe slot (27W)."
NOT_ADVERTISED = "mlx5_core 0000:5c:00.0: PCIe slot power capability was not advertised."
SUFFICIENT = "mlx5_core 0000:5c:00.0: PCIe slot advertised sufficient power (75W)."
ACCESS_REG = (
    "mlx5_core 0000:3b:00.0: mlx5_cmd_out_err:838:(pid 2510): ACCESS_REG(0x805) op_mod(0x1) failed, "
    "status bad parameter(0x3), syndrome (0x6f3c3e), err(-22)"
)


def counted(*lines, host="n1"):
    ev = FabricEvents()
    for ln in lines:
        ev.apply(host, ln)
    return {k: v for k, v in ev.counts(host).items() if v}


@pytest.mark.parametrize(
    "line, labels",
    [
        (WARN_OLD, {"nic.netdev": "ens1f0np0", "nic.queue": "5"}),
        (WARN_MS, {"nic.netdev": "eth0", "nic.queue": "0"}),  # any NIC's timeout, not only mlx5's
        (CRIT, {"nic.device": "0000:3b:00.0", "nic.netdev": "ens1f0np0", "nic.queue": "5"}),
        (CRIT_NO_PARENT, {"nic.netdev": "eth1", "nic.queue": "2"}),
        (DETECTED, {"nic.device": "0000:3b:00.0", "nic.netdev": "ens1f0np0"}),
        (QUEUE_OLD, {"nic.device": "0000:3b:00.0", "nic.netdev": "ens1f0np0", "nic.queue": "5"}),
        (QUEUE, {"nic.device": "0000:3b:00.0", "nic.netdev": "ens1f0np0", "nic.queue": "5"}),
        (POWER_OLD, {"nic.device": "0000:5c:00.0", "nic.slot_power": "27W"}),
        (POWER, {"nic.device": "0000:5c:00.1", "nic.slot_power": "27W"}),
    ],
)
def test_every_layout_counts_one_warning_with_its_device(line, labels):
    ev = FabricEvents()
    got = ev.apply("n1", line)
    assert got is not None and {k: got[k] for k in labels} == labels
    assert "nic.message" in got and "pid" not in got["nic.message"]  # mlx5's function prefix is left out
    assert ev.counts("n1")["nic_driver_warnings"] == 1 and sum(ev.counts("n1").values()) == 1


def test_one_timeout_is_one_event_however_many_lines_it_prints():
    # netdev_crit's watchdog line every time, then mlx5e's report and its recovery.
    modern = [CRIT, DETECTED, QUEUE, QUEUE_7, EQ]
    assert counted(*modern) == {"nic_driver_warnings": 1}
    assert counted(*modern, *modern) == {"nic_driver_warnings": 2}
    # WARN_ONCE prints its line once a boot: the driver's report counts every later timeout.
    old = [CUT_HERE, WARN_OLD, WARNING, DETECTED, QUEUE_OLD]
    assert counted(*old) == {"nic_driver_warnings": 1}
    assert counted(*old, DETECTED, QUEUE_OLD, DETECTED, QUEUE_OLD) == {"nic_driver_warnings": 3}
    # A report whose first line was lost counts at its first queue line, once.
    assert counted(QUEUE, QUEUE_7) == {"nic_driver_warnings": 1}
    # Two watchdog lines without a driver's report between: two timeouts.
    assert counted(WARN_MS, WARN_MS) == {"nic_driver_warnings": 2}


def test_interfaces_and_hosts_are_followed_apart():
    other = "mlx5_core 0000:3c:00.0 ens2f0np0: "
    ev = FabricEvents()
    for ln in [
        CRIT,
        other + "NETDEV WATCHDOG: CPU: 3: transmit queue 1 timed out 5000 ms",
        DETECTED,
        other + "TX timeout detected",
        QUEUE,
        other + "TX timeout on queue: 1, SQ: 0x20, CQ: 0x21, SQ Cons: 0x0 SQ Prod: 0x1",
    ]:
        ev.apply("n1", ln)
    assert ev.counts("n1")["nic_driver_warnings"] == 2
    # Another host's driver report is its own event, not the detail of n1's watchdog line.
    assert ev.apply("n2", DETECTED) is not None and ev.counts("n2")["nic_driver_warnings"] == 1


@pytest.mark.parametrize(
    "line",
    [
        NOT_ADVERTISED,  # info: the slot's power could not be read, not a shortage
        SUFFICIENT,
        ACCESS_REG,  # GPUd: noise from reading counters on restricted functions
        CUT_HERE,
        WARNING,  # the WARN_ONCE's own frame line, not a second event
        EQ,
        "Detected insufficient power on the PCIe slot (27W).",  # no device: not the driver's line
        "mlx5_core: Detected insufficient power on the PCIe slot (27W).",
        "mlx5_core 0000:5c:00.0: Detected insufficient power on the PCIe slot (2",  # cut
        "NETDEV WATCHDOG: eth0 (e1000e): transmit queue 0 timed o",  # cut
        "NETDEV WATCHDOG: eth0 (e1000e): transmit queue 0 timed out 54",  # cut in its number
        PFX + "NETDEV WATCHDOG: CPU: 12: transmit queue 5 timed",
        PFX + "TX timeout on queue: 5,",
        PFX + "TX timeout detect",
        "NETDEV WATCHDOG: eth0 (e1000e): transmit queue 99999999999 timed out",  # no queue number
        "NETDEV WATCHDOG: eth0 (e1000e): transmit queue ٣ timed out",  # not an ASCII digit
        "NETDEV WATCHDOG: a b (e1000e): transmit queue 0 timed out",  # no netdev name has a space
        "hci0: command 0x0c03 tx timeout",  # Bluetooth: not a NIC, not this wording
        "spi-nor spi0.0: TX timeout",
        "systemd[1]: NETDEV WATCHDOG: CPU: 1: transmit queue 0 timed out 5000 ms is what the kernel says",
    ],
)
def test_lines_that_look_alike_count_nothing(line):
    assert counted(line) == {}
    assert counted(line, line) == {}


def test_hostile_interface_names_do_not_grow_the_state():
    ev = FabricEvents()
    for i in range(MAX_CPER * 4):
        ev.apply("n1", f"NETDEV WATCHDOG: eth{i} (e1000e): transmit queue 0 timed out 5000 ms")
        ev.apply("n1", f"mlx5_core 0000:3b:00.0 x{i}: TX timeout detected")
    assert ev.counts("n1")["nic_driver_warnings"] == MAX_CPER * 8
    assert len(ev.hosts["n1"].tx) <= MAX_CPER


def test_a_backlog_watchdog_line_makes_its_driver_report_the_same_event():
    ev = FabricEvents()
    assert ev.apply("n1", CRIT, count=False) is not None  # the ring buffer's: history, not counted
    assert ev.apply("n1", DETECTED) is None and ev.apply("n1", QUEUE) is None
    assert ev.counts("n1")["nic_driver_warnings"] == 0


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


def test_a_saved_log_carries_the_count_on_every_gpu(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg([CUT_HERE, WARN_OLD, WARNING, DETECTED, QUEUE_OLD, POWER_OLD, POWER]))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=1_800_000_000.0, interval_s=10)
    recs = src.poll()
    last = [r for r in recs if r.ts == max(x.ts for x in recs)]
    assert {val(r, "nic_driver_warnings") for r in last} == {3} and {r.gpu for r in last} == {0, 1, 2, 3, 4}
    first = min(r.ts for r in recs)
    assert {val(r, "nic_driver_warnings") for r in recs if r.ts == first} == {0}  # the baseline before it
    assert src.summary()["fabric_lines"] == 3


def test_produce_then_replay_raises_the_nic_driver_warning(tmp_path, capsys):
    lines = [CRIT, DETECTED, QUEUE, NOT_ADVERTISED, ACCESS_REG, POWER_OLD]
    summary, got = produce_and_replay(tmp_path, lines, 60.0, capsys)
    assert "fabric_lines 2" in summary
    assert {a["rule"] for a in got} == {"network_nic_driver_warning"}
    assert {(a["host"], a["severity"]) for a in got} == {("n1", "warning")}


def test_the_field_takes_a_column_after_every_older_one():
    # An engine snapshot restores its columns by position, padding new ones at the end
    # (pipeline/engine/state.py): a field added later must not move an older one's column.
    new = FIELDS.by_alias("nic_driver_warnings")
    assert new.field_id == 9518 and new.kind == "counter" and new.names == ("GPUWARDEN_KMSG_NIC_DRIVER_WARNINGS",)
    assert new.column > max(FIELDS.by_alias(a).column for a in ("pcie_aer_log_fatal", "fm_errors"))
