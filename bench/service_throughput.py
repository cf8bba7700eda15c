"""The service through the local broker: max-speed throughput next to the raw consume ceiling.

    .venv/bin/python bench/service_throughput.py --kafka 127.0.0.1:9092 [--gpus 2048] [--seconds 60]

1. publishes a simulated recording (per-host messages) to a fresh ``<prefix>.telemetry``;
2. measures the raw kafka-python consume rate of that topic (the ceiling of any consumer);
3. runs one `gpuwarden serve` process from the beginning of the topic and measures the time
   until its /metrics say every record was processed (GPU-samples/s, decode + rules + delivery
   + checkpoint + commit included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from kafka import KafkaConsumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.bus import Topics  # noqa: E402
from pipeline.bus.kafka import ensure_topics  # noqa: E402
from pipeline.recording import publish  # noqa: E402


def raw_consume(bootstrap: str, topic: str, n_msgs: int) -> float:
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                      enable_auto_commit=False, fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
    c.topics()
    got, t = 0, time.perf_counter()
    while got < n_msgs:
        got += sum(len(v) for v in c.poll(timeout_ms=1000, max_records=10000).values())
    dt = time.perf_counter() - t
    c.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    rec = ROOT / "bench" / "results" / f"svc-{args.gpus}gpu-{args.seconds}s.jsonl"
    rec.parent.mkdir(exist_ok=True)
    if not rec.exists():
        subprocess.run([sys.executable, "-m", "pipeline", "sim", "--hosts", str(args.gpus // 8), "--duration",
                        str(args.seconds), "--seed", "3", "--scenario", "mixed", "--out", str(rec)], check=True,
                       cwd=ROOT)
    n_dcgm = sum(1 for line in rec.open() if '"kind":"dcgm"' in line)
    n_all = sum(1 for _ in rec.open())
    ensure_topics(args.kafka, topics, partitions=8)
    n_msgs = publish([str(rec)], args.kafka, topics.telemetry)
    raw_s = raw_consume(args.kafka, topics.telemetry, n_msgs)
    cfg = rec.parent / f"{prefix}.json"
    cfg.write_text(json.dumps({"kafka": {"bootstrap": args.kafka, "prefix": prefix, "group": prefix},
                               "http": {"port": 0}, "service": {"rules": [str(ROOT / "rules")], "flush_idle_s": 2}}))
    log = rec.parent / f"{prefix}.log"
    env = {**os.environ}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--config", str(cfg)], cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    try:
        port = None
        while port is None:
            time.sleep(0.2)
            m = re.search(r'"http_port": (\d+)', log.read_text())
            port = int(m.group(1)) if m else None
        t0 = None
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            m = re.search(r"^gpuwarden_records_total (\S+)", text, re.M)
            done = float(m.group(1)) if m else 0.0
            if done > 0 and t0 is None:
                t0 = time.perf_counter()
            if done >= n_all:
                break
            time.sleep(0.05)
        svc_s = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(60)
    res = {"bench": "service_throughput", "gpus": args.gpus, "seconds": args.seconds, "messages": n_msgs,
           "gpu_samples": n_dcgm, "records": n_all, "raw_consume_gpu_samples_per_s": round(n_dcgm / raw_s),
           "service_gpu_samples_per_s": round(n_dcgm / svc_s), "ratio": round(raw_s / svc_s, 3),
           "machine": f"{os.cpu_count()} cores; broker and service on the same machine"}
    print(f"{n_dcgm:,} GPU-samples in {n_msgs:,} per-host messages: raw kafka-python consume "
          f"{res['raw_consume_gpu_samples_per_s']:,}/s, service {res['service_gpu_samples_per_s']:,}/s "
          f"({100 * res['ratio']:.0f}% of raw)")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
