"""``pipeline/detection.py``: what a driver builds its detector from. The service builds it once
per partition, so a second build must cost no scan of the YAML and share no state with the first."""

from __future__ import annotations

import msgspec

from pipeline import yamlsafe
from pipeline.decode import Decoder
from pipeline.detection import build_stages
from pipeline.resources import rules_dir
from producers.sim import Simulator


def _alerts(detector, lines: list[bytes]) -> list[tuple]:
    dec = Decoder()
    dec.set_fields(detector.decode_fields)
    out = detector.process(dec.decode_many(lines, ["sim"] * len(lines)).records)
    out.extend(detector.flush())
    return [(a.rule, a.host, a.gpu, a.ts, a.state) for a in out.alerts]


def test_a_second_build_scans_no_yaml_and_shares_nothing_with_the_first(monkeypatch):
    rules = [str(rules_dir())]
    first, diags = build_stages(rules, "auto")
    assert first is not None, diags
    real = yamlsafe._loader
    scans: list[str] = []
    monkeypatch.setattr(yamlsafe, "_loader", lambda text, *a: scans.append(text[:40]) or real(text, *a))
    second, _ = build_stages(rules, "auto")
    assert second is not None and scans == []     # rule, model and config files: each read once a process
    sim = Simulator(hosts=4, duration=600, seed=8, scenario="mixed")
    lines = [msgspec.json.encode(r) for batch in sim.batches() for r in batch]
    # One partition's engines run a recording to its end; another's, built from what the first
    # read, then give the same alerts: no window, lifecycle or model state is shared.
    a = _alerts(first.detector(), lines)
    b = _alerts(second.detector(), lines)
    assert a and a == b
