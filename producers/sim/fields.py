"""DCGM field names, clock-event bits, blank sentinels and per-model constants for the simulator.

The names are the ones dcgm-exporter prints (the pre-4.6 spellings), in the order the simulator
writes them into a record's ``fields``. Keeping the order fixed here is what makes the JSON of a
record byte-stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

# --- clock-event ("throttle") reasons, field 112 (shared/reference/clock_event_reasons.csv) ---
GPU_IDLE = 0x1
CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THERMAL_BITS = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN

# --- DCGM "blank" placeholders that older exporters leak (dcgm_structs.h) ---
BLANK_INT64 = 9223372036854775794  # DCGM_INT64_BLANK (0x7ffffffffffffff0 + 2)
BLANK_FP64 = 140737488355328.0  # DCGM_FP64_BLANK (2**47)

# --- XIDs the simulator emits (shared/data/nvsentinel_xiderrorsmapping.csv) ---
XID_DBE = 48  # double-bit ECC error
XID_REMAP = 63  # row remap recorded
XID_REMAP_FAILED = 64  # row remap failed
XID_NVLINK = 74  # NVLink error
XID_FELL_OFF_BUS = 79  # GPU has fallen off the bus
XID_SBE_RATE = 92  # excessive SBE interrupts
XID_CONTAINED = 94  # contained ECC error: one process dies
XID_UNCONTAINED = 95  # uncontained ECC error: GPU reset needed
XID_GSP_TIMEOUT = 119  # GSP RPC timeout

P = "DCGM_FI_DEV_"

# (name, is_int) in output order: the field catalog's order (pipeline/catalog.py), which is the
# decoder's slot order. msgspec matches JSON keys to Struct fields fastest when they arrive in
# that order (measured: 2.0 vs 4.6 us a record), so every producer writes fields in it.
# Ints are written as JSON ints; doubles are rounded to 3 decimals.
FIELD_SPECS: tuple[tuple[str, bool], ...] = (
    (P + "SM_CLOCK", True),
    (P + "MEM_CLOCK", True),
    (P + "CLOCK_THROTTLE_REASONS", True),
    (P + "MEMORY_TEMP", True),
    (P + "GPU_TEMP", True),
    (P + "MEM_MAX_OP_TEMP", True),
    (P + "GPU_MAX_OP_TEMP", True),
    (P + "SLOWDOWN_TEMP", True),
    (P + "SHUTDOWN_TEMP", True),
    (P + "POWER_USAGE", False),
    (P + "ENFORCED_POWER_LIMIT", False),
    (P + "PCIE_REPLAY_COUNTER", True),
    (P + "GPU_UTIL", True),
    (P + "XID_ERRORS", True),
    (P + "POWER_VIOLATION", True),
    (P + "THERMAL_VIOLATION", True),
    (P + "ECC_SBE_VOL_TOTAL", True),
    (P + "ECC_DBE_VOL_TOTAL", True),
    (P + "ECC_SBE_AGG_TOTAL", True),
    (P + "ECC_DBE_AGG_TOTAL", True),
    (P + "UNCORRECTABLE_REMAPPED_ROWS", True),
    (P + "CORRECTABLE_REMAPPED_ROWS", True),
    (P + "ROW_REMAP_FAILURE", True),
    (P + "ROW_REMAP_PENDING", True),
    (P + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", True),
    (P + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", True),
    (P + "NVLINK_REPLAY_ERROR_COUNT_TOTAL", True),
    (P + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL", True),
    (P + "NVLINK_BANDWIDTH_TOTAL", True),
    ("DCGM_FI_PROF_SM_ACTIVE", False),
)
FIELD_NAMES: tuple[str, ...] = tuple(n for n, _ in FIELD_SPECS)

# Telemetry from producers beside dcgm-exporter, sent when a scenario's fleet runs them
# (``sources``): the PCIe AER counters of ``produce pcie-aer`` and the NVSwitch SXids of
# ``produce kmsg``. Carried on each GPU's DCGM record, after its own fields in catalog order, with
# the values those producers' records carry. All integers. A source whose telemetry comes in records
# of its own (``nic``: the NIC records of ``produce ib-sysfs``, producers/sim/nic.py) adds none.
SOURCE_FIELDS: dict[str, tuple[str, ...]] = {
    "nvswitch": (P + "NVSWITCH_FATAL_ERRORS", P + "NVSWITCH_NON_FATAL_ERRORS"),
    "pcie_aer": (
        "GPUWARDEN_PCIE_AER_DEV_CORRECTABLE",
        "GPUWARDEN_PCIE_AER_DEV_NONFATAL",
        "GPUWARDEN_PCIE_AER_DEV_FATAL",
        "GPUWARDEN_PCIE_AER_UPSTREAM_CORRECTABLE",
        "GPUWARDEN_PCIE_AER_UPSTREAM_NONFATAL",
        "GPUWARDEN_PCIE_AER_UPSTREAM_FATAL",
    ),
    "nic": (),
}
# ``progress``: the ranks' collective progress (``produce ncclras``/``torch-watchdog``), records of
# their own (progress.py) rather than fields.
SOURCE_FIELDS["progress"] = ()
SOURCES: tuple[str, ...] = tuple(SOURCE_FIELDS)
INT_FIELDS: frozenset[str] = frozenset(n for n, is_int in FIELD_SPECS if is_int)

# Counters that only grow; the volatile ones (and the NVLink, PCIe and violation counters, which
# the driver also keeps since load) go back to 0 on a driver reload. Aggregate ECC and remapped
# rows live in the InfoROM and never reset.
VOLATILE_COUNTERS: tuple[str, ...] = (
    P + "ECC_SBE_VOL_TOTAL",
    P + "ECC_DBE_VOL_TOTAL",
    P + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    P + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    P + "NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    P + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    P + "PCIE_REPLAY_COUNTER",
    P + "THERMAL_VIOLATION",
    P + "POWER_VIOLATION",
)
PERSISTENT_COUNTERS: tuple[str, ...] = (
    P + "ECC_SBE_AGG_TOTAL",
    P + "ECC_DBE_AGG_TOTAL",
    P + "UNCORRECTABLE_REMAPPED_ROWS",
    P + "CORRECTABLE_REMAPPED_ROWS",
)


@dataclass(frozen=True)
class GpuModelSpec:
    """What differs between GPU models as far as the telemetry shows it.

    The limits come from the per-model table (``pipeline/data/gpu_models.csv``, with sources);
    ``load_scale`` and ``k_scale`` are the simulator's own physics: training power as a share of
    the H100's, and the cooling's thermal resistance relative to an air-cooled H100 SXM."""

    power_limit_w: float = 700.0  # H100/H200 SXM board power limit
    boost_mhz: int = 1980  # max SM clock
    idle_mhz: int = 345  # SM clock when nothing runs
    clock_step_mhz: int = 15  # SM clocks move in 15 MHz bins
    mem_clock_mhz: int = 2619  # HBM3 on H100 SXM
    slowdown_c: int = 89  # DCGM_FI_DEV_SLOWDOWN_TEMP
    shutdown_c: int = 92  # DCGM_FI_DEV_SHUTDOWN_TEMP
    gpu_max_op_c: int = 87  # DCGM_FI_DEV_GPU_MAX_OP_TEMP
    mem_max_op_c: int = 95  # DCGM_FI_DEV_MEM_MAX_OP_TEMP
    nvlink_busbw_gbs: tuple[float, float] = (395.0, 455.0)  # 8-GPU NVLink all-reduce busbw
    load_scale: float = 1.0  # training power relative to an H100's (585-662 W)
    k_scale: float = 1.0  # thermal resistance relative to an H100 SXM's


_H100 = GpuModelSpec()


class _Physics(TypedDict, total=False):
    """The simulator's own constants that a model overrides (``GpuModelSpec``'s of these names)."""

    load_scale: float
    k_scale: float


# B200: ~1,000 W board (training draws ~840-950 W), liquid-cooled: ~9 °C hotter than an H100 at
# its load rather than the +20 °C its power alone would give through an H100's cold plate.
_PHYSICS: dict[str, _Physics] = {"B200": {"load_scale": 1.43, "k_scale": 0.86}}


def model_spec(model: str) -> GpuModelSpec:
    """The constants for a GPU model name, from the per-model table (H100 SXM for anything
    not in it)."""
    from pipeline.gpu_models import lookup

    row = lookup(model)
    if row is None or row.key == "H100_SXM":
        return _H100
    return GpuModelSpec(
        power_limit_w=row.tdp_w,
        boost_mhz=int(row.max_sm_clock_mhz),
        mem_clock_mhz=int(row.mem_clock_mhz),
        slowdown_c=int(row.slowdown_c),
        shutdown_c=int(row.shutdown_c),
        gpu_max_op_c=int(row.gpu_max_op_c),
        mem_max_op_c=int(row.mem_max_op_c),
        **_PHYSICS.get(row.key, {}),
    )
