"""A process killed by a fatal fault in NCCL's code, read from the kernel log: counted per host as
``nccl_crashes`` (catalogue field 9519) and alerted on by ``nccl_process_crash``
(rules/kernel_log.yaml); an NVSwitch fault explains it (rules/incidents.yaml).

Every line below is built from a format string of the kernel (torvalds/linux, read in the public
mirrors and patches of the code corpus), with GPUd's example line
(``components/accelerator/nvidia/nccl``, ``RegexSegfaultInLibnccl``):

- ``arch/x86/mm/fault.c``, ``show_signal_msg()``: ``"%s%s[%d]: segfault at %lx ip %px sp %px error
  %lx"``, then ``print_vma_addr(KERN_CONT " in ", regs->ip)`` (``<file>[<start>+<size>]``, the
  mapping's file name) and since 6.2 ``" likely on CPU %d (core %d, socket %d)"``; current
  kernels print ``%pD[%lx,%lx+%lx]``: the offset in the file, then start+size
  (test_producer_kmsg_crash_layouts.py).
- ``arch/x86/kernel/traps.c`` (``pr_fmt`` ``"traps: "``): ``"%s[%d] general protection ip:%lx
  sp:%lx error:%lx"`` (``general protection fault`` in older kernels) and ``do_trap()``'s ``"%s[%d]
  trap %s ip:%lx sp:%lx error:%lx"``, each followed by `` in <file>[...]``.
- ``arch/x86/kernel/cet.c`` (6.6+, user shadow stacks), ``do_user_cp_fault()``: ``"%s[%d] control
  protection ip:%lx sp:%lx ssp:%lx error:%lx(%s)%s"`` (the kind, `` in enclave``), then `` in <file>[...]``.
- ``arch/arm64/kernel/traps.c``, ``arm64_show_signal()``: ``"%s[%d]: unhandled exception: "``,
  ``"%s, ESR 0x%016lx, "`` and the reason, then `` in <file>[...]`` (Grace hosts).
"""

from __future__ import annotations

import pytest

from pipeline.catalog import FIELDS
from pipeline.incidents import IncidentStage, default_config
from pipeline.schema import AlertEvent
from producers.kmsg import KmsgFileSource, parse_pci_map
from producers.kmsg_fabric import FabricEvents
from tests.unit.producers.kmsg_factories import PCI_MAP, dmesg, produce_and_replay, val, write

GPUD = (
    "pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 "
    "in libnccl.so.2[7f7c7ac00000+d3d3000]"
)
LIKELY_CPU = (
    "python3[88121]: segfault at 0 ip 00007f2a4c1e0b1d sp 00007f29f3ffe9c0 error 6 in "
    "libnccl.so.2.21.5[7f2a4c000000+d3d3000] likely on CPU 12 (core 6, socket 0)"
)
GP_OLD = (
    "traps: all_reduce_perf[4410] general protection fault ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 error:0 "
    "in libnccl.so.2[7f2a4c000000+d3d3000]"
)
GP = "traps: python[4411] general protection ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 error:0 in libnccl-net.so[7f2a4c000000+4d000]"
TRAP = "traps: python[4412] trap invalid opcode ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 error:0 in libnccl.so.2[7f2a4c000000+d3d3000]"
CONTROL = (
    "python[4414] control protection ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 ssp:7f2a3bfff000 error:1(near ret) "
    "in libnccl.so.2.21.5[1e0b1d,7f2a4c000000+d3d3000]"
)
ARM64 = (
    "pt_main_thread[9902]: unhandled exception: DABT (lower EL), ESR 0x0000000092000006, level 2 translation "
    "fault in libnccl.so.2[ffff8a000000+d3d3000]"
)
# A fault in another library or in the program, a line cut before its mapping, NCCL named elsewhere.
LIBC = "python3[88122]: segfault at 0 ip 00007f2a4c1e0b1d sp 00007f29f3ffe9c0 error 4 in libc.so.6[7f2a4c000000+195000]"
PROGRAM = "all_reduce_perf[4413]: segfault at 8 ip 000055d0c1a2b3c4 sp 00007ffd5a3c1e80 error 4 in all_reduce_perf[55d0c1a00000+40000]"
CUT = "python3[88123]: segfault at 0 ip 00007f2a4c1e0b1d sp 00007f29f3ffe9c0 error 4 in libnccl.so.2[7f2a4c0"
NO_MAPPING = "python3[88124]: segfault at 0 ip 0000000000000000 sp 00007f29f3ffe9c0 error 14"
NOT_A_FAULT = "audit: type=1400 apparmor=\"DENIED\" operation=\"open\" name=\"/usr/lib/libnccl.so.2[1+2]\" pid=7"


def counted(*lines: str) -> int:
    ev = FabricEvents()
    for ln in lines:
        ev.apply("n1", ln)
    return ev.counts("n1")["nccl_crashes"]


@pytest.mark.parametrize(
    "line, labels",
    [
        (GPUD, {"nccl.process": "pt_main_thread", "nccl.pid": "2536443", "nccl.library": "libnccl.so.2",
                "nccl.fault": "segfault"}),
        (LIKELY_CPU, {"nccl.process": "python3", "nccl.library": "libnccl.so.2.21.5", "nccl.fault": "segfault"}),
        (GP_OLD, {"nccl.process": "all_reduce_perf", "nccl.pid": "4410", "nccl.fault": "general protection"}),
        (GP, {"nccl.library": "libnccl-net.so", "nccl.fault": "general protection"}),
        (TRAP, {"nccl.pid": "4412", "nccl.fault": "trap invalid opcode"}),
        (ARM64, {"nccl.process": "pt_main_thread", "nccl.fault": "unhandled exception"}),
        (CONTROL, {"nccl.process": "python", "nccl.pid": "4414", "nccl.library": "libnccl.so.2.21.5",
                   "nccl.fault": "control protection"}),
    ],
)
def test_every_layout_counts_one_crash_with_its_process(line, labels):
    ev = FabricEvents()
    assert ev.wants(line)
    got = ev.apply("n1", line)
    assert got is not None and {k: got[k] for k in labels} == labels and got["nccl.message"] == line
    assert ev.counts("n1")["nccl_crashes"] == 1 and sum(ev.counts("n1").values()) == 1


@pytest.mark.parametrize("line", [LIBC, PROGRAM, CUT, NO_MAPPING, NOT_A_FAULT])
def test_a_fault_outside_nccl_or_a_cut_line_counts_nothing(line):
    assert counted(line) == 0


def test_each_line_is_a_process_and_hosts_count_apart():
    ev = FabricEvents()
    for ln in (GPUD, LIKELY_CPU, GP):  # three ranks of one job
        ev.apply("n1", ln)
    ev.apply("n2", ARM64)
    assert ev.counts("n1")["nccl_crashes"] == 3 and ev.counts("n2")["nccl_crashes"] == 1


def test_hostile_lines_are_bounded_and_count_nothing():
    long_comm = "x" * 5000 + "[1]: segfault at 0 ip 0 sp 0 error 4 in libnccl.so.2[1+2]"
    many = "p[1]: segfault " + " in libnccl" * 20_000  # no mapping after any of them
    assert counted(long_comm, many, "[1]: segfault in libnccl.so.2[1+2]", "\x00" * 100 + GPUD[:40]) == 0


def test_a_saved_log_carries_the_count_on_every_gpu(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg([GPUD, LIBC, LIKELY_CPU]))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=1_800_000_000.0, interval_s=10)
    recs = src.poll()
    last = [r for r in recs if r.ts == max(x.ts for x in recs)]
    assert {val(r, FIELDS.by_alias("nccl_crashes")) for r in last} == {2} and {r.gpu for r in last} == {0, 1, 2, 3, 4}
    assert src.summary()["fabric_lines"] == 2


def test_produce_then_replay_raises_the_nccl_crash(tmp_path, capsys):
    summary, got = produce_and_replay(tmp_path, [LIBC, GPUD, GP_OLD], 30.0, capsys)
    assert "fabric_lines 2" in summary
    assert {(a["rule"], a["host"], a["severity"]) for a in got} == {("nccl_process_crash", "n1", "warning")}


def test_an_nvswitch_fault_explains_the_crash_it_causes():
    stage = IncidentStage(default_config())

    def alert(rule, fault, severity, t):
        return AlertEvent(id=rule, state="firing", fault=fault, severity=severity, rule=rule, host="n1",
                          gpu=None, ts=1_800_000_000.0 + t, started_at=1_800_000_000.0 + t)

    events = stage.process([alert("nvlink_nvswitch_fatal_sxid", "nvswitch_fatal", "critical", 0),
                            alert("nccl_process_crash", "nccl_process_crash", "warning", 20)])
    assert [e.state for e in events] == ["opened", "updated"] and events[-1].members == [
        "nvlink_nvswitch_fatal_sxid", "nccl_process_crash"]


def test_the_field_takes_a_column_after_every_older_one():
    # An engine snapshot restores its columns by position, padding new ones at the end
    # (pipeline/engine/state.py): a field added later must not move an older one's column.
    new = FIELDS.by_alias("nccl_crashes")
    assert new.field_id == 9519 and new.kind == "counter" and new.names == ("GPUWARDEN_KMSG_NCCL_CRASHES",)
    assert new.column > FIELDS.by_alias("nic_driver_warnings").column
