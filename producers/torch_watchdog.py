"""PyTorch's ProcessGroupNCCL watchdog lines in a training log -> ``ProgressRecord``s.

When a collective hangs, each rank's watchdog (``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``)
logs what it knows: the work that timed out and how far its process group had come. Those are
the lines that name the ranks a hang is blamed on: a rank whose last completed work lags its
peers' is a suspect (docs/producers.md#collective-progress-pytorch-watchdog-and-nccl-ras has the
table of layouts and versions). Read here:

- ``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=N, OpType=OP[, NumelIn=..,
  NumelOut=..], Timeout(ms)=T) ran for R milliseconds before timing out.`` (every version since
  1.x; ``NumelIn``/``NumelOut`` since 2.1);
- ``failure detected by watchdog at work sequence id: N PG status: last enqueued work: A, last
  completed work: B`` (2.4 and later);
- ``Timeout at NCCL work: N, last enqueued NCCL work: A, last completed NCCL work: B.`` (2.2, 2.3);
- ``Received a dump signal due to a collective timeout from ... Last enqueued NCCL work: A, last
  completed NCCL work: B.``: a rank that did not time out itself, told by a peer that did (its
  progress, the evidence that tells the lagging ranks from the waiting ones);
- ``Some NCCL operations have failed or timed out.``: the only word older releases give on some
  ranks (a timeout without numbers).

Around the message: the glog/c10 header (``[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629]``
since 2.4, ``[E ProcessGroupNCCL.cpp:828]`` without a time before, glog's own ``E1218
20:27:21.426415 12345 ProcessGroupNCCL.cpp:629]``), the rank prefix (``[rank3]:``, 2.2+), the
log prefix (``[Rank 1]``, ``[PG 0 Rank 2]``, 2.4's ``[PG 0 (default_pg) Rank 2]``, ``[PG ID 0 PG GUID
0(default_pg) Rank 1]``), torchrun's ``--tee`` prefix (``[default0]:``, the local rank) and Ray's
(``(WorkerDict pid=..)``, ``(pid=.., ip=..)`` for a worker on another node, colored or not, one
within another where a worker's output passes through another's), and whatever stands before them
(a progress bar without its newline). Ray's pid (with its ip) names the worker process a line came
from: a process where the line prints no rank prefix.
A multi-rank log interleaves all of them; lines of one rank about the same work (the timeout,
the PG status, the exception that repeats it) become one record.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TextIO

from pipeline.decode import MAX_ID_LEN, MAX_RANKS, MAX_SEQ
from pipeline.numeric import ascii_int
from pipeline.recordchecks import bad_host
from pipeline.schema import NicRecord, ProgressRecord
from producers.nccl_ib import IbLog, IbStats
from producers.textinput import (
    CUT_LAST_LINE,
    GzipDamage,
    damage_counts,
    gzip_damage,
    open_text,
    stdin,
    warn_cut_line,
    warn_damage,
)

log = logging.getLogger(__name__)

LINE_MAX = 64 * 1024  # a watchdog line is ~400 characters; longer is not one (skipped whole, counted)
MAX_RECORDS = 1_000_000  # distinct (rank, work) reports one log may make; the rest counted
SEQ_DIGITS = 19  # an int64

# Prefixes, each optional, in the order they stack: Ray's worker tag, torchrun's local rank, the
# rank prefix, the c10/glog header.
# Ray's tag names the actor, which may hold brackets: "(MegatronPolicyWorker[rank=8] pid=3098870)";
# "(pid=.., ip=..)" for a worker on another node than the driver's (ray/_private/worker.py,
# print_worker_logs: "{DIM}{color}({name} pid={pid}[, ip={ip}]){RESET} {line}").
_SGR = r"(?:\x1b\[[0-9;]{0,16}m){0,4}"
_SGR_ANY = re.compile(r"\x1b\[[0-9;]{0,16}m")
_RAY = re.compile(_SGR + r"\([^()]*?\bpid=([0-9]{1,10})(?:, ip=([0-9A-Za-z.:%_-]{1,255}))?\)" + _SGR + r"\s*")
MAX_RAY_TAGS = 8  # Ray tags read off one line (a worker's output passed through others'); the rest are text
# Ray's log deduplication (ray/_private/ray_logging.py, DedupState.formatted): the last of N alike
# lines of other workers, printed with " [repeated Nx across cluster]"; the N - 1 before it are gone.
_RAY_REPEATED = re.compile(r" \[repeated ([0-9]{1,9})x across cluster\]")
_TORCHRUN = re.compile(r"\[default(\S+?)\]:")
_RANKPFX = re.compile(r"\[rank(\S+?)\]:")
# [E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] | [E ProcessGroupNCCL.cpp:828] | glog's own. The
# month is not zero-padded ("[E709 17:05:38...]").
_HEADER = re.compile(
    r"\[?[EWIF](?:(\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)?(?: +\d+)?)? *([\w.]+\.(?:cpp|hpp|cc|h)):\d+\] ?"
)
# Where those prefixes start when something else came first on the line: output that lacked its
# newline (a progress bar, a traceback's carets), a log shipper's or launcher's tag.
# Every repeat is bounded: tried at each place of a 64 KiB line, an open one costs the square of it.
# torchrun's "[default3]:" without "[rankN]:" after it (before 2.2, or a "what():" repeat) and glog's
# own header count too: after "srun --label"'s "0: " or a log shipper's time, they may be all that
# names the process and the time.
_EMBEDDED = re.compile(
    r"(?:\[default[^\]\s\[]{0,16}\]:)?\[rank[0-9]{1,10}\]:\[[EWIF]|\[[EWIF][0-9]{3,4} [0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"|\[default[0-9]{1,6}\]:|(?<![\w.:])[EWIF][0-9]{3,4} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{1,9} {1,16}[0-9]{1,10} "
)
# The log prefix: [Rank 1], [PG 0 Rank 2], [PG 0 (default_pg) Rank 2], [PG ID 0 PG GUID 0(default_pg) Rank 1].
# The name is the job's own (new_group's group_desc): it may hold brackets and parentheses.
_LOGPFX = re.compile(
    r"\[(?:PG ID (?P<pgid>\S{1,1024}) PG GUID (?P<guid>[^\s(\]]{1,1024})(?:\((?P<name>.{0,1024}?)\))? "
    r"|PG (?P<pg>\S{1,1024}) (?:\((?P<desc>.{0,1024}?)\) )?)?Rank (?P<rank>\S{1,32}?)\]"
)
_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\((?P<args>[^)]*(?:\)[^)]*)?)\) ran for (?P<ran>\S+) "
    r"milliseconds before timing out"
)
_FAILURE = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\S+) PG status: last enqueued work: (?P<enq>-?\S+?),"
    r" last completed work: (?P<done>-?[^\s.,]+)"
)
# "Exception (either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL
# work: 1582, last completed NCCL work: 1579." (PyTorch 2.4-2.6; "NCCL error is detected ..." since):
# on a rank whose work failed, often its only line.
_DETECTED = re.compile(
    r"detected by watchdog at work: (?P<seq>[^\s,]+), last enqueued NCCL work: (?P<enq>-?[^\s,]+), "
    r"last completed NCCL work: (?P<done>-?[^\s.,]+)"
)
_TIMEOUT_AT = re.compile(
    r"Timeout at NCCL work: (?P<seq>\S+?), last enqueued NCCL work: (?P<enq>-?\S+?), last completed NCCL work: "
    r"(?P<done>-?[^\s.,]+)"
)
_DUMP = re.compile(
    r"Received a dump signal due to a collective timeout from (?P<from>.*?)(?: and we will try our best to dump "
    r"the debug info\.)? ?Last enqueued NCCL work: (?P<enq>-?\S+?), last completed NCCL work: (?P<done>-?[^\s.,]+)"
)
_FAILED = "Some NCCL operations have failed or timed out"
# Words a watchdog line holds: a line with one that fits no layout is counted, never guessed at.
_MARKERS = ("Watchdog caught collective operation timeout", "failure detected by watchdog",
            "detected by watchdog at work", "Timeout at NCCL work",
            "Received a dump signal due to a collective timeout", _FAILED)  # fmt: skip
_KV = re.compile(r"(\w+(?:\(ms\))?)=([^,]*)")
# A log's last line without its newline that could be a watchdog or NCCL line cut short: a word of
# one, or the start of a c10/glog error or warning line before them. A crashed job's log often ends
# mid-line (a progress bar, block-buffered stdout): a line that is none of these loses us nothing.
_MAYBE_OURS = re.compile(
    r"NCCL|[Ww]atchdog|NET/IB|ibv_|\[rank[0-9]{1,10}\]:\[[EW]|(?<![\w.:])\[?[EW][0-9]{3,4} [0-9]{2}:[0-9]{2}"
)
# NCCL's debug lines (NCCL_DEBUG=INFO), which no layout reads: a cut one loses us nothing.
_NCCL_INFO = re.compile(r"\bNCCL INFO\b")


@dataclass
class WatchdogStats:
    lines: int = 0
    watchdog_lines: int = 0
    records: int = 0
    no_timestamp: int = 0  # watchdog lines without a time: stamped with the file's mtime
    oversize: int = 0  # lines longer than LINE_MAX: skipped whole
    unparsable: int = 0  # a watchdog line that fits no layout (cut short, altered)
    bad_number: int = 0  # a line of a known layout whose number is not one (Unicode digits, 20+ digits)
    no_rank: int = 0  # a watchdog line that names no rank anywhere
    implausible_seq: int = 0  # last completed past last enqueued (garbage): that field left out
    bad_name: int = 0  # a PG id, PG name or op not printable or past MAX_ID_LEN: that field left out
    ray_deduplicated: int = 0  # watchdog lines Ray's log deduplication left out before the log was written
    too_many: int = 0  # reports past MAX_RECORDS
    cut_last_line: int = 0  # a last line without its newline that could be ours (``_MAYBE_OURS``): not read
    cut_text: str = ""  # that line, for the warning (not a count)

    def summary(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "watchdog_lines": self.watchdog_lines,
            "records": self.records,
            "lines_without_time": self.no_timestamp,
            "dropped.oversize_line": self.oversize,
            "dropped.unparsable_line": self.unparsable,
            "dropped.bad_number": self.bad_number,
            "dropped.no_rank": self.no_rank,
            "implausible_seq_cleared": self.implausible_seq,
            "bad_name_cleared": self.bad_name,
            "ray_deduplicated_lines": self.ray_deduplicated,
            "dropped.too_many_records": self.too_many,
            CUT_LAST_LINE: self.cut_last_line,
        }


def _seq(text: str | None, minus_one: bool = False) -> int | None:
    """A work sequence number (ASCII digits, within int64), or -1 where PyTorch prints it."""
    if text is None:
        return None
    if minus_one and text == "-1":
        return -1
    n = ascii_int(text, SEQ_DIGITS)
    return n if n is not None and n <= MAX_SEQ else None


def _name(text: str | None, stats: WatchdogStats) -> str | None:
    """A PG id, PG name or op as a record may carry it (docs/architecture.md §3), else None
    (counted): the decoder would dead-letter the whole record for it."""
    if not text:
        return None
    if len(text) <= MAX_ID_LEN and text.isprintable():
        return text
    stats.bad_name += 1
    return None


class _Bad(Exception):
    """A line of a known layout whose number is not one."""


def _num(text: str | None, minus_one: bool = False) -> int | None:
    if text is None:
        return None
    n = _seq(text, minus_one)
    if n is None:
        raise _Bad(text)
    return n


@dataclass
class Prefix:
    """What the stacked prefixes of one line say."""

    local_rank: int | None = None
    rank: int | None = None
    ts: float | None = None
    rest: str = ""
    ray: str | None = None  # Ray's worker: "pid[@ip]", outermost first, "/" between tags within tags
    ray_pid: int | None = None  # the innermost tag's: the process that printed the line
    ray_ip: str | None = None  # the node it ran on: the innermost tag's ip, else the nearest outer one's


def strip_prefixes(line: str, year: int) -> Prefix:
    """The prefixes of a log line read off, the message left in ``rest``.

    >>> p = strip_prefixes("[default3]:[rank11]:[E709 17:05:38.162 ProcessGroupNCCL.cpp:632] [Rank 11] x", 2025)
    >>> (p.local_rank, p.rank, p.rest)
    (3, 11, '[Rank 11] x')
    >>> p = strip_prefixes("(WorkerDict pid=3490362, ip=10.0.0.5) [rank1]:[Rank 1] x", 2025)
    >>> (p.ray, p.ray_pid, p.ray_ip, p.rank)
    ('3490362@10.0.0.5', 3490362, '10.0.0.5', 1)
    """
    p = Prefix()
    s = line.strip()
    tags: list[str] = []
    while len(tags) < MAX_RAY_TAGS and (m := _RAY.match(s)):
        p.ray_pid = int(m.group(1))
        p.ray_ip = m.group(2) or p.ray_ip  # a tag without an ip: the node of the worker that printed it
        tags.append(m.group(1) + ("@" + m.group(2) if m.group(2) else ""))
        s = s[m.end() :]
    p.ray = "/".join(tags) or None
    if not (_TORCHRUN.match(s) or _RANKPFX.match(s) or _HEADER.match(s)) and (m := _EMBEDDED.search(s)):
        s = s[m.start() :]
    m = _TORCHRUN.match(s)
    if m:
        p.local_rank = ascii_int(m.group(1), 6)
        s = s[m.end() :]
    m = _RANKPFX.match(s)
    if m:
        p.rank = ascii_int(m.group(1), 9)
        s = s[m.end() :]
    m = _HEADER.match(s)
    if m:
        if m.group(1) is not None:
            p.ts = _glog_time(year, *m.group(1, 2, 3, 4, 5))
        s = s[m.end() :]
    p.rest = s
    return p


def _glog_time(year: int, mon: str, day: str, hh: str, mm: str, ss: str) -> float | None:
    """glog's ``MMDD HH:MM:SS`` (the month one or two digits) in the local time of ``year``;
    None for a date that does not exist or digits that are not ASCII."""
    if not (mon + day + hh + mm + ss).isascii():
        return None
    text = f"{year:04d}{int(mon):02d}{day} {hh}{mm}{ss}"
    try:
        return time.mktime(time.strptime(text, "%Y%m%d %H%M%S"))
    except (ValueError, OverflowError):
        return None


# A process in a log: ("rank", its global rank) or ("local", its tag: torchrun's local rank, Ray's
# worker, or both, ``_tag``); None where its lines name none of them.
_Process = tuple[str, Any] | None


def _tag(rep: "_Report") -> Any:
    """What names ``rep``'s process where no global rank does: torchrun's local rank, Ray's worker
    (its pid on its node: a worker's children that share its output share it too, as torchrun's
    ranks of several hosts share a local rank), or both (torchrun under a Ray worker); None."""
    if rep.ray is None:
        return rep.local_rank
    return (rep.ray, rep.local_rank)


@dataclass
class _Report:
    """One rank's report about one piece of work, gathered from its lines."""

    ts: float
    rank: int
    state: str
    local_rank: int | None = None
    global_rank: int | None = None  # "[rankN]:", the default PG's rank, where ``rank`` is a subgroup's
    comm: str | None = None
    comm_name: str | None = None
    seq: int | None = None
    op: str | None = None
    timeout_ms: int | None = None
    ran_ms: int | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None
    dump_from: str | None = None
    ray: str | None = None  # Ray's worker tag (``Prefix.ray``)
    ray_pid: int | None = None
    ray_ip: str | None = None

    def merge(self, o: "_Report") -> None:
        self.ts = min(self.ts, o.ts)
        for k in ("comm", "comm_name", "seq", "op", "timeout_ms", "ran_ms", "last_enqueued", "last_completed",
                  "local_rank", "global_rank", "dump_from", "ray", "ray_pid", "ray_ip"):  # fmt: skip
            if getattr(self, k) is None:
                setattr(self, k, getattr(o, k))


def parse_line(line: str, *, year: int, default_ts: float, stats: WatchdogStats) -> _Report | None:
    """The watchdog report one log line makes, or None (not a watchdog line, or one counted as
    dropped in ``stats``)."""
    if not any(w in line for w in _MARKERS):
        return None
    stats.watchdog_lines += 1
    if "\x1b" in line:
        # Colors a wrapper or log viewer put around the line ("... last completed work: 4\x1b[0m")
        # would run into its last number.
        line = _SGR_ANY.sub("", line)
    p = strip_prefixes(line, year)
    if p.ts is not None and p.ts > default_ts + 86400:
        # glog prints no year: a date past the log's own end is last year's (a December
        # line in a log written in January).
        p = strip_prefixes(line, year - 1)
    msg = p.rest
    ts = p.ts
    if ts is None:
        stats.no_timestamp += 1
        ts = default_ts
    # The log prefix nearest the message speaks for it: in "[PG 0 Rank 1] ... terminated with
    # exception: [Rank 1] Watchdog caught ..." both name the same rank, the first the PG.
    rank, comm, name = p.rank, None, None
    for m in _LOGPFX.finditer(msg):
        r = ascii_int(m.group("rank"), 9)
        if r is None:
            stats.bad_number += 1
            return None
        rank = r
        pg = m.group("guid") or m.group("pg") or m.group("pgid")
        if pg is not None:
            comm, name = pg, m.group("name") or m.group("desc") or name
    if rank is None or rank >= MAX_RANKS:
        stats.no_rank += 1
        return None
    rep = _Report(ts=ts, rank=rank, state="timeout", local_rank=p.local_rank, global_rank=p.rank,
                  comm=_name(comm, stats), comm_name=_name(name, stats), ray=p.ray, ray_pid=p.ray_pid,
                  ray_ip=p.ray_ip)  # fmt: skip
    if p.ray is not None and (rr := _RAY_REPEATED.search(msg)) is not None:
        stats.ray_deduplicated += max(int(rr.group(1)) - 1, 0)
    try:
        if (t := _TIMEOUT.search(msg)) is not None:
            kv = dict(_KV.findall(t.group("args")))
            rep.seq = _num(kv.get("SeqNum"))
            rep.op = _name(kv.get("OpType"), stats)
            rep.timeout_ms = _num(kv.get("Timeout(ms)"))
            rep.ran_ms = _num(t.group("ran"))
            if rep.seq is None:
                stats.unparsable += 1
                return None
        elif (f := _FAILURE.search(msg) or _TIMEOUT_AT.search(msg) or _DETECTED.search(msg)) is not None:
            rep.seq = _num(f.group("seq"))
            rep.last_enqueued = _num(f.group("enq"), True)
            rep.last_completed = _num(f.group("done"), True)
        elif (d := _DUMP.search(msg)) is not None:
            rep.dump_from = d.group("from").strip()[:200] or None
            # "from this local rank": this rank's own watchdog found the timeout (its shouldDump_),
            # so the line is that timeout, known early; from another rank it is this one's progress.
            if rep.dump_from != "this local rank":
                rep.state = "progress"
            rep.last_enqueued = _num(d.group("enq"), True)
            rep.last_completed = _num(d.group("done"), True)
        elif _FAILED in msg:
            pass  # a timeout without numbers: what the oldest releases print on every rank
        else:
            stats.unparsable += 1
            return None
    except _Bad:
        stats.bad_number += 1
        return None
    if rep.last_completed is not None and rep.last_enqueued is not None and rep.last_completed > rep.last_enqueued:
        # Seen in real logs (a completed seq of 7.6e16 with 1 enqueued): uninitialised, not progress.
        stats.implausible_seq += 1
        rep.last_completed = None
    return rep


_Work = tuple[Any, ...]  # (PG rank, "timeout", seq) or (PG rank, "progress", last enqueued, last completed)


def _work(rep: _Report) -> _Work:
    if rep.state == "progress":
        return (rep.rank, "progress", rep.last_enqueued, rep.last_completed)
    return (rep.rank, "timeout", rep.seq)


def _first(reps: Iterable[_Report]) -> _Report:
    """The earliest report (by time, then PG): where a line without a PG joins, whatever the order."""
    return min(reps, key=lambda r: (r.ts, r.comm or ""))


class _Reports:
    """A log's reports, one per process, communicator, PG rank and piece of work, the same for
    any order of the log's lines.

    The PG rank alone does not tell processes apart: ``Rank 0`` of every tensor-parallel group
    reports its own group's seq, so a combined log holds the same (PG rank, seq) from many
    processes. A process is the global rank its lines print (``[rankN]:``), else its tag:
    torchrun's local rank (``[defaultN]:``), Ray's worker (``(WorkerDict pid=P[, ip=A])``: a pid
    on its node), or both, which is that global rank's when the log ties the tag to exactly one (a
    line printing both). Within a process, a line without a PG (the ``[Rank N]
    Watchdog caught`` line) joins the report of that work on its PG, and two PGs named apart
    stay apart. A line that names no process (the ``what():`` repeat, the oldest layout without
    torchrun) joins the one process that reported that work (on the line's PG, else on none yet),
    and stays a report of its own when none or several could be its. A timeout without a seq
    ("Some NCCL operations have failed") joins its process's (or, naming none, the one
    process's) latest timeout of that PG rank.

    >>> stats = WatchdogStats()
    >>> reps = _Reports(stats)
    >>> line = "[rank{}]:[PG {} Rank 0] Timeout at NCCL work: 5, last enqueued NCCL work: {}, last completed NCCL work: 4."
    >>> for g in (0, 2):
    ...     reps.add(parse_line(line.format(g, g // 2 + 1, 5 + g), year=2025, default_ts=0.0, stats=stats))
    >>> sorted((r.global_rank, r.comm, r.last_enqueued) for r in reps.finish())
    [(0, '1', 5), (2, '2', 7)]
    """

    def __init__(self, stats: WatchdogStats) -> None:
        self.stats = stats
        self.kept = 0  # reports kept, at most MAX_RECORDS
        # (work, process) -> that process's reports of it by PG (None: not named yet).
        self.works: dict[tuple[_Work, _Process], dict[str | None, _Report]] = {}
        self.unnamed: dict[tuple[_Work, str | None], _Report] = {}  # lines naming no process, by work and PG
        self.bare: dict[tuple[_Process, int, str | None], _Report] = {}  # timeouts without a seq
        self.globals_of_local: dict[Any, set[int]] = {}  # a process tag (``_tag``) -> the global ranks it printed
        self._pairs = 0  # (local, global) pairs held: bounded as the reports are

    def _keep(self) -> bool:
        if self.kept >= MAX_RECORDS:
            self.stats.too_many += 1
            return False
        self.kept += 1
        return True

    def add(self, rep: _Report) -> None:
        """Take one line's report: merged with what its process said of the same work, or kept."""
        proc: _Process = None
        tag = _tag(rep)
        if rep.global_rank is not None:
            proc = ("rank", rep.global_rank)
            if tag is not None and self._pairs < MAX_RECORDS:  # a tag per line (Ray's pids): bounded too
                gs = self.globals_of_local.setdefault(tag, set())
                if rep.global_rank not in gs:
                    gs.add(rep.global_rank)
                    self._pairs += 1
        elif tag is not None:
            proc = ("local", tag)
        if rep.state == "timeout" and rep.seq is None:
            key = (proc, rep.rank, rep.comm)
            if key in self.bare:
                self.bare[key].merge(rep)
            elif self._keep():
                self.bare[key] = rep
            return
        work = _work(rep)
        if proc is None:
            have = self.unnamed.get((work, rep.comm))
            if have is not None:
                have.merge(rep)
            elif self._keep():
                self.unnamed[(work, rep.comm)] = rep
            return
        by_comm = self.works.get((work, proc))
        if by_comm is None:
            if self._keep():
                self.works[(work, proc)] = {rep.comm: rep}
        elif not _join(by_comm, rep, proc) and self._keep():
            by_comm[rep.comm] = rep

    def finish(self) -> list[_Report]:
        """Every report, the lines that named no process (or a local rank of several) placed.
        Placed in the order of their keys, not of the lines, and by index: a log of a million
        reports is placed in one pass, not a million times a million."""
        own: list[_Report] = []
        for (work, proc), by_comm in sorted(self.works.items(), key=lambda kv: repr(kv[0])):
            if proc is None or proc[0] != "local":
                continue
            gs = sorted(self.globals_of_local.get(proc[1], set()))
            del self.works[(work, proc)]
            for r in sorted(by_comm.values(), key=lambda r: (r.ts, r.comm or "")):
                if len(gs) == 1:
                    self._place(r, [(("rank", gs[0]), self.works.setdefault((work, ("rank", gs[0])), {}))])
                elif len(gs) > MAX_CANDIDATES or not self._place(
                    r, [(("rank", g), b) for g in gs if (b := self.works.get((work, ("rank", g))))]
                ):
                    self.works.setdefault((work, proc), {})[r.comm] = r  # its local rank is all the log tells
        procs: dict[_Work, list[_Process]] = {}
        for work, proc in self.works:
            procs.setdefault(work, []).append(proc)
        for (work, _), rep in sorted(self.unnamed.items(), key=lambda kv: (repr(kv[0][0]), kv[0][1] or "")):
            cands = procs.get(work, [])
            if len(cands) > MAX_CANDIDATES or not self._place(rep, [(p, self.works[(work, p)]) for p in cands]):
                own.append(rep)  # no process, or several, could have printed it
        placed = [(p, r) for (_, p), by_comm in self.works.items() for r in by_comm.values()] + [(None, r) for r in own]
        out = [r for _, r in placed]
        # Each PG rank's latest timeout by process (and PG), and which process (or several) has one.
        latest: dict[tuple[Any, ...], _Report] = {}
        who: dict[tuple[Any, ...], Any] = {}  # (rank[, PG]) -> the one process with a timeout there, or _SEVERAL
        for p, r in placed:
            if r.state != "timeout":
                continue
            for k in ((r.rank, p), (r.rank, p, r.comm)):
                if k not in latest or _later(r, latest[k]):
                    latest[k] = r
            for w in ((r.rank,), (r.rank, r.comm)):
                who[w] = p if who.get(w, p) == p else _SEVERAL
        for (proc, rank, comm), rep in sorted(self.bare.items(), key=lambda kv: repr(kv[0])):
            owner: Any = proc
            if owner is not None and owner[0] == "local":
                lg = self.globals_of_local.get(owner[1], set())
                owner = ("rank", next(iter(lg))) if len(lg) == 1 else owner
            elif owner is None:  # naming no process: the one process (or none, own records) that has one
                keys: list[tuple[Any, ...]] = [(rank,)] if comm is None else [(rank, comm), (rank, None)]
                found = {who[k] for k in keys if k in who}
                owner = next(iter(found)) if len(found) == 1 else _SEVERAL
            target: _Report | None = None
            if owner is not _SEVERAL:
                if comm is None:
                    target = latest.get((rank, owner))
                else:
                    got = [t for k in ((rank, owner, comm), (rank, owner, None)) if (t := latest.get(k)) is not None]
                    target = max(got, key=_order) if got else None
            if target is not None:
                target.merge(rep)
            else:
                out.append(rep)
        return out

    @staticmethod
    def _place(rep: _Report, cands: list[tuple[_Process, dict[str | None, _Report]]]) -> bool:
        """Join ``rep`` to the one candidate process that can have printed it: on its PG, else on
        a report without a PG yet, and saying nothing the report it joins contradicts (the
        ``ran for`` of a ``what():`` repeat is its own process's); False when none or several can."""
        if rep.comm is not None:
            if same := [c for c in cands if rep.comm in c[1]]:
                cands = same
            elif open_ := [c for c in cands if None in c[1]]:
                cands = open_
        if len(cands) > 1:
            cands = [c for c in cands if (t := _target(c[1], rep)) is None or _agrees(t, rep)]
        if len(cands) != 1:
            return False
        proc, by_comm = cands[0]
        if not _join(by_comm, rep, proc):
            by_comm[rep.comm] = rep
        _identify(rep, proc)
        return True


_DETAIL = ("op", "timeout_ms", "ran_ms", "last_enqueued", "last_completed")


def _agrees(a: _Report, b: _Report) -> bool:
    """Whether two reports of one work say nothing apart (each detail one of them lacks, or equal)."""
    return all(getattr(a, k) is None or getattr(b, k) is None or getattr(a, k) == getattr(b, k) for k in _DETAIL)


def _target(by_comm: dict[str | None, _Report], rep: _Report) -> _Report | None:
    """The report ``rep`` would join in ``by_comm`` (``_join``); None: it would be a PG of its own."""
    if rep.comm in by_comm:
        return by_comm[rep.comm]
    if rep.comm is None:
        return _first(by_comm.values()) if by_comm else None
    return by_comm.get(None)


MAX_CANDIDATES = 64  # processes a line naming none is weighed against; more is "several"
_SEVERAL = ("several",)  # more than one process has a timeout of that PG rank


def _order(r: _Report) -> tuple[float, int, str]:
    return (r.ts, r.seq or 0, r.comm or "")


def _later(a: _Report, b: _Report) -> bool:
    return _order(a) > _order(b)


def _identify(rep: _Report, proc: _Process) -> None:
    """``rep`` is ``proc``'s: its global rank where the process is one."""
    if proc is not None and proc[0] == "rank" and rep.global_rank is None:
        rep.global_rank = proc[1]


def _join(by_comm: dict[str | None, _Report], rep: _Report, proc: _Process) -> bool:
    """Merge ``rep`` into the process's report of its work on its PG (a line without a PG: the
    earliest; a report without a PG yet: this PG's); False when it is a PG of its own."""
    if rep.comm in by_comm:
        by_comm[rep.comm].merge(rep)
    elif rep.comm is None and by_comm:
        _first(by_comm.values()).merge(rep)
    elif None in by_comm:
        have = by_comm.pop(None)
        have.merge(rep)
        by_comm[rep.comm] = have
    else:
        return False
    return True


def read_lines(src: TextIO, stats: WatchdogStats, *, saved: bool = False) -> Iterator[str]:
    """``src``'s lines, each at most ``LINE_MAX`` characters (longer ones skipped whole, counted);
    a watchdog timeout line that a wrapped copy cut inside ``WorkNCCL(...)`` is joined with its
    next line, unless that one starts a log line of its own. ``saved``: ``src`` is a whole saved
    log, whose last line without its newline is cut (``_MAYBE_OURS``: counted, not read)."""
    held = ""
    while True:
        text = src.readline(LINE_MAX)
        if not text:
            if held:
                yield held
            return
        stats.lines += 1
        if len(text) >= LINE_MAX and not text.endswith("\n"):
            stats.oversize += 1
            while text and not text.endswith("\n"):  # the rest of it, a bounded piece at a time
                text = src.readline(LINE_MAX)
            continue
        if saved and not text.endswith("\n") and (held or (_MAYBE_OURS.search(text) and not _NCCL_INFO.search(text))):
            # The last line, without its newline (a log still being written, or cut): its last number
            # may be part of one ("last completed work: 51" of 5122), or the rest of a held line.
            stats.cut_last_line += 1
            stats.cut_text = text
            continue
        text = text.rstrip("\r\n")
        if held:
            cont = text.lstrip()
            if cont and cont[0] not in "[(" and not any(w in cont for w in _MARKERS):
                text, held = held + " " + cont, ""
                yield text
                continue
            yield held  # cut short, not wrapped: the next line is a line of its own
            held = ""
        if "WorkNCCL(" in text and ")" not in text.split("WorkNCCL(", 1)[1]:
            held = text
            continue
        yield text


def parse(
    src: TextIO,
    *,
    job: str | None,
    host: str | None = None,
    year: int | None = None,
    default_ts: float | None = None,
    gpus_per_node: int | None = None,
    stats: WatchdogStats | None = None,
    ib: IbLog | None = None,
    saved: bool = False,
) -> list[ProgressRecord]:
    """Records from a training log: one per (process, communicator, rank, work) the watchdog reported on.

    ``host``: every record's host (default: the ip in Ray's tag of a worker on another node than
    the driver's, else this host). ``year``: the year of glog's ``MMDD`` times (default:
    ``default_ts``'s); ``default_ts``: the time of lines without one (default: now). ``gpus_per_node``: a rank's GPU is its global rank
    (``[rank14]:``, else the PG's rank) ``% gpus_per_node``; without it, torchrun's local rank (``[default3]:``) is taken as the GPU
    (the ``LOCAL_RANK`` a job passes to ``torch.cuda.set_device``), else none. ``ib``: where
    NCCL's InfiniBand error lines go (``producers/nccl_ib.py``); without it they are skipped.
    ``saved``: ``src`` is a whole saved log or stdin at its end (``read_lines``).
    """
    stats = stats if stats is not None else WatchdogStats()
    now = time.time() if default_ts is None else default_ts
    yr = year or time.localtime(now).tm_year
    hostname = host or socket.gethostname()
    reports = _Reports(stats)
    for line in read_lines(src, stats, saved=saved):
        if ib is not None and ib.feed(line):
            continue
        rep = parse_line(line, year=yr, default_ts=now, stats=stats)
        if rep is not None:
            reports.add(rep)
    out = []
    for r in reports.finish():
        # Ray's ip is the node of a worker on another node than the driver's (a worker on the
        # driver's node prints none): the log's word on the host, as a line's host is in nccl_ib.
        at = host or (r.ray_ip if r.ray_ip is not None and bad_host(r.ray_ip) is None else None) or hostname
        # A subgroup's rank is not its process's: the GPU follows the global rank where the line gave it.
        grank = r.global_rank if r.global_rank is not None else r.rank
        gpu = grank % gpus_per_node if gpus_per_node else r.local_rank
        labels = {"source": "torch_watchdog"}
        if r.local_rank is not None:
            labels["local_rank"] = str(r.local_rank)
        if grank != r.rank:
            labels["global_rank"] = str(grank)
        if r.dump_from:
            labels["dump_from"] = r.dump_from
        if r.ray_pid is not None:
            labels["ray_pid"] = str(r.ray_pid)
        if r.ray_ip is not None:
            labels["ray_ip"] = r.ray_ip
        out.append(
            ProgressRecord(
                ts=r.ts,
                host=at,
                job=job,
                rank=r.rank,
                gpu=gpu if gpu is not None and 0 <= gpu <= 4095 else None,
                comm=r.comm,
                comm_name=r.comm_name,
                last_enqueued=r.last_enqueued,
                last_completed=r.last_completed,
                seq=r.seq,
                op=r.op,
                timeout_ms=r.timeout_ms,
                ran_ms=r.ran_ms,
                source="watchdog",
                state="progress" if r.state == "progress" else "timeout",
                labels=labels,
            )
        )
    out.sort(key=lambda r: (r.ts, r.rank))
    stats.records += len(out)
    return out


class WatchdogLogSource:
    """A finite source: a training log (or stdin) read once, its watchdog lines as progress
    records and NCCL's InfiniBand errors as NIC records (``producers/nccl_ib.py``). Lines
    without a time get the file's modification time (stdin: now)."""

    def __init__(
        self, path: str, *, job: str | None, host: str | None = None, gpus_per_node: int | None = None
    ) -> None:
        import os

        self.path = path
        self.job, self.host, self.gpus_per_node = job, host, gpus_per_node
        self.mtime = os.stat(path).st_mtime if path != "-" else time.time()
        self.done = False
        self.stats = WatchdogStats()
        self.ib_stats = IbStats()
        self.damage: GzipDamage | None = None  # what ended a gzip input early (lost input, exit 3)

    def poll(self) -> list[ProgressRecord | NicRecord]:
        if self.done:
            return []
        self.done = True
        fh = open_text(self.path) if self.path != "-" else None
        src = fh if fh is not None else stdin()
        ib = IbLog(host=self.host, default_ts=self.mtime, stats=self.ib_stats, fallback_host=socket.gethostname())
        try:
            recs: list[ProgressRecord | NicRecord] = []
            recs += parse(
                src,
                job=self.job,
                host=self.host,
                default_ts=self.mtime,
                gpus_per_node=self.gpus_per_node,
                stats=self.stats,
                ib=ib,
                saved=True,
            )
            self.damage = gzip_damage(src)
        finally:
            if fh is not None:
                fh.close()
        warn_damage(self.path, self.damage)
        recs += ib.records()
        if self.stats.cut_last_line:
            warn_cut_line(self.path, self.stats.cut_text)
        if not recs:
            log.warning("%s: no PyTorch NCCL watchdog or NCCL InfiniBand error lines found", self.path)
        return recs

    def summary(self) -> dict[str, int]:
        """Counts for the exit summary (what was read and what was left out, by reason)."""
        return self.stats.summary() | self.ib_stats.summary() | damage_counts(self.damage)

    def close(self) -> None:
        pass
