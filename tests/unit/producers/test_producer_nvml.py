"""NVML producer against a fake NVML module (no GPU in CI): every field, unsupported queries,
per-link records, XID events, and a GPU that becomes unreadable."""

from __future__ import annotations

import math
import types

import pynvml

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.nvml import NvmlSource
from tests.unit.producers.nvml_factories import FakeNvml, fv


def test_reads_every_field_with_units():
    fake = FakeNvml()
    src = NvmlSource(nvml=fake, host="n1", clock=lambda: 1764403200.0)
    recs = src.poll()
    assert [(r.gpu, r.link) for r in recs] == [(0, None), (0, 0), (0, 1), (1, None), (1, 0), (1, 1)]
    g = recs[0]
    f = g.fields
    assert g.uuid == "GPU-fake-0" and g.model == "NVIDIA H100 80GB HBM3" and g.host == "n1"
    assert (f.DCGM_FI_DEV_GPU_TEMP, f.DCGM_FI_DEV_MEMORY_TEMP, f.DCGM_FI_DEV_SM_CLOCK, f.DCGM_FI_DEV_MEM_CLOCK) == (60, 70, 1980, 2619)
    assert f.DCGM_FI_DEV_POWER_USAGE == 650.5 and f.DCGM_FI_DEV_ENFORCED_POWER_LIMIT == 700.0   # mW -> W
    assert f.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION == 123_456_789
    assert (f.DCGM_FI_DEV_GPU_UTIL, f.DCGM_FI_DEV_MEM_COPY_UTIL) == (98, 40)
    assert (f.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, f.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
            f.DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, f.DCGM_FI_DEV_ECC_DBE_AGG_TOTAL) == (5, 0, 50, 1)
    assert (f.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, f.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
            f.DCGM_FI_DEV_ROW_REMAP_PENDING, f.DCGM_FI_DEV_ROW_REMAP_FAILURE) == (2, 1, 1, 0)
    assert f.DCGM_FI_DEV_PCIE_REPLAY_COUNTER == 3
    assert (f.DCGM_FI_DEV_POWER_VIOLATION, f.DCGM_FI_DEV_THERMAL_VIOLATION) == (1000, 2000)
    assert f.DCGM_FI_DEV_XID_ERRORS == 0                      # events registered, none yet
    assert recs[3].fields.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS == 0x60
    # Per link: replay=0, recovery=1, crc_flit=2, crc_data=3 (+10*link); GPU totals are the sums.
    l1 = recs[2].fields
    assert (l1.DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, l1.DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
            l1.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, l1.DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL) == (10, 11, 12, 13)
    assert l1.DCGM_FI_DEV_NVLINK_GET_STATE == 1
    assert f.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 2 + 12
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "t")
    assert out.dead == [] and len(out.records) == 6
    src.close()
    assert fake.shutdown


def test_unsupported_queries_are_absent_not_zero():
    src = NvmlSource(nvml=FakeNvml(gpus=1, links=(), unsupported={"ecc", "rows", "fieldvalues"}), host="n1")
    [r] = src.poll()
    assert math.isnan(r.fields.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL) and math.isnan(r.fields.DCGM_FI_DEV_ROW_REMAP_PENDING)
    assert math.isnan(r.fields.DCGM_FI_DEV_MEMORY_TEMP)
    assert r.fields.DCGM_FI_DEV_GPU_TEMP == 60


def test_xid_event_is_sticky_latest_code():
    fake = FakeNvml(gpus=2, links=())
    src = NvmlSource(nvml=fake, host="n1")
    fake.events = [types.SimpleNamespace(eventType=pynvml.nvmlEventTypeXidCriticalError, device=1, eventData=48),
                   types.SimpleNamespace(eventType=pynvml.nvmlEventTypeXidCriticalError, device=1, eventData=94)]
    r = src.poll()
    assert [x.fields.DCGM_FI_DEV_XID_ERRORS for x in r] == [0, 94]
    assert [x.fields.DCGM_FI_DEV_XID_ERRORS for x in src.poll()] == [0, 94]   # stays until restart


def test_lost_gpu_is_skipped_so_gpu_lost_fires():
    fake = FakeNvml(gpus=2, links=())
    src = NvmlSource(nvml=fake, host="n1")
    fake.gone.add(1)
    recs = src.poll()
    assert [r.gpu for r in recs] == [0] and src.errors == 1


def test_xid_matches_real_ctypes_handles_by_address():
    """pynvml's handles are ctypes pointers: an event's ``device`` is a different object from
    the handle we hold, and ``==`` on them compares identity. The match must be by address."""
    import ctypes

    bufs = [(ctypes.c_char * 8)() for _ in range(2)]

    class CtypesNvml(FakeNvml):
        def nvmlDeviceGetHandleByIndex(self, i):
            return ctypes.cast(bufs[i], pynvml.c_nvmlDevice_t)

        def _chk(self, name, h):
            pass

        def nvmlDeviceGetUUID(self, h): return "GPU-x"
        def nvmlDeviceGetTemperature(self, h, s): return 60
        def nvmlDeviceGetFieldValues(self, h, ids): raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        def nvmlDeviceGetNvLinkState(self, h, link): raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fake = CtypesNvml(gpus=2)
    src = NvmlSource(nvml=fake, host="n1")
    event_handle = ctypes.cast(bufs[1], pynvml.c_nvmlDevice_t)      # a new object, same GPU
    assert not (event_handle == src.handles[1])
    fake.events = [types.SimpleNamespace(eventType=pynvml.nvmlEventTypeXidCriticalError, device=event_handle,
                                         eventData=79)]
    assert [r.fields.DCGM_FI_DEV_XID_ERRORS for r in src.poll()] == [0, 79]


# NVML's own semantics, each with its source.

def test_memory_temp_is_uival_even_when_labelled_double():
    # r545 drivers label NVML_FI_DEV_MEMORY_TEMP a double but fill uiVal; DCGM reads uiVal regardless
    # (NVIDIA/DCGM 72fa3feaa67d716a75323a8f47c34ff3ee73f824 dcgmlib/src/DcgmCacheManager.cpp, nvbugs/4300930).
    class R545(FakeNvml):
        def nvmlDeviceGetFieldValues(self, h, ids):
            return [fv(pynvml.NVML_VALUE_TYPE_DOUBLE, uiVal=71) if i == pynvml.NVML_FI_DEV_MEMORY_TEMP
                    else fv(3, ullVal=5) for i in ids]

    [r] = NvmlSource(nvml=R545(gpus=1, links=()), host="n1").poll()
    assert r.fields.DCGM_FI_DEV_MEMORY_TEMP == 71


def test_field_value_status_is_checked_per_value():
    # nvmlDeviceGetFieldValues returns SUCCESS while each nvmlFieldValue_t carries its own nvmlReturn
    # (pynvml.py nvmlDeviceGetFieldValues checks only the call's): an unsupported one is absent and counted.
    class NoHbmTemp(FakeNvml):
        def nvmlDeviceGetFieldValues(self, h, ids):
            vals = super().nvmlDeviceGetFieldValues(h, ids)
            vals[0] = fv(1, ret=pynvml.NVML_ERROR_NOT_SUPPORTED, uiVal=0)
            return vals

    src = NvmlSource(nvml=NoHbmTemp(gpus=1, links=()), host="n1")
    [r] = src.poll()
    assert math.isnan(r.fields.DCGM_FI_DEV_MEMORY_TEMP) and r.fields.DCGM_FI_DEV_POWER_VIOLATION == 1000
    assert src.summary()["unsupported_queries"] == 1


def test_clock_event_reasons_fall_back_on_drivers_before_r535():
    # nvmlDeviceGetCurrentClocksEventReasons exists from r535 only ("undefined symbol" before, gpud
    # components/accelerator/nvidia/hw-slowdown/clock_events.go); pynvml raises FUNCTION_NOT_FOUND.
    class R525(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return 0x40

    [r] = NvmlSource(nvml=R525(gpus=1, links=()), host="n1").poll()
    assert r.fields.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS == 0x40


def test_temperature_survives_removal_of_deprecated_call():
    # nvmlDeviceGetTemperature is deprecated in CUDA 13 and removed in 14, returning NVML_ERROR_DEPRECATED;
    # nvmlDeviceGetTemperatureV replaces it (https://docs.nvidia.com/deploy/nvml-api/Deprecations.html).
    class Cuda14(FakeNvml):
        def nvmlDeviceGetTemperature(self, h, s):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DEPRECATED)

        def nvmlDeviceGetTemperatureV(self, h, s):
            return 61

    class Old(FakeNvml):  # a driver older than nvmlDeviceGetTemperatureV
        def nvmlDeviceGetTemperatureV(self, h, s):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    class Mismatch(FakeNvml):  # a driver with the call but not the struct version the bindings send
        def nvmlDeviceGetTemperatureV(self, h, s):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)

    assert NvmlSource(nvml=Cuda14(gpus=1, links=()), host="n1").poll()[0].fields.DCGM_FI_DEV_GPU_TEMP == 61
    assert NvmlSource(nvml=Old(gpus=1, links=()), host="n1").poll()[0].fields.DCGM_FI_DEV_GPU_TEMP == 60
    assert NvmlSource(nvml=Mismatch(gpus=1, links=()), host="n1").poll()[0].fields.DCGM_FI_DEV_GPU_TEMP == 60


def test_violation_times_come_from_field_values_as_dcgm_maps_them():
    # DCGM fills 240/241 from NVML_FI_DEV_PERF_POLICY_POWER/THERMAL (NVIDIA/DCGM dcgmlib/src/dcgm_fields.cpp);
    # nvmlDeviceGetViolationStatus is removed in CUDA 14 (https://docs.nvidia.com/deploy/nvml-api/Deprecations.html).
    class Cuda14(FakeNvml):
        def nvmlDeviceGetViolationStatus(self, h, p):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DEPRECATED)

    [r] = NvmlSource(nvml=Cuda14(gpus=1, links=()), host="n1").poll()
    assert (r.fields.DCGM_FI_DEV_POWER_VIOLATION, r.fields.DCGM_FI_DEV_THERMAL_VIOLATION) == (1000, 2000)


def test_gpu_requiring_reset_is_not_sent():
    # NVML_ERROR_RESET_REQUIRED ("GPU requires restart") is a GPU-level failure like GPU_IS_LOST
    # (leptonai/gpud 4a8de33a3f02e207f39e9023d67125592d599731 pkg/nvidia/errors/error.go).
    fake = FakeNvml(gpus=2, links=())
    src = NvmlSource(nvml=fake, host="n1")
    fake.broken[1] = pynvml.NVML_ERROR_RESET_REQUIRED
    assert [r.gpu for r in src.poll()] == [0] and src.summary()["dropped.gpu_unreadable"] == 1


def test_gpu_answering_nothing_is_not_sent_but_one_unknown_costs_one_field():
    # NVML_ERROR_UNKNOWN is "any unexpected error" per call (NVML API reference, nvmlReturn_t): one costs its
    # field; a GPU for which every query fails is not answering, so it is not sent and gpu_lost fires.
    fake = FakeNvml(gpus=2, links=())
    src = NvmlSource(nvml=fake, host="n1")
    fake.broken[1] = pynvml.NVML_ERROR_UNKNOWN
    assert [r.gpu for r in src.poll()] == [0] and src.summary()["dropped.gpu_unreadable"] == 1

    class FlakyPower(FakeNvml):
        def nvmlDeviceGetPowerUsage(self, h):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    [r] = NvmlSource(nvml=FlakyPower(gpus=1, links=()), host="n1").poll()
    assert math.isnan(r.fields.DCGM_FI_DEV_POWER_USAGE) and r.fields.DCGM_FI_DEV_GPU_TEMP == 60


def test_gpu_without_handle_at_start_costs_only_itself():
    # nvmlDeviceGetHandleByIndex fails for a GPU that fell off the bus (NVML_ERROR_GPU_IS_LOST / UNKNOWN,
    # NVML API reference, nvmlDeviceGetHandleByIndex_v2): the other GPUs must still be read.
    class OffBus(FakeNvml):
        def nvmlDeviceGetHandleByIndex(self, i):
            if i == 1:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            return i

    src = NvmlSource(nvml=OffBus(gpus=3, links=()), host="n1")
    assert [r.gpu for r in src.poll()] == [0, 2] and src.summary()["dropped.gpu_unreadable"] == 1


def test_gpu_lost_during_link_reads_costs_only_that_gpu():
    # GPU_IS_LOST can come from any call (NVML API reference): one GPU lost mid-poll must not cost the others.
    class LostOnLinks(FakeNvml):
        def nvmlDeviceGetNvLinkErrorCounter(self, h, link, c):
            if h == 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return 0

    src = NvmlSource(nvml=LostOnLinks(gpus=2, links=(0,)), host="n1")
    assert [(r.gpu, r.link) for r in src.poll()] == [(1, None), (1, 0)]
    assert src.summary()["dropped.gpu_unreadable"] == 1


def test_counters_of_a_link_that_is_down_are_still_read():
    # DCGM (dcgmlib/src/DcgmCacheManager.cpp ReadAndCacheNvLinkData) and gpud (components/accelerator/nvidia/
    # nvlink/nvlink.go) read every link's error counters whatever its state; DCGM's *_TOTAL is all links.
    class Link1Down(FakeNvml):
        def nvmlDeviceGetNvLinkState(self, h, link):
            return pynvml.NVML_FEATURE_DISABLED if link == 1 else super().nvmlDeviceGetNvLinkState(h, link)

    recs = NvmlSource(nvml=Link1Down(gpus=1, links=(0, 1)), host="n1").poll()
    assert recs[2].link == 1 and recs[2].fields.DCGM_FI_DEV_NVLINK_GET_STATE == 0
    assert recs[2].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 12
    assert recs[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 2 + 12
