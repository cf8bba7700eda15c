"""Helpers of the rule tests: run a rule set over records."""

from pipeline.engine import Engine, EngineConfig


def run_rules(ruleset, records, batch=None):
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=ruleset)
    out = []
    step = batch or max(1, len(records))
    for i in range(0, len(records), step):
        out += eng.process(records[i:i + step]).alerts
    return out + eng.flush().alerts, eng


def port_series(seconds, host="n1", device="mlx5_0", port=1, step=10.0, states=None, counters=None, **kw):
    """A port's ``NicRecord`` every ``step`` seconds for ``seconds``: ACTIVE/LinkUp at 400 Gb/s
    unless ``states(t)`` says ``(state, phys_state)``; ``counters(t)`` its counters at ``t``."""
    from pipeline.schema import NicRecord
    from tests.factories import T0

    names = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}
    phys = {2: "Polling", 3: "Disabled", 5: "LinkUp", 6: "LinkErrorRecovery"}
    out = []
    t = 0.0
    while t < seconds:
        st, ph = states(t) if states else (4, 5)
        out.append(NicRecord(ts=T0 + t, host=host, device=device, port=port, link_layer="InfiniBand",
                             rate_gbps=400.0, state=st, state_name=names.get(st), phys_state=ph,
                             phys_state_name=phys.get(ph), counters=counters(t) if counters else {}, **kw))
        t += step
    return out


def run_ports(records, batch=None, config_text=None, engine=None, flush=True):
    """The shipped port checks (or ``config_text``'s) in an engine fed ``records`` in batches."""
    from pathlib import Path

    from pipeline.rules.portconfig import load_port_config, parse_port_config
    from pipeline.rules.ports import PortStage

    if engine is None:
        shipped = Path(__file__).resolve().parents[3] / "rules" / "fabric" / "ports.yaml"
        cfg, diags = parse_port_config(config_text) if config_text is not None else load_port_config(shipped)
        assert cfg is not None, [str(d) for d in diags]
        engine = Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[PortStage(cfg)])
    recs = sorted(records, key=lambda r: r.ts)
    out = []
    step = batch or max(1, len(recs))
    for i in range(0, len(recs), step):
        out += engine.process(recs[i:i + step]).alerts
    return (out + engine.flush().alerts) if flush else out, engine
