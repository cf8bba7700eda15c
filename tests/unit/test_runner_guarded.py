"""``Pipeline.handle_guarded``: an unexpected error costs only the message that caused it."""

from __future__ import annotations

from collections import Counter

from pipeline.bus.base import Message
from pipeline.bus.telemetry import as_consumed, per_host_messages
from pipeline.catalog import FIELDS
from pipeline.engine import Engine, EngineConfig
from pipeline.engine.stage import StageBase
from pipeline.runner import Pipeline
from pipeline.schema import encode
from tests.factories import T0, sample


class _Boom(Engine):
    """An engine with a bug that one host's records reach."""

    def process(self, records, origins=None, now=None):  # type: ignore[override]
        if any(r.host == "boom" for r in records):
            raise ZeroDivisionError("a bug")
        return super().process(records, origins, now)


def test_a_message_that_raises_is_an_internal_dead_letter_and_its_neighbours_are_processed() -> None:
    msgs = [Message("t", 0, i, None, encode(sample(i, "boom" if i == 3 else "n1", 0))) for i in range(6)]
    pipe = Pipeline(_Boom())
    out = pipe.handle_guarded(msgs)
    assert [(d.reason, d.origin) for d in out.dead] == [("internal", "t[0]@3")]
    assert "ZeroDivisionError: a bug" in out.dead[0].detail
    assert pipe.totals.records == 5 and pipe.totals.dead["internal"] == 1


class _Picky(StageBase):
    """A stage with a bug that one sample's value reaches, counting every row it evaluates."""

    kind = "picky"
    state_key = None

    def __init__(self) -> None:
        self.seen: Counter[tuple[float, int]] = Counter()
        self.checks = []
        self.columns = {FIELDS.require("gpu_temp").column}

    def run(self, view, entities, outputs):
        self.seen.update(zip(view.frame.ts.tolist(), view.frame.gpu.tolist()))
        if (view.value("gpu_temp") == 999).any():
            raise ZeroDivisionError("a bug")
        return []


def test_an_engine_that_raises_mid_batch_costs_that_ticks_rows_once_and_nothing_else() -> None:
    # The engine raised in a tick after ingesting the whole batch: handle_guarded's message-by-
    # message retry fed every record a second time, and the poison rows, left pending, raised again
    # at every later call (flush included): the partition was wedged.
    recs = [sample(t, "n1", g, gpu_temp=999 if t == 3 and g == 0 else 60) for t in range(8) for g in range(2)]
    stage = _Picky()
    pipe = Pipeline(Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[stage]))
    out = pipe.handle_guarded(as_consumed(per_host_messages(recs), "t", 0))
    out.extend(pipe.flush())
    assert max(stage.seen.values()) == 1 and len(stage.seen) == len(recs)
    assert [(d.reason, d.origin) for d in out.dead] == [("internal", f"n1@{T0 + 3:.3f}")]
    assert "ZeroDivisionError: a bug" in out.dead[0].detail and "2 sample(s)" in out.dead[0].detail
    assert pipe.engine.stats["dead.internal"] == 2


class _Late(_Picky):
    """A stage whose hook after a release (``Stage.advanced``) has a bug, the first time only."""

    kind = "late"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def advanced(self, upto, entities):
        self.calls += 1
        if self.calls == 1:
            raise ZeroDivisionError("a bug")


def test_a_stage_that_raises_after_a_release_costs_no_row_twice() -> None:
    # The ticks ran before the hook raised: the exception left the engine, and handle_guarded's
    # retry fed every record of the batch a second time.
    recs = [sample(t, "n1", g) for t in range(8) for g in range(2)]
    stage = _Late()
    pipe = Pipeline(Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[stage]))
    out = pipe.handle_guarded(as_consumed(per_host_messages(recs), "t", 0))
    out.extend(pipe.flush())
    assert max(stage.seen.values()) == 1 and len(stage.seen) == len(recs)
    assert [d.reason for d in out.dead] == ["internal"] and out.dead[0].origin.startswith("late@")
    assert "ZeroDivisionError: a bug" in out.dead[0].detail and stage.calls >= 2
