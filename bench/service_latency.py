"""Produce-to-alert latency of the service at a paced fleet load (default 16,384 GPUs at 1 Hz).

    .venv/bin/python bench/service_latency.py --kafka 127.0.0.1:9092 [--gpus 16384] [--seconds 40]

A publisher sends one message per host per second, paced in real time, each sample stamped
with the current wall clock as its event time. Every second a few random GPUs report XID 79,
which the default rules alert on at once (`gpu_fallen_off_bus`). The latency of an alert is its
Kafka timestamp (set when the service produced it) minus the wall time its triggering sample was
produced. One `gpuwarden serve` process; broker, service and publisher share the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from kafka import KafkaConsumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.bus import Topics  # noqa: E402
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--faults-per-s", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    prefix = f"lat-{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    ensure_topics(args.kafka, topics, partitions=8)
    hosts = [f"node-{i:05d}" for i in range(args.gpus // 8)]
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    cfg = results / f"{prefix}.json"
    cfg.write_text(json.dumps({"kafka": {"bootstrap": args.kafka, "prefix": prefix, "group": prefix},
                               "engine": {"allowed_lateness": 10},
                               "http": {"port": 0}, "service": {"rules": [str(ROOT / "rules")]}}))
    log = results / f"{prefix}.log"
    svc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--config", str(cfg)], cwd=ROOT,
                           stdout=open(log, "w"), stderr=subprocess.STDOUT)
    while not re.search(r'"http_port"', log.read_text()):
        time.sleep(0.2)
    produced: dict[tuple[str, int, int], float] = {}     # (host, gpu, second) -> produce wall time
    rng = random.Random(1)
    lost: set[tuple[str, int]] = set()

    def publisher() -> None:
        p = KafkaBusProducer(args.kafka, linger_ms=2)
        start = time.time()
        for s in range(args.seconds):
            target = start + s
            delay = target - time.time()
            if delay > 0:
                time.sleep(delay)
            ts = round(time.time(), 3)
            faulty = set()
            if s >= 15:  # after the engine's start-up window
                while len(faulty) < args.faults_per_s:
                    c = (rng.choice(hosts), rng.randrange(8))
                    if c not in lost:
                        faulty.add(c)
                        lost.add(c)
            for h in hosts:
                recs = []
                for g in range(8):
                    xid = 79 if (h, g) in faulty or (h, g) in lost else 0
                    recs.append('{"v":1,"kind":"dcgm","ts":%s,"host":"%s","gpu":%d,"fields":{"DCGM_FI_DEV_GPU_UTIL":99,'
                                '"DCGM_FI_DEV_GPU_TEMP":65,"DCGM_FI_DEV_SM_CLOCK":1980,"DCGM_FI_DEV_XID_ERRORS":%d}}'
                                % (ts, h, g, xid))
                now = time.time()
                for g in range(8):
                    if (h, g) in faulty:
                        produced[(h, g, int(ts))] = now
                p.send(topics.telemetry, ("[" + ",".join(recs) + "]").encode(), h.encode())
            p.flush()
        p.close()

    t = threading.Thread(target=publisher)
    t.start()
    t.join()
    time.sleep(8)
    c = KafkaConsumer(topics.alerts, bootstrap_servers=args.kafka, group_id=None, auto_offset_reset="earliest")
    lat = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=1000).values():
            for r in recs:
                a = json.loads(r.value)
                key = (a["host"], a["gpu"], int(a["ts"]))
                if a["state"] == "firing" and a["rule"] == "gpu_fallen_off_bus" and key in produced:
                    lat.append(r.timestamp / 1000.0 - produced[key])
    c.close()
    svc.terminate()
    svc.wait(60)
    lat.sort()
    expected = len(produced)
    q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]) if lat else (lambda p: float("nan"))
    res = {"bench": "service_latency", "gpus": args.gpus, "seconds": args.seconds, "faults": expected,
           "alerts_seen": len(lat), "p50_s": round(q(0.50), 3), "p99_s": round(q(0.99), 3),
           "max_s": round(lat[-1], 3) if lat else None, "machine": f"{os.cpu_count()} cores, shared"}
    print(f"{args.gpus:,} GPUs at 1 Hz for {args.seconds}s: {len(lat)}/{expected} alerts seen, produce-to-alert "
          f"latency p50 {res['p50_s']}s, p99 {res['p99_s']}s, max {res['max_s']}s")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
