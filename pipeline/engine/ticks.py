"""Tick skipping: how far the tick grid may jump where walking it would do nothing.

Called where no row falls between the next tick and a limit, so those ticks all see the same
state; only the tick checks (absence) and their lifecycles act at a tick without rows. Over a
run of ticks where no check's condition can flip (``changes``) and no lifecycle deadline falls
(``for:``, ``keep_firing_for:``; ``Lifecycle.next_change``), walking every tick is the same as
one step at the last of them, and when no condition holds and no alert is active, the same as
none (docs/architecture.md §4; tested against the walk in
tests/unit/engine/test_engine_tick_skipping.py).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from pipeline.engine.checks import TickCheck
from pipeline.engine.config import EngineConfig
from pipeline.engine.entities import Entities
from pipeline.engine.lifecycle import Lifecycle
from pipeline.engine.state import GpuState


def skip_ahead(
    next_tick: float,
    limit: float,
    config: EngineConfig,
    tick_checks: Sequence[TickCheck],
    lifecycles: Mapping[str, Lifecycle],
    state: GpuState,
    entities: Entities,
    arrival_step: np.ndarray,
) -> float:
    """The next tick to walk, at or after ``next_tick``, with every tick up to ``limit`` that
    cannot change anything skipped. ``arrival_step``: each host's sampling step on arrival
    (``HostClock.step``), for a check that cannot say when it changes (``settled_after``)."""
    tick, a = config.tick, next_tick
    if math.isinf(limit) or math.isnan(a):
        return next_tick
    last = math.floor(limit / tick) * tick
    if not last > a:  # the densely sampled case: at most this tick before the next row
        return next_tick
    state.ensure(entities.n_gpus, entities.n_hosts)
    idle = True
    for check in tick_checks:
        changes = getattr(check, "changes", None)
        if changes is not None:
            x = changes(state, entities, config)
            with np.errstate(invalid="ignore"):
                x = x[x >= a - 2 * tick]  # those further back have flipped already
        elif a <= settled_after(config, tick_checks, state, arrival_step) + 2 * tick:
            return next_tick  # a check that cannot say when it changes: walked until all is settled
        else:
            x = np.empty(0)
        lc = lifecycles[check.meta.name]
        cond = check.evaluate_tick(a, state, entities, config)
        cond = cond if cond.dtype == bool else cond.astype(bool)
        due = lc.next_change(cond)
        if len(x):
            due = min(due, float(x.min()))
        # A whole tick of margin on either side of a deadline: the tick where it falls is
        # walked whatever the rounding of ``t - last_ts > after``.
        if due <= last + tick:
            if due < a:
                return next_tick
            last = math.floor(due / tick) * tick - tick
            if last < a:
                return next_tick
        idle = idle and lc.idle and not cond.any()
    if idle:
        return last + tick  # every one of these ticks would do nothing
    if last > a:
        return last  # one step, at the last of them, does what all would
    return next_tick


def settled_after(
    config: EngineConfig, tick_checks: Sequence[TickCheck], state: GpuState, arrival_step: np.ndarray
) -> float:
    """When every absence deadline after the newest sample has passed and every lifecycle on it
    has settled: the bound for a tick check that cannot say when it changes."""
    last = float(np.nanmax(state.last_ts)) if len(state.last_ts) and not np.isnan(state.last_ts).all() else -math.inf
    hold = max((c.meta.for_s + c.meta.keep_firing_for_s for c in tick_checks), default=0.0)
    step = np.concatenate([arrival_step, state.host_step])  # released steps come from arrived ones
    step = step[~np.isnan(step)]
    slow = 2.5 * float(step.max()) if len(step) else 0.0  # checks.absent_after
    return last + max(config.gpu_absent_after, config.host_silent_after, slow) + hold + 2 * config.tick
