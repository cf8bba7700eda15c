"""``dcgmi dmon`` -> ``DcgmRecord``s, for hosts that run DCGM but no exporter.

``dcgmi dmon -e <ids> -d <ms>`` prints two header lines (``#Entity`` + short names, ``ID`` +
units since DCGM 2.4; ``# Entity``, ``Id``, right-aligned, before), repeated after round 15 and
then every 14 rounds, then one row per entity per round (``GPU 0``, ``GPU-I 9``, ``GPU-CI 9``,
``Switch 0``...; an NVLink is ``GPU 0 LINK 3`` since DCGM 4.6, ``LINK 769``, the packed
``dcgm_link_t`` id, in 3.0 - 4.5: counted, not read, see ``_entity``). Column widths differ between DCGM versions, so rows are split
on whitespace and matched to the latest header (or, when a row has fewer values, read as
``DmonParser`` says); ``N/A`` is "no value". A capture stopped with Ctrl-C ends with ``dmon was
stopped due to receiving a signal``. Short names map to fields through ``FIELDS.by_dmon``.
One unsupported field makes the whole command exit 250, so each
field is probed alone first (``dcgmi dmon -e ID -c 1``) and only the supported ones are streamed.

The command runs as an argv list (no shell), read by a thread so a silent ``dcgmi`` never blocks
the poll loop; if it exits it is restarted with back-off.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import queue
import socket
import subprocess
import threading
import time
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, TextIO

from pipeline.catalog import FIELDS, Field
from pipeline.schema import DcgmFields, DcgmRecord
from producers.dcgm_exporter import is_blank
from producers.textinput import (
    CUT_LAST_LINE,
    GzipDamage,
    damage_counts,
    gzip_damage,
    open_text,
    warn_cut_line,
    warn_damage,
)

log = logging.getLogger(__name__)

# What our rules read, that dmon can report (GPU entities).
DEFAULT_FIELD_IDS = (
    100,
    112,
    140,
    150,
    155,
    156,
    202,
    203,
    230,
    240,
    241,
    310,
    311,
    313,
    395,
    396,
    409,
    419,
    429,
    439,
    449,
)
UNSUPPORTED_EXIT = 250
# A dmon line of 128 fields is a few KB; a longer one is no row (skipped whole, counted), so a
# saved log's one huge line (a gzip bomb's) costs this much memory, not its length.
LINE_MAX = 64 * 1024
_NULS = "\x00" * LINE_MAX


@dataclass
class DmonStats:
    rows: int = 0
    records: int = 0
    na: int = 0
    blank: int = 0
    skipped_rows: int = 0  # rows before any header, or whose cells fit neither the header's count nor its positions
    packed_rows: int = 0  # short rows of a pre-4.0 layout: values packed left, so their columns are unknown
    unknown_columns: int = 0
    restarts: int = 0
    bad_values: int = 0  # a cell with digits that is no plain ASCII number ("٣", "1_0", 400 digits)
    queue_full: int = 0  # records the reader thread could not hand over (the poll loop fell behind)
    bad_headers: int = 0  # heading lines no dmon prints (over 128 columns, "#Entity" mid-line): rows wait for the next
    cut_last_line: int = 0  # a saved log's last line without its newline ("81" of 81234): not read
    skipped_entities: dict[str, int] = field(default_factory=dict)  # entity type -> rows (Switch, CPU...)

    def counts(self) -> dict[str, int]:
        """What the exit summary and /metrics show: rows read, records made, drops by reason."""
        out = {
            "rows": self.rows,
            "records": self.records,
            "dropped.na_value": self.na,
            "dropped.blank_sentinel": self.blank,
            "dropped.unparsable_row": self.skipped_rows,
            "dropped.packed_row": self.packed_rows,
            "dropped.unknown_column": self.unknown_columns,
            "dropped.bad_value": self.bad_values,
            "dropped.queue_full": self.queue_full,
            "dropped.bad_header": self.bad_headers,
            CUT_LAST_LINE: self.cut_last_line,
            "restarts": self.restarts,
        }
        for ent, n in sorted(self.skipped_entities.items()):
            out[f"dropped.skipped_entity.{ent}"] = n
        return out


# Entity cells as DeviceMonitor.cpp prints them: "GPU 0", "GPU 0 LINK 3", "SW 1 LINK 3", "GPU-I 9",
# "GPU-CI 9", "Switch 0", "CPU 0", "CPU Core 5", "vGPU 1", "CX 0", "LINK 769" (DCGM 3.0 - 4.5: the raw
# dcgm_link_t), "UNKNOWN 0" (DCGM_FE_NONE, 2.4 - 4.5), a bare "0" (DCGM_FE_NONE, 2.1 - 2.3). Longest names first.
# Ids are ASCII digits of bounded length: "\d" would read "٣" as GPU 3, and int() of 5,000 digits raises;
# 10 digits hold a raw link id (up to 2**32 - 1).
_ENTITY = re.compile(
    r"^\s*(GPU-CI|GPU-I|GPU|SW|Switch|NvSwitch|CPU Core|CPU|vGPU|CX|LINK|UNKNOWN)\s+([0-9]{1,10})"
    r"(?:\s+LINK\s+([0-9]{1,9}))?(?=\s|$)",
    re.ASCII,
)
# A non-GPU entity whose id runs into its first value: before 4.5 the entity cell is printed 10 (11 from 4.0)
# wide with no padding after it (PrintMetricsRow, DeviceMonitor.cpp @ v3.3.9 and v4.4.2), so "LINK 65537"
# (3.x: GPU 1, port 0) or "CPU Core 10" touches the value after it. Such a row is only counted, so its
# type is enough; a GPU row cannot run over ("GPU 31" is 6 wide).
_RUN_ON_ENTITY = re.compile(
    r"^\s*(GPU-CI|GPU-I|SW|Switch|NvSwitch|CPU Core|CPU|vGPU|CX|LINK|UNKNOWN)\s+[0-9]", re.ASCII
)
# The DCGM_FE_NONE row of DCGM 2.1 - 2.3: HelperGetGroupIdPrefix (DeviceMonitor.cpp @ v2.1.4, v2.3.4)
# names that group "", so the row starts with its bare id.
_BARE_ID = re.compile(r"^\s*[0-9]{1,10}(?=\s|$)", re.ASCII)
# A heading dmon prints: a line holding one anywhere else (NUL padding is stripped first) is a damaged one.
_HEADING = re.compile(r"#\s?entity", re.IGNORECASE)
_TOKEN = re.compile(r"\S+")
# A field group holds at most DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP (128, dcgm_structs.h in 2.1 - 4.6) fields,
# so no dmon heading has more columns; the bound also caps each row's cost at the header's size.
MAX_COLUMNS = 128
# The ctrl-C trailer ("." at the end before DCGM 2.4; 2.4 - 3.3 spell it "do to", DeviceMonitor.cpp).
_STOPPED = frozenset({"dmon was stopped due to receiving a signal", "dmon was stopped do to receiving a signal"})
# A value as dmon prints it: a plain decimal number (float() would also take "٣", "1_0" or "inf").
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?", re.ASCII)
MAX_CELL = 40
# The DCGM_FS_GLOBAL fields (dcgm_fields.cpp, the same nine in 2.1 - 3.1): before 3.2
# GetLatestSample (DcgmCacheManager.cpp) files their values under DCGM_FE_NONE, so dmon prints them
# on their own row (``UNKNOWN n``; a bare ``n`` in 2.1 - 2.3) and leaves them out of the GPU row.
_GLOBAL_COLUMNS = frozenset({"DRVER", "NVVER", "PRNAM", "CDVER", "DVCNT", "SYBST", "STVCI", "STNVL", "SYSAF"})
# "#Entity" is padded to 10 before DCGM 4.0 (11 in 4.0 - 4.4, 16 since 4.5): the first column's offset
# tells a layout that packs a row's values from one that prints empty cells.
_PACKING_ENTITY_WIDTH = 10


def _entity(line: str) -> tuple[str, int, int | None, int] | None:
    """(entity type, id, link, end offset of the entity cell) of a dmon row, or None.

    A ``LINK <raw>`` row (DCGM 3.0 - 4.5) stays a ``LINK`` entity, counted and not read: the raw
    ``dcgm_link_t`` names its GPU differently in each release (dcgm_structs.h: bits 16-31 in 3.x,
    bits 24-31 from 4.3.1, not at all in 4.0 - 4.3.0, whose 32 bits hold only the group and the
    port), and a row does not say which release printed it. The GPU rows' NVLink totals are read.
    """
    m = _ENTITY.match(line)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None, m.end()


def _is_header(tokens: list[str]) -> int:
    """Number of tokens the entity heading takes: ``#Entity`` (DCGM 2.4+) is one, ``# Entity``
    (DCGM 2.1 - 2.3, and the DCGM User Guide's examples) two; 0 when this is no header."""
    if tokens and tokens[0].lower() == "#entity":
        return 1
    if len(tokens) >= 2 and tokens[0] == "#" and tokens[1].lower() == "entity":
        return 2
    return 0


class DmonParser:
    """Feeds on ``dcgmi dmon`` lines; a round's rows share one timestamp (taken when it starts).

    Values are split on whitespace when a row has one per column. A row with fewer is read by
    layout: DCGM 4.0+ prints an empty cell for a field the entity has no value of (e.g. GPU fields
    on a LINK row), so the row is cut at the header's column offsets, since DeviceMonitor.cpp
    left-aligns each value under its column name; before 4.0 a row prints only the values it got,
    packed to the left, so it is read only when the header's global columns are exactly what it
    lacks (``_GLOBAL_COLUMNS``), and otherwise dropped as ``packed_row``, since any reading would
    guess. A row whose values start at the header's column offsets (2.4+ print them so) is cut
    there first, so a string value's spaces (``DVNAM`` is ``NVIDIA H100 80GB HBM3``) stay in its
    cell instead of shifting the values after it.

    >>> p = DmonParser("h", clock=lambda: 0.0)
    >>> p.feed("#Entity        DVNAM                       TMPTR")
    >>> p.feed("GPU 0          NVIDIA H100 80GB HBM3       45").fields.DCGM_FI_DEV_GPU_TEMP
    45.0
    """

    def __init__(self, host: str, clock=time.time) -> None:
        self.host = host
        self.clock = clock
        self.columns: list[Field | None] | None = None
        self.offsets: list[int] = []
        self.packs = False  # the header is of a layout that packs a row's values to the left (before 4.0)
        self.right_aligned = False  # "# Entity" (2.1 - 2.3): cells end, not start, under their names
        self.local: list[int] = []  # the columns a packed GPU row holds: all but the global ones
        self.stats = DmonStats()
        self._round: set[tuple[str, int, int | None]] = set()
        self._round_ts = 0.0

    def _bad_header(self) -> None:
        # Rows until the next heading are dropped, not read against an earlier heading whose
        # fields may differ.
        self.stats.bad_headers += 1
        self.columns = None
        self.offsets = []

    def _header(self, line: str, skip: int) -> None:
        # At most one token past the bound is looked at, so a 1 MB heading costs no more than a small one.
        spans = [(m.start(), m.group(0)) for m in itertools.islice(_TOKEN.finditer(line), skip + MAX_COLUMNS + 1)]
        spans = spans[skip:]
        if len(spans) > MAX_COLUMNS:
            log.debug("dmon heading with over %d columns (no field group holds more): %.200r", MAX_COLUMNS, line)
            self._bad_header()
            return
        names = [t for _, t in spans]
        cols = [FIELDS.by_dmon(t) for t in names]
        unknown = [t for t, c in zip(names, cols) if c is None]
        if unknown and self.columns is None:
            log.warning("dcgmi dmon columns not in the catalog (ignored): %s", ", ".join(unknown))
        self.stats.unknown_columns += len(unknown)
        self.columns = cols
        self.offsets = [o for o, _ in spans]
        # "# Entity" is printed by 2.1 - 2.3 only, which pack like every release before 4.0.
        self.packs = skip == 2 or (bool(spans) and spans[0][0] <= _PACKING_ENTITY_WIDTH)
        self.right_aligned = skip == 2
        self.local = [i for i, t in enumerate(names) if t not in _GLOBAL_COLUMNS]

    def _values(self, line: str, end: int) -> list[str] | None:
        assert self.columns is not None
        vals = line[end:].split()
        n = len(self.columns)
        cut, aligned = self._cut(line, end) if self.offsets and not self.right_aligned else (None, False)
        if cut is not None and aligned:
            # As dmon prints it: a string value's spaces ("NVIDIA H100 80GB HBM3") stay in its cell,
            # where splitting on whitespace would shift every value after it.
            if not self.packs:
                return cut
            k = next((i for i, c in enumerate(cut) if not c), n)
            if k == n:
                return cut
            if any(cut[k:]):
                return None  # a packing layout leaves no empty cell between two values
            vals = cut[:k]  # a packed row's values in order, read as one below
        elif len(vals) == n:
            return vals  # one value a column, not under the names (a log whose spacing was collapsed)
        elif cut is not None and not self.packs and len(vals) < n:
            # Values under their columns, not at their starts: one token a cell, or it does not fit.
            return cut if sum(1 for c in cut if c) == len(vals) else None
        if self.packs and len(vals) < n and len(vals) == len(self.local):
            cells = [""] * n
            for i, v in zip(self.local, vals):
                cells[i] = v
            return cells
        return None

    def _cut(self, line: str, end: int) -> tuple[list[str] | None, bool]:
        """The row's cells cut at the header's column offsets, a cell's tokens joined by one space,
        and whether each cell's value starts at its column's offset; None when a token starts
        before the first column or runs into the next one (the row does not fit this header).

        DeviceMonitor.cpp (2.4 - 4.6) left-aligns each value under its column's name and cuts it to
        the column's width with two spaces after it (FixedSizeString), so a value starts at its
        column's offset and never crosses into the next cell.
        """
        offsets = self.offsets
        n = len(offsets)
        cells: list[list[str]] = [[] for _ in range(n)]
        aligned = True
        for m in _TOKEN.finditer(line, end):
            col = bisect.bisect_right(offsets, m.start()) - 1
            if col < 0 or (col + 1 < n and m.end() > offsets[col + 1]):
                return None, False
            if not cells[col] and m.start() != offsets[col]:
                aligned = False
            cells[col].append(m.group())
        return [" ".join(c) for c in cells], aligned

    def feed(self, line: str) -> DcgmRecord | None:
        # Leading NULs are the hole a crash leaves in a log that dmon then appends to: what follows is
        # whole, and a heading after them must not be missed (rows would be read against the old one).
        line = line.rstrip("\r\n").lstrip("\x00")
        tokens = line.split()
        if not tokens:
            return None
        skip = _is_header(tokens)
        if skip:
            self._header(line, skip)
            return None
        if _HEADING.search(line):
            log.debug("dmon heading that does not start its line: %.200r", line)
            self._bad_header()
            return None
        if tokens[0] in ("ID", "Id", "id") or tokens[0].startswith("#"):
            return None  # the units row ("ID" since DCGM 2.4, "Id" before), comments
        if line.strip().rstrip(".") in _STOPPED:
            return None  # the end of a capture stopped with ctrl-C, not a row
        self.stats.rows += 1
        ent = _entity(line)
        if ent is None or self.columns is None:
            unread = self._unread_entity(line) if self.columns is not None else None
            if unread is not None:
                self.stats.skipped_entities[unread] = self.stats.skipped_entities.get(unread, 0) + 1
            else:
                self.stats.skipped_rows += 1
            return None
        etype, eid, link, end = ent
        if etype != "GPU":
            # Switch, CPU, vGPU, CX rows and NVSwitch links are not GPU telemetry; GPU-I/GPU-CI
            # rows are MIG instances (docs/architecture.md, MIG).
            what = f"{etype} LINK" if link is not None else etype
            self.stats.skipped_entities[what] = self.stats.skipped_entities.get(what, 0) + 1
            return None
        vals = self._values(line, end)
        if vals is None:
            if self.packs and len(line[end:].split()) < len(self.columns):
                self.stats.packed_rows += 1
                log.debug("dmon row with values left out, packed left (%d columns): %r", len(self.columns), line)
            else:
                self.stats.skipped_rows += 1
                log.debug("dmon row that fits no header (%d columns): %r", len(self.columns), line)
            return None
        key = (etype, eid, link)
        if key in self._round or not self._round:
            self._round = set()
            self._round_ts = self.clock()
        self._round.add(key)
        named = self._named(vals)
        self.stats.records += 1
        return DcgmRecord(ts=self._round_ts, host=self.host, gpu=eid, link=link, fields=DcgmFields(**named))

    def _unread_entity(self, line: str) -> str | None:
        """The type of a non-GPU row ``_entity`` cannot take apart (its id runs into its first value,
        or it is 2.1 - 2.3's bare-id global row), or None."""
        m = _RUN_ON_ENTITY.match(line)
        if m is not None:
            return m.group(1)
        if self.right_aligned and _BARE_ID.match(line):
            return "UNKNOWN"
        return None

    def _named(self, vals: list[str]) -> dict[str, float]:
        assert self.columns is not None
        named: dict[str, float] = {}
        for f, v in zip(self.columns, vals):
            if f is None or v == "":
                continue
            if v == "N/A":
                self.stats.na += 1
                continue
            if len(v) > MAX_CELL or not _NUMBER.fullmatch(v):
                # A word ("N/S", "ERR!") is a placeholder like N/A; digits that are no plain number
                # ("٣", "1_0", 400 digits) are a damaged cell.
                if any(c.isdigit() for c in v):
                    self.stats.bad_values += 1
                else:
                    self.stats.na += 1
                continue
            x = float(v)
            if is_blank(f, x):
                self.stats.blank += 1
                continue
            named[f.names[0]] = x
        return named

    def parse(self, lines: Iterable[str]) -> Iterator[DcgmRecord]:
        for line in lines:
            rec = self.feed(line)
            if rec is not None:
                yield rec


class DmonFileSource:
    """A saved ``dcgmi dmon`` log (``--file``), read in one poll. dmon prints no timestamps: round
    k is stamped ``mtime - (rounds - 1 - k) * interval_s``, so the last round is when the file was
    last written and rounds are ``interval_s`` apart (give the ``-d`` it was taken with)."""

    def __init__(self, path: str, *, interval_s: float = 1.0, host: str | None = None) -> None:
        self.path = path
        self.interval_s = interval_s
        self.parser = DmonParser(host or socket.gethostname())
        self.done = False
        self.damage: GzipDamage | None = None  # what ended a gzip input early (lost input, exit 3)

    @property
    def stats(self) -> DmonStats:
        return self.parser.stats

    def poll(self) -> list[DcgmRecord]:
        import os

        self.done = True
        rounds = iter(range(1 << 62))
        self.parser.clock = lambda: float(next(rounds))
        with open_text(self.path) as fh:
            recs = list(self.parser.parse(self._whole_lines(self._bounded_lines(fh))))
            self.damage = gzip_damage(fh)
        warn_damage(self.path, self.damage)
        if not recs:
            log.warning("%s: no dcgmi dmon GPU rows (%d rows read)", self.path, self.parser.stats.rows)
            return []
        last = max(r.ts for r in recs)
        end = os.stat(self.path).st_mtime
        for r in recs:
            r.ts = end - (last - r.ts) * self.interval_s
        return recs

    def _bounded_lines(self, fh: TextIO) -> Iterator[str]:
        """``fh``'s lines, each read a bounded piece at a time: NULs before a long line (the hole a
        crash leaves, which ``DmonParser.feed`` drops) are dropped as they come, and a line still
        longer than ``LINE_MAX`` is skipped to its end (an unparsable row)."""
        held = ""  # a long line's start, without its leading NULs
        while True:
            piece = fh.readline(LINE_MAX)
            if not held and (len(piece) < LINE_MAX or piece.endswith("\n")):
                if not piece:
                    return
                yield piece  # a line of a usual length, or the last one
                continue
            if not piece:
                yield held  # the last line, without its newline
                return
            # A comparison with NULs runs at memory speed; lstrip tests each character.
            held = "" if not held and piece == _NULS[: len(piece)] else (held + piece).lstrip("\x00")
            if held.endswith("\n"):
                yield held
                held = ""
            elif len(held) >= LINE_MAX:
                self.parser.stats.rows += 1
                self.parser.stats.skipped_rows += 1
                log.debug("dmon line longer than %d characters, skipped: %.200r", LINE_MAX, held)
                while piece and not piece.endswith("\n"):  # the rest of it, a bounded piece at a time
                    piece = fh.readline(LINE_MAX)
                held = ""

    def _whole_lines(self, lines: Iterable[str]) -> Iterator[str]:
        """``lines`` but a last one without its newline: dmon ends every line with one, so such a
        line is a log still being written or cut, and its last cell may be a part of a value. A
        blank one, or the ctrl-C trailer, holds no value and is read."""
        for line in lines:
            if not line.endswith("\n") and line.strip() and line.strip().rstrip(".") not in _STOPPED:
                self.parser.stats.cut_last_line += 1
                warn_cut_line(self.path, line)
                return
            yield line

    def summary(self) -> dict[str, int]:
        return self.parser.stats.counts() | damage_counts(self.damage)

    def close(self) -> None:
        pass


def supported_fields(ids: Iterable[int], dcgmi: str = "dcgmi", timeout_s: float = 20.0) -> list[int]:
    """The ids that ``dcgmi dmon`` accepts on this host, probed one at a time."""
    ok = []
    for fid in ids:
        try:
            proc = subprocess.run(
                [dcgmi, "dmon", "-e", str(fid), "-c", "1"], capture_output=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("dcgmi probe of field %d failed: %s", fid, e)
            continue
        if proc.returncode == 0:
            ok.append(fid)
        else:
            f = FIELDS.by_id(fid)
            log.warning(
                "field %d (%s) not supported here (dcgmi exit %d); left out",
                fid,
                f.alias if f else "?",
                proc.returncode,
            )
    return ok


class DmonSource:
    """Runs ``dcgmi dmon`` in the background and hands out the rows read since the last poll."""

    def __init__(
        self,
        field_ids: Iterable[int] = DEFAULT_FIELD_IDS,
        *,
        interval_s: float = 1.0,
        host: str | None = None,
        dcgmi: str = "dcgmi",
        probe: bool = True,
        restart_backoff_s: float = 1.0,
        max_queued: int = 100_000,
    ) -> None:
        self.host = host or socket.gethostname()
        self.dcgmi = dcgmi
        ids = list(field_ids)
        self.field_ids = supported_fields(ids, dcgmi) if probe else ids
        if not self.field_ids:
            raise RuntimeError(f"dcgmi dmon supports none of the fields {ids} on this host")
        self.argv = [dcgmi, "dmon", "-e", ",".join(map(str, self.field_ids)), "-d", str(int(interval_s * 1000))]
        self.parser = DmonParser(self.host)
        self.done = False
        self._q: queue.Queue[DcgmRecord] = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._backoff = restart_backoff_s
        self._thread = threading.Thread(target=self._reader, name="dcgmi-dmon", daemon=True)
        self._thread.start()

    def _reader(self) -> None:
        delay = self._backoff
        while not self._stop.is_set():
            try:
                self._proc = subprocess.Popen(
                    self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
                )
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
                        # Only when the poll loop is stuck: the bound caps memory; the loss is counted.
                        self.parser.stats.queue_full += 1
            rc = self._proc.wait()
            if self._stop.is_set():
                break
            err = self._proc.stderr.read().strip() if self._proc.stderr else ""
            self.parser.stats.restarts += 1
            log.warning("dcgmi dmon exited %d%s; restarting in %.1fs", rc, f" ({err[:200]})" if err else "", delay)
            if got:
                delay = self._backoff
            self._stop.wait(delay)
            delay = min(delay * 2, 30.0)

    def summary(self) -> dict[str, int]:
        return self.parser.stats.counts()

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
