"""dcgm-exporter's own field lists, rendered as a stock exporter prints them: every metric in them
is read or known to be left out (never an unknown metric), an operator running it sees no warning,
and the NVSwitch SXids an exporter prints per switch reach the host's GPU records.

The lists are NVIDIA/dcgm-exporter's ``etc/default-counters.csv`` (the exporter's and, from 4.x,
the Helm chart's default) and ``etc/dcp-metrics-included.csv`` (the Helm chart's default through
3.x), both @ d5e5f510 in shared/data; the rows earlier releases had and d5e5f510 dropped are listed
below with the tags that ship them. Scrapes are written the way ``render_metrics.go`` renders them.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import pytest

from pipeline.catalog import FIELDS
from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.common import BoundedSender, RunResult, lost_input, run
from producers.dcgm_exporter import ExporterSource, parse_metrics

from tests.factories import ListSink, SHARED_DATA as DATA  # noqa: E402

DEFAULT = DATA / "dcgm_exporter_default-counters.csv"
DCP = DATA / "dcgm_exporter_dcp-metrics-included.csv"
TS = 1764403200.0

# Enabled rows of etc/default-counters.csv from 2.2.9-2.4.1 to 3.3.6-3.4.2, gone at 3.3.7-3.5.0.
OLDER_DEFAULT_ROWS = [
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter"),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter"),
]
# Enabled rows of etc/1.x-compatibility-metrics.csv (2.2.9-2.4.1 to d5e5f510; the two throughput
# rows until 3.3.6-3.4.2), each once (d5e5f510 lists the PCIe byte counters twice).
ONE_X_ROWS = [
    ("dcgm_sm_clock", "gauge"),
    ("dcgm_memory_clock", "gauge"),
    ("dcgm_memory_temp", "gauge"),
    ("dcgm_gpu_temp", "gauge"),
    ("dcgm_power_usage", "gauge"),
    ("dcgm_total_energy_consumption", "counter"),
    ("dcgm_pcie_tx_throughput", "counter"),
    ("dcgm_pcie_rx_throughput", "counter"),
    ("dcgm_fi_prof_pcie_tx_bytes", "counter"),
    ("dcgm_fi_prof_pcie_rx_bytes", "counter"),
    ("dcgm_pcie_replay_counter", "counter"),
    ("dcgm_gpu_utilization", "gauge"),
    ("dcgm_mem_copy_utilization", "gauge"),
    ("dcgm_enc_utilization", "gauge"),
    ("dcgm_dec_utilization", "gauge"),
    ("dcgm_xid_errors", "gauge"),
    ("dcgm_fb_free", "gauge"),
    ("dcgm_fb_used", "gauge"),
    ("dcgm_nvlink_bandwidth_total", "counter"),
    ("dcgm_fi_prof_gr_engine_active", "gauge"),
    ("dcgm_fi_prof_pipe_tensor_active", "gauge"),
    ("dcgm_fi_prof_dram_active", "gauge"),
]
# What the stock lists enable that no detector reads: encoder/decoder load, vGPU licence, reserved
# framebuffer, the NVML PCIe throughput DCGM deprecates.
NOT_USED = {
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "dcgm_pcie_tx_throughput",
    "dcgm_pcie_rx_throughput",
    "dcgm_enc_utilization",
    "dcgm_dec_utilization",
}
GPUS = 2


def read_rows(path: Path) -> list[tuple[str, str]]:
    """(field, Prometheus type) of each row dcgm-exporter loads: '#' lines are comments."""
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(rec[0].strip(), rec[1].strip()) for rec in csv.reader(lines)]


def render(rows: list[tuple[str, str]], *, old_namespace: bool = False) -> str:
    """The scrape of an exporter with ``rows`` on GPUS GPUs: d5e5f510 gpuMetricsFormat (``UUID``,
    ``hostname``), or with --use-old-namespace and the 1.x list (``uuid``, 4.5.3-4.8.2's
    ``Hostname``); label rows (DCGM_FI_DRIVER_VERSION) are labels on every series."""
    uuid, hostname = ("uuid", "Hostname") if old_namespace else ("UUID", "hostname")
    extra = "".join(f',{name}="570.86.15"' for name, typ in rows if typ == "label")
    out = []
    for i, (name, typ) in enumerate(r for r in rows if r[1] != "label"):
        out += [f"# HELP {name} {name}", f"# TYPE {name} {typ}"]
        for g in range(GPUS):
            out.append(
                f'{name}{{gpu="{g}",{uuid}="GPU-{g:08d}-0000-0000-0000-000000000000",pci_bus_id="00000000:{0x18 + g:02X}:00.0",'
                f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",{hostname}="node-1"{extra}}} {i + 1}'
            )
    return "\n".join(out) + "\n"


def _decoded(records):
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in records) + b"]", "test")
    assert out.dead == [], [d.reason for d in out.dead]
    return out.records


STOCK_LISTS = {
    "default-counters": (read_rows(DEFAULT), False),
    "dcp-metrics-included": (read_rows(DCP), False),
    "default-counters-2.2.9-to-3.3.6": (read_rows(DEFAULT) + OLDER_DEFAULT_ROWS, False),
    "1.x-compatibility": (ONE_X_ROWS, True),
}


@pytest.mark.parametrize("which", sorted(STOCK_LISTS))
def test_every_metric_of_a_stock_list_is_read_or_known_unused(which):
    # Before: ENC_UTIL, DEC_UTIL, VGPU_LICENSE_STATUS, FB_RESERVED and the PCIe throughput were
    # unknown metrics, warned about on every stock exporter.
    rows, old = STOCK_LISTS[which]
    metrics = [(name, i + 1) for i, (name, _) in enumerate(r for r in rows if r[1] != "label")]
    recs, st = parse_metrics(render(rows, old_namespace=old), ts=TS)
    recs = _decoded(recs)
    assert st.unknown_metric == 0 and st.unknown_names == []
    assert st.no_gpu_label == st.blank == st.duplicate_series == st.bad_label == 0
    unused = [name for name, _ in metrics if name in NOT_USED]
    assert st.not_used == GPUS * len(unused) and st.used == GPUS * (len(metrics) - len(unused))
    assert [(r.gpu, r.link) for r in recs] == [(g, None) for g in range(GPUS)]
    labelled = any(typ == "label" for _, typ in rows)
    for r in recs:
        got = [v for n in r.fields.__struct_fields__ if not math.isnan(v := getattr(r.fields, n))]
        assert sorted(got) == sorted(float(v) for name, v in metrics if name not in NOT_USED)
        assert r.labels.get("DCGM_FI_DRIVER_VERSION") == ("570.86.15" if labelled else None)


def test_the_current_default_list_enables_exactly_these_unused_metrics():
    # What an operator's scrape holds that gpuwarden leaves out: if dcgm-exporter adds a row the
    # catalog lacks, this names it.
    names = {name for name, typ in read_rows(DEFAULT) if typ != "label"}
    assert {n for n in names if FIELDS.by_name(n) is None} == {
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_FB_RESERVED",
    }
    assert names & NOT_USED == {n for n in names if FIELDS.by_name(n) is None}


def test_a_stock_exporter_gives_its_operator_no_warning(tmp_path, caplog):
    # Before: "metric(s) the catalog does not know" on the first scrape, and every periodic
    # "producer running" line a warning for dropped.unknown_metric.
    caplog.set_level(logging.DEBUG)
    files = []
    for i in range(3):
        f = tmp_path / f"s{i}.prom"
        f.write_text(render(read_rows(DEFAULT)))
        files.append(str(f))
    src = ExporterSource(files=files)
    sender, res = BoundedSender(ListSink()), RunResult()
    run(src, sender, interval_s=0.0, log_every_s=0.0, drain_s=0.1, result=res)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    c = src.summary()
    assert c["records"] == 3 * GPUS and c["samples_not_used"] == 3 * GPUS * 4
    assert {k: v for k, v in c.items() if k.startswith("dropped.") and v} == {}
    assert lost_input(src, res) == {}
    assert sum(r.levelno == logging.INFO and r.getMessage().startswith("producer ") for r in caplog.records) >= 2


def test_an_unknown_metric_is_still_named_and_counted():
    # A metric neither the catalog nor the stock lists know stays an unknown metric.
    text = render(read_rows(DEFAULT)) + 'DCGM_FI_DEV_COUNT{gpu="0",hostname="node-1"} 8\n'
    _, st = parse_metrics(text, ts=TS)
    assert st.unknown_metric == 1 and st.unknown_names == ["DCGM_FI_DEV_COUNT"]


# --- NVSwitch SXids ------------------------------------------------------------------------------

GPU_LINE = (
    'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",UUID="GPU-{g}",pci_bus_id="00000000:1{g}:00.0",device="nvidia{g}",'
    'modelName="NVIDIA H100 80GB HBM3",hostname="n1"}} 40'
)
GPU_SCRAPE = "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" + "\n".join(GPU_LINE.format(g=g) for g in range(4)) + "\n"


def test_switch_sxids_of_d5e5f510_reach_every_gpu_record_of_the_host():
    # d5e5f510 switchMetricsFormat with gpu_collector.go toSwitchMetric: every switch entity is
    # "nvswitch0" (its ParentId is PARENT_ID_IGNORED, 0), so two switches print the same labels.
    # Before: dropped as series without a gpu label; the SXid reached no rule.
    switch = [
        "# HELP DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS NVSwitch fatal errors",
        "# TYPE DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS gauge",
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="nvswitch0",hostname="n1",DCGM_FI_DRIVER_VERSION="570.86.15"} 12028',
        "# HELP DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS NVSwitch non-fatal errors",
        "# TYPE DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS gauge",
        'DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS{nvswitch="nvswitch0",hostname="n1"} 20034',
        'DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS{nvswitch="nvswitch0",hostname="n1"} 12028',
    ]
    recs, st = parse_metrics(GPU_SCRAPE + "\n".join(switch) + "\n", ts=TS)
    recs = _decoded(recs)
    assert [r.gpu for r in recs] == [0, 1, 2, 3]
    for r in recs:
        assert r.fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS == 12028
        assert r.fields.DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS == 12028  # one choice whatever the order
        assert r.labels["sxid.fatal_sources"] == "nvswitch0:12028"
        assert r.labels["sxid.nonfatal_sources"] == "nvswitch0:12028,nvswitch0:20034"
        assert r.fields.DCGM_FI_DEV_GPU_TEMP == 40 and "nvswitch" not in r.labels
    assert st.no_gpu_label == st.duplicate_series == 0 and st.used == 4 + 3


def test_switch_sxids_of_3x_name_the_switch_by_its_entity_id():
    # 3.1.3-3.1.2 to 4.4.1-4.5.2 switchMetricsFormat: nvswitch="<entity id>", Hostname. The lowest
    # switch with a non-zero SXid gives the value, 0 from another switch does not hide it.
    switch = [
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="0",Hostname="n1"} 0',
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="11",Hostname="n1"} 24007',
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="3",Hostname="n1"} 12028',
    ]
    gpus = GPU_SCRAPE.replace('hostname="n1"', 'Hostname="n1"')
    recs, _ = parse_metrics(gpus + "\n".join(switch) + "\n", ts=TS)
    assert {r.fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS for r in _decoded(recs)} == {12028}
    assert recs[0].labels["sxid.fatal_sources"] == "3:12028,11:24007"
    assert math.isnan(recs[0].fields.DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS)  # no series: no value, not 0


def test_a_switch_sxid_stays_with_its_host_and_is_counted_when_no_gpu_carries_it():
    switch = [
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="nvswitch0",hostname="n2"} 12028',
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="nvswitch0",hostname="n1"} 9223372036854775794',  # blank
    ]
    recs, st = parse_metrics(GPU_SCRAPE + "\n".join(switch) + "\n", ts=TS)
    assert {r.host for r in recs} == {"n1"}
    assert all(math.isnan(r.fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS) for r in _decoded(recs))
    assert st.no_gpu_label == 1 and st.blank == 1
    assert ("DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", "n2/nvswitch0", "no_gpu_label") in st.dropped


def test_a_switch_sxid_scrape_raises_the_host_rule_end_to_end(tmp_path, capsys):
    # produce dcgm-exporter --file (two scrapes, the second after the switch's SXid) -> replay.
    from pipeline.cli import main

    def scrape(ms: int, sxid: bool) -> str:
        lines = [GPU_LINE.format(g=g) + f" {ms}" for g in range(4)]
        if sxid:
            lines.append(f'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{{nvswitch="nvswitch0",hostname="n1"}} 12028 {ms}')
        return "\n".join(lines) + "\n"

    files = [tmp_path / "s0.prom", tmp_path / "s1.prom"]
    files[0].write_text(scrape(1_800_000_000_000, False))
    files[1].write_text(scrape(1_800_000_030_000, True))
    out, alerts = tmp_path / "o.jsonl", tmp_path / "alerts.jsonl"
    assert main(["produce", "dcgm-exporter", "--file", *map(str, files), "--out", str(out)]) == 0
    assert "WARNING" not in capsys.readouterr().err
    assert main(["replay", str(out), "--alerts-out", str(alerts), "-q"]) == 0
    fired = [a for a in map(json.loads, alerts.read_text().splitlines()) if a["state"] == "firing"]
    assert [(a["rule"], a["host"], a["gpu"]) for a in fired] == [("nvlink_nvswitch_fatal_sxid", "n1", None)]
    assert "SXid 12028" in fired[0]["summary"]
