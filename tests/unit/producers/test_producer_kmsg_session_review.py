"""A hostile review of the kernel-log producer's GPU-off-the-bus message, GHES / AER pairing and
NIC transmit timeouts: what the joining of the driver's message across lines may swallow, copies
of one record in two layouts, a busy log's chatter, and the live follower for each feature.

The driver's message is open-gpu-kernel-modules ``osinit.c``'s three lines (see
``test_producer_kmsg_gpu_lost.py``); ``mce: [Hardware Error]: ...`` is ``arch/x86/kernel/cpu/mce``'s
prefix (``pr_emerg(HW_ERR ...)``, ``HW_ERR`` being ``"[Hardware Error]: "``) behind its
``pr_fmt`` ``"mce: "``, printed for every corrected machine check on a host with a failing DIMM.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.kmsg import KmsgFileSource, KmsgFollower, parse_pci_map
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import XID, FakeReader, val, write

PCI = parse_pci_map("index, pci.bus_id\n0, 00000000:3B:00.0\n3, 00000000:B3:00.0")
LOST = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)
XID_13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception"
MTIME = 1_796_157_005.0
FUZZ = settings(max_examples=fuzz_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _read(tmp_path, text, host="n1"):
    src = KmsgFileSource(str(write(tmp_path, "kern.log", text, MTIME)), PCI, host=host, sample=False)
    return src, src.poll()


def _xids(recs):
    return sorted((r.host, r.gpu, int(val(r, XID))) for r in recs)


def test_another_hosts_line_between_a_records_lines_loses_neither(tmp_path):
    # A remote-syslog file of several hosts: each line of the record is its own syslog message
    # (the kernel's syslog interface), and another host's line lands between them.
    for other in ("NVRM: GPU at PCI:0000:3b:00: GPU-5c6ff2f3", "systemd[1]: Started Session 7.", LOST[0]):
        text = (
            f"Dec  1 20:30:05 n1 kernel: {LOST[0]}\n"
            f"Dec  1 20:30:05 n2 kernel: {other}\n"
            f"Dec  1 20:30:05 n1 kernel: {LOST[1]}\n"
            f"Dec  1 20:30:05 n2 kernel: {XID_13}\n"
            f"Dec  1 20:30:05 n1 kernel: {LOST[2]}\n"
        )
        src, recs = _read(tmp_path, text, host=None)
        assert ("n1", 3, 79) in _xids(recs), other
        assert ("n2", 0, 13) in _xids(recs), other
        assert src.summary()["gpu_lost_lines"] == 1, other


def test_a_later_nvrm_line_after_a_cut_first_line_keeps_its_time(tmp_path):
    # The message cut after its first line; the log's last line, minutes later, is another NVRM
    # line: it is no part of the record, and the boot-relative times are placed by it.
    text = (
        f"[ 1000.000000] {XID_13}\n[ 1000.500000] {LOST[0]}\n[ 1500.000000] NVRM: GPU at PCI:0000:3b:00: GPU-5c6ff2f3\n"
    )
    src, recs = _read(tmp_path, text)
    (rec,) = recs
    assert rec.ts == MTIME - 500.0  # the last line (1500 s after boot) is at the file's mtime
    assert src.summary()["gpu_lost_lines"] == 0


def test_rsyslogs_012_copy_and_the_journals_copy_are_one_event(tmp_path):
    journal = {
        "MESSAGE": "\n".join(LOST),
        "__REALTIME_TIMESTAMP": "1796157005000000",
        "_SOURCE_MONOTONIC_TIMESTAMP": "1843308145",
        "_TRANSPORT": "kernel",
        "_HOSTNAME": "n1",
    }
    rsyslog = f"2026-12-01T20:30:05.000000+00:00 n1 kernel: [ 1843.308145] {'#012'.join(LOST)}\n"
    for text in (rsyslog + json.dumps(journal) + "\n", json.dumps(journal) + "\n" + rsyslog):
        src, recs = _read(tmp_path, text, host=None)
        assert _xids(recs) == [("n1", 3, 79)]
        assert src.summary()["duplicate_lines"] == 1
        assert src.summary()["gpu_lost_lines"] == 2  # the record and its copy, as xid_lines counts copies


def test_a_busy_logs_machine_check_lines_are_not_kept(tmp_path):
    # mce's corrected-error lines say "[Hardware Error]" behind "mce: ": no GHES record, and a
    # saved file keeps only the lines it reads (memory follows the events, not the log).
    chatter = (
        "mce: [Hardware Error]: Machine check events logged",
        "mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 13: cc00008000010090",
        "mce: [Hardware Error]: TSC 0 ADDR 3f2c8c1c0 MISC 200400c008002086",
        "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0)",
        "x86/fpu: xstate_offset[2]:  576, xstate_sizes[2]:  256",
        "docker0: port 1(veth12ab) entered forwarding state",
        "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    )
    lines = [f"[{i * 0.01:12.6f}] {chatter[i % len(chatter)]}" for i in range(20_000)]
    lines.insert(10_000, f"[  100.000500] {XID_13}")
    src = KmsgFileSource(
        str(write(tmp_path, "dmesg.txt", "\n".join(lines) + "\n", MTIME)), PCI, host="n1", sample=False
    )
    events, *_ = src._read()
    assert [e.msg for e in events] == [XID_13]
    assert src.summary()["lines"] == 20_001


def test_a_follower_counts_each_feature_from_dev_kmsg_and_the_journal():
    msgs = [
        "{7}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4",
        "{7}[Hardware Error]: event severity: corrected",
        "{7}[Hardware Error]:  Error 0, type: corrected",
        "{7}[Hardware Error]:   section_type: PCIe error",
        "{7}[Hardware Error]:   device_id: 0000:3b:00.0",
        "nvidia 0000:3b:00.0: AER: aer_status: 0x00000001, aer_mask: 0x00000000",
        "nvidia 0000:3b:00.0: AER:    [ 0] RxErr",
        "nvidia 0000:3b:00.0: AER: aer_layer=Physical Layer, aer_agent=Receiver ID",
        "mlx5_core 0000:5e:00.0 ens1: NETDEV WATCHDOG: CPU: 3: transmit queue 3 timed out 5000 ms",
        "mlx5_core 0000:5e:00.0 ens1: TX timeout detected",
        "mlx5_core 0000:5e:00.0 ens1: TX timeout on queue: 3, SQ: 0x1, CQ: 0x2, SQ Cons: 0x0 SQ Prod: 0x3",
        "\n".join(LOST),
    ]
    for kind in ("dev/kmsg", "journal json"):
        reader = FakeReader()
        f = KmsgFollower(reader, PCI, host="n1", clock=lambda: MTIME + 100, boot_time=0.0)
        f.started = MTIME
        stamps = [int((MTIME + 1 + i / 1000) * 1e6) for i in range(len(msgs))]
        if kind == "dev/kmsg":
            batch = [f"4,{i},{us},-;" + m.replace("\n", "\\x0a") for i, (m, us) in enumerate(zip(msgs, stamps))]
        else:
            batch = [
                json.dumps({"MESSAGE": m, "__REALTIME_TIMESTAMP": str(us), "_TRANSPORT": "kernel"})
                for m, us in zip(msgs, stamps)
            ]
        reader.batches = [batch]
        recs = f.poll()
        counts = f.log.fabric.counts("n1")
        assert counts["pcie_aer_log_correctable"] == 1, kind  # the section and its print: one report
        assert counts["nic_driver_warnings"] == 1, kind  # the watchdog and the driver's lines: one timeout
        assert (("n1", 3, 79)) in _xids(recs), kind
        assert f.summary()["gpu_lost_lines"] == 1, kind


NOISE = st.sampled_from(
    [
        "systemd[1]: Started Session 7.",
        "NVRM: GPU at PCI:0000:3b:00: GPU-5c6ff2f3",
        XID_13,
        LOST[0].replace("b3", "3b"),
        "mlx5_core 0000:5e:00.0 ens1: Link down",
    ]
)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["n2", "n3"]), NOISE, st.integers(0, 3)), max_size=8))
def test_other_hosts_lines_anywhere_in_a_record_cost_it_nothing(tmp_path_factory, noise):
    # n1's record, a line per syslog message, with other hosts' lines at any place among its lines.
    spots: list[list[str]] = [[], [], [], []]
    for host, msg, at in noise:
        spots[at].append(f"Dec  1 20:30:05 {host} kernel: {msg}")
    lines = list(spots[0])
    for n, part in enumerate(LOST):
        lines += [f"Dec  1 20:30:05 n1 kernel: {part}", *spots[n + 1]]
    tmp = tmp_path_factory.mktemp("kmsg")
    src, recs = _read(tmp, "\n".join(lines) + "\n", host=None)
    n1 = [r for r in recs if r.host == "n1"]
    assert [int(val(r, XID)) for r in n1] == [79]
    xids = sum(1 for _, msg, _ in noise if msg == XID_13)
    assert src.summary()["xid_lines"] == xids  # each other host's XID read once, none swallowed
