"""dcgm-exporter's ``/metrics`` (Prometheus text format) -> ``DcgmRecord``s.

Parsed with ``prometheus_client.parser`` (the maintained parser), one record per GPU and one
per NVLink (``nvlink`` label). What real exporters vary on, and how it is handled:

- host label ``Hostname`` (released) or ``hostname`` (master, per-link metrics); UUID label
  ``UUID``, ``uuid`` (``--use-old-namespace``) or ``gpu_uuid``; model ``modelName`` or
  ``model_name``; ``pci_bus_id`` may be missing. Every other non-empty label (Kubernetes
  ``pod``/``namespace``/``container``, HPC ``hpc_job``, label-type fields such as the driver
  version) is carried in the record's ``labels``.
- both DCGM spellings (pre-4.6 and 4.6) resolve through the catalog; old-namespace metric
  names (``dcgm_sm_clock``) are tried as ``DCGM_FI_DEV_*``.
- DCGM blank sentinels (``pipeline.catalog`` thresholds) and non-finite values are dropped.
- ``DCGM_FI_DEV_XID_ERRORS`` is the most recent XID (a sticky gauge), passed through as such.

A scrape that fails, times out, comes back empty, or lacks GPUs an earlier scrape had sends
nothing for what is missing -- so the engine's absence checks (``telemetry_gap`` for a silent
host, ``gpu_lost`` for a GPU missing while its host reports) fire -- and logs and counts it.
"""

from __future__ import annotations

import logging
import math
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pipeline.catalog import BLANK_INT32, COUNTER, FIELDS, Field
from pipeline.schema import DcgmFields, DcgmRecord

log = logging.getLogger(__name__)

HOST_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid", "gpu_uuid")
MODEL_LABELS = ("modelName", "model_name")
# Identity labels become record fields; the XID's code/message are already the value.
_NOT_CARRIED = {"gpu", "nvlink", "err_code", "err_msg", *HOST_LABELS, *UUID_LABELS, *MODEL_LABELS}
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class ParseStats:
    """What one parse kept and left out, by reason."""

    samples: int = 0
    used: int = 0
    blank: int = 0          # DCGM blank sentinel or non-finite value
    unknown_metric: int = 0
    no_gpu_label: int = 0
    bad_lines: int = 0
    dropped: list[tuple[str, str, str]] = field(default_factory=list)  # (metric, entity, reason)


def is_blank(f: Field, value: float) -> bool:
    """True for DCGM's "no data" placeholders (and NaN/inf), which must never reach a detector."""
    if not math.isfinite(value) or value >= f.blank_threshold:
        return True
    # int32 blanks (0x7ffffff0..0x7fffffff) leak from 32-bit fields; a counter such as the energy
    # total can legitimately pass 2^31, so only non-counters are read this way.
    return f.kind != COUNTER and BLANK_INT32 <= value <= BLANK_INT32 + 15


def _field(name: str) -> Field | None:
    f = FIELDS.by_name(name)
    if f is None and name.startswith("dcgm_"):
        rest = name[5:].upper()
        f = FIELDS.by_name("DCGM_FI_DEV_" + rest) or FIELDS.by_name("DCGM_FI_PROF_" + rest)
    return f


def _families(text: str, stats: ParseStats):
    """Parse with the maintained parser; if the text is damaged (a cut-off scrape), parse it
    again line by line so one bad line costs only itself."""
    try:
        return list(text_string_to_metric_families(text))
    except Exception:  # noqa: BLE001 - the parser raises ValueError, TypeError, IndexError...
        pass
    fams = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            fams.extend(text_string_to_metric_families(line + "\n"))
        except Exception:  # noqa: BLE001
            stats.bad_lines += 1
    return fams


def parse_metrics(text: str, *, ts: float, host: str | None = None,
                  default_host: str | None = None) -> tuple[list[DcgmRecord], ParseStats]:
    """Records (one per GPU and per NVLink) from one scrape.

    ``host`` overrides the exporter's host label; ``default_host`` is used when it has none.
    """
    stats = ParseStats()
    values: dict[tuple[str, int, int | None], dict[str, float]] = {}
    meta: dict[tuple[str, int, int | None], dict[str, object]] = {}
    for fam in _families(text, stats):
        for s in fam.samples:
            stats.samples += 1
            # prometheus_client names a counter's sample "<family>_total" even when the exposition
            # line had no suffix (dcgm-exporter writes none): the metric is the family's name.
            mname = fam.name if fam.type == "counter" and s.name == fam.name + "_total" else s.name
            f = _field(mname)
            if f is None:
                stats.unknown_metric += 1
                continue
            lab = s.labels
            gpu_s = lab.get("gpu", "")
            if not gpu_s.isdigit():
                stats.no_gpu_label += 1
                stats.dropped.append((mname, repr(gpu_s), "no_gpu_label"))
                continue
            link_s = lab.get("nvlink")
            link = int(link_s) if link_s is not None and link_s.isdigit() else None
            h = host or next((lab[k] for k in HOST_LABELS if lab.get(k)), None) or default_host or "unknown"
            key = (h, int(gpu_s), link)
            value = float(s.value)
            if is_blank(f, value):
                stats.blank += 1
                stats.dropped.append((mname, f"{h}/gpu{gpu_s}" + (f"/link{link}" if link is not None else ""),
                                      "blank_sentinel"))
                continue
            stats.used += 1
            name = mname if mname in f.names else f.names[0]
            values.setdefault(key, {})[name] = value
            m = meta.setdefault(key, {"labels": {}})
            uuid = next((lab[k] for k in UUID_LABELS if lab.get(k)), None)
            model = next((lab[k] for k in MODEL_LABELS if lab.get(k)), None)
            if uuid:
                m["uuid"] = uuid
            if model:
                m["model"] = model
            if s.timestamp is not None:
                m["ts"] = float(s.timestamp)
            labels = m["labels"]
            for k, v in lab.items():
                if v and k not in _NOT_CARRIED:
                    labels[k] = v  # type: ignore[index]
    # Entities whose every sample was blank still exist: send them with no fields, so the engine
    # sees the GPU report (a blank is "no data", not "GPU gone").
    records = []
    for key in sorted(set(values) | set(meta), key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        h, gpu, link = key
        m = meta.get(key, {"labels": {}})
        records.append(DcgmRecord(ts=float(m.get("ts", ts)), host=h, gpu=gpu, link=link,  # type: ignore[arg-type]
                                  uuid=m.get("uuid"), model=m.get("model"),  # type: ignore[arg-type]
                                  labels=dict(m["labels"]),  # type: ignore[arg-type]
                                  fields=DcgmFields(**values.get(key, {}))))
    return records, stats


class ScrapeError(Exception):
    """The exporter did not answer with a usable body (down, timeout, HTTP error, too large)."""


def fetch(url: str, timeout_s: float) -> str:
    """GET ``url`` with one overall deadline (a server that trickles bytes cannot hold us)."""
    deadline = time.monotonic() + timeout_s
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - operator's URL
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise ScrapeError(f"{url}: no complete answer within {timeout_s}s")
                chunk = resp.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError(f"{url}: body larger than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
    except ScrapeError:
        raise
    except urllib.error.HTTPError as e:
        raise ScrapeError(f"{url}: HTTP {e.code}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ScrapeError(f"{url}: {getattr(e, 'reason', e)}") from e
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass
class ExporterStats:
    scrapes: int = 0
    failures: int = 0          # down, timeout, HTTP error
    empty: int = 0             # answered, but no GPU in it
    missing_gpus: int = 0      # GPU-intervals missing that an earlier scrape had
    blank: int = 0
    unknown_metric: int = 0
    bad_lines: int = 0


class ExporterSource:
    """Scrapes one dcgm-exporter (``url``), or reads saved scrapes (``files``, one per poll)."""

    def __init__(self, url: str | None = None, *, files: list[str] | None = None, timeout_s: float = 5.0,
                 host: str | None = None, clock=time.time) -> None:
        if bool(url) == bool(files):
            raise ValueError("give exactly one of url or files")
        self.url = url
        self.files = list(files or [])
        self.timeout_s = timeout_s
        self.host = host
        self.default_host = socket.gethostname()
        self.clock = clock
        self.stats = ExporterStats()
        self.known: set[tuple[str, int]] = set()
        self.done = False

    def _text(self) -> str | None:
        if self.url:
            return fetch(self.url, self.timeout_s)
        path = self.files.pop(0)
        if not self.files:
            self.done = True
        return Path(path).read_text(encoding="utf-8", errors="replace")

    def poll(self) -> list[DcgmRecord]:
        self.stats.scrapes += 1
        try:
            text = self._text()
        except (ScrapeError, OSError) as e:
            self.stats.failures += 1
            log.warning("dcgm-exporter scrape failed (%d so far): %s; sending nothing, so the engine's "
                        "telemetry_gap check sees the silence", self.stats.failures, e)
            return []
        records, ps = parse_metrics(text or "", ts=self.clock(), host=self.host, default_host=self.default_host)
        self.stats.blank += ps.blank
        self.stats.unknown_metric += ps.unknown_metric
        self.stats.bad_lines += ps.bad_lines
        if ps.bad_lines:
            log.warning("dcgm-exporter: %d unparseable line(s) skipped (truncated scrape?)", ps.bad_lines)
        gpus = {(r.host, r.gpu) for r in records}
        if not gpus:
            self.stats.empty += 1
            log.warning("dcgm-exporter answered with no GPU samples (%d so far)", self.stats.empty)
        missing = self.known - gpus
        if missing and gpus:
            self.stats.missing_gpus += len(missing)
            log.warning("dcgm-exporter lost GPU(s) it reported before: %s", ", ".join(
                f"{h}/gpu{g}" for h, g in sorted(missing)))
        self.known |= gpus
        return records

    def close(self) -> None:
        pass
