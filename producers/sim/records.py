"""DCGM records (docs/architecture.md §3) from a step's arrays, and rare, seeded data-quality noise.

Building the dicts is the expensive part of a run, so columns are turned into Python lists once
per step (``ndarray.tolist``) and stored into copies of a template ``fields`` dict.
"""

from __future__ import annotations

from itertools import repeat
from typing import Callable

import numpy as np

from .fields import BLANK_FP64, BLANK_INT64, FIELD_NAMES, INT_FIELDS, SOURCE_FIELDS, GpuModelSpec
from .fleet import FleetState, StepOut


def _dcgm46_names() -> dict[str, str]:
    """Pre-4.6 exporter name -> DCGM 4.6 canonical name, for the fields that were renamed
    (the field catalog's CSV, a copy of shared/reference/dcgm_field_ids_subset.csv)."""
    import csv
    from importlib import resources

    with (resources.files("pipeline") / "data" / "dcgm_fields.csv").open() as fh:
        return {
            r["name_used_by_dcgm_exporter"]: r["canonical_name_dcgm_4_6_if_renamed"]
            for r in csv.DictReader(fh)
            if r["canonical_name_dcgm_4_6_if_renamed"]
        }


FIELD_NAMES_46: dict[str, str] = {n: _dcgm46_names().get(n, n) for n in FIELD_NAMES}


def _name_46(name: str) -> str:
    """A field's DCGM 4.6 spelling (the source fields' names did not change)."""
    return FIELD_NAMES_46.get(name, name)


def _same(name: str) -> str:
    return name


class DcgmBuilder:
    """Makes the DCGM records of one step for the GPUs that report."""

    def __init__(
        self,
        fleet: FleetState,
        spec: GpuModelSpec,
        host_names: list[str],
        uuids: list[str],
        model: str,
        cluster: str,
        job: str,
        host_kinds: list[tuple[str, GpuModelSpec, bool]] | None = None,
        sources: tuple[str, ...] = (),
    ) -> None:
        """``host_kinds``: per host (model name, spec, DCGM 4.6 field names?); default: every
        host ``model``/``spec`` with the pre-4.6 names. ``sources``: the producers beside
        dcgm-exporter whose fields the records carry (``fields.SOURCE_FIELDS``)."""
        self.fleet = fleet
        self.sources = sources
        # In SOURCE_FIELDS' order whatever the order given: the catalog's, which msgspec reads fastest.
        extra = tuple(n for src, names in SOURCE_FIELDS.items() if src in sources for n in names)
        kinds = host_kinds or [(model, spec, False)] * len(host_names)
        uniq = list(dict.fromkeys(kinds))
        self.kind_of_gpu = np.repeat(np.array([uniq.index(k) for k in kinds]), fleet.G)
        self.kinds = [DcgmBuilder._Kind(m, sp, new, extra) for m, sp, new in uniq]
        self.host_of_gpu = [host_names[h] for h in fleet.host_of.tolist()]
        self.gpu_local = fleet.gpu_of.tolist()
        self.uuids = uuids
        self.model, self.cluster, self.job = model, cluster, job
        # Constant fields live in the template; every record's ``fields`` starts as a copy of it
        # (copying a dict clones its hash table, far cheaper than inserting 30 keys), then the
        # varying columns are stored column by column. Key order is FIELD_NAMES either way.

    class _Kind:
        """One GPU model with one exporter's field names: its record template."""

        def __init__(self, model: str, spec: GpuModelSpec, dcgm46: bool, extra: tuple[str, ...] = ()) -> None:
            self.model = model
            self.name: Callable[[str], str] = _name_46 if dcgm46 else _same
            static = {
                "DCGM_FI_DEV_MEM_CLOCK": spec.mem_clock_mhz,
                "DCGM_FI_DEV_SLOWDOWN_TEMP": spec.slowdown_c,
                "DCGM_FI_DEV_SHUTDOWN_TEMP": spec.shutdown_c,
                "DCGM_FI_DEV_GPU_MAX_OP_TEMP": spec.gpu_max_op_c,
                "DCGM_FI_DEV_MEM_MAX_OP_TEMP": spec.mem_max_op_c,
            }
            self.template = {self.name(n): static.get(n, 0) for n in (*FIELD_NAMES, *extra)}

    def build(self, ts: float, out: StepOut, idx: np.ndarray) -> list[dict]:
        """Records for the GPUs in ``idx`` (global indices, ascending = host-major order)."""
        if len(self.kinds) == 1:
            return self._build(ts, out, idx, self.kinds[0])
        recs: list[dict] = [None] * len(idx)  # type: ignore[list-item]
        kind = self.kind_of_gpu[idx]
        for k, kd in enumerate(self.kinds):
            pos = np.flatnonzero(kind == k)
            if len(pos):
                for p, r in zip(pos.tolist(), self._build(ts, out, idx[pos], kd)):
                    recs[p] = r
        return recs

    def _build(self, ts: float, out: StepOut, idx: np.ndarray, kd: "DcgmBuilder._Kind") -> list[dict]:
        f = self.fleet
        nm = kd.name
        m = len(idx)
        all_rows = m == f.N
        P = "DCGM_FI_DEV_"
        columns: tuple[tuple[str, np.ndarray], ...] = (
            (P + "GPU_TEMP", out.temp),
            (P + "MEMORY_TEMP", out.mem_temp),
            (P + "SM_CLOCK", out.sm_clock),
            (P + "POWER_USAGE", out.power),
            (P + "ENFORCED_POWER_LIMIT", out.limit),
            (P + "GPU_UTIL", out.util),
            (P + "CLOCK_THROTTLE_REASONS", out.reasons),
            (P + "THERMAL_VIOLATION", f.therm_ns),
            (P + "POWER_VIOLATION", f.power_ns),
            (P + "ECC_SBE_VOL_TOTAL", f.sbe_vol),
            (P + "ECC_DBE_VOL_TOTAL", f.dbe_vol),
            (P + "ECC_SBE_AGG_TOTAL", f.sbe_agg),
            (P + "ECC_DBE_AGG_TOTAL", f.dbe_agg),
            (P + "ROW_REMAP_PENDING", f.remap_pending),
            (P + "ROW_REMAP_FAILURE", f.remap_failure),
            (P + "UNCORRECTABLE_REMAPPED_ROWS", f.rows_unc),
            (P + "CORRECTABLE_REMAPPED_ROWS", f.rows_corr),
            (P + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", f.crc_flit),
            (P + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", f.crc_data),
            (P + "NVLINK_REPLAY_ERROR_COUNT_TOTAL", f.replay),
            (P + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL", f.recovery),
            (P + "NVLINK_BANDWIDTH_TOTAL", out.nvlink_bw),
            (P + "XID_ERRORS", f.xid),
            (P + "PCIE_REPLAY_COUNTER", f.pcie_replay),
            ("DCGM_FI_PROF_SM_ACTIVE", out.sm_active),
        )
        if "nvswitch" in self.sources:
            columns += ((P + "NVSWITCH_FATAL_ERRORS", f.sxid_fatal), (P + "NVSWITCH_NON_FATAL_ERRORS", f.sxid_nonfatal))
        if "pcie_aer" in self.sources:
            A = "GPUWARDEN_PCIE_AER_"
            columns += (
                (A + "DEV_CORRECTABLE", f.aer_cor),
                (A + "DEV_NONFATAL", f.aer_nonfatal),
                (A + "DEV_FATAL", f.aer_fatal),
                (A + "UPSTREAM_CORRECTABLE", f.aer_up_cor),
                (A + "UPSTREAM_NONFATAL", f.aer_up_nonfatal),
                (A + "UPSTREAM_FATAL", f.aer_up_fatal),
            )
        # Most columns are constant across the fleet apart from a few GPUs (clocks at boost,
        # error counters at 0, one XID): put the common value in this step's template and store
        # only the exceptions. Only the genuinely varying columns are stored for every record.
        tmpl = kd.template.copy()
        dense: list[tuple[str, list]] = []
        sparse: list[tuple[str, np.ndarray, np.ndarray]] = []
        for name, arr in columns:
            name = nm(name)
            a = arr if all_rows else arr[idx]
            if m == 0:
                continue
            base = a[0]
            diff = a != base
            k = int(np.count_nonzero(diff))
            if k > m // 4 and base != 0:
                diff = a != 0
                k2 = int(np.count_nonzero(diff))
                if k2 < k:
                    base, k = a.dtype.type(0), k2
                else:
                    diff = a != base
            if k > m // 4:
                dense.append((name, a.tolist()))
            else:
                tmpl[name] = base.item()
                if k:
                    pos = np.flatnonzero(diff)
                    sparse.append((name, pos, a[pos]))
        fields = list(map(dict.copy, repeat(tmpl, m)))
        for name, values in dense:
            for d, v in zip(fields, values):
                d[name] = v
        for name, pos, vals in sparse:
            for i, v in zip(pos.tolist(), vals.tolist()):
                fields[i][name] = v
        model, cluster, job = kd.model, self.cluster, self.job
        hosts, gpus, uuids = self.host_of_gpu, self.gpu_local, self.uuids
        return [
            {
                "v": 1,
                "kind": "dcgm",
                "ts": ts,
                "host": hosts[i],
                "gpu": gpus[i],
                "uuid": uuids[i],
                "model": model,
                "labels": {"cluster": cluster, "job": job},
                "fields": fd,
            }
            for i, fd in zip(idx.tolist(), fields)
        ]


def add_noise(recs: list[dict], rng: np.random.Generator, blank_rate: float, missing_rate: float) -> None:
    """Now and then put DCGM's blank sentinel in a field, or leave a field out (in place)."""
    n = len(recs)
    if not n:
        return
    nf = len(FIELD_NAMES)
    for rate, blank in ((blank_rate, True), (missing_rate, False)):
        k = int(rng.binomial(n, rate)) if rate > 0 else 0
        if not k:
            continue
        which = rng.integers(0, n, k).tolist()
        fields = rng.integers(0, nf, k).tolist()
        for r, fi in zip(which, fields):
            name = FIELD_NAMES[fi]
            flds = recs[r]["fields"]
            if name not in flds:
                continue
            if blank:
                flds[name] = BLANK_INT64 if name in INT_FIELDS else BLANK_FP64
            else:
                del flds[name]
