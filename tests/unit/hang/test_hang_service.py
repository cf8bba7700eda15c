"""Progress records through ``serve``'s two stages (in-process bus): the host stage forwards
them, the fleet stage's hang detector alerts as ``replay`` of the same records does."""

from __future__ import annotations

from pipeline.bus.telemetry import per_host_messages
from pipeline.runner import Pipeline
from pipeline.bus.base import Message
from tests.factories import fleet
from tests.unit.hang.factories import detector, serve_both_stages, watchdog_timeouts


def test_serve_alerts_on_the_hang_as_replay_does():
    recs = sorted(fleet(range(200), hosts=4, gpus=1) + watchdog_timeouts(4, 100.0, {2: 300}), key=lambda r: r.ts)
    msgs = list(per_host_messages(recs))
    pipe = Pipeline(detector())
    ref = pipe.handle([Message("rec", -1, i, k, v) for i, (k, v) in enumerate(msgs)]).alerts + pipe.flush().alerts
    want = [(a.id, a.state, a.host, a.gpu) for a in ref if a.rule == "hang_collective"]
    assert want and want[0][1:] == ("firing", "n2", 2)
    got = [(a["id"], a["state"], a["host"], a["gpu"]) for a in serve_both_stages(msgs)
           if a["rule"] == "hang_collective"]  # fmt: skip
    assert got == want
