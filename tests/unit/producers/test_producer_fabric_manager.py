"""NVIDIA Fabric Manager's log (#34): error lines counted per host, read once or followed across
rotation, and replayed into the NVSwitch rules.

Public lines and their origins:

- leptonai/gpud ``components/accelerator/nvidia/fabric-manager/testdata/fabricmanager.log``
  @ 15b320f7 (an H100 node's log: multicast team setup and release, ``Message payload details``
  continuation lines, and ``[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch
  non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61``);
- gpud's ``log_matcher.go`` examples (``detected NVSwitch fatal error 20034 ... port 33``,
  ``failed to find the GPU handle ... in the multicast team request setup ...``) and its sxid
  README (``detected number of NVSwitches don't match with any supported system topology``);
- a public NMX-C fabric-log analyser's documentation ("NMX-C Directory Structure", GitHub code
  search): ``[Jul 19 2025 18:34:57] [WARNING] [tid 134] Trunk port failure detected for switch
  GUID ...`` and the multi-line ``Fabric Manager detected GPU NVL Non Fatal error on :``.
"""

from __future__ import annotations

import json
import math
import os
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.catalog import FIELDS
from producers.fabric_manager import FIELDS as COUNTERS
from producers.fabric_manager import FabricManagerLog, FileFollower, classify, parse_fm_line
from producers.kmsg import LINE_MAX, KmsgFileSource, KmsgFollower, parse_pci_map
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import PCI_MAP, write

FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

GPUD_LOG = """\
[Feb 27 2025 14:08:27] [INFO] [tid 1808] multicast group 0 is allocated.
[Feb 27 2025 14:08:27] [INFO] [tid 1808] successfully setup multicast team for request id 3579535742760719133.
[Feb 27 2025 14:08:27] [INFO] [tid 1584] Sending inband response message:  Message header details: magic Id:adbc request Id:31ad10caf811131d status:0 type:3 length:24
Message payload details:Team setup response: Team Handle:93c7f931b6570d8d Flags:0 Address Base:c000000000000 Address Size:60000000

[Feb 27 2025 14:10:02] [INFO] [tid 1808] multicast group 1 is allocated.
[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61

"""
FATAL = ("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus "
         "id 00000000:86:00.0 physical id 3 port 33")
NONFATAL = ("[Jul 09 2024 18:14:07] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch "
            "pci bus id 00000000:86:00.0 physical id 3 port 61")
MULTICAST = ("[Sep 17 2024 06:01:46] [ERROR] [tid 1230079] failed to find the GPU handle 5410063385821516767 in the "
             "multicast team request setup 6130285411925746235.")
TRUNK = ("[Jul 19 2025 18:34:57] [WARNING] [tid 134] Trunk port failure detected for switch GUID 0xb0cf0e0300e42e00 "
         "and switch chassis sn 1825124190179, slot 7 port number 61 port GUID 0xb0cf0e0300e42e00 cage 7.")
GPU_NVL = "[Jul 19 2025 18:34:55] [ERROR] [tid 192] Fabric Manager detected GPU NVL Non Fatal error on :"
GPU_NVL_DETAIL = ["moduleId : 1", "nodeId : 6", "portNum : 61", "errorCode : 0x02"]
TOPOLOGY = ("[Jul 23 2024 07:50:01] [ERROR] [tid 812] detected number of NVSwitches don't match with any supported "
            "system topology, aborting fabric manager")


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


def test_each_error_message_moves_its_counter_and_info_lines_none():
    kinds = {ln: classify(parse_fm_line(ln).msg) for ln in (FATAL, NONFATAL, MULTICAST, TRUNK, GPU_NVL, TOPOLOGY)}
    assert {ln: k[0] for ln, k in kinds.items()} == {
        FATAL: "fm_nvswitch_fatal_errors", NONFATAL: "fm_nvswitch_nonfatal_errors", MULTICAST: "fm_nvlink_errors",
        TRUNK: "fm_nvlink_errors", GPU_NVL: "fm_nvlink_errors", TOPOLOGY: "fm_errors"}
    assert kinds[FATAL][1] == {
        "fm.level": "ERROR", "fm.sxid": "20034", "fm.nvswitch_pci": "00000000:86:00.0", "fm.nvswitch_phys": "3",
        "fm.nvswitch_port": "33",
        "fm.message": FATAL.split("] ", 3)[3]}
    infos = [ln for ln in GPUD_LOG.splitlines() if "[INFO]" in ln]
    assert infos and all(classify(parse_fm_line(ln).msg) is None for ln in infos)
    assert all(parse_fm_line(ln) is None for ln in GPU_NVL_DETAIL + ["", "Message payload details:Team"])


def test_a_saved_log_counts_its_errors_on_every_gpu_with_a_baseline(tmp_path):
    text = GPUD_LOG + "\n".join([FATAL.replace("Jul 23 2024 07:53:55", "Feb 27 2025 15:11:00"), GPU_NVL.replace(
        "Jul 19 2025 18:34:55", "Feb 27 2025 15:12:00"), *GPU_NVL_DETAIL]) + "\n"
    p = write(tmp_path, "fabricmanager.log", text)
    pci = parse_pci_map(PCI_MAP)
    src = KmsgFileSource(str(p), pci, host="n1", interval_s=10, log=FabricManagerLog(pci, host="n1"),
                         parse=parse_fm_line)
    recs = src.poll()
    t_err = time.mktime(time.strptime("Feb 27 2025 15:10:02", "%b %d %Y %H:%M:%S"))
    first = min(r.ts for r in recs)
    assert first == t_err - 10 and {val(r, "fm_nvswitch_nonfatal_errors") for r in recs if r.ts == first} == {0}
    last = [r for r in recs if r.ts == max(x.ts for x in recs)]
    assert {r.gpu for r in last} == {0, 1, 2, 3, 4}
    assert {tuple(val(r, k) for k in COUNTERS) for r in last} == {(1, 1, 1, 0)}
    labelled = [r for r in recs if r.gpu == 0 and "fm.message" in r.labels]
    assert [r.labels.get("fm.sxid") for r in labelled] == ["12028", "20034", None]
    s = src.summary()
    assert s["error_lines"] == 3 and s["lines"] == len(text.splitlines()) and s["dropped.bad_timestamp"] == 0


def test_a_bad_date_costs_its_line(tmp_path):
    lines = [FATAL.replace("Jul 23 2024", "Feb 30 2025"), FATAL.replace("07:53:55", "07:٥3:55"), NONFATAL]
    p = write(tmp_path, "fabricmanager.log", "\n".join(lines) + "\n")
    pci = parse_pci_map(PCI_MAP)
    src = KmsgFileSource(str(p), pci, host="n1", sample=False, log=FabricManagerLog(pci, host="n1"), parse=parse_fm_line)
    recs = src.poll()
    assert {val(r, "fm_nvswitch_nonfatal_errors") for r in recs if r.labels} == {1}
    assert src.summary()["dropped.bad_timestamp"] == 2


def test_the_follower_reads_appended_lines_across_rotation_and_truncation(tmp_path):
    path = tmp_path / "fabricmanager.log"
    rd = FileFollower(str(path))
    assert rd.read() == []                              # Fabric Manager not started yet
    path.write_text("[Jul 09 2024 18:14:00] [INFO] [tid 1] start\n[Jul 09 2024 18:14:01] [INFO] [tid 1] par")
    assert rd.read() == ["[Jul 09 2024 18:14:00] [INFO] [tid 1] start"]   # a partial line waits
    with path.open("a") as fh:
        fh.write("tial\n" + NONFATAL + "\n")
    assert rd.read() == ["[Jul 09 2024 18:14:01] [INFO] [tid 1] partial", NONFATAL]
    os.rename(path, tmp_path / "fabricmanager.log.1")   # logrotate: a new file under the name
    path.write_text(FATAL + "\n")
    assert rd.read() == [FATAL]
    path.write_text("")                                 # copytruncate
    assert rd.read() == []
    path.write_text(MULTICAST + "\n")
    assert rd.read() == [MULTICAST]
    with path.open("a") as fh:
        fh.write("x" * (LINE_MAX + 10) + "\n" + TRUNK + "\n")
    got = []
    for _ in range(3):
        got += rd.read()
    assert got == [TRUNK] and rd.stats.oversize == 1
    rd.close()


def test_a_follower_folds_the_backlog_then_counts_new_errors(tmp_path):
    path = tmp_path / "fabricmanager.log"
    path.write_text(FATAL + "\n")                        # 2024: before the producer started
    pci = parse_pci_map(PCI_MAP)
    now = [time.time()]
    f = KmsgFollower(FileFollower(str(path)), pci, host="n1", clock=lambda: now[0], log=FabricManagerLog(pci, host="n1"),
                     parse=parse_fm_line)
    assert {val(r, "fm_nvswitch_fatal_errors") for r in f.poll()} == {0}
    assert f.summary()["backlog_events"] == 1
    now[0] += 10
    stamp = time.strftime("%b %d %Y %H:%M:%S", time.localtime(now[0] - 5))
    with path.open("a") as fh:
        fh.write(FATAL.replace("Jul 23 2024 07:53:55", stamp) + "\n")
    recs = f.poll()
    assert {val(r, "fm_nvswitch_fatal_errors") for r in recs} == {1} and any(r.labels for r in recs)
    f.close()


def test_produce_fabric_manager_then_replay_raises_the_fabric_manager_alerts(tmp_path, capsys):
    from pipeline.cli import main

    stamps = [f"Jul 23 2024 08:{m:02d}:00" for m in range(0, 10)]
    lines = [GPUD_LOG.splitlines()[0].replace("Feb 27 2025 14:08:27", stamps[0])]
    lines += [NONFATAL.replace("Jul 09 2024 18:14:07", s) for s in stamps[1:4]]
    lines += [FATAL.replace("Jul 23 2024 07:53:55", stamps[4]), TRUNK.replace("Jul 19 2025 18:34:57", stamps[5]),
              TOPOLOGY.replace("Jul 23 2024 07:50:01", stamps[6])]
    log = write(tmp_path, "fabricmanager.log", "\n".join(lines) + "\n")
    pci = write(tmp_path, "pci.csv", PCI_MAP)
    out, alerts = tmp_path / "fm.jsonl", tmp_path / "alerts.jsonl"
    assert main(["produce", "fabric-manager", "--file", str(log), "--pci-map", str(pci), "--host", "n1",
                 "--out", str(out), "--interval", "10"]) == 0
    assert "error_lines 6" in capsys.readouterr().err
    assert main(["replay", str(out), "--alerts-out", str(alerts), "-q"]) == 0
    fired = {a["rule"] for a in map(json.loads, alerts.read_text().splitlines()) if a["state"] == "firing"}
    assert fired == {"nvlink_fm_nvswitch_fatal", "nvlink_fm_nvswitch_error_rate", "nvlink_fm_nvlink_failure",
                     "nvlink_fm_error"}


def test_produce_fabric_manager_wants_one_source(capsys):
    from pipeline.cli import main

    assert main(["produce", "fabric-manager", "--out", "-"]) == 2
    assert "exactly one of --file FILE or --follow" in capsys.readouterr().err


FM_PIECES = st.sampled_from([
    "[Jul 23 2024 07:53:55] ", "[Feb 29 2025 07:53:55] ", "[ERROR] ", "[INFO] ", "[tid 1] ", "[tid x] ",
    "detected NVSwitch fatal error ", "detected NVSwitch non-fatal error ", "9" * 30, "٣", "NVLink training failed",
    " pci bus id ", " physical id ", " port ", "\x00", "[", "]",
])
FM_LINES = st.lists(st.one_of(st.text(max_size=120), st.lists(FM_PIECES, max_size=10).map("".join)), max_size=30)


@FUZZ
@given(FM_LINES)
def test_any_line_is_a_line_a_continuation_or_a_counted_drop(lines):
    for ln in lines:
        got = parse_fm_line(ln)
        if got is None or got.error is not None:
            continue
        kind = classify(got.msg)
        assert kind is None or (kind[0] in COUNTERS and all(len(v) <= 200 for v in kind[1].values()))


@FUZZ
@given(FM_LINES)
def test_a_saved_log_of_hostile_lines_still_counts_the_good_ones(tmp_path_factory, lines):
    tmp = tmp_path_factory.mktemp("fm")
    body = [ln.replace("\n", " ").replace("\r", " ") for ln in lines]
    p = write(tmp, "fabricmanager.log", "\n".join([FATAL, *body, NONFATAL]) + "\n")
    pci = parse_pci_map(PCI_MAP)
    src = KmsgFileSource(str(p), pci, host="n1", sample=False, log=FabricManagerLog(pci, host="n1"), parse=parse_fm_line)
    recs = src.poll()
    last = max(recs, key=lambda r: r.ts)
    assert val(last, "fm_nvswitch_fatal_errors") >= 1 and val(last, "fm_nvswitch_nonfatal_errors") >= 1


@FUZZ
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=60), max_size=20),
       st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=10))
def test_the_follower_returns_the_same_lines_however_the_writes_are_cut(tmp_path_factory, lines, cuts):
    tmp = tmp_path_factory.mktemp("ff")
    path = tmp / "fabricmanager.log"
    data = "".join(ln + "\n" for ln in lines).encode()
    rd = FileFollower(str(path), read_max=13)            # reads smaller than the writes, too
    got: list[str] = []
    pos, i = 0, 0
    with path.open("wb") as fh:
        while pos < len(data):
            step = cuts[i % len(cuts)]
            fh.write(data[pos:pos + step])
            fh.flush()
            pos, i = pos + step, i + 1
            got += rd.read()
    for _ in range(len(data) // 13 + 2):
        got += rd.read()
    rd.close()
    assert got == lines


def test_an_error_stamped_in_the_second_the_follower_started_is_news(tmp_path):
    """Fabric Manager stamps whole seconds: an error written just after the producer started,
    in the same second, carries a time before the start's (10:00:05 < 10:00:05.7) and was folded
    into the backlog as old, never counted."""
    path = tmp_path / "fabricmanager.log"
    path.write_text("")
    pci = parse_pci_map(PCI_MAP)
    start = float(int(time.time()) - 60) + 0.7
    now = [start]
    f = KmsgFollower(FileFollower(str(path)), pci, host="n1", clock=lambda: now[0], log=FabricManagerLog(pci, host="n1"),
                     parse=parse_fm_line)
    f.poll()
    now[0] += 0.2
    stamp = time.strftime("%b %d %Y %H:%M:%S", time.localtime(start))
    with path.open("a") as fh:
        fh.write(FATAL.replace("Jul 23 2024 07:53:55", stamp) + "\n")
    recs = f.poll()
    assert {val(r, "fm_nvswitch_fatal_errors") for r in recs} == {1} and f.summary()["backlog_events"] == 0
    f.close()


def test_a_finer_time_just_before_the_start_is_still_backlog():
    """Only a whole-second stamp of the start's second is taken as news: a kernel line stamped to
    the microsecond 0.3 s before the start was sent before (a quick restart would send it again)."""
    from producers.kmsg_input import Line

    pci = parse_pci_map(PCI_MAP)
    start = float(int(time.time()) - 60) + 0.7

    class Lines:
        stats = None

        def __init__(self, ts):
            self.ts = ts

        def read(self):
            out, self.ts = ([] if self.ts is None else ["x"]), None
            return out

        def close(self):
            pass

    for ts, backlog in ((start - 0.3, 1), (math.floor(start), 0)):
        xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
        f = KmsgFollower(Lines(ts), pci, host="n1", clock=lambda: start, parse=lambda _t, ts=ts: Line(xid, ts=ts))
        f.poll()
        assert f.summary()["backlog_events"] == backlog, ts
