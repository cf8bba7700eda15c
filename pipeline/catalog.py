"""The field catalog: alias <-> DCGM field names (pre-4.6 and 4.6) <-> field id <-> unit <-> kind.

The ids and both spellings come from ``data/dcgm_fields.csv``, a copy of
``shared/reference/dcgm_field_ids_subset.csv`` (derived from DCGM 4.6's ``dcgm_fields.h``);
what the project adds -- the short alias rules use, the unit, whether the value is a gauge,
a counter, a bitmask or a sticky code, and which values are impossible -- lives in
``_SEMANTICS`` below, keyed by field id so a DCGM rename cannot desynchronise the two.

``data/dcgm_exporter_fields.csv`` (same columns) adds the metrics dcgm-exporter computes itself,
which DCGM has no field for, with dcgm-exporter's own ids (``ExporterCounter`` in its
``internal/pkg/counters/exporter_counters.go``: ``DCGM_EXP_XID_ERRORS_COUNT`` is 9001), and
``data/dcgm_fields_extra.csv`` DCGM fields the shared subset lacks, from DCGM's ``dcgm_fields.h``
(the NVSwitch SXid fields 856/857 the kernel-log producer sends), and ``data/host_fields.csv``
what gpuwarden's own producers read from the host where DCGM has no field (the PCIe AER counters
of sysfs, ids from 9501; the kernel-log and fabric-manager event counters, 9510-9523, and the
kernel log's fatal hardware error records of the previous boot (BERT), 9524;
``GPUWARDEN_`` names). That file is read last, so its fields take the
last columns and an engine snapshot from before them restores with those columns empty.

Every known field gets a dense column index; the engine stores per-entity values in arrays
with one column per field, so a rule's ``gpu_temp`` is one column lookup, never a dict walk.

>>> FIELDS.by_name("DCGM_FI_DEV_GPU_TEMP_CELSIUS").alias
'gpu_temp'
>>> FIELDS.by_name("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") is FIELDS.by_alias("clocks_event_reasons")
True
"""

from __future__ import annotations

import csv
import difflib
from dataclasses import dataclass
from importlib import resources
from typing import Iterator

GAUGE = "gauge"
COUNTER = "counter"  # only grows; a drop is a reset (driver reload)
BITMASK = "bitmask"  # clock-event reasons
CODE = "code"  # a sticky last value (XID): compare with changed(), not rate()
STATE = "state"  # small enumerations / flags (remap pending, pstate)

# field id -> (alias, unit, kind, lower bound of possible values or None)
_SEMANTICS: dict[int, tuple[str, str, str, float | None]] = {
    64: ("nvlink_p2p_status", "", STATE, 0),
    100: ("sm_clock", "MHz", GAUGE, 0),
    101: ("mem_clock", "MHz", GAUGE, 0),
    110: ("app_sm_clock", "MHz", GAUGE, 0),
    112: ("clocks_event_reasons", "", BITMASK, 0),
    113: ("max_sm_clock", "MHz", GAUGE, 0),
    140: ("memory_temp", "C", GAUGE, -40),
    150: ("gpu_temp", "C", GAUGE, -40),
    151: ("memory_max_op_temp", "C", GAUGE, 0),
    152: ("gpu_max_op_temp", "C", GAUGE, 0),
    153: ("gpu_temp_margin", "C", GAUGE, None),  # margin to slowdown: negative means past it
    155: ("power", "W", GAUGE, 0),
    156: ("energy", "mJ", COUNTER, 0),
    157: ("power_instant", "W", GAUGE, 0),
    158: ("slowdown_temp", "C", GAUGE, 0),
    159: ("shutdown_temp", "C", GAUGE, 0),
    160: ("power_limit", "W", GAUGE, 0),
    164: ("enforced_power_limit", "W", GAUGE, 0),
    190: ("pstate", "", STATE, 0),
    202: ("pcie_replays", "", COUNTER, 0),
    203: ("gpu_util", "%", GAUGE, 0),
    204: ("mem_copy_util", "%", GAUGE, 0),
    230: ("xid", "", CODE, 0),
    237: ("pcie_link_gen", "", STATE, 0),
    238: ("pcie_link_width", "", STATE, 0),
    240: ("power_violation", "ns", COUNTER, 0),
    241: ("thermal_violation", "ns", COUNTER, 0),
    242: ("sync_boost_violation", "ns", COUNTER, 0),
    243: ("board_limit_violation", "ns", COUNTER, 0),
    244: ("low_util_violation", "ns", COUNTER, 0),
    245: ("reliability_violation", "ns", COUNTER, 0),
    250: ("fb_total", "MiB", GAUGE, 0),
    251: ("fb_free", "MiB", GAUGE, 0),
    252: ("fb_used", "MiB", GAUGE, 0),
    310: ("ecc_sbe_volatile", "", COUNTER, 0),
    311: ("ecc_dbe_volatile", "", COUNTER, 0),
    312: ("ecc_sbe_aggregate", "", COUNTER, 0),
    313: ("ecc_dbe_aggregate", "", COUNTER, 0),
    390: ("retired_pages_sbe", "", COUNTER, 0),
    391: ("retired_pages_dbe", "", COUNTER, 0),
    392: ("retired_pages_pending", "", STATE, 0),
    393: ("remapped_rows_uncorrectable", "", COUNTER, 0),
    394: ("remapped_rows_correctable", "", COUNTER, 0),
    395: ("row_remap_failure", "", STATE, 0),
    396: ("row_remap_pending", "", STATE, 0),
    400: ("nvlink_crc_flit_errors_l0", "", COUNTER, 0),
    409: ("nvlink_crc_flit_errors", "", COUNTER, 0),
    419: ("nvlink_crc_data_errors", "", COUNTER, 0),
    429: ("nvlink_replay_errors", "", COUNTER, 0),
    439: ("nvlink_recovery_errors", "", COUNTER, 0),
    440: ("nvlink_bandwidth_l0", "MB/s", GAUGE, 0),
    # DCGM gives BW_MBPS as the unit: a throughput, so a gauge (a sag is a finding, not a reset).
    449: ("nvlink_bandwidth", "MB/s", GAUGE, 0),
    450: ("nvlink_errors", "", COUNTER, 0),
    1001: ("gr_engine_active", "ratio", GAUGE, 0),
    1002: ("sm_active", "ratio", GAUGE, 0),
    1004: ("tensor_active", "ratio", GAUGE, 0),
    1005: ("dram_active", "ratio", GAUGE, 0),
    1009: ("pcie_tx_bytes", "B/s", GAUGE, 0),
    1010: ("pcie_rx_bytes", "B/s", GAUGE, 0),
    1011: ("nvlink_tx_bytes", "B/s", GAUGE, 0),
    1012: ("nvlink_rx_bytes", "B/s", GAUGE, 0),
    1420: ("power_cap_ns", "ns", COUNTER, 0),
    1421: ("sync_boost_ns", "ns", COUNTER, 0),
    1422: ("sw_thermal_ns", "ns", COUNTER, 0),
    1423: ("hw_thermal_ns", "ns", COUNTER, 0),
    1424: ("hw_power_brake_ns", "ns", COUNTER, 0),
    1508: ("nvlink_state", "", STATE, 0),
    # An NVSwitch's last SXid (DCGM's value is "the specific SXid reported"), fatal and non-fatal.
    # DCGM reports them per switch; records carry them on every GPU of the switch's host
    # (docs/architecture.md §3), the way the kernel-log producer reads them.
    856: ("nvswitch_fatal_sxid", "", CODE, 0),
    857: ("nvswitch_nonfatal_sxid", "", CODE, 0),
    # dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: XIDs reported within its window (--xid-count-window-size,
    # label window_size_in_ms), all codes together; it falls as events leave the window: a gauge.
    9001: ("xid_count", "", GAUGE, 0),
    # PCIe Advanced Error Reporting (producers/pcie_aer.py): the kernel's per-device totals of
    # errors seen (sysfs aer_dev_*; docs/producers.md#pcie-aer), the GPU's own and those of the
    # bridges between it and its root port, which often see an endpoint's errors first.
    9501: ("pcie_aer_correctable", "", COUNTER, 0),
    9502: ("pcie_aer_nonfatal", "", COUNTER, 0),
    9503: ("pcie_aer_fatal", "", COUNTER, 0),
    9504: ("pcie_aer_upstream_correctable", "", COUNTER, 0),
    9505: ("pcie_aer_upstream_nonfatal", "", COUNTER, 0),
    9506: ("pcie_aer_upstream_fatal", "", COUNTER, 0),
    # Events read from the kernel log and the fabric manager's log (producers/kmsg_fabric.py,
    # producers/fabric_manager.py; docs/producers.md#kernel-log): lines counted since the producer
    # started, per host and carried on every GPU record of the host (docs/architecture.md §3), so
    # a producer restart is a counter reset and increase() gives a rate the sticky SXid code cannot.
    9510: ("nvswitch_fatal_sxids", "", COUNTER, 0),
    9511: ("nvswitch_nonfatal_sxids", "", COUNTER, 0),
    9512: ("nic_link_down_events", "", COUNTER, 0),
    9513: ("nic_module_errors", "", COUNTER, 0),
    9514: ("nic_health_errors", "", COUNTER, 0),
    9515: ("pcie_aer_log_correctable", "", COUNTER, 0),
    9516: ("pcie_aer_log_nonfatal", "", COUNTER, 0),
    9517: ("pcie_aer_log_fatal", "", COUNTER, 0),
    9518: ("nic_driver_warnings", "", COUNTER, 0),
    9519: ("nccl_crashes", "", COUNTER, 0),
    9520: ("fm_nvswitch_fatal_errors", "", COUNTER, 0),
    9521: ("fm_nvswitch_nonfatal_errors", "", COUNTER, 0),
    9522: ("fm_nvlink_errors", "", COUNTER, 0),
    9523: ("fm_errors", "", COUNTER, 0),
    # The kernel log's fatal error records of the previous boot, as firmware's Boot Error Record
    # Table printed them at this boot (producers/kmsg_fabric.py, bert.c): one per CPER record.
    9524: ("host_fatal_errors_previous_boot", "", COUNTER, 0),
}

# Extra short names people type (and older dashboards use).
_EXTRA_ALIASES = {
    "throttle_reasons": "clocks_event_reasons",
    "temp": "gpu_temp",
    "power_usage": "power",
    "util": "gpu_util",
    "ecc_sbe_vol": "ecc_sbe_volatile",
    "ecc_dbe_vol": "ecc_dbe_volatile",
    "xid_errors": "xid",
}

# DCGM "blank" placeholders (dcgm_structs.h): values at or above these are not data.
BLANK_INT64 = float(0x7FFFFFFFFFFFFFF0)  # == 2**63 once a JSON number becomes a float
BLANK_INT32 = float(0x7FFFFFF0)
BLANK_FP64 = 140737488355328.0  # 2**47


@dataclass(frozen=True, slots=True)
class Field:
    """One telemetry field: every name it goes by and how to read its values."""

    column: int
    alias: str
    field_id: int
    names: tuple[str, ...]  # exporter name first, then the DCGM 4.6 canonical name if renamed
    dcgm_type: str  # INT64 / DOUBLE
    unit: str
    kind: str
    min_value: float | None
    dmon_name: str

    @property
    def blank_threshold(self) -> float:
        return BLANK_FP64 if self.dcgm_type == "DOUBLE" else BLANK_INT64

    @property
    def is_counter(self) -> bool:
        return self.kind == COUNTER


@dataclass(frozen=True, slots=True)
class Bit:
    name: str  # HW_THERMAL
    mask: int  # 0x40
    label: str  # dcgm-exporter's label, hw_thermal
    meaning: str


class Catalog:
    """Lookup of fields by any of their names, alias or id."""

    def __init__(self, fields: list[Field], bits: list[Bit]) -> None:
        self.fields = fields
        self.bits = {b.name: b for b in bits}
        self._by_name: dict[str, Field] = {}
        self._by_alias: dict[str, Field] = {}
        self._by_id: dict[int, Field] = {}
        self._by_dmon: dict[str, Field] = {}
        for f in fields:
            for n in f.names:
                self._by_name[n] = f
            self._by_alias[f.alias] = f
            self._by_id[f.field_id] = f
            if f.dmon_name:
                self._by_dmon.setdefault(f.dmon_name, f)
        for extra, target in _EXTRA_ALIASES.items():
            self._by_alias[extra] = self._by_alias[target]

    def __len__(self) -> int:
        return len(self.fields)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def by_name(self, name: str) -> Field | None:
        """A field by its DCGM name (either spelling)."""
        return self._by_name.get(name)

    def by_alias(self, alias: str) -> Field | None:
        """A field by its alias (``gpu_temp``); None for an unknown one (a name from input)."""
        return self._by_alias.get(alias)

    def require(self, alias: str) -> Field:
        """A field the code itself names by alias: an unknown one is a bug, so ``KeyError``.

        >>> FIELDS.require("xid").names[0]
        'DCGM_FI_DEV_XID_ERRORS'
        """
        return self._by_alias[alias]

    def by_id(self, field_id: int) -> Field | None:
        return self._by_id.get(field_id)

    def by_dmon(self, short: str) -> Field | None:
        return self._by_dmon.get(short)

    def resolve(self, name: str) -> Field | None:
        """A field by alias, DCGM name (either spelling) or numeric id, whichever ``name`` is."""
        if name.isdigit():
            return self._by_id.get(int(name))
        return self._by_alias.get(name) or self._by_name.get(name)

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """Closest known names, for a "did you mean" answer."""
        pool = list(self._by_alias) + list(self._by_name)
        return difflib.get_close_matches(name, pool, n=n, cutoff=0.6)

    @property
    def all_names(self) -> list[str]:
        """Every DCGM spelling in catalog order; the decoder's typed ``fields`` has one slot each."""
        return [n for f in self.fields for n in f.names]


def _load() -> Catalog:
    data = resources.files("pipeline") / "data"
    rows: dict[int, dict[str, str]] = {}
    renames: dict[int, list[str]] = {}
    with (
        (data / "dcgm_fields.csv").open() as fh,
        (data / "dcgm_exporter_fields.csv").open() as fx,
        (data / "dcgm_fields_extra.csv").open() as fe,
        (data / "host_fields.csv").open() as fo,
    ):
        for row in [*csv.DictReader(fh), *csv.DictReader(fx), *csv.DictReader(fe), *csv.DictReader(fo)]:
            fid = int(row["field_id"])
            name = row["name_used_by_dcgm_exporter"]
            canon = row["canonical_name_dcgm_4_6_if_renamed"]
            if canon and fid in rows and rows[fid]["name_used_by_dcgm_exporter"] == canon:
                # The 4.6 name was listed first; keep the exporter's (older) one in front.
                renames[fid].insert(0, name)
                continue
            rows.setdefault(fid, row)
            names = renames.setdefault(fid, [])
            for n in (name, canon):
                if n and n not in names:
                    names.append(n)
    fields: list[Field] = []
    for fid, row in rows.items():
        if fid not in _SEMANTICS:
            continue  # strings such as the driver version: labels, not telemetry
        alias, unit, kind, lo = _SEMANTICS[fid]
        fields.append(
            Field(
                column=len(fields),
                alias=alias,
                field_id=fid,
                names=tuple(renames[fid]),
                dcgm_type=row["type"],
                unit=unit,
                kind=kind,
                min_value=lo,
                dmon_name=row["dmon_short_name"],
            )
        )
    bits = []
    with (data / "clock_event_reasons.csv").open() as fh:
        for row in csv.DictReader(fh):
            name = row["dcgm_macro"].removeprefix("DCGM_CLOCKS_EVENT_REASON_")
            bits.append(Bit(name, int(row["bit_hex"], 16), row["dcgm_exporter_clock_event_label"], row["meaning"]))
    return Catalog(fields, bits)


FIELDS = _load()
