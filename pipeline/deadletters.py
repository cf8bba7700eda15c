"""Dead letters' reason codes, and where each record came from (its origin).

Foundation, beside ``pipeline.schema.DeadLetter``: the decoder and the engine both make dead
letters, so the codes and the origins they carry live here rather than in either of them.
"""

from __future__ import annotations

from typing import Sequence, overload

import numpy as np

# Stable reason codes (documented in docs/architecture.md; DLQ consumers match on them).
MALFORMED_JSON = "malformed_json"
WRONG_TYPE = "wrong_type"
MISSING_KEY = "missing_key"
NAN_VALUE = "nan_value"
NAN_FIELD = "nan_field"
BLANK_SENTINEL = "blank_sentinel"
NEGATIVE_VALUE = "negative_value"
UNKNOWN_KIND = "unknown_kind"
UNSUPPORTED_VERSION = "unsupported_version"
TS_OUT_OF_RANGE = "ts_out_of_range"
LATE = "late"
TOO_LARGE = "too_large"
TOO_DEEP = "too_deep"
OUT_OF_RANGE = "out_of_range"
BAD_IDENTIFIER = "bad_identifier"
INTERNAL = "internal"
ENTITY_LIMIT = "entity_limit"
# A message whose header says columnar (pipeline/colwire.py) and whose bytes are not one.
MALFORMED_COLUMNS = "malformed_columns"
# The fleet topic's own (pipeline/service/fleet.py): a message the host stage did not write.
BAD_ENVELOPE = "bad_envelope"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
UNKNOWN_PARTITION = "unknown_partition"
BAD_MARK = "bad_mark"
EARLY_MARK = "early_mark"
BAD_ALERT = "bad_alert"
REASONS = (
    MALFORMED_JSON,
    WRONG_TYPE,
    MISSING_KEY,
    NAN_VALUE,
    NAN_FIELD,
    BLANK_SENTINEL,
    NEGATIVE_VALUE,
    UNKNOWN_KIND,
    UNSUPPORTED_VERSION,
    TS_OUT_OF_RANGE,
    LATE,
    TOO_LARGE,
    TOO_DEEP,
    OUT_OF_RANGE,
    BAD_IDENTIFIER,
    INTERNAL,
    ENTITY_LIMIT,
    MALFORMED_COLUMNS,
    BAD_ENVELOPE,
    UNSIGNED,
    BAD_SIGNATURE,
    UNKNOWN_PARTITION,
    BAD_MARK,
    EARLY_MARK,
    BAD_ALERT,
)


class Origins(Sequence[str]):
    """Each record's origin, spelled out only when read.

    Only dead letters name an origin, so the hot path keeps two index arrays instead of a
    string per record: record ``i`` is record ``pos[i]`` of the array in message ``msg[i]``
    (``pos`` -1: the message was that one record, not an array), named ``names[msg[i]]``.

    >>> o = Origins(["t[0]@7", "t[0]@8"], np.array([0, 0, 1]), np.array([0, 1, -1]))
    >>> list(o), o[1]
    (['t[0]@7#0', 't[0]@7#1', 't[0]@8'], 't[0]@7#1')
    >>> list(o.take(np.array([False, True, True])))
    ['t[0]@7#1', 't[0]@8']
    """

    __slots__ = ("names", "msg", "pos")

    def __init__(self, names: Sequence[str], msg: np.ndarray, pos: np.ndarray) -> None:
        self.names, self.msg, self.pos = names, msg, pos

    @classmethod
    def of_messages(cls, names: Sequence[str], sizes: Sequence[int]) -> "Origins":
        """``sizes[j]``: how many records message ``j`` held as an array, -1 for a bare record."""
        size = np.asarray(sizes, dtype=np.int64)
        count = np.where(size < 0, 1, size)
        msg = np.repeat(np.arange(len(size)), count)
        pos = np.arange(len(msg)) - np.repeat(np.cumsum(count) - count, count)
        pos[size[msg] < 0] = -1
        return cls(names, msg, pos)

    def __len__(self) -> int:
        return len(self.msg)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> "Origins": ...

    def __getitem__(self, i: int | slice) -> "str | Origins":
        if isinstance(i, slice):
            return Origins(self.names, self.msg[i], self.pos[i])
        name, pos = self.names[int(self.msg[i])], int(self.pos[i])
        return name if pos < 0 else f"{name}#{pos}"

    def take(self, idx: np.ndarray) -> "Origins":
        """The origins at ``idx`` (indices or a boolean mask), still lazy."""
        return Origins(self.names, self.msg[idx], self.pos[idx])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Origins, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Origins({list(self)!r})"


def take_origins(origins: Sequence[str], idx: np.ndarray) -> Sequence[str]:
    """``origins`` at ``idx`` (indices or a boolean mask): lazy ones stay lazy."""
    if isinstance(origins, Origins):
        return origins.take(idx)
    if idx.dtype == bool:
        idx = np.flatnonzero(idx)
    return [origins[i] for i in idx.tolist()]
