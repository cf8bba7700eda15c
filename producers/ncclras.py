"""NCCL RAS status output (``ncclras``, ``echo verbose status | nc localhost 28028``) ->
``ProgressRecord``s: the ranks RAS names as behind, missing, dead or in error.

The format is NCCL's (``src/ras/client_support.cc``; ``docs/userguide/source/troubleshooting/ras.rst``;
docs/producers.md#collective-progress-pytorch-watchdog-and-nccl-ras has the table). RAS prints
the ranks of a group only when the group is an outlier (at most 25 % of the ranks and 10 of
them; verbose: under 50 %), so a record is made for every rank it names, never for the
unnamed majority:

- ``#G-C (HASH) MISMATCH`` then ``Communicator ranks have different [OP ]operation counts`` (2.26+
  per operation, ``collective operation counts`` before): ``K ranks have launched up to operation
  N`` or ``K ranks have not launched any operations`` heads a group whose outliers follow as
  ``Rank R -- GPU g managed by process P on node H``; a group of one is ``Rank R has launched up to
  operation N -- GPU ...``. A named rank's ``last_enqueued`` is its count; it is ``lagging``
  when another group of the same operation has launched more, else ``progress``.
- ``#G-C (HASH) INCOMPLETE`` / ``Missing communicator data from K rank(s)``: the ranks named
  (``Rank R -- GPU ...``, or 2.24-2.25's ``The missing ranks: 21,22``, a list RAS cuts at 1023
  characters, so its last number is then dropped, counted) are ``missing``; ``dead`` when a
  ``DEAD`` section names its process (``Process P on node H managing GPUs 0,1``): the same pid on
  the same node, in every communicator the process had a rank in. The job-level ``INCOMPLETE`` /
  ``Missing communicator data from K job process(es)`` lists the processes that did not answer
  (not dead) the same way: they name no rank, so they make no record of their own (their ranks
  that the blocks name are the ``missing`` ones); they are counted, and those whose ranks no
  block names too.
- ``#G-C (HASH) ERROR``: ranks named under ``Initialization error`` / ``Asynchronous error`` are
  ``error``, the NCCL error in ``labels["ras.error"]``.
- ``MISMATCH`` on status (``K ranks have status S``): ranks in ``ABORT`` are ``error``; the
  others (``INIT``, ``FINALIZE``, ``NOCOMM``...) are transitions RAS itself calls harmless, counted;
  so are 2.24-2.25's ``UNKNOWN`` ones (``The unknown ranks: 30,31``, ``Rank 31 has status UNKNOWN``).

``nranks`` is the "Ranks per comm" of the communicator's group in the Communicators table. Group
numbers and process lists are a status's own: captures appended to one file are matched each
within itself. The text has no time: records get the file's modification time (stdin: now).
``-f json`` output (2.28.7+) is read as well: every rank, its operation counts summed (``lagging`` below the
communicator's highest), ``missing_ranks`` ``missing`` or ``dead`` (``considered_dead``; one not
``unresponsive`` is the text's NOCOMM, counted), and an ``async_error`` or ``init_state`` other
than success/in-progress, or ``abort_flag``, ``error``. Its ``hash`` (``0x%lx``) is zero-padded to
the text's 16 digits; 2.28.7-2.28.9's missing comma after a missing rank's ``nvml_dev`` is mended,
and lines before the document are read as text (the client's own stderr, kept by ``2>&1``, makes
no record). An input names at most ``MAX_RECORDS`` ranks; the rest are counted.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.decode import MAX_RANKS, MAX_SEQ
from pipeline.numeric import ascii_int, finite
from pipeline.schema import ProgressRecord
from producers import jsonsafe
from producers.textinput import (
    CUT_LAST_LINE,
    GzipDamage,
    damage_counts,
    read_input,
    split_cut_line,
    warn_cut_line,
    warn_damage,
)

log = logging.getLogger(__name__)

MAX_CHARS = 64 * 1024 * 1024  # a status of 100k ranks is a few MB; the rest is counted, not read
LINE_MAX = 64 * 1024
MAX_RECORDS = 1_000_000  # ranks one input may name: a list costs a few characters a rank; the rest counted
_COMM = re.compile(r"#(\d+)-(\d+) \(([0-9a-fA-Fx]+)\) (MISMATCH|INCOMPLETE|ERROR)\s*$")
_COUNTS = re.compile(r"Communicator ranks have different (?:(\w+) )?operation counts")
_GROUP_LAUNCHED = re.compile(r"(\S+) ranks have launched up to operation (\S+)$")
_GROUP_NONE = re.compile(r"(\S+) ranks have not launched any operations$")
_GROUP_STATUS = re.compile(r"(\S+) ranks have status (\w+)$")
_GROUP_REPORTED = re.compile(r"(\S+) ranks reported (.+)$")
# Rank R[ has launched up to operation N| has not launched any operations| has status S| reported E]
#   -- GPU g[ (NVML n)] managed by process P on node H   |   -- [process information not found]
_RANK = re.compile(
    r"Rank (?P<rank>\S+?)(?: has launched up to operation (?P<ops>\S+)| has not launched any operations"
    r"| has status (?P<status>\w+)| reported (?P<err>.+?))? -- (?:GPU (?P<gpu>\S+)(?: \(NVML (?P<nvml>\S+?)\))? "
    r"managed by process (?P<pid>\S+) on node (?P<node>\S+)|\[process information not found\])$"
)
# 2.24-2.25: the missing ranks of an INCOMPLETE block; the UNKNOWN ones of a status mismatch
_RANK_LIST = re.compile(r"The (missing|unknown) ranks?: (.+)$")
LIST_MAX = 1023  # RAS formats a rank list in a 1024-byte buffer: one this long may end in a cut number
_RANK_BARE_STATUS = re.compile(r"Rank (\S+) has status (\w+)$")  # 2.24-2.25: a lone UNKNOWN rank
# GPUs "0,1", or "0,1 (NVML 4,5)" when the CUDA indices differ from NVML's
_PROCESS = re.compile(r"Process (\S+) on node (\S+) managing GPUs? (.+)$")
# The Errors section's job-level lists of processes ("Process P on node H managing GPU g"): the
# ones RAS holds dead, and the ones that did not answer this time (INCOMPLETE); TIMEOUT lists none.
# A list's processes RAS knows nothing of (no pid, no node): counted, nothing to match them by.
_UNIDENTIFIED = re.compile(r"\[could not find information on (\S+) process(?:es)?\]$")
_PROCESS_LISTS = {"DEAD": "dead", "INCOMPLETE": "missing", "TIMEOUT": None}
# where -f json's document starts after the client's own messages ("Connection timed out; retrying...")
_JSON_START = re.compile(r"^\{[ \t\r]*$", re.MULTILINE)
# 2.28.7-2.28.9 print no comma after a missing rank's "nvml_dev" (fixed in 2.29.2)
_JSON_NO_COMMA = re.compile(r'("nvml_dev": -?\d+)(\s*"status")')
_TABLE_ROW = re.compile(r"(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\w+)\s+([\w,]+)$")
_SECTIONS = ("Errors", "Warnings", "Job summary", "Communicators")
_TABLE_HEAD = ("Group     Comms", "#  in group")  # the communicators table's two header lines
_NO_COMMS = "No communicator data collected!"  # the table's place when the job has no communicator
_PREAMBLE = ("NCCL version ", "CUDA runtime version ")  # the first lines of every text status
_JSON_KEYS = {"nccl_version", "communicators", "ras"}
_BLOCK_KINDS = {"MISMATCH", "INCOMPLETE", "ERROR"}  # a table row's Errors that each print a #G-C block
# The heads that say how many ranks or processes the lines after them list (client_support.cc):
_MISSING_RANKS = re.compile(r"Missing communicator data from (\S+) ranks?$")
_RANK_ERRORS = re.compile(r"(?:Initialization|Asynchronous) errors? on (\S+) ranks?$")
_PROCESS_COUNT = re.compile(
    r"(?:Missing communicator data from (\S+) job process(?:es)?|(\S+) job process(?:es)? (?:is|are) considered dead)"
)
# rasCountIsOutlier: RAS lists a group's ranks when it has at most 10 and at most a quarter of the
# communicator's (under half with --verbose): such a group is listed in either mode.
DETAIL_THRESHOLD = 10


@dataclass
class RasStats:
    lines: int = 0
    communicators: int = 0  # communicator blocks (MISMATCH, INCOMPLETE, ERROR) read
    records: int = 0
    dead_processes: int = 0
    missing_processes: int = 0  # processes the job-level INCOMPLETE names: they did not answer
    transitional: int = 0  # ranks in a harmless status mismatch (INIT, FINALIZE, NOCOMM, UNKNOWN): not records
    unranked: int = 0  # dead processes that no missing rank matches: named in the log, no record
    unranked_missing: int = 0  # job-level INCOMPLETE processes that no missing rank matches: no record
    unidentified: int = 0  # processes a DEAD or INCOMPLETE list could not name ("could not find information")
    unparsable: int = 0  # a line inside a communicator block that fits no layout
    orphan: int = 0  # lines of a block whose header's number is not one: whose they are is unknown
    bad_number: int = 0  # a rank, count or GPU that is not a number in range, or the last of a cut rank list
    oversize: int = 0
    truncated: int = 0
    bad_json_values: int = 0
    too_many: int = 0  # ranks named past MAX_RECORDS
    # A text status that began (version lines, job summary or "Communicators...") but ended before
    # the communicators table's rows, a flagged comm's block, or what a block's head announces:
    # the client timed out or lost the daemon, so what it says of the job is not known (healthy is
    # what an end there would otherwise read as).
    cut_status: int = 0
    cut_last_line: int = 0  # the input's last text line without its newline: not read
    empty: int = 0  # nothing at all: ncclras prints a status whenever it reaches the daemon
    named: int = 0  # ranks named so far, kept or not (what MAX_RECORDS bounds)
    # Lines of RAS's own layout (version, section heads, communicator blocks, the table) or a
    # JSON document of its keys: none in a non-blank input means it is not ncclras output.
    recognised: int = 0

    def summary(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "communicators": self.communicators,
            "records": self.records,
            "dead_processes": self.dead_processes,
            "missing_processes": self.missing_processes,
            "transitional_ranks": self.transitional,
            "unranked_dead_processes": self.unranked,
            "unranked_missing_processes": self.unranked_missing,
            "unidentified_processes": self.unidentified,
            "dropped.unparsable_line": self.unparsable,
            "dropped.bad_number": self.bad_number,
            "dropped.orphan_line": self.orphan,
            "dropped.oversize_line": self.oversize,
            "dropped.truncated_log": self.truncated,
            "dropped.bad_json_value": self.bad_json_values,
            "dropped.too_many_records": self.too_many,
            "dropped.cut_status": self.cut_status,
            CUT_LAST_LINE: self.cut_last_line,
            "dropped.empty_status": self.empty,
        }


@dataclass
class _Named:
    """One rank a block names."""

    rank: int
    state: str
    node: str | None = None
    gpu: int | None = None
    pid: int | None = None
    ops: int | None = None
    op: str | None = None
    error: str | None = None


@dataclass
class _Block:
    group: int
    hash: str
    kind: str
    named: list[_Named] = field(default_factory=list)
    # Operation-count groups of the current "different ... operation counts" paragraph.
    op: str | None = None
    groups: list[int] = field(default_factory=list)
    value: int | None = None
    status: str | None = None
    error: str | None = None
    max_ops: dict[str | None, int] = field(default_factory=dict)


def _int(text: str | None, limit: int = MAX_SEQ) -> int | None:
    n = ascii_int(text, 19) if text is not None else None
    return n if n is not None and n <= limit else None


def parse_text(text: str, *, ts: float, job: str | None = None, stats: RasStats | None = None) -> list[ProgressRecord]:
    """Records from ``ncclras`` text output (any release since 2.24)."""
    stats = stats if stats is not None else RasStats()
    out: list[ProgressRecord] = []
    st = _Status()
    cur: _Block | None = None
    section = ""
    plist: str | None = None  # inside a job-level process list: "dead" (DEAD) or "missing" (INCOMPLETE)
    orphaned = False  # inside a block whose header could not be read
    began = tabled = False  # a status's first lines seen; its communicators table (or "no data") seen
    for raw in text.splitlines():
        stats.lines += 1
        if len(raw) > LINE_MAX:
            stats.oversize += 1
            continue
        line = raw.strip()
        if not line or set(line) == {"="}:
            continue
        head = line.split("...")[0].strip()
        if line.startswith(_PREAMBLE) and raw == raw.lstrip():
            stats.recognised += 1
            if line.startswith(_PREAMBLE[0]):  # a new status begins (captures appended to one file)
                stats.cut_status += (began and not tabled) or st.owes()
                began, tabled = True, False
                # Its group numbers and process lists are its own, not the earlier status's.
                out += _records(st, ts, job, stats)
                st, cur, section, plist, orphaned = _Status(), None, "", None, False
            continue
        if head in _SECTIONS and raw == raw.lstrip():
            stats.recognised += 1
            section, cur, plist, orphaned = head, None, None, False
            st.owed = st.groups = 0
            began = began or head in ("Job summary", "Communicators")
            tabled = tabled or head in ("Errors", "Warnings")
            continue
        if section == "Communicators" and (line.startswith(_TABLE_HEAD) or line == _NO_COMMS):
            stats.recognised += 1
            # RAS prints the heads only with a row under them: heads alone are a table cut short.
            tabled = tabled or line == _NO_COMMS
            continue
        if section == "Communicators" and (m := _TABLE_ROW.match(line)):
            stats.recognised += 1
            tabled = True
            g, size = _int(m.group(1)), _int(m.group(5), MAX_RANKS)
            if g is not None and size is not None:
                st.ranks_per_comm[g] = size
            comms, kinds = _int(m.group(2)), _BLOCK_KINDS.intersection(m.group(8).split(","))
            if g is not None and comms is not None and kinds:
                st.flagged[g] = (comms, kinds)
            continue
        if m := _COMM.match(line):
            stats.recognised += 1
            g = _int(m.group(1))
            if g is None:
                stats.bad_number += 1
                cur, orphaned = None, True
                st.owed = st.groups = 0  # its lines are counted as orphans, not owed
                continue
            st.owed, st.groups = 1, 0  # a block has at least one paragraph
            cur = _Block(g, m.group(3).lower().removeprefix("0x"), m.group(4))
            st.blocks.append(cur)
            c = _int(m.group(2))
            if c is not None:
                st.seen.setdefault((g, cur.kind), set()).add(c)
            stats.communicators += 1
            plist, orphaned = None, False
            continue
        if raw == raw.lstrip() and line in _PROCESS_LISTS:
            stats.recognised += 1
            cur, plist, orphaned = None, _PROCESS_LISTS[line], False
            st.owed, st.groups = 1, 0  # its count line (TIMEOUT's: how many)
            continue
        if orphaned:
            stats.orphan += 1
            continue
        if plist is not None:
            if m := _PROCESS_COUNT.match(line):
                n = _int(m.group(1) or m.group(2), MAX_RANKS)
                st.owed = n if n is not None and n <= DETAIL_THRESHOLD else 0
                continue
            st.owed = max(0, st.owed - 1)
            if m := _PROCESS.match(line):
                if plist == "dead":
                    stats.dead_processes += 1
                else:
                    stats.missing_processes += 1
                pid = _int(m.group(1))
                if pid is None:
                    stats.bad_number += 1
                else:
                    (st.dead if plist == "dead" else st.absent).add((m.group(2), pid))
            elif m := _UNIDENTIFIED.match(line):
                n = _int(m.group(1), MAX_RANKS)
                if n is None:
                    stats.bad_number += 1
                else:
                    stats.unidentified += n
                    st.owed = max(0, st.owed - n + 1)
            continue
        if cur is None:
            st.owed = max(0, st.owed - 1)  # TIMEOUT's count line
            continue
        _block_line(cur, line, stats, st)
    if (began and not tabled) or st.owes():
        stats.cut_status += 1
    out += _records(st, ts, job, stats)
    stats.records += len(out)
    return out


@dataclass
class _Status:
    """What one status says: its table's group sizes, its blocks, its job-level process lists."""

    ranks_per_comm: dict[int, int] = field(default_factory=dict)
    blocks: list[_Block] = field(default_factory=list)
    dead: set[tuple[str, int]] = field(default_factory=set)  # (node, pid) of the processes DEAD names
    absent: set[tuple[str, int]] = field(default_factory=set)  # those the job-level INCOMPLETE names
    # What a status cut short lacks (``owes``): the groups a table row flags (its comms' number and
    # the block kinds each of them prints), the blocks seen ((group, kind) -> their comm numbers),
    # and what the last head read still owes: rank or process lines it lists, and groups a
    # paragraph of different counts or status has (at least two: it is printed because they differ).
    flagged: dict[int, tuple[int, set[str]]] = field(default_factory=dict)
    seen: dict[tuple[int, str], set[int]] = field(default_factory=dict)
    owed: int = 0
    groups: int = 0
    total: int = 0  # ranks the groups of the current paragraph hold so far

    def owes(self) -> bool:
        """Whether the status ended before what RAS prints in full: a flagged row's blocks, or the
        lines the last head announced (the client lost the daemon, or the file is a part)."""
        if self.owed > 0 or self.groups > 0:
            return True
        for g, (comms, kinds) in self.flagged.items():
            for kind in kinds:
                if sum(1 for c in self.seen.get((g, kind), ()) if c < comms) < comms:
                    return True
        return False


def _records(st: _Status, ts: float, job: str | None, stats: RasStats) -> list[ProgressRecord]:
    """The records of one status's named ranks; its listed processes no rank matches counted."""
    out = []
    ranked: set[tuple[str, int]] = set()  # the listed processes a missing rank was found on
    for b in st.blocks:
        for nm in b.named:
            state = nm.state
            # A dead process is missing from every communicator it had a rank in; its pid, not its
            # GPU, names it (two processes may drive one GPU).
            if state == "missing" and nm.node is not None and nm.pid is not None:
                proc = (nm.node, nm.pid)
                if proc in st.dead:
                    state = "dead"
                    ranked.add(proc)
                elif proc in st.absent:
                    ranked.add(proc)
            if state == "counted":
                top = b.max_ops.get(nm.op, 0)
                state = "lagging" if nm.ops is not None and nm.ops < top else "progress"
            labels = {"source": "ncclras", "ras.block": b.kind, "ras.comm_id": f"#{b.group}"}
            if nm.op:
                labels["ras.op"] = nm.op
            if nm.error:
                labels["ras.error"] = nm.error[:200]
            if nm.op is not None or state in ("lagging", "progress"):
                labels["ras.max_ops"] = str(b.max_ops.get(nm.op, 0))
            nranks = st.ranks_per_comm.get(b.group)
            out.append(
                ProgressRecord(
                    ts=ts,
                    host=nm.node or "unknown",
                    job=job,
                    rank=nm.rank,
                    gpu=nm.gpu,
                    comm=b.hash,
                    nranks=nranks if nranks is not None and nm.rank < nranks else None,
                    last_enqueued=nm.ops,
                    source="ras",
                    state=state,  # type: ignore[arg-type]
                    labels=labels,
                )
            )
    stats.unranked += len(st.dead - ranked)
    stats.unranked_missing += len(st.absent - ranked)
    return out


def _group(st: _Status, b: _Block, k: str) -> None:
    """A group head of ``k`` ranks: one of its paragraph's groups; its ranks are owed when RAS lists
    them in either mode (at most 10, and at most a quarter of the communicator: the table's size,
    or at least the ranks of this paragraph's groups, printed largest first)."""
    st.groups = max(0, st.groups - 1)
    n = _int(k, MAX_RANKS)
    if n is None:
        st.owed = 0
        return
    st.total += n
    size = max(st.ranks_per_comm.get(b.group, 0), st.total)
    st.owed = n if n <= DETAIL_THRESHOLD and 4 * n <= size else 0


def _block_line(b: _Block, line: str, stats: RasStats, st: _Status) -> None:
    """One line inside a communicator block: a paragraph's head, a group's head or a rank."""
    if m := _COUNTS.match(line):
        # Before 2.26 one paragraph for every operation: "different collective operation counts".
        op = m.group(1) if m.group(1) != "collective" else None
        b.op, b.status, b.error, b.value = op, None, None, None
        st.owed, st.groups, st.total = 0, 2, 0
        return
    if line.startswith("Communicator ranks have different status"):
        b.op, b.status, b.error, b.value = None, "", None, None
        st.owed, st.groups, st.total = 0, 2, 0
        return
    if line.startswith(("Missing communicator data", "Initialization error", "Asynchronous error")):
        b.error = None
        m = _MISSING_RANKS.match(line) or _RANK_ERRORS.match(line)
        n = _int(m.group(1), MAX_RANKS) if m else None
        st.owed, st.groups = (n if n is not None and n <= DETAIL_THRESHOLD else 0), 0
        return
    if m := _GROUP_LAUNCHED.match(line):
        _group(st, b, m.group(1))
        k, v = _int(m.group(1), MAX_RANKS), _int(m.group(2))
        if k is None or v is None:
            stats.bad_number += 1
            b.value = None
            return
        b.value = v
        b.max_ops[b.op] = max(b.max_ops.get(b.op, 0), v)
        return
    if m := _GROUP_NONE.match(line):
        _group(st, b, m.group(1))
        b.value = 0
        return
    if m := _GROUP_STATUS.match(line):
        _group(st, b, m.group(1))
        b.status = m.group(2)
        return
    if m := _GROUP_REPORTED.match(line):
        n = _int(m.group(1), MAX_RANKS)
        if st.owed == 0 and n is not None and n <= DETAIL_THRESHOLD:
            st.owed = n  # one kind of error of more than 10 ranks: this kind's are listed
        b.error = m.group(2)
        return
    if m := _RANK_LIST.match(line):
        st.owed = 0  # 2.24-2.25 list a group's ranks on one line
        toks = re.split(r"[,\s]+", m.group(2).strip())
        if len(m.group(2)) >= LIST_MAX:
            stats.bad_number += 1
            toks.pop()
        for tok in toks:
            r = _int(tok, MAX_RANKS - 1)
            if r is None:
                stats.bad_number += 1
            elif m.group(1) == "unknown":
                stats.transitional += 1
            else:
                _name(b, _Named(r, "missing"), stats)
        return
    if m := _RANK_BARE_STATUS.match(line):
        st.groups, st.owed = max(0, st.groups - 1), 0  # a group of one
        r = _int(m.group(1), MAX_RANKS - 1)
        if r is None:
            stats.bad_number += 1
        elif m.group(2) == "ABORT":
            _name(b, _Named(r, "error", error="ABORT"), stats)
        else:
            stats.transitional += 1
        return
    m = _RANK.match(line)
    if m is None:
        stats.unparsable += 1
        return
    if m.group("ops") is not None or m.group("status") is not None or "has not launched any operations" in line:
        st.groups, st.owed = max(0, st.groups - 1), 0  # a group of one, its rank on its head's line
    else:
        st.owed = max(0, st.owed - 1)
    rank = _int(m.group("rank"), MAX_RANKS - 1)
    gpu_text = m.group("nvml") or m.group("gpu")
    gpu = _int(gpu_text, 4095) if gpu_text is not None else None
    ops = _int(m.group("ops")) if m.group("ops") is not None else None
    if (
        rank is None
        or (gpu_text is not None and gpu is None)
        or (m.group("ops") is not None and ops is None)
        or (m.group("pid") is not None and _int(m.group("pid")) is None)
    ):
        stats.bad_number += 1
        return
    node = m.group("node")
    pid = _int(m.group("pid")) if m.group("pid") is not None else None
    if b.kind == "INCOMPLETE":
        _name(b, _Named(rank, "missing", node, gpu, pid), stats)
    elif b.kind == "ERROR":
        _name(b, _Named(rank, "error", node, gpu, pid, error=m.group("err") or b.error), stats)
    elif b.status is not None:
        status = m.group("status") or b.status
        if status == "ABORT":
            _name(b, _Named(rank, "error", node, gpu, pid, error="ABORT"), stats)
        else:
            stats.transitional += 1
    else:
        if ops is None and "has not launched any operations" in line:
            ops = 0
        if ops is not None:
            b.max_ops[b.op] = max(b.max_ops.get(b.op, 0), ops)
        _name(b, _Named(rank, "counted", node, gpu, pid, ops=ops if ops is not None else b.value, op=b.op), stats)


def _name(b: _Block, nm: _Named, stats: RasStats) -> None:
    """Keep a rank ``b`` names, up to ``MAX_RECORDS`` an input (``_room``)."""
    if _room(stats):
        b.named.append(nm)


def _room(stats: RasStats) -> bool:
    """Whether one more named rank fits the input's ``MAX_RECORDS``; past it, counted."""
    stats.named += 1
    if stats.named > MAX_RECORDS:
        stats.too_many += 1
        return False
    return True


def parse_json(
    doc: Any, *, ts: float | None, job: str | None = None, stats: RasStats | None = None
) -> list[ProgressRecord]:
    """Records from ``ncclras -f json`` (2.28.7+). A value of the wrong type is left out and
    counted (``bad_json_value``); the rest of the document is read. ``ts``: the document's
    ``timestamp`` (local time) when it has one, else this."""
    stats = stats if stats is not None else RasStats()
    if not isinstance(doc, dict):
        stats.bad_json_values += 1
        return []
    if _JSON_KEYS & doc.keys():
        stats.recognised += 1
    when = doc.get("timestamp")
    t = ts if ts is not None else time.time()
    if isinstance(when, str) and when.isascii():
        try:
            t = time.mktime(time.strptime(when[:19], "%Y-%m-%d %H:%M:%S"))
        except (ValueError, OverflowError):
            stats.bad_json_values += 1
    out: list[ProgressRecord] = []
    for c in _list(doc.get("communicators")):
        if not isinstance(c, dict) or not isinstance(c.get("hash"), str):
            stats.bad_json_values += 1
            continue
        stats.communicators += 1
        chash = c["hash"].lower().removeprefix("0x")[:64] or "unknown"
        if re.fullmatch(r"[0-9a-f]{1,15}", chash):  # "0x%lx": the text's "%016lx" has the leading zeros
            chash = chash.zfill(16)
        size = _count(c.get("size"), MAX_RANKS)
        named: list[tuple[dict, str, int | None, str | None]] = []
        totals: list[int] = []
        for r in _list(c.get("ranks")):
            if not isinstance(r, dict):
                stats.bad_json_values += 1
                continue
            counts = r.get("collective_counts")
            total = None
            if isinstance(counts, dict):
                vals = [_count(v) for v in counts.values()]
                if None in vals:
                    stats.bad_json_values += 1
                else:
                    total = min(sum(v for v in vals if v is not None), MAX_SEQ)
                    totals.append(total)
            st = _dict(r.get("status"))
            bad = [k for k in ("init_state", "async_error") if _count(st.get(k)) not in (None, 0, 7)]
            if st.get("abort_flag") is True:
                bad.append("abort_flag")
            if not _room(stats):
                continue
            named.append((r, "error" if bad else "counted", total, ",".join(bad) or None))
        for r in _list(c.get("missing_ranks")):
            if not isinstance(r, dict):
                stats.bad_json_values += 1
                continue
            st = _dict(r.get("status"))
            if st.get("considered_dead") is not True and st.get("unresponsive") is False:
                stats.transitional += 1  # reachable but no longer a member: the text's NOCOMM
                continue
            if not _room(stats):
                continue
            named.append((r, "dead" if st.get("considered_dead") is True else "missing", None, None))
        top = max(totals, default=0)
        for r, state, total, err in named:
            rank = _count(r.get("rank"), MAX_RANKS - 1)
            host = r.get("host")
            if rank is None or not isinstance(host, str) or not host or len(host) > 253:
                stats.bad_json_values += 1
                continue
            gpu = _count(r.get("nvml_dev"), 4095)
            if gpu is None:
                gpu = _count(r.get("cuda_dev"), 4095)
            if state == "counted":
                state = "lagging" if total is not None and total < top else "progress"
            labels = {"source": "ncclras", "format": "json"}
            if total is not None:
                labels["ras.max_ops"] = str(top)
            if err:
                labels["ras.error"] = err
            out.append(
                ProgressRecord(
                    ts=t,
                    host=host,
                    job=job,
                    rank=rank,
                    gpu=gpu,
                    comm=chash,
                    nranks=size if size and rank < size else None,
                    last_enqueued=total,
                    source="ras",
                    state=state,  # type: ignore[arg-type]
                    labels=labels,
                )
            )
    stats.records += len(out)
    return out


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _count(v: Any, limit: int = MAX_SEQ) -> int | None:
    """A JSON count (an int, not a bool) in 0..``limit``, else None."""
    x = finite(v)
    if x is None or isinstance(v, float) and not x.is_integer():
        return None
    n = int(x)
    return n if 0 <= n <= limit else None


def _json_body(text: str) -> str | None:
    """Where a ``-f json`` document starts in ``text`` (after the client's stderr, ``2>&1``), else None."""
    if text.lstrip().startswith("{"):
        return text
    start = _JSON_START.search(text)
    return text[start.start() :] if start else None


def parse(text: str, *, ts: float, job: str | None = None, stats: RasStats | None = None) -> list[ProgressRecord]:
    """Text or ``-f json``, whichever ``text`` is."""
    stats = stats if stats is not None else RasStats()
    body = _json_body(text)
    if body is not None:
        try:
            doc, deep = jsonsafe.loads_pruned(body)
        except ValueError:
            try:
                doc, deep = jsonsafe.loads_pruned(_JSON_NO_COMMA.sub(r"\1,\2", body))
            except ValueError:
                doc, deep = None, 0
        stats.bad_json_values += deep
        if doc is not None:
            # What came before the document is read as text: the client's stderr makes no record.
            head = parse_text(text[: len(text) - len(body)], ts=ts, job=job, stats=stats) if body is not text else []
            return head + parse_json(doc, ts=ts, job=job, stats=stats)
    return parse_text(text, ts=ts, job=job, stats=stats)


class RasStatusSource:
    """A finite source: one saved ``ncclras`` output (or stdin), read once, up to ``max_chars``."""

    def __init__(self, path: str, *, job: str | None = None, max_chars: int = MAX_CHARS) -> None:
        import os

        self.path, self.job, self.max_chars = path, job, max_chars
        self.mtime = os.stat(path).st_mtime if path != "-" else time.time()
        self.done = False
        self.stats = RasStats()
        self.damage: GzipDamage | None = None  # what ended a gzip input early (lost input, exit 3)
        self.unrecognised = False  # text, but not one line of ncclras output (the CLI exits 3)

    def poll(self) -> list[ProgressRecord]:
        if self.done:
            return []
        self.done = True
        text, cut, self.damage = read_input(self.path, self.max_chars)
        warn_damage(self.path, self.damage)
        whole, tail = split_cut_line(text)
        if cut:
            self.stats.truncated = 1
            text = whole  # the last line is cut short: not read as a whole one
        elif (
            tail.strip()
            # A -f json document: parsing it tells whether it is whole.
            and not (tail.rstrip().endswith("}") and _json_body(text) is not None)
            # RAS's wait line ("Communicators...") is printed before its time: a cut there is a cut_status.
            and not tail.rstrip().endswith("...")
        ):
            # RAS ends every other text line with a newline: one without may end inside a host or a number.
            self.stats.cut_last_line = 1
            warn_cut_line(self.path, tail)
            text = whole
        if not text.strip():
            self.stats.empty = 1  # the client printed nothing: it could not reach the daemon, or asked in vain
            return []
        recs = parse(text, ts=self.mtime, job=self.job, stats=self.stats)
        self.unrecognised = not self.stats.recognised
        return recs

    def summary(self) -> dict[str, int]:
        """Counts for the exit summary (what was read and what was left out, by reason)."""
        return self.stats.summary() | damage_counts(self.damage)

    def close(self) -> None:
        pass
