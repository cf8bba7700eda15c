"""NCCL Inspector plugin output -> ``NcclRecord``s, aggregated per communicator and interval.

JSON mode (NVIDIA/nccl ``plugins/profiler/inspector/inspector_json.cc`` from 2.30; before,
``inspector.cc``, under ``ext-profiler/`` up to 2.29.3): the plugin writes
``<dump_dir>/<hostname>-pid<pid>.log``, one object a line: ``header`` (``id``: the comm hash as
``"0x…"`` text, ``comm_name`` from 2.30 on, ``"unknown"`` when the application named none, ``rank``,
``n_ranks``, ``nnodes``), ``metadata`` (``inspector_output_format_version``, always ``"v4.0"`` so
far; ``git_rev``, ``rec_mechanism``, ``dump_timestamp_us``, ``hostname``, ``pid``) and ``coll_perf``
or, from 2.30 on, ``p2p_perf`` (``p2p_peer`` beside the ``p2p_*`` twins of the ``coll_*`` fields);
bandwidths are ``%lf`` numbers or the string ``"nan"``; verbose mode adds
``event_trace_sn``/``event_trace_ts`` inside the perf object. From 2.30 on there is one line per
completed operation (a per-communicator ring of 1,024 by default, overwritten silently when full);
up to 2.29 one line per communicator per dump, its latest operation only. ``InspectorFollower``
follows every such file in a directory like ``tail -F``: new files, appended lines, a partial last
line (kept until its newline arrives), truncation and rotation (a new inode under the same name
starts over). Records are selected by ``coll_perf``/``p2p_perf``. Also tolerated, though NVIDIA's
plugin writes none of them: a ``dump_stats`` record
(``*_dropped_since_last_dump``/``*_dropped_total``, counted as
``dropped.inspector_ring_overwritten`` and warned about), ``coll_algo``/``coll_proto`` (kept in
``labels`` as ``algo``, ``proto`` and ``algo_proto``), operation lines without
``header``/``metadata`` (the last ``dump_stats`` marker's are applied) and ``proxy_trace`` records
(counted, not sent).

A 16,384-rank job emits far too many operations to ship raw, so ``Aggregator`` folds each
interval's operations per (host, communicator, rank, collective, message size) into one record:
mean time and bandwidths, the count and the worst time in ``labels``.

Ranks map to GPUs only where that is knowable: with ``gpus_per_node`` given and a communicator
that spans whole nodes (``n_ranks == nnodes * gpus_per_node``), ``gpu = rank % gpus_per_node``
(NCCL's usual node-major rank order); otherwise ``gpu`` stays empty rather than guessed.

Prometheus mode (``--prom PATH``: a file, or the dump directory): the plugin writes
``<dump_dir>/nccl_inspector_metrics_<GPU UUID>.prom`` per GPU, rewritten every dump interval;
see ``parse_prom`` for its two layouts and ``PromFileSource`` for the files.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from pipeline.numeric import ascii_int, finite
from pipeline.recordchecks import MAX_GPU_INDEX, MAX_RANKS, MAX_SEQ, TS_MAX, TS_MIN, bad_host, bad_identifier
from pipeline.schema import NcclRecord
from producers import jsonsafe
from producers.textinput import read_capped

log = logging.getLogger(__name__)

_PATTERNS = ("*.log", "*.jsonl", "*.json")
LINE_MAX = 4 * 1024 * 1024  # an operation line is a few hundred bytes, a verbose one a few KiB
RING_KEYS_MAX = 65_536  # (file, communicator, kind) totals remembered for *_dropped_total growth


def _name(v: Any) -> str | None:
    """A communicator name, or None for none: ``"unknown"`` is the plugin's placeholder for a
    communicator the application did not name (``inspector_json.cc``, ``inspector_prom.cc``)."""
    return v if isinstance(v, str) and v and v != "unknown" else None


def _int(v: Any, lo: int, hi: int) -> int | None:
    """A JSON integer (not a bool) from ``lo`` to ``hi``, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else None


def _text(v: Any, host: bool = False) -> str | None:
    """``v`` when the decoder takes it as a name (a host name: ``host``, which holds no space),
    else None: ``recordchecks.bad_identifier`` decides, so the two never disagree."""
    return v if (bad_host(v) if host else bad_identifier(v)) is None else None


def _num(v: Any) -> float | None:
    """A finite number below 2**63 from an Inspector value (which may be ``"nan"`` or a numeric
    string; ASCII only), else None."""
    return finite(v)


@dataclass
class InspectorStats:
    lines: int = 0
    records: int = 0
    bad_json: int = 0
    skipped: int = 0  # valid JSON but no usable perf record (no time, bad rank...)
    rotations: int = 0
    dump_stats: int = 0  # v4.1+ per-dump stats records read
    ring_overwritten: int = 0  # operations the Inspector itself dropped (its ring buffer was full)
    # A field the decoder would refuse (a seq past int64, nnodes 0, a year-3000 timestamp, a name
    # past 256 characters): left out, so the operation's timing is kept.
    bad_values: int = 0
    skipped_by: dict[str, int] = field(default_factory=dict)  # reason -> records

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.skipped_by[reason] = self.skipped_by.get(reason, 0) + 1

    def counts(self) -> dict[str, int]:
        """What the exit summary, the periodic log line and /metrics show."""
        out = {
            "lines": self.lines,
            "operations": self.records,
            "dump_stats": self.dump_stats,
            "rotations": self.rotations,
            "dropped.bad_json": self.bad_json,
            "dropped.inspector_ring_overwritten": self.ring_overwritten,
            "dropped.bad_value": self.bad_values,
        }
        for reason, n in sorted(self.skipped_by.items()):
            out[f"dropped.{reason}"] = n
        return out


def parse_record(
    obj: Any, *, gpus_per_node: int | None = None, file_host: str | None = None, job: str | None = None
) -> NcclRecord | None:
    """One Inspector JSON object -> an ``NcclRecord``, or None when it holds no usable operation."""
    r = parse_operation(obj, gpus_per_node=gpus_per_node, file_host=file_host, job=job)
    return r if isinstance(r, NcclRecord) else None


def parse_operation(
    obj: Any,
    *,
    gpus_per_node: int | None = None,
    file_host: str | None = None,
    job: str | None = None,
    context: dict[str, Any] | None = None,
    stats: InspectorStats | None = None,
) -> NcclRecord | str:
    """One Inspector JSON object -> an ``NcclRecord``, or the reason it holds none (``not_an_object``,
    ``no_operation``, ``bad_rank``, ``no_time``). ``context``: the v4.3 marker's ``header`` and
    ``metadata``, for operation lines that carry neither. A field outside the decoder's range is
    left out and counted in ``stats.bad_values``."""
    if not isinstance(obj, dict):
        return "not_an_object"
    hdr = obj.get("header") or (context or {}).get("header") or {}
    meta = obj.get("metadata") or (context or {}).get("metadata") or {}
    perf, kind = (obj.get("coll_perf"), "coll") if "coll_perf" in obj else (obj.get("p2p_perf"), "p2p")
    if not isinstance(perf, dict):
        return "no_operation"
    if not isinstance(hdr, dict) or not isinstance(meta, dict):
        return "bad_rank"
    # The decoder's bounds: a communicator past MAX_RANKS would be dead-lettered downstream.
    rank = _int(hdr.get("rank"), 0, MAX_RANKS - 1)
    nranks = _int(hdr.get("n_ranks", hdr.get("nranks")), 1, MAX_RANKS)
    if rank is None or nranks is None or rank >= nranks:
        return "bad_rank"
    bad = 0
    nbytes = _num(perf.get(f"{kind}_msg_size_bytes"))
    exec_us = _num(perf.get(f"{kind}_exec_time_us"))
    if nbytes is None or exec_us is None or exec_us < 0 or nbytes < 0:
        return "no_time"
    ts_us = _num(meta.get("dump_timestamp_us"))
    ts = ts_us / 1e6 if ts_us else time.time()
    if not TS_MIN <= ts <= TS_MAX:  # a year the decoder refuses: the read time, as for none
        bad, ts = bad + 1, time.time()
    host = _text(meta.get("hostname"), host=True)
    bad += meta.get("hostname") not in (None, "") and host is None
    host = host or file_host or "unknown"
    nnodes = _int(hdr.get("nnodes"), 1, MAX_RANKS)
    bad += hdr.get("nnodes") is not None and nnodes is None
    gpu = None
    if gpus_per_node and nnodes and nranks == nnodes * gpus_per_node:
        gpu = rank % gpus_per_node
    labels = {"source": "nccl_inspector"}
    for k in ("inspector_output_format_version", "pid"):
        if meta.get(k) not in (None, ""):
            labels[k.replace("inspector_output_format_", "")] = str(meta[k])
    if perf.get(f"{kind}_timing_source"):
        labels["timing_source"] = str(perf[f"{kind}_timing_source"])
    algo, proto = perf.get(f"{kind}_algo"), perf.get(f"{kind}_proto")  # v4.2+
    if algo not in (None, ""):
        labels["algo"] = str(algo)
    if proto not in (None, ""):
        labels["proto"] = str(proto)
    if algo not in (None, "") or proto not in (None, ""):
        labels["algo_proto"] = f"{algo or 'unknown'}_{proto or 'unknown'}"
    if kind == "p2p" and perf.get("p2p_peer") is not None:
        labels["peer"] = str(perf["p2p_peer"])
    algbw, busbw = _num(perf.get(f"{kind}_algobw_gbs")), _num(perf.get(f"{kind}_busbw_gbs"))
    seq = _int(perf.get(f"{kind}_sn"), 0, MAX_SEQ)  # jsonUint64: up to 2**64-1, the decoder's is int64
    bad += perf.get(f"{kind}_sn") is not None and seq is None
    comm_name = _name(hdr.get("comm_name"))
    if comm_name is not None and _text(comm_name) is None:  # the plugin keeps up to 2,047 bytes
        bad, comm_name = bad + 1, None
    comm = _text(str(hdr.get("id", "unknown")))
    coll = _text(str(perf.get(kind) or kind))
    if comm is None or coll is None:
        return "bad_id"  # no communicator or collective the decoder would take
    if bad and stats is not None:
        stats.bad_values += bad
    return NcclRecord(
        ts=ts,
        host=host,
        gpu=gpu,
        job=job,
        comm=comm,
        comm_name=comm_name,
        rank=rank,
        nranks=nranks,
        nnodes=nnodes,
        coll=coll,
        seq=seq,
        bytes=int(nbytes),
        exec_time_us=exec_us,
        algbw_gbs=algbw if algbw is None or algbw >= 0 else None,
        busbw_gbs=busbw if busbw is None or busbw >= 0 else None,
        labels=labels,
    )


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def aggregate(records: Iterable[NcclRecord]) -> list[NcclRecord]:
    """Fold operations per (host, comm, rank, coll, bytes): means, count and the worst time."""
    groups: dict[tuple, list[NcclRecord]] = {}
    for r in records:
        # Operations NCCL ran with another algorithm/protocol are not the same measurement.
        groups.setdefault((r.host, r.comm, r.rank, r.coll, r.bytes, r.labels.get("algo_proto", "")), []).append(r)
    out = []
    for recs in groups.values():
        last = max(recs, key=lambda r: r.ts)
        if len(recs) == 1:
            out.append(last)
            continue
        times = [r.exec_time_us for r in recs]
        labels = {
            **last.labels,
            "ops": str(len(recs)),
            "exec_time_us_max": f"{max(times):g}",
            "seq_first": str(min((r.seq for r in recs if r.seq is not None), default="")),
        }
        out.append(
            NcclRecord(
                ts=last.ts,
                host=last.host,
                gpu=last.gpu,
                job=last.job,
                comm=last.comm,
                comm_name=last.comm_name,
                rank=last.rank,
                nranks=last.nranks,
                nnodes=last.nnodes,
                coll=last.coll,
                seq=last.seq,
                bytes=last.bytes,
                exec_time_us=sum(times) / len(times),
                algbw_gbs=_mean([r.algbw_gbs for r in recs if r.algbw_gbs is not None]),
                busbw_gbs=_mean([r.busbw_gbs for r in recs if r.busbw_gbs is not None]),
                labels=labels,
            )
        )
    out.sort(key=lambda r: (r.host, r.comm, r.rank, r.coll, r.bytes))
    return out


@dataclass
class _Tail:
    inode: int
    offset: int = 0
    partial: bytes = b""
    head: bytes = b""  # the file's first bytes: a rewrite to the same size changes them
    skipping: bool = False  # inside a line longer than the cap: drop bytes up to its newline


class InspectorFollower:
    """Follows the Inspector's dump files in ``directory``; ``poll`` aggregates what was new."""

    def __init__(
        self,
        directory: str | Path,
        *,
        gpus_per_node: int | None = None,
        job: str | None = None,
        host: str | None = None,
        from_start: bool = True,
        max_read_bytes: int = 64 * 1024 * 1024,
        aggregate_ops: bool = True,
        max_line_bytes: int = LINE_MAX,
    ) -> None:
        self.dir = Path(directory)
        self.gpus_per_node = gpus_per_node
        self.job = job
        self.host = host  # --host: overrides the host name the files give
        self.from_start = from_start
        self.max_read_bytes = max_read_bytes
        self.max_line_bytes = max_line_bytes
        self.aggregate_ops = aggregate_ops
        self.stats = InspectorStats()
        self.done = False
        self._tails: dict[Path, _Tail] = {}
        self._first = True
        self._warned_missing = False
        self._context: dict[Path, dict[str, Any]] = {}  # v4.3: the last dump_stats marker per file
        self._ring_totals: dict[tuple, float] = {}  # (file, comm, kind) -> *_dropped_total seen

    def _files(self) -> list[Path]:
        if not self.dir.is_dir():
            if not self._warned_missing:
                log.warning("%s is not a directory (yet): waiting for the Inspector to create it", self.dir)
                self._warned_missing = True
            return []
        self._warned_missing = False
        seen: set[Path] = set()
        for pat in _PATTERNS:
            seen.update(p for p in self.dir.glob(pat) if p.is_file())
        return sorted(seen)

    @staticmethod
    def _head(path: Path, n: int) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read(n)
        except OSError:
            return b""

    def _read(self, path: Path) -> list[bytes]:
        try:
            st = path.stat()
        except OSError:
            return []
        t = self._tails.get(path)
        if t is None:
            start = 0 if (self.from_start or not self._first) else st.st_size
            t = self._tails[path] = _Tail(st.st_ino, start)
        elif t.inode != st.st_ino or st.st_size < t.offset or (t.head and self._head(path, len(t.head)) != t.head):
            # Rotated (new inode) or truncated: the new content starts at 0; a partial line of the
            # old file can never be completed.
            self.stats.rotations += 1
            log.info("%s rotated or truncated; reading it from the start", path)
            t.inode, t.offset, t.partial, t.head, t.skipping = st.st_ino, 0, b"", b"", False
        if st.st_size <= t.offset:
            return []
        with open(path, "rb") as fh:
            fh.seek(t.offset)
            data = fh.read(min(st.st_size - t.offset, self.max_read_bytes))
        if t.offset == 0 or len(t.head) < 64:
            t.head = self._head(path, 64)
        t.offset += len(data)
        if t.skipping:  # the rest of a line already counted as oversize
            nl = data.find(b"\n")
            if nl < 0:
                return []
            data, t.skipping = data[nl + 1 :], False
        data = t.partial + data
        *lines, t.partial = data.split(b"\n")
        if len(t.partial) > self.max_line_bytes:
            # An unfinished line past the cap (a dump without newlines) is not held: it would grow
            # by max_read_bytes a poll. Counted now; its bytes up to the next newline are skipped.
            self.stats.skip("oversize_line")
            log.warning("%s: a line longer than %d bytes: skipped to its newline", path, self.max_line_bytes)
            t.partial, t.skipping = b"", True
        if any(len(line) > self.max_line_bytes for line in lines):
            kept = [line for line in lines if len(line) <= self.max_line_bytes]
            for _ in range(len(lines) - len(kept)):
                self.stats.skip("oversize_line")
            lines = kept
        return lines

    def poll(self) -> list[NcclRecord]:
        recs = []
        live = set()
        for path in self._files():
            live.add(path)
            m = re.match(r"(.+)-pid(\d+)$", path.stem)
            file_host = m.group(1) if m else None
            for line in self._read(path):
                line = line.strip()
                if not line:
                    continue
                self.stats.lines += 1
                try:
                    obj = jsonsafe.loads(line)  # nesting and numbers bounded: a bad line is a ValueError
                except ValueError:
                    self.stats.bad_json += 1
                    log.debug("%s: not JSON: %.120r", path, line)
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("dump_stats"), dict):
                    self._dump_stats(path, obj)
                    continue
                if isinstance(obj, dict) and "proxy_trace" in obj:
                    self.stats.skip("proxy_trace")  # network-progress traces: no operation timing to send
                    continue
                r = parse_operation(
                    obj,
                    gpus_per_node=self.gpus_per_node,
                    file_host=file_host,
                    job=self.job,
                    context=self._context.get(path),
                    stats=self.stats,
                )
                if isinstance(r, str):
                    self.stats.skip(r)
                    continue
                if self.host:
                    r = msgspec.structs.replace(r, host=self.host)
                self.stats.records += 1
                recs.append(r)
        for gone in set(self._tails) - live:
            del self._tails[gone]  # deleted by the plugin's own clean-up or by logrotate
            self._context.pop(gone, None)
        self._first = False
        return aggregate(recs) if self.aggregate_ops else recs

    def _dump_stats(self, path: Path, obj: dict[str, Any]) -> None:
        """A v4.1+ ``dump_stats`` record: count the operations the plugin overwrote before dumping
        them (``*_dropped_since_last_dump``, else the growth of ``*_dropped_total``), and keep its
        header/metadata as the context of the v4.3 operation lines that follow it."""
        self.stats.dump_stats += 1
        st = obj["dump_stats"]
        hdr = obj.get("header")
        if not isinstance(hdr, dict):
            hdr = {}
        if obj.get("header") or obj.get("metadata"):
            self._context[path] = {"header": obj.get("header"), "metadata": obj.get("metadata")}
        lost = 0.0
        for kind in ("coll", "p2p"):
            raw_since, raw_total = st.get(f"{kind}_dropped_since_last_dump"), st.get(f"{kind}_dropped_total")
            since, total = _count(raw_since), _count(raw_total)
            if (raw_since is not None and since is None) or (raw_total is not None and total is None):
                # 1e308, "²", a list: not a count. The marker's context still applies.
                self.stats.skip("bad_dump_stats")
            key = (path, str(hdr.get("id"))[:256], kind)
            if key not in self._ring_totals and len(self._ring_totals) >= RING_KEYS_MAX:
                del self._ring_totals[next(iter(self._ring_totals))]  # the oldest: memory stays bounded
            if since is not None:
                lost += max(since, 0.0)
            elif total is not None:
                prev = self._ring_totals.get(key, 0.0)
                lost += total - prev if total >= prev else total  # a smaller total: the process restarted
            if total is not None:
                self._ring_totals[key] = total
        if lost > 0:
            self.stats.ring_overwritten += int(lost)
            log.warning(
                "NCCL Inspector on %s dropped %d operation record(s) of communicator %s before dumping "
                "them (its ring buffer was full; %d in all): raise the plugin's ring size or dump more "
                "often",
                path.name,
                lost,
                hdr.get("comm_name") or hdr.get("id"),
                self.stats.ring_overwritten,
            )

    def summary(self) -> dict[str, int]:
        """Lines, operations, and what was dropped, by reason (the plugin's own losses included)."""
        return self.stats.counts()

    def close(self) -> None:
        pass


def _count(v: Any) -> float | None:
    """A ring-buffer count: a finite number from 0 to 2**53 (exact as a float), else None."""
    x = _num(v)
    return x if x is not None and 0 <= x <= 2.0**53 else None


_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def bucket_bytes(bucket: str) -> int | None:
    """Lower bound of a Prometheus-mode size bucket: ``"4-5GB"`` -> 4 GiB, ``"512-513MB"`` -> 512 MiB;
    the 2.29 layout's size to two decimals of its unit: ``"2.00GB"`` -> 2 GiB, ``"512B"``."""
    m = re.fullmatch(r"\s*(\d{1,12})(?:\.(\d{1,2})|-\d{1,12})?\s*([KMGT]?B)\s*", bucket or "", re.ASCII)
    if not m:
        return None
    n = round((int(m.group(1)) + int(m.group(2) or 0) / 10 ** len(m.group(2) or "")) * _UNITS[m.group(3)])
    return n if n <= MAX_SEQ else None  # the decoder's int64: "999999999999TB" is no message size


def parse_prom(
    text: str,
    *,
    ts: float,
    host: str | None = None,
    counts: dict[str, int] | None = None,
    job: str | None = None,
) -> list[NcclRecord]:
    """Prometheus-mode output -> one record per series (``inspector_prom.cc``).

    From 2.30 (``version="v5.1"``): per GPU, one series per (communicator name, ``n_nodes``,
    ``nranks``, op, size bucket, ``algo_proto``) with ``nccl_bus_bandwidth_gbs`` (a geometric mean)
    and ``nccl_collective_exec_time_microseconds`` (+ ``nccl_p2p_*`` with ``p2p_operation``), labels
    ``node, gpu="GPU<n>", comm_name`` (``"unknown"`` when unnamed), ``message_size="4-5GB"``. This
    layout carries no rank: ``rank`` is the GPU's local index when that is below ``nranks``
    (labelled ``rank_source=gpu_index``), else 0 (``rank_source=unknown``).

    2.29.3-2.29.7: one series per communicator's latest collective, ``nccl_algorithm_bandwidth_gbs``
    beside the other two, labels ``comm_id, hostname, rank, slurm_job, slurm_job_id, nranks, n_nodes,
    gpu_device_id="GPU<n>", collective, coll_sn, timestamp, message_size="2.00GB"``: the rank is
    read from its label (``rank_source=label``).

    ``host`` and ``job``, where given, stand in for the labels' (``--host``, ``--job``).
    """
    rows: dict[tuple, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name.endswith("bus_bandwidth_gbs"):
                what = "busbw"
            elif name.endswith("algorithm_bandwidth_gbs"):
                what = "algbw"
            elif name.endswith("exec_time_microseconds"):
                what = "time"
            else:
                if counts is not None:
                    counts["dropped.unknown_metric"] = counts.get("dropped.unknown_metric", 0) + 1
                continue
            lab = s.labels
            # The plugin writes every metric of a series with the same labels, and two series
            # differ in one label or more (nranks, n_nodes of two "unknown" communicators; coll_sn).
            row = rows.setdefault(tuple(sorted(lab.items())), {"labels": lab})
            row[what] = float(s.value)
    out = []
    for row in rows.values():
        lab = row["labels"]
        t = _num(row.get("time"))
        nranks = ascii_int(lab.get("nranks", "0"), 9) or 0  # "٣" or 5,000 digits: this row's bad_rank
        if t is None or not 0 < nranks <= MAX_RANKS:
            if counts is not None:
                reason = "dropped.no_time" if t is None else "dropped.bad_rank"
                counts[reason] = counts.get(reason, 0) + 1
            continue
        # "GPU٣" is not GPU 3; 2.29 names the label gpu_device_id
        g = re.fullmatch(r"GPU(\d{1,6})", lab.get("gpu") or lab.get("gpu_device_id") or "", re.ASCII)
        gpu = int(g.group(1)) if g else None
        bad = 0
        if gpu is not None and gpu > MAX_GPU_INDEX:  # a GPU index the decoder refuses: no GPU
            bad, gpu = bad + 1, None
        named = ascii_int(lab.get("rank"), 9)
        if named is not None and named < nranks:
            rank, src = named, "label"
        else:
            rank, src = (gpu, "gpu_index") if gpu is not None and gpu < nranks else (0, "unknown")
        labels = {"source": "nccl_inspector_prom", "rank_source": src}
        for k in ("message_size", "algo_proto", "version"):
            if lab.get(k):
                labels[k] = lab[k]
        row_job = job or lab.get("slurm_job_id")
        nnodes = ascii_int(lab.get("n_nodes", ""), 9)
        if nnodes is not None and not 0 < nnodes <= MAX_RANKS:  # the decoder's range: left out
            bad, nnodes = bad + 1, None
        busbw, algbw = _num(row.get("busbw")), _num(row.get("algbw"))
        comm_id = lab.get("comm_id") or None  # 2.29: the comm hash; 2.30 writes only the name
        comm_name = _name(lab.get("comm_name"))
        if comm_name is not None and _text(comm_name) is None:
            bad, comm_name = bad + 1, None
        comm = _text(comm_id or lab.get("comm_name") or "unknown")
        coll = _text(lab.get("collective") or lab.get("p2p_operation") or "unknown")
        lhost = host or _text(lab.get("node") or lab.get("hostname") or "", host=True)
        if (lab.get("node") or lab.get("hostname")) and lhost is None:
            bad += 1
        if comm is None or coll is None:
            if counts is not None:
                counts["dropped.bad_id"] = counts.get("dropped.bad_id", 0) + 1
            continue
        nbytes = bucket_bytes(lab.get("message_size", ""))
        if nbytes is None and lab.get("message_size"):
            bad += 1  # a bucket past an int64 or of no known layout: the size is left at 0
        if bad and counts is not None:
            counts["dropped.bad_value"] = counts.get("dropped.bad_value", 0) + bad
        out.append(
            NcclRecord(
                ts=ts,
                host=lhost or socket.gethostname(),
                gpu=gpu,
                job=None if row_job in (None, "", "unknown") else row_job,
                comm=comm,
                comm_name=comm_name,
                rank=rank,
                nranks=nranks,
                nnodes=nnodes,
                coll=coll,
                seq=ascii_int(lab.get("coll_sn"), 18),  # within an int64, as the decoder wants
                bytes=nbytes or 0,
                exec_time_us=t,
                algbw_gbs=algbw if algbw is None or algbw >= 0 else None,
                busbw_gbs=busbw if busbw is None or busbw >= 0 else None,
                labels=labels,
            )
        )
    return out


PROM_FILES_MAX = 1024  # a dump directory's files: one per GPU, 8-72 on a real host
PROM_CHARS_MAX = 16 * 1024 * 1024  # a file's series: a few hundred lines per GPU, ~100 KB
# The plugin's file name carries its GPU's UUID (inspector_prom.cc): the one sure name of the GPU.
_PROM_FILE = re.compile(r"nccl_inspector_metrics_([A-Za-z0-9-]{1,96})\.prom")


def _plain(path: Path) -> bool:
    """Whether ``path`` is a regular file itself, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class PromFileSource:
    """Re-reads the plugin's Prometheus-mode output whenever it is rewritten (mtime change):
    one file, or the dump directory's ``nccl_inspector_metrics_<GPU UUID>.prom`` files (the
    plugin writes one per GPU), each on its own change; a link or another name in the directory
    is not read, and a file is read up to ``PROM_CHARS_MAX`` characters.

    A file named so lends its UUID to its records (``labels["gpu_uuid"]``). Its ``gpu`` label is
    the process's CUDA device number, not the GPU's: with one GPU visible to each process (a
    Slurm task per GPU) every file says ``GPU0``. Where two files of the directory claim one
    (host, GPU index), the index names no GPU: their records carry no ``gpu`` and, where the rank
    was that index, rank 0 (``rank_source=unknown``), for as long as both files are there.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        host: str | None = None,
        once: bool = False,
        job: str | None = None,
        gpus_per_node: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.host = host
        self.job = job
        self.gpus_per_node = gpus_per_node
        self.once = once
        self.done = False
        self._mtimes: dict[Path, float] = {}
        # Each file's GPU UUID and the (host, GPU index) pairs its last read claimed.
        self._claimed: dict[Path, tuple[str, set[tuple[str, int]]]] = {}
        self.counts: dict[str, int] = {
            "reads": 0,
            "records": 0,
            "dropped.unparsable_file": 0,
            "dropped.unknown_metric": 0,
            "dropped.no_time": 0,
            "dropped.bad_rank": 0,
            "dropped.bad_id": 0,
            "dropped.bad_value": 0,
            "dropped.oversize": 0,
            "dropped.too_many_files": 0,  # the most left out of one poll
        }

    def _files(self) -> list[Path]:
        """The file, or the directory's plugin files in name order (at most ``PROM_FILES_MAX``)."""
        if not self.path.is_dir():
            return [self.path]
        try:
            # Not a link: the dump directory is the job's to write, and a link could name any file.
            files = sorted(p for p in self.path.iterdir() if _PROM_FILE.fullmatch(p.name) and _plain(p))
        except OSError as e:
            log.warning("%s: %s", self.path, e)
            return []
        if len(files) > PROM_FILES_MAX:
            over = len(files) - PROM_FILES_MAX
            self.counts["dropped.too_many_files"] = max(self.counts["dropped.too_many_files"], over)
            files = files[:PROM_FILES_MAX]
        return files

    def poll(self) -> list[NcclRecord]:
        if self.once:
            self.done = True
        files = self._files()
        present = set(files)
        # A file the plugin removed (its process ended) is read anew should it come back, and
        # claims no GPU index meanwhile.
        self._mtimes = {p: m for p, m in self._mtimes.items() if p in present}
        self._claimed = {p: c for p, c in self._claimed.items() if p in present}
        read: list[tuple[NcclRecord, str | None]] = []
        for p in files:
            read += self._read(p)
        owners: dict[tuple[str, int], set[str]] = {}
        for uuid, keys in self._claimed.values():
            for k in keys:
                owners.setdefault(k, set()).add(uuid)
        out = [self._by_rank(self._located(r, uuid, owners)) for r, uuid in read]
        self.counts["records"] += len(out)
        return out

    def _read(self, path: Path) -> list[tuple[NcclRecord, str | None]]:
        """The records of ``path`` if it changed, each with its file's GPU UUID (None: not named
        so); the GPU indices they claim noted (``_claimed``)."""
        try:
            st = os.stat(path)
        except OSError as e:
            log.warning("%s: %s", path, e)
            return []
        if st.st_mtime == self._mtimes.get(path):
            return []
        self._mtimes[path] = st.st_mtime
        self.counts["reads"] += 1
        try:
            text, more = read_capped(str(path), PROM_CHARS_MAX)
        except OSError as e:
            log.warning("%s: %s", path, e)
            return []
        if more:
            self.counts["dropped.oversize"] += 1
            log.warning("%s: more than %d characters; not read", path, PROM_CHARS_MAX)
            return []
        try:
            recs = parse_prom(text, ts=time.time(), host=self.host, counts=self.counts, job=self.job)
        except ValueError as e:  # a half-rewritten file: try again at the next change
            del self._mtimes[path]
            self.counts["dropped.unparsable_file"] += 1
            log.warning("%s: not parseable yet (%s)", path, e)
            return []
        m = _PROM_FILE.fullmatch(path.name)
        if m is None:
            return [(r, None) for r in recs]
        self._claimed[path] = (m.group(1), {(r.host, r.gpu) for r in recs if r.gpu is not None})
        return [(r, m.group(1)) for r in recs]

    def _located(self, r: NcclRecord, uuid: str | None, owners: dict[tuple[str, int], set[str]]) -> NcclRecord:
        """``r`` of the file of GPU ``uuid``: labelled with it, and without its GPU index (and the
        rank read from it) where files of two GPUs claim that index on its host (``owners``)."""
        if uuid is None:
            return r
        labels = {**r.labels, "gpu_uuid": uuid}
        if r.gpu is None or len(owners.get((r.host, r.gpu), ())) < 2:
            return msgspec.structs.replace(r, labels=labels)
        if labels.get("rank_source") != "gpu_index":  # 2.29's rank label holds
            return msgspec.structs.replace(r, gpu=None, labels=labels)
        labels["rank_source"] = "unknown"
        return msgspec.structs.replace(r, gpu=None, rank=0, labels=labels)

    def _by_rank(self, r: NcclRecord) -> NcclRecord:
        """``r`` with ``gpu = rank % gpus_per_node`` where it has no GPU but a rank from its label and
        its communicator spans whole nodes (``--gpus-per-node``, as in JSON mode)."""
        n = self.gpus_per_node
        if not n or r.gpu is not None or r.labels.get("rank_source") != "label":
            return r
        if not r.nnodes or r.nranks != r.nnodes * n:
            return r
        return msgspec.structs.replace(r, gpu=r.rank % n)

    def summary(self) -> dict[str, int]:
        """Reads, records, and what was dropped, by reason."""
        return dict(self.counts)

    def close(self) -> None:
        pass


__all__ = ["InspectorFollower", "PromFileSource", "aggregate", "bucket_bytes", "parse_prom", "parse_record"]
