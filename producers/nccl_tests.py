"""nccl-tests output (``all_reduce_perf`` and friends) -> ``NcclRecord``s, for burn-in runs.

Layouts (from nccl-tests' ``src/common.cu`` / ``src/util.cu`` across its releases; see
docs/producers.md for the table):

- Text tables are read by their header row, not by position. Before 2.13 there is no ``root``
  column (some builds) and the check column is ``error``: the largest deviation from the
  expected values (``maxDelta``, ``%5.0le``: ``0e+00``, or ``2e-07`` of float rounding in a healthy
  run), not a count, so it is kept as ``max_error`` and the ``# Out of bounds values`` line is
  the verdict; 2.13+ prints ``#wrong`` (wrong elements), a ``root`` column, optional
  per-iteration columns (``i_min``...) and a timestamp.
- Lines tagged by the launcher (``mpirun --tag-output``: ``[1,0]<stdout>:``; ``srun -l``:
  ``0: ``) are read without the tag, each tag's lines as a stream of their own: processes that
  each print a whole run (a build without MPI launched as N processes) interleave their lines.
- Tests without a reduction (alltoall, broadcast, gather...) printed an *empty* ``redop`` cell
  before NCCL 2.13's resync (``"none"`` since): such a row has one token fewer than its header,
  and the missing one is the ``redop`` cell.
- Rank lines: ``#  Rank N Group G Pid P on HOST device D [..] NAME`` since 2.13,
  ``#   Rank N Pid P on HOST device D`` before, ``#   Rank N on HOST device D`` in the first
  releases. A multi-node log may list only some ranks, so ``nranks`` is the highest listed
  rank + 1 (never the count of lines).
- The collective comes from the log itself: ``# Collective test starting: all_gather_perf``
  (2.16.7+), else a ``*_perf`` command line echoed into the log, else ``--coll``; a file name is
  the last resort and says so in ``labels["coll_source"]``.
- One log may hold several runs (a script running each test in turn): a run starts at
  ``# Collective test starting`` or a ``# nThread`` header once the previous run had results, and
  ends at ``# Collective test concluded``. Each run gets its own id (``comm``).
- Wrong results (``#wrong`` > 0, or ``# Out of bounds values : N FAILED``) are silent data
  corruption: each such run becomes a ``Finding`` (severity critical), logged at CRITICAL, named
  in the exit summary, and the records carry ``labels["wrong_results"]``.

``-J`` JSON output (``{"config": {"devices": [...]}, "results": [...], "out_of_bounds": ...}``)
is read as well. One record per message size: the out-of-place result, with the in-place
numbers, data type, reduction and wrong-element count in ``labels``; the record is rank 0's (or
the lowest listed rank's), on its host and GPU.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.numeric import ascii_int, finite
from pipeline.recordchecks import MAX_SEQ
from pipeline.schema import NcclRecord
from producers import jsonsafe
from producers.textinput import GzipDamage, damage_counts, read_input, warn_damage

log = logging.getLogger(__name__)

# Compact names (no underscores), longest first when matching: "reduce" is inside "allreduce"
# and "reducescatter", "gather" inside "allgather".
_COLL = {
    "allreduce": "AllReduce",
    "allgather": "AllGather",
    "reducescatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "alltoallv": "AllToAllV",
    "alltoall": "AllToAll",
    "sendrecv": "SendRecv",
    "gather": "Gather",
    "scatter": "Scatter",
    "hypercube": "HyperCube",
}
# Numbers are matched as any token and read by ascii_int: a line of the right shape whose number
# is not one ("²", 4,300 digits) is counted as that line's drop instead of passing as text.
_RANK = re.compile(r"#\s*Rank\s+(\S+)(?:\s+Group\s+(\S+))?(?:\s+Pid\s+(\S+))?\s+on\s+(\S+)\s+device\s+(\S+)")
_PERF = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b", re.ASCII)
_NTHREAD = re.compile(r"nThread\s+(\S+)\s+nGpus\s+(\S+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\S+)\s*(\w*)")
# A launcher's tag before each line: mpirun --tag-output's [job,rank]<stdout>:, srun -l's "rank: ".
_TAG = re.compile(r"^\s*(?:\[(\d{1,9},\d{1,9})\]<(?:stdout|stderr)>:|(\d{1,9}):(?=\s))")
MAX_RUN_HOSTS = 16  # a wrong run's hosts named on its records (``labels.run_hosts``); more are counted
RANK_DIGITS = 9  # ranks, devices, thread and GPU counts: far beyond any job
_BANNERS = ("nccl-tests version", "Using devices", "Avg bus bandwidth")  # comment lines of its own
_JSON_KEYS = {"config", "results", "out_of_bounds"}
# util.cu's jsonDouble quotes NaN but prints infinities with printf("%lf"): a bare inf or -inf,
# which is not JSON. Strings are matched first so that text inside them is left alone.
# An unterminated string runs to the end (its closing quote optional): a failed match is never
# tried again at every later quote, which made a file of stray quotes quadratic.
_STR_OR_INF = re.compile(r'"(?:[^"\\]|\\.)*"?|(?<![\w.])-?inf(?:inity)?(?![\w.])', re.ASCII | re.IGNORECASE)
MAX_STREAMS = 16_384  # launcher tags read apart in one log: a job's processes; lines of further tags are counted


def collective_name(text: str | None) -> str | None:
    """``all_reduce_perf`` / ``/opt/nccl-tests/build/all_gather_perf`` / ``allgather`` -> ``AllGather``..."""
    if not text:
        return None
    low = text.lower().replace("_", "").replace("-", "")
    for key in sorted(_COLL, key=len, reverse=True):
        if key in low:
            return _COLL[key]
    return None


def _program(line: str) -> str | None:
    """The ``X_perf`` program an echoed command line runs: a match that names a collective and is
    not a directory (``/opt/my_perf/build/all_gather_perf`` -> ``all_gather_perf``)."""
    for m in _PERF.finditer(line):
        if not line.startswith("/", m.end()) and collective_name(m.group(0)):
            return m.group(0)
    return None


@dataclass
class Device:
    rank: int
    host: str
    device: int
    pid: int | None


@dataclass
class Finding:
    """A run whose results were wrong: the worst thing a burn-in can find."""

    run: str
    coll: str
    host: str
    wrong_sizes: list[int]
    wrong_elements: float
    out_of_bounds: int | None
    severity: str = "critical"

    def describe(self) -> str:
        parts = []
        if self.wrong_sizes:
            parts.append(
                f"{self.wrong_elements:g} wrong element(s) at sizes {', '.join(map(str, self.wrong_sizes[:8]))}"
                + (" ..." if len(self.wrong_sizes) > 8 else "")
            )
        if self.out_of_bounds:
            parts.append(f"Out of bounds values : {self.out_of_bounds} FAILED")
        return f"nccl-tests {self.coll} run {self.run} on {self.host}: wrong results ({'; '.join(parts)})"


@dataclass
class ParseStats:
    runs: int = 0
    rows: int = 0
    records: int = 0
    unparsable_rows: int = 0  # looked like a result row (or a JSON result) but did not fit the header
    unparsable_lines: int = 0  # a rank, nThread or out-of-bounds line whose number is not one
    bad_json_values: int = 0  # a -J value of the wrong type, or nested too deep: left out
    no_time: int = 0  # a row without a usable out-of-place time
    coll_from_file_name: int = 0
    coll_unknown: int = 0  # runs whose collective nothing names: their records say "unknown"
    too_many_streams: int = 0  # lines of launcher tags past MAX_STREAMS: not read
    # Lines of nccl-tests' own layout (banner, rank, nThread, header, result, out-of-bounds) or a
    # -J document: none in a non-blank input means it is not nccl-tests output.
    recognised: int = 0
    findings: list[Finding] = field(default_factory=list)


@dataclass
class _Run:
    devices: dict[int, Device] = field(default_factory=dict)
    header: list[str] | None = None
    time_scale: float = 1.0  # the first releases printed times in ms (units row "(ms)")
    rows: list[dict[str, Any]] = field(default_factory=list)
    started: str | None = None
    nranks_header: int | None = None
    oob: int | None = None
    concluded: bool = False

    def empty(self) -> bool:
        return not self.rows and self.header is None and self.started is None


@dataclass
class _Stream:
    """One launcher tag's lines: its current run and the command line echoed before it
    (``perf_hint``, as of the ``epoch``-th untagged command line: later ones apply when read)."""

    cur: _Run = field(default_factory=_Run)
    perf_hint: str | None = None
    order: int = 0  # the stream's place among the log's streams: runs close in this order
    epoch: int = 0


def _float(tok: Any) -> float | None:
    """A finite number from a text cell or a JSON value (ASCII, bounded length), else None."""
    return finite(tok)


def _records(
    run: _Run,
    coll: str,
    ts: float,
    host_default: str,
    job: str | None,
    fmt: str,
    run_id: str,
    stats: ParseStats,
    coll_source: str,
) -> list[NcclRecord]:
    devs = sorted(run.devices.values(), key=lambda d: d.rank)
    d0 = devs[0] if devs else None
    # Highest listed rank + 1: a log may elide ranks; nThread x nGpus is one process's share only.
    nranks = max([d.rank + 1 for d in devs] + [run.nranks_header or 1])
    nnodes = len({d.host for d in devs}) or None
    host = d0.host if d0 else host_default
    comm = f"nccl-tests:{host}:{d0.pid if d0 and d0.pid is not None else 0}:{run_id}"
    out = []
    wrong_sizes, wrong_total = [], 0.0
    for row in run.rows:
        t = row.get("time")
        w = (row.get("wrong") or 0) + (row.get("in_wrong") or 0)
        if w > 0:
            wrong_sizes.append(int(row["size"]))
            wrong_total += w
        if t is None or t < 0:
            stats.no_time += 1
            continue
        labels = {"source": "nccl_tests", "format": fmt, "run": run_id}
        if coll_source != "log":
            labels["coll_source"] = coll_source
        for k in ("type", "redop", "root"):
            if row.get(k) not in (None, ""):
                labels[k] = str(row[k])
        for k in ("in_time_us", "in_algbw_gbs", "in_busbw_gbs", "wrong", "in_wrong", "max_error", "in_max_error"):
            if row.get(k) is not None:
                labels[k] = f"{row[k]:g}"
        out.append(
            NcclRecord(
                ts=ts,
                host=host,
                gpu=d0.device if d0 else None,
                job=job,
                comm=comm,
                comm_name="nccl-tests",
                rank=d0.rank if d0 else 0,
                nranks=nranks,
                nnodes=nnodes,
                coll=coll,
                bytes=int(row["size"]),
                exec_time_us=t,
                algbw_gbs=row.get("algbw") if (row.get("algbw") or 0) >= 0 else None,
                busbw_gbs=row.get("busbw") if (row.get("busbw") or 0) >= 0 else None,
                labels=labels,
            )
        )
    if wrong_sizes or run.oob:
        hosts = sorted({d.host for d in devs})
        run_hosts = ",".join(hosts[:MAX_RUN_HOSTS]) + (
            f",+{len(hosts) - MAX_RUN_HOSTS}" if len(hosts) > MAX_RUN_HOSTS else ""
        )
        run_hosts = run_hosts if len(hosts) > 1 else ""
        f = Finding(run_id, coll, host, wrong_sizes, wrong_total, run.oob)
        stats.findings.append(f)
        log.critical("%s: silent data corruption, take this node out of service", f.describe())
        for r in out:
            r.labels["wrong_results"] = "true"
            if run.oob:  # the pre-2.13 layout's verdict: no row says which size was wrong
                r.labels["out_of_bounds"] = str(run.oob)
            if run_hosts:  # any of the run's nodes may be the one at fault: name them
                r.labels["run_hosts"] = run_hosts
    stats.records += len(out)
    return out


def _row(header: list[str], time_scale: float, toks: list[str]) -> dict[str, Any] | None:
    if len(toks) == len(header) - 1 and "redop" in header:
        i = header.index("redop")
        # Pre-2.13 builds printed an empty redop cell for tests without a reduction.
        if i < len(toks) and _float(toks[i]) is not None:
            toks = toks[:i] + [""] + toks[i:]
    if len(toks) < len(header):
        return None
    row: dict[str, Any] = {}
    groups = 0
    for name, tok in zip(header, toks):
        if name == "size":
            size = ascii_int(tok)
            if size is None or size > MAX_SEQ:  # the decoder's int64: 19 nines is no message size
                return None
            row["size"] = size
        elif name in ("type", "redop", "root"):
            row[name] = tok
        elif name in ("time", "cputime"):
            groups += 1
            x = _float(tok)
            row["time" if groups == 1 else "in_time_us"] = None if x is None else x * time_scale
        elif name in ("algbw", "busbw"):
            row[name if groups == 1 else f"in_{name}_gbs"] = _float(tok)
        elif name in ("#wrong", "wrong"):
            row["wrong" if groups == 1 else "in_wrong"] = _float(tok)
        elif name == "error":  # pre-2.13: the largest deviation (maxDelta), not a count
            row["max_error" if groups == 1 else "in_max_error"] = _float(tok)
    return row if "size" in row else None


def _coll_of(
    run: _Run, coll: str | None, perf_hint: str | None, name_hint: str | None, stats: ParseStats
) -> tuple[str, str]:
    if coll:
        return coll, "flag"
    c = collective_name(run.started)
    if c:
        return c, "log"
    c = collective_name(perf_hint)
    if c:
        return c, "log"
    # The file's own name first: a directory named for another collective must not win.
    c = collective_name(name_hint.rsplit("/", 1)[-1] if name_hint else None) or collective_name(name_hint)
    if c:
        stats.coll_from_file_name += 1
        log.warning(
            "nccl-tests log does not name its collective; took %s from the file name %s (use --coll)", c, name_hint
        )
        return c, "file_name"
    stats.coll_unknown += 1
    return "unknown", "unknown"


def _bad_line(stats: ParseStats, line: str) -> None:
    stats.unparsable_lines += 1
    log.warning("nccl-tests line with a number that is not one: %r", line[:200])


def parse_text(
    text: str,
    *,
    ts: float | None = None,
    coll: str | None = None,
    host: str | None = None,
    job: str | None = None,
    name_hint: str | None = None,
    stats: ParseStats | None = None,
) -> list[NcclRecord]:
    """Records from an nccl-tests text log (any layout; several runs in one log are split)."""
    stats = stats if stats is not None else ParseStats()
    runs: list[tuple[_Run, str | None]] = []
    # One stream per launcher tag (untagged lines: ""): each process's run is read apart.
    streams: dict[str, _Stream] = {}
    with_rows: dict[int, _Stream] = {}  # the streams whose run has rows, by ``order``
    # The untagged command lines so far and the latest one's program: each stream takes it when
    # it next closes a run or reads a line (``hint``), so a command line costs the runs it closes,
    # not one step for every stream of the log.
    epoch, base_hint = 0, None

    def hint(st_: _Stream) -> str | None:
        if st_.epoch < epoch:
            st_.perf_hint, st_.epoch = base_hint, epoch
        return st_.perf_hint

    def close(st_: _Stream) -> None:
        if not st_.cur.empty():
            runs.append((st_.cur, hint(st_)))
        st_.cur = _Run()
        with_rows.pop(st_.order, None)

    for line in text.splitlines():
        tag = _TAG.match(line)
        key = (tag.group(1) or tag.group(2)) if tag else ""
        s = (line[tag.end() :] if tag else line).strip()
        if not s:
            continue
        stream = streams.get(key)
        if stream is None:
            if len(streams) >= MAX_STREAMS:
                stats.too_many_streams += 1
                continue
            # A tagged process's run takes the untagged command line echoed before it.
            stream = streams[key] = _Stream(perf_hint=base_hint, order=len(streams), epoch=epoch)
        if not s.startswith("#"):
            m = _PERF.search(s)
            if m and not s[0].isdigit():
                prog = _program(s) or m.group(0)  # an echoed command line: mpirun ... all_gather_perf -b 8
                if key == "":
                    # An untagged command line (a script's echo) starts the next run of every process.
                    for _, other in sorted(with_rows.items()):
                        close(other)
                    epoch, base_hint = epoch + 1, prog
                elif stream.cur.rows:
                    close(stream)
                stream.perf_hint, stream.epoch = prog, epoch
                continue
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            if body.startswith(_BANNERS):
                stats.recognised += 1
            m = _RANK.match(s)
            if m:
                stats.recognised += 1
                if stream.cur.rows:
                    close(stream)
                r, dev = ascii_int(m.group(1), RANK_DIGITS), ascii_int(m.group(5), RANK_DIGITS)
                pid = ascii_int(m.group(3), RANK_DIGITS) if m.group(3) else None
                if r is None or dev is None or (m.group(3) and pid is None):
                    _bad_line(stats, s)
                    continue
                stream.cur.devices[r] = Device(r, m.group(4), dev, pid)
                continue
            if body.startswith("Collective test starting:"):
                stats.recognised += 1
                close(stream)
                stream.cur.started = body.split(":", 1)[1].strip()
                continue
            if body.startswith("Collective test concluded"):
                stats.recognised += 1
                stream.cur.concluded = True
                close(stream)
                continue
            m = _NTHREAD.search(body)
            if m:
                stats.recognised += 1
                if stream.cur.rows or stream.cur.nranks_header is not None:
                    close(stream)
                nthread, ngpus = ascii_int(m.group(1), RANK_DIGITS), ascii_int(m.group(2), RANK_DIGITS)
                if nthread is None or ngpus is None:
                    _bad_line(stats, s)
                    continue
                # One process's ranks: a lower bound for nranks (MPI runs multiply it by processes).
                stream.cur.nranks_header = nthread * ngpus
                continue
            m = _OOB.search(body)
            if m:
                stats.recognised += 1
                n = ascii_int(m.group(1))
                failed = m.group(2).upper() == "FAILED"
                if n is None:
                    _bad_line(stats, s)
                    n = 1 if failed else None  # the verdict still stands when its count is unreadable
                if n is not None:
                    stream.cur.oob = n if (n or failed) else 0
                continue
            toks = body.split()
            if "size" in toks and "count" in toks:
                stats.recognised += 1
                if stream.cur.rows:
                    close(stream)
                stream.cur.header, stream.cur.time_scale = toks, 1.0
            elif stream.cur.header is not None and toks and toks[0] == "(B)" and "(ms)" in toks:
                stream.cur.time_scale = 1000.0
            continue
        if stream.cur.header is None:
            continue
        toks = s.split()
        if not toks[0].isdigit():
            continue
        stats.recognised += 1
        stats.rows += 1
        row = _row(stream.cur.header, stream.cur.time_scale, toks)
        if row is None:
            stats.unparsable_rows += 1
            log.warning(
                "nccl-tests row does not fit its header (%d cells for %d columns): %r",
                len(toks),
                len(stream.cur.header),
                s[:200],
            )
            continue
        stream.cur.rows.append(row)
        with_rows[stream.order] = stream
    for stream in streams.values():
        close(stream)
    t = time.time() if ts is None else ts
    hdefault = host or socket.gethostname()
    out: list[NcclRecord] = []
    multi = sum(1 for r, _ in runs if r.rows or r.oob) > 1
    n = 0
    for run, run_hint in runs:
        if not run.rows and not run.oob:
            continue
        n += 1
        stats.runs += 1
        c, src = _coll_of(run, coll, run_hint, name_hint, stats)
        run_id = f"run{n}" if multi else "run1"
        out.extend(_records(run, c, t, hdefault, job, "text", run_id, stats, src))
    return out


def parse_json(
    doc: dict[str, Any],
    *,
    ts: float | None = None,
    coll: str | None = None,
    host: str | None = None,
    job: str | None = None,
    stats: ParseStats | None = None,
) -> list[NcclRecord]:
    """Records from nccl-tests ``-J`` output. A value of the wrong type is left out and counted
    (``bad_json_values``; a result that is not an object or has no usable size: ``unparsable_rows``);
    the rest of the document is read."""
    stats = stats if stats is not None else ParseStats()
    run = _Run()

    def obj(v: Any) -> dict[str, Any]:
        if isinstance(v, dict):
            return v
        if v is not None:
            stats.bad_json_values += 1
        return {}

    def seq(v: Any) -> list[Any]:
        if isinstance(v, list):
            return v
        if v is not None:
            stats.bad_json_values += 1
        return []

    def count(v: Any) -> int | None:
        x = _float(v)
        return int(x) if x is not None and x >= 0 else None

    def text(v: Any) -> str | None:
        return v if isinstance(v, str) else (str(v) if isinstance(v, int) and not isinstance(v, bool) else None)

    doc = obj(doc)
    if _JSON_KEYS & doc.keys():
        stats.recognised += 1
    for d in seq(obj(doc.get("config")).get("devices")):
        r = count(d.get("rank")) if isinstance(d, dict) else None
        if r is None:
            stats.bad_json_values += 1
            continue
        run.devices[r] = Device(
            r, text(d.get("hostname")) or "unknown", count(d.get("device")) or 0, count(d.get("pid")) or 0
        )
    args = seq(doc.get("args"))
    for r in seq(doc.get("results")):
        stats.rows += 1
        size = count(r.get("size")) if isinstance(r, dict) else None
        if size is None:
            stats.unparsable_rows += 1
            log.warning("nccl-tests -J result without a usable size: %.200r", r)
            continue
        oop, inp = obj(r.get("out_of_place")), obj(r.get("in_place"))
        num = lambda d, *ks: next((_float(d[k]) for k in ks if d.get(k) is not None), None)  # noqa: E731
        run.rows.append(
            {
                "size": size,
                "type": text(r.get("type")),
                "redop": text(r.get("redop")),
                "root": (text(r.get("root")) or "").strip(),
                "time": num(oop, "time", "cpu_time"),
                "algbw": num(oop, "alg_bw"),
                "busbw": num(oop, "bus_bw"),
                "wrong": num(oop, "nwrong"),
                "in_time_us": num(inp, "time", "cpu_time"),
                "in_algbw_gbs": num(inp, "alg_bw"),
                "in_busbw_gbs": num(inp, "bus_bw"),
                "in_wrong": num(inp, "nwrong"),
            }
        )
    oob = doc.get("out_of_bounds")
    if isinstance(oob, dict):
        n = count(oob.get("count"))
        if n is None and oob.get("count") is not None:
            stats.bad_json_values += 1
        # okay=false is the verdict even when the count is missing or unreadable.
        # util.cu's jsonBool writes a string: "okay": "false".
        failed = oob.get("okay") in (False, "false")
        run.oob = n or (1 if failed else (0 if n is not None else None))
    stats.runs += 1
    arg0 = args[0] if args and isinstance(args[0], str) else None
    c, src = (coll, "flag") if coll else (collective_name(arg0), "log")
    if not c:
        stats.coll_unknown += 1
    return _records(
        run,
        c or "unknown",
        time.time() if ts is None else ts,
        host or socket.gethostname(),
        job,
        "json",
        "run1",
        stats,
        src if c else "unknown",
    )


def parse(text: str, **kw: Any) -> list[NcclRecord]:
    """Text or ``-J`` JSON, whichever ``text`` is."""
    if text.lstrip().startswith("{"):
        try:
            # Values nested past the limit become null (counted), so one of them costs only itself.
            doc, deep = jsonsafe.loads_pruned(text)
        except ValueError:
            doc, deep = None, 0
            fixed = _STR_OR_INF.sub(lambda m: m.group(0) if m.group(0)[0] == '"' else "null", text)
            if fixed != text:
                try:
                    doc, deep = jsonsafe.loads_pruned(fixed)  # each infinity reads as missing, as NaN does
                except ValueError:
                    pass
        if isinstance(doc, dict):
            kw.pop("name_hint", None)
            stats = kw.get("stats")
            if stats is None:
                stats = kw["stats"] = ParseStats()
            stats.bad_json_values += deep
            return parse_json(doc, **kw)
    return parse_text(text, **kw)


MAX_LOG_CHARS = 256 * 1024 * 1024  # a burn-in log is kilobytes; this bounds what one poll holds


class NcclTestsSource:
    """A finite source: the whole file (or stdin) in one poll, up to ``max_chars`` characters (the
    rest counted as ``dropped.truncated_log``). ``stats.findings`` lists runs with wrong results
    (the CLI exits non-zero for them)."""

    def __init__(self, path: str, *, max_chars: int = MAX_LOG_CHARS, **kw: Any) -> None:
        self.path = path
        self.max_chars = max_chars
        self.kw = kw
        self.done = False
        self.stats = ParseStats()
        self.truncated = 0
        self.damage: GzipDamage | None = None  # what ended a gzip input early (lost input, exit 3)
        self.unrecognised = False  # text, but not one line of nccl-tests output (the CLI exits 3)

    def poll(self) -> list[NcclRecord]:

        self.done = True
        text, cut, self.damage = read_input(self.path, self.max_chars)
        warn_damage(self.path, self.damage)
        if cut:
            self.truncated = 1
            log.warning(
                "%s: longer than %d characters; the rest is not read (dropped.truncated_log)", self.path, self.max_chars
            )
        recs = parse(text, name_hint=None if self.path == "-" else self.path, stats=self.stats, **self.kw)
        self.unrecognised = bool(text.strip()) and not self.stats.recognised
        if not recs:
            log.warning("%s: no nccl-tests result rows found", self.path)
        elif self.stats.coll_unknown:
            # Records of collective "unknown" match no per-collective baseline: say so once.
            log.warning(
                "%s: %d run(s) name no collective (no start line, *_perf command or file name): "
                'their records say coll "unknown" (use --coll)',
                self.path,
                self.stats.coll_unknown,
            )
        return recs

    def summary(self) -> dict[str, int]:
        """Counts for the exit summary (what was read and what was left out, by reason)."""
        s = self.stats
        return {
            "runs": s.runs,
            "rows": s.rows,
            "dropped.unparsable_row": s.unparsable_rows,
            "dropped.unparsable_line": s.unparsable_lines,
            "dropped.bad_json_value": s.bad_json_values,
            "dropped.no_time": s.no_time,
            "dropped.truncated_log": self.truncated,
            "dropped.too_many_streams": s.too_many_streams,
            "wrong_result_runs": len(s.findings),
            "coll_unknown_runs": s.coll_unknown,
        } | damage_counts(self.damage)

    def close(self) -> None:
        pass
