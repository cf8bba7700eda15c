"""dcgm-exporter producer: the real samples field by field, label variants, sentinels, and a real
HTTP server on 127.0.0.1 that serves, fails, hangs and cuts its answer short."""

from __future__ import annotations

import http.server
import math
import threading
import time

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.dcgm_exporter import ExporterSource, fetch, parse_metrics, ScrapeError

from tests.factories import SHARED_DATA as DATA  # noqa: E402
H100 = DATA / "dcgm_exporter_h100_8gpu_sampled.prom"
T4 = DATA / "dcgm_exporter_t4_full_format.prom"
TS = 1764403200.0


def _roundtrip(records):
    """Every record must decode with the pipeline's own decoder, unchanged."""
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in records) + b"]", "test")
    assert out.dead == []
    assert len(out.records) == len(records)
    return out.records


def test_h100_sample_field_by_field():
    recs, st = parse_metrics(H100.read_text(), ts=TS)
    recs = _roundtrip(recs)
    assert [r.gpu for r in recs] == list(range(8))
    assert {r.host for r in recs} == {"gpu-node-1"}          # from the Hostname label
    temps = [30, 29, 26, 29, 28, 26, 28, 26]
    power = [113.611, 68.347, 65.709, 67.316, 68.717, 65.742, 67.328, 66.997]
    for r, t, p in zip(recs, temps, power):
        assert r.fields.DCGM_FI_DEV_GPU_TEMP == t
        assert r.fields.DCGM_FI_DEV_POWER_USAGE == pytest.approx(p)
        assert r.fields.DCGM_FI_DEV_GPU_UTIL == 0
        assert r.model == "NVIDIA H100 80GB HBM3"
        assert r.ts == TS and r.link is None
        assert r.labels["DCGM_FI_DRIVER_VERSION"] == "580.105.08"
        assert math.isnan(r.fields.DCGM_FI_DEV_SM_CLOCK)     # not in the scrape: absent, not 0
    assert recs[0].uuid == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    assert recs[0].labels["pci_bus_id"] == "00000000:53:00.0"
    # Kubernetes labels ride along where the exporter gave them; empty ones (pod_uid="") do not.
    assert recs[0].labels["pod"] == "vllm-agg-0-vllmdecodeworker-s65j5"
    assert recs[0].labels["namespace"] == "dynamo-workload" and "pod_uid" not in recs[0].labels
    assert "pod" not in recs[1].labels
    # The sample is filtered: MEM_COPY_UTIL exists for GPUs 0-5 only.
    assert [not math.isnan(r.fields.DCGM_FI_DEV_MEM_COPY_UTIL) for r in recs] == [True] * 6 + [False] * 2
    assert st.samples == 30 and st.used == 30 and st.blank == 0


def test_t4_sample_two_hosts_both_layouts():
    recs, st = parse_metrics(T4.read_text(), ts=TS)
    recs = _roundtrip(recs)
    by_host = {r.host: r for r in recs}
    assert set(by_host) == {"424773df46e0", "551bdf382151"}
    a, b = by_host["424773df46e0"], by_host["551bdf382151"]
    assert (a.fields.DCGM_FI_DEV_SM_CLOCK, a.fields.DCGM_FI_DEV_MEM_CLOCK, a.fields.DCGM_FI_DEV_GPU_TEMP) == (300, 405, 25)
    assert a.fields.DCGM_FI_DEV_POWER_USAGE == pytest.approx(8.969)
    assert a.fields.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION == 128996013
    assert a.fields.DCGM_FI_DEV_XID_ERRORS == 0                 # most recent XID: none
    assert a.fields.DCGM_FI_DEV_FB_FREE == 15109 and a.fields.DCGM_FI_DEV_FB_USED == 0
    assert a.fields.DCGM_FI_DEV_PCIE_REPLAY_COUNTER == 0
    assert a.fields.DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL == 0
    assert a.labels["DCGM_FI_PROCESS_NAME"] == "/usr/bin/dcgm-exporter"
    assert "pci_bus_id" not in a.labels                          # older exporter: no pci_bus_id
    assert b.fields.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS == 1      # pre-4.6 spelling kept
    assert b.fields.DCGM_FI_DEV_SLOWDOWN_TEMP == 93 and b.fields.DCGM_FI_DEV_PSTATE == 8
    assert b.fields.DCGM_FI_DEV_POWER_MGMT_LIMIT == 70 and b.fields.DCGM_FI_DEV_FB_TOTAL == 15109
    assert b.labels["DCGM_FI_DEV_SERIAL"] == "1565220008176"
    # ENC/DEC util and vGPU licence are in the exporter's default list: skipped, counted, not warned
    # about; the device count (DCGM_FI_DEV_COUNT) is in no stock list: unknown.
    assert st.not_used == 3 and st.unknown_metric == 1


SYNTH = """\
# TYPE DCGM_FI_DEV_GPU_TEMP_CELSIUS gauge
DCGM_FI_DEV_GPU_TEMP_CELSIUS{gpu="0",uuid="GPU-a",model_name="H100",hostname="n7",hpc_job="4242"} 71
DCGM_FI_DEV_GPU_TEMP_CELSIUS{gpu="1",uuid="GPU-b",model_name="H100",hostname="n7"} 9223372036854775794
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",hostname="n7"} 96
DCGM_FI_DEV_SM_CLOCK{gpu="1",hostname="n7"} 2147483632
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",hostname="n7"} 2147483640
DCGM_FI_DEV_POWER_USAGE{gpu="1",hostname="n7"} 140737488355328.000000
DCGM_FI_DEV_XID_ERRORS{gpu="0",hostname="n7",err_code="79",err_msg="GPU has fallen off the bus"} 79
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{nvlink="3",gpu="0",gpu_uuid="GPU-a",hostname="n7"} 12
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{nvlink="4",gpu="0",gpu_uuid="GPU-a",hostname="n7"} 0
dcgm_sm_clock{gpu="0",Hostname="n7"} 1980
DCGM_FI_DEV_GPU_UTIL{UUID="GPU-c"} 5
"""


def test_label_variants_sentinels_nvlink_and_xid():
    recs, st = parse_metrics(SYNTH, ts=TS)
    recs = _roundtrip(recs)
    key = {(r.gpu, r.link): r for r in recs}
    assert set(key) == {(0, None), (1, None), (0, 3), (0, 4)}
    g0, g1 = key[(0, None)], key[(1, None)]
    assert g0.host == "n7" and g0.uuid == "GPU-a" and g0.model == "H100" and g0.labels == {"hpc_job": "4242"}
    assert g0.fields.DCGM_FI_DEV_GPU_TEMP_CELSIUS == 71          # 4.6 spelling kept as given
    assert g0.fields.DCGM_FI_DEV_CLOCKS_EVENT_REASONS == 96
    assert g0.fields.DCGM_FI_DEV_XID_ERRORS == 79                # the code, not a count
    assert "err_code" not in g0.labels
    assert g0.fields.DCGM_FI_DEV_SM_CLOCK == 1980                # old namespace name
    # Sentinels dropped: int64 blank temp, int32 blank clock, fp64 blank power...
    assert math.isnan(g1.fields.DCGM_FI_DEV_GPU_TEMP_CELSIUS)
    assert math.isnan(g1.fields.DCGM_FI_DEV_SM_CLOCK)
    assert math.isnan(g1.fields.DCGM_FI_DEV_POWER_USAGE)
    # ...but an energy counter past 2^31 is data.
    assert g1.fields.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION == 2147483640
    assert st.blank == 3
    assert {d[2] for d in st.dropped} == {"blank_sentinel", "no_gpu_label"}
    assert key[(0, 3)].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 12
    assert key[(0, 3)].uuid == "GPU-a"
    assert key[(0, 4)].fields.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL == 0
    assert st.no_gpu_label == 1


def test_host_override_and_default():
    recs, _ = parse_metrics('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="pod-abc"} 50\n', ts=TS, host="node-9")
    assert recs[0].host == "node-9"
    recs, _ = parse_metrics('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 50\n', ts=TS, default_host="me")
    assert recs[0].host == "me"


def test_truncated_scrape_keeps_complete_lines():
    text = H100.read_text()
    cut = text[: text.index("DCGM_FI_DEV_POWER_USAGE{gpu=\"3\"") + 40]   # mid-line, mid-label
    recs, st = parse_metrics(cut, ts=TS)
    assert st.bad_lines == 1
    assert [r.fields.DCGM_FI_DEV_GPU_TEMP for r in recs] == [30, 29, 26, 29, 28, 26, 28, 26]
    assert [not math.isnan(r.fields.DCGM_FI_DEV_POWER_USAGE) for r in recs] == [True] * 3 + [False] * 5


# -- a real HTTP server on loopback -------------------------------------------------------------

class _Exporter(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.mode = "ok"
        self.body = H100.read_bytes()
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):  # keep pytest output clean
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        srv: _Exporter = self.server  # type: ignore[assignment]
        if srv.mode == "fail":
            self.send_error(500, "DCGM not ready")
            return
        if srv.mode == "hang":
            srv.release.wait(10)
            return
        body = srv.body
        if srv.mode == "partial":
            body = body[: len(body) // 2]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if srv.mode != "partial":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def exporter():
    srv = _Exporter()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def test_scrape_real_server_then_fail_hang_partial_missing(exporter, caplog):
    url = f"http://127.0.0.1:{exporter.server_address[1]}/metrics"
    src = ExporterSource(url, timeout_s=1.0)
    recs = src.poll()
    assert len(recs) == 8 and recs[3].fields.DCGM_FI_DEV_POWER_USAGE == pytest.approx(67.316)
    _roundtrip(recs)

    exporter.mode = "fail"
    assert src.poll() == [] and src.stats.failures == 1
    assert "HTTP 500" in caplog.text

    exporter.mode = "hang"
    t0 = time.monotonic()
    assert src.poll() == []
    assert time.monotonic() - t0 < 5 and src.stats.failures == 2   # the timeout, not the server, decides

    exporter.mode = "partial"
    part = src.poll()
    # Half the body, cut mid-line and without a Content-Length: the cut line is one bad line (it
    # could parse as a wrong value), every complete line before it is kept.
    assert 0 < len(part) <= 8 and src.stats.bad_lines == 1

    exporter.mode = "ok"
    exporter.body = "\n".join(l for l in H100.read_text().splitlines() if 'gpu="5"' not in l).encode()
    recs = src.poll()
    assert [r.gpu for r in recs] == [0, 1, 2, 3, 4, 6, 7]          # GPU 5 not sent: gpu_lost fires
    assert src.stats.missing_gpus >= 1 and "gpu-node-1/gpu5" in caplog.text

    exporter.body = b"# HELP nothing here\n"
    assert src.poll() == [] and src.stats.empty == 1


def test_exporter_down_is_a_counted_failure():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    with pytest.raises(ScrapeError):
        fetch(f"http://127.0.0.1:{port}/metrics", 1.0)
    src = ExporterSource(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0)
    assert src.poll() == [] and src.stats.failures == 1


def test_saved_scrapes_one_per_poll(tmp_path):
    src = ExporterSource(files=[str(H100), str(T4)], host=None)
    assert len(src.poll()) == 8 and not src.done
    assert {r.host for r in src.poll()} == {"424773df46e0", "551bdf382151"} and src.done


def test_cli_scrapes_real_server_into_jsonl(exporter, tmp_path, capsys):
    import json

    from pipeline.cli import main

    out = tmp_path / "t.jsonl"
    url = f"http://127.0.0.1:{exporter.server_address[1]}/metrics"
    rc = main(["produce", "dcgm-exporter", "--url", url, "--out", str(out), "--count", "2", "--interval", "0.1",
               "--host", "node-7"])
    assert rc == 0
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(lines) == 16 and {l["host"] for l in lines} == {"node-7"}
    assert "16 records read, 16 delivered, 0 dropped" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["produce", "dcgmi", "--fields", "150,abc", "--out", "x"], "--fields must be comma-separated"),
    (["produce", "dcgm-exporter", "--out", "x"], "exactly one of --url URL or --file"),
    (["produce", "nccl-tests", "f", "--out", "x", "--kafka", "b:1"], "exactly one of --out FILE or --kafka"),
    (["produce", "nccl-tests", "f", "--out", "x", "--buffer", "0"], "--buffer must be a positive"),
])
def test_cli_bad_options_name_the_option(argv, message, capsys):
    from pipeline.cli import main

    assert main(argv) == 2   # a usage mistake: one line, no traceback
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_missing_gpu_and_dead_exporter_reach_the_engine_as_gpu_lost_and_telemetry_gap(exporter):
    """The producer's choice (send nothing for what is missing) proven end to end: a GPU that
    vanishes from a real exporter becomes ``gpu_lost``; an exporter that dies, ``telemetry_gap``."""
    from pipeline.engine import Engine

    second = _Exporter()
    second.body = H100.read_text().replace("gpu-node-1", "gpu-node-2").encode()
    threading.Thread(target=second.serve_forever, daemon=True).start()
    t = [TS]
    srcs = [ExporterSource(f"http://127.0.0.1:{s.server_address[1]}/metrics", timeout_s=1.0, clock=lambda: t[0])
            for s in (exporter, second)]
    eng = Engine()
    alerts = []
    full = exporter.body
    try:
        for i in range(150):
            if i == 20:   # GPU 5 of node 1 drops out of the scrape
                exporter.body = "\n".join(l for l in full.decode().splitlines() if 'gpu="5"' not in l).encode()
            if i == 40:   # node 2's exporter dies
                second.mode = "fail"
            recs = srcs[0].poll() + srcs[1].poll()
            alerts += eng.process(recs).alerts
            t[0] += 1.0
        alerts += eng.flush().alerts
    finally:
        second.shutdown()
        second.server_close()
    fired = {(a.fault, a.host, a.gpu) for a in alerts if a.state == "firing"}
    assert ("gpu_lost", "gpu-node-1", 5) in fired
    assert ("telemetry_gap", "gpu-node-2", None) in fired
    assert not any(a.fault == "gpu_lost" and a.host == "gpu-node-2" for a in alerts)   # a silent host is not 8 lost GPUs
    assert srcs[0].stats.missing_gpus > 0 and srcs[1].stats.failures == 110
