"""Each host's clock: the per-host arrays the watermark is computed from.

A host's high-water mark, when it was last heard relative to the stream, its sampling step and
jitter, whether it sends per-host messages, and how far its rows went early: what the
watermark, arrival screening and early host release read (docs/architecture.md §4). Every array
is declared once, as a ``PerHost`` attribute of ``HostClock``: growth and the snapshot's
``to_state``/``load_state`` follow from those declarations.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence, overload

import numpy as np

from pipeline.deadletters import Origins
from pipeline.engine.arrays import from_dict, like, to_dict
from pipeline.engine.config import EngineConfig
from pipeline.errors import StateError
from pipeline.numeric import grow


class PerHost:
    """One per-host array of ``HostClock``, declared as a class attribute: the value a new host
    gets, and its snapshot key (None: not kept across a restore). A snapshot without the key
    gets a copy of the array ``absent_as`` names, or ``fill``. The array itself lives in the
    instance (set once in ``__init__``), so reading it costs what a plain attribute does."""

    def __init__(self, fill: float | bool, key: str | None = None, absent_as: str | None = None) -> None:
        self.fill, self.key, self.absent_as = fill, key, absent_as
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "PerHost": ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> np.ndarray: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> "PerHost | np.ndarray":
        if obj is None:
            return self
        raise AttributeError(f"{self.name}: not set yet")  # (set in HostClock.__init__)

    def new(self, n: int = 0) -> np.ndarray:
        """``n`` hosts' worth of ``fill``."""
        return np.full(n, self.fill, dtype=bool if isinstance(self.fill, bool) else np.float64)


class HostClock:
    """Per-host event-time bookkeeping (docs/architecture.md §4) and the watermark it gives.

    Each ``PerHost`` attribute below is one array, indexed by host id; ``arrays()`` lists them,
    and growth and the state codec follow from that list."""

    # Newest event time accepted from each host.
    hwm = PerHost(math.nan, "host_hwm")
    # Wall clock of each host's latest arrival (live only).
    arrival = PerHost(math.nan)
    # Whether each host's latest records came as per-host messages, one host's GPUs at one
    # time each: such a host is complete for the tick of its newest sample.
    whole = PerHost(False)
    # Stream progress (the newest event time accepted) when each host's latest record came:
    # a host whose records keep coming is alive however far it lags.
    seen = PerHost(math.nan, "host_seen")
    # Event time of a host's latest record refused as ahead of the fleet (NaN: none since its
    # last good one): when half the fleet claims a jump, the fleet's present follows.
    jump = PerHost(math.nan, "host_jump")
    # Each host's sampling interval (its latest step forward in event time): a host sampled
    # every 30 s is not gone 30 s after its last sample.
    step = PerHost(math.nan, "host_step")
    # The shortest step a host has sampled at, forgotten by STEP_RECOVERY a step: a longer
    # step takes its place once it has grown past that one, so that missed samples do not
    # stretch the promise and a host that samples more slowly for good is trusted so in time.
    min_step = PerHost(math.nan, "host_min_step", absent_as="step")
    # The step that set ``min_step`` last, as the host sampled it, not grown: how far it is
    # trusted not to sample again (whole_bound), and what its jitter is measured from. After
    # a missed sample ``min_step`` has grown by 1 %, more than a steady clock's 0.5 % margin.
    trusted_step = PerHost(math.nan, "host_trusted_step", absent_as="min_step")
    # How far a host's steps stray from whole multiples of the shortest step it sampled at
    # (``trusted_step``; a running maximum that fades by JITTER_FADE a step), and over how many
    # steps it was measured: the margin the release rule gives a host for jitter (whole_bound).
    jitter = PerHost(math.nan, "host_jitter")
    jitter_n = PerHost(0.0, "host_jitter_n")
    # How far a host's clock once leapt ahead of the stream's progress (at most max_ahead; 0:
    # never): its times count that much less for the fleet's front (``front``), so that one
    # clock stepping minutes ahead does not make every other host count as gone.
    lead = PerHost(0.0, "host_lead")
    # How far each host's rows have been processed so, ahead of ``released`` (-inf: not);
    # see Engine._release_hosts.
    done = PerHost(-math.inf, "host_done")
    # Each host's newest DCGM sample, as it came and where ``one_per_tick`` put it: the next
    # sample is moved by what these say, whatever the batching, and ``whole_bound`` reads them.
    dcgm_ts = PerHost(math.nan, "host_dcgm_ts")
    dcgm_at = PerHost(math.nan, "host_dcgm_at")
    # Whether a record of the host in this batch came sooner after the one before it than the
    # host was trusted to sample (whole_bound's promise): a second producer, a sampler sped up.
    # Such a host is not whole for the batch (note_whole). Not kept: it is the batch's.
    sooner = PerHost(False)
    # How many DCGM rows each host's latest sample (by its time as sent) has brought so far, the
    # time, and how many the sample before it held: a per-host message with fewer rows than that
    # is part of a sample, not all of it (note_whole). Not kept: unknown, a host is not whole.
    sample_ts = PerHost(math.nan)
    sample_n = PerHost(0.0)
    sample_prev = PerHost(math.nan)

    @classmethod
    def arrays(cls) -> tuple[PerHost, ...]:
        """Every ``PerHost`` of the class and its bases, in the order declared."""
        found: dict[str, PerHost] = {}
        for klass in reversed(cls.__mro__):
            found.update((k, v) for k, v in vars(klass).items() if isinstance(v, PerHost))
        return tuple(found.values())

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._arrays = self.arrays()
        for a in self._arrays:
            setattr(self, a.name, a.new())
        self.first_ts = math.inf  # oldest event time ever accepted: the stream's start
        self.live_since: float | None = None  # wall clock of the first live arrival (not persisted)

    def grow(self, n: int) -> None:
        """Room for ``n`` hosts in every array."""
        for a in self._arrays:
            setattr(self, a.name, grow(getattr(self, a.name), n, a.fill))

    # -- what arrives ---------------------------------------------------------------------------

    def hear(self, ts: np.ndarray, hosts: np.ndarray, n: int) -> None:
        """Records heard from ``hosts`` at ``ts`` (late ones included): marks, stream progress,
        sampling steps and jitter move."""
        if np.isnan(ts).any():
            # A time that is no number says nothing: the running max below carried it to every
            # record after it in the batch, whose hosts then went unheard.
            keep = ~np.isnan(ts)
            ts, hosts = ts[keep], hosts[keep]
        # Stream progress at each record (a running max): the same whatever the batching.
        prior = self.hwm[:n]
        start = float(np.nanmax(prior)) if n and not np.isnan(prior).all() else -math.inf
        progress = np.maximum(np.maximum.accumulate(ts), start)
        np.fmax.at(self.seen, hosts, progress)
        # Before latest_steps moves the steps a leap is measured against.
        self._leaps(ts, hosts, progress, start, n)
        # Before latest_steps shortens the promise a record broke.
        self._sooner(ts, hosts, n)
        # Before latest_steps moves the shortest step its deviations are measured from.
        step_jitter(self.jitter, self.jitter_n, ts, hosts, self.hwm, self.trusted_step)
        # The step the release rule waits by (docs/architecture.md §4); absence scales with the
        # step of released samples instead (GpuState.host_step, see Engine._rows).
        latest_steps(
            self.step, ts, hosts, self.hwm, self.config.max_lag, shortest=self.min_step, sampled=self.trusted_step
        )
        np.fmax.at(self.hwm, hosts, ts)
        # ``jump`` is kept by screening record by record (its fast path runs only when no host
        # claims a jump): clearing it here for every host heard would make a claim depend on
        # whether its next record came in the same batch.

    def _sooner(self, ts: np.ndarray, hosts: np.ndarray, n: int) -> None:
        """Which hosts sent a record sooner after their record before it than the shortest step
        they were trusted with, less twice its margin (``whole_bound``'s promise, as it stood
        before these records, broken by more than jitter): ``sooner``, for this batch."""
        self.sooner[:] = False
        step = np.fmin(self.min_step[:n], self.trusted_step[:n])
        if np.isnan(step).all():
            return
        soonest = step - 2 * self.jitter_margin(step, n)
        h, gap = _host_gaps(ts, hosts, self.hwm)
        with np.errstate(invalid="ignore"):
            early = (gap > 0) & (gap < soonest[h])
        self.sooner[h[early]] = True

    def _leaps(self, ts: np.ndarray, hosts: np.ndarray, progress: np.ndarray, start: float, n: int) -> None:
        """Records that leapt ahead: further than ``allowed_lateness`` past the stream's progress
        before them, in a step forward of their own host longer than ``allowed_lateness`` plus
        its step before (a host's first record: any step; its second: the fleet's longest). A
        host sampling slowly, or alone at the front, walks its own steps and never leaps; a
        clock set minutes ahead does."""
        before = np.empty_like(progress)
        before[:1] = start
        before[1:] = progress[:-1]
        lateness = self.config.allowed_lateness
        with np.errstate(invalid="ignore"):
            cand = np.isfinite(before) & (ts - before > lateness)
        if not cand.any():
            return  # (the common case: no record is far ahead of the stream)
        o, h, t, first, gap = _host_order(ts, hosts, self.hwm)
        with np.errstate(invalid="ignore"):
            back = (gap < 0).any()
        if back:
            # A clock that stepped back: a step is measured from the host's newest time before
            # the record (its mark, as ``hwm`` has it across batches), not from the record
            # before it, or a leap would depend on whether the step back came in its batch.
            prev = np.empty_like(t)
            prev[first] = self.hwm[h[first]]
            prev[~first] = _group_running_max(t, first)[:-1][~first[1:]]
            prev = np.fmax(prev, self.hwm[h])
            gap = t - prev
        # Each record's host's latest step forward before it (as latest_steps keeps it).
        with np.errstate(invalid="ignore"):
            forward = gap > 0
        idx = np.where(forward, np.arange(len(h)), -1)
        last = np.maximum.accumulate(idx)  # latest forward step at or before each record
        group = np.maximum.accumulate(np.where(first, np.arange(len(h)), 0))
        upto = np.empty_like(last)
        upto[0] = -1
        upto[1:] = last[:-1]
        upto[first] = -1
        upto[upto < group] = -1
        step_before = np.where(upto >= 0, np.minimum(gap[np.maximum(upto, 0)], self.config.max_lag), self.step[h])
        # A host's second record has no step of its own before it: the fleet's longest step (as
        # the batch found it) stands in, as ``wait`` has it for a host seen once; with none known
        # anywhere, it does not leap. Not never: a clock set ahead between a host's first samples
        # would be the front unchecked. Not 0: at 60 s sampling a first step would be a leap.
        steps = self.step[:n]
        fleet = float(np.nanmax(steps)) if n and not np.isnan(steps).all() else math.nan  # (none: no judging)
        with np.errstate(invalid="ignore"):
            leapt = cand[o] & (np.isnan(gap) | (gap > lateness + np.where(np.isnan(step_before), fleet, step_before)))
        if leapt.any():
            ahead = np.minimum((ts - before)[o][leapt], self.config.max_ahead)
            np.fmax.at(self.lead, h[leapt], ahead)

    def one_per_tick(self, ts: np.ndarray, hosts: np.ndarray, dcgm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each host's DCGM samples one to a tick: a sample that falls in the tick of its host's
        newest sample before it (as moved), in that tick's last ``SAMPLE_SHIFT`` and at least a
        tick less that much after that sample (a host sampling at the tick, early), moves to the
        next tick's start; the other GPUs of the sample (the same time) move with it, and a
        sample older than the host's newest (sent again, out of order) neither moves nor counts
        as its newest. ``ts``, ``hosts``, ``dcgm`` (which records are DCGM samples): a batch in
        stream order. Returns the times, moved, and which moved. A sample's move depends on its
        host's samples before it alone, so replay and every serve topology move the same ones
        (docs/architecture.md §4).

        >>> c = HostClock(EngineConfig(tick=1.0))
        >>> c.grow(1)
        >>> t, moved = c.one_per_tick(np.array([100.01, 100.96, 100.96, 102.0]), np.zeros(4, np.int64), np.ones(4, bool))
        >>> t.tolist(), moved.tolist()  # 100.96 shares 100.01's tick: it goes to 101
        ([100.01, 101.0, 101.0, 102.0], [False, True, True, False])
        """
        moved = np.zeros(len(ts), bool)
        with np.errstate(invalid="ignore"):
            idx = np.flatnonzero(dcgm & np.isfinite(ts))
        if not len(idx):
            return ts, moved
        t, h = ts[idx], hosts[idx]
        tick = self.config.tick
        margin = SAMPLE_SHIFT * tick
        k = np.floor(t / tick)
        cand = t >= (k + 1) * tick - margin
        # Each host's samples together, in stream order, with the one each is judged against:
        # the newest before it (the latest of equal ones), -1 where that is the kept state's.
        o = np.argsort(h, kind="stable")
        ho, to = h[o], t[o]
        first = np.ones(len(o), bool)
        first[1:] = ho[1:] != ho[:-1]
        top = _group_running_argmax(to, first)  # the newest up to and including each
        before = np.empty(len(o), np.int64)
        before[0] = -1
        before[1:] = top[:-1]
        before[first] = -1
        newest = top[np.r_[np.flatnonzero(first)[1:] - 1, len(o) - 1]]  # each host's, its run's last
        last_ts, last_at = self.dcgm_ts, self.dcgm_at
        newo = to.copy()
        if cand.any():
            # In order, a host's samples one by one, since a move depends on the one before: only
            # the rows in a tick's last tenth (a tenth of them at spread phases) can move.
            for j in np.flatnonzero(cand[o]).tolist():
                p = int(before[j])
                p_ts, p_at = (float(to[p]), float(newo[p])) if p >= 0 else (math.nan, math.nan)
                s_ts = float(last_ts[ho[j]])
                if p < 0 or s_ts > p_ts:  # the kept newest is newer than the batch's before it
                    p_ts, p_at = s_ts, float(last_at[ho[j]])
                tj = float(to[j])
                if tj == p_ts:
                    newo[j] = p_at  # another GPU of the sample before
                elif tj > p_ts and math.floor(p_at / tick) == k[o[j]] and tj - p_ts >= tick - margin:
                    newo[j] = _tick_start(k[o[j]] + 1, tick)
            new = np.empty_like(t)
            new[o] = newo
            moved[idx] = new != t
        else:
            new = t
        # Each host's newest sample, kept where this batch has none newer.
        hs, nt = ho[newest], to[newest]
        with np.errstate(invalid="ignore"):
            newer = ~(last_ts[hs] > nt)
        self.dcgm_ts[hs[newer]] = nt[newer]
        self.dcgm_at[hs[newer]] = newo[newest][newer]
        if not moved.any():
            return ts, moved
        out = ts.copy()
        out[idx] = new
        return out, moved

    def arrived(self, now: float, hosts: np.ndarray) -> None:
        """Records of ``hosts`` arrived at wall clock ``now`` (a live consumer)."""
        self.arrival[hosts] = now
        if self.live_since is None:
            self.live_since = now

    def accepted(self, ts: np.ndarray) -> None:
        """Records at ``ts`` were accepted: the stream's start moves back to the oldest."""
        self.first_ts = min(self.first_ts, float(ts.min())) if len(ts) else self.first_ts

    def note_whole(
        self, origins: Sequence[str], hosts: np.ndarray, ts: np.ndarray | None = None, dcgm: np.ndarray | None = None
    ) -> None:
        """Which hosts of this batch sent their samples as per-host messages, whole: only arrays
        of their own records, each with as many DCGM rows at a time as the host's sample before
        it held (docs/architecture.md §4). ``ts``: the rows' times as sent; ``dcgm``: which rows
        are DCGM samples (both None: messages alone are judged).

        >>> c = HostClock(EngineConfig(tick=1.0))
        >>> c.grow(1)
        >>> def msg(t, n): c.note_whole(Origins(["m"], np.zeros(n, np.int64), np.arange(n)), np.zeros(n, np.int64), np.full(n, t), np.ones(n, bool))
        >>> msg(100.0, 8); bool(c.whole[0])  # a host's first sample: its size is not known yet
        False
        >>> msg(101.0, 8); bool(c.whole[0])
        True
        >>> msg(102.0, 4); bool(c.whole[0])  # half a sample: the rest may still come
        False
        """
        if not len(hosts):
            return
        if isinstance(origins, Origins):
            m = origins.msg
            whole = origins.pos >= 0  # an element of an array message, not a bare record
        else:  # decoded message by message (a batch of one, or a doubtful one): "<origin>#<i>"
            parts = [o.rpartition("#") for o in origins]
            whole = np.array([sep == "#" and i.isdigit() for _, sep, i in parts], bool)
            ids: dict[str, int] = {}
            m = np.array([ids.setdefault(name, len(ids)) for name, _, _ in parts], np.int64)
        mixed = (m[1:] == m[:-1]) & (hosts[1:] != hosts[:-1])
        if mixed.any():  # a message with several hosts' records: not per host
            whole &= ~np.isin(m, m[1:][mixed])
        if ts is not None and dcgm is not None:
            self._count_samples(m, hosts, ts, dcgm)
            # By each host's newest sample so far, not by this batch's rows: a batch with none
            # of its samples (its NCCL records) between a split sample's halves is no whole one.
            with np.errstate(invalid="ignore"):
                whole &= np.isnan(self.sample_ts[hosts]) | (self.sample_n[hosts] >= self.sample_prev[hosts])
        # A host that sent sooner than it promised (another producer's records among its
        # samples, say) is not trusted with the promise in this batch.
        whole &= ~grow(self.sooner, len(self.whole), False)[hosts]
        self.whole[hosts] = True
        self.whole[hosts[~whole]] = False

    def _count_samples(self, m: np.ndarray, hosts: np.ndarray, ts: np.ndarray, dcgm: np.ndarray) -> None:
        """Move on each host's newest DCGM sample so far (``sample_ts``): how many rows it has
        brought (``sample_n``), and how many the sample before it held (``sample_prev``; NaN, a
        host's first sample: not known). A row older than its host's newest so far (sent again,
        out of order) is not counted."""
        with np.errstate(invalid="ignore"):
            idx = np.flatnonzero(dcgm & np.isfinite(ts))
        if not len(idx):
            return
        # A sample: a host's consecutive rows at one time, in stream order (message ids are in
        # it: rows out of message order, a batch of both encodings, are sorted by them first).
        h, mm, t = hosts[idx], m[idx], ts[idx]
        in_order = len(mm) < 2 or bool((mm[1:] >= mm[:-1]).all())
        o = np.argsort(h, kind="stable") if in_order else np.lexsort((mm, h))
        h, t = h[o], t[o]
        new_host = np.ones(len(o), bool)
        new_host[1:] = h[1:] != h[:-1]
        back = (t[1:] < t[:-1]) & ~new_host[1:]
        newest = np.fmax(_group_running_max(t, new_host) if back.any() else t, self.sample_ts[h])
        keep = t >= newest
        if not keep.all():
            h, t = h[keep], t[keep]
            if not len(h):
                return
            new_host = np.ones(len(h), bool)
            new_host[1:] = h[1:] != h[:-1]
        cut = new_host.copy()
        cut[1:] |= t[1:] != t[:-1]
        first = np.flatnonzero(cut)
        total = np.diff(np.r_[first, len(h)]).astype(np.float64)
        sh, st, host_first = h[first], t[first], new_host[first]
        # What each sample is measured against: the one before it of its host in this batch, or
        # the kept one's; a first sample continuing the kept one adds to its count.
        kept_t, kept_n, kept_prev = self.sample_ts[sh], self.sample_n[sh], self.sample_prev[sh]
        same = host_first & (st == kept_t)
        total = np.where(same, total + kept_n, total)
        ref = np.full(len(first), np.nan)
        ref[1:] = total[:-1]
        ref[host_first] = np.where(same, kept_prev, np.where(kept_n > 0, kept_n, np.nan))[host_first]
        # Each host's last sample in the stream is its newest so far.
        last = np.r_[np.flatnonzero(np.diff(sh)), len(sh) - 1]
        self.sample_ts[sh[last]] = st[last]
        self.sample_n[sh[last]] = total[last]
        self.sample_prev[sh[last]] = ref[last]

    # -- what the marks say ---------------------------------------------------------------------

    def newest(self, n: int) -> float:
        """The newest event time accepted so far (-inf before any)."""
        hwm = self.hwm[:n]
        return float(np.nanmax(hwm)) if len(hwm) and not np.isnan(hwm).all() else -math.inf

    def wait(self, n: int, step: np.ndarray | None = None) -> np.ndarray:
        """How much stream progress each host may go without a record and still count as there:
        ``allowed_lateness`` plus its sampling step (a host seen once: the fleet's longest), and
        at least two and a half steps, as absence has it (checks.absent_after): a host that
        misses one sample still counts when its next one comes. ``step``: the hosts' steps,
        when not ``self.step``'s."""
        step = grow(self.step, n, np.nan)[:n] if step is None else step
        known = step[~np.isnan(step)]
        step = np.where(np.isnan(step), known.max() if len(known) else 0.0, step)
        return np.maximum(self.config.allowed_lateness + step, 2.5 * step)

    def alive(self, n: int) -> np.ndarray:
        """Hosts near the front, or whose records kept coming within ``allowed_lateness`` of stream
        progress: the hosts whose clocks say where the fleet is."""
        hwm, seen = self.hwm[:n], self.seen[:n]
        if not n or np.isnan(hwm).all():
            return np.zeros(n, bool)
        newest, lateness = float(np.nanmax(hwm)), self.config.allowed_lateness
        wait = self.wait(n)
        with np.errstate(invalid="ignore"):
            return (hwm >= newest - lateness) | (newest - seen <= wait)

    def watermark(self, n: int, released: float, now: float | None, pending: int) -> tuple[float, np.ndarray | None]:
        """The watermark, and how far each host is complete (-inf: not one the watermark waits
        for; None: neither start-up hold is over, so no host's word is taken yet). ``released``:
        what was processed; ``now``: a live consumer's wall clock; ``pending``: rows buffered."""
        hwm = self.hwm[:n]
        known = ~np.isnan(hwm)
        if not known.any():
            return released, None
        cfg = self.config
        if (
            now is not None
            and self.live_since is not None
            and now - self.live_since < cfg.idle_timeout
            and pending < cfg.max_pending
        ):
            return released, None  # live start-up: let every partition deliver first
        newest, lateness = float(hwm[known].max()), cfg.allowed_lateness
        front = self.front(n)
        seen = grow(self.seen, n, np.nan)[:n]
        wait = self.wait(n)
        with np.errstate(invalid="ignore"):
            # Near the front, or still sending (however far behind, up to max_lag).
            active = known & ((hwm >= front - lateness) | (front - seen <= wait))
            active &= hwm >= front - cfg.max_lag
        if now is not None:
            arrival = grow(self.arrival, n, np.nan)[:n]
            heard = ~np.isnan(arrival)
            with np.errstate(invalid="ignore"):
                recent = now - arrival <= cfg.idle_timeout
            # Live, a host heard from holds the watermark while its records keep arriving on the
            # wall clock, however far behind (a backlog drained partition by partition), and
            # stops holding it ``idle_timeout`` after its last one, however near the front.
            live = np.where(heard, known & recent, active)
            if live.any():  # (the whole fleet silent: as replay has it, until the idle flush)
                active = live
        complete = np.where(active, self.whole_bound(hwm, active, newest) - cfg.host_disorder, -np.inf)
        wm = float(complete[active].min())
        # A host's first sample may come up to its sampling interval after the stream's start:
        # at 30 s sampling, 30 s of lateness alone is not time enough for every host to appear.
        hold = (
            lateness + float(np.nanmax(self.step[:n], initial=0.0))
            if n and not np.isnan(self.step[:n]).all()
            else lateness
        )
        if newest - float(np.nanmin(self.first_ts)) < hold:
            # Start-up: hosts come online a little apart and one not seen yet cannot hold the
            # watermark, so wait out the allowed lateness before trusting the per-host marks.
            return max(released, min(wm, newest - hold)), None
        return max(released, wm), complete

    def front(self, n: int) -> float:
        """Where the fleet is, for judging which hosts are still sending: the newest time claimed,
        each host's less how far its clock once leapt ahead (``lead``). Measured from the time
        of one clock stepped minutes ahead (within ``max_ahead``, or its records are refused),
        every other host would count as gone at once and their samples of those minutes would
        be ``late``.

        >>> c = HostClock(EngineConfig())
        >>> c.grow(3)
        >>> c.hear(np.array([100.0, 100.5, 101.0, 101.0, 102.0, 191.0]), np.array([0, 1, 2, 0, 2, 2]), 3)
        >>> float(c.newest(3)), float(c.lead[2]), c.front(3)  # host 2's clock leapt 89 s
        (191.0, 89.0, 102.0)
        """
        claims = self.hwm[:n] - self.lead[:n]
        return float(np.nanmax(claims)) if n and not np.isnan(claims).all() else -math.inf

    def whole_bound(self, hwm: np.ndarray, active: np.ndarray, newest: float) -> np.ndarray:
        """How far each host is complete: its newest sample, or, for a host sending per-host
        messages, every tick before its next sample is due (``hwm`` plus the shortest step it
        sampled at, ``trusted_step`` where known, less ``jitter_margin``), up to the tick of the
        fleet's newest sample (docs/architecture.md §4).

        >>> c = HostClock(EngineConfig(tick=1.0))
        >>> c.grow(1); c.whole[0] = True; c.min_step[0] = 1.0
        >>> float(c.whole_bound(np.array([100.2]), np.array([True]), 100.2)[0])
        101.0
        """
        n = len(hwm)
        whole = grow(self.whole, n, False)[:n] & active
        if not whole.any():
            return hwm
        tick = self.config.tick
        # (fmin: never longer than min_step, which a clock built by hand may set alone.)
        step = np.fmin(grow(self.min_step, n, np.nan)[:n], grow(self.trusted_step, n, np.nan)[:n])
        # The promise is about the host's samples: counted from its newest DCGM sample (as sent),
        # not from a record of another producer at that time or after it, which came in a message
        # of its own and says nothing of the sample (a host without samples: its newest record;
        # a sample newer than that was refused, ahead of the fleet).
        dcgm_ts = grow(self.dcgm_ts, n, np.nan)[:n]
        with np.errstate(invalid="ignore"):
            sampled = dcgm_ts <= hwm
        base = np.where(sampled, dcgm_ts, hwm)
        end = (np.floor(base / tick) + 1) * tick
        with np.errstate(invalid="ignore"):
            soonest = step - self.jitter_margin(step, n)  # the next sample comes no sooner
            upto = np.floor((base + soonest) / tick) * tick
            # Or it falls in the last SAMPLE_SHIFT of the tick its newest sample went to, where it
            # is moved to the next (one_per_tick), so the host is complete for that tick, whatever
            # its phase: where its next sample comes at least 1 - SAMPLE_SHIFT ticks on.
            shift = SAMPLE_SHIFT * tick
            moved_end = (np.floor(grow(self.dcgm_at, n, np.nan)[:n] / tick) + 1) * tick
            moves = sampled & (soonest >= tick - shift)
            moves &= base + soonest >= moved_end - shift
            end = np.where(moves, moved_end, end)
            whole &= (upto >= end) | moves
        # (np.floor: a newest time of infinity is no integer, and math.floor raised on it.)
        ahead = np.maximum(end, np.minimum(upto, np.floor(newest / tick) * tick))
        # Never short of the per-record rule: a record newer than the sample has come.
        return np.where(whole, np.fmax(ahead, hwm), hwm)

    def jitter_margin(self, step: np.ndarray, n: int) -> np.ndarray:
        """How much sooner than its shortest step each host's next sample may come: 5 % of the
        step (or of a tick, if more) until the host has shown its jitter over
        ``JITTER_TRUSTED_AFTER`` steps, then twice the largest deviation it showed (fading), no
        less than 0.5 % and no more than 5 %."""
        scale = np.maximum(step, self.config.tick)
        jitter = grow(self.jitter, n, np.nan)[:n]
        shown = grow(self.jitter_n, n, 0.0)[:n] >= JITTER_TRUSTED_AFTER
        with np.errstate(invalid="ignore"):
            return np.where(shown, np.clip(2 * jitter, 0.005 * scale, 0.05 * scale), 0.05 * scale)

    # -- state ----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """The kept arrays and the stream's start, under their snapshot keys."""
        state: dict[str, Any] = {a.key: to_dict(getattr(self, a.name)) for a in self._arrays if a.key}
        state["first_ts"] = self.first_ts
        return state

    def load_state(self, data: Mapping[str, Any]) -> None:
        """Where ``to_state`` left off; arrays a snapshot lacks (older ones) start as ``fill``."""
        n = len(from_dict(data["host_hwm"]))
        for a in self._arrays:
            if a.key is None:
                continue  # not kept: as it is
            if a.key in data:
                setattr(self, a.name, like(from_dict(data[a.key]), a.key, a.new()))
            elif a.absent_as is not None:  # declared after the array it stands in for
                setattr(self, a.name, getattr(self, a.absent_as).copy())
            else:
                setattr(self, a.name, a.new(n))
        first = data["first_ts"]
        if type(first) not in (int, float):  # (a bool is no time; None or text failed the next batch)
            raise StateError(f"snapshot: first_ts is {type(first).__name__}, expected a number")
        self.first_ts = float(first)


# How far before a tick's end a host's second sample of the tick may fall and still be moved to
# the next tick (a fraction of the tick; HostClock.one_per_tick): a host sampling at the tick
# whose samples jitter around the tick's start sends one sample a tick all the same.
SAMPLE_SHIFT = 0.1


def _tick_start(k: float, tick: float) -> float:
    """The start of tick ``k`` (``k * tick``), never a float's step short of it."""
    v = k * tick
    return v if math.floor(v / tick) >= k else float(np.nextafter(v, math.inf))


STEP_RECOVERY = 1.01  # how fast a host's shortest step is forgotten, per step (HostClock.min_step)
# Steps after which a shortest step has grown past any cap (1.01^7000 > 1e30): the exponent is
# capped there, so the powers stay finite however long a host's run in one batch.
_FORGOTTEN = 7000


def latest_steps(
    step: np.ndarray,
    ts: np.ndarray,
    hosts: np.ndarray,
    before: np.ndarray,
    cap: float,
    shortest: np.ndarray | None = None,
    sampled: np.ndarray | None = None,
) -> None:
    """Each host's latest step forward in event time, record to record in its own order, into
    ``step`` (per host, in place); ``before``: each host's time before these records. Steps
    longer than ``cap`` count as ``cap``. ``shortest``: each host's shortest step, kept as a
    running minimum that grows by ``STEP_RECOVERY`` a step (see ``HostClock.min_step``);
    ``sampled`` (with ``shortest``): the step that set it last, as the host sampled it, not
    grown (``HostClock.trusted_step``).

    >>> step, shortest, sampled = (np.full(1, np.nan) for _ in range(3))
    >>> latest_steps(step, np.array([0.0, 30.0, 90.0]), np.zeros(3, np.int64), np.full(1, np.nan), 300.0,
    ...              shortest=shortest, sampled=sampled)  # a missed sample: one step of 60 s
    >>> float(step[0]), round(float(shortest[0]), 2), float(sampled[0])
    (60.0, 30.3, 30.0)
    """
    if not len(ts):
        return
    h, gap = _host_gaps(ts, hosts, before)
    with np.errstate(invalid="ignore"):
        fwd = np.flatnonzero(gap > 0)
    if not len(fwd):
        return
    hf, g = h[fwd], np.minimum(gap[fwd], cap)
    starts, ends, count, after = _runs(hf)
    hs = hf[ends]
    step[hs] = g[ends]
    if shortest is not None:
        # m_k = min(g_k, m_(k-1) * r) over a host's steps of the batch, in closed form: the
        # minimum over its steps j of g_j * r^(steps after j), and of the old m * r^(its steps).
        grown = g * STEP_RECOVERY ** np.minimum(after, _FORGOTTEN)
        old = shortest[hs] * STEP_RECOVERY ** np.minimum(count, _FORGOTTEN)
        new = np.minimum.reduceat(grown, starts)
        if sampled is not None:
            # The step of the batch the new minimum came from (of equal ones, the shortest).
            came = np.minimum.reduceat(np.where(grown == np.repeat(new, count), g, np.inf), starts)
            with np.errstate(invalid="ignore"):
                won = (new < old) | np.isnan(old)
                sampled[hs] = np.where(won, came, np.where(new == old, np.fmin(sampled[hs], came), sampled[hs]))
        shortest[hs] = np.fmin(old, new)


def _host_gaps(ts: np.ndarray, hosts: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Records grouped by host (stable: each host's in its own order): their hosts, and each
    one's step from the record before it of its host (``before``: each host's time before
    these records; NaN where unknown, negative where a record went back in time)."""
    _, h, _, _, gap = _host_order(ts, hosts, before)
    return h, gap


def _host_order(
    ts: np.ndarray, hosts: np.ndarray, before: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_host_gaps`` with what it is built from: the order that groups the records by host,
    their hosts and times in it, where each host's run starts, and the steps."""
    o = np.argsort(hosts, kind="stable")
    h, t = hosts[o], ts[o]
    prev = np.empty_like(t)
    prev[1:] = t[:-1]
    first = np.ones(len(h), bool)
    first[1:] = h[1:] != h[:-1]
    prev[first] = before[h[first]]
    return o, h, t, first, t - prev


def _group_running_argmax(t: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Where the running maximum of ``t`` within each run that ``first`` starts was reached, up to
    and including each element (of equal values, the latest), as indices into ``t``; no NaN.

    >>> _group_running_argmax(np.array([3.0, 1.0, 3.0, 2.0, 1.0]), np.array([True, False, False, True, False])).tolist()
    [0, 0, 2, 3, 3]
    """
    if not len(t):
        return np.zeros(0, np.int64)
    # Ranked by value, then position, so that of equal values the later ranks higher.
    order = np.lexsort((np.arange(len(t)), t))
    rank = np.empty(len(t), np.int64)
    rank[order] = np.arange(len(t))
    run = np.cumsum(first) - 1
    key = np.maximum.accumulate(run * len(t) + rank)
    return order[key - run * len(t)]


def _group_running_max(t: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The running maximum of ``t`` within each run that ``first`` starts (``_host_gaps``'s
    grouping), in linear-logarithmic time: values are ranked, and each run's ranks are offset
    past every earlier run's, so one running maximum over the whole array restarts at each run.
    No NaN in ``t`` (``HostClock.hear`` drops them); infinities rank as any value.

    >>> _group_running_max(np.array([3.0, 1.0, 5.0, 2.0, 1.0]), np.array([True, False, False, True, False])).tolist()
    [3.0, 3.0, 5.0, 2.0, 2.0]
    """
    if not len(t):
        return t.copy()
    order = np.argsort(t, kind="stable")
    rank = np.empty(len(t), np.int64)
    rank[order] = np.arange(len(t))
    run = np.cumsum(first) - 1
    key = np.maximum.accumulate(run * len(t) + rank)
    return t[order[key - run * len(t)]]


def _runs(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For ids grouped into runs (``_host_gaps``): each run's first and last index, its length,
    and per element how many elements of its run come after it."""
    # (np.r_ parses its index in Python, ~15 us a call; these run twice a tick.)
    first = np.empty(len(h), dtype=bool)
    first[:1] = True
    np.not_equal(h[1:], h[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:] - 1
    ends[-1:] = len(h) - 1
    count = ends - starts + 1
    return starts, ends, count, np.repeat(ends, count) - np.arange(len(h))


JITTER_FADE = 0.99  # how fast a host's largest deviation is forgotten, per step (HostClock.jitter)
JITTER_TRUSTED_AFTER = 10  # steps measured before a host's own jitter replaces the 5 % margin
_JITTER_MAX_MULTIPLE = 3  # a longer step (a gap, a restart) says nothing of the sampler's jitter


def step_jitter(
    jitter: np.ndarray, count: np.ndarray, ts: np.ndarray, hosts: np.ndarray, before: np.ndarray, ref: np.ndarray
) -> None:
    """Each host's jitter into ``jitter`` and ``count`` (per host, in place): how far each of its
    steps forward in these records, in its own order, lies from the nearest whole multiple (one
    to three) of ``ref``, the shortest step it sampled at before them (a missed sample is two
    steps, not jitter); a running maximum faded by ``JITTER_FADE`` a step. ``before``: each
    host's time before these records. Hosts without a shortest step yet are not measured."""
    if not len(ts):
        return
    h, gap = _host_gaps(ts, hosts, before)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = ref[h]
        k = np.rint(gap / m)
        use = np.flatnonzero((gap > 0) & (m > 0) & (k <= _JITTER_MAX_MULTIPLE))
    if not len(use):
        return
    hu, dev = h[use], np.abs(gap[use] - np.maximum(k[use], 1) * m[use])
    starts, ends, steps, after = _runs(hu)
    faded = dev * JITTER_FADE ** np.minimum(after, _FORGOTTEN)
    hs = hu[ends]
    jitter[hs] = np.fmax(jitter[hs] * JITTER_FADE ** np.minimum(steps, _FORGOTTEN), np.maximum.reduceat(faded, starts))
    count[hs] += steps
