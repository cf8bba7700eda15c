"""Fakes of pynvml for the NVML producer's tests (no GPU in CI): the constants and error classes
are pynvml's own."""

from __future__ import annotations

import types

import pynvml

from pipeline.decode import Decoder
from pipeline.schema import encode

XID = pynvml.nvmlEventTypeXidCriticalError


def fv(value_type, ret=0, **value):
    """One ``nvmlFieldValue_t`` as pynvml returns it: a ctypes struct whose ``value`` is a union."""
    out = pynvml.c_nvmlFieldValue_t()
    out.valueType, out.nvmlReturn = value_type, ret
    for k, v in value.items():
        setattr(out.value, k, v)
    return out


def err(code):
    return pynvml.NVMLError(code)


class Fake(types.SimpleNamespace):
    """The slice of pynvml the producer calls. ``counters[(gpu, link, counter)]`` overrides a
    link counter: an int is its value, an NVML error code (negated) is raised instead."""

    def __init__(self, gpus=2, links=(0, 1)):
        super().__init__()
        for k in dir(pynvml):
            if k.startswith(("NVML_", "nvmlEventType", "NVMLError")):
                setattr(self, k, getattr(pynvml, k))
        self.gpus, self.links = gpus, links
        self.events: list = []
        self.counters: dict = {}
        self.state_errors: dict = {}  # (gpu, link) -> NVML error code nvmlDeviceGetNvLinkState raises
        self.no_handle: set[int] = set()
        self.registered: list = []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        if i in self.no_handle:
            raise err(pynvml.NVML_ERROR_UNKNOWN)
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h}"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlEventSetCreate(self):
        return "es"

    def nvmlEventSetFree(self, es):
        pass

    def nvmlDeviceRegisterEvents(self, h, mask, es):
        self.registered.append(h)

    def nvmlEventSetWait(self, es, timeout_ms):
        if not self.events:
            raise err(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlDeviceGetTemperature(self, h, s):
        return 60

    def nvmlDeviceGetFieldValues(self, h, ids):
        vals = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: fv(1, uiVal=70),
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER: fv(3, ullVal=1000),
            pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: fv(3, ullVal=2000),
        }
        return [vals[i] for i in ids]

    def nvmlDeviceGetClockInfo(self, h, c):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123_456_789

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=98, memory=40)

    def nvmlDeviceGetTotalEccErrors(self, h, e, c):
        return 0

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 0, 0, 0)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return 3

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link not in self.links:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if (h, link) in self.state_errors:
            raise err(self.state_errors[h, link])
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, c):
        v = self.counters.get((h, link, c), 10 * link + c)
        if v < 0:
            raise err(-v)
        return v


def decodes_clean(recs):
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "t")
    return out.dead == [] and len(out.records) == len(recs)


class FakeNvml(types.SimpleNamespace):
    """The slice of pynvml the producer uses; constants and error classes are pynvml's own."""

    def __init__(self, gpus=2, links=(0, 1), unsupported=()):
        super().__init__()
        for k in dir(pynvml):
            if k.startswith(("NVML_", "nvmlEventType", "NVMLError")):
                setattr(self, k, getattr(pynvml, k))
        self.gpus, self.links, self.unsupported = gpus, links, set(unsupported)
        self.events: list = []
        self.gone: set[int] = set()
        self.broken: dict[int, int] = {}  # handle -> the NVML error every query of it raises
        self.shutdown = False

    def _chk(self, name, h):
        if h in self.gone:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if h in self.broken:
            raise pynvml.NVMLError(self.broken[h])
        if name in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h}"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlEventSetCreate(self):
        return "es"

    def nvmlEventSetFree(self, es):
        pass

    def nvmlDeviceRegisterEvents(self, h, mask, es):
        pass

    def nvmlEventSetWait(self, es, timeout_ms):
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlDeviceGetTemperature(self, h, s):
        self._chk("temp", h)
        return 60 + h

    def nvmlDeviceGetFieldValues(self, h, ids):
        self._chk("fieldvalues", h)
        vals = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: fv(1, uiVal=70 + h),
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER: fv(3, ullVal=1000),
            pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: fv(3, ullVal=2000),
        }
        return [vals[i] for i in ids]

    def nvmlDeviceGetClockInfo(self, h, c):
        self._chk("clock", h)
        return 1980 if c == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._chk("reasons", h)
        return 0x60 if h == 1 else 0

    def nvmlDeviceGetPowerUsage(self, h):
        self._chk("power", h)
        return 650_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._chk("limit", h)
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._chk("energy", h)
        return 123_456_789

    def nvmlDeviceGetUtilizationRates(self, h):
        self._chk("util", h)
        return types.SimpleNamespace(gpu=98, memory=40)

    def nvmlDeviceGetTotalEccErrors(self, h, err, cnt):
        self._chk("ecc", h)
        return {(0, 0): 5, (1, 0): 0, (0, 1): 50, (1, 1): 1}[(err, cnt)]

    def nvmlDeviceGetRemappedRows(self, h):
        self._chk("rows", h)
        return (2, 1, True, False)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        self._chk("pcie", h)
        return 3

    def nvmlDeviceGetViolationStatus(self, h, p):
        self._chk("viol", h)
        return types.SimpleNamespace(violationTime=1000 if p == pynvml.NVML_PERF_POLICY_POWER else 2000)

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link not in self.links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, c):
        self._chk("nvlink", h)
        return 10 * link + c
