"""The kernel log's NCCL crash lines in every mapping format and log layout that prints them, and
the 5 s window that pairs a firmware-first report's two printings.

Kernel sources (torvalds/linux, read in the code corpus):

- ``mm/memory.c``, ``print_vma_addr()``: older kernels ``printk("%s%s[%lx+%lx]", prefix, p, ...)``
  with ``p`` the basename of ``d_path()``, which ends in `` (deleted)`` for a file unlinked or
  replaced since it was mapped (a library upgraded under a running job); current kernels
  ``printk("%s%pD[%lx,%lx+%lx]", prefix, f, ip, vma->vm_start, vma->vm_end - vma->vm_start)``:
  the faulting instruction's offset in the file, a comma, then the mapping as before.
- ``arch/x86/mm/fault.c`` ``show_signal_msg()``, ``arch/x86/kernel/traps.c`` ``show_signal()``,
  ``arch/arm64/kernel/traps.c`` ``arm64_show_signal()``: ``tsk->comm`` is printed with ``%s``, any
  bytes a task named itself (``prctl(PR_SET_NAME)``): NCCL names its threads ``NCCL Service %2d``
  / ``NCCL Progress%2d``, setproctitle ``ray::RayTrainWorker``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.kmsg import KmsgFileSource, KmsgFollower, parse_line, parse_pci_map
from producers.kmsg_fabric import MAX_CPER, MAX_UNPAIRED, PAIR_WINDOW, FabricEvents, _Host
from tests.factories import fuzz_examples
from tests.unit.producers.kmsg_factories import PCI_MAP, FakeReader, dmesg, lkml_print, lkml_record, write

SEG = "python3[88121]: segfault at 0 ip 00007f2a4c1e0b1d sp 00007f29f3ffe9c0 error 6 in "
# The mapping as current kernels print it: offset of the instruction in the file, then start+size.
NEW_SEG = SEG + "libnccl.so.2.21.5[1e0b1d,7f2a4c000000+d3d3000] likely on CPU 12 (core 6, socket 0)"
NEW_GP = (
    "traps: python[4411] general protection fault ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 error:0 in "
    "libnccl-net.so[1e0b1d,7f2a4c000000+4d000]"
)
NEW_TRAP = (
    "traps: python[4412] trap invalid opcode ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 error:0 in "
    "libnccl.so.2[1e0b1d,7f2a4c000000+d3d3000]"
)
NEW_ARM64 = (
    "pt_main_thread[9902]: unhandled exception: DABT (lower EL), ESR 0x0000000092000006, level 2 "
    "translation fault in libnccl.so.2[69996,ffff8a000000+d3d3000]"
)
# arch/x86/kernel/cet.c (6.6+): a shadow-stack violation, no pr_fmt and no ": " before the mapping.
NEW_CONTROL = (
    "python[4414] control protection ip:7f2a4c1e0b1d sp:7ffd5a3c1e80 ssp:7f2a3bfff000 error:1(near ret) in "
    "libnccl.so.2[1e0b1d,7f2a4c000000+d3d3000]"
)
DELETED = SEG + "libnccl.so.2 (deleted)[7f2a4c000000+d3d3000]"


def crash(line: str) -> dict[str, str] | None:
    ev = FabricEvents()
    got = ev.apply("n1", line) if ev.wants(line) else None
    assert ev.counts("n1")["nccl_crashes"] == (got is not None)
    return got


@pytest.mark.parametrize(
    "line, lib",
    [
        (NEW_SEG, "libnccl.so.2.21.5"),
        (NEW_GP, "libnccl-net.so"),
        (NEW_TRAP, "libnccl.so.2"),
        (NEW_ARM64, "libnccl.so.2"),
    ],
)
def test_current_kernels_mapping_with_the_instruction_offset_counts(line, lib):
    # Before: "[<start>+<size>]" only, so no crash of a current kernel was ever counted.
    got = crash(line)
    assert got is not None and got["nccl.library"] == lib


# A current kernel's segfault line as a user posted it (eden-emulator/Releases#16, 2025).
EDEN = (
    "nvservices[1333]: segfault at 9 ip 00007fa7793e8d30 sp 00007f2435ffb7f0 error 6 in "
    "eden[7e8d30,7fa778d24000+13ba000] likely on CPU 6 (core 2, socket 0)"
)


def test_a_real_current_kernel_line_counts_only_when_its_mapping_is_nccls():
    assert crash(EDEN) is None
    got = crash(EDEN.replace("in eden[", "in libnccl.so.2[", 1))
    assert got is not None and (got["nccl.process"], got["nccl.pid"]) == ("nvservices", "1333")


def test_a_library_replaced_since_it_was_mapped_counts():
    got = crash(DELETED)
    assert got is not None and got["nccl.library"] == "libnccl.so.2" and got["nccl.process"] == "python3"


@pytest.mark.parametrize("comm", ["[pt_main]", "job[3]", "NCCL Service  0", "NCCL Progress 7", "ray::RayTrainWo", "a"])
def test_any_comm_a_task_may_take_counts_with_its_pid(comm):
    # Before: a comm holding "[" or "]" (prctl(PR_SET_NAME) takes any bytes) counted nothing.
    got = crash(f"{comm}[4242]: segfault at 0 ip 0 sp 0 error 6 in libnccl.so.2[7f+d]")
    assert got is not None and got["nccl.process"] == comm.strip() and got["nccl.pid"] == "4242"


@pytest.mark.parametrize(
    "line",
    [
        SEG + "libc.so.6[28a1d,7f2a4c000000+195000] likely on CPU 1 (core 1, socket 0)",
        SEG + "libc.so.6 (deleted)[7f2a4c000000+195000]",
        SEG + "libnccl.so.2[1e0b1d,7f2a4c0",  # cut inside the mapping
        SEG + "libnccl.so.2[,7f2a4c000000+d3d3000]",
        "[4242]: segfault at 0 ip 0 sp 0 error 6 in libnccl.so.2[7f+d]",  # no comm at all
        "x" * 100 + "[1]: segfault at 0 ip 0 sp 0 error 6 in libnccl.so.2[7f+d]",
    ],
)
def test_other_mappings_and_broken_lines_still_count_nothing(line):
    assert crash(line) is None


_COMM = st.text(st.sampled_from("abcXYZ019 _-.:/[]()#@"), min_size=1, max_size=15).filter(
    lambda c: c.strip() == c and "segfault" not in c
)
_MAPPING = st.sampled_from(["[7f2a4c000000+d3d3000]", "[1e0b1d,7f2a4c000000+d3d3000]", " (deleted)[7f+1000]"])
_LIB = st.sampled_from(["libnccl.so.2", "libnccl.so.2.21.5", "libnccl-net.so", "libnccl-net-ofi.so"])


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(comm=_COMM, pid=st.integers(1, 4_194_304), lib=_LIB, mapping=_MAPPING, traps=st.booleans(), cpu=st.booleans())
def test_every_comm_library_and_mapping_layout_counts_one_crash(comm, pid, lib, mapping, traps, cpu):
    if traps:
        line = f"traps: {comm}[{pid}] general protection fault ip:7f sp:7f error:0 in {lib}{mapping}"
    else:
        line = f"{comm}[{pid}]: segfault at 0 ip 00007f2a sp 00007f29 error 4 in {lib}{mapping}"
    line += " likely on CPU 3 (core 3, socket 0)" if cpu else ""
    got = crash(line)
    assert got is not None and (got["nccl.process"], got["nccl.pid"], got["nccl.library"]) == (comm, str(pid), lib)
    assert crash(line.replace(lib, "libc.so.6")) is None


LAYOUTS = {
    "dmesg": "[ 5678.901000] {m}",
    "dmesg caller": "[ 5678.901000] [T88121] {m}",
    "dmesg -T": "[Mon Dec  7 07:00:00 2026] {m}",
    "dmesg -x": "kern  :info  : [ 5678.901000] {m}",
    "/dev/kmsg": "6,1234,5678901000,-;{m}",
    "/dev/kmsg caller": "6,1234,5678901000,-,caller=T88121;{m}",
    "journal short": "Dec 07 07:00:00 node1 kernel: {m}",
    "journal no-hostname": "Dec 07 07:00:00 kernel: {m}",
    "rsyslog kern.log": "Dec  7 07:00:00 node1 kernel: [ 5678.901000] {m}",
    "short-iso": "2026-12-07T07:00:00+0000 node1 kernel: {m}",
    "short-iso-precise": "2026-12-07T07:00:00.123456+00:00 node1 kernel: {m}",
    "short-unix": "1800000000.123456 node1 kernel: {m}",
    "short-full": "Mon 2026-12-07 07:00:00 UTC node1 kernel: {m}",
    "short-monotonic": "[ 5678.901000] node1 kernel: {m}",
    "cat": "{m}",
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(
    "msg", [NEW_SEG, NEW_GP, NEW_CONTROL, "NCCL Service  0[7]: segfault at 0 ip 0 sp 0 error 6 in libnccl.so.2[7f+d]"]
)
def test_every_layout_hands_the_line_over_with_the_comm_first(layout, msg):
    ln = parse_line(LAYOUTS[layout].format(m=msg), year=2026)
    assert ln is not None and ln.msg == msg and crash(ln.msg) is not None


def test_a_journal_export_hands_the_line_over_whole():
    entry = {"__REALTIME_TIMESTAMP": "1800000000000000", "_TRANSPORT": "kernel", "_HOSTNAME": "n1", "MESSAGE": NEW_SEG}
    ln = parse_line(json.dumps(entry))
    assert ln is not None and ln.msg == NEW_SEG and ln.host == "n1" and crash(ln.msg) is not None


def test_dmesg_iso_time_keeps_a_message_that_starts_with_a_comm_and_pid():
    ln = parse_line(f"2026-12-07T07:00:00,123456+00:00 {NEW_SEG}")
    assert ln is not None and ln.msg == NEW_SEG


@pytest.mark.parametrize("text", [f"2026-12-07T07:00:00,123456+00:00 [  T88121] {NEW_SEG}", f"[  T88121] {NEW_SEG}"])
def test_dmesg_iso_or_untimed_with_the_caller_id_hands_over_the_message(text):
    ln = parse_line(text)
    assert ln is not None and ln.msg == NEW_SEG


def _cper(seq: int, bdf: str) -> list[str]:
    return lkml_record(seq, bdf, "nvidia")[0]


def _print(bdf: str) -> list[str]:
    return lkml_print(bdf, "nvidia")


BDF = "0000:3b:00.0"  # GPU 0 of PCI_MAP


@pytest.mark.parametrize("gap_s, reports", [(0.003, 1), (PAIR_WINDOW / 2, 1), (3600.0, 2)])
def test_the_live_follower_pairs_by_the_kernels_boot_relative_time(gap_s, reports):
    # /dev/kmsg stamps records in microseconds since boot; the follower places them on the wall
    # clock at its boot time, so two printings keep their true distance.
    r = FakeReader()
    now = [1_800_000_000.0]
    f = KmsgFollower(r, parse_pci_map(PCI_MAP), host="n1", clock=lambda: now[0], boot_time=now[0] - 10_000)
    f.poll()  # nothing in the ring buffer
    t0 = 10_001_000_000
    cper = [f"3,{i},{t0 + i},-;{m}" for i, m in enumerate(_cper(1, BDF))]
    late = t0 + round(gap_s * 1e6)
    printed = [f"3,{100 + i},{late + i},-;{m}" for i, m in enumerate(_print(BDF))]
    r.batches = [cper + printed]
    now[0] += 3700
    f.poll()
    assert f.log.fabric.counts("n1")["pcie_aer_log_correctable"] == reports


@pytest.mark.parametrize("step, reports", [(0.001, 1), (3600.0, 2)])
def test_a_saved_dmesg_pairs_by_its_times(tmp_path, step, reports):
    # The record, then its print ``step`` seconds later, per line (dmesg's boot-relative times).
    stamped = [f"[{1000.0 + i * 0.0001:12.6f}] {m}" for i, m in enumerate(_cper(1, BDF))]
    stamped += [f"[{1000.0 + step + i * 0.0001:12.6f}] {m}" for i, m in enumerate(_print(BDF))]
    p = write(tmp_path, "dmesg.txt", "\n".join(stamped) + "\n")
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=1_800_000_000.0, sample=False)
    src.poll()
    assert src.log.fabric.counts("n1")["pcie_aer_log_correctable"] == reports


def test_nccl_crash_lines_in_a_saved_dmesg_count_with_the_current_kernels_layout(tmp_path):
    p = write(tmp_path, "dmesg.txt", dmesg([NEW_SEG, NEW_ARM64, DELETED, NEW_CONTROL]))
    src = KmsgFileSource(str(p), parse_pci_map(PCI_MAP), host="n1", boot_time=1_800_000_000.0, sample=False)
    src.poll()
    assert src.log.fabric.counts("n1")["nccl_crashes"] == 4 and src.summary()["fabric_lines"] == 4


_KEYS = [(f"0000:{b:02x}:00.0", c) for b in range(40) for c in ("cor", "unc")]


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(_KEYS), st.sampled_from([1, -1]), st.none() | st.floats(0, 1e5)), max_size=200
    )
)
def test_pairing_state_stays_bounded_and_its_times_name_only_kept_entries(calls):
    h = _Host()
    for key, kind, ts in calls:
        h.pair(key, kind, ts)
        assert len(h.unpaired) <= MAX_CPER and set(h.unpaired_at) <= set(h.unpaired)
        assert all(0 < abs(n) <= MAX_UNPAIRED for n in h.unpaired.values())


def test_a_stale_half_of_either_kind_never_takes_a_later_printing():
    for first in (1, -1):
        h = _Host()
        key = (BDF, "cor")
        assert h.pair(key, first, 100.0) is False
        assert h.pair(key, -first, 100.0 + PAIR_WINDOW + 0.001) is False  # stale: counts itself
        assert h.pair(key, first, 100.0 + PAIR_WINDOW + 0.002) is True  # pairs with the fresh one
