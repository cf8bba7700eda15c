"""Helpers of the rule tests: run a rule set over records."""

from pipeline.engine import Engine, EngineConfig
from tests.factories import T0


# A rule file holding one rule that loads: the rest of a test says what it adds.
GOOD = """\
rules:
  - name: hot
    fault: thermal_hot
    severity: warning
    condition: gpu_temp > 85
"""


def one_rule(condition, **extra):
    """The YAML of one rule ``r`` with ``condition`` (and ``extra`` keys such as ``for``)."""
    lines = "\n".join(f"    {k}: {v}" for k, v in extra.items())
    return f"""
rules:
  - name: r
    fault: gpu_test
    severity: warning
    condition: "{condition}"
{lines}
"""


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


def fields_in_spells(seed: int, seconds: int):
    """A fleet whose PCIe counters (AER from ``produce pcie-aer``, DCGM's replays) come and go:
    each GPU reports them only in spells (a producer started late, stopped, back), counting up
    now and then, so windows over them go from never held to held, quiet and back."""
    import numpy as np

    from tests.factories import fleet

    rng = np.random.default_rng(seed)
    hosts, gpus = 3, 2
    spells = {(f"n{h}", g): sorted(rng.choice(seconds, size=4, replace=False).tolist())
              for h in range(hosts) for g in range(gpus)}
    totals = {k: {"pcie_aer_fatal": 0, "pcie_aer_correctable": 0, "pcie_replays": 0} for k in spells}

    def overrides(t, host, gpu):
        a, b, c, d = spells[(host, gpu)]
        if not (a <= t < b or c <= t < d):
            return {}
        tot = totals[(host, gpu)]
        if rng.random() < 0.02:
            tot["pcie_aer_fatal"] += 1
        tot["pcie_aer_correctable"] += int(rng.integers(0, 40)) if rng.random() < 0.2 else 0
        tot["pcie_replays"] += int(rng.integers(0, 30)) if rng.random() < 0.3 else 0
        return dict(tot)

    return fleet(range(0, seconds, int(rng.choice([1, 5, 10]))), hosts=hosts, gpus=gpus, overrides=overrides)


def fired(alerts, state="firing"):
    return [(a.host, a.gpu, a.ts - T0) for a in alerts if a.state == state]
