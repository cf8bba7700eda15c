"""The kernel-log producer (#21 item 3): XID and SXid lines in the layouts the driver and the log
tools print, mapped to GPU indices, published as XID-gauge records, replayed into catalogue-driven
alerts.

The line formats are the driver's own (open-gpu-kernel-modules 595.45.04):
``kernel_rc.c`` prints ``"NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s,
name=%s, %s"`` (or ``"...: %d, %s"`` with no process); ``common_nvswitch.h`` prints
``"nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, "`` followed by ``"Fatal, Link %02d ..."`` or
``"Non-fatal, Link %02d ..."`` (``intr_nvswitch.h``); drivers before R4xx printed the bus id
without ``PCI:`` (NVIDIA's r384 XID document: ``NVRM: Xid (0000:03:00): 14, Channel 00000001``).
The layouts around the message are dmesg's (``[ seconds]``, ``-T``), journalctl's (short,
short-iso, json) and /dev/kmsg's (``prio,seq,usec,flags;message``, see the kernel's
Documentation/ABI/testing/dev-kmsg).
"""

from __future__ import annotations

import json
import stat
import time

import pytest

from pipeline.catalog import FIELDS
from producers.kmsg import KmsgFileSource, KmsgFollower, parse_line, parse_pci_map
from tests.unit.producers.kmsg_factories import (
    EVENTS,
    PCI_MAP,
    SXID_FATAL,
    SXID_NONFATAL,
    XID,
    XID_119,
    XID_13,
    XID_79,
    XID_79_R4XX,
    FakeReader,
    dmesg,
    val,
    write,
)

FATAL = FIELDS.by_alias("nvswitch_fatal_sxid")
NONFATAL = FIELDS.by_alias("nvswitch_nonfatal_sxid")


def test_pci_map_reads_nvidia_smi_csv_with_or_without_header_and_refuses_anything_else():
    m = parse_pci_map(PCI_MAP)
    assert m == {(0, 0x3B, 0): 0, (0, 0x5E, 0): 1, (0, 0x86, 0): 2, (0, 0xAF, 0): 3, (0, 0xD8, 0): 4}
    assert parse_pci_map("0, 0000:3b:00.0\n1, 0001:5e:00.0\n") == {(0, 0x3B, 0): 0, (1, 0x5E, 0): 1}
    with pytest.raises(ValueError, match="line 2"):
        parse_pci_map("index, pci.bus_id\nGPU-0, not-a-bus-id\n")


def test_a_pci_map_naming_a_bus_id_or_an_index_twice_is_refused():
    # Either would charge one GPU's XIDs to another.
    with pytest.raises(ValueError, match="line 3: bus id 0000:3b:00.0 is already on line 2"):
        parse_pci_map("index, pci.bus_id\n0, 0000:3b:00.0\n1, 0000:3b:00.0\n")
    with pytest.raises(ValueError, match="line 2: GPU index 0 is already on line 1"):
        parse_pci_map("0, 0000:3b:00.0\n0, 0000:5e:00.0\n")
    with pytest.raises(ValueError, match="line 1"):
        parse_pci_map("\u0663, 0000:3b:00.0\n")  # an Arabic-Indic 3 is no GPU index
    with pytest.raises(ValueError, match="line 2: GPU index 9999 is past 4095"):
        parse_pci_map("0, 0000:3b:00.0\n9999, 0000:5e:00.0\n")  # the decoder refuses its every record


def test_unmapped_pci_ids_are_each_counted_but_remembered_only_up_to_a_bound():
    from producers.kmsg import MAX_WARNED_PCI, KernelLog

    kl = KernelLog(parse_pci_map(PCI_MAP), host="n1")
    n = MAX_WARNED_PCI + 500
    for i in range(n):
        line = parse_line(f"[ 1.0] NVRM: Xid (PCI:{i + 0x100:08x}:3b:00): 79, pid=1, GPU has fallen off the bus.")
        assert kl.apply(line, 1.0) == []
    assert kl.stats.unmapped_pci == n and len(kl._warned) == MAX_WARNED_PCI


def test_every_line_layout_gives_the_message_and_its_time():
    msg = XID_79
    assert parse_line(f"[ 1234.567890] {msg}").boot == pytest.approx(1234.56789)
    assert parse_line(f"4,1234,1234567890,-;{msg}").boot == pytest.approx(1234.56789)     # /dev/kmsg
    assert parse_line(" SUBSYSTEM=pci") is None                                            # kmsg continuation
    t = time.mktime(time.strptime("2026-12-01 20:30:05", "%Y-%m-%d %H:%M:%S"))
    ln = parse_line(f"[Tue Dec  1 20:30:05 2026] {msg}")                                    # dmesg -T (local time)
    assert (ln.msg, ln.ts) == (msg, t)
    ln = parse_line(f"Dec 01 20:30:05 gpu-node-7 kernel: {msg}", year=2026)               # journalctl / syslog
    assert (ln.msg, ln.ts, ln.host) == (msg, t, "gpu-node-7")
    ln = parse_line(f"2026-12-01T20:30:05+0000 gpu-node-7 kernel: {msg}")                 # journalctl -o short-iso
    assert (ln.msg, ln.ts, ln.host) == (msg, 1796157005.0, "gpu-node-7")
    ln = parse_line(json.dumps({"__REALTIME_TIMESTAMP": "1796157005250000", "_HOSTNAME": "gpu-node-7",
                                "MESSAGE": msg, "_TRANSPORT": "kernel"}))                  # journalctl -o json
    assert (ln.msg, ln.ts, ln.host) == (msg, 1796157005.25, "gpu-node-7")
    ln = parse_line(json.dumps({"MESSAGE": list(msg.encode()), "__REALTIME_TIMESTAMP": "1"}))
    assert ln.msg == msg                                                                   # journald byte arrays
    assert parse_line(msg).msg == msg and parse_line(msg).ts is None                       # dmesg -t: no time


def test_dmesg_iso_times_and_decoded_facility_prefixes_keep_their_time():
    # dmesg --time-format=iso, and dmesg -x's "kern  :err   : " (leptonai/gpud#338): no layout
    # matched, and the event took the file's time instead of its own.
    msg = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"
    for pfx in ("", "kern  :err   : "):
        ln = parse_line(f"{pfx}2025-01-25T10:34:54,859532+00:00 {msg}")
        assert (ln.msg, ln.ts, ln.error) == (msg, 1737801294.859532, None), pfx
    ln = parse_line(f"kern  :warn  : [ 1234.567890] {XID_79}")
    assert (ln.msg, ln.boot) == (XID_79, 1234.56789)
    assert parse_line(f"2025-02-30T10:34:54+00:00 {msg}").error is not None   # a date that does not exist

def test_a_dmesg_file_gives_each_gpus_last_xid_sxids_on_the_host_and_counts_what_it_drops(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg(EVENTS))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=1_800_000_000.0, interval_s=10)
    recs = src.poll()
    assert src.done
    t0 = 1_800_000_000.0 + 1000
    events = [r for r in recs if "xid.message" in r.labels or "sxid.message" in r.labels]
    xids = [(r.ts - t0, r.gpu, val(r, XID)) for r in events if "xid.message" in r.labels]
    assert xids == [(0.0, 0, 79), (2.0, 1, 119), (4.0, 2, 13), (6.0, 3, 94), (8.0, 4, 31)]
    by_gpu = {r.gpu: r for r in events if "xid.message" in r.labels}
    assert by_gpu[0].labels["xid.message"] == "GPU has fallen off the bus."
    assert (by_gpu[1].labels["xid.pid"], by_gpu[1].labels["xid.process"]) == ("2103", "python3")
    assert by_gpu[0].labels["xid.pid"] == "<unknown>"
    assert by_gpu[3].labels["mig.xid_sources"] == "GPU_I_ID=5:94"       # the instance the driver blamed
    assert by_gpu[4].labels["xid.message"].startswith("Ch 00000008")   # pre-R4xx layout, no process
    # An SXid is the host's: every GPU's record carries it, fatal and non-fatal apart.
    sx = [r for r in events if "sxid.message" in r.labels]
    assert {r.gpu for r in sx} == {0, 1, 2, 3, 4}
    last = max(r.ts for r in recs)
    final = {r.gpu: r for r in recs if r.ts == last}
    assert {g: (val(r, XID), val(r, FATAL), val(r, NONFATAL)) for g, r in final.items()} == {
        0: (79, 20034, 12028), 1: (119, 20034, 12028), 2: (13, 20034, 12028), 3: (94, 20034, 12028),
        4: (31, 20034, 12028)}
    s = src.summary()
    assert s["xid_lines"] == 6 and s["sxid_lines"] == 2 and s["dropped.unmapped_pci"] == 1
    assert s["records"] == len(recs) and s["lines"] == len(EVENTS) + 3


def test_an_sxids_severity_and_data_lines_are_its_detail_not_more_events(tmp_path):
    # The driver prints each SXid as three lines (NVIDIA's Fabric Manager guide; a dmesg in
    # NVIDIA/nvtrust#124): each was counted as an SXid of its own, non-fatal whatever the event.
    pfx = "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 20034, "
    three = [SXID_FATAL, pfx + "Severity 1 Engine instance 30 Sub-engine instance 00",
             pfx + "Data {0x00000000, 0x00000004, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}"]
    src = KmsgFileSource(str(write(tmp_path, "dmesg.txt", dmesg([SXID_NONFATAL] + three))), parse_pci_map(PCI_MAP),
                         host="n1", boot_time=1_800_000_000.0, interval_s=10)
    recs = src.poll()
    last = max(recs, key=lambda r: r.ts)
    n_nonfatal = FIELDS.by_alias("nvswitch_nonfatal_sxids")
    n_fatal = FIELDS.by_alias("nvswitch_fatal_sxids")
    assert (val(last, FATAL), val(last, NONFATAL)) == (20034, 12028)     # the fatal one stays fatal
    assert (val(last, n_fatal), val(last, n_nonfatal)) == (1, 1)
    s = src.summary()
    assert s["sxid_lines"] == 2 and s["sxid_detail_lines"] == 2 and len({r.ts for r in recs
                                                                          if "sxid.message" in r.labels}) == 2

def test_every_known_gpu_is_sampled_between_events_so_none_looks_lost(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg([XID_79, XID_13], step=60.0))
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, interval_s=10).poll()
    for g in range(5):
        ts = sorted(r.ts for r in recs if r.gpu == g)
        assert ts[0] == 1000.0 and ts[-1] == 1060.0
        assert max(b - a for a, b in zip(ts, ts[1:])) <= 10.0
    assert {val(r, XID) for r in recs if r.gpu == 0 and r.ts > 1000} == {79}     # the gauge stays set
    only = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False).poll()
    assert [(r.ts, r.gpu) for r in only] == [(1000.0, 0), (1060.0, 2)]


def test_boot_relative_times_end_at_the_files_mtime_and_untimed_lines_take_it(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg([XID_79]), mtime=1_800_000_500.0)
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", sample=False).poll()
    assert [r.ts for r in recs] == [1_800_000_500.0]
    p = write(tmp_path, "dmesg-t.txt", XID_79 + "\n" + XID_13 + "\n", mtime=1_800_000_600.0)
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", sample=False)
    assert [(r.ts, r.gpu) for r in src.poll()] == [(1_800_000_600.0, 0), (1_800_000_600.0, 2)]
    assert src.summary()["lines_without_time"] == 2


def test_a_journal_export_names_its_host(tmp_path):
    lines = [json.dumps({"__REALTIME_TIMESTAMP": str(1_800_000_000_000_000 + i * 1_000_000), "_HOSTNAME": "gpu-7",
                         "MESSAGE": m}) for i, m in enumerate([XID_119, SXID_FATAL])]
    p = write(tmp_path, "journal.json", "\n".join(lines) + "\n")
    recs = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), sample=False).poll()
    assert {r.host for r in recs} == {"gpu-7"}
    assert [(r.ts, r.gpu, val(r, XID)) for r in recs if "xid.message" in r.labels] == [(1_800_000_000.0, 1, 119)]


def test_a_follower_folds_the_backlog_into_its_first_sample_then_sends_each_new_xid():
    r = FakeReader()
    now = [1_800_000_000.0]
    # The ring buffer: an XID 79 from an hour before we started (boot 10 000 s ago).
    r.batches = [[f"3,100,{(10_000 - 3600) * 1_000_000},-;{XID_79}", " DEVICE=+pci:0000:3b:00.0"],
                 [], [f"4,101,{10_005 * 1_000_000},-;{XID_13}"]]
    f = KmsgFollower(r, parse_pci_map(PCI_MAP), host="n1", clock=lambda: now[0], boot_time=now[0] - 10_000)
    first = f.poll()
    assert [(x.ts, x.gpu, val(x, XID)) for x in first] == [(now[0], g, 79 if g == 0 else 0) for g in range(5)]
    assert f.summary()["backlog_events"] == 1
    now[0] += 10
    assert {val(x, XID) for x in f.poll() if x.gpu == 0} == {79}           # a sample; nothing new
    now[0] += 10
    third = f.poll()
    new = [x for x in third if "xid.message" in x.labels]
    assert [(x.ts, x.gpu, val(x, XID)) for x in new] == [(now[0] - 20 + 5, 2, 13)]


def test_journalctl_is_run_as_argv_and_followed(tmp_path):
    from producers.kmsg import JournalReader

    fake = tmp_path / "journalctl"
    argv_out = tmp_path / "argv"
    line = json.dumps({"__REALTIME_TIMESTAMP": "1800000000000000", "MESSAGE": XID_13})
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {argv_out}\necho '{line}'\nsleep 5\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    rd = JournalReader(str(fake))
    try:
        deadline = time.monotonic() + 5
        got = []
        while not got and time.monotonic() < deadline:
            got = rd.read()
            time.sleep(0.05)
        assert got and json.loads(got[0])["MESSAGE"] == XID_13
        assert argv_out.read_text().split() == ["-k", "-b", "-f", "-o", "json", "--no-pager"]
    finally:
        rd.close()


def test_produce_then_replay_raises_catalogue_driven_alerts_with_the_action(tmp_path, capsys):
    from pipeline.cli import main

    log = write(tmp_path, "dmesg.txt", dmesg(EVENTS))
    pci = write(tmp_path, "pci.csv", PCI_MAP)
    out, alerts = tmp_path / "kmsg.jsonl", tmp_path / "alerts.jsonl"
    assert main(["produce", "kmsg", "--file", str(log), "--pci-map", str(pci), "--boot-time", "1800000000",
                 "--host", "n1", "--out", str(out), "--interval", "5"]) == 3  # an XID lost: unmapped PCI
    err = capsys.readouterr().err
    assert "xid_lines 6" in err and "dropped.unmapped_pci 1" in err and "LOST input: dropped.unmapped_pci 1" in err
    assert main(["replay", str(out), "--alerts-out", str(alerts), "-q"]) == 0
    fired = {(a["rule"], a["gpu"]): a for a in map(json.loads, alerts.read_text().splitlines())
             if a["state"] == "firing"}
    assert set(fired) == {("gpu_fallen_off_bus", 0), ("gpu_xid_critical", 1), ("gpu_xid_warning", 2),
                          ("hbm_ecc_xid", 3), ("gpu_xid_warning", 4), ("nvlink_nvswitch_sxid", None),
                          ("nvlink_nvswitch_fatal_sxid", None)}
    assert "action: drain the node and restart it" in fired["gpu_fallen_off_bus", 0]["summary"]
    crit = fired["gpu_xid_critical", 1]
    assert "XID 119 GSP_RPC_TIMEOUT (GSP RPC Timeout); action: drain the GPU and reset it" in crit["summary"]
    assert crit["evidence"]["xid_immediate_action"] == "RESET_GPU"
    assert fired["gpu_xid_warning", 2]["evidence"]["xid_action"] == "restart the application"
    assert fired["gpu_xid_warning", 4]["evidence"]["xid_meaning"] == "GPU memory page fault"
    assert "SXid 20034" in fired["nvlink_nvswitch_fatal_sxid", None]["summary"]
    assert not [a for a in map(json.loads, alerts.read_text().splitlines()) if a["rule"] in ("gpu_lost", "telemetry_gap")]


def test_older_driver_layouts_keep_the_pid_and_message_apart(tmp_path):
    from producers.kmsg import KernelLog, Line

    kl = KernelLog(parse_pci_map("0, 00000000:10:00.0\n"), host="n1")
    (r,) = kl.apply(Line(XID_79_R4XX), 1.0)
    assert (val(r, XID), r.labels["xid.pid"], r.labels["xid.message"]) == (79, "0", "GPU has fallen off the bus.")
    assert "xid.process" not in r.labels
    assert kl.apply(Line("NVRM: Xid (PCI:0000:10:00): seventy-nine"), 2.0) == []
    assert kl.stats.summary()["dropped.unparsable_xid"] == 1


def test_dev_kmsg_records_are_read_without_blocking(tmp_path):
    from producers.kmsg import DevKmsgReader

    dev = write(tmp_path, "kmsg", f"3,812,{9_000 * 1_000_000},-;{XID_119}\n SUBSYSTEM=pci\n"
                                  f"4,813,{9_990 * 1_000_000},-;{SXID_NONFATAL}\n")
    now = 1_800_000_000.0
    f = KmsgFollower(DevKmsgReader(str(dev)), parse_pci_map(PCI_MAP), host="n1", clock=lambda: now,
                     boot_time=now - 10_000)
    try:
        recs = f.poll()                       # both lines are from before the follower started: state
        assert {(r.gpu, val(r, XID), val(r, NONFATAL)) for r in recs} == {
            (0, 0, 12028), (1, 119, 12028), (2, 0, 12028), (3, 0, 12028), (4, 0, 12028)}
        assert f.summary()["backlog_events"] == 2 and f.summary()["lines"] == 3
        assert [r for r in f.poll() if r.labels] == []          # nothing new, and read() did not block
    finally:
        f.close()


def test_hostile_lines_cost_only_themselves_and_are_counted(tmp_path):
    huge = "NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * 200_000
    p = write(tmp_path, "dmesg.txt", f"[ 1.000000] {huge}\n[ 2.000000] {XID_13}\n")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=0.0, sample=False)
    assert [(r.gpu, val(r, XID)) for r in src.poll()] == [(2, 13)]
    assert src.summary()["dropped.oversize_line"] == 1 and src.summary()["lines"] == 2
    # An SXid on a host whose PCI map has no GPU has no record to ride on: counted, not lost silently.
    p = write(tmp_path, "sx.txt", f"[ 1.000000] {SXID_FATAL}\n")
    src = KmsgFileSource(str(p), {}, host="n1", boot_time=0.0)
    assert src.poll() == [] and src.summary()["dropped.sxid_without_gpu"] == 1
