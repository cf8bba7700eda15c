"""NVIDIA Fabric Manager's log as a telemetry source: NVSwitch, NVLink and fabric errors, counted.

Fabric Manager (``nv-fabricmanager``, on every NVSwitch system) writes its log to
``LOG_FILE_NAME`` in ``fabricmanager.cfg`` (default ``/var/log/fabricmanager.log``), one message
per line (``[%b %d %Y %H:%M:%S] [LEVEL] [tid N] message``, the level one of ``CRITICAL``,
``ERROR``, ``WARNING``, ``INFO``: ``LOG_LEVEL`` in ``fabricmanager.cfg``), continuation lines of
a multi-line message without the prefix; a message logged before its thread is known has no
``[tid N]`` (GPUd's topology-mismatch example); a journal's or syslog's copy of these lines
(``<time> <host> nv-fabricmanager[pid]: [...] [ERROR] ...``) reads the same, charged to its host::

    [Jul 13 2023 06:39:42] [ERROR] [tid 1259] detected NVSwitch fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 45
    [Feb 25 2025 13:59:45] [INFO] [tid 1803] multicast group 0 is freed.
    [Sep 08 2025 23:21:50] [ERROR] detected number of NVSwitches don't match with any supported system topology, aborting fabric manager

``gpuwarden produce fabric-manager`` reads such a file once (``--file``) or follows it as it
grows (``--follow``, rotation and truncation included) and counts, per host since the producer
started, the errors GPUd's fabric-manager component and NVIDIA's Fabric Manager user guide name
(catalogue fields 9520-9523, docs/producers.md#fabric-manager-log):

- ``detected NVSwitch fatal error <SXid>`` -> ``fm_nvswitch_fatal_errors``;
- ``detected NVSwitch non-fatal error <SXid>`` -> ``fm_nvswitch_nonfatal_errors``;
- NVLink failures: ``failed to find the GPU handle N in the multicast team ...`` (GPUd's "NVSwitch
  NVLink failure"), ``Fabric Manager detected GPU NVL [Non ]Fatal error``, ``Trunk port failure
  detected``, ``Detected a trunk link failure event``, and any ``[CRITICAL]``/``[ERROR]``/
  ``[WARNING]`` line about NVLink training or a link that failed or went down -> ``fm_nvlink_errors``;
- every other ``[CRITICAL]`` or ``[ERROR]`` line (topology mismatch, NVSwitch driver queries that
  failed, configuration errors) -> ``fm_errors``.

The records are the kernel-log producer's (``producers/kmsg.py``: the same sampling around the
events, the same follower and backlog rules, DCGM records on every GPU of the PCI map) with these
counters as host fields; the log's times are local time, as Fabric Manager writes them.

>>> parse_fm_line("[Jul 13 2023 06:39:42] [ERROR] [tid 1259] detected NVSwitch fatal error 12028 on fid 0").msg
'[ERROR] detected NVSwitch fatal error 12028 on fid 0'
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any

from pipeline.numeric import ascii_int
from pipeline.recordchecks import TS_MAX, TS_MIN
from pipeline.schema import DcgmRecord
from producers.kmsg import KernelLog
from producers.kmsg_input import LINE_MAX, KmsgStats, Line, PciKey, iso_time, local_time

log = logging.getLogger(__name__)

FIELDS = ("fm_nvswitch_fatal_errors", "fm_nvswitch_nonfatal_errors", "fm_nvlink_errors", "fm_errors")
LABEL_MAX = 200
SYSLOG_LEVEL = "UNKNOWN"  # the level of a line Fabric Manager sent to syslog, which prints none
DEFAULT_PATH = "/var/log/fabricmanager.log"
READ_MAX = 4 * 1024 * 1024  # bytes a follower reads per poll: a burst is read over several polls

_PREFIX = re.compile(
    r"^\[(?P<date>[A-Z][a-z]{2} [ \d]?\d \d{4} \d\d:\d\d:\d\d)\] \[(?P<level>[A-Z]{1,16})\] "
    r"(?:\[tid (?P<tid>\d{1,12})\] ?|(?!\[tid ))(?P<msg>.*)$",  # [tid N] absent on some startup errors
    re.ASCII,
)
# A journal's or syslog's copy (``journalctl -u nvidia-fabricmanager``, ``LOG_USE_SYSLOG=1``): its
# time, host and Fabric Manager's tag (``nv-fabricmanager[pid]``, the start script's, or the 15
# characters of a process name) before Fabric Manager's own prefix, whose time has the year. Only
# Fabric Manager's tag: nvidia-imex and others print the same prefix.
_JOURNAL = re.compile(
    r"^(?:(?P<syslog>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)(?P<frac>\.\d{1,9})?"
    r"|(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)) "
    r"(?:(?P<host>[^\s:]{1,255}) )?(?:nv-fabricmanage|nvidia-fabricmanager)[\w.-]{0,32}(?:\[\d{1,12}\])?: ",
    re.ASCII,
)
_LOOSE_PREFIX = re.compile(r"^\[[^\]]{0,64}\] \[[A-Za-z]{1,16}\](?: \[tid [^\]]{0,32}\])?")
_SWITCH = re.compile(
    r"detected NVSwitch (?P<kind>fatal|non-fatal) error (?P<code>\d+)"
    # Each id whole or not at all: a longer one is no label ("31337" is not "3133").
    r"(?:.*?pci bus id (?P<pci>[0-9a-fA-F:.]{1,20})(?![0-9a-fA-F:.]))?"
    r"(?:.*?physical id (?P<phys>\d{1,4})(?!\d))?(?:.*?port (?P<port>\d{1,4})(?!\d))?",
    re.ASCII,
)
_NVLINK = re.compile(
    r"failed to find the GPU handle \d+ in the multicast team|GPU NVL (?:Non )?Fatal error|Trunk port failure"
    r"|trunk link failure"
    # No "\w*" before ".{0,N}": it backtracks over every letter of a word, quadratic on a long line.
    r"|(?i:nvlink.{0,80}(?:train\w*|fail\w*|down|error)|(?:train|fail).{0,88}nvlink)",
    re.ASCII,
)


def parse_fm_line(text: str, *, year: int | None = None) -> Line | None:
    """A Fabric Manager log line as a ``Line`` (``msg`` is ``[LEVEL] message``, ``ts`` local
    time); ``None`` for a continuation line of a multi-line message; a line with the prefix whose
    date does not exist has ``error="bad_timestamp"``. A journal's or syslog's time, host and
    Fabric Manager's tag before the prefix are read past (``host`` the journal's). ``year`` is
    unused: the log writes it.

    >>> parse_fm_line("Message payload details:Team release request") is None
    True
    >>> parse_fm_line("[Feb 30 2025 13:59:45] [INFO] [tid 1803] x").error
    'bad_timestamp'
    """
    text = text.rstrip("\r\n").lstrip("\0")  # NULs: a crash's unwritten blocks before the next line
    host = None
    j = _JOURNAL.match(text)
    if j is not None and text.startswith("[", j.end()):  # the journal's time has no year: Fabric Manager's is read
        text, host = text[j.end() :], j["host"]
    elif j is not None:
        return _syslog_line(j, text[j.end() :], year)
    m = _PREFIX.match(text)
    if m is None:
        if _LOOSE_PREFIX.match(text):  # the prefix with a time or thread that is not one
            return Line(text, error="bad_timestamp")
        return None
    ts = local_time(m["date"], "%b %d %Y %H:%M:%S")
    if ts is not None and not TS_MIN <= ts <= TS_MAX:  # a year no record can carry (the decoder's range)
        ts = None
    msg = f"[{m['level']}] {m['msg']}"
    return Line(msg, ts=ts, host=host) if ts is not None else Line(msg, error="bad_timestamp")


def _syslog_line(j: re.Match[str], msg: str, year: int | None) -> Line:
    """Fabric Manager's own output to syslog (``LOG_USE_SYSLOG=1``): the message without its
    prefix, at the syslog's time (without a year: ``year``'s, else this one's) and of no known
    level, so only what says its severity itself (an NVSwitch SXid) counts."""
    if j["iso"] is not None:
        ts, yearless = iso_time(j["iso"]), False
    else:
        ts = local_time(f"{year or time.localtime().tm_year} {j['syslog']}", "%Y %b %d %H:%M:%S")
        ts, yearless = (ts + float(j["frac"] or 0) if ts is not None else None), True
    if ts is None or not TS_MIN <= ts <= TS_MAX:
        return Line(f"[{SYSLOG_LEVEL}] {msg}", error="bad_timestamp", yearless=yearless)
    return Line(f"[{SYSLOG_LEVEL}] {msg}", ts=ts, host=j["host"], yearless=yearless)


def classify(msg: str) -> tuple[str, dict[str, str]] | None:
    """The counter a ``[LEVEL] message`` moves and its labels, or ``None``.

    >>> classify("[ERROR] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61")[0]
    'fm_nvswitch_nonfatal_errors'
    >>> classify("[INFO] multicast group 0 is freed.") is None
    True
    """
    level, _, body = msg.partition("] ")
    level = level.lstrip("[")
    labels = {"fm.level": level, "fm.message": body[:LABEL_MAX]}
    s = _SWITCH.search(body)
    if s is not None and ascii_int(s["code"], 9) is not None:
        labels["fm.sxid"] = s["code"]
        for key in ("pci", "phys", "port"):
            if s[key] is not None:
                labels[f"fm.nvswitch_{key}"] = s[key]
        return ("fm_nvswitch_fatal_errors" if s["kind"] == "fatal" else "fm_nvswitch_nonfatal_errors"), labels
    if level in ("CRITICAL", "ERROR", "FATAL", "WARNING", "WARN") and _NVLINK.search(body) is not None:
        return "fm_nvlink_errors", labels
    if level in ("CRITICAL", "ERROR", "FATAL"):  # CRITICAL: FM's most severe level (LOG_LEVEL=1)
        return "fm_errors", labels
    return None


@dataclass
class FabricManagerStats(KmsgStats):
    """The exit summary and ``/metrics`` (docs/producers.md#fabric-manager-log)."""

    error_lines: int = 0

    def summary(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "error_lines": self.error_lines,
            "records": self.records,
            "backlog_events": self.backlog_events,
            "dropped.oversize_line": self.oversize,
            "dropped.bad_timestamp": self.bad_timestamp,
            "dropped.event_without_gpu": self.fabric_no_gpu,
            "samples_capped": self.samples_capped,
        }


class FabricManagerLog(KernelLog):
    """The kernel-log state and records, fed Fabric Manager's messages: each host's counters."""

    def __init__(self, pci_map: dict[PciKey, int], *, host: str | None = None) -> None:
        super().__init__(pci_map, host=host)
        self.fm_stats = FabricManagerStats()
        self.stats = self.fm_stats
        self.counters: dict[str, dict[str, int]] = {}

    def wants(self, msg: str) -> bool:
        levels = ("[CRITICAL]", "[ERROR]", "[FATAL]", "[WARNING]", "[WARN]")
        return msg.startswith(levels) or "detected NVSwitch" in msg

    def apply(self, line: Line, ts: float, *, emit: bool = True) -> list[DcgmRecord]:
        got = classify(line.msg) if self.wants(line.msg) else None
        if got is None:
            return []
        host = self.host_of(line)
        self.fm_stats.error_lines += 1
        if not emit:  # a follower's backlog: the counters count from the producer's start
            self.stats.backlog_events += 1
            return []
        out = self._baseline(host, ts)
        counts = self.counters.setdefault(host, dict.fromkeys(FIELDS, 0))
        counts[got[0]] += 1
        if not self._state(host).xid:
            self.stats.fabric_no_gpu += 1
        return out + self.snapshot(ts, host, labels=got[1])

    def _record(self, ts: float, host: str, gpu: int, st: Any, labels: dict[str, str]) -> DcgmRecord:
        from pipeline.schema import dcgm

        self.stats.records += 1
        counts = self.counters.get(host) or dict.fromkeys(FIELDS, 0)
        return dcgm(ts, host, gpu, {k: float(v) for k, v in counts.items()}, labels=labels)


class FileFollower:
    """A growing text file read line by line, from its start: what was there before the producer
    started is the backlog (folded, not counted, like the kernel ring buffer); a file replaced
    (rotation: another inode, or none yet) is read to its end, then the new one from its start; a
    file truncated is read again from its start. A line longer than
    ``LINE_MAX`` is skipped whole (``dropped.oversize_line``)."""

    def __init__(self, path: str, stats: KmsgStats | None = None, read_max: int = READ_MAX) -> None:
        self.path = path
        self.stats = stats or KmsgStats()
        self.read_max = read_max
        self._fh: Any = None
        self._ino: int | None = None
        self._buf = b""
        self._skipping = False  # inside an oversize line: drop up to its newline
        self._moved = False  # the name is another file now (rotation): this one's rest, then that one
        self._warned = False  # that the path is not a regular file

    def _open(self) -> bool:
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None  # not there yet (Fabric Manager not started), or between a rotation's rename and its new file
        except OSError:
            return False  # not readable now: the file we hold is kept (read again from its start, it would count twice)
        if self._fh is not None:
            if st is not None and st.st_ino == self._ino and st.st_size < self._fh.tell():
                self._reset()  # truncated (copytruncate): read again from its start
            else:
                # Another file under the name, or none: the old one's rest is read first (what was
                # written before the rotation), then the new one (read).
                self._moved = st is None or st.st_ino != self._ino
                return True
        if st is None:
            return False
        try:
            # Non-blocking: a FIFO under the name would block the open (and each read) for ever.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if not self._warned:
                log.warning("%s is not a regular file: not read until it is one", self.path)
                self._warned = True
            return False
        self._fh = os.fdopen(fd, "rb")
        self._ino = st.st_ino
        return True

    def _reset(self) -> None:
        self.close()
        self._buf, self._skipping, self._moved = b"", False, False

    def read(self) -> list[str]:
        if not self._open():
            return []
        chunk = self._fh.read(self.read_max)
        if self._moved and len(chunk) < self.read_max:  # the old file's end: on to the new one
            out = self._lines(chunk)
            self._reset()
            return out + (self._lines(self._fh.read(self.read_max)) if self._open() else [])
        return self._lines(chunk)

    def _lines(self, chunk: bytes) -> list[str]:
        """The whole lines ``chunk`` completes; a partial last line waits for its newline."""
        if not chunk:
            return []
        data = self._buf + chunk
        parts = data.split(b"\n")
        self._buf = parts.pop()
        out: list[str] = []
        for raw in parts:
            if self._skipping:
                self._skipping = False
                continue
            if len(raw) > LINE_MAX:
                self.stats.oversize += 1
                continue
            out.append(raw.decode("utf-8", "replace"))
        if len(self._buf) > LINE_MAX:  # no newline in sight: drop what we hold, and the rest of it
            self.stats.oversize += 0 if self._skipping else 1
            self._buf, self._skipping = b"", True
        return out

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


__all__ = [
    "DEFAULT_PATH",
    "FIELDS",
    "FabricManagerLog",
    "FabricManagerStats",
    "FileFollower",
    "classify",
    "parse_fm_line",
]
