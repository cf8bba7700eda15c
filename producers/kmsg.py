"""The kernel log as a telemetry source: XIDs (``NVRM: Xid``) and NVSwitch SXids, and (through
``producers/kmsg_fabric.py``) the NIC and PCIe AER lines, counted per host.

Most XIDs reach operators through the kernel log, whether or not DCGM runs. The driver prints
(open-gpu-kernel-modules, ``src/nvidia/src/kernel/gpu/rc/kernel_rc.c`` and
``src/common/nvswitch/kernel/inc/common_nvswitch.h``)::

    NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x): %d, <message>                 (no process to blame)
    nvidia-<switch>: SXid (PCI:%04x:%02x:%02x.%x): %05d, <Fatal|Non-fatal>, <message>
    nvidia-<switch>: SXid (PCI:...): %05d, Severity %d Engine instance %02d Sub-engine instance %02d
    nvidia-<switch>: SXid (PCI:...): %05d, Data {0x%08x, ...}         (the same event's detail)

and drivers before R4xx wrote ``NVRM: Xid (0000:03:00): 14, ...`` without ``PCI:``. The
producer reads those lines from ``/dev/kmsg``, ``journalctl -k -f -o json`` or a saved file
(``dmesg`` with or without timestamps, ``-T``, ``-r``, ``-d``, ``-x``, ``--time-format=iso``;
``journalctl`` short, short-precise, short-iso(-precise), short-monotonic, short-delta, short-unix
and json output; syslog files; a copy of ``/dev/kmsg``), maps each PCI bus id to a GPU index (nvidia-smi or a saved
``--query-gpu=index,pci.bus_id`` mapping) and publishes DCGM records with the XID gauge's meaning:
``xid`` is the GPU's last XID, ``nvswitch_fatal_sxid`` / ``nvswitch_nonfatal_sxid`` the host's
last SXid of each kind, and the host's SXid, NIC and AER line counts since the producer started
(docs/architecture.md §3, docs/producers.md#kernel-log).

Each XID line becomes a record at its own time; around them every known GPU is sampled every
``interval_s`` (the state the log implies, like DCGM's gauge), so the engine's absence checks
see a reporting GPU, not a silent one: a follower at every poll, a saved file densely for
``window_s`` after each event and sparsely between, with a cap (not once per interval across
the whole span of the file, which may be a year). What cannot be
used is counted by reason, never skipped silently: a line whose time or code is not a number or
a date that exists costs only itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pipeline.numeric import ascii_int
from pipeline.schema import DcgmRecord, dcgm
from pipeline.yamlsafe import open_regular
from producers.kmsg_fabric import MAX_BERT_DONE, PREVIOUS_BOOT, FabricEvents
from producers.textinput import GzipDamage, damage_counts, gzip_damage, open_text, stdin, warn_damage
from producers.kmsg_input import (
    LINE_MAX,
    DevKmsgReader,
    JournalReader,
    KmsgStats,
    Line,
    PciKey,
    load_pci_map,
    nvidia_smi_pci_map,
    parse_line,
    parse_pci_map,
    pci_key,
)

log = logging.getLogger(__name__)

# ASCII digits only (re.ASCII): "٣" is no XID code. Codes are read by ascii_int, bounded. The
# driver always writes ", " after the code, so a line cut after "7" of "79" is not XID 7.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<dom>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.[0-9a-fA-F])?(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<code>\d+),(?: ?(?P<rest>.*))?$",
    re.ASCII,
)
_PID = re.compile(r"^pid=(?P<pid>'[^']*'|[^,]*)(?:, name=(?P<name>.*?))?, (?P<msg>.*)$")
_SXID = re.compile(
    r"nvidia-(?P<sw>[^:\s]+): SXid \(PCI:(?P<dom>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"\.(?P<fn>[0-9a-fA-F])\): (?P<code>\d+),(?: ?(?P<rest>.*))?$",
    re.ASCII,
)
# An SXid event is three lines: "<code>, Non-fatal|Fatal, <message>", then "<code>, Severity N
# Engine instance .. Sub-engine instance .." and "<code>, Data {0x.., ...}" (the same event's detail).
_SXID_DETAIL = ("Severity ", "Data {")
CODE_DIGITS = 9  # XID codes are below 200 and SXids five digits; longer is not a code
# A GPU whose registers read all ones when the driver sets it up is off the bus without an XID
# (open-gpu-kernel-modules, ``src/nvidia/arch/nvalloc/unix/src/osinit.c``)::
#
#     NVRM: The NVIDIA GPU %04x:%02x:%02x.%x
#     NVRM: (PCI ID: %04x:%04x) installed in this system has
#     NVRM: fallen off the bus and is not responding to commands.
#
# One kernel record of three lines (other releases break them elsewhere): /dev/kmsg escapes its
# newlines (``\x0a``), the journal keeps them, rsyslog may write ``#012``, dmesg and journalctl's
# short layouts print the later lines indented under the first, and the kernel's syslog interface
# gives each its own prefix (KmsgFileSource joins those). The same fault as XID 79, read as one.
_LOST = re.compile(
    r"NVRM: The NVIDIA GPU (?P<dom>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.[0-7]\b",
    re.ASCII,
)
LOST_TEXT = "fallen off the bus"
LOST_XID = 79
LOST_LINES = 2  # lines that may follow the first line of the driver's message
_LOST_SPLIT = re.compile(r"\n|#012")  # its lines, as the journal and as rsyslog write them
MAX_PENDING = 64  # hosts of a saved file whose message's first line awaits the rest, oldest given up
LOST_SLACK_S = 1.0  # the rest of the message, on lines of its own, has the first line's time
_NO_HOST = object()  # no record goes on (KmsgFileSource._read)
# Unmapped PCI ids each logged once, up to this many: hostile lines must not grow the set for ever.
MAX_WARNED_PCI = 1024

LABEL_MAX = 200  # characters of the driver's message kept on the record
WINDOW_S = 3600.0  # a saved file is sampled every interval for this long after each event
# Between windows a saved file is sampled this far apart: under the engine's max_ahead (300 s),
# so a replay follows without a jump, and the engine's absence bound grows with a host's step
# (2.5 steps), so a quiet stretch is not a silent host; 360 samples a day instead of 8,640.
QUIET_S = 240.0
# The gaps that lead from a window's step to QUIET_S: each under the engine's 60 s floor or 2.5
# times the gap before it (its absence bound), so the host is never judged silent on the way.
QUIET_RAMP = (48.0, 96.0, 192.0)
MAX_SAMPLE_RECORDS = 200_000  # sample records one saved file may make (~200 MB of records)
# A syslog time (no year) this far past the file's mtime is last year's: the slack covers a log
# written in another time zone than the one reading it.
YEAR_SLACK_S = 86400.0
YEAR_S = 366 * 86400.0  # a year-less time is within this of the mtime: an older Feb 29 is no date
# What KernelLog.apply counts once per line read (not per record sent): a record's copies in a
# saved file are counted in these as the record was.
_PER_LINE = (
    "xid_lines",
    "gpu_lost_lines",
    "sxid_lines",
    "sxid_detail_lines",
    "fabric_lines",
    "unmapped_pci",
    "unparsable_xid",
    "sxid_no_gpu",
    "fabric_no_gpu",
)


@dataclass
class _HostState:
    xid: dict[int, int] = field(default_factory=dict)  # gpu -> last XID
    fatal_sxid: int = 0
    nonfatal_sxid: int = 0
    fatal_sxids: int = 0  # SXid lines since the producer started: a counter, so a rate
    nonfatal_sxids: int = 0


class KernelLog:
    """The state the kernel log implies (each GPU's last XID, each host's last SXids) and the
    records that report it. Shared by the file reader and the followers."""

    def __init__(self, pci_map: dict[PciKey, int], *, host: str | None = None) -> None:
        self.pci_map = dict(pci_map)
        self.host = host
        self.default_host = host or socket.gethostname()
        self.stats = KmsgStats()
        self.hosts: dict[str, _HostState] = {}
        self.fabric = FabricEvents()
        self.baseline_s = 1.0  # a saved file's source sets its --interval
        self._warned: set[PciKey] = set()
        # The fatal records of a previous boot that a BERT print names (kmsg_fabric.py) count in
        # host_fatal_errors_previous_boot however old their line: they are this boot's news. A
        # follower restarted within the boot that knows it counted them (KmsgFollower's
        # boot_marker) turns this off; a follower defers them to the end of its poll.
        self.count_previous_boot = True
        self.defer_previous_boot = False
        self._deferred: list[tuple[str, dict[str, str]]] = []  # at most MAX_BERT_DONE, then:
        self._deferred_more: dict[str, int] = {}  # each host's records past them: counted, one record

    def host_of(self, line: Line) -> str:
        """The host a line is charged to: ``--host``, else the one the line names, else this one."""
        return self.host or line.host or self.default_host

    def wants(self, msg: str) -> bool:
        """Whether ``apply`` may make something of ``msg`` (a saved file keeps only those lines)."""
        return "Xid" in msg or (LOST_TEXT in msg and "NVRM: The NVIDIA GPU" in msg) or self.fabric.wants(msg)

    def _state(self, host: str) -> _HostState:
        st = self.hosts.get(host)
        if st is None:
            st = self.hosts[host] = _HostState(xid=dict.fromkeys(sorted(set(self.pci_map.values())), 0))
        return st

    def apply(self, line: Line, ts: float, *, emit: bool = True) -> list[DcgmRecord]:
        """Fold one message into the state; the record(s) it makes when ``emit`` (a previous
        boot's fatal error records, which a BERT print names, also when not)."""
        host = self.host_of(line)
        # A BERT print of this host that ended before this line (its records are counted now).
        ended = self._previous_boot(host, ts, self.fabric.previous_boot(host, ts))
        return ended + self._apply(line, host, ts, emit)

    def end_previous_boot(self, ts: float, hosts: list[str] | None = None) -> list[DcgmRecord]:
        """At the end of the input read so far: the records of a previous boot that were deferred
        (a follower's), and those of the BERT prints of ``hosts`` (every host when ``None``)
        still open, at ``ts``."""
        defer, self.defer_previous_boot = self.defer_previous_boot, False
        try:
            out: list[DcgmRecord] = []
            deferred, self._deferred = self._deferred, []
            more, self._deferred_more = self._deferred_more, {}
            for host, labels in deferred:
                out += self._previous_boot(host, ts, [labels])
            for host, n in more.items():
                for _ in range(n):
                    self.fabric.count(host, PREVIOUS_BOOT)
                out += self.snapshot(ts, host)
            for host in list(self.fabric.hosts) if hosts is None else hosts:
                out += self._previous_boot(host, ts, self.fabric.previous_boot(host, end=True))
            return out
        finally:
            self.defer_previous_boot = defer

    def _previous_boot(self, host: str, ts: float, done: list[dict[str, str]]) -> list[DcgmRecord]:
        """Count each fatal record of a previous boot (its labels in ``done``) for ``host``: every
        GPU of the host with its counters (after the host's baseline, as any event)."""
        if not done or not self.count_previous_boot:
            return []
        if self.defer_previous_boot:  # bounded: a poll's every record need not have its own record
            for labels in done:
                if len(self._deferred) < MAX_BERT_DONE:
                    self._deferred.append((host, labels))
                else:
                    self._deferred_more[host] = self._deferred_more.get(host, 0) + 1
            return []
        out: list[DcgmRecord] = []
        for labels in done:
            out += self._baseline(host, ts)
            self.fabric.count(host, PREVIOUS_BOOT)
            if not self._state(host).xid:
                self.stats.fabric_no_gpu += 1
            labels = dict(labels)
            gpu = self._gpu_of(labels.get("bert.pci"))
            if gpu is not None:
                labels["bert.gpu"] = str(gpu)
            out += self.snapshot(ts, host, labels=labels)
        return out

    def _apply(self, line: Line, host: str, ts: float, emit: bool) -> list[DcgmRecord]:
        msg = line.msg
        if "SXid" in msg:
            m = _SXID.search(msg)
            code = ascii_int(m["code"], CODE_DIGITS) if m is not None else None
            if m is None or code is None:
                self.stats.unparsable_xid += 1
                return []
            rest = m["rest"] or ""
            if rest.startswith(_SXID_DETAIL):
                # The driver's 2nd and 3rd line of the event above (error_nvswitch.c,
                # _nvswitch_dump_error_entry): its severity and raw data, not another SXid.
                self.stats.sxid_detail_lines += 1
                return []
            self.stats.sxid_lines += 1
            base = self._baseline(host, ts) if emit else []
            st = self._state(host)
            if rest.startswith("Fatal"):
                st.fatal_sxid = code
                st.fatal_sxids += emit  # a follower's backlog is the state, not news: not counted
            else:  # "Non-fatal", or a message that does not say (thermal events)
                st.nonfatal_sxid = code
                st.nonfatal_sxids += emit
            labels = {
                "sxid.switch": m["sw"],
                "sxid.pci": f"{m['dom']}:{m['bus']}:{m['dev']}.{m['fn']}",
                "sxid.message": rest[:LABEL_MAX],
            }
            if not st.xid:
                self.stats.sxid_no_gpu += 1
            return base + self.snapshot(ts, host, labels=labels) if emit else []
        if "NVRM: Xid" not in msg:
            if LOST_TEXT in msg and (lost := _LOST.search(msg)) is not None:
                return self._lost(lost, msg, host, ts, emit)
            return self._fabric(msg, host, ts, emit)
        m = _XID.search(msg)
        code = ascii_int(m["code"], CODE_DIGITS) if m is not None else None
        gi = ascii_int(m["gi"], CODE_DIGITS) if m is not None and m["gi"] is not None else None
        ci = ascii_int(m["ci"], CODE_DIGITS) if m is not None and m["ci"] is not None else None
        if m is None or code is None or (m["gi"] is not None and gi is None) or (m["ci"] is not None and ci is None):
            self.stats.unparsable_xid += 1
            return []
        self.stats.xid_lines += 1
        key = pci_key(m["dom"], m["bus"], m["dev"])
        gpu = self._mapped(key, f"XID {m['code']}")
        if gpu is None:
            return []
        st = self._state(host)
        st.xid[gpu] = code
        if not emit:
            return []
        labels = {}
        rest = m["rest"] or ""
        pm = _PID.match(rest)
        if pm:
            labels["xid.pid"] = pm["pid"].strip("'")
            if pm["name"] is not None:
                labels["xid.process"] = pm["name"][:LABEL_MAX]
            rest = pm["msg"]
        labels["xid.message"] = rest[:LABEL_MAX]
        labels["xid.pci"] = "%04x:%02x:%02x" % key
        if gi is not None:  # the physical GPU's fault, attributed to an instance (architecture.md §3, MIG)
            labels["mig.xid_sources"] = f"GPU_I_ID={gi}:{code}"
            if ci is not None:
                labels["mig.xid_compute_instance"] = str(ci)
        return [self._record(ts, host, gpu, st, labels)]

    def _mapped(self, key: PciKey, what: str) -> int | None:
        """The GPU index of ``key``; else ``None``, counted and (once per bus id) logged."""
        gpu = self.pci_map.get(key)
        if gpu is None:
            self.stats.unmapped_pci += 1
            if key not in self._warned and len(self._warned) < MAX_WARNED_PCI:
                self._warned.add(key)
                log.warning(
                    "%s for PCI %04x:%02x:%02x, which the PCI map does not have: not sent (dropped.unmapped_pci)",
                    what,
                    *key,
                )
        return gpu

    def _lost(self, m: re.Match[str], msg: str, host: str, ts: float, emit: bool) -> list[DcgmRecord]:
        """The driver's "fallen off the bus and is not responding" message (``_LOST``): the GPU's
        last XID becomes 79, as the driver's XID for the same fault would make it."""
        self.stats.gpu_lost_lines += 1
        key = pci_key(m["dom"], m["bus"], m["dev"])
        gpu = self._mapped(key, "A GPU off the bus")
        if gpu is None:
            return []
        st = self._state(host)
        st.xid[gpu] = LOST_XID
        if not emit:
            self.stats.backlog_events += 1
            return []
        # One line of the driver's words: "The NVIDIA GPU ... has fallen off the bus and ...".
        words = " ".join(p.strip().removeprefix("NVRM:").strip() for p in _LOST_SPLIT.split(msg[m.start() :]))
        labels = {"xid.message": words[:LABEL_MAX], "xid.pci": "%04x:%02x:%02x" % key}
        return [self._record(ts, host, gpu, st, labels)]

    def _record(self, ts: float, host: str, gpu: int, st: _HostState, labels: dict[str, str]) -> DcgmRecord:
        self.stats.records += 1
        return dcgm(
            ts,
            host,
            gpu,
            {
                "xid": st.xid.get(gpu, 0),
                "nvswitch_fatal_sxid": st.fatal_sxid,
                "nvswitch_nonfatal_sxid": st.nonfatal_sxid,
                "nvswitch_fatal_sxids": st.fatal_sxids,
                "nvswitch_nonfatal_sxids": st.nonfatal_sxids,
                **self.fabric.counts(host),
            },
            labels=labels,
        )

    def _fabric(self, msg: str, host: str, ts: float, emit: bool) -> list[DcgmRecord]:
        """A NIC or AER line (producers/kmsg_fabric.py): every GPU of the host with its counters."""
        if not self.fabric.wants(msg):
            return []
        got = self.fabric.classify(host, msg, ts)
        # The records of a previous boot this line ended (the next record of a BERT print, its end).
        ended = self._previous_boot(host, ts, self.fabric.previous_boot(host))
        if got is None:
            return ended
        self.stats.fabric_lines += 1
        if not emit:  # a follower's backlog: the counters count from the producer's start
            self.stats.backlog_events += 1
            return ended
        out = ended + self._baseline(host, ts)
        self.fabric.count(host, got[0])
        if not self._state(host).xid:
            self.stats.fabric_no_gpu += 1
        labels = got[1]
        for key in ("aer.device", "aer.source", "nic.device"):  # a GPU's own bus id: name the GPU
            gpu = self._gpu_of(labels.get(key))
            if gpu is not None:
                labels[key.split(".")[0] + ".gpu"] = str(gpu)
                break
        return out + self.snapshot(ts, host, labels=labels)

    def _gpu_of(self, bdf: str | None) -> int | None:
        """The GPU index of a bus id the PCI map has (``0000:3b:00.0``), else ``None``."""
        parts = bdf.replace(".", ":").split(":") if bdf else []
        if len(parts) != 4 or not all(p and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts):
            return None
        return self.pci_map.get(pci_key(parts[0], parts[1], parts[2]))

    def _baseline(self, host: str, ts: float) -> list[DcgmRecord]:
        """The counters of a host not seen before, ``baseline_s`` before its first event: a
        counter first seen non-zero is history to increase(), and this event is news."""
        return [] if host in self.hosts else self.snapshot(ts - self.baseline_s, host)

    def snapshot(self, ts: float, host: str | None = None, labels: dict[str, str] | None = None) -> list[DcgmRecord]:
        """A record per known GPU of ``host`` (every host when ``None``) with the current state."""
        hosts = [host] if host is not None else (list(self.hosts) or [self.host or self.default_host])
        out = []
        for h in hosts:
            st = self._state(h)
            out += [self._record(ts, h, g, st, dict(labels or {})) for g in sorted(st.xid)]
        return out


def _continues(first: Line, ln: Line, more: str) -> bool:
    """Whether ``ln`` (its message ``more``, stripped) is a later line of the driver's message for
    a GPU off the bus that ``first`` began: an ``NVRM:`` line that begins no record of its own (an
    XID, another GPU's message) with no time, or the first line's own (the syslog interface)."""
    if not more.startswith("NVRM:") or "Xid" in more or _LOST.search(more) is not None:
        return False
    if ln.ts is None and ln.boot is None:
        return True
    if ln.ts is not None and first.ts is not None:
        return abs(ln.ts - first.ts) <= LOST_SLACK_S
    return ln.boot is not None and first.boot is not None and abs(ln.boot - first.boot) <= LOST_SLACK_S


def _root(ln: Line) -> Line:
    """The kept line ``ln`` was merged into (``Line.into``, followed to its end), else ``ln``;
    every line passed on the way is pointed at it, so chains stay short (union-find's path
    compression: merges that chain one record's copies would otherwise cost quadratic time)."""
    root = ln
    while root.into is not None:
        root = root.into
    while ln.into is not None and ln.into is not root:
        ln.into, ln = root, ln.into
    return root


class KmsgFileSource:
    """A saved kernel log, read once: each XID / SXid line a record at its time, and every known
    GPU sampled around them: a snapshot at an event that opens a window, samples every
    ``interval_s`` until ``window_s`` after the window's last event, then, until the next window
    or the log's last line, a sample every ``QUIET_S`` (reached by ``QUIET_RAMP``), so a year-long
    log does not cost one sample per interval of the year. At most ``max_sample_records`` sample
    records are made, a quarter of them for quiet stretches (the rest counted as
    ``samples_capped``, in records): the events themselves are never capped.

    The file is streamed: only the lines ``KernelLog.wants`` (XID, SXid, NIC, AER) are kept (with the
    latest time of every other line),
    so memory follows the events, not the log's length.

    Times: ``dmesg`` and ``/dev/kmsg`` count seconds from boot, placed at ``boot_time`` (epoch
    seconds) or else so that the last line falls at the file's modification time; lines with no
    time at all get the modification time; syslog lines without a year get the mtime's year, or
    the year before when that would put them after the mtime (``YEAR_SLACK_S``)."""

    def __init__(
        self,
        path: str,
        pci_map: dict[PciKey, int],
        *,
        host: str | None = None,
        interval_s: float = 10.0,
        boot_time: float | None = None,
        sample: bool = True,
        window_s: float = WINDOW_S,
        max_sample_records: int = MAX_SAMPLE_RECORDS,
        log: KernelLog | None = None,
        parse: Callable[..., Line | None] | None = None,
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0) and sample:
            raise ValueError(f"kmsg --interval must be a positive number of seconds, not {interval_s}")
        self.path = path
        # Another log of the same shape (the fabric manager's: producers/fabric_manager.py) brings
        # its own state and line layout.
        self.log = log if log is not None else KernelLog(pci_map, host=host)
        self.parse = parse or parse_line
        if sample:
            self.log.baseline_s = interval_s
        self.interval_s = interval_s
        self.boot_time = boot_time
        self.sample = sample
        self.window_s = window_s
        self.max_sample_records = max_sample_records
        self._made = {"window": 0, "quiet": 0}  # sample records made so far, by kind
        self.done = False
        self.damage: GzipDamage | None = None  # what ended a gzip input early (lost input, exit 3)
        self.mtime = os.stat(path).st_mtime if path != "-" else time.time()

    @property
    def stats(self) -> KmsgStats:
        return self.log.stats

    def _read(self) -> tuple[list[Line], float | None, float | None, bool]:
        """The event lines (XID/SXid), the latest absolute time and boot time of any line, and
        whether a line had no time."""
        year = time.localtime(self.mtime).tm_year
        fh = open_text(self.path) if self.path != "-" else None
        src = fh if fh is not None else stdin()
        events: list[Line] = []
        seen: dict[object, Line] = {}  # each event line's identities (KmsgFileSource._again)
        last_ts: float | None = None
        last_boot: float | None = None
        untimed = False
        # The first line of the driver's message for a GPU off the bus (``_LOST``) printed as
        # lines of their own, by host (a log of several hosts interleaves theirs), with how many
        # of its lines have followed it; and the host whose record the line before continued.
        pending: dict[object, tuple[Line, int]] = {}
        last: object = _NO_HOST
        try:
            while True:
                text = src.readline(LINE_MAX)
                if not text:
                    self.damage = gzip_damage(src)
                    warn_damage(self.path, self.damage)
                    for first, _ in pending.values():
                        self._keep(first, events, seen)
                    return events, last_ts, last_boot, untimed
                self.stats.lines += 1
                if len(text) >= LINE_MAX and not text.endswith("\n"):
                    self.stats.oversize += 1
                    while text and not text.endswith("\n"):  # the rest of it, a bounded piece at a time
                        text = src.readline(LINE_MAX)
                    continue
                ln = self.parse(text, year=year)
                if ln is None:
                    continue
                if ln.yearless and (ln.error is not None or (ln.ts is not None and ln.ts > self.mtime + YEAR_SLACK_S)):
                    # After the file was written (December's lines in January's file), or Feb 29
                    # of a common year: the year before's, if that is within a year of the mtime.
                    before = self.parse(text, year=year - 1)
                    if before is not None and before.ts is not None and before.ts > self.mtime - YEAR_S:
                        ln = before
                if ln.error is not None:
                    self.stats.bad_timestamp += 1
                    continue
                if ln.ts is not None:
                    last_ts = ln.ts if last_ts is None else max(last_ts, ln.ts)
                elif ln.boot is not None:
                    last_boot = ln.boot if last_boot is None else max(last_boot, ln.boot)
                # A line without a time or host (dmesg's and journalctl's indented lines) goes on
                # the record the line before it printed; any other, on its host's.
                bare = ln.ts is None and ln.boot is None and ln.host is None
                key = last if bare else ln.host
                last = _NO_HOST
                if (held := pending.get(key)) is not None:
                    first, follow = held
                    more = ln.msg.strip()
                    if _continues(first, ln, more):
                        # The next line of the record (dmesg and journalctl indent it and give it
                        # no time; the kernel's syslog interface gives it the record's).
                        first.msg += "\n" + more
                        if LOST_TEXT in more or follow + 1 == LOST_LINES:
                            del pending[key]
                            self._keep(first, events, seen)
                        else:
                            pending[key] = (first, follow + 1)
                            last = key
                        continue
                    del pending[key]
                    self._keep(first, events, seen)
                if bare:
                    untimed = True
                if LOST_TEXT not in ln.msg and _LOST.search(ln.msg) is not None:
                    # Its other lines follow (``_LOST``); a host's earlier one has ended.
                    if (held := pending.pop(ln.host, None)) is not None:
                        self._keep(held[0], events, seen)
                    if len(pending) >= MAX_PENDING:  # hosts whose record never went on
                        self._keep(pending.pop(next(iter(pending)))[0], events, seen)
                    pending[ln.host] = (ln, 0)
                    last = ln.host
                    continue
                self._keep(ln, events, seen)
        finally:
            if fh is not None:
                fh.close()

    def _keep(self, ln: Line, events: list[Line], seen: dict[object, Line]) -> None:
        """Keep ``ln`` if ``KernelLog.apply`` reads it (XID, SXid, a GPU off the bus, NIC and AER
        lines) and it is no copy of a line kept already."""
        if not self.log.wants(ln.msg):
            return
        if LOST_TEXT in ln.msg and _LOST.search(ln.msg) is not None:
            # The driver's message for a GPU off the bus in one spelling, whichever layout wrote
            # it (rsyslog's "#012", the journal's newlines, lines joined here): its copies are one.
            ln.msg = "\n".join(p.strip() for p in _LOST_SPLIT.split(ln.msg))
        if not self._again(ln, seen):
            events.append(ln)

    def _again(self, ln: Line, seen: dict[object, Line]) -> bool:
        """Whether ``ln`` is a record already kept: the same message at the same kernel time (or
        journal time) to the microsecond, as a dmesg capture and a journal export of the same boot
        in one file both print it (docs/producers.md#kernel-log). A genuine repeat of an XID is
        another record at another microsecond, so it stays. The kept line takes the copy's
        wall-clock time and host where it had none: a boot-relative time is only placed.

        ``seen`` maps a microsecond (``Line.mono_us``, or ``-1 - Line.wall_us``) to the first line
        kept at it, and ``(microsecond, message)`` to any other: one entry or two per event line,
        the time's int shared with the line, so memory follows the events. A line that carries both
        times may show two kept lines to be one record (a dmesg copy keyed by the kernel's time, a
        ``short-precise`` one by the journal's, then the json copy with both): they become one
        (``Line.into``), so the answer does not depend on the order of the copies."""
        keys = [us for us in (ln.mono_us, None if ln.wall_us is None else -1 - ln.wall_us) if us is not None]
        found: list[Line] = []
        for us in keys:
            for k in (seen.get(us), seen.get((us, ln.msg))):
                if k is not None and self._same(k := _root(k), ln) and k not in found:
                    found.append(k)
        if not found:
            for us in keys:
                first = seen.setdefault(us, ln)
                if first is not ln:  # another message (or host) at the same microsecond
                    seen.setdefault((us, ln.msg), ln)
            return False
        kept = found[0]
        for other in (*found[1:], ln):
            if kept.ts is None and other.ts is not None:
                kept.ts, kept.boot, kept.yearless = other.ts, other.boot, other.yearless
            kept.host = kept.host or other.host
            kept.copies += other.copies + 1
            other.into = kept  # a kept line merged here is skipped when the events are read
            self.stats.duplicates += 1
        for us in keys:  # the copy's other time now names the kept line too
            if _root(seen.setdefault(us, kept)) is not kept and not self._same(_root(seen[us]), ln):
                seen.setdefault((us, ln.msg), kept)
        return True

    @staticmethod
    def _same(kept: Line | None, ln: Line) -> bool:
        """Whether ``kept`` is ``ln``'s record: the same message, and no other host named."""
        return kept is not None and kept.msg == ln.msg and (ln.host is None or kept.host in (None, ln.host))

    def _count_copies(self, before: dict[str, int], copies: int) -> None:
        """Count a record's copies where ``KernelLog.apply`` counted the record (``xid_lines``, or
        the reason it was dropped), so every event line of the file is accounted for."""
        for name in _PER_LINE:
            got = getattr(self.stats, name) - before[name]
            if got:
                setattr(self.stats, name, getattr(self.stats, name) + got * copies)

    def poll(self) -> list[DcgmRecord]:
        if self.done:
            return []
        self.done = True
        events, last_ts, last_boot, untimed = self._read()
        boot = self.boot_time if self.boot_time is not None else self.mtime - (last_boot or 0.0)
        ends = [t for t in (last_ts, None if last_boot is None else boot + last_boot) if t is not None]
        end = max(ends + ([self.mtime] if untimed else []), default=self.mtime)
        stamped: list[tuple[float, Line]] = []
        for ln in events:
            if ln.into is not None:
                continue  # merged into another copy of its record (_again)
            if ln.ts is not None:
                ts = ln.ts
            elif ln.boot is not None:
                ts = boot + ln.boot
            else:
                ts = self.mtime
                self.stats.no_timestamp += 1
            stamped.append((ts, ln))
        stamped.sort(key=lambda p: p[0])  # journal exports of several boots are not in order
        out: list[DcgmRecord] = []
        window_end = -math.inf  # the open (or last) window's end
        cursor = 0.0  # the window's next sample
        quiet: float | None = None  # the quiet stretch's next sample; None inside a window
        iv, qv = self.interval_s, max(QUIET_S, self.interval_s)
        # After the last line, a BERT print cut off (or ending the log) ends there (KernelLog).
        tail: list[tuple[float, Line | None]] = [(stamped[-1][0], None)] if stamped else []
        for ts, maybe in [*stamped, *tail]:
            if self.sample and window_end > -math.inf:  # the samples before this line, in the state before it
                if ts <= window_end:
                    cursor = self._samples(out, cursor, ts, iv, "window", inclusive=False)
                else:
                    if quiet is None:  # the window closed: its last samples, then a quiet stretch
                        quiet = self._close(out, cursor, window_end, ts)
                    quiet = self._samples(out, quiet, ts, qv, "quiet", inclusive=False)
            if maybe is None:
                recs = self.log.end_previous_boot(ts)
            else:
                ln = maybe
                before = {name: getattr(self.stats, name) for name in _PER_LINE} if ln.copies else None
                recs = self.log.apply(ln, ts)
                if before is not None:
                    self._count_copies(before, ln.copies)
            if not recs:
                continue
            if recs[0].ts < ts:  # a host's baseline (KernelLog._baseline) goes before its window
                out += [r for r in recs if r.ts < ts]
                recs = [r for r in recs if r.ts >= ts]
            if self.sample:
                if ts > window_end:  # a window opens: every GPU's state as the log says something
                    self._samples(out, ts, ts, iv, "window", inclusive=True)
                    cursor, quiet = ts + iv, None
                window_end = max(window_end, min(ts + self.window_s, end))
            out += recs
        if self.sample and window_end > -math.inf:
            if quiet is None:
                quiet = self._close(out, cursor, window_end, end)
            self._samples(out, quiet, end, qv, "quiet", inclusive=True)
        return out

    def _close(self, out: list[DcgmRecord], cursor: float, window_end: float, stop: float) -> float:
        """A window's last samples, then the ramp to the quiet spacing (samples before ``stop``);
        the quiet stretch's first sample time."""
        self._samples(out, cursor, window_end, self.interval_s, "window", inclusive=True)
        t, qv = window_end, max(QUIET_S, self.interval_s)
        for gap in QUIET_RAMP:
            if gap >= qv or t + gap >= stop:
                break
            t += gap
            self._samples(out, t, t, gap, "quiet", inclusive=True)
        return t + qv

    def _samples(
        self, out: list[DcgmRecord], start: float, stop: float, step: float, kind: str, *, inclusive: bool
    ) -> float:
        """Append snapshots every ``step`` from ``start`` to before ``stop`` (to ``stop`` itself
        when ``inclusive``) while ``kind``'s share of the sample budget lasts (the rest counted as
        ``samples_capped``, in records); the next sample's time. The times are counted, not
        stepped, so float spacing cannot stall the loop and a huge span costs nothing past the cap."""
        if not stop >= start:
            return start
        span = (stop - start) / step
        n = math.floor(span) + 1 if inclusive else max(math.ceil(span), 0)
        if n == 0:
            return start
        hosts = list(self.log.hosts) or [self.log.host or self.log.default_host]
        per = sum(len(self.log._state(h).xid) for h in hosts)
        share = (
            self.max_sample_records // 4 if kind == "quiet" else self.max_sample_records - self.max_sample_records // 4
        )
        room = max((share - self._made[kind]) // per, 0) if per else n
        for k in range(min(n, room)):
            made = self.log.snapshot(start + k * step)
            self._made[kind] += len(made)
            out += made
        if n > room:
            if self.stats.samples_capped == 0:
                log.warning(
                    "%s: more than %d sample records; later samples are left out (samples_capped)",
                    self.path,
                    self.max_sample_records,
                )
            self.stats.samples_capped += (n - room) * per
        return start + n * step

    def summary(self) -> dict[str, int]:
        return self.stats.summary() | damage_counts(self.damage)

    def close(self) -> None:
        pass


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"  # a random UUID the kernel makes at each boot
DEFAULT_BOOT_MARKER = "/var/lib/gpuwarden/kmsg-boot-id"  # produce kmsg --boot-marker's default
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)
_SMALL_MAX = 256  # bytes read of a boot id or a boot marker (a boot id is 37 with its newline)


def _read_small(path: str) -> str | None:
    """The text of the small regular file ``path``, stripped (at most ``_SMALL_MAX`` bytes, and
    ``None`` when there were more); ``FileNotFoundError`` when there is none, ``NotRegularFile``
    when ``path`` is no regular file (``yamlsafe.open_regular``: a FIFO's open would wait for a
    writer), another ``OSError`` when it cannot be read."""
    fd = open_regular(path)
    try:
        data = os.read(fd, _SMALL_MAX + 1)
    finally:
        os.close(fd)
    return None if len(data) > _SMALL_MAX else data.decode("ascii", "replace").strip()


def _write_small(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole (a temporary file beside it renamed over it); ``OSError``."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        try:
            os.write(fd, (text + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def claim_boot(marker: str | None, boot_id: str | None = None, boot_id_path: str | None = None) -> bool:
    """Whether a follower counts the fatal error records of the previous boot that this boot's log
    holds (BERT's print, always in a follower's backlog): the first follower of a boot does, and
    records the boot in ``marker`` before it reads them; a follower restarted within the boot,
    which finds its boot there, does not. ``None``: no marker, always (a restart counts them again).
    ``""``: never. A marker that cannot be read or written (a directory missing, read-only, not a
    regular file) or a boot id that cannot be read: never, with one warning -- a restart would
    count them again and drain the host again, which is worse than not counting them here.
    ``boot_id``: this boot's id, else read from ``boot_id_path`` (``BOOT_ID_PATH``)."""
    if marker is None:
        return True
    lost = (
        "the previous boot's fatal hardware error records (BERT) in this boot's log are not counted "
        "(`gpuwarden produce kmsg --file` on this boot's log counts them)"
    )
    if marker == "":
        log.info("kmsg: --boot-marker '': %s", lost)
        return False
    if boot_id is None:
        where = boot_id_path if boot_id_path is not None else BOOT_ID_PATH
        try:
            boot_id = _read_small(where)
        except OSError as e:
            log.warning("kmsg: cannot read this boot's id (%s): %s", e, lost)
            return False
        if boot_id is None or _BOOT_ID.fullmatch(boot_id) is None:
            log.warning("kmsg: %s holds no boot id: %s", where, lost)
            return False
    if _BOOT_ID.fullmatch(boot_id) is None:
        log.warning("kmsg: %r is no boot id: %s", boot_id, lost)
        return False
    try:
        seen = _read_small(marker)
    except FileNotFoundError:
        seen = ""  # this host's first follower (or its directory is missing: the write says)
    except OSError as e:
        log.warning("kmsg: --boot-marker %s: cannot read it (%s): %s", marker, e, lost)
        return False
    if seen == boot_id:
        log.info("kmsg: --boot-marker %s: this boot's BERT records were counted before (a restart)", marker)
        return False
    if seen is None or (seen and _BOOT_ID.fullmatch(seen) is None):
        log.warning("kmsg: --boot-marker %s holds no boot id: replacing it", marker)
    try:
        _write_small(marker, boot_id)
    except OSError as e:
        log.warning("kmsg: --boot-marker %s: cannot write it (%s): %s", marker, e, lost)
        return False
    return True


class KmsgFollower:
    """Follow a live kernel log (a ``DevKmsgReader`` or ``JournalReader``). What the log says
    happened before we started -- the ring buffer or this boot's journal -- is the state, not
    news: it is folded in, and the first sample tells the engine, once, which GPUs already have
    an XID. Each later XID line is a record at its time; every poll samples every known GPU."""

    def __init__(
        self,
        reader: Any,
        pci_map: dict[PciKey, int],
        *,
        host: str | None = None,
        sample: bool = True,
        clock: Callable[[], float] = time.time,
        boot_time: float | None = None,
        log: KernelLog | None = None,
        parse: Callable[..., Line | None] | None = None,
        boot_marker: str | None = None,
        boot_id: str | None = None,
        boot_id_path: str | None = None,
    ) -> None:
        self.reader = reader
        self.log = log if log is not None else KernelLog(pci_map, host=host)
        self.parse = parse or parse_line
        reader.stats = self.log.stats
        self.sample = sample
        self.clock = clock
        self.started = clock()
        self.boot = boot_time if boot_time is not None else self.started - time.monotonic()
        self.done = False
        self._first = True
        # The fatal error records of the previous boot (a BERT print, always in the backlog: it is
        # printed at an initcall) are sent at the end of the poll that read them, at its time.
        self.log.defer_previous_boot = True
        self._bert_lines: dict[str, int] = {}  # each host's BERT print lines read by the last poll
        # Nothing in the log tells a restart within a boot from the first start: the backlog is
        # the same. A file naming the boot (``boot_marker``: this boot's id, written before the
        # backlog is read; ``claim_boot``) does; without one (``None``), a restarted follower counts
        # this boot's BERT print again; with one that cannot be used, none counts it.
        self.boot_marker = boot_marker
        if not claim_boot(boot_marker, boot_id, boot_id_path):
            self.log.count_previous_boot = False

    @property
    def stats(self) -> KmsgStats:
        return self.log.stats

    def poll(self) -> list[DcgmRecord]:
        out: list[DcgmRecord] = []
        now = self.clock()
        for text in self.reader.read():
            self.stats.lines += 1
            ln = self.parse(text)
            if ln is None:
                continue
            if ln.error is not None:
                self.stats.bad_timestamp += 1
                continue
            ts = ln.ts if ln.ts is not None else (self.boot + ln.boot if ln.boot is not None else now)
            # A line stamped in whole seconds (Fabric Manager's, syslog's) of the start's second is
            # the present: what came just after the start carries a time before it. A finer time
            # (/dev/kmsg's microseconds) says on which side it is.
            backlog = ts < (math.floor(self.started) if ts == math.floor(ts) else self.started)
            if backlog and "Xid" in ln.msg:  # (a GPU off the bus is counted by KernelLog._lost)
                self.stats.backlog_events += 1
            out += self.log.apply(ln, min(ts, now), emit=not backlog)
        # A BERT print no line of which came in this poll has ended: its open record too.
        lines = {h: n for h in self.log.fabric.hosts if (n := self.log.fabric.bert_lines(h)) is not None}
        ended = self.log.end_previous_boot(now, [h for h, n in lines.items() if self._bert_lines.get(h) == n])
        self._bert_lines = lines
        out += ended
        if self.sample or self._first:
            out += self.log.snapshot(now)
        self._first = False
        return out

    def summary(self) -> dict[str, int]:
        return self.stats.summary()

    def close(self) -> None:
        self.reader.close()


__all__ = [
    "LINE_MAX",
    "PciKey",
    "DevKmsgReader",
    "JournalReader",
    "KernelLog",
    "KmsgFileSource",
    "KmsgFollower",
    "KmsgStats",
    "Line",
    "load_pci_map",
    "nvidia_smi_pci_map",
    "parse_line",
    "parse_pci_map",
]
