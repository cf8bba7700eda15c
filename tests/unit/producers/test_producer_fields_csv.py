"""etc/dcgm-exporter-fields.csv: the field list a cluster deploys. It must read like
dcgm-exporter's own CSV and enable every field our rules use; and every sample in
shared/data must be covered by a producer test (a new sample fails here until one reads it)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from pipeline.catalog import FIELDS

ROOT = Path(__file__).resolve().parents[3]
from tests.factories import SHARED_DATA as DATA  # noqa: E402


def read_exporter_csv(path: Path) -> list[tuple[str, str, str]]:
    """The rows dcgm-exporter would load: '#' lines are comments, fields are comma-separated."""
    rows = []
    for rec in csv.reader(l for l in path.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")):
        assert len(rec) == 3, rec
        rows.append(tuple(x.strip() for x in rec))
    return rows


def test_same_format_as_the_exporters_own_list():
    ours = read_exporter_csv(ROOT / "etc" / "dcgm-exporter-fields.csv")
    theirs = read_exporter_csv(DATA / "dcgm_exporter_default-counters.csv")
    assert {t for _, t, _ in theirs} >= {t for _, t, _ in ours} == {"gauge", "counter", "label"}
    names = [n for n, _, _ in ours]
    assert len(names) == len(set(names))
    for n, kind, _ in ours:
        if kind != "label":
            assert FIELDS.by_name(n) is not None, f"{n} is not in the catalog"


def test_enables_every_field_the_rules_use_and_what_the_default_leaves_out():
    enabled = {FIELDS.by_name(n).field_id for n, k, _ in read_exporter_csv(ROOT / "etc" / "dcgm-exporter-fields.csv")
               if k != "label"}
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "".join(p.read_text() for p in (ROOT / "rules").glob("*.yaml"))))
    used = {f.field_id for w in words for f in [FIELDS.by_alias(w) or FIELDS.by_name(w)] if f is not None}
    assert used, "no field found in rules/*.yaml"
    # NVSwitch SXids come from the kernel-log producer: dcgm-exporter reports 856/857 per switch,
    # without the GPU label its records need (docs/producers.md#kernel-log).
    used -= {FIELDS.by_alias("nvswitch_fatal_sxid").field_id, FIELDS.by_alias("nvswitch_nonfatal_sxid").field_id}
    # The PCIe AER counters come from `produce pcie-aer` (sysfs): DCGM has no field for them.
    used -= {f.field_id for f in FIELDS if f.names[0].startswith("GPUWARDEN_")}
    assert used <= enabled, f"rules use fields the CSV leaves off: {sorted(used - enabled)}"
    # What the issue names: ECC, NVLink errors, violations, clock-event reasons, row remap pending.
    assert {310, 311, 312, 313, 409, 419, 429, 439, 240, 241, 112, 396, 230} <= enabled
    default_on = {FIELDS.by_name(n).field_id for n, k, _ in read_exporter_csv(DATA / "dcgm_exporter_default-counters.csv")
                  if k != "label" and FIELDS.by_name(n)}
    assert not {310, 311, 409, 429, 241, 112, 396} & default_on   # why the project ships its own list


# Every sample file and the test that feeds it through its producer.
COVERED = {
    "dcgm_exporter_h100_8gpu_sampled.prom": "test_producer_dcgm_exporter.py",
    "dcgm_exporter_t4_full_format.prom": "test_producer_dcgm_exporter.py",
    "dcgmi_dmon_a100_dcgm3_sample.txt": "test_producer_dcgmi.py",
    "nccl_inspector_sample.jsonl": "test_producer_nccl.py",
    "nccl_inspector_prom_sample.prom": "test_producer_nccl.py",
    "nccl_tests_all_reduce_perf_2x8_h100.txt": "test_producer_nccl.py",
    "dcgm_exporter_default-counters.csv": "test_producer_fields_csv.py",   # a field list, not telemetry
    "dcgm_exporter_dcp-metrics-included.csv": "test_producer_fields_csv.py",
    "nvsentinel_xiderrorsmapping.csv": "test_producer_fields_csv.py",      # XID reference, not telemetry
}


def test_every_sample_is_fed_through_a_producer_test():
    here = Path(__file__).parent
    for p in DATA.iterdir():
        if p.name == "SOURCES.md":
            continue
        assert p.name in COVERED, f"{p.name}: no producer test reads it"
        assert p.name in (here / COVERED[p.name]).read_text(), f"{COVERED[p.name]} does not read {p.name}"


def test_dcp_list_parses_and_xid_table_codes_pass_through_as_gauges():
    rows = read_exporter_csv(DATA / "dcgm_exporter_dcp-metrics-included.csv")
    assert any(n == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" for n, _, _ in rows)
    from producers.dcgm_exporter import parse_metrics

    xids = [int(r[0]) for r in csv.reader((DATA / "nvsentinel_xiderrorsmapping.csv").read_text().splitlines())
            if r and r[0].strip().isdigit()]
    assert 79 in xids and 48 in xids
    text = "".join(f'DCGM_FI_DEV_XID_ERRORS{{gpu="{i}",Hostname="h"}} {x}\n' for i, x in enumerate(xids))
    recs, _ = parse_metrics(text, ts=1764403200.0)
    assert [r.fields.DCGM_FI_DEV_XID_ERRORS for r in recs] == [float(x) for x in xids]   # codes, unchanged
