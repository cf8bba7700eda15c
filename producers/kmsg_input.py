"""What the kernel-log producer reads: the line layouts of the kernel log (dmesg, journalctl,
/dev/kmsg), its live readers, and the PCI map that names the GPUs (docs/producers.md#kernel-log).

``producers/kmsg.py`` turns the lines into records; ``producers/fabric_manager.py`` reuses the
same time rules and readers' shape for Fabric Manager's log.

>>> parse_line("[ 1000.000200] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.").boot
1000.0002
"""

from __future__ import annotations

import csv
import io
import math
import os
import queue
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from pipeline.numeric import ascii_float, ascii_int
from pipeline.recordchecks import MAX_GPU_INDEX
from producers import jsonsafe
from producers.textinput import read_capped

PciKey = tuple[int, int, int]  # (domain, bus, device): the GPU, whatever its function


# Line layouts, tried in order (docs/producers.md#kernel-log). They match any digits so that a
# line of a known layout whose time is not one ("²", "٣", 400 digits, Feb 29 of 2025) is that
# line's counted drop (``Line.error``) rather than an untimed message.
# /dev/kmsg: "PRI,SEQ,USEC,FLAGS;msg", PRI facility * 8 + level (read by _kernel_pri: any number).
_KMSG = re.compile(r"^(?P<prio>-?\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
# dmesg's "[secs] ", with -r the priority "<N>" before it, with -d the delta after the time, and
# a caller id "[T123] " after it (CONFIG_PRINTK_CALLER): util-linux sys-utils/dmesg.c print_record.
# -r prints LOG_RAW_FAC_PRI(facility, level), facility * 8 + level: any number ("<-2>" for a
# facility dmesg has no name for, up to 2047 from the kernel's syslog(2) buffer); whatever stands
# between "<" and ">" is read by _kernel_pri, so no prefix makes the line a bare kernel message.
_DELTA = r"(?: <\s*-?\d+\.\d+>)?"
_CALLER = r"(?:\[\s*[TC]\d+\] )?"
_DMESG = re.compile(r"^(?:<(?P<pri>[^<>]*)>)?\[\s*(?P<secs>\d+\.\d+)" + _DELTA + r"\]\s?" + _CALLER + r"(?P<msg>.*)$")
# The kernel's syslog(2) buffer (dmesg -S -r) with printk.time off: the priority, no time.
_UNTIMED_PRI = re.compile(r"^<(?P<pri>-?\d+)>")
_CTIME = r"(?P<date>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})"
_DMESG_T = re.compile(r"^\[" + _CTIME + _DELTA + r"\]\s?" + _CALLER + r"(?P<msg>.*)$")
# journalctl -o short-monotonic / short-delta ("[secs <delta>] host kernel: ", the delta's mark " "
# or "*"): the host and "kernel:" before the message, which dmesg's layout would keep in it.
_JOURNAL_MONO = re.compile(
    r"^\[\s*(?P<secs>\d+\.\d+)(?: <\s*\d+\.\d+[ *]>)?\] (?:(?P<host>\S*[^\s:]) )?kernel: (?P<msg>.*)$"
)
# The host and the program ("kernel", or another's "name[pid]" in /var/log/syslog and messages)
# of a syslog or journal line; "kernel:" alone with journalctl --no-hostname.
# With --no-hostname a program's line has its tag alone: "gpud[88]: " (with its pid: a kernel
# line never has one, and "NVRM: Xid" with no host must stay the kernel's).
_TAG = (
    r"(?:(?P<host>\S*[^\s:]) (?P<tag>[^\s:\[]+(?:\[\d+\])?)|(?P<ptag>[^\s:\[]+\[\d+\])|kernel): "
    r"(?:\[\s*(?P<ksecs>\d+\.\d+)\] )?(?P<msg>.*)$"
)
_ISO = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) " + _TAG
)  # short-iso, short-iso-precise, rsyslog's RFC 3339 files
_DMESG_ISO = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)) " + _CALLER + r"(?P<msg>.*)$"
)  # dmesg --time-format=iso
# dmesg -t (--notime): the caller id alone before the message.
_UNTIMED_CALLER = re.compile(r"^\[\s*[TC]\d+\] ")
_UNIX = re.compile(r"^(?P<secs>\d{1,12}\.\d{6}) (?P<host>\S+) kernel: (?P<msg>.*)$")  # journalctl -o short-unix
# dmesg -x (--decode): "kern  :err   : " before the time (util-linux sys-utils/dmesg.c
# facility_names, level_names); any facility but "kern" is a program's line (see _kernel_pri).
_FACILITY = re.compile(
    r"^(?P<fac>kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res[0-3]|local[0-7])\s*:"
    r"(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: "
)
_SYSLOG = re.compile(r"^(?P<date>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)(?P<frac>\.\d{1,9})? " + _TAG)  # short(-precise)
# journalctl -o short-full (and -o with-unit, whose kernel lines name no unit): systemd
# src/shared/logs-show.c output_timestamp_realtime prints src/basic/time-util.c
# format_timestamp_style's TIMESTAMP_PRETTY, or TIMESTAMP_UTC with --utc: "Www YYYY-MM-DD HH:MM:SS"
# and the zone ("UTC" with --utc, else the local abbreviation, "CET" or tzdata's numeric "+04"),
# never microseconds (those are TIMESTAMP_US). Older systemd wrote strftime's "%a ... %Z", so the
# weekday may be the locale's ("Fr", "ven.") and --utc's zone "GMT"; the weekday is not checked.
# The program may stand alone (--no-hostname): a host never ends in ":", so "gpud[88]: " is a tag.
_FULL_TAG = r"(?:(?P<host>\S*[^\s:]) )?(?P<tag>[^\s:\[]+(?:\[\d+\])?): (?:\[\s*(?P<ksecs>\d+\.\d+)\] )?(?P<msg>.*)$"
_FULL = re.compile(
    r"^[^\W\d_]{1,12}\.? (?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?P<zone>[A-Za-z]{1,10}|[+-]\d\d(?:\d\d)?) "
    + _FULL_TAG
)
_UTC_ZONES = frozenset({"UTC", "GMT"})

_USEC = re.compile(r"\s*(\d{1,12})\.(\d{6})$", re.ASCII)  # the kernel's "%5lu.%06lu": "²" is no digit

MAX_PCI_MAP_CHARS = 1 << 20  # a saved map is ~40 characters a GPU
LINE_MAX = 64 * 1024  # a kernel message is at most ~1 KiB (kmsg's LOG_LINE_MAX); longer is not a log line
EPOCH_MAX = 253402300800.0  # 10000-01-01: times past it (or before 1970) are not a log's
BOOT_MAX = 1e10  # seconds since boot: three centuries of uptime


@dataclass(slots=True)  # a saved file holds every event line: no per-line __dict__
class Line:
    """One kernel-log message: its time (epoch seconds, ``None`` when the layout has none, or
    ``boot`` seconds when it counts from boot), the host the line names, and the message."""

    msg: str
    ts: float | None = None
    boot: float | None = None
    host: str | None = None
    error: str | None = None  # a line of a known layout whose time is not one: the reason
    yearless: bool = False  # a syslog time, which has no year: read in the one parse_line was given
    # The record's identity in a log that holds two copies of it (docs/producers.md#kernel-log):
    # the kernel's own time of the record in microseconds since boot, as dmesg, /dev/kmsg,
    # journalctl -o short-monotonic and json (_SOURCE_MONOTONIC_TIMESTAMP) and rsyslog's
    # "kernel: [secs]" all write it, and a wall time written to the microsecond (the journal's
    # entry time in short-precise, short-iso-precise, short-unix and json).
    mono_us: int | None = None
    wall_us: int | None = None
    copies: int = 0  # the same record's other lines in a saved file: counted as this one is, not sent
    into: Line | None = None  # the copy of the same record kept instead of this one (a saved file)


def _bad_time(msg: str) -> Line:
    return Line(msg, error="bad_timestamp")


def _usec(secs: str | None) -> int | None:
    """Microseconds of ``"1234.567890"`` as the tools print the kernel's time (``%5lu.%06lu``),
    or None for any other shape: fewer or more digits are not the record's exact time."""
    m = _USEC.match(secs) if secs is not None else None
    return int(m[1]) * 1_000_000 + int(m[2]) if m is not None else None


def _wall_us(ts: float | None, frac: str | None) -> int | None:
    """A wall time's microseconds when it was written with six fraction digits, else None."""
    return round(ts * 1e6) if ts is not None and frac is not None and len(frac) == 7 else None


def _epoch(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) and 0.0 <= x < EPOCH_MAX else None


def _boot(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) and 0.0 <= x < BOOT_MAX else None


def local_time(date: str, fmt: str) -> float | None:
    """Local time of ``date`` in ``fmt``, or None for a date that does not exist (Feb 29 of a
    common year, month 13) or is not ASCII (strptime reads Unicode digits).

    >>> local_time("Feb 29 2025 10:00:00", "%b %d %Y %H:%M:%S") is None
    True
    """
    if not date.isascii():
        return None
    try:
        return _epoch(time.mktime(time.strptime(date, fmt)))
    except (ValueError, OverflowError):
        return None


def _kernel_pri(pri: str) -> bool:
    """Whether a syslog priority as the kernel prints it (``/dev/kmsg``'s first field, ``dmesg -r``'s
    ``<N>``: facility * 8 + level) is the kernel's own record: facility 0 (LOG_KERN), so 0-7.

    kernel/printk/printk.c ``devkmsg_write`` gives a line a program wrote to ``/dev/kmsg`` LOG_USER
    (1), or the nonzero facility its ``<N>`` names: never 0. Anything else -- 8 and up, negative
    (dmesg's ``<-2>`` for a facility it has no name for), Unicode digits -- is not the kernel's.

    >>> [_kernel_pri(p) for p in ("6", "0", "8", "14", "-2", "٣", "99999999999")]
    [True, True, False, False, False, False, False]
    """
    if len(pri) == 1:  # the kernel's "%u" / dmesg's "%d": one digit
        return "0" <= pri <= "7"
    v = pri.lstrip("0")  # zero-padded by hand: its value
    return pri.isascii() and pri.isdigit() and len(v) <= 1 and v <= "7"


def _program(ln: Line | None) -> Line | None:
    """A line the kernel's log holds but a program wrote (its facility is not LOG_KERN): as a
    program's syslog line, its time counts and its message is not the kernel's."""
    if ln is None:
        return None
    return Line("", ts=ln.ts, boot=ln.boot, host=ln.host, error=ln.error, yearless=ln.yearless)


def parse_line(text: str, *, year: int | None = None) -> Line | None:
    """A line in any layout the producer reads; ``None`` for ``/dev/kmsg`` continuation lines
    (`` KEY=value`` metadata of the record before). A line whose layout shows a facility other
    than the kernel's (``/dev/kmsg``, ``dmesg -r`` / ``-x``, the journal's ``SYSLOG_FACILITY``) was
    written by a program to ``/dev/kmsg``: its time counts, its message is empty."""
    text = text.rstrip("\r\n").lstrip("\0")  # NULs: a crash's unwritten blocks before the next line
    if text.startswith(" ") and "=" in text:
        return None
    if text.startswith("{"):
        try:
            obj = jsonsafe.loads(text)  # nesting and numbers bounded
        except ValueError:
            return Line(text)
        if not isinstance(obj, dict):
            return Line(text)
        msg = obj.get("MESSAGE", "")
        if isinstance(msg, list):  # journald writes non-UTF-8 messages as byte arrays
            msg = bytes(b & 0xFF for b in msg if isinstance(b, int)).decode("utf-8", "replace")
        host = obj.get("_HOSTNAME") if isinstance(obj.get("_HOSTNAME"), str) else None
        raw = obj.get("__REALTIME_TIMESTAMP")
        usec = _json_int(raw)
        ts = _epoch(usec / 1e6) if usec is not None else None
        transport = obj.get("_TRANSPORT")
        fac = obj.get("SYSLOG_FACILITY")
        if (transport is not None and transport != "kernel") or not (
            fac is None or fac == "0" or (type(fac) is int and fac == 0)
        ):
            # Another program's entry (journald-kmsg.c sets _TRANSPORT=kernel on the kernel's):
            # health monitors re-log the kernel's XID lines, so its message is not the kernel's.
            # A line a program wrote to /dev/kmsg is _TRANSPORT=kernel too, with its facility in
            # SYSLOG_FACILITY (dev_kmsg_record: "0" on the kernel's own, or, before systemd set
            # it on every record, none).
            return Line("", ts=ts, host=host)
        if raw is None:
            return Line(str(msg), host=host)
        if ts is None:
            return _bad_time(str(msg))
        mono = _json_int(obj.get("_SOURCE_MONOTONIC_TIMESTAMP"))
        return Line(str(msg), ts=ts, host=host, mono_us=mono, wall_us=usec)
    m = _KMSG.match(text)
    if m:
        usec = ascii_int(m["usec"], 19)
        boot = _boot(usec / 1e6) if usec is not None else None
        # /dev/kmsg escapes a record's newlines (devkmsg_read: "\x0a"): one record of several lines.
        if boot is None:
            return _bad_time(m["msg"])
        if not _kernel_pri(m["prio"]):  # a program's record: facility * 8 + level, facility not 0
            return Line("", boot=boot)
        return Line(m["msg"].replace("\\x0a", "\n"), boot=boot, mono_us=usec)
    m = _FACILITY.match(text)
    if m is None:
        return _layouts(text, year)
    return _layouts(text[m.end() :], year) if m["fac"] == "kern" else _program(_layouts(text[m.end() :], year))


def _layouts(text: str, year: int | None) -> Line | None:
    """``parse_line`` of a line in a text layout, after any ``dmesg -x`` prefix."""
    m = _JOURNAL_MONO.match(text)
    if m:
        boot = _boot(ascii_float(m["secs"], 32))
        if boot is None:
            return _bad_time(m["msg"])
        return Line(m["msg"], boot=boot, host=m["host"], mono_us=_usec(m["secs"]))
    m = _DMESG.match(text)
    if m:
        boot = _boot(ascii_float(m["secs"], 32))
        if boot is None:
            return _bad_time(m["msg"])
        if m["pri"] is not None and not _kernel_pri(m["pri"]):  # dmesg -r: a program's record
            return Line("", boot=boot)
        return Line(m["msg"], boot=boot, mono_us=_usec(m["secs"]))
    m = _DMESG_T.match(text)
    if m:
        ts = local_time(m["date"], "%a %b %d %H:%M:%S %Y")
        return Line(m["msg"], ts=ts) if ts is not None else _bad_time(m["msg"])
    m = _ISO.match(text)
    # dmesg's iso time has a comma and no host or tag after it: a message that starts with a
    # task's "<comm>[<pid>]: " (a segfault report) is the kernel's, not a program's line.
    if m and not ("," in m["date"] and (m["tag"] not in (None, "kernel") or m["ptag"] is not None)):
        ts = iso_time(m["date"])
        if m["tag"] not in (None, "kernel") or m["ptag"] is not None:
            return Line("", ts=ts, host=m["host"])  # a program's line, which may quote the kernel's
        if ts is None:
            return _bad_time(m["msg"])
        wall = _wall_us(ts, _frac(m["date"]))
        return Line(m["msg"], ts=ts, host=m["host"], mono_us=_usec(m["ksecs"]), wall_us=wall)
    m = _DMESG_ISO.match(text)
    if m:
        ts = iso_time(m["date"])
        return Line(m["msg"], ts=ts, wall_us=_wall_us(ts, _frac(m["date"]))) if ts is not None else _bad_time(m["msg"])
    m = _UNIX.match(text)
    if m:
        ts = _epoch(ascii_float(m["secs"], 32))
        if ts is None:
            return _bad_time(m["msg"])
        return Line(m["msg"], ts=ts, host=m["host"], wall_us=_wall_us(ts, m["secs"][-7:]))
    m = _FULL.match(text)
    if m:
        # A zone that says UTC is read as such; any other abbreviation as local time, as the
        # zone-less layouts are: an abbreviation names no offset reliably ("IST", "CST" are several).
        zone = m["zone"]
        if zone in _UTC_ZONES:
            ts = iso_time(m["date"] + "+00:00")
        elif zone[0] in "+-":  # tzdata's numeric abbreviation ("+04", "-0330") is the offset itself
            ts = iso_time(f"{m['date']}{zone[:3]}:{zone[3:5] or '00'}")
        else:
            ts = local_time(m["date"], "%Y-%m-%d %H:%M:%S")
        if m["tag"] != "kernel":
            return Line("", ts=ts, host=m["host"])  # a program's line, which may quote the kernel's
        if ts is None:
            return _bad_time(m["msg"])
        return Line(m["msg"], ts=ts, host=m["host"], mono_us=_usec(m["ksecs"]))  # seconds only: no wall_us
    m = _SYSLOG.match(text)
    if m:
        yr = year or time.localtime().tm_year
        ts = local_time(f"{yr} {m['date']}", "%Y %b %d %H:%M:%S")
        frac = ascii_float(m["frac"], 10) if m["frac"] else 0.0
        ts = ts + frac if ts is not None and frac is not None else None
        if m["tag"] not in (None, "kernel") or m["ptag"] is not None:
            return Line("", ts=ts, host=m["host"], yearless=True)  # a program's line, which may quote the kernel's
        if ts is None:
            return Line(m["msg"], error="bad_timestamp", yearless=True)
        wall = _wall_us(ts, m["frac"])
        return Line(m["msg"], ts=ts, host=m["host"], yearless=True, mono_us=_usec(m["ksecs"]), wall_us=wall)
    if text.startswith("<") and (m := _UNTIMED_PRI.match(text)) is not None:
        return Line(text[m.end() :]) if _kernel_pri(m["pri"]) else Line("")  # syslog(2)'s "<N>", no time
    return Line(_UNTIMED_CALLER.sub("", text, count=1))


def _json_int(raw: object) -> int | None:
    """A journal export's microsecond field (a string of digits, or a number in hand-made exports)."""
    if raw is None or isinstance(raw, bool):
        return None
    return ascii_int(str(raw) if isinstance(raw, int) else raw, 19)


def _frac(date: str) -> str | None:
    """The ``.123456`` (or dmesg's ``,123456``) of an ISO time, or None."""
    m = re.search(r"[.,]\d+", date)
    return m.group(0) if m else None


def iso_time(date: str) -> float | None:
    """Epoch seconds of a short-iso time, or None for one that does not exist or is not ASCII."""
    if not date.isascii():
        return None
    d = date.replace(",", ".")
    if d.endswith("Z"):
        d = d[:-1] + "+00:00"
    elif re.search(r"[+-]\d{4}$", d):
        d = d[:-2] + ":" + d[-2:]
    try:
        return _epoch(datetime.fromisoformat(d).timestamp())
    except (ValueError, OverflowError, OSError):
        return None


def pci_key(dom: str, bus: str, dev: str) -> PciKey:
    return int(dom, 16), int(bus, 16), int(dev, 16)


def parse_pci_map(text: str) -> dict[PciKey, int]:
    """GPU index by PCI bus id from ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv``
    (with or without its header; ``00000000:3B:00.0`` and ``0000:3b:00.0`` both read).

    Raises ``ValueError`` naming the line that is neither, or that names a bus id or a GPU index
    an earlier line already did: with either, XIDs would be charged to the wrong GPU.

    >>> parse_pci_map("index, pci.bus_id\\n0, 00000000:3B:00.0\\n1, 00000000:5E:00.0")
    {(0, 59, 0): 0, (0, 94, 0): 1}
    """
    out: dict[PciKey, int] = {}
    line_of: dict[object, int] = {}
    bus_id = re.compile(r"^(?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?$", re.ASCII)
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#") or cells[0].lower() == "index":
            continue
        idx = next((i for i in (ascii_int(c, 4) for c in cells) if i is not None), None)
        bid = next((bus_id.match(c) for c in cells if bus_id.match(c)), None)
        if idx is None or bid is None:
            raise ValueError(f"PCI map line {n}: expected 'index, pci.bus_id', got {','.join(row)!r}")
        if idx > MAX_GPU_INDEX:  # every record of that GPU would be refused downstream
            raise ValueError(f"PCI map line {n}: GPU index {idx} is past {MAX_GPU_INDEX}")
        key = pci_key(*bid.groups())
        for what, seen in ((f"bus id {bid.group(0)}", key), (f"GPU index {idx}", ("gpu", idx))):
            if seen in line_of:
                raise ValueError(f"PCI map line {n}: {what} is already on line {line_of[seen]}")
            line_of[seen] = n
        out[key] = idx
    return out


def nvidia_smi_pci_map(nvidia_smi: str = "nvidia-smi", timeout_s: float = 15.0) -> dict[PciKey, int]:
    """This host's mapping from ``nvidia-smi`` (run as argv, no shell)."""
    out = subprocess.run(
        [nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    ).stdout
    return parse_pci_map(out)


@dataclass
class KmsgStats:
    """What the exit summary and ``/metrics`` show (docs/producers.md#kernel-log)."""

    lines: int = 0
    xid_lines: int = 0
    gpu_lost_lines: int = 0  # the driver's "fallen off the bus and is not responding" message: XID 79
    sxid_lines: int = 0
    sxid_detail_lines: int = 0  # an SXid event's Severity and Data lines: read, not another event
    records: int = 0
    backlog_events: int = 0  # events from before the follower started: folded into the state
    unmapped_pci: int = 0  # an XID for a bus id the PCI map does not have
    unparsable_xid: int = 0  # a line that says "NVRM: Xid" / "SXid" in no layout the driver prints
    no_timestamp: int = 0  # lines of a saved file without a time: stamped with the file's mtime
    overrun: int = 0  # /dev/kmsg records the ring buffer overwrote before we read them
    queue_full: int = 0  # journalctl lines beyond the follower's buffer
    oversize: int = 0  # lines of a saved file longer than LINE_MAX: skipped whole
    sxid_no_gpu: int = 0  # an SXid on a host with no GPU in the PCI map to carry it
    fabric_lines: int = 0  # NIC and AER lines counted (producers/kmsg_fabric.py)
    fabric_no_gpu: int = 0  # a NIC or AER line on a host with no GPU in the PCI map to carry it
    bad_timestamp: int = 0  # a line of a known layout whose time is not a number or a date that exists
    samples_capped: int = 0  # sample records a saved file did not get: past max_sample_records
    duplicates: int = 0  # an event line a saved file holds twice (dmesg and the journal): read once

    def summary(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "xid_lines": self.xid_lines,
            "gpu_lost_lines": self.gpu_lost_lines,
            "sxid_lines": self.sxid_lines,
            "sxid_detail_lines": self.sxid_detail_lines,
            "fabric_lines": self.fabric_lines,
            "records": self.records,
            "backlog_events": self.backlog_events,
            "lines_without_time": self.no_timestamp,
            "dropped.unmapped_pci": self.unmapped_pci,
            "dropped.unparsable_xid": self.unparsable_xid,
            "dropped.kmsg_overrun": self.overrun,
            "dropped.queue_full": self.queue_full,
            "dropped.oversize_line": self.oversize,
            "dropped.sxid_without_gpu": self.sxid_no_gpu,
            "dropped.event_without_gpu": self.fabric_no_gpu,
            "dropped.bad_timestamp": self.bad_timestamp,
            "samples_capped": self.samples_capped,
            "duplicate_lines": self.duplicates,  # not lost: the same kernel record, counted once
        }


class DevKmsgReader:
    """``/dev/kmsg``: one record per read(2), non-blocking; from the start of the ring buffer."""

    def __init__(self, path: str = "/dev/kmsg", stats: KmsgStats | None = None) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.stats = stats or KmsgStats()

    def read(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:
                return out
            except BrokenPipeError:  # EPIPE: records were overwritten before we read them
                self.stats.overrun += 1
                continue
            if not chunk:
                return out
            out.extend(chunk.decode("utf-8", "replace").splitlines())

    def close(self) -> None:
        os.close(self.fd)


class JournalReader:
    """``journalctl -k -b -f -o json`` (argv, no shell), its lines gathered by a thread."""

    def __init__(
        self, journalctl: str = "journalctl", stats: KmsgStats | None = None, max_lines: int = 100_000
    ) -> None:
        self.stats = stats or KmsgStats()
        self.proc = subprocess.Popen(
            [journalctl, "-k", "-b", "-f", "-o", "json", "--no-pager"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        self.q: queue.Queue[str] = queue.Queue(maxsize=max_lines)
        self.thread = threading.Thread(target=self._pump, name="journalctl", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        out = self.proc.stdout
        # Bounded reads: a line without a newline must not grow without bound in this thread.
        for text in iter(lambda: out.readline(LINE_MAX), ""):
            if len(text) >= LINE_MAX and not text.endswith("\n"):
                self.stats.oversize += 1
                while text and not text.endswith("\n"):  # the rest of it, a bounded piece at a time
                    text = out.readline(LINE_MAX)
                continue
            try:
                self.q.put_nowait(text)
            except queue.Full:
                self.stats.queue_full += 1

    def read(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def load_pci_map(path: str | None, nvidia_smi: str = "nvidia-smi") -> dict[PciKey, int]:
    """``--pci-map FILE`` if given, else this host's ``nvidia-smi``; ``ValueError``/``OSError``
    with the reason when neither works."""
    if path:
        text, more = read_capped(path, MAX_PCI_MAP_CHARS)
        if more:
            raise ValueError(f"PCI map {path} is over {MAX_PCI_MAP_CHARS} characters: not a saved nvidia-smi map")
        return parse_pci_map(text)
    try:
        return nvidia_smi_pci_map(nvidia_smi)
    except (OSError, subprocess.SubprocessError) as e:
        raise OSError(
            f"cannot map PCI bus ids to GPU indices: {nvidia_smi} failed ({e}); give --pci-map FILE "
            "(saved `nvidia-smi --query-gpu=index,pci.bus_id --format=csv`)"
        ) from e


__all__ = [
    "BOOT_MAX",
    "EPOCH_MAX",
    "LINE_MAX",
    "DevKmsgReader",
    "JournalReader",
    "KmsgStats",
    "Line",
    "PciKey",
    "load_pci_map",
    "local_time",
    "nvidia_smi_pci_map",
    "parse_line",
    "parse_pci_map",
    "pci_key",
]
