"""dcgm-exporter with MIG, and its per-XID counter (issue 21 items 1 and 2).

Series are written the way dcgm-exporter renders them (``internal/pkg/rendermetrics/render_metrics.go``:
``gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID][, Hostname]`` then the
Kubernetes labels), so each test holds one shape a MIG node really prints: the whole GPU beside
its instances, instances only, one pod per instance. The contract: docs/architecture.md §3.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.catalog import FIELDS
from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.dcgm_exporter import ExporterSource, parse_metrics

TS = 1764403200.0
RULES = Path(__file__).resolve().parents[3] / "rules"
UUID = "GPU-5d4b15f5-f9f4-c94e-b30a-111001f6ba29"
TYPES = {"DCGM_FI_DEV_XID_ERRORS": "gauge", "DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_FB_USED": "gauge",
         "DCGM_FI_DEV_FB_FREE": "gauge", "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge", "DCGM_FI_DEV_POWER_USAGE": "gauge",
         "DCGM_EXP_XID_ERRORS_COUNT": "counter"}


def engine():
    """The engine with the shipped rule packs, as ``replay`` and ``serve`` run it."""
    from pipeline.engine import Engine, EngineConfig
    from pipeline.rules.loader import load_rules

    rules, diags = load_rules([RULES])
    assert rules is not None, diags
    return Engine(EngineConfig(), rules=rules)


def series(metric: str, value: float | str, *, gpu: int = 0, inst: int | None = None, profile: str = "3g.40gb",
           host: str = "node-1", **labels: str) -> tuple[str, str]:
    """One exposition line as dcgm-exporter's gpuMetricsFormat writes it."""
    lab = [f'gpu="{gpu}"', f'UUID="{UUID[:-1]}{gpu}"', f'pci_bus_id="00000000:{0x3b + gpu:02X}:00.0"',
           f'device="nvidia{gpu}"', 'modelName="NVIDIA A100-SXM4-80GB"']
    if inst is not None:
        lab += [f'GPU_I_PROFILE="{profile}"', f'GPU_I_ID="{inst}"']
    lab.append(f'Hostname="{host}"')
    lab += [f'{k}="{v}"' for k, v in labels.items()]
    return metric, f"{metric}{{{','.join(lab)}}} {value if isinstance(value, str) else format(value, 'g')}"


def scrape(*lines: tuple[str, str]) -> str:
    """A scrape: each family's HELP/TYPE header, then its series, in first-seen order."""
    fams: dict[str, list[str]] = {}
    for metric, line in lines:
        fams.setdefault(metric, []).append(line)
    out = []
    for metric, ls in fams.items():
        out += [f"# HELP {metric} {metric}", f"# TYPE {metric} {TYPES[metric]}", *ls]
    return "\n".join(out) + "\n"


def one(text: str):
    recs, stats = parse_metrics(text, ts=TS)
    gpus = [r for r in recs if r.link is None]
    assert len(gpus) == len({(r.host, r.gpu) for r in gpus}), "one record per physical GPU"
    return gpus, stats


def test_parent_and_instances_xid_79_on_the_whole_gpu_is_not_hidden_by_an_instance_zero():
    gpus, stats = one(scrape(
        series("DCGM_FI_DEV_XID_ERRORS", 79),
        series("DCGM_FI_DEV_XID_ERRORS", 0, inst=1, pod="train-a", namespace="ml"),
        series("DCGM_FI_DEV_XID_ERRORS", 0, inst=2, pod="train-b", namespace="ml"),
        series("DCGM_FI_DEV_FB_USED", 61000),
        series("DCGM_FI_DEV_FB_USED", 20480, inst=1, pod="train-a", namespace="ml"),
        series("DCGM_FI_DEV_FB_USED", 512, inst=2, pod="train-b", namespace="ml"),
        series("DCGM_FI_DEV_GPU_TEMP", 71),
        series("DCGM_FI_DEV_GPU_TEMP", 71, inst=1),
        series("DCGM_FI_DEV_GPU_TEMP", 71, inst=2)))
    [r] = gpus
    assert r.fields.DCGM_FI_DEV_XID_ERRORS == 79
    assert r.labels["mig.source.xid"] == "gpu" and r.labels["mig.xid_sources"] == "gpu:79"
    # The whole GPU's framebuffer is the whole GPU's; each slice's stays the slice's.
    assert r.fields.DCGM_FI_DEV_FB_USED == 61000
    assert r.labels["mig.1.fb_used"] == "20480" and r.labels["mig.2.fb_used"] == "512"
    assert r.fields.DCGM_FI_DEV_GPU_TEMP == 71 and "mig.source.gpu_temp" not in r.labels
    assert r.labels["mig.instances"] == "1,2" and r.labels["mig.1.profile"] == "3g.40gb"
    assert r.uuid == UUID[:-1] + "0" and stats.mig_entities == 1


def test_instances_only_xid_48_on_one_instance_is_not_hidden_by_its_siblings():
    gpus, stats = one(scrape(
        series("DCGM_FI_DEV_XID_ERRORS", 0, inst=1, profile="1g.10gb"),
        series("DCGM_FI_DEV_XID_ERRORS", 48, inst=2, profile="1g.10gb", pod="infer-7", namespace="serving"),
        series("DCGM_FI_DEV_XID_ERRORS", 0, inst=9, profile="1g.10gb"),
        series("DCGM_FI_DEV_FB_USED", 9000, inst=1, profile="1g.10gb"),
        series("DCGM_FI_DEV_FB_USED", 20480, inst=2, profile="1g.10gb"),
        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.93, inst=2, profile="1g.10gb"),
        series("DCGM_FI_DEV_POWER_USAGE", 250.5, inst=1, profile="1g.10gb"),
        series("DCGM_FI_DEV_POWER_USAGE", 250.5, inst=2, profile="1g.10gb")))
    [r] = gpus
    assert r.fields.DCGM_FI_DEV_XID_ERRORS == 48
    assert r.labels["mig.xid_sources"] == "GPU_I_ID=2:48" and r.labels["mig.2.pod"] == "infer-7"
    # No whole-GPU series: no instance's framebuffer or activity poses as the GPU's.
    assert math.isnan(r.fields.DCGM_FI_DEV_FB_USED) and math.isnan(r.fields.DCGM_FI_PROF_GR_ENGINE_ACTIVE)
    assert r.labels["mig.2.fb_used"] == "20480" and r.labels["mig.1.fb_used"] == "9000"
    assert r.labels["mig.2.gr_engine_active"] == "0.93"
    # Physical fields every instance reports alike are the physical GPU's.
    assert r.fields.DCGM_FI_DEV_POWER_USAGE == 250.5
    assert r.labels["mig.instances"] == "1,2,9" and r.labels["mig.9.profile"] == "1g.10gb"


def test_pods_per_instance_both_kept_none_lifted_onto_the_gpu():
    gpus, _ = one(scrape(
        series("DCGM_FI_DEV_GPU_TEMP", 60, inst=1, pod="a-0", namespace="team-a", container="main"),
        series("DCGM_FI_DEV_GPU_TEMP", 60, inst=2, pod="b-0", namespace="team-b", container="main"),
        series("DCGM_FI_DEV_GPU_TEMP", 60, gpu=1, inst=1, pod="c-0", namespace="team-c", container="main")))
    r0, r1 = gpus
    assert (r0.labels["mig.1.pod"], r0.labels["mig.2.pod"]) == ("a-0", "b-0")
    assert (r0.labels["mig.1.namespace"], r0.labels["mig.2.namespace"]) == ("team-a", "team-b")
    assert r0.labels["mig.1.container"] == r0.labels["mig.2.container"] == "main"
    assert "pod" not in r0.labels and "namespace" not in r0.labels   # neither pod owns the whole GPU
    assert r1.gpu == 1 and r1.labels["mig.1.pod"] == "c-0"
    assert r0.labels["device"] == "nvidia0"   # a label every series agrees on is the GPU's
    # A pod that owns the whole GPU (its series has no GPU_I_ID) is the GPU's.
    whole, _ = one(scrape(series("DCGM_FI_DEV_GPU_TEMP", 60, pod="whole", namespace="ns"),
                          series("DCGM_FI_DEV_GPU_TEMP", 60, inst=1, pod="slice", namespace="ns")))
    assert whole[0].labels["pod"] == "whole" and whole[0].labels["mig.1.pod"] == "slice"


def test_disagreeing_physical_series_choose_one_value_and_say_which():
    gpus, stats = one(scrape(series("DCGM_FI_DEV_GPU_TEMP", 70, inst=1), series("DCGM_FI_DEV_GPU_TEMP", 72, inst=2)))
    assert gpus[0].fields.DCGM_FI_DEV_GPU_TEMP == 70    # the lowest GPU_I_ID's, never a mean
    assert gpus[0].labels["mig.source.gpu_temp"] == "GPU_I_ID=1" and stats.mig_conflicts == 1


def test_xid_on_one_instance_reaches_the_engine_as_the_physical_gpus_alert():
    def tick(xid: int) -> str:
        return scrape(series("DCGM_FI_DEV_XID_ERRORS", 0, inst=1), series("DCGM_FI_DEV_XID_ERRORS", xid, inst=2),
                      series("DCGM_FI_DEV_XID_ERRORS", 0, inst=3), series("DCGM_FI_DEV_GPU_TEMP", 60, inst=1),
                      series("DCGM_FI_DEV_GPU_TEMP", 60, inst=2), series("DCGM_FI_DEV_GPU_TEMP", 60, inst=3))

    eng = engine()
    alerts = []
    for i in range(40):   # the engine's warm-up passes before rules fire
        recs, _ = parse_metrics(tick(48 if i >= 2 else 0), ts=TS + i)
        alerts += eng.process(recs).alerts
    fired = {(a.fault, a.host, a.gpu) for a in alerts if a.state == "firing"}
    assert ("hbm_ecc_xid", "node-1", 0) in fired


def test_xid_on_the_whole_gpu_reaches_the_engine():
    eng = engine()
    alerts = []
    for i in range(40):
        text = scrape(series("DCGM_FI_DEV_XID_ERRORS", 79 if i >= 2 else 0),
                      series("DCGM_FI_DEV_XID_ERRORS", 0, inst=1), series("DCGM_FI_DEV_XID_ERRORS", 0, inst=2),
                      series("DCGM_FI_DEV_GPU_TEMP", 60))
        alerts += eng.process(parse_metrics(text, ts=TS + i)[0]).alerts
    assert ("gpu_fallen_off_bus", "node-1", 0) in {(a.fault, a.host, a.gpu) for a in alerts if a.state == "firing"}


# -- DCGM_EXP_XID_ERRORS_COUNT (xid_collector.go / expcollector.go) --------------------------------------

def test_a_scrape_holding_only_the_xid_counter_gives_records_not_a_no_gpu_warning(tmp_path, caplog):
    text = scrape(series("DCGM_EXP_XID_ERRORS_COUNT", 2, gpu=0, window_size_in_ms="300000", xid="79"),
                  series("DCGM_EXP_XID_ERRORS_COUNT", 5, gpu=0, window_size_in_ms="300000", xid="13"),
                  series("DCGM_EXP_XID_ERRORS_COUNT", 0, gpu=1, window_size_in_ms="300000"))
    f = tmp_path / "scrape.prom"
    f.write_text(text)
    src = ExporterSource(files=[str(f)])
    recs = src.poll()
    assert [r.gpu for r in recs] == [0, 1]
    assert recs[0].fields.DCGM_EXP_XID_ERRORS_COUNT == 7 and recs[0].labels["xid_counts"] == "13:5,79:2"
    assert recs[0].labels["xid_count_window_ms"] == "300000" and "xid" not in recs[0].labels
    assert recs[1].fields.DCGM_EXP_XID_ERRORS_COUNT == 0 and "xid_counts" not in recs[1].labels
    assert "no GPU samples" not in caplog.text and src.summary()["dropped.unknown_metric"] == 0


def test_xid_count_is_a_catalog_field_the_rules_and_the_decoder_read():
    f = FIELDS.by_alias("xid_count")
    assert f is FIELDS.by_name("DCGM_EXP_XID_ERRORS_COUNT") and f.field_id == 9001 and f.kind == "gauge"
    recs, _ = parse_metrics(scrape(series("DCGM_EXP_XID_ERRORS_COUNT", 3, xid="48")), ts=TS)
    dec = Decoder()
    dec.set_fields(("DCGM_EXP_XID_ERRORS_COUNT",))
    out = dec.decode(encode(recs[0]), "t")
    assert out.dead == [] and out.records[0].fields.DCGM_EXP_XID_ERRORS_COUNT == 3


def test_xid_counter_under_mig_is_not_counted_once_per_instance():
    # The exporter keys its counts by GPU, so every instance's series repeats the GPU's counts.
    gpus, _ = one(scrape(series("DCGM_EXP_XID_ERRORS_COUNT", 1, inst=1, xid="48"),
                         series("DCGM_EXP_XID_ERRORS_COUNT", 1, inst=2, xid="48")))
    assert gpus[0].fields.DCGM_EXP_XID_ERRORS_COUNT == 1 and gpus[0].labels["xid_counts"] == "48:1"


# -- nothing dropped silently ------------------------------------------------------------------------------

def test_every_drop_is_counted_by_reason_in_the_summary(tmp_path, caplog):
    text = (scrape(series("DCGM_FI_DEV_GPU_TEMP", 60), series("DCGM_FI_DEV_FB_USED", str(0x7FFFFFFFFFFFFFF0)))
            + 'DCGM_EXP_GPU_HEALTH_STATUS{gpu="0",Hostname="node-1"} 0\n'
            + 'DCGM_FI_DEV_GPU_TEMP{gpu="",Hostname="node-1"} 50\n')
    f = tmp_path / "s.prom"
    f.write_text(text + 'DCGM_FI_DEV_GPU_TEMP{gpu="1",Hostn')   # cut off mid-line
    src = ExporterSource(files=[str(f)])
    src.poll()
    c = src.summary()
    assert c["dropped.unknown_metric"] == 1 and c["dropped.blank_sentinel"] == 1
    assert c["dropped.no_gpu_label"] == 1 and c["dropped.unparsable_line"] >= 1
    assert c["records"] == 1 and c["scrapes"] == 1
    assert "DCGM_EXP_GPU_HEALTH_STATUS" in caplog.text   # named once, so it can be added or ignored
