"""Defects found by breaking ``nccl_wrong_results`` (pipeline/engine/wrongresults.py)."""

from __future__ import annotations

import pytest

from pipeline.engine import Engine
from pipeline.engine.wrongresults import KEEP_FIRING_FOR
from producers.nccl_tests import parse_text
from tests.factories import fleet, nccl_tests_log, run_batched

T = 1764403200.0


def rows(alerts) -> list[tuple]:
    return [(a.state, a.host, a.ts) for a in alerts if a.fault == "nccl_wrong_results"]


@pytest.mark.parametrize("batch", [1, 100_000])
def test_the_end_of_a_replay_resolves_a_deadline_its_rows_ran_past(batch):
    # n0 stops at T+3690, n1 at T+3710: the last watermark before the end is short of the
    # deadline (T+100 + 1 h), the end's rows run to T+3710; the alert resolved nowhere.
    recs = [r for r in fleet(range(0, 4000, 10), hosts=2, gpus=1) if r.ts < T + (3695 if r.host == "n0" else 3720)]
    recs += parse_text(nccl_tests_log("n0", wrong=3), ts=T + 100)
    recs.sort(key=lambda r: r.ts)
    eng = Engine()
    got = rows(run_batched(recs, batch, eng).alerts)
    assert eng.released > T + 100 + KEEP_FIRING_FOR
    assert got == [("firing", "n0", T + 100), ("resolved", "n0", T + 100 + KEEP_FIRING_FOR)]
