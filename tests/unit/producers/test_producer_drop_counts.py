"""Nothing dropped silently (issue 21 item 4): every producer counts what it leaves out, by reason,
logs it periodically and at exit, and serves it on ``/metrics`` (``--metrics-port``)."""

from __future__ import annotations

import logging
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from producers.common import BoundedSender, ProducerMetrics, RunResult, run, serve_metrics
from producers.dcgm_exporter import ExporterSource
from tests.factories import ListSink

SCRAPE = ('# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
          'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="n1"} 60\n'
          'DCGM_FI_DEV_GPU_TEMP{gpu="",Hostname="n1"} 60\n'
          '# TYPE DCGM_EXP_GPU_HEALTH_STATUS gauge\n'
          'DCGM_EXP_GPU_HEALTH_STATUS{gpu="0",Hostname="n1"} 0\n')


def _source(tmp_path, n=1) -> ExporterSource:
    files = []
    for i in range(n):
        f = tmp_path / f"s{i}.prom"
        f.write_text(SCRAPE)
        files.append(str(f))
    return ExporterSource(files=files)


def test_the_periodic_and_final_log_lines_give_drops_by_reason(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="producers.common")
    src = _source(tmp_path, n=3)
    run(src, BoundedSender(ListSink()), interval_s=0.0, log_every_s=0.0, drain_s=0.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "producers.common"]
    running = [l for l in lines if l.startswith("producer running")]
    assert len(running) >= 2   # periodic, not only at exit
    assert "dropped.unknown_metric 2" in running[1] and "dropped.no_gpu_label 2" in running[1]
    assert any(l.startswith("producer stopped") and "dropped.unknown_metric 3" in l for l in lines)
    assert any(r.levelno == logging.WARNING for r in caplog.records if r.getMessage().startswith("producer "))


def test_metrics_endpoint_serves_records_drops_failures_and_queue_depth(tmp_path):
    src = _source(tmp_path)
    sender = BoundedSender(ListSink())
    res = RunResult()
    ep = serve_metrics(ProducerMetrics("dcgm-exporter", src, sender, res), 0, "127.0.0.1")
    try:
        run(src, sender, interval_s=0.0, drain_s=0.1, result=res)
        sender.submit(["x"] * 3)   # queued, not yet sent
        body = urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/metrics", timeout=5).read().decode()
    finally:
        ep.stop()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(body) for s in fam.samples}
    p = (("producer", "dcgm-exporter"),)
    assert got[("gpuwarden_producer_records_total", p)] == 1
    assert got[("gpuwarden_producer_dropped_total", (("producer", "dcgm-exporter"), ("reason", "unknown_metric")))] == 1
    assert got[("gpuwarden_producer_dropped_total", (("producer", "dcgm-exporter"), ("reason", "no_gpu_label")))] == 1
    assert got[("gpuwarden_producer_dropped_total",
                (("producer", "dcgm-exporter"), ("reason", "send_buffer_full")))] == 0
    assert got[("gpuwarden_producer_send_failures_total", p)] == 0
    assert got[("gpuwarden_producer_queue_depth", p)] == 3


def test_cli_has_metrics_port_and_prints_drops_in_the_exit_summary(tmp_path, capsys):
    from pipeline.cli import main

    f = tmp_path / "s.prom"
    f.write_text(SCRAPE)
    rc = main(["produce", "dcgm-exporter", "--file", str(f), "--out", str(tmp_path / "o.jsonl"),
               "--metrics-port", "0", "--metrics-host", "127.0.0.1"])
    err = capsys.readouterr().err
    assert rc == 0 and "dropped.unknown_metric 1" in err and "dropped.no_gpu_label 1" in err


def test_nvml_counts_an_unreadable_gpu_as_dropped():
    from tests.unit.producers.nvml_factories import FakeNvml
    from producers.nvml import NvmlSource

    fake = FakeNvml(gpus=2, links=())
    src = NvmlSource(nvml=fake, host="n1")
    fake.gone.add(1)
    src.poll()
    c = src.summary()
    assert c["dropped.gpu_unreadable"] == 1 and c["records"] == 1 and c["polls"] == 1
