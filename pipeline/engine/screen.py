"""Arrival screening: which arriving records the engine refuses, and why.

A record is ``late`` when it is older than what was processed, or further behind the stream than
``max_lag``; ``ts_out_of_range`` when it is further ahead of the fleet's present (the lower median
of what the live hosts claim) than ``max_ahead`` (docs/architecture.md §4). A verdict is a pair of
arrays, each record's code (0: kept, ``LATE``, ``AHEAD``) and the time it was judged against, or
None when every record is kept.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

import msgspec
import numpy as np

from pipeline.deadletters import LATE as LATE_REASON
from pipeline.deadletters import TS_OUT_OF_RANGE, Origins
from pipeline.engine.hostclock import HostClock
from pipeline.rows import Combined
from pipeline.schema import DcgmSample, DeadLetter, TelemetryRecord

LATE, AHEAD = 1, 2  # why a record is refused
REASONS = {LATE: LATE_REASON, AHEAD: TS_OUT_OF_RANGE}
Verdict = tuple[np.ndarray, np.ndarray] | None


def screen_fleet(clock: HostClock, n: int, ts: np.ndarray, hosts: np.ndarray, released: float) -> Verdict:
    """The replay engine's screen: against the fleet's clock (``n`` hosts known).

    Judged record by record in stream order, so the answer does not depend on the batching; the
    common case (nothing ahead, no jump claimed) is one vectorised comparison.
    """
    cfg = clock.config
    claimed = np.fmax(clock.hwm[:n], clock.jump[:n])
    alive = clock.alive(n)
    now = present(claimed, alive)
    k = (len(ts) - 1) // 2
    median = float(np.partition(ts, k)[k])
    if not np.isnan(clock.jump[:n]).all():
        return screen_in_order(clock, n, ts, hosts, claimed, median, released)
    # Not the present now but the lowest it can fall to within the batch: record by record a
    # host can come to count or one at the median stop, and the answer must not change.
    low = median if math.isnan(now) else lowest_present(clock, ts, hosts, claimed, alive)
    if (ts > low + cfg.max_ahead).any():
        return screen_in_order(clock, n, ts, hosts, claimed, median, released)
    # Behind: against the stream's progress when the record came (a running max), which
    # nothing ahead can have inflated here, and which is the same whatever the batching.
    progress = np.maximum.accumulate(ts)
    np.maximum(progress, clock.newest(n), out=progress)
    behind = (ts < released) | (ts < progress - cfg.max_lag)
    if not behind.any():
        return None
    return np.where(behind, LATE, 0).astype(np.int8), progress


def stream_order(records: Sequence[TelemetryRecord], origins: Sequence[str]) -> np.ndarray | None:
    """The rows of a batch in the order their messages came (message, then place in it), or
    None when that is the order they are in: a ``rows.Combined`` holds its columnar messages'
    rows first, whatever came between them.

    >>> from pipeline.deadletters import Origins
    >>> stream_order([], Origins(["a", "b"], np.array([1, 0]), np.array([0, 0]))) is None  # records: as they came
    True
    """
    if not isinstance(records, Combined) or not isinstance(origins, Origins):
        return None
    if not len(records.cols) or not len(records.others):
        return None
    seq = np.lexsort((origins.pos, origins.msg))
    return None if (seq[1:] > seq[:-1]).all() else seq


def in_row_order(verdict: Verdict, seq: np.ndarray | None) -> Verdict:
    """A verdict on the rows taken in ``seq``'s order, put back in the rows' own.

    >>> why, ref = in_row_order((np.array([2, 0]), np.array([5.0, 6.0])), np.array([1, 0]))
    >>> why.tolist(), ref.tolist()
    ([0, 2], [6.0, 5.0])
    """
    if verdict is None or seq is None:
        return verdict
    why, ref = np.empty_like(verdict[0]), np.empty_like(verdict[1])
    why[seq], ref[seq] = verdict
    return why, ref


def present(claimed: np.ndarray, alive: np.ndarray) -> float:
    """The fleet's present: the lower median of what the live hosts claim (NaN: none yet)."""
    known = claimed[alive & ~np.isnan(claimed)]
    if not len(known):
        return math.nan
    k = (len(known) - 1) // 2
    return float(np.partition(known, k)[k])


def lowest_present(
    clock: HostClock, ts: np.ndarray, hosts: np.ndarray, claimed: np.ndarray, alive: np.ndarray
) -> float:
    """The lowest the present can fall to while ``screen_in_order`` judges this batch, as long
    as none of its records is ahead (its premise: it is the check of that).

    Claims only rise then, so the present falls only as the set of live hosts changes: a host
    comes to count (one heard in the batch, or one seen once, whose wait the fleet's longest
    step can lengthen) or stops (one alive now that the batch's newest record can outrun).
    The lowest lower median over those sets keeps every host sure to stay alive and adds
    the others' lowest claims from the bottom while they pull it down."""
    cfg = clock.config
    n = len(claimed)
    newest = max(clock.newest(n), float(ts.max()))
    hwm, seen = clock.hwm[:n], clock.seen[:n]
    sending = np.zeros(n, bool)
    sending[hosts] = True
    first = np.full(n, np.inf)
    np.minimum.at(first, hosts, ts)
    low = np.where(np.isnan(claimed), first, claimed)  # a new host claims at least its first record
    with np.errstate(invalid="ignore"):
        # Alive through to the batch's newest record whatever comes (wait >= allowed_lateness).
        sure = alive & ((hwm >= newest - cfg.allowed_lateness) | (seen >= newest - cfg.allowed_lateness))
    may = (alive | sending | np.isnan(clock.step[:n])) & ~sure & np.isfinite(low)
    if not may.any():
        return present(claimed, sure)
    counted = np.sort(low[sure]).tolist()
    for c in np.sort(low[may]).tolist():
        if counted and c > counted[(len(counted) - 1) // 2]:
            break  # this one and every one after it would only raise the median
        bisect.insort(counted, c)
    return counted[(len(counted) - 1) // 2]


def screen_in_order(
    clock: HostClock,
    n: int,
    ts: np.ndarray,
    hosts: np.ndarray,
    claimed: np.ndarray,
    first: float,
    released: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``screen_fleet`` one record at a time (a host or the fleet claims a jump: rare).

    Each record is judged on the state the engine would have left had the records before it
    come one batch each: marks, stream progress and sampling steps are kept up to date here as
    ``HostClock.hear`` keeps them, on copies (the engine reads the state before the batch).
    Only ``clock.jump`` is kept in place.

    The present is worked out only for a record that could be ahead of it: one past
    ``in_order_floor`` (the lowest it can fall to while the stream's progress stays within the
    bound that comes with it) by more than ``max_ahead``. A record nearer is kept or late
    whatever the present is, and its reference time, when kept, is that floor: so a few hosts
    claiming jumps cost their own records, not every record the fleet's size (a kept record's
    reference time is read by nothing)."""
    cfg = clock.config
    lateness, max_ahead, max_lag = cfg.allowed_lateness, cfg.max_ahead, cfg.max_lag
    newest = clock.newest(n)
    floor, bound = in_order_floor(clock, n, ts, hosts, claimed, first, newest)
    claimed = claimed.copy()
    hwm, seen, jump = clock.hwm[:n].copy(), clock.seen[:n].copy(), clock.jump
    step = clock.step[:n].copy()
    # Python lists mirror the arrays for the record-by-record reads (a numpy scalar read costs
    # several times a list's); the arrays are what the present is worked out from.
    c_l, hwm_l, seen_l, jump_l = claimed.tolist(), hwm.tolist(), seen.tolist(), jump[:n].tolist()
    wait: np.ndarray | None = clock.wait(n)
    why = np.zeros(len(ts), np.int8)
    ref = np.empty(len(ts))
    for i, (t, h) in enumerate(zip(ts.tolist(), hosts.tolist())):
        if newest > bound or not t <= floor + max_ahead:
            # Aliveness as HostClock.alive has it (a host that went silent in the middle of this
            # batch stops counting for the present); the sending host counts only if it did already.
            if wait is None:
                wait = clock.wait(n, step)
            with np.errstate(invalid="ignore"):
                alive = (hwm >= newest - lateness) | (newest - seen <= wait)
            now = present(claimed, alive)
            start = math.isnan(now)  # no host yet: the batch's median judges what is ahead
            ref[i] = now = first if start else now
        else:
            ref[i] = now = floor  # ahead of no present it can have: kept or late
        if t > now + max_ahead:
            why[i] = AHEAD
            jump[h] = jump_l[h] = t
            c_l[h] = claimed[h] = t if math.isnan(c_l[h]) else max(t, c_l[h])
            continue  # a record refused as ahead says nothing of its host (see Engine.process)
        if t < released or t < newest - max_lag:
            why[i] = LATE
            ref[i] = newest
        else:
            jump[h] = jump_l[h] = math.nan
        # Heard, late or not: as HostClock.hear has it, the host's mark, step and progress move.
        m = hwm_l[h]
        if math.isnan(m) or t > m:
            if not math.isnan(m):
                step[h] = min(t - m, max_lag)
                wait = None  # worked out again when next needed
            hwm[h] = hwm_l[h] = m = t
        j = jump_l[h]
        c_l[h] = claimed[h] = m if math.isnan(j) else max(m, j)
        newest = max(newest, t)
        s = seen_l[h]
        seen[h] = seen_l[h] = newest if math.isnan(s) else max(s, newest)
    return why, ref


def in_order_floor(
    clock: HostClock, n: int, ts: np.ndarray, hosts: np.ndarray, claimed: np.ndarray, first: float, newest: float
) -> tuple[float, float]:
    """The lowest the present can fall to while ``screen_in_order`` judges this batch, and the
    stream progress up to which that holds (-inf, -inf: no floor known).

    The bound is the batch's newest time within ``max_ahead`` of the present now (a record
    refused as ahead moves no progress). Up to it, a host alive now whose mark or progress is
    within ``allowed_lateness`` of it stays alive (its wait is no shorter) and keeps a claim;
    the others may come to count or stop, as in ``lowest_present``. No host's claim falls
    below its mark, or, without one, below its jump or first time in the batch (a claim of a
    jump is withdrawn by the host's next good record, which leaves its mark)."""
    cfg = clock.config
    alive = clock.alive(n)
    now = present(claimed, alive)
    with np.errstate(invalid="ignore"):
        within = ts <= (first if math.isnan(now) else now) + cfg.max_ahead
    bound = max(newest, float(ts[within].max())) if within.any() else newest
    hwm, seen, jump = clock.hwm[:n], clock.seen[:n], clock.jump[:n]
    sending = np.zeros(n, bool)
    sending[hosts] = True
    firsts = np.full(n, np.inf)
    np.fmin.at(firsts, hosts, ts)
    low = np.where(
        np.isnan(jump),
        np.where(np.isnan(claimed), firsts, claimed),
        np.where(np.isnan(hwm), np.fmin(jump, firsts), hwm),
    )
    with np.errstate(invalid="ignore"):
        sure = alive & ~np.isnan(hwm) & ((hwm >= bound - cfg.allowed_lateness) | (bound - seen <= cfg.allowed_lateness))
    may = (alive | sending | np.isnan(clock.step[:n])) & ~sure & (low < np.inf)  # (-inf: no floor)
    counted = np.sort(low[sure]).tolist()
    for c in np.sort(low[may]).tolist():
        if counted and c > counted[(len(counted) - 1) // 2]:
            break  # this one and every one after it would only raise the median
        bisect.insort(counted, c)
    floor = counted[(len(counted) - 1) // 2] if counted else math.nan
    if not sure.any():  # the fleet may fall silent: the batch's median judges then
        floor = first if math.isnan(floor) else min(floor, first)
    if not math.isfinite(floor):
        return -math.inf, -math.inf
    return floor, bound


def screen_late(ts: np.ndarray, released: float) -> Verdict:
    """Only what is older than what was processed (the live engine's screen)."""
    late = ts < released
    if not late.any():
        return None
    return np.where(late, LATE, 0).astype(np.int8), np.full(len(ts), released)


def screen_done(
    clock: HostClock,
    ts: np.ndarray,
    hosts: np.ndarray,
    records: Sequence[TelemetryRecord],
    screened: Verdict,
    released: float,
) -> Verdict:
    """``screened`` and, as ``late``, each DCGM sample older than what its host's early release
    processed already (``clock.done``, Engine._release_hosts). NCCL records are never released
    early: they wait for ``released``."""
    done = clock.done[hosts]
    late = (ts < done) & (ts >= released)
    if screened is not None:
        late &= screened[0] == 0
    if not late.any():
        return screened
    idx = np.flatnonzero(late)
    late[idx] = [isinstance(records[i], DcgmSample) for i in idx.tolist()]
    if not late.any():
        return screened
    why, ref = screened if screened is not None else (np.zeros(len(ts), np.int8), np.full(len(ts), released))
    return np.where(late, LATE, why).astype(np.int8), np.where(late, done, ref)


def refused(
    code: int,
    r: TelemetryRecord,
    origin: str,
    judged: float,
    clock: HostClock,
    host: int | None,
    released: float,
) -> DeadLetter:
    """The dead letter of a record refused with ``code``, judged against ``judged`` (the
    present, or the stream's progress); ``host``: its host's id, if known."""
    cfg = clock.config
    raw = msgspec.json.encode(r).decode()[:2048]
    if code == AHEAD:
        return DeadLetter(
            reason=TS_OUT_OF_RANGE,
            detail=f"ts {r.ts} is {r.ts - judged:.0f}s ahead of the "
            f"fleet's present {judged} (max ahead {cfg.max_ahead}s)",
            origin=origin,
            ts=r.ts,
            host=r.host,
            raw=raw,
        )
    if r.ts >= released and host is not None and r.ts < clock.done[host]:
        detail = (
            f"ts {r.ts} is behind {clock.done[host]}, up to which host {r.host!r}'s samples "
            f"were processed already (its message of that tick held every GPU's sample)"
        )
    elif r.ts >= released:
        detail = f"ts {r.ts} is {judged - r.ts:.0f}s behind the newest record {judged} (max lag {cfg.max_lag}s)"
    else:
        detail = (
            f"ts {r.ts} is {released - r.ts:.1f}s behind the watermark {released} "
            f"(allowed lateness {cfg.allowed_lateness}s)"
        )
    return DeadLetter(reason=LATE_REASON, detail=detail, origin=origin, ts=r.ts, host=r.host, raw=raw)
