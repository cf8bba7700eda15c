"""dcgm-exporter's real layouts across its releases, and hostile values that look like them.

Each scrape is written the way the cited template renders it (NVIDIA/dcgm-exporter at the named
tag): ``pkg/pipeline.go`` (2.x, ``migMetricsFormat``), ``pkg/dcgmexporter/pipeline.go`` (3.x,
``switchMetricsFormat``, ``linkMetricsFormat``, ``cpuMetricsFormat``, ``cpuCoreMetricsFormat``),
``internal/pkg/rendermetrics/render_metrics.go`` (4.x). Every record must decode with the
pipeline's own decoder: what it would refuse must be dropped and counted here, never sent.
"""

from __future__ import annotations

import math

import pytest

from pipeline.catalog import FIELDS
from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.dcgm_exporter import ExporterSource, parse_metrics, read_saved

TS = 1764403200.0


def _decoded(records):
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in records) + b"]", "test")
    assert out.dead == [], [d.reason for d in out.dead]
    return out.records


# etc/1.x-compatibility-metrics.csv at 2.2.9-2.4.1 (the same file ships through 4.5.3-4.8.2), every
# name enabled, rendered by 2.2.9-2.4.1 pkg/pipeline.go migMetricsFormat with --use-old-namespace
# (``uuid``); the TYPE is the CSV's. Field ids: go-dcgm pkg/dcgm/const_fields.go legacyDCGMFields.
OLD_NAMES = [
    ("dcgm_sm_clock", "gauge", 100),
    ("dcgm_memory_clock", "gauge", 101),
    ("dcgm_memory_temp", "gauge", 140),
    ("dcgm_gpu_temp", "gauge", 150),
    ("dcgm_power_usage", "gauge", 155),
    ("dcgm_total_energy_consumption", "counter", 156),
    ("dcgm_pcie_replay_counter", "counter", 202),
    ("dcgm_gpu_utilization", "gauge", 203),
    ("dcgm_mem_copy_utilization", "gauge", 204),
    ("dcgm_xid_errors", "gauge", 230),
    ("dcgm_power_violation", "counter", 240),
    ("dcgm_thermal_violation", "counter", 241),
    ("dcgm_fb_free", "gauge", 251),
    ("dcgm_fb_used", "gauge", 252),
    ("dcgm_ecc_sbe_volatile_total", "counter", 310),
    ("dcgm_ecc_dbe_volatile_total", "counter", 311),
    ("dcgm_ecc_sbe_aggregate_total", "counter", 312),
    ("dcgm_ecc_dbe_aggregate_total", "counter", 313),
    ("dcgm_retired_pages_sbe", "counter", 390),
    ("dcgm_retired_pages_dbe", "counter", 391),
    ("dcgm_retired_pages_pending", "counter", 392),
    ("dcgm_nvlink_flit_crc_error_count_total", "counter", 409),
    ("dcgm_nvlink_data_crc_error_count_total", "counter", 419),
    ("dcgm_nvlink_replay_error_count_total", "counter", 429),
    ("dcgm_nvlink_recovery_error_count_total", "counter", 439),
    ("dcgm_nvlink_bandwidth_total", "counter", 449),
    ("dcgm_fi_prof_gr_engine_active", "gauge", 1001),
    ("dcgm_fi_prof_sm_active", "gauge", 1002),
    ("dcgm_fi_prof_pipe_tensor_active", "gauge", 1004),
    ("dcgm_fi_prof_dram_active", "gauge", 1005),
    ("dcgm_fi_prof_pcie_tx_bytes", "counter", 1009),
    ("dcgm_fi_prof_pcie_rx_bytes", "counter", 1010),
]
# In the CSV but not in the catalog: PCIe throughput and ENC/DEC are enabled in the shipped file
# (skipped as not used), SM occupancy is commented out there (unknown).
OLD_NOT_USED = [("dcgm_pcie_tx_throughput", "counter"), ("dcgm_enc_utilization", "gauge")]
OLD_UNKNOWN = [("dcgm_fi_prof_sm_occupancy", "gauge")]
OLD_LABELS = 'gpu="0",uuid="GPU-8f640a3c-7e9a-608d-02a3-f4372d72b323",device="nvidia0",modelName="Tesla V100-SXM2-16GB",Hostname="dgx-3"'


def _old_scrape(names) -> str:
    out = []
    for i, (name, typ, *_) in enumerate(names):
        out += [f"# HELP {name} {name}", f"# TYPE {name} {typ}", f"{name}{{{OLD_LABELS}}} {i + 1}"]
    return "\n".join(out) + "\n"


def test_every_1x_compatibility_name_reaches_its_field():
    # Before: dcgm_gpu_utilization, dcgm_memory_clock, the ECC, retired-page, NVLink CRC and
    # dcgm_fi_prof_* names were guessed as DCGM_FI_DEV_<NAME> and lost as unknown, and a counter
    # whose name ends in _total (dcgm_nvlink_bandwidth_total) lost the suffix to prometheus_client.
    (rec,), st = parse_metrics(_old_scrape(OLD_NAMES + OLD_NOT_USED + OLD_UNKNOWN), ts=TS)
    (rec,) = _decoded([rec])
    values = {n: getattr(rec.fields, n) for n in rec.fields.__struct_fields__}
    got = {FIELDS.by_name(n).field_id: v for n, v in values.items() if isinstance(v, float) and not math.isnan(v)}
    assert got == {fid: float(i + 1) for i, (_, _, fid) in enumerate(OLD_NAMES)}
    assert rec.uuid == "GPU-8f640a3c-7e9a-608d-02a3-f4372d72b323" and rec.host == "dgx-3"
    assert st.unknown_metric == len(OLD_UNKNOWN) and st.used == len(OLD_NAMES)
    assert st.not_used == len(OLD_NOT_USED)


def test_1x_counter_without_type_line_reads_the_same():
    # A saved scrape cut by grep keeps no # TYPE: the sample keeps its own name.
    text = f"dcgm_nvlink_bandwidth_total{{{OLD_LABELS}}} 7\ndcgm_gpu_utilization{{{OLD_LABELS}}} 55\n"
    (rec,), _ = parse_metrics(text, ts=TS)
    assert rec.fields.DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL == 7 and rec.fields.DCGM_FI_DEV_GPU_UTIL == 55


# --- MIG attribution labels ---------------------------------------------------------------------

MIG_BASE = 'gpu="0",{uuid}="GPU-5d4b15f5-f9f4-c94e-b30a-111001f6ba20",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB"'


def _mig(metric: str, value: float, inst: int | None, uuid: str = "UUID", **labels: str) -> str:
    lab = MIG_BASE.format(uuid=uuid)
    if inst is not None:
        lab += f',GPU_I_PROFILE="3g.40gb",GPU_I_ID="{inst}"'
    lab += ',Hostname="node-1"' + "".join(f',{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{lab}}} {value:g}"


@pytest.mark.parametrize(
    "pod_labels",
    [
        # --use-old-namespace: pkg/types.go oldPodAttribute... at 2.2.9-2.4.1, still
        # internal/pkg/transformation/const.go at 4.5.3-4.8.2.
        {"pod_name": "train-a", "pod_namespace": "ml", "container_name": "main"},
        # --kubernetes-enable-pod-uid (4.4.0-4.5.0) and a shared GPU's vgpu (4.1.1-4.0.3).
        {"pod": "train-a", "namespace": "ml", "pod_uid": "7f3c0c5e-1b", "vgpu": "1"},
        # --kubernetes-enable-dra (4.3.1-4.4.0): kubernetes.go draClaimName...
        {"pod": "train-a", "dra_claim_name": "claim-a", "dra_claim_namespace": "ml", "dra_device_name": "gpu-0-mig-1"},
    ],
)
def test_an_instances_pod_labels_never_become_the_whole_gpus(pod_labels):
    # Before: only pod/namespace/container/hpc_job were kept with their instance; pod_name, pod_uid,
    # vgpu and dra_* of instance 1 were lifted onto the physical GPU as if it ran that pod.
    uuid = "uuid" if "pod_name" in pod_labels else "UUID"
    text = "\n".join([
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        _mig("DCGM_FI_DEV_FB_USED", 61000, None, uuid),
        _mig("DCGM_FI_DEV_FB_USED", 20480, 1, uuid, **pod_labels),
        _mig("DCGM_FI_DEV_FB_USED", 512, 2, uuid),
    ]) + "\n"
    (rec,), _ = parse_metrics(text, ts=TS)
    for k, v in pod_labels.items():
        assert k not in rec.labels
        assert rec.labels[f"mig.1.{k}"] == v
    assert rec.labels["device"] == "nvidia0"  # a label every series agrees on still moves up


# --- entities that are not GPUs, per release ----------------------------------------------------


def test_switch_link_and_cpu_entities_are_never_gpu_rows():
    text = "\n".join([
        # 4.5.3-4.8.2 render_metrics.go gpuMetricsFormat.
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="n1",DCGM_FI_DRIVER_VERSION="570.86.15"} 33',
        # 3.1.8-3.1.5 pipeline.go switchMetricsFormat / linkMetricsFormat (nvlink is the link, not a GPU).
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="0",Hostname="n1"} 0',
        'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{nvlink="3",nvswitch="0",Hostname="n1"} 9',
        # 3.3.9-3.6.1 cpuMetricsFormat / cpuCoreMetricsFormat.
        'DCGM_FI_DEV_GPU_TEMP{cpu="0",Hostname="n1"} 55',
        'DCGM_FI_DEV_GPU_TEMP{cpucore="12",cpu="0",Hostname="n1"} 56',
        # 4.4.1-4.6.0 linkMetricsFormat: a switch's link has no gpu label, a GPU's link has one.
        'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{nvlink="0",nvswitch="nvswitch0",hostname="n1"} 9',
        'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{nvlink="2",gpu="0",gpu_uuid="GPU-a",pci_bus_id="00000000:18:00.0",'
        'device="nvidia0",model_name="NVIDIA H100 80GB HBM3",hostname="n1"} 7',
    ]) + "\n"
    recs, st = parse_metrics(text, ts=TS)
    recs = _decoded(recs)
    assert [(r.host, r.gpu, r.link) for r in recs] == [("n1", 0, None), ("n1", 0, 2)]
    assert recs[0].fields.DCGM_FI_DEV_GPU_TEMP == 33 and recs[1].fields.DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL == 7
    assert recs[1].uuid == "GPU-a" and recs[1].model == "NVIDIA H100 80GB HBM3"
    # The switch's SXid (0: none) is the host's, on its GPU record; the link and CPU rows are dropped.
    assert recs[0].fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS == 0 and "sxid.fatal_sources" not in recs[0].labels
    assert math.isnan(recs[1].fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS)  # an NVLink row is no GPU record
    assert st.no_gpu_label == 4


# --- hostile values -----------------------------------------------------------------------------

LINE = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"}'
GOOD = 'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 30\n'


def _one_good(text: str):
    recs, st = parse_metrics(text, ts=TS)
    recs = _decoded(recs)
    assert [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP) for r in recs] == [(1, 30)]  # the neighbour is untouched
    return st


@pytest.mark.parametrize(
    "tail",
    [
        " ٣",  # int() reads Arabic-Indic digits: 3 °C
        " １２",  # full-width digits: 12 °C
        " 41 ١٧٦٤٤٠٣٢٠٠٠٠٠",  # a timestamp in Arabic-Indic digits
        " 41 junk 1764403200000",  # the parser took the last word as the timestamp
        " 41 1764403200000 9",  # ...so this was 41 °C at 0.009 s
    ],
)
def test_a_value_or_timestamp_the_format_does_not_allow_is_an_unparsable_line(tail):
    # Before: read as a value (or a time), where Prometheus refuses the line.
    st = _one_good(LINE + tail + "\n" + GOOD)
    assert st.bad_lines == 1


def test_an_integer_too_large_for_a_float_does_not_raise():
    # Before: prometheus_client returns int("1" + "0" * 400) and float() of it raised OverflowError:
    # the whole scrape lost on every poll.
    recs, st = parse_metrics(LINE + " 1" + "0" * 400 + "\n" + GOOD, ts=TS)
    recs = _decoded(recs)
    assert [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP) for r in recs][1] == (1, 30)
    assert math.isnan(recs[0].fields.DCGM_FI_DEV_GPU_TEMP)  # GPU 0 reports, without a value
    assert st.blank == 1


@pytest.mark.parametrize("ts_text", ["NaN", "+Inf", "-1764403200000", "1e23", "12"])
def test_a_timestamp_the_pipeline_refuses_costs_only_its_series(ts_text):
    # Before: the record took the sample's time (NaN, inf, negative, 1e20 s, 0.012 s), and the
    # decoder then refused the GPU's whole record, every field, uncounted.
    good_ts = GOOD.replace(" 30\n", " 30 1764403200000\n")
    recs, st = parse_metrics(GOOD.replace("gpu=\"1\"", "gpu=\"1\",x=\"y\"").replace(" 30\n", f" 99 {ts_text}\n").replace("GPU_TEMP", "POWER_USAGE") + good_ts, ts=TS + 5)
    (rec,) = _decoded(recs)
    assert rec.ts == 1764403200.0 and rec.fields.DCGM_FI_DEV_GPU_TEMP == 30
    assert math.isnan(rec.fields.DCGM_FI_DEV_POWER_USAGE)
    assert st.bad_timestamp == 1


def test_a_federated_timestamp_in_milliseconds_is_the_records_time():
    recs, st = parse_metrics(GOOD.replace(" 30\n", " 30 1764403200500\n"), ts=TS + 60)
    assert recs[0].ts == TS + 0.5 and st.bad_timestamp == 0


@pytest.mark.parametrize(
    "label",
    [
        'Hostname="n\\u0000x"'.replace("\\u0000", "\x00"),  # NUL
        'Hostname="n1\x1b[2J"',  # a terminal escape
        'Hostname="' + "h" * 300 + '"',  # longer than a DNS name
        'Hostname="n 1"',  # a space
        'modelName="NVIDIA\x00H100"',
    ],
)
def test_a_host_or_model_the_decoder_refuses_is_a_bad_label(label):
    # Before: the record was sent and the decoder refused it whole (bad_identifier), uncounted here.
    key = label.split("=", 1)[0]
    bad = LINE.replace(next(p for p in LINE[LINE.index("{") + 1 : -1].split(",") if p.startswith(key + "=")), label)
    st = _one_good(bad + " 41\n" + GOOD)
    assert st.bad_label == 1


def test_source_counts_bad_timestamps(tmp_path):
    p = tmp_path / "s.prom"
    p.write_text(LINE + " 41 NaN\n" + GOOD)
    src = ExporterSource(files=[str(p)])
    assert [r.gpu for r in src.poll()] == [1]
    assert src.summary()["dropped.bad_timestamp"] == 1


@pytest.mark.parametrize(
    "text",
    [
        b"\x00" * 100,
        LINE.encode() + b" 4\x001\n",
        LINE.encode()[:40] + b"\xff\xfe" + LINE.encode()[40:] + b" 41\n",
        b"\xef\xbb\xbf" + LINE.encode() + b" 41\n",  # a byte-order mark
        (LINE + " 41\r\n").encode(),
        (LINE.replace('Hostname="n1"', 'Hostname="n1",pod="a\\"b\\\\c\\nd"') + " 41\n").encode(),
        ("# HELP DCGM_FI_DEV_GPU_TEMP \u2028 \\ ‘x’\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" + LINE + " 4.1e+01\n").encode(),
        (LINE + " 41\n" + LINE[:50]).encode(),  # cut mid-line
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="true"} 41\n').encode(),  # a pod label named gpu repeats it
    ],
)
def test_hostile_bytes_never_raise_and_every_record_decodes(text):
    recs, st = parse_metrics(GOOD + text.decode("utf-8", "replace"), ts=TS)
    recs = _decoded(recs)
    assert (1, 30) in [(r.gpu, r.fields.DCGM_FI_DEV_GPU_TEMP) for r in recs]


def test_a_saved_scrape_with_a_byte_order_mark_keeps_its_first_series(tmp_path):
    # A scrape saved by a Windows editor or PowerShell's Out-File starts with U+FEFF: before, the
    # first line's metric name carried it and that series was an unknown metric.
    f = tmp_path / "scrape.txt"
    line = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="n1"} 41\n'
    f.write_bytes(b"\xef\xbb\xbf" + line.encode())
    assert read_saved(str(f)) == line
