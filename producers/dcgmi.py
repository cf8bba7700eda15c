"""``dcgmi dmon`` -> ``DcgmRecord``s, for hosts that run DCGM but no exporter.

``dcgmi dmon -e <ids> -d <ms>`` prints two header lines (``#Entity`` + short names, ``ID`` +
units), repeated every 14 rounds, then one row per entity per round (``GPU 0``, ``GPU-I 1``,
``GPU 0 LINK 3``...). Column widths differ between DCGM versions, so rows are split on
whitespace and matched to the latest header; ``N/A`` is "no value". Short names map to fields
through ``FIELDS.by_dmon``. One unsupported field makes the whole command exit 250, so each
field is probed alone first (``dcgmi dmon -e ID -c 1``) and only the supported ones are streamed.

The command runs as an argv list (no shell), read by a thread so a silent ``dcgmi`` never blocks
the poll loop; if it exits it is restarted with back-off.
"""

from __future__ import annotations

import logging
import queue
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

from pipeline.catalog import FIELDS, Field
from pipeline.schema import DcgmFields, DcgmRecord
from producers.dcgm_exporter import is_blank

log = logging.getLogger(__name__)

# What our rules read, that dmon can report (GPU entities).
DEFAULT_FIELD_IDS = (100, 112, 140, 150, 155, 156, 202, 203, 230, 240, 241, 310, 311, 313, 395, 396,
                     409, 419, 429, 439, 449)
UNSUPPORTED_EXIT = 250


@dataclass
class DmonStats:
    rows: int = 0
    records: int = 0
    na: int = 0
    blank: int = 0
    skipped_rows: int = 0       # rows that match no header, or entities we do not map (GPU-I...)
    unknown_columns: int = 0
    restarts: int = 0


def _entity(tokens: list[str]) -> tuple[int, int | None, int] | None:
    """(gpu, link, tokens used) for ``GPU 0`` / ``GPU 0 LINK 3``; None for other entities."""
    if len(tokens) >= 2 and tokens[0] == "GPU" and tokens[1].isdigit():
        if len(tokens) >= 4 and tokens[2] == "LINK" and tokens[3].isdigit():
            return int(tokens[1]), int(tokens[3]), 4
        return int(tokens[1]), None, 2
    return None


class DmonParser:
    """Feeds on ``dcgmi dmon`` lines; a round's rows share one timestamp (taken when it starts)."""

    def __init__(self, host: str, clock=time.time) -> None:
        self.host = host
        self.clock = clock
        self.columns: list[Field | None] | None = None
        self.stats = DmonStats()
        self._round: set[tuple[int, int | None]] = set()
        self._round_ts = 0.0

    def feed(self, line: str) -> DcgmRecord | None:
        tokens = line.split()
        if not tokens:
            return None
        if tokens[0] == "#Entity":
            cols = [FIELDS.by_dmon(t) for t in tokens[1:]]
            unknown = [t for t, c in zip(tokens[1:], cols) if c is None]
            if unknown and self.columns is None:
                log.warning("dcgmi dmon columns not in the catalog (ignored): %s", ", ".join(unknown))
            self.stats.unknown_columns += len(unknown)
            self.columns = cols
            return None
        if tokens[0] in ("ID", "#") or tokens[0].startswith("#"):
            return None
        self.stats.rows += 1
        ent = _entity(tokens)
        if ent is None or self.columns is None:
            self.stats.skipped_rows += 1
            return None
        gpu, link, used = ent
        vals = tokens[used:]
        if len(vals) != len(self.columns):
            self.stats.skipped_rows += 1
            log.debug("dmon row with %d values for %d columns: %r", len(vals), len(self.columns), line)
            return None
        key = (gpu, link)
        if key in self._round or not self._round:
            self._round = set()
            self._round_ts = self.clock()
        self._round.add(key)
        named: dict[str, float] = {}
        for f, v in zip(self.columns, vals):
            if f is None:
                continue
            if v == "N/A":
                self.stats.na += 1
                continue
            try:
                x = float(v)
            except ValueError:
                self.stats.na += 1
                continue
            if is_blank(f, x):
                self.stats.blank += 1
                continue
            named[f.names[0]] = x
        self.stats.records += 1
        return DcgmRecord(ts=self._round_ts, host=self.host, gpu=gpu, link=link, fields=DcgmFields(**named))

    def parse(self, lines: Iterable[str]) -> Iterator[DcgmRecord]:
        for line in lines:
            rec = self.feed(line)
            if rec is not None:
                yield rec


def supported_fields(ids: Iterable[int], dcgmi: str = "dcgmi", timeout_s: float = 20.0) -> list[int]:
    """The ids that ``dcgmi dmon`` accepts on this host, probed one at a time."""
    ok = []
    for fid in ids:
        try:
            proc = subprocess.run([dcgmi, "dmon", "-e", str(fid), "-c", "1"], capture_output=True,
                                  timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("dcgmi probe of field %d failed: %s", fid, e)
            continue
        if proc.returncode == 0:
            ok.append(fid)
        else:
            f = FIELDS.by_id(fid)
            log.warning("field %d (%s) not supported here (dcgmi exit %d); left out", fid,
                        f.alias if f else "?", proc.returncode)
    return ok


class DmonSource:
    """Runs ``dcgmi dmon`` in the background and hands out the rows read since the last poll."""

    def __init__(self, field_ids: Iterable[int] = DEFAULT_FIELD_IDS, *, interval_s: float = 1.0,
                 host: str | None = None, dcgmi: str = "dcgmi", probe: bool = True,
                 restart_backoff_s: float = 1.0) -> None:
        self.host = host or socket.gethostname()
        self.dcgmi = dcgmi
        ids = list(field_ids)
        self.field_ids = supported_fields(ids, dcgmi) if probe else ids
        if not self.field_ids:
            raise RuntimeError(f"dcgmi dmon supports none of the fields {ids} on this host")
        self.argv = [dcgmi, "dmon", "-e", ",".join(map(str, self.field_ids)), "-d", str(int(interval_s * 1000))]
        self.parser = DmonParser(self.host)
        self.done = False
        self._q: queue.Queue[DcgmRecord] = queue.Queue(maxsize=100_000)
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._backoff = restart_backoff_s
        self._thread = threading.Thread(target=self._reader, name="dcgmi-dmon", daemon=True)
        self._thread.start()

    def _reader(self) -> None:
        delay = self._backoff
        while not self._stop.is_set():
            try:
                self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, bufsize=1)
            except OSError as e:
                log.error("cannot run %s: %s", self.argv[0], e)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
                continue
            assert self._proc.stdout is not None
            got = False
            for line in self._proc.stdout:
                rec = self.parser.feed(line)
                if rec is not None:
                    got = True
                    try:
                        self._q.put_nowait(rec)
                    except queue.Full:
                        pass  # the sender's own bound is the one that counts; this only caps memory
            rc = self._proc.wait()
            if self._stop.is_set():
                break
            err = self._proc.stderr.read().strip() if self._proc.stderr else ""
            self.parser.stats.restarts += 1
            log.warning("dcgmi dmon exited %d%s; restarting in %.1fs", rc, f" ({err[:200]})" if err else "",
                        delay)
            if got:
                delay = self._backoff
            self._stop.wait(delay)
            delay = min(delay * 2, 30.0)

    def poll(self) -> list[DcgmRecord]:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._stop.set()
        p = self._proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        self._thread.join(timeout=5)
