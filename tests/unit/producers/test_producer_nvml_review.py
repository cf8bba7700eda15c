"""NVML producer against hostile and flaky fakes: a GPU lost during its link reads, a link read
that fails once, a GPU that gets its handle late, a binding that raises or returns what no record
can carry, a driver call that never returns. No GPU in CI; the fakes are in nvml_factories.py."""

from __future__ import annotations

import ctypes
import math
import threading
import types

import pynvml

from producers.nvml import NvmlSource
from tests.unit.producers.nvml_factories import XID, Fake, decodes_clean, fv


def test_gpu_lost_during_its_nvlink_state_query_is_not_sent():
    # nvmlDeviceGetNvLinkState returns NVML_ERROR_GPU_IS_LOST "if the target GPU has fallen off the bus"
    # (NVML API reference, nvmlDeviceGetNvLinkState), like every device query: the GPU must not be sent
    # that poll so gpu_lost fires (leptonai/gpud pkg/nvidia/errors/error.go IsGPULostError).
    fake = Fake(gpus=2, links=(0, 1))
    fake.state_errors = {(0, 0): pynvml.NVML_ERROR_GPU_IS_LOST, (0, 1): pynvml.NVML_ERROR_GPU_IS_LOST}
    src = NvmlSource(nvml=fake, host="n1")
    assert [(r.gpu, r.link) for r in src.poll()] == [(1, None), (1, 0), (1, 1)]
    assert src.summary()["dropped.gpu_unreadable"] == 1


def test_gpu_total_keeps_a_links_last_count_when_one_read_fails():
    # nvmlDeviceGetNvLinkErrorCounter may answer NVML_ERROR_UNKNOWN ("any unexpected error", nvmlReturn_t)
    # for one link once; rules read the GPU total with increase(), where a drop restarts the series
    # (docs/rules.md), so a total that dips and comes back would count the link's whole history again.
    fake = Fake(gpus=1, links=(0, 1))
    crc = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
    src = NvmlSource(nvml=fake, host="n1")
    assert src.poll()[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 2 + 12
    fake.counters[0, 1, crc] = -pynvml.NVML_ERROR_UNKNOWN
    gpu, _l0, l1 = src.poll()
    assert gpu.fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 2 + 12  # link 1's last count kept
    assert math.isnan(l1.fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL)  # the link's own read: absent
    fake.counters[0, 1, crc] = 13
    assert src.poll()[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 2 + 13
    # The link's state query failing once (not GPU_IS_LOST) leaves the link out of that poll: same.
    fake.state_errors[0, 1] = pynvml.NVML_ERROR_UNKNOWN
    recs = src.poll()
    assert [r.link for r in recs] == [None, 0]
    assert recs[0].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 2 + 13
    assert recs[0].fields.DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL == 0 + 10


def test_gpu_without_handle_at_start_is_read_once_it_answers():
    # nvmlDeviceGetHandleByIndex can fail for a GPU that is not ready or briefly off the bus (NVML_ERROR_UNKNOWN,
    # GPU_IS_LOST; NVML API reference, nvmlDeviceGetHandleByIndex_v2); a GPU that answers later must be read,
    # with its UUID and XID events, not left unsent until the producer restarts.
    fake = Fake(gpus=2, links=())
    fake.no_handle = {1}
    src = NvmlSource(nvml=fake, host="n1")
    assert [r.gpu for r in src.poll()] == [0] and src.summary()["dropped.gpu_unreadable"] == 1
    fake.no_handle = set()
    recs = src.poll()
    assert [r.gpu for r in recs] == [0, 1]
    assert recs[1].uuid == "GPU-fake-1" and recs[1].fields.DCGM_FI_DEV_XID_ERRORS == 0
    fake.events = [types.SimpleNamespace(eventType=XID, device=1, eventData=79)]
    assert [r.fields.DCGM_FI_DEV_XID_ERRORS for r in src.poll()] == [0, 79]


def test_a_binding_that_raises_or_returns_garbage_costs_its_field_not_the_poll():
    # pynvml's wrappers are ctypes calls (pynvml.py: fn(handle, byref(...)), c_uint(...)): besides NVMLError
    # they can raise ctypes.ArgumentError, TypeError or OverflowError. One GPU's odd answer must cost
    # that field (house rule: nothing the input holds may crash a driver), not every GPU's record.
    class Odd(Fake):
        def nvmlDeviceGetPowerUsage(self, h):
            if h == 1:
                raise ctypes.ArgumentError("argument 1: wrong type")
            return 650_500

        def nvmlDeviceGetTemperature(self, h, s):
            return None if h == 1 else 60

        def nvmlDeviceGetFieldValues(self, h, ids):
            return super().nvmlDeviceGetFieldValues(h, ids)[: 1 if h == 1 else None]

    src = NvmlSource(nvml=Odd(gpus=2, links=()), host="n1")
    g0, g1 = src.poll()
    assert g0.fields.DCGM_FI_DEV_POWER_USAGE == 650.5 and g0.fields.DCGM_FI_DEV_GPU_TEMP == 60
    assert g0.fields.DCGM_FI_DEV_MEMORY_TEMP == 70
    assert math.isnan(g1.fields.DCGM_FI_DEV_POWER_USAGE) and math.isnan(g1.fields.DCGM_FI_DEV_GPU_TEMP)
    assert math.isnan(g1.fields.DCGM_FI_DEV_MEMORY_TEMP) and g1.fields.DCGM_FI_DEV_SM_CLOCK == 1980
    assert src.summary()["unsupported_queries"] == 3


def test_non_finite_field_value_is_absent_not_sent():
    # A field value typed NVML_VALUE_TYPE_DOUBLE carries any double in dVal (pynvml c_nvmlValue_t): an
    # infinite one is no reading, and the decoder refuses it (a wrong_type dead letter for that field).
    class InfViolation(Fake):
        def nvmlDeviceGetFieldValues(self, h, ids):
            vals = super().nvmlDeviceGetFieldValues(h, ids)
            vals[1] = fv(pynvml.NVML_VALUE_TYPE_DOUBLE, dVal=math.inf)
            return vals

    src = NvmlSource(nvml=InfViolation(gpus=1, links=()), host="n1")
    recs = src.poll()
    assert math.isnan(recs[0].fields.DCGM_FI_DEV_POWER_VIOLATION)
    assert recs[0].fields.DCGM_FI_DEV_THERMAL_VIOLATION == 2000
    assert decodes_clean(recs) and src.summary()["unsupported_queries"] == 1


def test_malformed_xid_event_costs_the_wait_not_the_poll():
    # nvmlEventData_t carries device, eventType, eventData (pynvml c_nvmlEventData_t); an event the
    # binding hands back without them is a failed wait (counted), not a poll that loses every GPU.
    fake = Fake(gpus=2, links=())
    src = NvmlSource(nvml=fake, host="n1")
    fake.events = [types.SimpleNamespace(eventType=XID, device=1)]
    recs = src.poll()
    assert [r.gpu for r in recs] == [0, 1]
    assert src.summary()["dropped.xid_event_error"] == 1


class HangingFake(Fake):
    """A driver whose power reading of GPU 1 blocks until ``release`` is set: NVML hangs so when a
    GPU goes bad, and no signal reaches a thread inside a C call."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.shut = False

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 1:
            self.release.wait()
        return super().nvmlDeviceGetPowerUsage(h)

    def nvmlShutdown(self):
        self.shut = True


def test_a_hung_nvml_call_costs_the_polls_until_it_returns_not_the_loop():
    # Before, poll() blocked with the driver: no record and no stop on SIGTERM, for ever.
    nv = HangingFake()
    src = NvmlSource(nvml=nv, host="n1", clock=lambda: 1.7e9, deadline_s=0.2)
    assert src.poll() == []  # the deadline ends the poll: the driver never would
    stuck = src._stuck
    assert src.poll() == []  # still hung: no second thread piles up behind it
    assert src._stuck is stuck and src.summary()["dropped.poll_hung"] == 2
    src.close()
    assert not nv.shut  # shutting NVML down would wait on the hung call too
    nv.release.set()
    stuck.join(timeout=60)
    recs = src.poll()
    assert sorted({r.gpu for r in recs}) == [0, 1] and decodes_clean(recs)
    src.close()
    assert nv.shut
