"""The kernel log beyond the GPU (#34): mlx5/NIC and PCIe AER lines counted per host, SXids
counted as well as kept as codes, and the rules they feed.

Public lines and their origins:

- mlx5 health and command timeouts: NVIDIA/NVSentinel
  ``health-monitors/syslog-health-monitor/pkg/nicdriver/handler_test.go`` and its e2e test
  (``mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss
  count``, ``... print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error``,
  ``mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak
  of a command resource``); the ``Fatal error %u detected`` and ``Port module event`` layouts are
  the format strings of the kernel's mlx5 ``health.c`` and ``events.c`` (torvalds/linux).
- AER: the linux-pci patch "PCI/AER: Decode Error Source Requester ID" follow-up by Naveen Naidu
  (2021; the ``id=0018`` layout before 5.x), Bjorn Helgaas's "Correctable error received" message
  change (linux-pci), Documentation/PCI/pcieaer-howto.rst (``0000:50:00.0: PCIe Bus Error:
  severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)``) and NVSentinel's
  ``pkg/nicdriver/bdf_test.go`` (``pcieport 0000:50:00.0: AER: PCIe Bus Error:
  severity=Uncorrectable (Fatal)``).
- link down: a r8169 syslog capture quoted in public troubleshooting threads (``r8169
  0000:06:00.0 eth0: link down``, ``r8169: eth0: link down``), mlx5e's ``netdev_info(..., "Link
  down")`` (``en_main.c``), Intel's ``NIC Link is Down`` and Azure's node health checks' ``lost
  carrier`` (``azure_ib_link_flapping.nhc``).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.catalog import FIELDS
from producers.kmsg import KmsgFileSource, KmsgFollower, parse_pci_map
from producers.kmsg_fabric import FIELDS as COUNTERS
from producers.kmsg_fabric import FabricEvents
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import PCI_MAP, SXID_NONFATAL, XID_79, FakeReader, dmesg, write

FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEALTH = "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count"
HEALTH_DETAIL = "mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error"
CMD_TIMEOUT = ("mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak of a "
               "command resource")
FATAL_SENSOR = "mlx5_core 0000:41:00.0: Fatal error 1 detected"
UNPLUGGED = "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged"
PLUGGED = "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable plugged"
CABLE_ERROR = "mlx5_core 0000:3b:00.0: port_module:254:(pid 0): Port module event[error]: module 0, Cable error, High Temperature"
MLX5E_DOWN = "mlx5_core 0000:3b:00.0 ens1f0np0: Link down"
MLX5E_UP = "mlx5_core 0000:3b:00.0 ens1f0np0: Link up"
R8169_DOWN = "r8169 0000:06:00.0 eth0: link down"
OLD_DOWN = "r8169: eth0: link down"
INTEL_DOWN = "ixgbe 0000:01:00.0 eth2: NIC Link is Down"
LOST_CARRIER = "ib0: lost carrier"
PCIEHP = "pcieport 0000:00:03.0: pciehp: Slot(3): Link Down"
NOT_READY = "ADDRCONF(NETDEV_UP): eth0: link is not ready"
AER_RECEIVED = "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5"
AER_RECEIVED_NEW = "pcieport 0000:00:1c.5: AER: Correctable error received: 0000:00:1c.5"
AER_RECEIVED_OLD = "pcieport 0000:00:03.0: AER: Corrected error received: id=0018"
AER_BUS_OLD = "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, id=0018 (Receiver ID)"
AER_DEVICE = "pcieport 0000:00:03.0:   device [1b36:000c] error status/mask=00000040/0000e000"
AER_BIT = "pcieport 0000:00:03.0:    [ 6] BadTLP"
AER_FATAL_HOWTO = "0000:50:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"
AER_FATAL_NVSENTINEL = "pcieport 0000:50:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal)"
AER_NONFATAL_RECEIVED = "pcieport 0000:00:01.0: AER: Multiple Uncorrected (Non-Fatal) error received: 0000:01:00.0"
AER_NONFATAL_BUS = ("nvidia 0000:01:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
                    "(Requester ID)")


def counted(*lines: str, host: str = "n1") -> dict[str, int]:
    ev = FabricEvents()
    for ln in lines:
        ev.apply(host, ln)
    return {k: v for k, v in ev.counts(host).items() if v}


def test_each_nic_line_moves_its_counter_and_detail_lines_count_nothing():
    assert counted(HEALTH, HEALTH_DETAIL) == {"nic_health_errors": 1}   # print_health_info's detail: same event
    assert counted(CMD_TIMEOUT, FATAL_SENSOR) == {"nic_health_errors": 2}
    assert counted(UNPLUGGED, PLUGGED, CABLE_ERROR) == {"nic_module_errors": 2}   # plugged is not an error
    assert counted(MLX5E_DOWN, MLX5E_UP, R8169_DOWN, OLD_DOWN, INTEL_DOWN, LOST_CARRIER) == {"nic_link_down_events": 5}
    assert counted(PCIEHP, NOT_READY, XID_79, SXID_NONFATAL) == {}   # a PCIe slot, a link not ready, GPU lines
    labels = FabricEvents().apply("n1", CABLE_ERROR)
    assert labels == {"nic.module": "0", "nic.device": "0000:3b:00.0",
                      "nic.message": "Port module event[error]: module 0, Cable error, High Temperature"}
    assert FabricEvents().apply("n1", MLX5E_DOWN)["nic.netdev"] == "ens1f0np0"
    assert FabricEvents().apply("n1", LOST_CARRIER)["nic.netdev"] == "ib0"


def test_an_aer_error_counts_once_per_report_whatever_the_kernel_version():
    # A root port's "received" line and the device's "PCIe Bus Error" line are one error; the
    # device/mask and bit lines are its detail.
    assert counted(AER_RECEIVED_OLD, AER_BUS_OLD, AER_DEVICE, AER_BIT) == {"pcie_aer_log_correctable": 1}
    assert counted(AER_RECEIVED, AER_RECEIVED_NEW) == {"pcie_aer_log_correctable": 2}
    # Multiple: the second device's report is an error of its own; DPC and howto lines stand alone.
    assert counted(AER_NONFATAL_RECEIVED, AER_NONFATAL_BUS, AER_NONFATAL_BUS) == {"pcie_aer_log_nonfatal": 2}
    assert counted(AER_FATAL_HOWTO, AER_FATAL_NVSENTINEL) == {"pcie_aer_log_fatal": 2}
    # A "PCIe Bus Error" of another severity does not consume the pending one.
    assert counted(AER_NONFATAL_RECEIVED, AER_BUS_OLD) == {"pcie_aer_log_nonfatal": 1, "pcie_aer_log_correctable": 1}
    labels = FabricEvents().apply("n1", AER_FATAL_HOWTO)
    assert labels["aer.device"] == "0000:50:00.0" and labels["aer.type"] == "Transaction Layer"


def test_hosts_are_counted_apart():
    ev = FabricEvents()
    ev.apply("n1", MLX5E_DOWN)
    ev.apply("n2", MLX5E_DOWN)
    ev.apply("n2", MLX5E_DOWN)
    assert ev.counts("n1")["nic_link_down_events"] == 1 and ev.counts("n2")["nic_link_down_events"] == 2
    assert ev.counts("n3") == dict.fromkeys(COUNTERS, 0)


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


def test_a_saved_log_counts_on_every_gpu_with_a_baseline_before_the_first_event(tmp_path):
    lines = [MLX5E_DOWN, SXID_NONFATAL, AER_RECEIVED_OLD, AER_BUS_OLD, AER_DEVICE, MLX5E_DOWN, HEALTH, HEALTH_DETAIL]
    p = write(tmp_path, "dmesg.txt", dmesg(lines))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=1_800_000_000.0, interval_s=10)
    recs = src.poll()
    t0 = 1_800_000_000.0 + 1000
    # The host's counters at 0 one interval before its first event: increase() sees that event.
    first = min(r.ts for r in recs)
    assert first == t0 - 10 and {val(r, "nic_link_down_events") for r in recs if r.ts == first} == {0}
    assert {r.gpu for r in recs if r.ts == first} == {0, 1, 2, 3, 4}
    last = [r for r in recs if r.ts == max(x.ts for x in recs)]
    assert {(val(r, "nic_link_down_events"), val(r, "nvswitch_nonfatal_sxids"), val(r, "pcie_aer_log_correctable"),
             val(r, "nic_health_errors"), val(r, "nvswitch_nonfatal_sxid")) for r in last} == {(2, 1, 1, 1, 12028)}
    events = [r for r in recs if "nic.message" in r.labels and r.gpu == 0]
    # mlx5_core_err's "<func>:<line>:(pid N): " prefix is left out of the message.
    assert [r.labels["nic.message"] for r in events] == ["Link down", "Link down", HEALTH.split("(pid 0): ")[1]]
    s = src.summary()
    assert s["fabric_lines"] == 4 and s["sxid_lines"] == 1 and s["dropped.event_without_gpu"] == 0


def test_a_follower_folds_backlog_lines_without_counting_them():
    r = FakeReader()
    now = [1_800_000_000.0]
    r.batches = [[f"3,100,{(10_000 - 3600) * 1_000_000},-;{MLX5E_DOWN}"], [f"3,101,{10_005 * 1_000_000},-;{MLX5E_DOWN}"]]
    f = KmsgFollower(r, parse_pci_map(PCI_MAP), host="n1", clock=lambda: now[0], boot_time=now[0] - 10_000)
    assert {val(x, "nic_link_down_events") for x in f.poll()} == {0}   # the ring buffer's: history
    assert f.summary()["backlog_events"] == 1
    now[0] += 10
    new = [x for x in f.poll() if "nic.message" in x.labels]
    assert len(new) == 5 and {val(x, "nic_link_down_events") for x in new} == {1}


def test_an_event_on_a_host_with_no_gpu_in_the_map_is_counted_as_a_drop(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg([MLX5E_DOWN]))
    src = KmsgFileSource(str(p), {}, host="n1", boot_time=0.0)
    assert src.poll() == [] and src.summary()["dropped.event_without_gpu"] == 1


def test_produce_then_replay_raises_the_nic_aer_and_sxid_rate_alerts(tmp_path, capsys):
    from pipeline.cli import main

    # A flapping link (3 downs in 10 minutes), an mlx5 health failure, a fatal AER error and three
    # non-fatal SXids in an hour, a minute apart.
    lines = [MLX5E_DOWN, SXID_NONFATAL, MLX5E_DOWN, SXID_NONFATAL, MLX5E_DOWN, SXID_NONFATAL, HEALTH,
             AER_FATAL_NVSENTINEL]
    log = write(tmp_path, "dmesg.txt", dmesg(lines, step=60.0))
    pci = write(tmp_path, "pci.csv", PCI_MAP)
    out, alerts = tmp_path / "kmsg.jsonl", tmp_path / "alerts.jsonl"
    assert main(["produce", "kmsg", "--file", str(log), "--pci-map", str(pci), "--boot-time", "1800000000",
                 "--host", "n1", "--out", str(out), "--interval", "10"]) == 0
    assert "fabric_lines 5" in capsys.readouterr().err
    assert main(["replay", str(out), "--alerts-out", str(alerts), "-q"]) == 0
    fired = {a["rule"] for a in map(json.loads, alerts.read_text().splitlines()) if a["state"] == "firing"}
    assert {"network_nic_link_down_log", "network_nic_link_flapping_log", "network_nic_health_error",
            "pcie_aer_log_fatal", "nvlink_nvswitch_sxid_rate", "nvlink_nvswitch_sxid"} == fired


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
PIECES = st.sampled_from([
    "mlx5_core 0000:3b:00.0", "pcieport 0000:00:01.0: ", "AER: ", "PCIe Bus Error: severity=", "Corrected",
    "Uncorrected (Fatal)", " error received: ", "Port module event", ": module 9999999, Cable error, ",
    "Link down", " lost carrier", "Fatal error 99999999999 detected", "health compromised", ": ", "\x00", "٣",
])
LINES = st.lists(st.one_of(TEXT, st.lists(PIECES, max_size=8).map("".join)), max_size=30)


@FUZZ
@given(LINES)
def test_any_line_costs_at_most_one_count_and_never_raises(lines):
    ev = FabricEvents()
    for ln in lines:
        before = sum(ev.counts("n1").values())
        labels = ev.apply("n1", ln)
        after = sum(ev.counts("n1").values())
        assert after - before == (1 if labels is not None else 0)
        assert labels is None or all(len(v) <= 200 for v in labels.values())


@FUZZ
@given(LINES)
def test_a_saved_log_of_hostile_lines_among_good_ones_still_counts_the_good_ones(tmp_path_factory, lines):
    tmp = tmp_path_factory.mktemp("kf")
    text = dmesg([MLX5E_DOWN] + [ln.replace("\n", " ").replace("\r", " ") for ln in lines] + [HEALTH])
    p = write(tmp, "dmesg.txt", text)
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False).poll()
    last = max(recs, key=lambda r: r.ts)
    assert val(last, "nic_link_down_events") >= 1 and val(last, "nic_health_errors") >= 1


def test_an_aer_error_on_a_gpus_bus_id_names_the_gpu(tmp_path):
    # The PCI map's GPU 0 is 0000:3b:00.0; the root port's "received" line names it as the source.
    lines = ["pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
             "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
             "(Requester ID)", AER_FATAL_HOWTO]
    p = write(tmp_path, "dmesg.txt", dmesg(lines))
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False).poll()
    named = [r.labels.get("aer.gpu") for r in recs if r.gpu == 0 and "aer.message" in r.labels]
    assert named == ["0", None]   # 0000:50:00.0 is no GPU of the map
