"""Typed records of the data contracts (docs/architecture.md §3): telemetry in, alerts and dead letters out.

msgspec Structs: decoding JSON straight into them costs ~1 us a record (docs/performance.md) and checks
types on the way. ``DcgmFields`` has one slot per known DCGM spelling (both the pre-4.6 and the
4.6 name), NaN when absent, so turning a batch into a numpy matrix is one ``astuple`` per record.
Unknown field names are ignored: no rule can name them (the catalog is the vocabulary).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal, Union, cast

import msgspec

from pipeline.catalog import FIELDS

# DeadLetter's reason codes and the records' origins (pipeline/deadletters.py), beside it.
from pipeline.deadletters import (
    BAD_IDENTIFIER,
    BLANK_SENTINEL,
    ENTITY_LIMIT,
    INTERNAL,
    LATE,
    MALFORMED_JSON,
    MISSING_KEY,
    NAN_FIELD,
    NAN_VALUE,
    NEGATIVE_VALUE,
    OUT_OF_RANGE,
    REASONS,
    TOO_DEEP,
    TOO_LARGE,
    TS_OUT_OF_RANGE,
    UNKNOWN_KIND,
    UNSUPPORTED_VERSION,
    WRONG_TYPE,
    Origins,
    take_origins,
)

SCHEMA_VERSION = 1

DcgmFields = msgspec.defstruct(
    "DcgmFields",
    [(name, float, math.nan) for name in FIELDS.all_names],
    omit_defaults=True,
    repr_omit_defaults=True,
    gc=False,
)
"""All known DCGM fields of one sample; NaN = not reported."""

# Column of the engine's value matrix for each slot of DcgmFields, in slot order.
FIELD_SLOT_COLUMNS: tuple[int, ...] = tuple(f.column for f in FIELDS for _ in f.names)


# gc=False: records hold no reference cycles, and keeping millions of them out of the cyclic
# garbage collector's sight cuts decode time by a quarter (msgspec's own advice).
class DcgmSample(msgspec.Struct, tag="dcgm", tag_field="kind", kw_only=True, gc=False):
    """What detection reads of a DCGM record: the engine's decoder skips the rest (``uuid``,
    ``labels``) without building a string or dict for them (see ``dcgm_record_type``)."""

    v: int = SCHEMA_VERSION
    ts: float
    host: str
    gpu: int
    link: int | None = None
    model: str | None = None
    fields: DcgmFields = msgspec.field(default_factory=DcgmFields)  # type: ignore[valid-type]


class DcgmRecord(DcgmSample, tag="dcgm", tag_field="kind", kw_only=True, gc=False):
    """One GPU's (or one NVLink's, when ``link`` is set) DCGM sample, as the wire carries it."""

    uuid: str | None = None
    labels: dict[str, str] = {}


class NcclRecord(msgspec.Struct, tag="nccl", tag_field="kind", kw_only=True, gc=False):
    """One rank's view of one collective (or an interval's aggregate of them)."""

    v: int = SCHEMA_VERSION
    ts: float
    host: str
    gpu: int | None = None
    job: str | None = None
    comm: str
    comm_name: str | None = None
    rank: int
    nranks: int
    nnodes: int | None = None
    coll: str
    seq: int | None = None
    bytes: int
    exec_time_us: float
    algbw_gbs: float | None = None
    busbw_gbs: float | None = None
    labels: dict[str, str] = {}


class NicRecord(msgspec.Struct, tag="nic", tag_field="kind", kw_only=True, gc=False):
    """One InfiniBand/RoCE port of a host's NIC (``/sys/class/infiniband/<device>/ports/<port>``
    or ``ibstat``): its link state and counters at ``ts`` (docs/architecture.md §3).

    ``state`` is the IBTA port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE), ``phys_state`` the
    physical state (2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery, ...), each with the
    kernel's name beside it; ``counters`` the port's ``counters/*``, ``hw_counters/*`` and its
    netdev's ``carrier_changes``, by file name; ``gpus`` the GPU indices behind this NIC (the
    nearest common PCIe bridge) when the producer knows them; ``peer*`` the switch port (or other
    node) at the far end of the cable, when the producer was given the fabric's links;
    ``port_guid`` the port's own GUID, which a driver reload that renames the device keeps.

    >>> r = NicRecord(ts=1764403200.0, host="h1", device="mlx5_0", port=1, state=4, state_name="ACTIVE")
    >>> (r.device, r.port, r.state_name, r.counters)
    ('mlx5_0', 1, 'ACTIVE', {})
    """

    v: int = SCHEMA_VERSION
    ts: float
    host: str
    device: str
    port: int
    link_layer: str | None = None  # InfiniBand | Ethernet (RoCE)
    rate_gbps: float | None = None
    state: int | None = None
    state_name: str | None = None
    phys_state: int | None = None
    phys_state_name: str | None = None
    netdev: str | None = None
    counters: dict[str, int] = {}
    gpus: list[int] = []
    labels: dict[str, str] = {}
    # The port's link partner, from a saved iblinkinfo/ibnetdiscover (``--peers``): its node
    # description, GUID, port and LID (docs/producers.md#peers); None where not known.
    peer: str | None = None
    peer_guid: str | None = None
    peer_port: int | None = None
    peer_lid: int | None = None
    # The port's own GUID (``0x`` and 16 lower-case hex digits): the low 64 bits of its GID 0
    # (``…/ports/<port>/gids/0``, ibstat's ``Port GUID``; RoCE's from the MAC), the same after a
    # driver reload renames ``mlx5_0`` to ``mlx5_4`` (docs/producers.md); None where not known.
    port_guid: str | None = None


#: Who reported a ``ProgressRecord``: PyTorch's ProcessGroupNCCL watchdog, or NCCL's RAS.
PROGRESS_SOURCES = ("watchdog", "ras")
#: What a ``ProgressRecord`` says of its rank (docs/architecture.md §3, progress records).
PROGRESS_STATES = ("timeout", "progress", "lagging", "missing", "dead", "error")


class ProgressRecord(msgspec.Struct, tag="progress", tag_field="kind", kw_only=True, gc=False):
    """One rank's collective progress in one communicator (a PyTorch process group), as its
    watchdog or NCCL's RAS reported it: how far it has enqueued and completed, and the work that
    timed out when there was one. A rank behind its peers is what a hang is blamed on."""

    v: int = SCHEMA_VERSION
    ts: float
    host: str
    job: str | None = None
    rank: int
    gpu: int | None = None
    comm: str | None = None  # the PG id (watchdog) or communicator hash (RAS); None: not said
    comm_name: str | None = None  # the PG's name (``default_pg``), when the line gives it
    nranks: int | None = None
    last_enqueued: int | None = None  # -1: nothing enqueued yet
    last_completed: int | None = None  # -1: nothing completed yet
    seq: int | None = None  # the work that failed or timed out
    op: str | None = None  # its operation (``ALLREDUCE``)
    timeout_ms: int | None = None
    ran_ms: int | None = None
    source: Literal["watchdog", "ras"]
    state: Literal["timeout", "progress", "lagging", "missing", "dead", "error"]
    labels: dict[str, str] = {}


# A DcgmRecord is a DcgmSample.
TelemetryRecord = Union[DcgmSample, NcclRecord, NicRecord, ProgressRecord]

#: A ``NicRecord`` whose labels hold this key (value ``"1"``) says its producer polled the host and
#: the port it saw before was not there (``produce ib-sysfs``: a driver unloaded, a NIC fallen off
#: the bus): the host's poll, without that port (docs/rules.md, NIC ports: ``port_lost``).
NIC_ABSENT_LABEL = "absent"

#: A GPU shared by several pods (dcgm-exporter ``--kubernetes-virtual-gpus``: time-slicing, MPS)
#: keeps its first pod in ``pod``/``namespace``/``container`` and lists every pod in ``pods``:
#: ``namespace/pod`` entries, sorted, comma-separated, at most ``MAX_SHARED_PODS`` of them; the
#: number of distinct pods in ``pod_count``. Absent on a GPU with one pod or none.
PODS_LABEL = "pods"
POD_COUNT_LABEL = "pod_count"
MAX_SHARED_PODS = 64
# Kubernetes' own bounds: a pod name is a DNS subdomain (253), a namespace a DNS label (63).
MAX_POD_NAME = 253
MAX_NAMESPACE_NAME = 63
MAX_PODS_CHARS = MAX_SHARED_PODS * (MAX_NAMESPACE_NAME + 1 + MAX_POD_NAME + 1)

# MIG (docs/architecture.md §3). dcgm-exporter labels a GPU instance's series with these
# (rendermetrics/render_metrics.go: GPU_I_PROFILE="3g.40gb", GPU_I_ID = NVML's GPU instance id).
MIG_INSTANCE_LABEL = "GPU_I_ID"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
# Fields that describe one GPU instance (its share of the engines and memory): utilisation,
# framebuffer and the profiling (DCGM_FI_PROF_*, ids 1001-1099) fields. Every other field belongs
# to the physical GPU (XIDs, temperatures, power, clocks, ECC, row remap, NVLink, PCIe, violations).
MIG_INSTANCE_FIELD_IDS: frozenset[int] = frozenset(
    f.field_id for f in FIELDS if f.field_id in (203, 204, 250, 251, 252) or 1000 < f.field_id < 1100
)


@functools.lru_cache(maxsize=32)
def dcgm_fields_type(names: tuple[str, ...]) -> type:
    """A ``fields`` Struct with a slot for each of ``names`` only, in catalog order.

    Decoding into it skips every other field (the engine never reads them): fewer slots to fill,
    free and read, measured ~1.5 us a record less than the 134-slot ``DcgmFields``.

    A value is kept as the JSON has it, ``int`` or ``float``: most DCGM fields are integers and
    most of those are small (counters at 0, temperatures, utilisation), which Python shares
    instead of allocating, where a ``float`` slot made a new object of every one. Fewer objects
    made and freed per record: the benchmark ~7 % faster end to end (docs/performance.md),
    though callgrind counts about as many instructions (the columnizer converts the ints): the
    gain is memory traffic, which instruction counts do not see.
    """
    slot = {n: i for i, n in enumerate(FIELDS.all_names)}
    ordered = sorted(set(names), key=slot.__getitem__)
    return msgspec.defstruct(
        "DcgmFieldsSubset",
        [(n, Union[int, float], math.nan) for n in ordered],
        omit_defaults=True,
        repr_omit_defaults=True,
        gc=False,
    )


class DcgmJobLabels(msgspec.Struct, kw_only=True, gc=False):
    """The few ``labels`` of a DCGM record that say whose work runs on the GPU: dcgm-exporter's
    Kubernetes pod mapping (``pod``, ``namespace``, ``container``; ``pods`` and ``pod_count`` on a
    GPU shared by pods), its HPC job mapping
    (``hpc_job``), and a ``job`` label (the simulator's, or one a producer adds). Every other
    label is skipped while decoding, allocating nothing (docs/architecture.md §3). An integer
    (a Slurm job id written as a number) is kept as it is; it is text by the time an alert has it."""

    job: str | int | None = None
    hpc_job: str | int | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    # A shared GPU's every pod (``PODS_LABEL``, ``POD_COUNT_LABEL``); new fields go last, as
    # snapshots list these in this order.
    pods: str | None = None
    pod_count: str | int | None = None


JOB_LABELS = tuple(DcgmJobLabels.__struct_fields__)


@functools.lru_cache(maxsize=32)
def dcgm_record_type(names: tuple[str, ...]) -> type[DcgmSample]:
    """A ``DcgmSample`` whose ``fields`` keep only ``names`` (see ``dcgm_fields_type``).

    Without ``uuid``, and with only the job labels of ``labels`` (``DcgmJobLabels``): skipping
    an unknown key allocates nothing, where the whole labels dict and its strings cost ~1 us a
    record; the job labels' Struct costs ~0.1 us.
    """
    sub = dcgm_fields_type(names)
    # defstruct is typed as making a plain Struct; bases=(DcgmSample,) makes it a DcgmSample.
    made = msgspec.defstruct(
        "DcgmSampleSubset",
        [
            ("fields", sub, msgspec.field(default_factory=sub)),
            ("labels", Union[DcgmJobLabels, None], msgspec.field(default_factory=DcgmJobLabels)),
        ],
        bases=(DcgmSample,),
        tag="dcgm",
        tag_field="kind",
        kw_only=True,
        gc=False,
    )
    return cast("type[DcgmSample]", made)


class AlertEvent(msgspec.Struct, tag="alert", tag_field="kind", kw_only=True):
    """An alert's state change: ``firing`` then ``resolved`` under the same ``id``."""

    v: int = SCHEMA_VERSION
    id: str
    state: str  # firing | resolved
    fault: str  # family-prefixed: thermal_..., hbm_..., nvlink_..., gpu_...
    severity: str
    rule: str
    host: str | None = None
    gpu: int | None = None
    link: int | None = None
    job: str | None = None
    ts: float
    started_at: float
    summary: str = ""
    evidence: dict[str, Any] = {}
    labels: dict[str, str] = {}

    @property
    def family(self) -> str:
        return fault_family(self.fault)


class DeadLetter(msgspec.Struct, tag="dead_letter", tag_field="kind", kw_only=True, omit_defaults=True):
    """A record (or part of one) that could not be used, why, and where it came from."""

    v: int = SCHEMA_VERSION
    reason: str
    detail: str
    origin: str
    action: str = "record_dropped"  # or "fields_dropped": the rest of the record was used
    fields: list[str] = []
    ts: float | None = None
    host: str | None = None
    raw: str | None = None


FAMILIES = (
    "thermal",
    "hbm",
    "nvlink",
    "nvswitch",
    "nccl",
    "gpu",
    "power",
    "pcie",
    "telemetry",
    "network",
    "hang",
    "host",
)


def fault_family(fault: str) -> str:
    """``hbm_ecc_burst`` -> ``hbm``: what remediation routes and evaluation match on."""
    return fault.split("_", 1)[0]


def dcgm(ts: float, host: str, gpu: int, fields: dict[str, float] | None = None, **kw: Any) -> DcgmRecord:
    """Build a DCGM record from plain values; field names may be DCGM names or aliases.

    >>> r = dcgm(10.0, "h1", 0, {"gpu_temp": 71})
    >>> r.fields.DCGM_FI_DEV_GPU_TEMP
    71.0
    """
    named: dict[str, float] = {}
    for k, val in (fields or {}).items():
        f = FIELDS.resolve(k)
        if f is None:
            raise KeyError(f"unknown field {k!r}")
        named[k if k in f.names else f.names[0]] = float(val)
    return DcgmRecord(ts=float(ts), host=host, gpu=gpu, fields=DcgmFields(**named), **kw)


_enc = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    """JSON bytes of a record, alert, dead letter or plain value (compact, deterministic)."""
    return _enc.encode(obj)
