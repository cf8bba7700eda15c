"""What the engine gives back (``pipeline/engine/output.py``)."""

from __future__ import annotations

from itertools import islice

import pytest

from pipeline.engine import Engine
from pipeline.engine.output import Numbered
from tests.factories import sample


def test_numbered_origins_end_where_the_batch_does() -> None:
    o = Numbered("batch", 3)
    assert list(islice(iter(o), 10)) == ["batch#0", "batch#1", "batch#2"]
    assert o[-1] == "batch#2" and o[1:] == ["batch#1", "batch#2"]
    with pytest.raises(IndexError):
        o[3]


def test_records_handed_over_without_origins_are_named_by_their_place_in_the_batch() -> None:
    eng = Engine()
    eng.process([sample(t) for t in range(40)])
    out = eng.process([sample(41), sample(0)])  # the second is long behind the watermark
    assert [(d.reason, d.origin) for d in out.dead] == [("late", "batch#1")]
