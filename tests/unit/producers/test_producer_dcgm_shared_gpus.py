"""dcgm-exporter on GPUs shared by several pods (``--kubernetes-virtual-gpus``: time-slicing, MPS).

The exporter's pod mapper (``internal/pkg/transformation/kubernetes.go``, ``Process`` with
``KubernetesVirtualGPUs``) writes one copy of each GPU series per pod on the GPU, differing only in
the attribution attributes (``container``, ``namespace``, ``pod``, ``pod_uid``, ``vgpu``, rendered
after the labels in sorted order by ``gpuMetricsFormat``); a GPU no pod uses keeps its plain series.
The record of a shared GPU keeps the first pod in ``pod``/``namespace``/``container`` and lists
every pod in ``pods`` (``namespace/pod``, sorted, at most ``MAX_SHARED_PODS``) with ``pod_count``;
an alert on the GPU carries both.
"""

from __future__ import annotations

import time

from pipeline.decode import Decoder
from pipeline.engine import Engine
from pipeline.schema import MAX_PODS_CHARS, MAX_SHARED_PODS, POD_COUNT_LABEL, PODS_LABEL, dcgm, encode
from producers.dcgm_exporter import parse_metrics
from tests.factories import T0

UUIDS = ("GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a")
# The thermal-throttling rule's inputs (tests/unit/engine/test_job_labels.py's HOT), by DCGM name.
HOT = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 64, "DCGM_FI_DEV_GPU_UTIL": 99, "DCGM_FI_DEV_GPU_TEMP": 90,
       "DCGM_FI_DEV_SM_CLOCK": 1005}
COOL = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0, "DCGM_FI_DEV_GPU_UTIL": 40, "DCGM_FI_DEV_GPU_TEMP": 50,
        "DCGM_FI_DEV_SM_CLOCK": 1980}
# (container, namespace, pod, vgpu) as the mapper's PodInfo gives them; the trainer pod has two
# containers on the GPU, so it is copied twice.
SHARING = [
    ("vllm", "serving", "vllm-decode-7f9c-x2kq", "0"),
    ("main", "research", "trainer-0", "1"),
    ("sidecar", "research", "trainer-0", "1"),
    ("nb", "alice", "jupyter-alice", "2"),
]
ALL_PODS = "alice/jupyter-alice,research/trainer-0,serving/vllm-decode-7f9c-x2kq"


def _line(metric: str, gpu: int, value: float, attrs: dict[str, str]) -> str:
    """One series as gpuMetricsFormat renders it: fixed labels, hostname, label-type fields, then
    the sorted attributes."""
    lab = [f'gpu="{gpu}"', f'UUID="{UUIDS[gpu]}"', f'pci_bus_id="00000000:{0x53 + gpu:02X}:00.0"',
           f'device="nvidia{gpu}"', 'modelName="NVIDIA H100 80GB HBM3"', 'hostname="gpu-node-1"',
           'DCGM_FI_DRIVER_VERSION="580.105.08"']
    lab += [f'{k}="{v}"' for k, v in sorted(attrs.items())]
    return f"{metric}{{{','.join(lab)}}} {value:g}"


def _scrape(gpu0: list[tuple[str, str, str, str]], gpu1: list[tuple[str, str, str, str]] | None = None,
            values: dict[str, float] | None = None, per_pod: dict[str, list[float]] | None = None) -> str:
    """A scrape of two GPUs: each family's header, then per GPU one copy per (container, namespace,
    pod, vgpu) -- the plain series where there is none. ``per_pod``: a metric's value per copy."""
    values = values or COOL
    out = []
    for metric, v in values.items():
        out += [f"# HELP {metric} {metric}", f"# TYPE {metric} gauge"]
        for gpu, pods in ((0, gpu0), (1, gpu1 or [])):
            if not pods:
                out.append(_line(metric, gpu, v, {}))
            for i, (c, ns, pod, vgpu) in enumerate(pods):
                val = per_pod[metric][i] if per_pod and metric in per_pod and gpu == 0 else v
                out.append(_line(metric, gpu, val, {"container": c, "namespace": ns, "pod": pod, "pod_uid": "",
                                                    "vgpu": vgpu}))
    return "\n".join(out) + "\n"


def _by_gpu(text: str):
    recs, st = parse_metrics(text, ts=T0)
    return {r.gpu: r for r in recs}, st


def test_a_gpu_shared_by_three_pods_lists_every_pod_once():
    # Before: the record named vllm-decode only and 12 copies were dropped.duplicate_series.
    recs, st = _by_gpu(_scrape(SHARING, [("main", "batch", "etl-0", "")]))
    rec = recs[0]
    assert rec.labels["pod"] == "vllm-decode-7f9c-x2kq" and rec.labels["namespace"] == "serving"
    assert rec.labels["container"] == "vllm"
    assert rec.labels[PODS_LABEL] == ALL_PODS and rec.labels[POD_COUNT_LABEL] == "3"
    assert rec.fields.DCGM_FI_DEV_GPU_TEMP == 50
    # The copies agree: merged, nothing dropped, every sample used.
    assert st.duplicate_series == 0 and st.used == st.samples == 4 * (4 + 1)


def test_a_gpu_with_one_pod_is_unchanged():
    text = _scrape(SHARING, [("main", "batch", "etl-0", "")])
    recs, _ = _by_gpu(text)
    alone, _ = _by_gpu(_scrape(SHARING[:1], [("main", "batch", "etl-0", "")]))
    # Empty values (pod_uid, vgpu) are left out as before.
    assert recs[1].labels == {"pci_bus_id": "00000000:54:00.0", "device": "nvidia1", "DCGM_FI_DRIVER_VERSION": "580.105.08",
                              "container": "main", "namespace": "batch", "pod": "etl-0"}
    assert PODS_LABEL not in recs[1].labels and POD_COUNT_LABEL not in recs[1].labels
    assert alone[1] == recs[1] and PODS_LABEL not in alone[0].labels
    # Two containers of one pod are one pod: no list either.
    two, st = _by_gpu(_scrape(SHARING[1:3]))
    assert PODS_LABEL not in two[0].labels and two[0].labels["container"] == "main"
    assert st.duplicate_series == 0


def test_per_pod_shares_are_counted_apart_the_gpus_value_kept():
    # The mapper's per-process GPU_UTIL/FB_USED copies carry each pod's share: the first (the
    # device's) is kept, and nothing is lost (a review found a complete scrape exiting 3 for them).
    text = _scrape(SHARING, per_pod={"DCGM_FI_DEV_GPU_UTIL": [40, 10, 10, 25]})
    recs, st = _by_gpu(text)
    assert recs[0].fields.DCGM_FI_DEV_GPU_UTIL == 40
    assert st.pod_shares == 3 and st.duplicate_series == 0  # 10, 10 and 25: each pod's share
    assert recs[0].labels[PODS_LABEL] == ALL_PODS


def test_pod_copies_of_another_metric_that_disagree_are_still_duplicates():
    text = _scrape(SHARING, per_pod={"DCGM_FI_DEV_GPU_TEMP": [60, 61, 61, 61]})
    recs, st = _by_gpu(text)
    assert recs[0].fields.DCGM_FI_DEV_GPU_TEMP == 60 and st.duplicate_series == 3


def test_hostile_pod_labels_are_left_out_of_the_list_and_counted():
    bad = [
        ("c", "ns", "p" * 300, "0"),  # past Kubernetes' 253 characters
        ("c", "n" * 64, "pod-x", "1"),  # past a namespace's 63
        ("c", "ns", "bell\x07", "2"),
        ("c", "ns", "a\\nb", "3"),
        ("c", "ns", "a,b", "4"),
        ("c", "ns/evil", "a", "5"),
        ("c", "ns", "two words", "6"),
    ]
    good = [("c", "ns", "ok-1", "7"), ("c", "ns", "ok-0", "8")]
    recs, st = _by_gpu(_scrape(bad + good))
    # Counted once each, never listed; the count says how many pods share the GPU.
    assert recs[0].labels[PODS_LABEL] == "ns/ok-0,ns/ok-1" and recs[0].labels[POD_COUNT_LABEL] == "9"
    assert st.labels_dropped == 7 and st.duplicate_series == 0
    # A GPU whose one pod has such a name is as before: nothing listed, nothing counted.
    alone, st = _by_gpu(_scrape(bad[2:3]))
    assert PODS_LABEL not in alone[0].labels and POD_COUNT_LABEL not in alone[0].labels and st.labels_dropped == 0


def test_many_pods_are_bounded_and_counted():
    pods = [("c", f"ns{i % 7}", f"pod-{i:04d}-" + "x" * 200, str(i)) for i in range(300)]
    t0 = time.monotonic()
    recs, st = _by_gpu(_scrape(pods))
    elapsed = time.monotonic() - t0
    listed = recs[0].labels[PODS_LABEL].split(",")
    every = sorted(f"{ns}/{p}" for _, ns, p, _ in pods)
    assert listed == every[:MAX_SHARED_PODS] and recs[0].labels[POD_COUNT_LABEL] == "300"
    assert st.duplicate_series == 0 and elapsed < 5


def test_a_pods_label_from_the_exporter_is_not_taken_for_the_list():
    # --kubernetes-enable-pod-labels copies a pod's own Kubernetes labels onto its series.
    text = _scrape([("main", "batch", "etl-0", "")]).replace('pod_uid=""', 'pod_uid="",pods="kube-system/x"')
    recs, _ = _by_gpu(text)
    assert PODS_LABEL not in recs[0].labels


def test_a_shared_gpu_instance_lists_its_pods_under_the_instance():
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    base = ('gpu="0",UUID="GPU-x",pci_bus_id="00000000:3B:00.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",'
            'GPU_I_PROFILE="3g.40gb",GPU_I_ID="{i}",hostname="n1",container="c",namespace="ns",pod="{p}"')
    for i, p in ((1, "a"), (1, "b"), (2, "z")):
        lines.append("DCGM_FI_DEV_GPU_TEMP{" + base.format(i=i, p=p) + "} 40")
    (rec,), st = parse_metrics("\n".join(lines) + "\n", ts=T0)
    assert rec.labels["mig.1.pods"] == "ns/a,ns/b" and rec.labels["mig.1.pod_count"] == "2"
    assert PODS_LABEL not in rec.labels and "mig.2.pods" not in rec.labels
    assert st.duplicate_series == 0


def test_the_list_survives_both_decoders_at_its_largest():
    pods = [("c", "n" * 63, f"{i:03d}" + "p" * 250, str(i)) for i in range(MAX_SHARED_PODS + 5)]
    recs, _ = _by_gpu(_scrape(pods))
    payload = encode(recs[0])
    for dec in (Decoder(), Decoder(fields=Engine().decode_fields)):
        out = dec.decode_many([payload], ["t:0"])
        assert not out.dead
        labels = out.records[0].labels
        get = labels.get if isinstance(labels, dict) else lambda k: getattr(labels, k)
        assert get(PODS_LABEL) == recs[0].labels[PODS_LABEL] and get(POD_COUNT_LABEL) == str(MAX_SHARED_PODS + 5)


def _alerts(fast: bool):
    eng = Engine()
    dec = Decoder(fields=eng.decode_fields if fast else None)
    payloads = []
    for t in range(20):
        recs, _ = parse_metrics(_scrape(SHARING, [("main", "batch", "etl-0", "")], values=HOT), ts=T0 + t)
        payloads += [encode(r) for r in recs if r.gpu == 0]
    out = dec.decode_many(payloads, [f"t:{i}" for i in range(len(payloads))])
    assert not out.dead
    res = eng.process(out.records, out.origins)
    res.extend(eng.flush())
    return res.alerts


def test_an_alert_on_a_shared_gpu_lists_every_pod():
    # Before: the alert named vllm-decode only; a hook evicting "the pod" left the other two on the faulty GPU.
    for fast in (True, False):
        alerts = _alerts(fast)
        assert [a.fault for a in alerts] == ["thermal_throttling"]
        a = alerts[0]
        assert a.labels["pod"] == "vllm-decode-7f9c-x2kq" and a.labels["namespace"] == "serving"
        assert a.labels[PODS_LABEL] == ALL_PODS and a.labels[POD_COUNT_LABEL] == "3"


def test_a_copy_differing_beyond_attribution_is_still_a_duplicate():
    # Another driver-version label is no pod's copy: the format's one series per label set, counted.
    text = _scrape(SHARING[:1])
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    other = line.replace('580.105.08"', '580.105.09"').replace('pod="vllm-decode-7f9c-x2kq"', 'pod="other"')
    recs, st = _by_gpu(text + other + "\n")
    assert st.duplicate_series == 1 and PODS_LABEL not in recs[0].labels


def test_a_hostile_pods_label_on_a_record_does_not_reach_the_alert():
    hot = {"clocks_event_reasons": 0x40, "gpu_util": 99, "gpu_temp": 90, "sm_clock": 1005}
    for labels in ({"pods": "ns/a b", "pod_count": "x"}, {"pods": "n/" + "p" * MAX_PODS_CHARS, "pod_count": "-2"},
                   {"pods": "ns/a\nns/b", "pod_count": "1" * 10}, {"pods": "", "pod_count": "٣"}):
        eng = Engine()
        dec = Decoder(fields=eng.decode_fields)
        out = dec.decode_many([encode(dcgm(T0 + t, "n1", 0, hot, labels={"pod": "a", **labels})) for t in range(20)],
                              [f"t:{t}" for t in range(20)])
        res = eng.process(out.records, out.origins)
        res.extend(eng.flush())
        assert [a.labels for a in res.alerts] == [{"pod": "a"}], labels


def test_the_pod_lists_keep_to_the_gpus_label_budget():
    # Found by a review: the lists were added after the 64 KiB budget was applied, so seven
    # shared GPU instances of 64 long-named pods put 184,494 label characters on one record.
    from producers.dcgm_exporter import MAX_ENTITY_LABEL_CHARS, parse_metrics

    lines = []
    for mig in range(7):
        for p in range(64):
            pod, ns = f"p{p:02d}-" + "x" * 240, "n" * 63
            lines.append(f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1",GPU_I_ID="{mig}",GPU_I_PROFILE="1g.10gb",'
                         f'pod="{pod}",namespace="{ns}",container="c"}} 41')  # fmt: skip
    recs, st = parse_metrics("\n".join(lines) + "\n", ts=T0)
    total = sum(len(k) + len(v) for k, v in recs[0].labels.items())
    assert total <= MAX_ENTITY_LABEL_CHARS
    assert st.labels_dropped > 0
    assert all(recs[0].labels[f"mig.{i}.pod_count"] == "64" for i in range(7))  # how many, still said
