"""The stage's output depends on the alerts and their order, never on how they are batched."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import fuzz_examples
from tests.unit.incidents.factories import RULES, alert, resolved, run, wire

HOSTS = ("n1", "n2")
RULE_NAMES = sorted(RULES)


@st.composite
def alert_streams(draw):
    """Alerts of any rule on two hosts' GPUs, some resolved later, a few out of order, with XIDs."""
    out = []
    t = 0.0
    for i in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 5.0, 30.0, 200.0, 400.0, 4000.0]))
        rule = draw(st.sampled_from(RULE_NAMES))
        gpu = None if rule in ("nccl_comm_busbw", "builtin_telemetry_gap") else draw(st.integers(0, 2))
        ev = {"xid": draw(st.sampled_from([13, 79, 92]))} if "xid" in rule or rule == "gpu_fallen_off_bus" else {}
        if rule.startswith("nccl"):
            ev["comm"] = draw(st.sampled_from(["c1", "c2"]))
        late = draw(st.sampled_from([0.0, 0.0, 0.0, 20.0]))  # a model alert's ts is behind
        a = alert(rule, t - late, draw(st.sampled_from(HOSTS)), gpu, id=f"a{i}", **ev)
        out.append(a)
        if draw(st.booleans()):
            out.append(resolved(a, t + draw(st.sampled_from([10.0, 300.0, 900.0]))))
    # Resolutions go where their time puts them, as the engine emits them.
    return sorted(out, key=lambda a: a.ts)


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(alert_streams(), st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_any_batching_gives_the_same_incident_events(alerts, sizes) -> None:
    whole = wire(run(alerts, batch=len(alerts)))
    one = wire(run(alerts, batch=1))
    assert one == whole
    for size in sizes:
        assert wire(run(alerts, batch=size)) == whole
