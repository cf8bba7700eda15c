"""NVML (``nvidia-ml-py``) -> ``DcgmRecord``s, for hosts without DCGM.

Reads the fields our rules use straight from the driver: temperatures, clocks, clock-event
reasons, power, energy, utilisation, ECC counters, remapped rows, PCIe replays, violation
times, per-NVLink error counters (one record per link NVML reports, down ones included, plus the
GPU's totals) and XID events. A query the GPU does not support leaves that field absent (NaN),
never zero.

A GPU that does not answer is not sent that poll, so ``gpu_lost`` fires: no handle yet (asked
for again each poll, so a GPU that answers later is read from then on), ``GPU_IS_LOST`` or
``RESET_REQUIRED`` from any query (its NVLink state queries included), or no query answered at all
(``Unknown Error`` on every call). Any other error, an exception that is not ``NVMLError``, or a
value that is not a finite number costs only its field (counted ``unsupported_queries``). A link
whose counter read fails keeps its last count in the GPU's total, so the total never dips.
Deprecated calls are tried newest first and fall back when the driver lacks them (clock-event
reasons before r535, ``nvmlDeviceGetTemperature`` once CUDA 14 drivers remove it).

XIDs come from an NVML event set; like dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` the value is
the most recent XID (0 until one arrives), sticky until the producer restarts.

The module is injected (``nvml=``) so CI runs against a fake; by default ``pynvml`` from
``nvidia-ml-py`` is imported.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from typing import Any, Callable

from pipeline.schema import DcgmFields, DcgmRecord

log = logging.getLogger(__name__)

# The GPU itself is not answering: fallen off the bus, or it needs a reset (gpud's IsGPULostError /
# IsGPURequiresReset, leptonai/gpud pkg/nvidia/errors/error.go).
_GPU_GONE = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")
# The driver lacks the function (older than the bindings) or has removed it (CUDA 14 removals return DEPRECATED).
# A driver that has the function but not the struct version the bindings ask for answers
# ARGUMENT_VERSION_MISMATCH: the older call still works there.
_NO_FUNCTION = ("NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_DEPRECATED", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")


# A healthy poll of 8 GPUs and their links is ~1,000 NVML calls, well under a second; NVML's own
# slowest answers (a power reading's first call) take ~1 s.
POLL_DEADLINE_S = 30.0


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlSource:
    """Polls every GPU NVML sees; ``poll`` returns one record per GPU and per NVLink it reports."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        links: bool = True,
        deadline_s: float = POLL_DEADLINE_S,
    ) -> None:
        """``deadline_s``: how long a poll waits for NVML before it counts the driver hung."""
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
            "dropped.poll_hung": 0,
        }
        self.deadline_s = deadline_s
        self._stuck: threading.Thread | None = None  # the poll whose NVML call has not returned
        self._gone = {getattr(nvml, k) for k in _GPU_GONE if hasattr(nvml, k)}
        self._missing = {getattr(nvml, k) for k in _NO_FUNCTION if hasattr(nvml, k)}
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        self.handles: list[Any] = [None] * count
        self.uuid: list[str | None] = [None] * count
        self.model: list[str | None] = [None] * count
        self.xid: list[float] = [float("nan")] * count
        # Per GPU, the last value each (link, counter) gave: a link that misses one read keeps its
        # last count in the GPU's total, so the total never dips and jumps back (a false increase).
        self._link_last: list[dict[tuple[int, str], float]] = [{} for _ in range(count)]
        self._warned: set[str] = set()
        self._events = None
        try:
            self._events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.warning("NVML event sets unavailable, no XIDs: %s", e)
        for i in range(count):
            if not self._attach(i):
                log.warning("GPU %d: no NVML handle yet; not sent until it answers", i)

    def _attach(self, i: int) -> bool:
        """Get GPU ``i``'s handle, name and UUID and register it for XID events; False while it has
        no handle (off the bus, "Unknown Error"): tried again each poll, the others are still read."""
        nvml = self.n
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as e:  # noqa: BLE001 - any failure leaves this GPU unread, never the others
            log.debug("GPU %d: no NVML handle (%s)", i, e)
            return False
        self.handles[i] = h
        self.uuid[i] = _ident(nvml, lambda: _text(nvml.nvmlDeviceGetUUID(h)))
        self.model[i] = _ident(nvml, lambda: _text(nvml.nvmlDeviceGetName(h)))
        if self._events is not None:
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self._events)
                self.xid[i] = 0.0
            except nvml.NVMLError as e:
                log.warning("GPU %d: XID events unavailable (%s)", i, e)
        return True

    def _unexpected(self, e: Exception) -> None:
        """Count and log (once per kind) a query that raised something other than ``NVMLError``."""
        self.counts["unsupported_queries"] += 1
        kind = type(e).__name__
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("NVML query raised %s (%s): its field is absent", kind, e)

    def _try(self, fn: Callable[[], Any]) -> Any:
        """The query's value, or None when this GPU cannot answer it (unsupported, no permission).
        A GPU that is gone (``_GPU_GONE``) raises on: its record must disappear so ``gpu_lost`` fires.
        ``fn`` runs here and now, so the callers' lambdas may read their loop variables without
        binding them."""
        try:
            v = fn()
            if v is None:
                raise TypeError("the binding returned None")
            return v
        except self.n.NVMLError as e:
            if getattr(e, "value", None) in self._gone:
                raise
            self.counts["unsupported_queries"] += 1
            return None
        except Exception as e:  # noqa: BLE001 - a wrapper's ctypes or type error costs its field, not the poll
            self._unexpected(e)
            return None

    def _newest(self, names: tuple[str, ...], *args: Any) -> Any:
        """Call the first of ``names`` (newest NVML API first) that both the bindings and the driver
        have: a driver older than the API, or one that removed the old one, answers ``_NO_FUNCTION``."""
        fns = [getattr(self.n, k) for k in names if hasattr(self.n, k)]
        for fn in fns[:-1]:
            try:
                return fn(*args)
            except self.n.NVMLError as e:
                if getattr(e, "value", None) not in self._missing:
                    raise
        return fns[-1](*args)

    def _field(self, fv: Any) -> Any:
        """An ``nvmlFieldValue_t`` itself, or None: each value carries its own ``nvmlReturn``, which
        ``nvmlDeviceGetFieldValues``' return does not cover (pynvml checks only the call's)."""
        ret = getattr(fv, "nvmlReturn", 0)
        if ret in self._gone:
            raise self.n.NVMLError(ret)
        if ret != 0:
            self.counts["unsupported_queries"] += 1
            return None
        return fv

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        n = self.n
        for _ in range(1024):  # bounded: a storm of events cannot hold a poll forever
            try:
                ev = n.nvmlEventSetWait(self._events, 0)
                if not ev.eventType & n.nvmlEventTypeXidCriticalError:
                    continue
                xid = float(ev.eventData)
                gpus = [i for i, h in enumerate(self.handles) if h is not None and _same_device(ev.device, h)]
            except n.NVMLError_Timeout:
                return
            except Exception as e:  # noqa: BLE001 - NVML's errors and a malformed event alike cost the wait, not the poll
                self.counts["dropped.xid_event_error"] += 1
                log.warning("NVML event wait failed: %s", e)
                return
            for i in gpus:
                self.counts["xid_events"] += 1
                self.xid[i] = xid
                log.warning("GPU %d: XID %d", i, xid)

    def _gpu_fields(self, i: int, h: Any) -> dict[str, float] | None:
        n, t = self.n, self._try
        f: dict[str, Any] = {}
        temp = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")  # the latter removed in CUDA 14
        f["DCGM_FI_DEV_GPU_TEMP"] = t(lambda: self._newest(temp, h, n.NVML_TEMPERATURE_GPU))
        ids = [n.NVML_FI_DEV_MEMORY_TEMP, n.NVML_FI_DEV_PERF_POLICY_POWER, n.NVML_FI_DEV_PERF_POLICY_THERMAL]
        fvs = t(lambda: _exactly(n.nvmlDeviceGetFieldValues(h, ids), len(ids))) or [None] * len(ids)
        mt, pviol, tviol = (None if fv is None else self._field(fv) for fv in fvs)
        # Memory temperature is the uiVal whatever valueType says: r545 drivers label it double
        # (DCGM's workaround, NVIDIA/DCGM dcgmlib/src/DcgmCacheManager.cpp, nvbugs/4300930).
        if mt is not None:
            f["DCGM_FI_DEV_MEMORY_TEMP"] = t(lambda: _hbm_temp(mt))
        f["DCGM_FI_DEV_SM_CLOCK"] = t(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        f["DCGM_FI_DEV_MEM_CLOCK"] = t(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))
        reasons = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")  # r535 rename
        f["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = t(lambda: self._newest(reasons, h))
        # mW -> W (nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit)
        f["DCGM_FI_DEV_POWER_USAGE"] = t(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0)
        f["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"] = t(lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
        f["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = t(lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        util = t(lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            f["DCGM_FI_DEV_GPU_UTIL"] = t(lambda: util.gpu)
            f["DCGM_FI_DEV_MEM_COPY_UTIL"] = t(lambda: util.memory)
        for name, err, cnt in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
        ):
            f[name] = t(lambda: n.nvmlDeviceGetTotalEccErrors(h, err, cnt))
        rows = t(lambda: _exactly(n.nvmlDeviceGetRemappedRows(h), 4))  # corr, unc, isPending, failureOccurred
        if rows is not None:
            corr, unc, pending, failed = rows
            f["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = corr
            f["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = unc
            f["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1.0 if pending else 0.0
            f["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = 1.0 if failed else 0.0
        f["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = t(lambda: n.nvmlDeviceGetPcieReplayCounter(h))
        # Violation time (ns) from field values, as DCGM maps 240/241 (dcgmlib/src/dcgm_fields.cpp):
        # nvmlDeviceGetViolationStatus is deprecated in CUDA 13 and removed in 14.
        f["DCGM_FI_DEV_POWER_VIOLATION"] = None if pviol is None else t(lambda: _field_value(pviol))
        f["DCGM_FI_DEV_THERMAL_VIOLATION"] = None if tviol is None else t(lambda: _field_value(tviol))
        out = {k: self._num(v) for k, v in f.items() if v is not None}
        if all(v is None for v in out.values()):
            return None  # not one query answered ("Unknown Error" on every call): the GPU is not answering
        out["DCGM_FI_DEV_XID_ERRORS"] = self.xid[i]
        return {k: v for k, v in out.items() if v is not None}

    def _num(self, v: Any) -> float | None:
        """``v`` as a finite float, or None (counted) for what no record can carry: a binding that
        hands back a non-number, or a double field value that is NaN or infinite."""
        try:
            x = float(v)
        except (TypeError, ValueError, OverflowError) as e:
            self._unexpected(e)
            return None
        if not math.isfinite(x):
            self._unexpected(ValueError(f"not a finite number: {x}"))
            return None
        return x

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
            except n.NVMLError as e:
                if getattr(e, "value", None) in self._gone:
                    raise  # the GPU itself is gone, as from any other query: not sent, gpu_lost fires
                continue  # no such link on this GPU (or NVLink unsupported): nothing to report
            except Exception as e:  # noqa: BLE001 - as in _try: costs this link's read, not the poll
                self._unexpected(e)
                continue
            vals: dict[str, float] = {"DCGM_FI_DEV_NVLINK_GET_STATE": 1.0 if state == n.NVML_FEATURE_ENABLED else 0.0}
            # Counters of a link that is down too (as DCGM and gpud read them): else the GPU's totals
            # would drop while it is down and jump back when it returns.
            for name, const in self._LINK_COUNTERS:
                v = self._try(lambda: n.nvmlDeviceGetNvLinkErrorCounter(h, link, getattr(n, const)))
                v = None if v is None else self._num(v)
                if v is not None:
                    vals[name] = v
            out[link] = vals
        return out

    def poll(self) -> list[DcgmRecord]:
        """One record per GPU and per NVLink, read in a worker thread: a driver call that never
        returns (a GPU going bad can hang NVML) costs the polls until it does, counted
        ``dropped.poll_hung``, never the producer's loop, which stays free to stop on SIGTERM."""
        if self._stuck is not None:
            if self._stuck.is_alive():
                self.counts["dropped.poll_hung"] += 1
                return []
            self._stuck = None
            log.warning("NVML answers again: polling resumes")
        box: list[Any] = []
        done = threading.Event()

        def work() -> None:
            try:
                box.append(self._poll())
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                box.append(e)
            finally:
                done.set()

        worker = threading.Thread(target=work, name="nvml-poll", daemon=True)
        worker.start()
        if not done.wait(self.deadline_s):
            # The stuck call's answer, whenever it comes, is stale: dropped with its thread.
            self._stuck = worker
            self.counts["dropped.poll_hung"] += 1
            log.critical(
                "an NVML call has not returned in %.0fs: the driver is hung (a GPU going bad?); "
                "no record is sent until it returns",
                self.deadline_s,
            )
            return []
        if isinstance(box[0], BaseException):
            raise box[0]
        recs: list[DcgmRecord] = box[0]
        return recs

    def _poll(self) -> list[DcgmRecord]:
        for i, h in enumerate(self.handles):
            if h is None and self._attach(i):
                log.warning("GPU %d: NVML handle acquired; read from this poll on", i)
        self._drain_xids()
        ts = self.clock()
        out = []
        for i, h in enumerate(self.handles):
            fields, links, why = None, {}, "no handle"
            try:
                if h is not None:
                    why = "no query answered"
                    fields = self._gpu_fields(i, h)
                    links = self._links(h) if self.links and fields is not None else {}
            except self.n.NVMLError as e:  # the GPU itself is gone (XID 79): skip, gpu_lost fires
                fields, why = None, str(e)
            except Exception as e:  # noqa: BLE001 - what the queries' own guards missed costs this GPU, not all
                fields, why = None, repr(e)
            if fields is None:
                self.errors += 1
                self.counts["dropped.gpu_unreadable"] += 1
                log.warning("GPU %d unreadable: %s", i, why)
                continue
            last = self._link_last[i]
            for link, vals in links.items():
                for name, _ in self._LINK_COUNTERS:
                    if name in vals:
                        last[link, name] = vals[name]
            for name, _ in self._LINK_COUNTERS:
                per = [v for (_link, k), v in last.items() if k == name]
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
        if self._stuck is not None and self._stuck.is_alive():
            log.warning("NVML still hung at exit: not shut down (the call would wait on it too)")
            return
        try:
            if self._events is not None:
                self.n.nvmlEventSetFree(self._events)
            self.n.nvmlShutdown()
        except self.n.NVMLError:
            pass


def _ident(nvml: Any, fn: Callable[[], str]) -> str | None:
    """A GPU's UUID or name, or None when it does not answer (its records carry none)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a GPU without a name or UUID is still read
        return None


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
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(vt, "uiVal")
    return float(getattr(val, member, val if isinstance(val, (int, float)) else 0))


def _exactly(values: Any, n: int) -> list[Any]:
    """``values`` as a list of ``n`` values (one per field id asked for, or a tuple's members), else
    ValueError."""
    out = list(values)
    if len(out) != n:
        raise ValueError(f"{len(out)} values where NVML gives {n}")
    return out


def _hbm_temp(fv: Any) -> int:
    """NVML_FI_DEV_MEMORY_TEMP's uiVal; ValueError above 200 C, which DCGM refuses as no reading."""
    v: int = fv.value.uiVal
    if v > 200:
        raise ValueError(f"memory temperature {v} C")
    return v
