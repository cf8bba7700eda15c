"""Fleet-wide causes that explain per-GPU findings away (docs/models.md#explain-away).

A cause that every GPU shows -- a facility power cap, a checkpoint or job restart (the fleet
idles), a warm afternoon -- moves GPUs apart in ways that look like a per-GPU fault to a
detector that compares a GPU with its peers. Under a fleet-wide software power cap, for one,
the GPU that draws the most power on its host is held a few per cent lower than its neighbours,
and in a synchronous job its communicator peers then wait 10-20 % on it: a "straggler" that is
the cap's doing, not the GPU's.

``FleetContext`` keeps, per GPU, when it was last seen, when it last showed the cap and its
last SM clock; each tick it says which causes are in force fleet-wide and, for a finding on a
GPU, whether a cause in force explains it. Models name the causes that may explain their
findings away (``explained_by`` in ``rules/models.yaml``). Host-wide versions of these causes
are handled inside the detectors (host means and medians); this is the fleet-wide layer.

A cap explains a finding only when the GPU itself is capped and its clock is within
``CLOCK_TOLERANCE`` of its host's median: a straggler that is 30 % slower than its capped
neighbours is still a straggler, and says so, with the cap named in its evidence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.state import View
from pipeline.gpu_models import lookup
from pipeline.models.cohorts import EPOCH_S, PartError, check_int_array
from pipeline.models.detectors._util import nan_to_num, repeats
from pipeline.numeric import group_stat, grow

SW_POWER_CAP = FIELDS.bits["SW_POWER_CAP"].mask
_REASONS = FIELDS.require("clocks_event_reasons").column
_LIMIT = FIELDS.require("enforced_power_limit").column
_CLOCK = FIELDS.require("sm_clock").column
COLUMNS = {_REASONS, _LIMIT, _CLOCK}

WINDOW_S = 90.0  # a GPU counts as seen / capped for this long (three samples at 30 s sampling)
FLEET_SHARE = 0.6  # a cause is fleet-wide when at least this share of the recently seen GPUs shows it
MIN_GPUS = 8  # ... and at least this many GPUs were seen
LIMIT_LOWERED = 0.97  # an enforced power limit under 97 % of the board's is a cap
CLOCK_TOLERANCE = 0.92  # a capped GPU's clock within 8 % of its host's median is explained by the cap
# The window in whole epochs (cohorts.py): a part counts GPUs by the epoch they were last seen /
# capped in, and "seen within WINDOW_S of an epoch's end" is exactly "in one of its last SPAN".
SPAN = round(WINDOW_S / EPOCH_S)
assert SPAN * EPOCH_S == WINDOW_S, "the context's window must be whole epochs"


class FleetContext:
    """Per-GPU arrays updated once per tick; see the module docstring."""

    def __init__(self) -> None:
        self.seen = np.full(0, np.nan)
        self.cap_ts = np.full(0, np.nan)
        self.lim_max = np.full(0, np.nan)
        self.clock = np.full(0, np.nan)
        self.host = np.full(0, -1, dtype=np.int64)
        self.now = np.nan
        self.power_cap_share = 0.0
        self.n_recent = 0

    def _ensure(self, n: int) -> None:
        if len(self.seen) < n:
            self.seen, self.cap_ts = grow(self.seen, n, np.nan), grow(self.cap_ts, n, np.nan)
            self.lim_max, self.clock = grow(self.lim_max, n, np.nan), grow(self.clock, n, np.nan)
            self.host = grow(self.host, n, -1)

    def update(self, view: View, n_gpus: int, board_w: np.ndarray, now: float) -> None:
        """Fold one tick's rows in. ``board_w``: per row, the GPU model's board power (NaN
        unknown); ``now``: the tick's end (so every shard judges a GPU at the same time)."""
        self._ensure(n_gpus)
        fr = view.frame
        if not len(fr):
            return
        rep = repeats(fr.gpu)
        if rep is None:  # one row per GPU (the usual tick)
            self._fold(view, board_w, None)
        else:
            # A GPU at several times in the tick: its rows in their order, each a layer after the
            # one before (a repeated id in one scatter keeps one row's value, not the running max).
            for rows in rep[1]:
                self._fold(view, board_w[rows], rows)
        self.now = now if np.isnan(self.now) else max(self.now, now)

    def _fold(self, view: View, board_w: np.ndarray, rows: np.ndarray | None) -> None:
        """``update``'s per-GPU step for ``rows`` of the view (None: all), each GPU at most once."""
        fr = view.frame
        pick = slice(None) if rows is None else rows
        ent, ts = fr.gpu[pick], fr.ts[pick]
        reasons = view.filled[:, _REASONS][pick]
        lim = view.filled[:, _LIMIT][pick]
        with np.errstate(invalid="ignore"):
            bit = np.where(np.isnan(reasons), False, (nan_to_num(reasons).astype(np.int64) & SW_POWER_CAP) != 0)
            self.lim_max[ent] = np.fmax(self.lim_max[ent], lim)
            board = np.fmax(board_w, self.lim_max[ent])
            lowered = lim < LIMIT_LOWERED * board
        capped = bit | lowered
        self.seen[ent] = ts
        self.cap_ts[ent] = np.where(capped, ts, self.cap_ts[ent])
        self.clock[ent] = view.filled[:, _CLOCK][pick]
        self.host[ent] = fr.host[pick]

    def cohort_part(self, epoch: int) -> dict[str, Any]:
        """How many of the shard's GPUs were last seen, and last capped, in each of the ``SPAN``
        epochs up to ``epoch`` (oldest first): the fleet's share follows from every shard's."""
        lo = epoch - SPAN + 1
        with np.errstate(invalid="ignore"):
            seen = np.floor(self.seen / EPOCH_S + 1e-9) - lo
            cap = np.floor(self.cap_ts / EPOCH_S + 1e-9) - lo
        seen = seen[(seen >= 0) & (seen < SPAN)].astype(np.int64)
        cap = cap[(cap >= 0) & (cap < SPAN)].astype(np.int64)
        return {"epoch": epoch, "seen": np.bincount(seen, minlength=SPAN), "capped": np.bincount(cap, minlength=SPAN)}

    @staticmethod
    def check_part(part: dict[str, Any], epoch: int) -> None:
        """``PartError`` unless ``part`` is what ``cohort_part(epoch)`` makes."""
        if set(part) != {"epoch", "seen", "capped"} or part["epoch"] != epoch:
            raise PartError(f"context part: {{'epoch': {epoch}, 'seen', 'capped'}} expected")
        for k in ("seen", "capped"):
            check_int_array(part[k], f"context {k}", length=SPAN)

    def apply_epoch(self, parts: Any, epoch: int) -> None:
        """The fleet's GPUs seen and capped within ``WINDOW_S`` of ``epoch``'s end, from every
        shard's part (a part of an earlier epoch: the shard had no rows since)."""
        recent = capped = 0
        for p in parts:
            if not p:
                continue
            cut = epoch - p["epoch"]  # this part's buckets from ``cut`` on are within the window
            recent += int(np.asarray(p["seen"])[cut:].sum())
            capped += int(np.asarray(p["capped"])[cut:].sum())
        self.n_recent = recent
        self.power_cap_share = capped / recent if recent else 0.0

    @property
    def fleet_power_cap(self) -> bool:
        return self.n_recent >= MIN_GPUS and self.power_cap_share >= FLEET_SHARE

    def in_force(self) -> dict[str, Any]:
        """The fleet-wide causes in force now, for an alert's evidence (empty when none)."""
        return {"fleet_power_cap": round(self.power_cap_share, 3)} if self.fleet_power_cap else {}

    def explains(self, cause: str, gpus: np.ndarray) -> np.ndarray:
        """Per GPU id in ``gpus``: whether ``cause`` (in force fleet-wide) explains a finding on it."""
        out = np.zeros(len(gpus), dtype=bool)
        if cause != "fleet_power_cap" or not len(gpus) or not self.fleet_power_cap:
            return out
        n = len(self.seen)
        recent = np.flatnonzero(self.now - self.seen[:n] <= WINDOW_S)
        med = group_stat(self.host[recent], self.clock[recent], "median")
        # The host's median over its recently seen GPUs, looked up through any of them.
        by_host: dict[int, float] = dict(zip(self.host[recent].tolist(), med.tolist()))
        g = np.asarray(gpus, dtype=np.int64)
        ref = np.array([by_host.get(int(h), np.nan) for h in self.host[g].tolist()])
        capped = self.now - self.cap_ts[g] <= WINDOW_S
        with np.errstate(invalid="ignore"):
            near = self.clock[g] >= CLOCK_TOLERANCE * ref
        return capped & near

    def to_state(self) -> dict[str, Any]:
        return {
            "n_recent": self.n_recent,
            "share": self.power_cap_share,
            "seen": self.seen,
            "cap_ts": self.cap_ts,
            "lim_max": self.lim_max,
            "clock": self.clock,
            "host": self.host,
            "now": self.now,
        }

    def load_state(self, st: dict[str, Any]) -> None:
        self.seen, self.cap_ts = np.array(st["seen"], float), np.array(st["cap_ts"], float)
        self.lim_max, self.clock = np.array(st["lim_max"], float), np.array(st["clock"], float)
        self.host, self.now = np.array(st["host"], np.int64), float(st["now"])
        self.n_recent, self.power_cap_share = int(st.get("n_recent", 0)), float(st.get("share", 0.0))


def board_power(cohort_names: list[str]) -> np.ndarray:
    """Board power per cohort index from the per-model table (NaN for models not in it)."""
    out = []
    for name in cohort_names:
        m = lookup(name)
        out.append(m.tdp_w if m is not None else np.nan)
    return np.array(out, dtype=float)
