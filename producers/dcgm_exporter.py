"""dcgm-exporter's ``/metrics`` (Prometheus text format) -> ``DcgmRecord``s.

Parsed with ``prometheus_client.parser`` (the maintained parser), one record per GPU and one
per NVLink (``nvlink`` label). What real exporters vary on, and how it is handled:

- host label ``Hostname`` or ``hostname`` (per-link metrics since 4.4.1-4.6.0, every metric after
  4.5.3-4.8.2); UUID label
  ``UUID``, ``uuid`` (``--use-old-namespace``) or ``gpu_uuid``; model ``modelName`` or
  ``model_name``; ``pci_bus_id`` may be missing. Every other non-empty label (Kubernetes
  ``pod``/``namespace``/``container``, HPC ``hpc_job``, label-type fields such as the driver
  version) is carried in the record's ``labels``.
- both DCGM spellings (pre-4.6 and 4.6) resolve through the catalog; the 1.x names of
  ``etc/1.x-compatibility-metrics.csv`` (``dcgm_gpu_utilization``, ``dcgm_nvlink_bandwidth_total``)
  through go-dcgm's table of them, other ``dcgm_*`` names tried as ``DCGM_FI_DEV_*``.
- DCGM blank sentinels (``pipeline.catalog`` thresholds) and non-finite values are dropped.
- ``DCGM_FI_DEV_XID_ERRORS`` is the most recent XID (a sticky gauge), passed through as such.
  ``DCGM_EXP_XID_ERRORS_COUNT{xid="N",window_size_in_ms="W"}`` (one series per XID code seen in
  the exporter's window) becomes the field ``xid_count`` (all codes' total) and
  ``labels["xid_counts"] = "13:5,79:2"``.
- MIG: a GPU instance's series (``GPU_I_ID``, ``GPU_I_PROFILE``, its own pod labels) and the
  whole GPU's become one record of the physical GPU, never overwriting each other
  (docs/architecture.md §3): physical fields from the whole GPU's series, else the instances'
  (an XID's non-zero wins); per-instance fields and labels under ``mig.<GPU_I_ID>.``; an
  instance's attribution (``pod``..., ``pod_name``..., ``pod_uid``, ``vgpu``, ``dra_*``) never
  becomes the whole GPU's.
- NVSwitch SXids: ``DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS`` / ``..._NON_FATAL_ERRORS`` (DCGM 856/857,
  the switch's last SXid) come per switch, labelled ``nvswitch`` and the host, never ``gpu``
  (``switchMetricsFormat``: ``nvswitch="3"`` 3.1.3-3.1.2 to 4.4.1-4.5.2, ``nvswitch="nvswitch0"``
  after). A switch serves every GPU of its baseboard, so each kind goes on every GPU record of
  the host in the same scrape, as the kernel-log producer does (docs/architecture.md §3): the
  lowest switch's non-zero SXid (0 if all say 0), every non-zero one in
  ``labels["sxid.fatal_sources"]`` / ``["sxid.nonfatal_sources"]`` (``"nvswitch0:12028"``).
- Metrics the exporter's own field lists enable that no detector reads (``_NOT_USED``: encoder and
  decoder load, vGPU licence, reserved framebuffer, the deprecated NVML PCIe throughput) are
  skipped without a warning and counted as ``samples_not_used``: the stock exporter's output is
  not a fault of the operator's.
- What is left out is counted by reason (``summary()``): unknown metric, blank sentinel, series
  without a GPU label (a switch SXid too, when its host has no GPU in the scrape), an identity
  label (``gpu``, ``nvlink``, ``GPU_I_ID``, ``xid``) that is not a number of ASCII digits or a
  host or model label the decoder refuses (``bad_label``), a sample timestamp outside the
  decoder's range (``bad_timestamp``), a second series for the same metric and entity
  (``duplicate_series``, the first one kept; but see shared GPUs below), unparsable line (also a value or timestamp that is
  not ASCII, or more words after the labels than a value and a timestamp: ``int()`` reads "٣" as
  3). Lines longer than ``MAX_LINE_CHARS`` or with more than ``MAX_LABELS`` labels are dropped (counted) before the
  parser sees them: ``prometheus_client``'s label parsing is quadratic in a line's label count.

What would make a record the decoder refuses or a message too large is left out and counted too:
a ``gpu`` index past 4095 or an ``nvlink`` past 1023 (``bad_label``), GPU instances past
``MAX_MIG_INSTANCES`` on one GPU (``bad_label``), XID codes past ``MAX_XID_CODES`` in ``xid_counts``
(still in the total), labels past ``MAX_ENTITY_LABEL_CHARS`` on one entity (``labels_dropped``).
A GPU shared by pods (``--kubernetes-virtual-gpus``: time-slicing, MPS) comes as one copy of each
series per pod, differing only in attribution labels (``pod``, ``namespace``, ``container``,
``pod_uid``, ``vgpu``...; kubernetes.go ``Process``): copies of the kept series' value are merged,
not dropped; the record keeps the first pod in ``pod``/``namespace``/``container`` and lists every
pod in ``labels["pods"]`` (``namespace/pod``, sorted, at most ``MAX_SHARED_PODS``) with
``labels["pod_count"]``; a GPU instance's under ``mig.<GPU_I_ID>.``. The per-process
``GPU_UTIL``/``FB_USED`` copies, each pod's share, count ``pod_share_series`` (the GPU's value kept);
a copy of another metric with another value still counts ``duplicate_series``, its pod listed; a
pod or namespace no Kubernetes name can be is counted (``labels_dropped``), never listed.
A host label that names the loopback (``localhost``, ``127.0.0.1``, ``::1``: what 4.0.0 and later
print with ``-r localhost:5555``, on every node alike) is taken as absent (``loopback_host_labels``).
The labels of ``DCGM_EXP_*`` series (one map shared by every GPU without events in the window,
expcollector.go) stand in only for an entity without DCGM series. A gzip body (a proxy's, a saved
``.prom.gz``) is read, up to ``MAX_BODY_BYTES`` unpacked.

A scrape that fails, times out, comes back empty, or lacks GPUs an earlier scrape had sends
nothing for what is missing -- so the engine's absence checks (``telemetry_gap`` for a silent
host, ``gpu_lost`` for a GPU missing while its host reports) fire -- and logs and counts it.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pipeline import numeric
from pipeline.catalog import BLANK_INT32, COUNTER, FIELDS, Field
from pipeline.recordchecks import MAX_GPU_INDEX, MAX_LINK_INDEX, TS_MAX, TS_MIN, bad_host, bad_identifier
from pipeline.schema import (
    MAX_NAMESPACE_NAME,
    MAX_POD_NAME,
    MAX_SHARED_PODS,
    MIG_INSTANCE_FIELD_IDS,
    MIG_INSTANCE_LABEL,
    MIG_PROFILE_LABEL,
    POD_COUNT_LABEL,
    PODS_LABEL,
    DcgmFields,
    DcgmRecord,
)
from producers import httpget

log = logging.getLogger(__name__)

HOST_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid", "gpu_uuid")
MODEL_LABELS = ("modelName", "model_name")
# Identity labels become record fields; the XID's code/message are already the value.
_NOT_CARRIED = {
    "gpu",
    "nvlink",
    "err_code",
    "err_msg",
    "xid",
    "window_size_in_ms",
    # The shared GPU's pod list is the producer's own: an exporter label of that name is not it.
    PODS_LABEL,
    POD_COUNT_LABEL,
    *HOST_LABELS,
    *UUID_LABELS,
    *MODEL_LABELS,
}
MAX_BODY_BYTES = 32 * 1024 * 1024
# A real exporter's line is a few hundred characters with a dozen labels (Kubernetes ones
# included); these bounds keep the parser's quadratic label handling to a constant per line.
MAX_LINE_CHARS = 64 * 1024
MAX_LABELS = 128
# GPU, NVLink, GPU instance and XID numbers: ASCII digits only (int() would also read "٣" as 3).
MAX_ID_DIGITS = 9
# What one entity (GPU or NVLink) may gather from a scrape, so that no record outgrows a message
# (producers.common.MAX_MESSAGE_BYTES) and memory stays a small multiple of the body: GPU
# instances (an A100/H100/B200 has at most 7), XID codes listed in ``xid_counts`` (NVIDIA's XIDs
# are below 200), and characters of carried labels (a real record holds a few hundred; MIG with
# Kubernetes pod labels a few thousand). The excess is counted (``bad_label``, ``labels_dropped``).
MAX_MIG_INSTANCES = 64
MAX_XID_CODES = 64
MAX_ENTITY_LABEL_CHARS = 64 * 1024
MAX_UNKNOWN_NAME = 200  # characters of an unknown metric's name kept for the warning
# Host labels that name no host: dcgm-exporter 4.0.0 and later label every series with the host
# of its ``-r``/``DCGM_REMOTE_HOSTENGINE_INFO`` hostengine (hostname.go parseRemoteHostname), so
# ``-r localhost:5555`` (nv-hostengine as a host service) makes every node "localhost". Such a
# label is taken as absent: the records are this host's (``default_host``) unless ``host`` says.
_LOOPBACK_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "localhost4", "localhost4.localdomain4", "localhost6",
     "localhost6.localdomain6", "ip6-localhost", "ip6-loopback"}
)  # fmt: skip
# The 1.x metric names dcgm-exporter accepts in its field list (etc/1.x-compatibility-metrics.csv,
# shipped 2.x - 4.x) and their DCGM field ids, from go-dcgm's table it resolves them with
# (pkg/dcgm/const_fields.go legacyDCGMFields, OLD_DCGM_FI before): many are not "dcgm_" + a DCGM
# name (dcgm_gpu_utilization is DCGM_FI_DEV_GPU_UTIL).
_OLD_NAMES = {
    "dcgm_sm_clock": 100,
    "dcgm_memory_clock": 101,
    "dcgm_memory_temp": 140,
    "dcgm_gpu_temp": 150,
    "dcgm_power_usage": 155,
    "dcgm_total_energy_consumption": 156,
    "dcgm_pcie_tx_throughput": 200,
    "dcgm_pcie_rx_throughput": 201,
    "dcgm_pcie_replay_counter": 202,
    "dcgm_gpu_utilization": 203,
    "dcgm_mem_copy_utilization": 204,
    "dcgm_enc_utilization": 206,
    "dcgm_dec_utilization": 207,
    "dcgm_xid_errors": 230,
    "dcgm_power_violation": 240,
    "dcgm_thermal_violation": 241,
    "dcgm_sync_boost_violation": 242,
    "dcgm_board_limit_violation": 243,
    "dcgm_low_util_violation": 244,
    "dcgm_reliability_violation": 245,
    "dcgm_fb_free": 251,
    "dcgm_fb_used": 252,
    "dcgm_ecc_sbe_volatile_total": 310,
    "dcgm_ecc_dbe_volatile_total": 311,
    "dcgm_ecc_sbe_aggregate_total": 312,
    "dcgm_ecc_dbe_aggregate_total": 313,
    "dcgm_retired_pages_sbe": 390,
    "dcgm_retired_pages_dbe": 391,
    "dcgm_retired_pages_pending": 392,
    "dcgm_nvlink_flit_crc_error_count_total": 409,
    "dcgm_nvlink_data_crc_error_count_total": 419,
    "dcgm_nvlink_replay_error_count_total": 429,
    "dcgm_nvlink_recovery_error_count_total": 439,
    "dcgm_nvlink_bandwidth_total": 449,
    "dcgm_fi_prof_gr_engine_active": 1001,
    "dcgm_fi_prof_sm_active": 1002,
    "dcgm_fi_prof_sm_occupancy": 1003,
    "dcgm_fi_prof_pipe_tensor_active": 1004,
    "dcgm_fi_prof_dram_active": 1005,
    "dcgm_fi_prof_pcie_tx_bytes": 1009,
    "dcgm_fi_prof_pcie_rx_bytes": 1010,
}

# Metrics that dcgm-exporter's shipped field lists enable (etc/default-counters.csv and
# dcp-metrics-included.csv, 2.2.9-2.4.1 to HEAD; the 1.x names of etc/1.x-compatibility-metrics.csv)
# and the catalog has no field for, with their DCGM ids (dcgm_fields.h). No detector reads encoder or
# decoder load, the vGPU licence or the reserved framebuffer, and DCGM deprecates the PCIe throughput
# (200/201, in the default list until 3.3.6-3.4.2) for DCGM_FI_PROF_PCIE_*_BYTES, which the catalog
# maps; so they are skipped, never warned about. The catalog is asked first: a field it gains is read.
_NOT_USED = {
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": 200,
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": 201,
    "DCGM_FI_DEV_ENC_UTIL": 206,
    "DCGM_FI_DEV_DEC_UTIL": 207,
    "DCGM_FI_DEV_FB_RESERVED": 253,
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 526,
    "dcgm_pcie_tx_throughput": 200,
    "dcgm_pcie_rx_throughput": 201,
    "dcgm_enc_utilization": 206,
    "dcgm_dec_utilization": 207,
}


@dataclass
class ParseStats:
    """What one parse kept and left out, by reason."""

    samples: int = 0
    used: int = 0
    blank: int = 0  # DCGM blank sentinel or non-finite value
    unknown_metric: int = 0
    not_used: int = 0  # samples of the stock field lists' metrics no detector reads (_NOT_USED)
    no_gpu_label: int = 0
    bad_lines: int = 0
    bad_label: int = 0  # gpu, nvlink, GPU_I_ID or xid not ASCII digits; a host or model the pipeline refuses
    bad_timestamp: int = 0  # a sample timestamp that is not finite or not a time the pipeline accepts
    duplicate_series: int = (
        0  # the same metric for the same entity again (the first is kept; a pod's same-value copy merges)
    )
    pod_shares: int = 0  # a shared GPU's per-pod GPU_UTIL/FB_USED copies: each pod's share, the GPU's kept
    line_too_long: int = 0
    too_many_labels: int = 0
    labels_dropped: int = 0  # labels past an entity's MAX_ENTITY_LABEL_CHARS (the series itself kept)
    loopback_host: int = 0  # series whose host label named a loopback ("localhost", "::1"): not a host
    mig_entities: int = 0  # records assembled from GPU-instance series (MIG)
    mig_conflicts: int = 0  # physical fields whose series disagreed (the chosen origin is labelled)
    unknown_names: list[str] = field(default_factory=list)
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
    if f is None and name in _OLD_NAMES:
        f = FIELDS.by_id(_OLD_NAMES[name])
    if f is None and name.startswith("dcgm_"):
        rest = name[5:].upper()
        f = FIELDS.by_name("DCGM_FI_DEV_" + rest) or FIELDS.by_name("DCGM_FI_PROF_" + rest)
    return f


def _screen(text: str, stats: ParseStats) -> list[str]:
    """The lines the parser may see: one pass, each line checked in time linear in its length."""
    kept = []
    # On "\n" only, as the parser splits: str.splitlines() would also cut at U+2028 in a label.
    for line in text.split("\n"):
        if len(line) > MAX_LINE_CHARS:
            stats.line_too_long += 1
            continue
        # '="' opens every label value, so its count bounds the label count from above.
        if not line.startswith("#") and line.count('="') > MAX_LABELS:
            stats.too_many_labels += 1
            continue
        if not line.startswith("#") and not _value_text_ok(line):
            stats.bad_lines += 1
            continue
        kept.append(line)
    return kept


def _value_text_ok(line: str) -> bool:
    """Whether a sample line's value and timestamp are what the format allows: ASCII, and one value
    with at most one timestamp, since the parser reads "٣" as 3 (``int()``) and takes the last of
    any number of words after the value as the timestamp."""
    labelled = "{" in line
    # No value or timestamp holds "}", so the last one closes the labels.
    tail = line[line.rfind("}") + 1 :] if labelled else line
    return tail.isascii() and len(tail.split()) <= (2 if labelled else 3)


def _families(text: str, stats: ParseStats) -> list[Metric]:
    """Parse with the maintained parser; if the text is damaged (a cut-off scrape), parse it
    again line by line so one bad line costs only itself. A text that does not end with a newline
    was cut off (the exporter ends every line with one): its last line may be a prefix that still
    parses, ``temp 4`` of ``temp 45``, so it is dropped as a bad line."""
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        stats.bad_lines += 1
    lines = _screen(text, stats)
    try:
        return list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except Exception:  # noqa: BLE001 - the parser raises ValueError, TypeError, IndexError...
        pass
    fams: list[Metric] = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        try:
            fams.extend(text_string_to_metric_families(line + "\n"))
        except Exception:  # noqa: BLE001
            stats.bad_lines += 1
    return fams


# dcgm-exporter's per-XID counter (xid_collector.go): one series per GPU and XID code seen in the
# window, labels ``xid`` and ``window_size_in_ms``; one series without ``xid`` and value 0 when none.
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
_XID_FIELDS = {FIELDS.by_alias("xid"), FIELDS.by_alias("xid_count")}
# Labels that say who uses a slice of the GPU: never lifted from an instance onto the whole GPU.
# The old-namespace spellings (--use-old-namespace), pod_uid, vgpu and the DRA claim labels are
# attribution too (internal/pkg/transformation/const.go).
_ATTRIBUTION = (
    "pod",
    "namespace",
    "container",
    "hpc_job",
    "pod_name",
    "pod_namespace",
    "container_name",
    "pod_uid",
    "vgpu",
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
    "dra_mig_profile",
    "dra_mig_device_uuid",
    PODS_LABEL,
    POD_COUNT_LABEL,
)
_ATTRIBUTION_KEYS = frozenset(_ATTRIBUTION)
# A series' pod (current spelling, then --use-old-namespace's), for a shared GPU's pod list.
_POD_KEYS = ("pod", "pod_name")
_NAMESPACE_KEYS = ("namespace", "pod_namespace")
_MIG_LABELS = {MIG_INSTANCE_LABEL, MIG_PROFILE_LABEL}
# NVSwitch SXids: DCGM keeps them per switch (entity level DCGM_FE_SWITCH), so the exporter renders
# them with ``nvswitch`` and no ``gpu`` (render_metrics.go switchMetricsFormat); the contract has no
# switch entity, so they ride on the host's GPU records (docs/architecture.md §3).
SWITCH_LABEL = "nvswitch"
_SXID_KIND = {FIELDS.require("nvswitch_fatal_sxid"): "fatal", FIELDS.require("nvswitch_nonfatal_sxid"): "nonfatal"}
MAX_SWITCH_SOURCES = 64  # switches one sxid.*_sources label names; an HGX baseboard has 2 to 12


def _num_text(v: float) -> str:
    return str(int(v)) if v.is_integer() and abs(v) < 2**63 else repr(v)


@functools.lru_cache(maxsize=1024)  # asked once a sample, of the few host names a scrape has
def is_loopback(name: str) -> bool:
    """Whether a host label names the loopback (or no address) rather than a host.

    >>> [is_loopback(n) for n in ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", "gpu-node-1", "10.0.0.7")]
    [True, True, True, True, True, False, False]
    """
    n = name.lower().rstrip(".")
    if n in _LOOPBACK_NAMES:
        return True
    if len(n) > 64 or not n.strip("[]"):
        return False
    try:
        ip = ipaddress.ip_address(n.strip("[]"))
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _host_of(lab: dict[str, str], host: str | None, default_host: str | None, stats: ParseStats | None = None) -> str:
    if host:
        return host
    named = next((lab[k] for k in HOST_LABELS if lab.get(k)), None)
    if named is not None and is_loopback(named):
        # "localhost" from -r localhost:5555 is every node's label: never a host of its own.
        if stats is not None:
            stats.loopback_host += 1
        named = None
    return named or default_host or "unknown"


def _switch_order(item: tuple[str, float]) -> tuple[int, int, str, float]:
    sw, v = item
    n = ascii_int(sw.removeprefix("nvswitch"))
    return (0, n, sw, v) if n is not None else (1, 0, sw, v)


def host_sxids(seen: dict[Field, list[tuple[str, float]]]) -> tuple[dict[str, float], dict[str, str]]:
    """The fields and labels a host's NVSwitch SXid series (``nvswitch`` label, value) give each of
    its GPU records: per kind, the lowest switch's non-zero SXid, else 0; the non-zero ones by switch
    in ``sxid.<kind>_sources``. Order-free, since 4.4.1-4.6.0 labels every switch ``nvswitch0``.

    >>> fatal = FIELDS.require("nvswitch_fatal_sxid")
    >>> host_sxids({fatal: [("nvswitch2", 12028.0), ("nvswitch0", 0.0)]})
    ({'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS': 12028.0}, {'sxid.fatal_sources': 'nvswitch2:12028'})
    """
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    for f, series in seen.items():
        ordered = sorted(series, key=_switch_order)
        raised = [(sw, v) for sw, v in ordered if v != 0]
        values[f.names[0]] = raised[0][1] if raised else ordered[0][1]
        if raised:
            labels[f"sxid.{_SXID_KIND[f]}_sources"] = ",".join(
                f"{sw}:{_num_text(v)}" for sw, v in raised[:MAX_SWITCH_SOURCES]
            )
    return values, labels


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer of over 308 digits: as infinite as float("1e400")
        return math.inf


@dataclass
class _Series:
    """What one origin (the whole GPU, ``None``, or one GPU instance's ``GPU_I_ID``) said about
    one entity in one scrape."""

    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    xid_counts: dict[int, float] = field(default_factory=dict)
    profile: str | None = None
    regular: bool = False  # a DCGM series (not a DCGM_EXP_ one) gave a value
    exp_labels: dict[str, str] = field(default_factory=dict)  # the DCGM_EXP_ series' labels
    pods: set[str] = field(default_factory=set)  # "namespace/pod" of every pod its DCGM series named
    bad_pods: set[tuple[str, str]] = field(default_factory=set)  # (namespace, pod) no Kubernetes name can be


def _pod_name_ok(name: str, limit: int) -> bool:
    # Kubernetes names are short DNS names: a comma, slash or space would break the list apart.
    # isprintable() is False for every white space but " ".
    return 0 < len(name) <= limit and name.isprintable() and not any(c in ",/ " for c in name)


def pod_entry(lab: dict[str, str]) -> str | None:
    """A series' pod as its entry in a shared GPU's ``pods`` list: ``namespace/pod`` (``pod``
    alone without a namespace), ``""`` for a pod or namespace no Kubernetes name can be (too
    long, unprintable, a comma, slash or space), ``None`` for a series that names no pod.

    >>> pod_entry({"pod": "trainer-0", "namespace": "research"}), pod_entry({"gpu": "0"}), pod_entry({"pod": "a,b"})
    ('research/trainer-0', None, '')
    """
    pod = next((lab[k] for k in _POD_KEYS if lab.get(k)), None)
    if pod is None:
        return None
    ns = next((lab[k] for k in _NAMESPACE_KEYS if lab.get(k)), None)
    if not _pod_name_ok(pod, MAX_POD_NAME) or (ns is not None and not _pod_name_ok(ns, MAX_NAMESPACE_NAME)):
        return ""
    return pod if ns is None else f"{ns}/{pod}"


# What dcgm-exporter attributes to each process, so to each pod of a shared GPU (pod mapper:
# utilisation and framebuffer used): a pod's copy of these holds its own share, not the GPU's.
_PER_PROCESS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"})


def _pod_copy(lab: dict[str, str], kept: dict[str, str]) -> bool:
    """Whether a series is another pod's copy of ``kept``: labels that differ, in attribution only."""
    differ = [k for k in lab.keys() | kept.keys() if (lab.get(k) or None) != (kept.get(k) or None)]
    return bool(differ) and all(k in _ATTRIBUTION_KEYS for k in differ)


def _note_pod(ser: _Series, lab: dict[str, str]) -> None:
    # Both sets are bounded by the body: every distinct pod came from a line of it.
    entry = pod_entry(lab)
    if entry == "":
        ser.bad_pods.add(
            (next((lab[k] for k in _NAMESPACE_KEYS if lab.get(k)), ""), next(lab[k] for k in _POD_KEYS if lab.get(k)))
        )
    elif entry is not None:
        ser.pods.add(entry)


def _origin_name(inst: str | None) -> str:
    return "gpu" if inst is None else f"{MIG_INSTANCE_LABEL}={inst}"


def _inst_order(inst: str | None) -> tuple[int, int, str]:
    if inst is None:
        return (0, 0, "")
    n = ascii_int(inst)
    return (1, n, inst) if n is not None else (1, 1 << 30, inst)


def ascii_int(text: str | None, max_digits: int = MAX_ID_DIGITS) -> int | None:
    """An identity label as a number: 1 to ``max_digits`` ASCII digits (``numeric.ascii_int``),
    so neither "²" nor "٣" can name a GPU."""
    return numeric.ascii_int(text, max_digits)


def _physical(f: Field, name: str, origins: dict[str | None, _Series]) -> tuple[float | None, str | None, bool]:
    """The physical GPU's value of one field: (value, the origin it came from -- ``None`` for the
    whole GPU or a GPU_I_ID --, whether the series disagreed).

    The whole GPU's series where it has one, else the lowest GPU_I_ID's; for an XID field, a
    non-zero value wins over 0 (a fault on any instance is the physical GPU's). Values are chosen,
    never combined."""
    seen = [
        (inst, ser.values[name])
        for inst, ser in sorted(origins.items(), key=lambda kv: _inst_order(kv[0]))
        if name in ser.values
    ]
    if not seen:
        return None, None, False
    conflict = len({v for _, v in seen}) > 1
    if f in _XID_FIELDS:
        for inst, v in seen:
            if v != 0:
                return v, inst, conflict
    inst, v = seen[0]
    return v, inst, conflict


def _assemble(
    key: tuple[str, int, int | None], origins: dict[str | None, _Series], stats: ParseStats
) -> tuple[dict[str, float], dict[str, str]]:
    """Fields and labels of one entity's record from its series (docs/architecture.md §3, MIG)."""
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    for ser in origins.values():
        if not ser.regular:  # only DCGM_EXP_ series: their labels are all there is
            for lk, lv in ser.exp_labels.items():
                ser.labels.setdefault(lk, lv)

    # The pod lists share the entity's label budget (every instance's with the GPU's), as any label.
    def prefix(inst: str | None) -> int:  # an instance's labels go out as ``mig.<id>.<key>``
        return 0 if inst is None else len(f"mig.{inst}.")

    room = MAX_ENTITY_LABEL_CHARS - sum(
        prefix(i) + len(k) + len(v) for i, ser in origins.items() for k, v in ser.labels.items()
    )
    for inst, ser in origins.items():
        n_pods = len(ser.pods) + len(ser.bad_pods)
        if n_pods > 1:  # a GPU (or instance) shared by pods: every one of them, bounded
            listed: list[str] = []
            size = 2 * prefix(inst) + len(PODS_LABEL) + len(POD_COUNT_LABEL) + len(str(n_pods))
            for pod in sorted(ser.pods)[:MAX_SHARED_PODS]:
                if size + len(pod) + 1 > room:
                    stats.labels_dropped += 1  # the list cut short here; pod_count still says how many
                    break
                listed.append(pod)
                size += len(pod) + 1
            if listed:
                ser.labels[PODS_LABEL] = ",".join(listed)
            ser.labels[POD_COUNT_LABEL] = str(n_pods)
            room -= size
            stats.labels_dropped += len(ser.bad_pods)  # counted, never listed: they would break the list apart
    whole = origins.get(None)
    instances = sorted((i for i in origins if i is not None), key=_inst_order)
    names = sorted({n for ser in origins.values() for n in ser.values}, key=_SLOT.__getitem__)
    chosen: dict[str, str | None] = {}
    for name in names:
        f = FIELDS.by_name(name)
        assert f is not None
        if f.field_id in MIG_INSTANCE_FIELD_IDS:
            if whole is not None and name in whole.values:
                values[name] = whole.values[name]
            for inst in instances:
                if name in origins[inst].values:
                    labels[f"mig.{inst}.{f.alias}"] = _num_text(origins[inst].values[name])
            continue
        v, src, conflict = _physical(f, name, origins)
        if v is None:
            continue
        values[name] = v
        chosen[name] = src
        if conflict:
            stats.mig_conflicts += 1
            labels[f"mig.source.{f.alias}"] = _origin_name(src)
    if instances:
        labels["mig.instances"] = ",".join(instances)
        for inst in instances:
            profile = origins[inst].profile
            if profile:
                labels[f"mig.{inst}.profile"] = profile
        xf = FIELDS.require("xid")
        xname = next((n for n in xf.names if n in values), None)
        if xname is not None and values[xname] != 0:
            labels["mig.xid_sources"] = ",".join(
                f"{_origin_name(i)}:{_num_text(origins[i].values[xname])}"
                for i in sorted(origins, key=_inst_order)
                if origins[i].values.get(xname, 0) != 0
            )
    # Labels: the whole GPU's as they are; an instance's attribution labels (pod...) stay with the
    # instance; other labels move up only when every series that has them agrees.
    keys = {k for ser in origins.values() for k in ser.labels}
    for k in sorted(keys):
        have = [(i, origins[i].labels[k]) for i in sorted(origins, key=_inst_order) if k in origins[i].labels]
        if whole is not None and k in whole.labels:
            labels[k] = whole.labels[k]
        elif k not in _ATTRIBUTION and len({v for _, v in have}) == 1:
            labels[k] = have[0][1]
            continue
        for i, text in have:
            if i is not None and (k in _ATTRIBUTION or text != labels.get(k)):
                labels[f"mig.{i}.{k}"] = text
    # DCGM_EXP_XID_ERRORS_COUNT per code, from the series its total was taken from.
    if XID_COUNT in chosen:
        counts = origins[chosen[XID_COUNT]].xid_counts
        if counts:
            labels["xid_counts"] = ",".join(f"{c}:{_num_text(n)}" for c, n in sorted(counts.items()))
    return values, labels


_SLOT = {n: i for i, n in enumerate(FIELDS.all_names)}


def parse_metrics(
    text: str, *, ts: float, host: str | None = None, default_host: str | None = None
) -> tuple[list[DcgmRecord], ParseStats]:
    """Records (one per GPU and per NVLink) from one scrape.

    ``host`` overrides the exporter's host label; ``default_host`` is used when it has none.
    With MIG, the series of a GPU's instances (``GPU_I_ID``) and of the whole GPU become one
    record of the physical GPU, per the contract in docs/architecture.md §3: nothing overwrites.
    An NVSwitch's SXid series goes on every GPU record of its host (``host_sxids``).

    >>> recs, st = parse_metrics(
    ...     'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 41\\n'
    ...     'DCGM_FI_DEV_ENC_UTIL{gpu="0",Hostname="n1"} 0\\n'
    ...     'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="nvswitch0",hostname="n1"} 12028\\n',
    ...     ts=1764403200.0,
    ... )
    >>> recs[0].fields.DCGM_FI_DEV_GPU_TEMP, recs[0].fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS, st.not_used
    (41.0, 12028.0, 1)
    """
    stats = ParseStats()
    series: dict[tuple[str, int, int | None], dict[str | None, _Series]] = {}
    meta: dict[tuple[str, int, int | None], dict[str, object]] = {}
    # (entity, origin, metric, xid code) -> the value and labels of the series kept
    seen: dict[tuple[object, ...], tuple[float, dict[str, str]]] = {}
    label_chars: dict[tuple[str, int, int | None], int] = {}  # characters of labels each entity carries
    switch_sxids: dict[str, dict[Field, list[tuple[str, float]]]] = {}  # host -> field -> (switch, SXid)
    for fam in _families(text, stats):
        for s in fam.samples:
            stats.samples += 1
            # prometheus_client names a counter's sample "<family>_total" even when the exposition
            # line had no suffix (dcgm-exporter writes none): the metric is the family's name, unless
            # the sample's own name is known (a "_total" the line had is stripped from the family's).
            mname = s.name
            f = _field(mname)
            if f is None and fam.type == "counter" and s.name == fam.name + "_total":
                mname = fam.name
                f = _field(mname)
            if f is None:
                if mname in _NOT_USED:
                    stats.not_used += 1
                    continue
                stats.unknown_metric += 1
                shown = mname[:MAX_UNKNOWN_NAME]
                if len(stats.unknown_names) < 1000 and shown not in stats.unknown_names:
                    stats.unknown_names.append(shown)
                continue
            lab = s.labels
            gpu_s = lab.get("gpu", "")
            if not gpu_s and f in _SXID_KIND and lab.get(SWITCH_LABEL):
                # A switch's last SXid: the host's, put on its GPU records once they are assembled.
                h = _host_of(lab, host, default_host, stats)
                sw = lab[SWITCH_LABEL]
                why = bad_host(h)
                value = _float(s.value)
                if why is not None:
                    stats.bad_label += 1
                    stats.dropped.append((mname, f"host: {why}", "bad_label"))
                elif is_blank(f, value):
                    stats.blank += 1
                    stats.dropped.append((mname, f"{h}/{sw[:40]}", "blank_sentinel"))
                else:
                    switch_sxids.setdefault(h, {}).setdefault(f, []).append((sw, value))
                continue
            if not gpu_s:
                stats.no_gpu_label += 1
                stats.dropped.append((mname, repr(gpu_s), "no_gpu_label"))
                continue
            # Identity labels: ASCII digits of bounded length, or the series is dropped (counted):
            # "²" would raise and lose the scrape, "٣" would overwrite GPU 3.
            bad = next(
                (k for k in ("gpu", "nvlink", MIG_INSTANCE_LABEL, "xid") if lab.get(k) and ascii_int(lab[k]) is None),
                None,
            )
            if bad is not None:
                stats.bad_label += 1
                stats.dropped.append((mname, f"{bad}={lab[bad][:40]!r}", "bad_label"))
                continue
            gpu = ascii_int(gpu_s)
            link = ascii_int(lab.get("nvlink"))
            assert gpu is not None
            if gpu > MAX_GPU_INDEX or (link is not None and link > MAX_LINK_INDEX):
                # The decoder refuses the record whole (out_of_range), uncounted here; and every
                # index up to 10^9 would be an entity of its own.
                stats.bad_label += 1
                stats.dropped.append((mname, f"gpu={gpu_s[:40]!r} nvlink={lab.get('nvlink', '')[:40]!r}", "bad_label"))
                continue
            h = _host_of(lab, host, default_host, stats)
            model = next((lab[k] for k in MODEL_LABELS if lab.get(k)), None)
            # A host or model the decoder refuses would cost the GPU's whole record downstream, uncounted.
            why = bad_host(h) or (bad_identifier(model) if model else None)
            if why is not None:
                stats.bad_label += 1
                stats.dropped.append((mname, f"host/model: {why}", "bad_label"))
                continue
            if s.timestamp is not None and not TS_MIN <= float(s.timestamp) <= TS_MAX:
                # The record takes its time from it: NaN, 1e20 or a negative time would cost all its fields.
                stats.bad_timestamp += 1
                stats.dropped.append((mname, f"{h}/gpu{gpu_s}", "bad_timestamp"))
                continue
            key = (h, gpu, link)
            inst = lab.get(MIG_INSTANCE_LABEL) or None
            origins = series.get(key)
            if inst is not None and origins is not None and inst not in origins:
                if sum(i is not None for i in origins) >= MAX_MIG_INSTANCES:
                    stats.bad_label += 1
                    stats.dropped.append((mname, f"{MIG_INSTANCE_LABEL}={inst}: past {MAX_MIG_INSTANCES}", "bad_label"))
                    continue
            ident = (key, inst, mname, lab.get("xid") or None)
            value = _float(s.value)
            if ident in seen:
                kept, kept_lab = seen[ident]
                # A GPU shared by pods (--kubernetes-virtual-gpus) has one copy per pod, differing
                # only in the attribution labels: all are its pods.
                pod_copy = _pod_copy(lab, kept_lab)
                if pod_copy and not mname.startswith("DCGM_EXP_") and not is_blank(f, value):
                    _note_pod(series[key][inst], lab)
                if pod_copy and (value == kept or (math.isnan(value) and math.isnan(kept))):
                    # The same value again (another pod's copy): merged, a blank one left out as blank.
                    if is_blank(f, value):
                        stats.blank += 1
                    else:
                        stats.used += 1
                    continue
                if pod_copy and mname in _PER_PROCESS:
                    # The exporter prints the GPU's value, then each pod's own share of it: the
                    # GPU's is kept, and nothing is lost.
                    stats.pod_shares += 1
                    continue
                # A second value for the same entity, or the same label set again (the format allows
                # one series per label set), would overwrite the first silently: the first is kept.
                stats.duplicate_series += 1
                stats.dropped.append((mname, f"{h}/gpu{gpu}", "duplicate_series"))
                continue
            seen[ident] = (value, lab)
            origins = series.setdefault(key, {})
            ser = origins.get(inst)
            if ser is None:
                ser = origins[inst] = _Series(profile=lab.get(MIG_PROFILE_LABEL) or None)
            m = meta.setdefault(key, {})
            if is_blank(f, value):
                stats.blank += 1
                stats.dropped.append(
                    (
                        mname,
                        f"{h}/gpu{gpu}"
                        + (f"/link{link}" if link is not None else "")
                        + (f"/{MIG_INSTANCE_LABEL}={inst}" if inst else ""),
                        "blank_sentinel",
                    )
                )
                continue
            stats.used += 1
            name = mname if mname in f.names else f.names[0]
            if name == XID_COUNT:
                # One series per XID code: the record's field is the window's total, the codes go in labels.
                code = ascii_int(lab.get("xid"))
                ser.values[name] = ser.values.get(name, 0.0) + value
                if code is not None and value and (code in ser.xid_counts or len(ser.xid_counts) < MAX_XID_CODES):
                    ser.xid_counts[code] = ser.xid_counts.get(code, 0.0) + value
                if lab.get("window_size_in_ms"):
                    ser.labels["xid_count_window_ms"] = lab["window_size_in_ms"]
            else:
                ser.values[name] = value
            uuid = next((lab[k] for k in UUID_LABELS if lab.get(k)), None)
            if uuid:
                m["uuid"] = uuid
            if model:
                m["model"] = model
            if s.timestamp is not None:
                m["ts"] = float(s.timestamp)
            # dcgm-exporter's own collectors (expcollector.go) render a GPU without events in the
            # window with one label map shared by every such GPU, holding the last GPU's label-type
            # fields (serial, ...) and, with --kubernetes-enable-pod-labels, other GPUs' pod labels:
            # their labels only stand in where the entity has no DCGM series of its own.
            exp = name.startswith("DCGM_EXP_")
            if not exp:
                ser.regular = True
                _note_pod(ser, lab)
            into = ser.exp_labels if exp else ser.labels
            for k, v in lab.items():
                if v and k not in _NOT_CARRIED and k not in _MIG_LABELS:
                    old = into.get(k)
                    if old == v:
                        continue
                    grow = len(v) - len(old) if old is not None else len(k) + len(v)
                    if label_chars.get(key, 0) + grow > MAX_ENTITY_LABEL_CHARS:
                        stats.labels_dropped += 1
                        continue
                    label_chars[key] = label_chars.get(key, 0) + grow
                    into[k] = v
    # Entities whose every sample was blank still exist: send them with no fields, so the engine
    # sees the GPU report (a blank is "no data", not "GPU gone").
    records = []
    carried: set[str] = set()  # hosts whose switch SXids found a GPU record
    for key in sorted(series, key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        h, gpu, link = key
        m = meta.get(key, {})
        values, labels = _assemble(key, series[key], stats)
        if link is None and h in switch_sxids:
            sx_values, sx_labels = host_sxids(switch_sxids[h])
            for name, sxid in sx_values.items():
                values.setdefault(name, sxid)  # a GPU's own series of the field is never overwritten
            labels.update(sx_labels)
            carried.add(h)
        if any(i is not None for i in series[key]):
            stats.mig_entities += 1
        records.append(
            DcgmRecord(
                ts=float(m.get("ts", ts)),  # type: ignore[arg-type]
                host=h,
                gpu=gpu,
                link=link,
                uuid=m.get("uuid"),  # type: ignore[arg-type]
                model=m.get("model"),  # type: ignore[arg-type]
                labels=labels,
                fields=DcgmFields(**values),
            )
        )
    for h, by_field in switch_sxids.items():
        n = sum(len(v) for v in by_field.values())
        if h in carried:
            stats.used += n
            continue
        stats.no_gpu_label += n  # a host without a GPU in the scrape: nothing to carry them
        stats.dropped.extend(
            (f.names[0], f"{h}/{sw[:40]}", "no_gpu_label") for f, seen_sw in by_field.items() for sw, _ in seen_sw
        )
    return records, stats


class ScrapeError(Exception):
    """The exporter did not answer with a usable body; ``reason`` is one of ``httpget.REASONS``
    (``unreadable`` for a saved scrape that cannot be read)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def fetch(url: str, timeout_s: float, cancel: threading.Event | None = None) -> str:
    """GET ``url`` within one overall deadline of ``timeout_s`` (connect, headers, body: a server
    that trickles bytes cannot hold us), at most ``MAX_BODY_BYTES``; ``cancel`` aborts it."""
    try:
        body = httpget.get(url, timeout_s=timeout_s, max_bytes=MAX_BODY_BYTES, cancel=cancel)
    except httpget.FetchError as e:
        raise ScrapeError(e.reason, str(e)) from e
    return _gunzipped(body, url, "protocol").decode("utf-8", "replace")


GZIP_MAGIC = b"\x1f\x8b"  # no Prometheus text starts with it (0x1f is a control character)


def _gunzipped(data: bytes, where: str, reason: str) -> bytes:
    """``data`` itself, or its content if it is gzip (a proxy that compresses although the request
    asked for no encoding, a saved ``.prom.gz``), at most ``MAX_BODY_BYTES`` of it: parsed as text,
    gzip would be an empty scrape whose cause no counter names. A cut gzip gives what it holds
    (the cut last line is dropped as in any cut scrape); a damaged or empty one is a ``ScrapeError``."""
    if not data.startswith(GZIP_MAGIC):
        return data
    out: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest.startswith(GZIP_MAGIC):  # concatenated members are one stream (RFC 1952)
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = d.decompress(rest, MAX_BODY_BYTES + 1 - size)
            out.append(chunk)
            size += len(chunk)
            if size > MAX_BODY_BYTES or d.unconsumed_tail:
                raise ScrapeError("too_large", f"{where}: gzip body larger than {MAX_BODY_BYTES} bytes")
            if not d.eof:
                break
            rest = d.unused_data
    except zlib.error as e:
        raise ScrapeError(reason, f"{where}: damaged gzip body: {e}") from e
    if not size:
        raise ScrapeError(reason, f"{where}: gzip body with nothing in it")
    return b"".join(out)


def read_saved(path: str) -> str:
    """A saved scrape, refused (``ScrapeError``) when unreadable or larger than ``MAX_BODY_BYTES``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BODY_BYTES + 1)
    except OSError as e:
        raise ScrapeError("unreadable", f"{path}: {e}") from e
    if len(data) > MAX_BODY_BYTES:
        raise ScrapeError("too_large", f"{path}: larger than {MAX_BODY_BYTES} bytes")
    # A BOM (an editor's save) is no part of the first name.
    return _gunzipped(data, path, "unreadable").decode("utf-8-sig", "replace")


MAX_KNOWN_GPUS = 65536  # (host, gpu) pairs remembered for missing-GPU reports: a fleet's worth


@dataclass
class ExporterStats:
    scrapes: int = 0
    failures: int = 0  # down, timeout, HTTP error, protocol error (URL); by reason in failure_reasons
    failure_reasons: dict[str, int] = field(default_factory=dict)
    lost_files: int = 0  # saved scrapes that could not be read (--file): input lost
    empty: int = 0  # answered, but no GPU in it
    missing_gpus: int = 0  # GPU-intervals missing that an earlier scrape had
    samples: int = 0
    records: int = 0
    blank: int = 0
    unknown_metric: int = 0
    not_used: int = 0
    no_gpu_label: int = 0
    bad_lines: int = 0
    bad_label: int = 0
    bad_timestamp: int = 0
    duplicate_series: int = 0
    pod_shares: int = 0
    line_too_long: int = 0
    too_many_labels: int = 0
    labels_dropped: int = 0
    loopback_host: int = 0
    mig_records: int = 0
    mig_conflicts: int = 0
    unknown_names: set[str] = field(default_factory=set)

    def counts(self) -> dict[str, int]:
        """What the exit summary, the periodic log line and /metrics show."""
        out = {
            "scrapes": self.scrapes,
            "samples": self.samples,
            "records": self.records,
            # Not a dropped.* key: a stock exporter's own metrics are no input lost and no warning.
            "samples_not_used": self.not_used,
            "mig_records": self.mig_records,
            # Labels past an entity's bound (its series kept); series whose host label was "localhost".
            "labels_dropped": self.labels_dropped,
            "loopback_host_labels": self.loopback_host,
            "mig_conflicts": self.mig_conflicts,
            "scrape_failures": self.failures,
            "empty_scrapes": self.empty,
            "missing_gpus": self.missing_gpus,
            "dropped.unknown_metric": self.unknown_metric,
            "dropped.blank_sentinel": self.blank,
            "dropped.no_gpu_label": self.no_gpu_label,
            "dropped.bad_label": self.bad_label,
            "dropped.bad_timestamp": self.bad_timestamp,
            "dropped.duplicate_series": self.duplicate_series,
            "pod_share_series": self.pod_shares,
            "dropped.line_too_long": self.line_too_long,
            "dropped.too_many_labels": self.too_many_labels,
            "dropped.unparsable_line": self.bad_lines,
            "dropped.unreadable_file": self.lost_files,
        }
        for reason, n in sorted(self.failure_reasons.items()):
            out[f"scrape_failures.{reason}"] = n
        return out


class ExporterSource:
    """Scrapes one dcgm-exporter (``url``), or reads saved scrapes (``files``, one per poll)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        files: list[str] | None = None,
        timeout_s: float = 5.0,
        host: str | None = None,
        clock=time.time,
    ) -> None:
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
        self._cancel = threading.Event()

    def interrupt(self) -> None:
        """Abort a scrape in flight (called from a signal handler: the producer is stopping)."""
        self._cancel.set()

    def _text(self) -> str | None:
        if self.url:
            return fetch(self.url, self.timeout_s, self._cancel)
        path = self.files.pop(0)
        if not self.files:
            self.done = True
        return read_saved(path)

    def poll(self) -> list[DcgmRecord]:
        self.stats.scrapes += 1
        try:
            text = self._text()
        except ScrapeError as e:
            st = self.stats
            if self.url:
                st.failures += 1
                st.failure_reasons[e.reason] = st.failure_reasons.get(e.reason, 0) + 1
            else:
                st.lost_files += 1
            log.warning(
                "dcgm-exporter scrape failed (%d so far, %s): %s; sending nothing, so the engine's "
                "telemetry_gap check sees the silence",
                st.failures + st.lost_files,
                e.reason,
                e,
            )
            return []
        records, ps = parse_metrics(text or "", ts=self.clock(), host=self.host, default_host=self.default_host)
        st = self.stats
        st.samples += ps.samples
        st.records += len(records)
        st.blank += ps.blank
        st.unknown_metric += ps.unknown_metric
        st.not_used += ps.not_used
        st.no_gpu_label += ps.no_gpu_label
        st.bad_lines += ps.bad_lines
        st.bad_label += ps.bad_label
        st.bad_timestamp += ps.bad_timestamp
        st.duplicate_series += ps.duplicate_series
        st.pod_shares += ps.pod_shares
        st.line_too_long += ps.line_too_long
        st.too_many_labels += ps.too_many_labels
        st.labels_dropped += ps.labels_dropped
        if ps.loopback_host and not st.loopback_host:
            log.warning(
                "dcgm-exporter labels its series with a loopback host (localhost, 127.0.0.1, ::1: the "
                "address of its -r hostengine, the same on every node): they are charged to %s; "
                "pass --host to name this host",
                self.default_host,
            )
        st.loopback_host += ps.loopback_host
        st.mig_records += ps.mig_entities
        st.mig_conflicts += ps.mig_conflicts
        if ps.bad_lines:
            log.warning("dcgm-exporter: %d unparseable line(s) skipped (truncated scrape?)", ps.bad_lines)
        odd = {
            "bad_label": ps.bad_label,
            "bad_timestamp": ps.bad_timestamp,
            "duplicate_series": ps.duplicate_series,
            "line_too_long": ps.line_too_long,
            "too_many_labels": ps.too_many_labels,
            "labels_dropped": ps.labels_dropped,
        }
        if any(odd.values()):
            log.warning(
                "dcgm-exporter: series left out (counted as dropped.<reason>): %s",
                ", ".join(f"{k} {v}" for k, v in odd.items() if v),
            )
        new = [n for n in ps.unknown_names if n not in st.unknown_names]
        if new and len(st.unknown_names) < 1000:
            st.unknown_names.update(new)
            log.warning(
                "dcgm-exporter: metric(s) the catalog does not know, left out (counted as dropped.unknown_metric): %s",
                ", ".join(sorted(new)[:20]),
            )
        if ps.no_gpu_label:
            log.debug("dcgm-exporter: %d sample(s) without a gpu label left out", ps.no_gpu_label)
        gpus = {(r.host, r.gpu) for r in records}
        if not gpus:
            self.stats.empty += 1
            log.warning("dcgm-exporter answered with no GPU samples (%d so far)", self.stats.empty)
        missing = self.known - gpus
        if missing and gpus:
            self.stats.missing_gpus += len(missing)
            log.warning(
                "dcgm-exporter lost GPU(s) it reported before: %s",
                ", ".join(f"{h}/gpu{g}" for h, g in sorted(missing)[:50]),
            )
        if len(self.known) < MAX_KNOWN_GPUS:  # host labels come from the exporter: bounded memory
            self.known |= gpus
        return records

    def summary(self) -> dict[str, int]:
        """Scrapes, samples, records, and what was dropped, by reason."""
        return self.stats.counts()

    def close(self) -> None:
        pass
