import textwrap

import pytest

from pipeline.engine import Engine, EngineConfig
from pipeline.rules import load_rules


@pytest.fixture
def make_rules(tmp_path):
    """Write YAML rule text to a file and load it; fail the test on any error."""
    def make(text: str, name: str = "r.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        rs, diags = load_rules([path])
        assert rs is not None, [str(d) for d in diags]
        return rs
    return make


def run_rules(ruleset, records, batch=None):
    eng = Engine(EngineConfig(), row_checks=[], tick_checks=[], rules=ruleset)
    out = []
    step = batch or max(1, len(records))
    for i in range(0, len(records), step):
        out += eng.process(records[i:i + step]).alerts
    return out + eng.flush().alerts, eng
