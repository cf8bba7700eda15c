"""NVML (``nvidia-ml-py``) -> ``DcgmRecord``s, for hosts without DCGM.

Reads the fields our rules use straight from the driver: temperatures, clocks, clock-event
reasons, power, energy, utilisation, ECC counters, remapped rows, PCIe replays, violation
times, per-NVLink error counters (one record per active link, plus the GPU's totals) and XID
events. A query the GPU does not support leaves that field absent (NaN), never zero.

XIDs come from an NVML event set; like dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` the value is
the most recent XID (0 until one arrives), sticky until the producer restarts.

The module is injected (``nvml=``) so CI runs against a fake; by default ``pynvml`` from
``nvidia-ml-py`` is imported.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable

from pipeline.schema import DcgmFields, DcgmRecord

log = logging.getLogger(__name__)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlSource:
    """Polls every GPU NVML sees; ``poll`` returns one record per GPU and per active NVLink."""

    def __init__(
        self, *, nvml: Any = None, host: str | None = None, clock: Callable[[], float] = time.time, links: bool = True
    ) -> None:
        if nvml is None:
            import pynvml  # nvidia-ml-py

            nvml = pynvml
        self.n = nvml
        self.host = host or socket.gethostname()
        self.clock = clock
        self.links = links
        self.done = False
        self.errors = 0  # GPU-polls skipped: the GPU did not answer (gpu_lost fires)
        self.counts: dict[str, int] = {
            "polls": 0,
            "records": 0,
            "xid_events": 0,
            "unsupported_queries": 0,
            "dropped.gpu_unreadable": 0,
            "dropped.xid_event_error": 0,
        }
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.uuid = [self._try(lambda: _text(nvml.nvmlDeviceGetUUID(h))) for h in self.handles]
        self.model = [self._try(lambda: _text(nvml.nvmlDeviceGetName(h))) for h in self.handles]
        self.xid: list[float] = [float("nan")] * len(self.handles)
        self._events = None
        try:
            es = nvml.nvmlEventSetCreate()
            for i, h in enumerate(self.handles):
                try:
                    nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, es)
                    self.xid[i] = 0.0
                except nvml.NVMLError as e:
                    log.warning("GPU %d: XID events unavailable (%s)", i, e)
            self._events = es
        except nvml.NVMLError as e:
            log.warning("NVML event sets unavailable, no XIDs: %s", e)

    def _try(self, fn: Callable[[], Any]) -> Any:
        """The query's value, or None when this GPU cannot answer it (unsupported, no permission).
        A GPU that is gone raises on: its record must disappear so ``gpu_lost`` fires. ``fn`` runs
        here and now, so the callers' lambdas may read their loop variables without binding them."""
        try:
            return fn()
        except self.n.NVMLError as e:
            if getattr(e, "value", None) == getattr(self.n, "NVML_ERROR_GPU_IS_LOST", object()):
                raise
            self.counts["unsupported_queries"] += 1
            return None

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        n = self.n
        for _ in range(1024):  # bounded: a storm of events cannot hold a poll forever
            try:
                ev = n.nvmlEventSetWait(self._events, 0)
            except n.NVMLError_Timeout:
                return
            except n.NVMLError as e:
                self.counts["dropped.xid_event_error"] += 1
                log.warning("NVML event wait failed: %s", e)
                return
            if ev.eventType & n.nvmlEventTypeXidCriticalError:
                for i, h in enumerate(self.handles):
                    if _same_device(ev.device, h):
                        self.counts["xid_events"] += 1
                        self.xid[i] = float(ev.eventData)
                        log.warning("GPU %d: XID %d", i, ev.eventData)

    def _gpu_fields(self, i: int, h: Any) -> dict[str, float]:
        n, t = self.n, self._try
        f: dict[str, float | None] = {}
        f["DCGM_FI_DEV_GPU_TEMP"] = t(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        mt = t(lambda: n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_MEMORY_TEMP])[0])
        if mt is not None and getattr(mt, "nvmlReturn", 0) == 0:
            f["DCGM_FI_DEV_MEMORY_TEMP"] = _field_value(mt)
        f["DCGM_FI_DEV_SM_CLOCK"] = t(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        f["DCGM_FI_DEV_MEM_CLOCK"] = t(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))
        reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        f["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = t(lambda: reasons(h))
        mw = t(lambda: n.nvmlDeviceGetPowerUsage(h))
        f["DCGM_FI_DEV_POWER_USAGE"] = None if mw is None else mw / 1000.0
        lim = t(lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
        f["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"] = None if lim is None else lim / 1000.0
        f["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = t(lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        util = t(lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            f["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            f["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        for name, err, cnt in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
        ):
            f[name] = t(lambda: n.nvmlDeviceGetTotalEccErrors(h, err, cnt))
        rows = t(lambda: n.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corr, unc, pending, failed = rows
            f["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = corr
            f["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = unc
            f["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1.0 if pending else 0.0
            f["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = 1.0 if failed else 0.0
        f["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = t(lambda: n.nvmlDeviceGetPcieReplayCounter(h))
        for name, policy in (
            ("DCGM_FI_DEV_POWER_VIOLATION", n.NVML_PERF_POLICY_POWER),
            ("DCGM_FI_DEV_THERMAL_VIOLATION", n.NVML_PERF_POLICY_THERMAL),
        ):
            v = t(lambda: n.nvmlDeviceGetViolationStatus(h, policy))
            f[name] = None if v is None else v.violationTime
        f["DCGM_FI_DEV_XID_ERRORS"] = self.xid[i]
        return {k: float(v) for k, v in f.items() if v is not None}

    _LINK_COUNTERS = (
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVML_NVLINK_ERROR_DL_REPLAY"),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVML_NVLINK_ERROR_DL_RECOVERY"),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    )

    def _links(self, h: Any) -> dict[int, dict[str, float]]:
        n = self.n
        out: dict[int, dict[str, float]] = {}
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                state = n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError:
                continue  # no such link on this GPU (or NVLink unsupported): nothing to report
            vals: dict[str, float] = {"DCGM_FI_DEV_NVLINK_GET_STATE": 1.0 if state == n.NVML_FEATURE_ENABLED else 0.0}
            if state == n.NVML_FEATURE_ENABLED:
                for name, const in self._LINK_COUNTERS:
                    v = self._try(lambda: n.nvmlDeviceGetNvLinkErrorCounter(h, link, getattr(n, const)))
                    if v is not None:
                        vals[name] = float(v)
            out[link] = vals
        return out

    def poll(self) -> list[DcgmRecord]:
        self._drain_xids()
        ts = self.clock()
        out = []
        for i, h in enumerate(self.handles):
            try:
                fields = self._gpu_fields(i, h)
            except self.n.NVMLError as e:  # the GPU itself is gone (XID 79): skip, gpu_lost fires
                self.errors += 1
                self.counts["dropped.gpu_unreadable"] += 1
                log.warning("GPU %d unreadable: %s", i, e)
                continue
            links = self._links(h) if self.links else {}
            for name, _ in self._LINK_COUNTERS:
                per = [v[name] for v in links.values() if name in v]
                if per:
                    fields[name] = float(sum(per))
            out.append(
                DcgmRecord(
                    ts=ts, host=self.host, gpu=i, uuid=self.uuid[i], model=self.model[i], fields=DcgmFields(**fields)
                )
            )
            for link, vals in sorted(links.items()):
                out.append(
                    DcgmRecord(
                        ts=ts,
                        host=self.host,
                        gpu=i,
                        link=link,
                        uuid=self.uuid[i],
                        model=self.model[i],
                        fields=DcgmFields(**vals),
                    )
                )
        self.counts["polls"] += 1
        self.counts["records"] += len(out)
        return out

    def summary(self) -> dict[str, int]:
        """Polls, records, XID events, and what was dropped, by reason."""
        return dict(self.counts)

    def close(self) -> None:
        try:
            if self._events is not None:
                self.n.nvmlEventSetFree(self._events)
            self.n.nvmlShutdown()
        except self.n.NVMLError:
            pass


def _same_device(a: Any, b: Any) -> bool:
    """Whether two NVML device handles name one GPU. Real handles are ctypes pointers, which
    compare by object identity, not address: an event's ``device`` is a new object each time."""
    if a is b or a == b:
        return True
    try:
        import ctypes

        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return False


def _field_value(fv: Any) -> float | None:
    """The number inside an ``nvmlFieldValue_t`` (its union member depends on ``valueType``)."""
    vt = getattr(fv, "valueType", 0)
    val = fv.value
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(vt, "uiVal")
    return float(getattr(val, member, val if isinstance(val, (int, float)) else 0))
