"""Messages -> decoder -> engine: the step every driver (service, replay, demo, bench) shares."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence, overload

from pipeline.bus.base import Message
from pipeline.colwire import is_columnar
from pipeline.decode import INTERNAL, RAW_KEEP, Decoder
from pipeline.engine import Engine, EngineOutput
from pipeline.engine.engine import MOVED
from pipeline.protocols import Detector
from pipeline.schema import DeadLetter

log = logging.getLogger("gpuwarden.runner")


@dataclass
class Totals:
    messages: int = 0
    records: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    alerts: Counter[str] = field(default_factory=Counter)  # firing alerts by fault family

    def add(self, out: EngineOutput) -> None:
        for d in out.dead:
            self.dead[d.reason] += 1
        for a in out.alerts:
            if a.state == "firing":
                self.alerts[a.family] += 1


class _Origins(Sequence[str]):
    """The messages' origins, spelled out only when one is read (by a dead letter)."""

    __slots__ = ("messages",)

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [m.origin for m in self.messages[i]]
        return self.messages[i].origin


class Pipeline:
    """Decode a batch of messages and feed the detector; dead letters from both come back. The
    host stage's ``PartitionTask`` in the service (``pipeline/protocols.py``)."""

    def __init__(
        self, engine: Detector | None = None, decoder: Decoder | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        """``clock``: a live consumer's monotonic wall clock (see ``EngineConfig.idle_timeout``)."""
        self.engine: Detector = engine or Engine()
        self.decoder = decoder or Decoder()
        self.clock = clock
        self.totals = Totals()
        # The detector's held-record drops as last taken (``take_held_drops``): its counts run
        # from the stage's start or snapshot, the service's counter from this process's start.
        self._held_seen: dict[str, int] = {}
        # Likewise the samples it moved to the next tick (``take_moved``).
        self._moved_seen = 0

    def handle(self, messages: Sequence[Message]) -> EngineOutput:
        """The batch's alerts and dead letters, and what the detector forwarded (``forwarded``)."""
        out = EngineOutput()
        if self.decoder.fields is not self.engine.decode_fields:  # new engine or rules reloaded
            self.decoder.set_fields(self.engine.decode_fields)
        # Headers say a message's encoding (colwire.is_columnar); a batch without any is all JSON.
        columnar = [is_columnar(m.headers) for m in messages] if any(m.headers for m in messages) else None
        d = self.decoder.decode_many([m.value for m in messages], _Origins(messages), columnar)
        records, origins = d.records, d.origins
        out.dead.extend(d.dead)
        out.extend(self.engine.process(records, origins, now=self.clock() if self.clock else None))
        self.totals.messages += len(messages)
        self.totals.records += len(records)
        self.totals.add(out)
        return out

    def checkpoint_offset(self, next_offset: int) -> int:
        """Where a checkpoint taken now resumes: the next message (the engine's snapshot holds
        every record it was given)."""
        return next_offset

    def handle_guarded(self, messages: Sequence[Message]) -> EngineOutput:
        """``handle``, where an unexpected error costs only the message that caused it.

        In the service an exception out of a batch would leave before checkpoint and commit, so
        every restart would read the same message and die with it (a poison pill); in replay it
        ended the run and lost the rest of the file. Instead the batch is handled again one
        message at a time, and each message that still raises becomes an ``internal`` dead
        letter carrying the error, and the driver goes on. A stage that raises on a tick's rows
        does not reach here: the engine dead-letters those rows itself and goes on, so no record
        it had taken is fed twice (``Engine._failed_rows``).
        """
        try:
            return self.handle(messages)
        except Exception as e:  # noqa: BLE001 - a driver must outlive any one message
            log.error(
                "a batch raised %s: %s; handling its %d message(s) one by one", type(e).__name__, e, len(messages)
            )
        out = EngineOutput()
        for m in messages:
            try:
                out.extend(self.handle([m]))
            except Exception as e:  # noqa: BLE001
                log.exception("message at %s raised; dead-lettered as internal", m.origin)
                dead = DeadLetter(
                    reason=INTERNAL,
                    detail=f"{type(e).__name__}: {e}"[:300],
                    origin=m.origin,
                    raw=None if m.value is None else bytes(m.value[:RAW_KEEP]).decode("utf-8", "replace"),
                )
                self.totals.dead[INTERNAL] += 1
                out.dead.append(dead)
        return out

    def flush(self) -> EngineOutput:
        """End of input: what the detector still held back."""
        got = self.engine.flush()
        out = EngineOutput(got.alerts, got.dead)
        self.totals.add(out)
        return out

    @property
    def pending(self) -> int:
        """Records the detector holds back (its rows not yet released)."""
        return self.engine.pending

    def snapshot(self) -> bytes:
        """The detector's state (a checkpoint's part; it resumes at ``checkpoint_offset``)."""
        return self.engine.snapshot()

    def restore(self, blob: bytes) -> None:
        """Continue where the detector's ``snapshot`` left off."""
        self.engine.restore(blob)
        # A restored count was dropped by an earlier process: not this one's to count again.
        self._held_seen = dict(self.engine.held_dropped)
        self._moved_seen = self.engine.stats[MOVED]

    def take_moved(self) -> int:
        """How many DCGM samples the detector moved to the next tick since the last call (or the
        restore): each the second of its host's samples in one tick (docs/architecture.md §4, one
        sample a tick); the service's ``gpuwarden_samples_moved`` is fed these.

        >>> Pipeline().take_moved()
        0
        """
        now = self.engine.stats[MOVED]
        out = now - self._moved_seen if now >= self._moved_seen else now  # (below: a new engine)
        self._moved_seen = now
        return out

    def take_held_drops(self) -> dict[str, int]:
        """How many records each stage that holds them until the watermark let go past its bound
        since the last call (or the restore), by stage (``Detector.held_dropped``): the service's
        counter is fed these. Every such stage is named, zero included, so its series starts at 0.

        >>> Pipeline().take_held_drops()
        {'nccl_results': 0}
        """
        now = self.engine.held_dropped
        # A count below the last one is a stage built anew (a reload): all of it is new.
        out = {k: n - seen if n >= (seen := self._held_seen.get(k, 0)) else n for k, n in now.items()}
        self._held_seen = now
        return out
