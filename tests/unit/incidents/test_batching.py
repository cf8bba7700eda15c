"""The stage's output depends on the alerts and their order, never on how they are batched."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import fuzz_examples
from tests.unit.incidents.factories import alert_streams, run, wire


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(alert_streams(), st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_any_batching_gives_the_same_incident_events(alerts, sizes) -> None:
    whole = wire(run(alerts, batch=len(alerts)))
    one = wire(run(alerts, batch=1))
    assert one == whole
    for size in sizes:
        assert wire(run(alerts, batch=size)) == whole
