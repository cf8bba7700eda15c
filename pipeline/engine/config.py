"""Engine settings: event-time semantics and absence detection."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from pipeline.errors import ConfigError


@dataclass(frozen=True)
class EngineConfig:
    """How the engine treats time.

    - ``allowed_lateness``: a host may lag the fleet by this much (seconds of event time) and its
      records still count; a host further behind stops holding the watermark back, and records
      older than the watermark go to the DLQ as ``late``.
    - ``host_disorder``: how far out of order one host's own records may arrive.
    - ``idle_timeout``: live input only (``process(..., now=...)``): a host whose records arrived
      within this many wall-clock seconds keeps holding the watermark even when it is further
      behind than ``allowed_lateness``, so a consumer catching up on a backlog partition by
      partition does not turn the slower partitions' records into late ones; and a host whose
      records stopped arriving this long ago stops holding it, however near the front it was
      (one dead node must not delay every other host's alerts by ``allowed_lateness``). For the same reason
      a live engine (fresh or restored) holds its first ``idle_timeout`` seconds of input, up to
      ``max_pending`` records, so every partition can deliver before any host counts as gone.
    - ``tick``: the engine processes samples one tick of event time at a time, and judges
      absence (a lost GPU, a silent host) at every tick boundary, so nothing depends on how
      records were batched. Rule windows resolve to whole ticks.
    - ``gpu_absent_after`` / ``host_silent_after``: silence that makes a finding.
    - ``max_lag``: a host whose records keep arriving holds the watermark however far it lags
      (its data is used, and it is never reported absent), up to this far behind the newest
      host; records further behind the fleet than this are ``late``. Bounds what a lagging host
      makes the engine buffer.
    - ``max_ahead``: a record further than this ahead of the fleet's present (the lower median
      of the hosts' newest event times) is ``ts_out_of_range``: one bad clock must not carry
      the watermark (and every other host's data) with it. A jump the fleet makes together is
      followed after its first record from each of half the hosts.
    - ``max_hosts``: hosts one engine keeps state for (a host stage's engine sees one
      telemetry partition's; ``serve`` gives a fleet stage's engine, which sees every host the
      host stages let through, this times the telemetry partitions); records of further new
      hosts are ``entity_limit`` dead letters, so junk host names cannot grow its memory
      without bound.
    """

    allowed_lateness: float = 30.0
    host_disorder: float = 0.0
    idle_timeout: float = 10.0
    max_pending: int = 500_000
    tick: float = 1.0
    gpu_absent_after: float = 30.0
    host_silent_after: float = 60.0
    max_lag: float = 300.0
    max_ahead: float = 300.0
    max_hosts: int = 16_384

    def __post_init__(self) -> None:
        for f in fields(self):
            val = getattr(self, f.name)
            # NaN passes ``val < 0`` and crashes the engine (a NaN tick, a NaN max_hosts); an int
            # past a float's range (400 digits) is no finite number either.
            try:
                ok = not isinstance(val, bool) and isinstance(val, (int, float)) and 0 <= float(val) < math.inf
            except OverflowError:
                ok = False
            if not ok:
                # A huge int is not turned into text: past 4,300 digits repr() itself raises.
                big = isinstance(val, int) and val.bit_length() > 64
                shown = f"an integer of {val.bit_length()} bits" if big else repr(val)[:40]
                raise ConfigError(f"engine.{f.name}", f"must be a finite non-negative number, got {shown}")
            if f.type in ("int", int):  # a count: 1.5 hosts would be cut, or crash an array's size
                if val != int(val):
                    raise ConfigError(f"engine.{f.name}", f"must be a whole number, got {val!r}")
                object.__setattr__(self, f.name, int(val))
            else:  # seconds: 2 from YAML is 2.0, as it was when the section was read as floats
                object.__setattr__(self, f.name, float(val))
        if self.tick <= 0:
            raise ConfigError("engine.tick", "must be > 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "EngineConfig":
        """Build from a config mapping; unknown keys are errors that name the key."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"engine.{key}", f"unknown key (known: {', '.join(sorted(known))})")
        return cls(**data)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
