"""The XID catalogue and the rule functions that read it: raised() and xid_severity() (#21)."""

import csv
import io
import textwrap
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from pipeline.rules import load_rules
from pipeline.rules.xids import CATALOG, evidence_text, lookup, severity_levels
from tests.factories import sample
from tests.unit.rules.factories import fired, one_rule, run_rules

RULES = Path(__file__).resolve().parents[3] / "rules"


def test_catalogue_is_package_data_with_its_source_and_every_xid():
    text = (resources.files("pipeline") / "data" / "xid_catalog.csv").read_text()
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any("docs.nvidia.com/deploy/xid-errors" in ln for ln in header)
    assert any("2026-12-01" in ln for ln in header)
    rows = list(csv.DictReader(io.StringIO("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))))
    assert [int(r["xid"]) for r in rows] == list(range(1, 173))      # NVIDIA's table has XIDs 1-172
    assert all(r["severity"] in ("critical", "warning", "info") and r["action"] and r["mnemonic"] for r in rows)


@pytest.mark.parametrize("xid, bucket, severity, words", [
    (79, "RESTART_BM", "critical", "restart it"),
    (48, "WORKFLOW_XID_48", "critical", "XID 48 workflow"),
    (119, "RESET_GPU", "critical", "reset"),
    (74, "WORKFLOW_NVLINK_ERR", "critical", "NVLink"),
    (13, "RESTART_APP", "warning", "restart the application"),
    (43, "IGNORE", "info", "none"),
])
def test_catalogue_rows_say_what_nvidia_says(xid, bucket, severity, words):
    e = CATALOG[xid]
    assert (e.immediate_action, e.severity) == (bucket, severity)
    assert words in e.action


def test_severity_lookup_is_vectorised_and_knows_no_xid_from_an_unknown_one():
    x = np.array([np.nan, 0, 79, 13, 43, 250, 2.5])
    got = severity_levels(x)
    assert np.isnan(got[[0, 1, 6]]).all()                 # no XID: unknown, never a finding
    assert got[2:6].tolist() == [3, 2, 1, 2]              # an XID newer than the catalogue is a warning
    assert lookup(250).action.startswith("not in gpuwarden's XID catalogue")
    assert evidence_text(0)["xid_action"] == ""


def test_raised_fires_on_a_first_seen_xid_once_and_on_each_new_one(make_rules):
    rs = make_rules(one_rule("raised(xid)", keep_firing_for="0s"))
    # 79 already set the first time the GPU is seen (changed() never fires here), then 79 again
    # (no new event), then cleared, then 13, then 13 again.
    xids = [79, 79, 79, 0, 0, 13, 13]
    alerts, _ = run_rules(rs, [sample(t, "n0", 0, xid=x) for t, x in enumerate(xids)])
    assert [a[2] - fired(alerts)[0][2] for a in fired(alerts)] == [0.0, 5.0]
    rs = make_rules(one_rule("changed(xid)", keep_firing_for="0s"))
    alerts, _ = run_rules(rs, [sample(t, "n0", 0, xid=x) for t, x in enumerate(xids)])
    assert len(fired(alerts)) == 2            # 79 -> 0 and 0 -> 13: the first-seen 79 is what changed() misses


def _diags(tmp_path, condition, summary='"x"'):
    p = tmp_path / "r.yaml"
    p.write_text(textwrap.dedent(f"""\
        rules:
          - name: r
            fault: gpu_x
            severity: warning
            condition: {condition}
            summary: {summary}
        """))
    rs, diags = load_rules([p])
    return rs, [(d.code, d.message) for d in diags]


def test_raised_and_xid_severity_are_type_checked(tmp_path):
    _, d = _diags(tmp_path, "raised(gpu_temp)")
    assert d and d[0][0] == "E105" and "code fields" in d[0][1]
    _, d = _diags(tmp_path, "xid_severity(gpu_temp) == 3")
    assert d and d[0][0] == "E105" and "XID catalogue" in d[0][1]
    _, d = _diags(tmp_path, "raised(xid, 5m)")
    assert d and d[0][0] == "E104"
    # The catalogue's text is for rules that read xid only.
    _, d = _diags(tmp_path, "gpu_temp > 90", summary='"{xid_action}"')
    assert d and d[0][0] == "R009"
    rs, d = _diags(tmp_path, "raised(xid)", summary='"{xid_meaning}: {xid_action}"')
    assert d == [] and rs is not None


def test_default_rules_alert_says_what_the_xid_means_and_what_to_do():
    rs, diags = load_rules([RULES])
    assert rs is not None, [str(d) for d in diags]
    recs = [sample(t, "n1", g, xid=x) for t in range(3) for g, x in enumerate([79, 119, 13, 43])]
    alerts, _ = run_rules(rs, recs)
    by_gpu = {a.gpu: a for a in alerts if a.state == "firing"}
    assert sorted((g, a.rule) for g, a in by_gpu.items()) == [
        (0, "gpu_fallen_off_bus"), (1, "gpu_xid_critical"), (2, "gpu_xid_warning")]    # 43 is informational
    a = by_gpu[1]
    assert a.summary == ("GPU 1 on n1: XID 119 GSP_RPC_TIMEOUT (GSP RPC Timeout); action: drain the GPU and "
                         "reset it (nvidia-smi -r) or reboot the node; contact support if it recurs")
    assert a.evidence["xid_immediate_action"] == "RESET_GPU" and a.evidence["xid_severity(xid)"] == 3
    assert "restart it" in by_gpu[0].summary and by_gpu[0].evidence["xid_mnemonic"].endswith("FALLEN_OFF_THE_BUS")
    assert by_gpu[2].evidence["xid_action"] == "restart the application"
