"""NCCL's InfiniBand errors in a training log -> ``NicRecord``s that count them per HCA.

When a work request fails on an InfiniBand/RoCE queue pair, NCCL's IB transport
(``src/transport/net_ib.cc``, ``net_ib/p2p.cc`` since 2.29) prints the completion's status and,
since 2.10, the peer it was talking to; since 2.22 the HCA too. Its async-event thread prints
the events the HCA raised. Read here, in every layout those files have printed
(docs/producers.md#nccl-infiniband-errors-in-a-training-log has the table):

- ``NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129`` (up to 2.9);
- ``NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327,
  vendor err 81`` (2.10-2.17), then with `` (Send)[ localGid .. remoteGid ..]`` (2.18, 2.19);
- ``NET/IB : Got completion from peer P with status=12 opcode=0 len=0 vendor err 129 (Recv)``
  (2.20, 2.21), the same with `` hca mlx5_0`` at the end (2.22-2.28.3, ``NET/IB:``; still so
  for ``NET/IB/GIN:``, GPU-initiated networking, 2.28.7 and later);
- ``NET/IB: Got completion from peer P with status=IBV_WC_RETRY_EXC_ERR(12) opcode=..(0)
  reqSize=0 vendor_err=129 req_type=Send .. hca mlx5_0`` (2.28.7-2.28.9), without ``reqSize``
  and ``req_type`` (2.29 and later);
- ``NET/IB : Got async event : local catastrophic error`` (up to 2.19),
  ``NET/IB : mlx5_0:1 Got async event : ..`` (2.20-2.22), ``NET/IB : mlx5_0:1 async fatal
  event[ on QP (0x..)[ qpn=..]]: ..`` (2.23 and later); the non-fatal events (``Got async error
  event``, ``Got non-fatal async event``) are counted, not sent;
- ``Call to ibv_poll_cq() returned -2`` (every 2.x release from 2.3.5, ``include/ibvwrap.h``'s
  ``wrap_ibv_poll_cq``): polling the completion queue itself failed, the HCA in error; a
  completion error with ``status`` the value returned and ``status_name`` ``ibv_poll_cq_failed``;
- ``NET/IB : Using [0]mlx5_0:1/IB [1]={[1] mlx5_1:1/IB, [2] mlx5_2:1/IB} ..``: the HCAs and
  ports a process uses (merged NICs in braces, 2.20-2.22), which name the HCA of a line that
  does not (before 2.22) when the process uses one.

Around the message: NCCL's own prefix (``[2025-11-09 07:39:30] host:pid:tid [cudaDev]
file.cc:line (func) NCCL WARN``, the time since 2.26), and anything before it (PyTorch's
``[rank3]:``, torchrun's ``[default3]:``, mpirun's ``[1,12]<stdout>:``, a log shipper's ISO time).
A warning's message again without the prefix, after one read with it, is PyTorch repeating
NCCL's last error in its exception (``Last error:``): counted ``ib_echoed_warnings``, not again.

Each HCA's errors become one ``nic`` record per second in which there were any, its counters
``nccl_ib_completion_errors`` and ``nccl_ib_async_fatal_events`` counting from 0 at the start of
the log, its labels the first error's ``peer``, ``status``, ``status_name``, ``opcode``,
``vendor_err``, ``direction``, ``event`` and the ``rank``; the port checks' ``completion_errors``
judges them (docs/rules.md#nic-ports).
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field

from pipeline.numeric import ascii_int
from pipeline.recordchecks import TS_MAX, TS_MIN
from pipeline.schema import NicRecord

MAX_RECORDS = 100_000  # (host, HCA, second) records one log may make; the rest counted
MAX_LABEL = 128  # a peer ``ip<port>`` is ~50 characters; longer is cut
MAX_PORTS = 64  # HCAs a host's "Using" lines may name
MAX_SEEN = 4096  # NCCL warnings kept (the newest) to know an echo of one (each under NCCL's 1024-byte line)

# NCCL's prefix: [time] host:pid:tid [cudaDev] file:line (func) NCCL WARN. The host starts where
# a name can (not inside a run of name characters): tried at each character of a 64 KiB word, it
# read up to 253 characters each time (0.45 s a line).
_NCCL = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\] )?(?<![\w.-])(?P<host>[A-Za-z0-9][\w.-]{0,252}):(?P<pid>\d{1,10}):"
    r"\d{1,10} \[(?P<dev>\d{1,6})\] (?:\S+:\d+ (?:\([^)]*\) )?)?NCCL (?P<level>WARN|INFO) (?P<msg>.*)",
    re.ASCII,
)
# The message without its prefix (cut by a log shipper); empty groups so both read alike.
_BARE = re.compile(
    r"(?P<ts>)?(?P<host>)?(?P<pid>)?(?P<dev>)?(?:NCCL (?P<level>WARN|INFO) )?(?P<msg>(?:NET/IB|Call to ibv_poll_cq).*)",
    re.ASCII,
)
_ISO = re.compile(r"\s*(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?\s*(Z|[+-]\d\d:?\d\d)?", re.ASCII)
_RANK = re.compile(r"\[rank(\d{1,7})\]:", re.ASCII)
_NUM = r"(-?\d{1,20})"
# ``peer`` may be empty: ncclSocketToString() prints "" for an address it cannot name ("from peer  with").
_COMPLETION = re.compile(
    r"NET/IB\w*(?:/\w+)? ?: ?Got completion (?:from peer (?P<peer>\S*) )?with "
    rf"(?:error {_NUM}, opcode {_NUM}, len ?{_NUM}, vendor err {_NUM}"
    rf"|status={_NUM} opcode={_NUM} len={_NUM} vendor err {_NUM}"
    rf"|status=(?P<sname>\w+)\({_NUM}\) opcode=\w+\({_NUM}\)(?: reqSize=-?\d{{1,20}})? vendor_err={_NUM}"
    r"(?: req_type=(?P<rtype>[A-Za-z]+))?)"  # reqSize and req_type: 2.28.7-2.28.9 only
    r"(?: \((?P<dir>[A-Za-z]+)\))?",
    re.ASCII,
)
# include/ibvwrap.h: WARN("Call to ibv_poll_cq() returned %d", done), done < 0 (a C int).
_POLL_TEXT = "Call to ibv_poll_cq"
_POLL = re.compile(r"Call to ibv_poll_cq\(\) returned (-?)(\d{1,20})(?!\w)", re.ASCII)
POLL_CQ_FAILED = "ibv_poll_cq_failed"  # the status_name of a failed poll: no ibv_wc_status, since no completion
_HCA = re.compile(r" hca ([A-Za-z0-9][\w.-]{0,63})\s*$", re.ASCII)
_DEVPORT = r"(?:(?P<hca>[A-Za-z0-9][\w.-]{0,63}):(?P<port>\d{1,3}) )?"
# "on \w[^:]*", not "on \w+[^:]*": two runs that both take a word backtrack quadratically on a long one.
_ASYNC = re.compile(
    rf"NET/IB ?: {_DEVPORT}(?:Got async event : (?P<old>.+)|async fatal event(?: on \w[^:]*)?: (?P<fatal>.+)"
    r"|Got (?:async error|non-fatal async) event: (?P<minor>.+))",
    re.ASCII,
)
# Each device `` [0]mlx5_0:1/IB``, or NICs merged into one (2.20-2.22: `` [1]={[1] mlx5_1:1/IB, [2] ..}``).
_USING = re.compile(r"NET/IB ?: Using((?: \[\d+\](?:=\{[^}]*\}?|[\w.-]+:\d+[^ ]*))+)", re.ASCII)
_USING_DEV = re.compile(r"\[\d+\] ?([A-Za-z0-9][\w.-]{0,63}):(\d{1,3})", re.ASCII)
# What ``ibv_event_type_str`` calls the events NCCL treats as fatal (2.23's async thread:
# DEVICE_FATAL, CQ_ERR, QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR); the older layout names them only.
FATAL_EVENTS = frozenset({"local catastrophic error", "CQ error", "local work queue catastrophic error",
                          "invalid request local work queue error", "local access violation work queue error"})  # fmt: skip
# rdma-core's enum ibv_wc_status (libibverbs/verbs.h).
WC_STATUS = ("IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR", "IBV_WC_LOC_EEC_OP_ERR",
             "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_MW_BIND_ERR", "IBV_WC_BAD_RESP_ERR",
             "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR",
             "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR",
             "IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR", "IBV_WC_INV_EECN_ERR", "IBV_WC_INV_EEC_STATE_ERR",
             "IBV_WC_FATAL_ERR", "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR", "IBV_WC_TM_ERR",
             "IBV_WC_TM_RNDV_INCOMPLETE")  # fmt: skip
UNKNOWN_HCA = "unknown"  # a line that names no HCA, from a process that uses more than one


@dataclass
class IbStats:
    completion_errors: int = 0
    async_fatal: int = 0
    async_other: int = 0  # non-fatal async events: counted, not sent
    records: int = 0
    no_hca: int = 0  # errors whose HCA no line names: sent as device "unknown", port 0
    no_timestamp: int = 0
    unparsable: int = 0  # an NCCL IB error line that fits no layout, or two processes' lines run together
    bad_number: int = 0  # a number that is not one (past 2^32, Unicode digits)
    success: int = 0  # a completion "with status 0", a poll that returned no error: no error
    poll_cq_failures: int = 0  # "Call to ibv_poll_cq() returned -N": sent as completion errors
    echoes: int = 0  # a warning repeated without NCCL's prefix (PyTorch's "Last error:"): not counted again
    too_many: int = 0

    def summary(self) -> dict[str, int]:
        return {
            "ib_completion_errors": self.completion_errors,
            "ib_async_fatal_events": self.async_fatal,
            "ib_async_other_events": self.async_other,
            "ib_poll_cq_failures": self.poll_cq_failures,
            "ib_records": self.records,
            "ib_errors_without_hca": self.no_hca,
            "ib_lines_without_time": self.no_timestamp,
            "ib_echoed_warnings": self.echoes,
            "dropped.ib_unparsable_line": self.unparsable,
            "dropped.ib_bad_number": self.bad_number,
            "dropped.ib_success_status": self.success,
            "dropped.ib_too_many_records": self.too_many,
        }


def _u32(text: str | None) -> int | None:
    """A status, opcode, length or vendor error: ASCII digits within uint32 (NCCL prints the
    unsigned ones with %d before 2.26, so -1 is 4294967295)."""
    if text is None:
        return None
    neg = text.startswith("-")
    n = ascii_int(text[1:] if neg else text, 10)
    if n is None or n >= 1 << 32 or (neg and n > 1 << 31):
        return None
    return (1 << 32) - n if neg and n else n


def _label(text: str | None) -> str | None:
    if not text:
        return None
    text = text[:MAX_LABEL]
    return text if text.isprintable() else None


@dataclass
class _Agg:
    """One HCA's errors in one second."""

    ts: float
    labels: dict[str, str]
    peers: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # this second's errors; records() sums them


class IbLog:
    """NCCL IB lines fed one at a time; ``records()`` the NIC records they make.

    >>> log = IbLog(host=None, default_ts=1764403200.0)
    >>> log.feed("node023:10214:10303 [0] transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer "
    ...          "10.1.3.201<33057> with status=9 opcode=0 len=0 vendor err 138 (Send) hca mlx5_3")
    True
    >>> r, = log.records()
    >>> (r.host, r.device, r.port, r.counters, r.labels["peer"], r.labels["status_name"])
    ('node023', 'mlx5_3', 1, {'nccl_ib_completion_errors': 1}, '10.1.3.201<33057>', 'IBV_WC_REM_INV_REQ_ERR')
    """

    def __init__(self, *, host: str | None, default_ts: float, stats: IbStats | None = None,
                 fallback_host: str = "localhost") -> None:  # fmt: skip
        self.host, self.default_ts = host, default_ts
        self.fallback_host = fallback_host
        self.stats = stats if stats is not None else IbStats()
        self._using: dict[tuple[str, str], dict[str, int]] = {}  # (host, pid) -> HCA -> port
        self._ports: dict[tuple[str, str], int] = {}  # (host, HCA) -> port, from any process's "Using"
        self._hcas: set[tuple[str, str, int]] = set()  # (host, HCA, port) with errors
        self._aggs: dict[tuple[str, str, int, int], _Agg] = {}
        self._seen: dict[str, None] = {}  # messages of the warnings read with NCCL's prefix, oldest first

    def feed(self, line: str) -> bool:
        """Take one log line; True when it was an NCCL IB line this reads (an error, an event, a
        failed poll of a completion queue, the HCAs a process uses), whether it made a count or
        was dropped (counted).

        >>> log = IbLog(host=None, default_ts=0.0)
        >>> log.feed("n1:4000:4071 [0] include/ibvwrap.h:60 NCCL WARN Call to ibv_poll_cq() returned -2")
        True
        >>> (log.stats.poll_cq_failures, log.records()[0].labels["status_name"])
        (1, 'ibv_poll_cq_failed')
        """
        if "NET/IB" not in line and _POLL_TEXT not in line:
            return False
        m = _NCCL.search(line)
        if m is not None and _NCCL.search(line, m.start("msg")) is not None:
            # Two processes' output run together (ranks sharing one pipe or file, their writes
            # cutting each other's lines; NCCL starts each warning on a line of its own): the
            # first is cut, and where the second's host name begins is not known (the cut text's
            # last word runs into it). Either host would be a guess: counted, not read.
            self.stats.unparsable += 1
            return True
        if m is None:
            # A line whose NCCL prefix a log shipper cut: the message alone, on the log's host.
            m = _BARE.search(line)
            if m is None:
                return False
            # PyTorch's exception repeats NCCL's last warning after "Last error:" (NCCLUtils'
            # getNcclErrorDetailStr): the error already read, without the host it happened on.
            if m.group("msg").rstrip() in self._seen:
                self.stats.echoes += 1
                return True
        elif m.group("level") == "WARN" and len(m.group("msg")) < 1024:
            # The newest kept, the oldest let go: an echo follows its warning, so a full set that
            # took no more would miss every echo after MAX_SEEN distinct warnings.
            seen = m.group("msg").rstrip()
            self._seen.pop(seen, None)
            self._seen[seen] = None
            if len(self._seen) > MAX_SEEN:
                del self._seen[next(iter(self._seen))]
        msg, pid = m.group("msg"), m.group("pid") or ""
        host = self.host or m.group("host") or self.fallback_host
        if (u := _USING.search(msg)) is not None:
            devs = {d: int(p) for d, p in _USING_DEV.findall(u.group(1))[:MAX_PORTS]}
            if len(self._using) < MAX_PORTS * 1024:
                self._using[(host, pid)] = devs
            for d, p in devs.items():
                if len(self._ports) < MAX_PORTS * 1024:
                    self._ports[(host, d)] = p
            return True
        if m.group("level") == "INFO":
            return False
        if (c := _COMPLETION.search(msg)) is not None:
            return self._completion(line, m, c, host, pid)
        if (a := _ASYNC.search(msg)) is not None:
            return self._async(line, m, a, host, pid)
        if _POLL_TEXT in msg:
            return self._poll(line, m, _POLL.search(msg), host, pid)
        if "Got completion" in msg or "async" in msg:
            self.stats.unparsable += 1
            return True
        return False

    def _completion(self, line: str, m: re.Match, c: re.Match, host: str, pid: str) -> bool:
        g = c.groups()
        # The three layouts' (status, opcode, vendor err) groups; the first that matched.
        nums = next(((g[i], g[i + 1], g[i + 3]) for i in (1, 5) if g[i] is not None), (g[10], g[11], g[12]))
        status, opcode, vendor = (_u32(x) for x in nums)
        if status is None or opcode is None or vendor is None:
            self.stats.bad_number += 1
            return True
        if status == 0:
            self.stats.success += 1
            return True
        hm = _HCA.search(m.group("msg"))
        labels = {"status": str(status), "opcode": str(opcode), "vendor_err": str(vendor)}
        name = c.group("sname") or (WC_STATUS[status] if status < len(WC_STATUS) else None)
        if name and name.isascii():
            labels["status_name"] = name[:64]
        if (peer := _label(c.group("peer"))) is not None:
            labels["peer"] = peer
        if way := c.group("dir") or c.group("rtype"):
            labels["direction"] = way[:16]
        self.stats.completion_errors += 1
        self._count(line, m, host, pid, hm.group(1) if hm else None, None, "nccl_ib_completion_errors", labels)
        return True

    def _poll(self, line: str, m: re.Match, p: re.Match | None, host: str, pid: str) -> bool:
        if p is None:
            self.stats.unparsable += 1
            return True
        n = ascii_int(p.group(2), 20)
        if n is None or n > 1 << 31:  # NCCL prints a C int: past INT_MIN is not what it printed
            self.stats.bad_number += 1
            return True
        if not p.group(1) or n == 0:  # NCCL warns only below 0: a count of completions is a good poll
            self.stats.success += 1
            return True
        # A completion error for the rules: the CQ is the HCA's, and a poll fails when the HCA is in error.
        labels = {"status": f"-{n}", "status_name": POLL_CQ_FAILED}
        self.stats.poll_cq_failures += 1
        self._count(line, m, host, pid, None, None, "nccl_ib_completion_errors", labels)
        return True

    def _async(self, line: str, m: re.Match, a: re.Match, host: str, pid: str) -> bool:
        event = (a.group("old") or a.group("fatal") or a.group("minor") or "").strip()
        fatal = a.group("fatal") is not None or (a.group("old") is not None and event in FATAL_EVENTS)
        if not fatal:
            self.stats.async_other += 1
            return True
        port = ascii_int(a.group("port"), 3) if a.group("port") else None
        labels = {"event": _label(event) or "?"}
        self.stats.async_fatal += 1
        self._count(line, m, host, pid, a.group("hca"), port, "nccl_ib_async_fatal_events", labels)
        return True

    def _count(self, line: str, m: re.Match, host: str, pid: str, hca: str | None, port: int | None, counter: str,
               labels: dict[str, str]) -> None:  # fmt: skip
        if hca is None:
            using = self._using.get((host, pid), {})
            if len(using) == 1:
                ((hca, port),) = using.items()
            else:
                self.stats.no_hca += 1
                hca, port = UNKNOWN_HCA, 0
        if port is None:
            port = self._using.get((host, pid), {}).get(hca) or self._ports.get((host, hca), 1)
        ts = self._time(line, m)
        r = _RANK.search(line, 0, m.start())
        if r is not None:
            labels["rank"] = r.group(1)
        if m.group("dev"):
            labels["cuda_dev"] = m.group("dev")
        labels["source"] = "nccl_log"
        if (host, hca, port) not in self._hcas:
            if len(self._hcas) >= MAX_RECORDS:  # hosts and HCAs come from the log: bounded as records are
                self.stats.too_many += 1
                return
            self._hcas.add((host, hca, port))
        key = (host, hca, port, int(ts))
        agg = self._aggs.get(key)
        if agg is None:
            if len(self._aggs) >= MAX_RECORDS:
                self.stats.too_many += 1
                return
            agg = self._aggs[key] = _Agg(ts=ts, labels=labels)
        else:
            for k, v in labels.items():
                agg.labels.setdefault(k, v)
        if "peer" in labels and labels["peer"] not in agg.peers and len(agg.peers) < 8:
            agg.peers.append(labels["peer"])
        agg.counters[counter] = agg.counters.get(counter, 0) + 1

    def _time(self, line: str, m: re.Match) -> float:
        """A log shipper's ISO time at the line's start when it names its zone (an absolute
        time), else NCCL's own (2.23+; the node's local time, which names none: read in this
        host's zone, wrong by hours when the node's differs, NVIDIA/nccl#1905 shows both apart),
        else the shipper's without a zone, else the log's default; a time no record can carry
        (a clock never set, year 1970) is none."""
        iso = _ISO.match(line)
        if iso is not None and iso.group(8) is not None and (t := _iso_time(iso)) is not None:
            return t
        if m.group("ts"):
            try:
                t = _in_range(time.mktime(time.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S")))
            except (ValueError, OverflowError):
                t = None
            if t is not None:
                return t
        if iso is not None and (t := _iso_time(iso)) is not None:
            return t
        self.stats.no_timestamp += 1
        return self.default_ts

    def records(self) -> list[NicRecord]:
        """One record per (host, HCA, port, second) with errors, in time order, its counters the
        HCA's errors up to the end of that second: summed in time order, not the log's, since
        processes' lines (flushed out of order) can go back in time, and a counter must not."""
        out = []
        running: dict[tuple[str, str, int], dict[str, int]] = {}
        for (host, hca, port, _), agg in sorted(self._aggs.items(), key=lambda kv: kv[0][3]):
            totals = running.setdefault((host, hca, port), {})
            for k, n in agg.counters.items():
                totals[k] = totals.get(k, 0) + n
            labels = dict(agg.labels)
            if len(agg.peers) > 1:
                labels["peers"] = ",".join(agg.peers)[:512]
            out.append(NicRecord(ts=agg.ts, host=host or self.fallback_host, device=hca, port=port,
                                 counters=dict(sorted(totals.items())), labels=labels))  # fmt: skip
        out.sort(key=lambda r: (r.ts, r.host, r.device, r.port))
        self.stats.records += len(out)
        return out


def _in_range(t: float) -> float | None:
    """``t`` when a record can carry it (the decoder's range), else None: a node whose clock was
    never set prints 1970, and a record of that time would be dead-lettered downstream."""
    return t if TS_MIN <= t <= TS_MAX else None


def _iso_time(iso: re.Match) -> float | None:
    """Epoch seconds of an ``_ISO`` match (local time when it names no zone), or None (also
    for a time no record can carry)."""
    y, mo, d, hh, mm, ss, frac, tz = iso.groups()
    try:
        tm = time.strptime(f"{y}-{mo}-{d} {hh}:{mm}:{ss}", "%Y-%m-%d %H:%M:%S")
        frac_s = float(frac) if frac else 0.0
        if tz is None:
            return _in_range(time.mktime(tm) + frac_s)
        off = 0 if tz == "Z" else (1 if tz[0] == "+" else -1) * (int(tz[1:3]) * 3600 + int(tz[-2:]) * 60)
        return _in_range(calendar.timegm(tm) - off + frac_s)
    except (ValueError, OverflowError):
        return None


__all__ = ["FATAL_EVENTS", "POLL_CQ_FAILED", "UNKNOWN_HCA", "WC_STATUS", "IbLog", "IbStats"]
