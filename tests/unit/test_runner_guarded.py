"""``Pipeline.handle_guarded``: an unexpected error costs only the message that caused it."""

from __future__ import annotations

from pipeline.bus.base import Message
from pipeline.engine import Engine
from pipeline.runner import Pipeline
from pipeline.schema import encode
from tests.factories import sample


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
