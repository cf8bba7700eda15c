"""dcgm-exporter producer, second review: layouts read against NVIDIA/dcgm-exporter at d5e5f51
(4.5.3-4.8.2 plus "Rename Hostname label to hostname"), and what they did to records before.

- ``internal/pkg/hostname/hostname.go`` (4.0.0 on): with ``-r HOST:PORT`` and no ``-k`` the host
  label is the hostengine's address, so ``-r localhost:5555`` labels every node ``localhost``.
- ``internal/pkg/collector/expcollector.go``: a GPU without events in the window is rendered with
  one label map shared by all such GPUs (the last GPU's label-type fields, other GPUs' pod labels).
- ``internal/pkg/transformation/kubernetes.go`` (``--kubernetes-virtual-gpus``): one copy of every
  series per pod sharing the GPU; for GPU_UTIL and FB_USED the device-level series first, then one
  per pod with the pod's own share.
- What the decoder refuses (GPU index past 4095, NVLink past 1023) and what would outgrow a
  message (thousands of GPU instances, XID codes or labels on one GPU).
"""

from __future__ import annotations

import gzip
import http.server
import logging
import math
import threading

import pytest

from pipeline.catalog import FIELDS
from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.dcgm_exporter import (
    MAX_BODY_BYTES,
    MAX_ENTITY_LABEL_CHARS,
    MAX_MIG_INSTANCES,
    MAX_UNKNOWN_NAME,
    MAX_XID_CODES,
    ExporterSource,
    ScrapeError,
    fetch,
    is_loopback,
    parse_metrics,
    read_saved,
)

from tests.factories import SHARED_DATA as DATA  # noqa: E402

TS = 1764403200.0
H100 = DATA / "dcgm_exporter_h100_8gpu_sampled.prom"


def _decoded(records):
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in records) + b"]", "test")
    assert out.dead == [], [(d.reason, d.detail) for d in out.dead]
    return out.records


def _gpu(gpu: int = 0, host: str = "gpu-node-1", **extra: str) -> str:
    """The labels of render_metrics.go's gpuMetricsFormat at d5e5f51, in its order."""
    base = (
        f'gpu="{gpu}",UUID="GPU-{gpu:08d}-69c4-b61d-e0bc-7b2460096005",pci_bus_id="00000000:{0x53 + gpu:02X}:00.0",'
        f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3"'
    )
    if host:
        base += f',hostname="{host}"'
    return "{" + base + "".join(f',{k}="{v}"' for k, v in sorted(extra.items())) + "}"


# -- the host label of a remote hostengine -----------------------------------------------------


@pytest.mark.parametrize("label", ["localhost", "LOCALHOST", "127.0.0.1", "127.0.1.1", "::1", "0.0.0.0", "localhost."])
def test_a_loopback_host_label_is_no_host(label):
    # Before: `dcgm-exporter -r localhost:5555` (nv-hostengine as a host service) gave every node
    # the host "localhost": each node's GPU 0 was one entity of the engine, their data mixed.
    text = f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, label)} 41\nDCGM_FI_DEV_GPU_TEMP{_gpu(1, label)} 42\n"
    recs, st = parse_metrics(text, ts=TS, default_host="gpu-node-7")
    assert [(r.host, r.gpu) for r in _decoded(recs)] == [("gpu-node-7", 0), ("gpu-node-7", 1)]
    assert st.loopback_host == 2 and st.bad_label == 0
    # --host still decides when given.
    recs, st = parse_metrics(text, ts=TS, host="n9", default_host="gpu-node-7")
    assert {r.host for r in recs} == {"n9"} and st.loopback_host == 0


@pytest.mark.parametrize(
    "label", ["gpu-node-1", "10.0.0.7", "fe80::1", "localhost-gpu-3", "node.localdomain", "::ffff:10.0.0.1"]
)
def test_a_host_label_that_names_a_host_is_kept(label):
    recs, st = parse_metrics(f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, label)} 41\n", ts=TS, default_host="me")
    assert recs[0].host == label and st.loopback_host == 0


def test_loopback_is_not_fooled_by_long_or_odd_names():
    assert not is_loopback("1" * 10_000) and not is_loopback("[]") and not is_loopback("")
    assert is_loopback("[::1]") and is_loopback("127.255.255.254")


def test_a_switch_sxid_of_a_loopback_host_goes_on_this_hosts_gpus():
    text = (
        f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, 'localhost')} 41\n"
        'DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS{nvswitch="nvswitch0",hostname="localhost"} 12028\n'
    )
    (rec,), st = parse_metrics(text, ts=TS, default_host="gpu-node-7")
    assert rec.host == "gpu-node-7" and rec.fields.DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS == 12028
    assert st.no_gpu_label == 0


def test_the_source_counts_loopback_labels_and_warns_once(tmp_path, caplog):
    p = tmp_path / "s.prom"
    p.write_text(f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, 'localhost')} 41\n")
    src = ExporterSource(files=[str(p), str(p)])
    src.default_host = "gpu-node-7"
    with caplog.at_level(logging.WARNING):
        assert [r.host for r in src.poll() + src.poll()] == ["gpu-node-7", "gpu-node-7"]
    assert src.summary()["loopback_host_labels"] == 2
    assert caplog.text.count("loopback host") == 1


# -- what the decoder refuses, and what would outgrow a message ---------------------------------


@pytest.mark.parametrize(("gpu", "link"), [("4096", None), ("999999999", None), ("0", "1024"), ("0", "123456")])
def test_a_gpu_or_link_index_the_decoder_refuses_is_a_bad_label(gpu, link):
    # Before: sent, and refused whole by the decoder (out_of_range) with nothing counted here.
    extra = f',nvlink="{link}"' if link else ""
    name = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" if link else "DCGM_FI_DEV_GPU_TEMP"
    bad = f'{name}{{gpu="{gpu}",hostname="n1"{extra}}} 7\n'
    good = 'DCGM_FI_DEV_GPU_TEMP{gpu="4095",hostname="n1"} 41\nDCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu="1",nvlink="1023",hostname="n1"} 0\n'
    recs, st = parse_metrics(bad + good, ts=TS)
    assert sorted((r.gpu, r.link) for r in _decoded(recs)) == [(1, 1023), (4095, None)]
    assert st.bad_label == 1


def test_gpu_instances_past_the_bound_are_counted_and_the_record_fits():
    # Before: 367,000 GPU_I_IDs made one record of 13.7 MB, past the 8 MiB message: refused at
    # the broker, and the GPU's temperature and XIDs with it.
    n = MAX_MIG_INSTANCES + 136
    text = f"DCGM_FI_DEV_GPU_TEMP{_gpu(0)} 41\n" + "".join(
        f"DCGM_FI_DEV_FB_USED{_gpu(0, GPU_I_ID=str(i), GPU_I_PROFILE='1g.10gb')} {i}\n" for i in range(n)
    )
    (rec,), st = parse_metrics(text, ts=TS)
    (rec,) = _decoded([rec])
    assert rec.fields.DCGM_FI_DEV_GPU_TEMP == 41
    assert len(rec.labels["mig.instances"].split(",")) == MAX_MIG_INSTANCES
    assert st.bad_label == n - MAX_MIG_INSTANCES
    assert len(encode(rec)) < 64 * 1024


def test_xid_codes_listed_are_bounded_and_the_total_is_not():
    # Before: 534,000 xid codes made one record's xid_counts label 4.7 MB.
    n = MAX_XID_CODES * 3
    text = "".join(
        f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",hostname="n1",window_size_in_ms="300000",xid="{c}"}} 1\n'
        for c in range(1, n + 1)
    )
    (rec,), st = parse_metrics(text, ts=TS)
    assert rec.fields.DCGM_EXP_XID_ERRORS_COUNT == n
    assert len(rec.labels["xid_counts"].split(",")) == MAX_XID_CODES
    assert st.used == n and st.bad_label == 0


def test_an_entitys_labels_are_bounded_and_its_fields_kept():
    # Labels with new names on each of a GPU's metrics gathered without bound (a 32 MiB scrape
    # could make one record of tens of MB: refused at the broker, every field of the GPU lost).
    names = [n for n in FIELDS.all_names if n.startswith("DCGM_FI_DEV_")][:40]
    lines = []
    for j, name in enumerate(names):
        junk = {f"l{j}_{i}": "v" * 500 for i in range(100)}
        lines.append(f"{name}{_gpu(0, pod='train-0', namespace='ml', **junk)} 1\n")
    (rec,), st = parse_metrics("".join(lines), ts=TS)
    (rec,) = _decoded([rec])
    assert sum(len(k) + len(v) for k, v in rec.labels.items()) <= MAX_ENTITY_LABEL_CHARS + 1024
    assert rec.labels["pod"] == "train-0" and rec.labels["namespace"] == "ml"
    assert st.labels_dropped > 0 and st.used == len(names)
    assert all(getattr(rec.fields, n) == 1 for n in names)


def test_the_real_scrapes_lose_no_label_to_the_bound():
    recs, st = parse_metrics(H100.read_text() + (DATA / "dcgm_exporter_t4_full_format.prom").read_text(), ts=TS)
    assert st.labels_dropped == 0 and st.loopback_host == 0 and len(recs) == 10


def test_unknown_metric_names_kept_for_the_warning_are_bounded():
    name = "DCGM_FI_UNKNOWN_" + "X" * 60_000
    recs, st = parse_metrics(f"{name}{_gpu(0)} 1\n" * 3 + f"DCGM_FI_DEV_GPU_TEMP{_gpu(0)} 41\n", ts=TS)
    assert st.unknown_metric == 3 and [len(n) for n in st.unknown_names] == [MAX_UNKNOWN_NAME]


# -- DCGM_EXP_ series: one label map shared by GPUs without events ------------------------------


def test_exp_series_do_not_relabel_a_gpu_with_another_gpus_fields():
    # expcollector.go renders GPUs with no XID in the window from one map that getLabelsFromCounters
    # refills for each GPU (and the pod mapper adds every pod's labels to): each such series holds
    # the LAST GPU's DCGM_FI_DEV_SERIAL. Before, GPU 0's serial became GPU 1's whenever the XID
    # family was rendered after the DCGM fields (Go's map order: some scrapes).
    s0, s1 = "1652123000111", "1652123000222"
    text = (
        f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, DCGM_FI_DEV_SERIAL=s0, pod='a', namespace='ml', app='trainer-a')} 41\n"
        f"DCGM_FI_DEV_GPU_TEMP{_gpu(1, DCGM_FI_DEV_SERIAL=s1)} 42\n"
        "# HELP DCGM_EXP_XID_ERRORS_COUNT Count of XID Errors within user-specified time window (see xid-count-window-size param).\n"
        "# TYPE DCGM_EXP_XID_ERRORS_COUNT counter\n"
        f"DCGM_EXP_XID_ERRORS_COUNT{_gpu(0, DCGM_FI_DEV_SERIAL=s1, app='trainer-b', namespace='ml', pod='a', window_size_in_ms='300000')} 0\n"
        f"DCGM_EXP_XID_ERRORS_COUNT{_gpu(1, DCGM_FI_DEV_SERIAL=s1, app='trainer-b', window_size_in_ms='300000')} 0\n"
    )
    recs, _ = parse_metrics(text, ts=TS)
    r0, r1 = _decoded(recs)
    assert r0.labels["DCGM_FI_DEV_SERIAL"] == s0 and r0.labels["app"] == "trainer-a" and r0.labels["pod"] == "a"
    assert r1.labels["DCGM_FI_DEV_SERIAL"] == s1 and "app" not in r1.labels  # GPU 1 runs no pod
    assert r0.fields.DCGM_EXP_XID_ERRORS_COUNT == 0 and r0.labels["xid_count_window_ms"] == "300000"


def test_a_gpu_reported_only_by_exp_series_keeps_their_labels():
    text = f"DCGM_EXP_XID_ERRORS_COUNT{_gpu(3, pod='p', window_size_in_ms='300000', xid='79')} 2\n"
    (rec,), _ = parse_metrics(text, ts=TS)
    assert rec.labels["pod"] == "p" and rec.labels["xid_counts"] == "79:2"


# -- --kubernetes-virtual-gpus: one copy of every series per pod sharing the GPU -----------------

SHARED = (
    # Per-process metric: the device-level series first, then each pod's share (uid always set).
    f"DCGM_FI_DEV_GPU_UTIL{_gpu(0)} 80\n"
    f"DCGM_FI_DEV_GPU_UTIL{_gpu(0, container='c', namespace='team-a', pod='pod-a', pod_uid='u-a')} 50\n"
    f"DCGM_FI_DEV_GPU_UTIL{_gpu(0, container='c', namespace='team-b', pod='pod-b', pod_uid='u-b')} 30\n"
    # Any other metric: one copy per pod, the same value.
    f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, container='c', namespace='team-a', pod='pod-a')} 71\n"
    f"DCGM_FI_DEV_GPU_TEMP{_gpu(0, container='c', namespace='team-b', pod='pod-b')} 71\n"
    f"DCGM_FI_DEV_XID_ERRORS{_gpu(0, container='c', namespace='team-a', pod='pod-a', err_code='79', err_msg='GPU has fallen off the bus')} 79\n"
    f"DCGM_FI_DEV_XID_ERRORS{_gpu(0, container='c', namespace='team-b', pod='pod-b', err_code='79', err_msg='GPU has fallen off the bus')} 79\n"
)


def test_a_shared_gpu_keeps_the_device_level_value_not_a_pods_share():
    (rec,), st = parse_metrics(SHARED, ts=TS)
    (rec,) = _decoded([rec])
    assert rec.fields.DCGM_FI_DEV_GPU_UTIL == 80  # the whole GPU's, not pod-a's 50
    assert rec.fields.DCGM_FI_DEV_GPU_TEMP == 71 and rec.fields.DCGM_FI_DEV_XID_ERRORS == 79


# -- gzip -----------------------------------------------------------------------------------------


def test_a_saved_gzip_scrape_is_read(tmp_path):
    # Before: read as text, a .prom.gz was an "empty scrape" with a few unparsable lines.
    p = tmp_path / "scrape.prom.gz"
    p.write_bytes(gzip.compress(H100.read_bytes()))
    assert read_saved(str(p)) == H100.read_text()
    src = ExporterSource(files=[str(p)])
    assert len(src.poll()) == 8 and src.summary()["empty_scrapes"] == 0


def test_concatenated_and_cut_gzip(tmp_path):
    body = H100.read_bytes()
    half = body.index(b"\n", len(body) // 2) + 1
    p = tmp_path / "two.gz"
    p.write_bytes(gzip.compress(body[:half]) + gzip.compress(body[half:]))
    assert read_saved(str(p)) == H100.read_text()
    z = gzip.compress(body)
    p.write_bytes(z[: len(z) * 3 // 4])  # cut mid-stream: what it holds, the cut line dropped
    recs, st = parse_metrics(read_saved(str(p)), ts=TS)
    assert 0 < len(recs) <= 8 and st.bad_lines == 1


def test_a_gzip_bomb_or_damaged_gzip_is_refused(tmp_path):
    p = tmp_path / "bomb.gz"
    p.write_bytes(gzip.compress(b"\n" * (MAX_BODY_BYTES + 1)))
    with pytest.raises(ScrapeError) as e:
        read_saved(str(p))
    assert e.value.reason == "too_large"
    z = bytearray(gzip.compress(H100.read_bytes()))
    z[20:40] = b"\xff" * 20
    p.write_bytes(bytes(z))
    with pytest.raises(ScrapeError) as e:
        read_saved(str(p))
    assert e.value.reason == "unreadable"


class _GzipServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, body: bytes) -> None:
        self.body = body
        super().__init__(("127.0.0.1", 0), _GzipHandler)


class _GzipHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802
        body = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Encoding", "gzip")  # although the request asked for none
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize(
    ("body", "reason"), [(gzip.compress(H100.read_bytes()), None), (b"\x1f\x8b\x08\x00garbage", "protocol")]
)
def test_a_gzip_answer_over_http(body, reason):
    srv = _GzipServer(body)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
        if reason is None:
            assert fetch(url, 2.0) == H100.read_text()
        else:
            with pytest.raises(ScrapeError) as e:
                fetch(url, 2.0)
            assert e.value.reason == reason
    finally:
        srv.shutdown()
        srv.server_close()


# -- across scrapes -------------------------------------------------------------------------------


def test_a_gpu_that_leaves_and_returns_and_an_exporter_restart(tmp_path):
    xid = 'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",Hostname="gpu-node-1",window_size_in_ms="300000"%s} %d\n'
    full = H100.read_text()
    without_3 = "".join(line for line in full.splitlines(keepends=True) if 'gpu="3"' not in line)
    # An exporter restart: a failed scrape (here an empty one), then its XID window starts empty.
    # The producer passes values through: nothing is carried across scrapes to "correct" a fall.
    texts = [full + xid % (',xid="79"', 5), without_3, full, "", full + xid % ("", 0)]
    files = []
    for i, text in enumerate(texts):
        p = tmp_path / f"s{i}.prom"
        p.write_text(text)
        files.append(str(p))
    src = ExporterSource(files=files)
    polls = [src.poll() for _ in files]
    assert [len(p) for p in polls] == [8, 7, 8, 0, 8]
    assert 3 not in {r.gpu for r in polls[1]} and 3 in {r.gpu for r in polls[2]}
    c = src.summary()
    assert c["missing_gpus"] == 1 and c["empty_scrapes"] == 1
    assert polls[0][0].fields.DCGM_EXP_XID_ERRORS_COUNT == 5 and polls[0][0].labels["xid_counts"] == "79:5"
    assert polls[4][0].fields.DCGM_EXP_XID_ERRORS_COUNT == 0 and "xid_counts" not in polls[4][0].labels


def test_a_hostname_change_moves_the_records_and_mixes_nothing(tmp_path):
    # A container's hostname changes when it is re-created (docker run without --hostname): the
    # new name's records are its own, none keeps the old name.
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(H100.read_text())
    b.write_text(H100.read_text().replace('Hostname="gpu-node-1"', 'Hostname="5a1b2c3d4e5f"'))
    src = ExporterSource(files=[str(a), str(b)])
    assert {r.host for r in src.poll()} == {"gpu-node-1"}
    recs = src.poll()
    assert {r.host for r in recs} == {"5a1b2c3d4e5f"} and len(recs) == 8


def test_values_reach_the_record_unchanged_at_their_extremes():
    text = (
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{_gpu(0)} 9007199254740993\n"  # > 2^53: a float's nearest
        f"DCGM_FI_DEV_GPU_TEMP{_gpu(0)} NaN\n"
        f"DCGM_FI_DEV_POWER_USAGE{_gpu(0)} +Inf\n"
        f"DCGM_FI_DEV_SM_CLOCK{_gpu(0)} 1e400\n"
        f"DCGM_FI_DEV_MEM_CLOCK{_gpu(0)} 1593.000000 1764403260000\n"
    )
    (rec,), st = parse_metrics(text, ts=TS)
    (rec,) = _decoded([rec])
    assert rec.fields.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION == 9007199254740992
    assert math.isnan(rec.fields.DCGM_FI_DEV_GPU_TEMP) and math.isnan(rec.fields.DCGM_FI_DEV_SM_CLOCK)
    assert rec.fields.DCGM_FI_DEV_MEM_CLOCK == 1593 and rec.ts == TS + 60
    assert st.blank == 3
