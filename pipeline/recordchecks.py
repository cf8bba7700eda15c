"""What each record kind may hold, checked as it is decoded: the limits of every value, the
Structs msgspec decodes into on the fast path (the schema's types with those limits), and the
checks the slow path names a dead letter's reason with (docs/architecture.md §3, Dead letters).

``pipeline.decode`` drives them, and re-exports the limits its users import.
"""

from __future__ import annotations

import math
import operator
import re
import sys
from typing import Annotated, Any, Optional

import msgspec

from pipeline.deadletters import (
    BAD_IDENTIFIER,
    NAN_FIELD,
    NAN_VALUE,
    NEGATIVE_VALUE,
    OUT_OF_RANGE,
    WRONG_TYPE,
)
from pipeline.schema import SCHEMA_VERSION, NcclRecord, NicRecord, ProgressRecord

# Plausible event time: 2001-09-09 .. 2100-01-01. Anything else is a unit mistake (ms, us) or garbage.
TS_MIN, TS_MAX = 1.0e9, 4.1e9
DOUBLE_MAX = sys.float_info.max
RAW_KEEP = 2048  # bytes of the original kept in a dead letter: enough to see it, not to flood the DLQ

# Ranges of the contract's integers (docs/architecture.md, "Dead letters"). Far beyond any real
# fleet, and each fits the int32 arrays the engine keeps: an index of 2^63 or a rank of 2^32
# must cost only its own record, never overflow a column.
MAX_GPU_INDEX = 4095  # GPUs (and MIG instances) of one host
MAX_LINK_INDEX = 1023  # NVLinks of one GPU
MAX_RANKS = 1 << 24  # ranks of one NCCL communicator
MAX_SEQ = (1 << 63) - 1  # a collective's sequence number: the int64 the fleet stage sorts by
# A rank's last enqueued/completed work (progress records): -1 is PyTorch's "none yet".
MIN_PROGRESS = -1
# Identifiers (host, GPU model, communicator, job, collective): a host name is at most a DNS name
# (253), the others a generous 256; printable, no white space, valid Unicode (no lone
# surrogates, which no UTF-8 writer can encode: a snapshot, an alert id or a dead letter would
# fail on them far from the record that brought them).
MAX_HOST_LEN = 253
MAX_ID_LEN = 256
# NIC port records (``NicRecord``): names are short ("mlx5_bond_0", "ibp26s0", "rx_icrc_encapsulated");
# a port number is a u8 in IBTA MADs and a u32 in the kernel, 65535 is past any real device;
# state codes are 4-bit fields; a counter is a u64 (hw_counters) or narrower (the IBTA ones).
MAX_NIC_NAME = 64
MAX_NIC_PORT = 65535
MAX_PORT_STATE = 15
MAX_NIC_COUNTERS = 256  # an mlx5 port has ~70 counters and hw_counters together
MAX_COUNTER = (1 << 64) - 1
MAX_NIC_GPUS = 64  # GPUs behind one NIC: 1 or 2 on an 8-GPU node
MAX_RATE_GBPS = 100_000.0  # 1.6 Tb/s is the fastest port sold; this is a unit mistake's bound
# A port's link partner (``peer*``): an IBTA NodeDescription is 64 bytes, a GUID 64 bits, a LID 16.
MAX_PEER_DESC = 64
PEER_GUID_PATTERN = "^0x[0-9a-f]{16}$"
MAX_LID = 0xFFFF

# The fast path's types carry the plausibility checks as msgspec constraints, so they cost
# nothing beyond decoding (checked in C); a record that breaks one fails the fast decode and its
# message goes to the slow path, whose plain types and ``_check`` say exactly what is wrong.
_ONE = Annotated[int, msgspec.Meta(ge=SCHEMA_VERSION, le=SCHEMA_VERSION)]
_TS_OK = Annotated[float, msgspec.Meta(ge=TS_MIN, le=TS_MAX)]
_HOST_OK = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_HOST_LEN)]
ID_OK = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LEN)]
GPU_OK = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_INDEX)]
LINK_OK = Annotated[int, msgspec.Meta(ge=0, le=MAX_LINK_INDEX)]
_RANK = Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANKS)]
_NRANKS = Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)]
_SEQ_OK = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
_NONNEG = Annotated[float, msgspec.Meta(ge=0)]  # JSON has no NaN, and msgspec refuses 1e999
_PROGRESS_OK = Annotated[int, msgspec.Meta(ge=MIN_PROGRESS, le=MAX_SEQ)]
CHECKED_BASE: list[tuple[str, Any] | tuple[str, Any, Any]] = [
    ("v", _ONE, SCHEMA_VERSION),
    ("ts", _TS_OK),
    ("host", _HOST_OK),
]
HOST_OF, MODEL_OF = operator.attrgetter("host"), operator.attrgetter("model")
NCCL_NAMES = operator.attrgetter("comm", "coll", "job", "comm_name")
_NIC_NAME_OK = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NIC_NAME)]
_STATE_OK = Annotated[int, msgspec.Meta(ge=0, le=MAX_PORT_STATE)]
# msgspec bounds only int64: a counter past it goes to the slow path, which keeps it up to 2^64-1.
_COUNTER_OK = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
PROGRESS_NAMES = operator.attrgetter("comm", "op", "job", "comm_name")


def bad_identifier(name: object, limit: int = MAX_ID_LEN, host: bool = False) -> str | None:
    """Why ``name`` cannot be an identifier, or None. A host name (``host``) holds no space;
    a GPU model, job or collective may ("NVIDIA H100 80GB HBM3").

    >>> bad_identifier("gpu-node-007", host=True), bad_identifier("n\\ud800"), bad_identifier("a b", host=True)
    (None, 'not printable', 'holds a space')
    """
    if not isinstance(name, str):
        return f"a {type(name).__name__}, not a string"
    if not 0 < len(name) <= limit:
        return f"{len(name)} characters (1..{limit})"
    # isprintable() is False for control characters, lone surrogates and every space but " ".
    if not name.isprintable():
        return "not printable"
    if host and " " in name:
        return "holds a space"
    return None


def bad_host(name: object) -> str | None:
    return bad_identifier(name, MAX_HOST_LEN, host=True)


def is_str(v: object) -> bool:
    return isinstance(v, str)


def label_text(labels: object, dropped: list[tuple[str, str]]) -> dict[str, str]:
    """``labels`` as strings: a finite number as its text (``1234``, ``0.5``), any other value
    (and labels that are not an object) noted in ``dropped``."""
    if not isinstance(labels, dict):
        dropped.append(("labels", WRONG_TYPE))
        return {}
    out = {}
    for k, v in labels.items():
        if isinstance(v, str):
            out[k] = v
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**30:
            out[k] = str(v)
        elif isinstance(v, float) and math.isfinite(v):
            out[k] = f"{v:g}" if v != int(v) or abs(v) >= 1e16 else str(int(v))
        else:
            dropped.append((f"labels.{k}", WRONG_TYPE))
    return out


def shown(name: str) -> str:
    """An untrusted name as it may appear in a detail: escaped, and cut."""
    return ascii(name[:64]) + ("…" if len(name) > 64 else "")


def _rank_below_nranks(self: NcclRecord) -> None:
    if self.rank >= self.nranks:  # the one check that spans two fields
        raise ValueError("rank >= nranks")


# Named as the contract's types (their reprs and class names are what users see).
NcclChecked = msgspec.defstruct(
    "NcclRecord",
    [
        *CHECKED_BASE,
        ("rank", _RANK),
        ("nranks", _NRANKS),
        ("exec_time_us", _NONNEG),
        ("bytes", _SEQ_OK),  # a message size: never negative, an int64 as the wire carries it
        ("gpu", Optional[GPU_OK], None),
        ("nnodes", Optional[_NRANKS], None),
        ("seq", Optional[_SEQ_OK], None),
        ("comm", ID_OK),
        ("coll", ID_OK),
        ("job", Optional[ID_OK], None),
        ("comm_name", Optional[ID_OK], None),
        ("algbw_gbs", Optional[_NONNEG], None),
        ("busbw_gbs", Optional[_NONNEG], None),
    ],
    bases=(NcclRecord,),
    tag="nccl",
    tag_field="kind",
    kw_only=True,
    gc=False,
    namespace={"__post_init__": _rank_below_nranks},
)


NicChecked = msgspec.defstruct(
    "NicRecord",
    [
        *CHECKED_BASE,
        ("device", _NIC_NAME_OK),
        ("port", Annotated[int, msgspec.Meta(ge=0, le=MAX_NIC_PORT)]),
        ("link_layer", Optional[_NIC_NAME_OK], None),
        ("rate_gbps", Optional[Annotated[float, msgspec.Meta(ge=0, le=MAX_RATE_GBPS)]], None),
        ("state", Optional[_STATE_OK], None),
        ("state_name", Optional[_NIC_NAME_OK], None),
        ("phys_state", Optional[_STATE_OK], None),
        ("phys_state_name", Optional[_NIC_NAME_OK], None),
        ("netdev", Optional[_NIC_NAME_OK], None),
        (
            "counters",
            Annotated[dict[_NIC_NAME_OK, _COUNTER_OK], msgspec.Meta(max_length=MAX_NIC_COUNTERS)],
            msgspec.field(default_factory=dict),
        ),
        ("gpus", Annotated[list[GPU_OK], msgspec.Meta(max_length=MAX_NIC_GPUS)], msgspec.field(default_factory=list)),
        ("peer", Optional[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PEER_DESC)]], None),
        ("peer_guid", Optional[Annotated[str, msgspec.Meta(pattern=PEER_GUID_PATTERN)]], None),
        ("peer_port", Optional[Annotated[int, msgspec.Meta(ge=0, le=MAX_NIC_PORT)]], None),
        ("peer_lid", Optional[Annotated[int, msgspec.Meta(ge=0, le=MAX_LID)]], None),
    ],
    bases=(NicRecord,),
    tag="nic",
    tag_field="kind",
    kw_only=True,
    gc=False,
)


def nic_problem(rec: NicRecord) -> tuple[str, str] | None:
    """What is wrong with a NIC port record beyond its time and host (reason, detail), or None."""
    if (why := bad_identifier(rec.device, MAX_NIC_NAME, host=True)) is not None:
        return BAD_IDENTIFIER, f"device {shown(str(rec.device))}: {why}"
    if rec.port < 0:
        return NEGATIVE_VALUE, f"port {rec.port}"
    if rec.port > MAX_NIC_PORT:
        return OUT_OF_RANGE, f"port {rec.port} (0..{MAX_NIC_PORT})"
    if rec.netdev is not None and (why := bad_identifier(rec.netdev, MAX_NIC_NAME, host=True)) is not None:
        return BAD_IDENTIFIER, f"netdev {shown(rec.netdev)}: {why}"
    for name in ("link_layer", "state_name", "phys_state_name"):
        val = getattr(rec, name)
        if val is not None and (why := bad_identifier(val, MAX_NIC_NAME)) is not None:
            return BAD_IDENTIFIER, f"{name} {shown(val)}: {why}"
    for name in ("state", "phys_state"):
        val = getattr(rec, name)
        if val is not None and not 0 <= val <= MAX_PORT_STATE:
            return OUT_OF_RANGE, f"{name} {val} (0..{MAX_PORT_STATE})"
    rate = rec.rate_gbps
    if rate is not None:
        if not math.isfinite(rate):
            return NAN_VALUE, f"rate_gbps is {rate}"
        if rate < 0:
            return NEGATIVE_VALUE, f"rate_gbps is {rate}"
        if rate > MAX_RATE_GBPS:
            return OUT_OF_RANGE, f"rate_gbps {rate} (at most {MAX_RATE_GBPS:g})"
    if len(rec.counters) > MAX_NIC_COUNTERS:
        return OUT_OF_RANGE, f"{len(rec.counters)} counters (at most {MAX_NIC_COUNTERS})"
    for k, v in rec.counters.items():
        if (why := bad_identifier(k, MAX_NIC_NAME, host=True)) is not None:
            return BAD_IDENTIFIER, f"counter {shown(str(k))}: {why}"
        if type(v) is not int:
            return WRONG_TYPE, f"counter {k} is a {type(v).__name__}, not an integer"
        if not 0 <= v <= MAX_COUNTER:
            return (NEGATIVE_VALUE if v < 0 else OUT_OF_RANGE), f"counter {k} is {v} (0..2^64-1)"
    if rec.peer is not None and (why := bad_identifier(rec.peer, MAX_PEER_DESC)) is not None:
        return BAD_IDENTIFIER, f"peer {shown(rec.peer)}: {why}"
    if rec.peer_guid is not None and not (
        isinstance(rec.peer_guid, str) and re.fullmatch(PEER_GUID_PATTERN, rec.peer_guid)
    ):
        return BAD_IDENTIFIER, f"peer_guid {shown(str(rec.peer_guid))}: not 0x and 16 lower-case hex digits"
    for name, top in (("peer_port", MAX_NIC_PORT), ("peer_lid", MAX_LID)):
        val = getattr(rec, name)
        if val is not None and (type(val) is not int or not 0 <= val <= top):
            return OUT_OF_RANGE, f"{name} {val!r} (0..{top})"
    if len(rec.gpus) > MAX_NIC_GPUS or any(type(g) is not int or not 0 <= g <= MAX_GPU_INDEX for g in rec.gpus):
        return OUT_OF_RANGE, f"gpus {rec.gpus[:8]!r}: at most {MAX_NIC_GPUS} indices, each 0..{MAX_GPU_INDEX}"
    return None


def clean_counters(counters: Any, dropped: list[tuple[str, str]]) -> Any:
    """A NIC record's ``counters`` with each unusable entry left out and noted in ``dropped``
    (its own dead letter, the rest of the record kept): a value that is not a non-negative
    integer of at most 64 bits, or a name that is not a short printable identifier. A number
    written as an integral float or as ASCII digits (a loose producer) is still that number."""
    if not isinstance(counters, dict) or len(counters) > MAX_NIC_COUNTERS:
        return counters  # the record's own problem: conversion or ``nic_problem`` names it
    clean: dict[str, int] = {}
    for name, val in counters.items():
        if bad_identifier(name, MAX_NIC_NAME, host=True) is not None:
            dropped.append((f"counters.{shown(str(name))}", BAD_IDENTIFIER))
            continue
        label = f"counters.{name}"
        num: int | None = None
        if isinstance(val, int) and not isinstance(val, bool):
            num = val
        elif isinstance(val, float) and math.isfinite(val) and val == int(val):
            num = int(val)
        elif isinstance(val, str) and val.isascii() and val.isdigit() and len(val) <= 20:
            num = int(val)
        if num is None:
            dropped.append((label, NAN_FIELD if isinstance(val, float) else WRONG_TYPE))
        elif num < 0:
            dropped.append((label, NEGATIVE_VALUE))
        elif num > MAX_COUNTER:
            dropped.append((label, OUT_OF_RANGE))
        else:
            clean[name] = num
    return clean


def _rank_in_comm(self: ProgressRecord) -> None:
    if self.nranks is not None and self.rank >= self.nranks:
        raise ValueError("rank >= nranks")


ProgressChecked = msgspec.defstruct(
    "ProgressRecord",
    [
        *CHECKED_BASE,
        ("rank", _RANK),
        ("nranks", Optional[_NRANKS], None),
        ("gpu", Optional[GPU_OK], None),
        ("seq", Optional[_SEQ_OK], None),
        ("last_enqueued", Optional[_PROGRESS_OK], None),
        ("last_completed", Optional[_PROGRESS_OK], None),
        ("timeout_ms", Optional[_SEQ_OK], None),
        ("ran_ms", Optional[_SEQ_OK], None),
        ("comm", Optional[ID_OK], None),
        ("comm_name", Optional[ID_OK], None),
        ("job", Optional[ID_OK], None),
        ("op", Optional[ID_OK], None),
    ],
    bases=(ProgressRecord,),
    tag="progress",
    tag_field="kind",
    kw_only=True,
    gc=False,
    namespace={"__post_init__": _rank_in_comm},
)


def nccl_problem(rec: NcclRecord) -> tuple[str, str] | None:
    """What is wrong with an NCCL record's own fields (its ts and host are checked before), or
    None: the ranks, GPU, sequence number, names, times, bandwidths and message size.

    >>> r = NcclRecord(ts=1764403200.0, host="h", comm="c", rank=0, nranks=2, coll="AllReduce", bytes=-5,
    ...                exec_time_us=1.0)
    >>> nccl_problem(r)
    ('negative_value', 'bytes is -5')
    """
    if rec.nranks > MAX_RANKS or rec.rank >= MAX_RANKS or (rec.nnodes is not None and not 0 <= rec.nnodes <= MAX_RANKS):
        return OUT_OF_RANGE, f"rank {rec.rank} of {rec.nranks} (at most {MAX_RANKS} ranks)"
    if rec.rank < 0 or rec.nranks <= 0 or rec.rank >= rec.nranks:
        return WRONG_TYPE, f"rank {rec.rank} of {rec.nranks}"
    if rec.gpu is not None and not 0 <= rec.gpu <= MAX_GPU_INDEX:
        return OUT_OF_RANGE, f"gpu index {rec.gpu} (0..{MAX_GPU_INDEX})"
    if rec.seq is not None and not 0 <= rec.seq <= MAX_SEQ:
        return OUT_OF_RANGE, f"seq {rec.seq} (0..{MAX_SEQ})"
    for name in ("comm", "coll", "job", "comm_name"):
        val = getattr(rec, name)
        if val is not None and (why := bad_identifier(val)) is not None:
            return BAD_IDENTIFIER, f"{name} {shown(val)}: {why}"
    for name in ("exec_time_us", "algbw_gbs", "busbw_gbs"):
        val = getattr(rec, name)
        if val is not None and not math.isfinite(val):
            return NAN_VALUE, f"{name} is {val}"
        if val is not None and val < 0:
            return NEGATIVE_VALUE, f"{name} is {val}"
    if rec.bytes < 0:
        return NEGATIVE_VALUE, f"bytes is {rec.bytes}"
    if rec.bytes > MAX_SEQ:
        return OUT_OF_RANGE, f"bytes {rec.bytes} (0..{MAX_SEQ})"
    return None


def progress_problem(rec: ProgressRecord) -> tuple[str, str] | None:
    """What is wrong with a progress record's own fields (its ts and host are checked
    before), or None: the ranges of its integers and its names (docs/architecture.md §3).

    >>> r = ProgressRecord(ts=1764403200.0, host="h", rank=3, nranks=2, source="watchdog", state="timeout")
    >>> progress_problem(r)
    ('wrong_type', 'rank 3 of 2')
    """
    if not 0 <= rec.rank < MAX_RANKS or (rec.nranks is not None and not 0 < rec.nranks <= MAX_RANKS):
        return OUT_OF_RANGE, f"rank {rec.rank} of {rec.nranks} (at most {MAX_RANKS} ranks)"
    if rec.nranks is not None and rec.rank >= rec.nranks:
        return WRONG_TYPE, f"rank {rec.rank} of {rec.nranks}"
    if rec.gpu is not None and not 0 <= rec.gpu <= MAX_GPU_INDEX:
        return OUT_OF_RANGE, f"gpu index {rec.gpu} (0..{MAX_GPU_INDEX})"
    for name in ("last_enqueued", "last_completed"):
        val = getattr(rec, name)
        if val is not None and not MIN_PROGRESS <= val <= MAX_SEQ:
            return OUT_OF_RANGE, f"{name} {val} ({MIN_PROGRESS}..{MAX_SEQ})"
    for name in ("seq", "timeout_ms", "ran_ms"):
        val = getattr(rec, name)
        if val is not None and not 0 <= val <= MAX_SEQ:
            return OUT_OF_RANGE, f"{name} {val} (0..{MAX_SEQ})"
    for name in ("comm", "comm_name", "job", "op"):
        val = getattr(rec, name)
        if val is not None and (why := bad_identifier(val)) is not None:
            return BAD_IDENTIFIER, f"{name} {shown(val)}: {why}"
    return None
