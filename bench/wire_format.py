"""Per-GPU vs per-host messages, JSON vs columnar: what each costs the consumer, measured.

    .venv/bin/python bench/wire_format.py [--kafka 127.0.0.1:9092] [--hosts 64] [--seconds 60] [--repeat 3]
        [--json OUT]

Prints, per GPU-sample, the decode cost (our decoder, batches of 256 messages as the service
polls them: typed msgspec for JSON, arrays for the columnar encoding, pipeline/colwire.py) and,
with --kafka, the raw kafka-python consume cost (the ceiling of any consumer) for each layout.
Pinned to one core when the platform allows, median of --repeat runs. The columnar decode
yields the engine's value matrix; JSON's records are still to be turned into one
(bench/engine_throughput.py --encoding measures both end to end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import uuid

from pipeline.bus.telemetry import COLUMNAR, per_host_messages, per_host_wire, per_record_messages
from pipeline.decode import Decoder
from producers.sim import Simulator


def _steps(hosts: int, seconds: int) -> list[list[dict]]:
    sim = Simulator(hosts=hosts, duration=seconds, seed=5, scenario="healthy", nccl_interval=1e9)
    return [[r for r in b if r["kind"] == "dcgm"] for b in sim.batches()]


def _decode_us(msgs: list[tuple[bytes, bytes]], n_samples: int, repeat: int, columnar: bool) -> float:
    dec = Decoder()
    values = [v for _, v in msgs]
    origins = [f"t[0]@{i}" for i in range(len(values))]
    flags = [True] * 256 if columnar else None
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for i in range(0, len(values), 256):
            chunk = values[i:i + 256]
            dec.decode_many(chunk, origins[i:i + 256], flags[:len(chunk)] if flags else None)
        runs.append((time.perf_counter() - t) / n_samples * 1e6)
    return statistics.median(runs)


def _kafka_us(bootstrap: str, msgs: list[tuple[bytes, bytes]], n_samples: int, repeat: int) -> float:
    from kafka import KafkaConsumer

    from service_harness import delete_topics

    from pipeline.bus import send_all
    from pipeline.bus.kafka import KafkaBusProducer

    topic = f"bench-wire-{uuid.uuid4().hex[:8]}"
    p = KafkaBusProducer(bootstrap)
    send_all(p, topic, msgs)
    p.close()
    runs = []
    for _ in range(repeat):
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                          enable_auto_commit=False, fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
        c.topics()  # metadata and connection set-up outside the timing
        got = 0
        t = time.perf_counter()
        deadline = time.monotonic() + 120
        while got < len(msgs) and time.monotonic() < deadline:
            batch = c.poll(timeout_ms=1000, max_records=10000)
            got += sum(len(v) for v in batch.values())
        runs.append((time.perf_counter() - t) / n_samples * 1e6)
        c.close()
    delete_topics(bootstrap, [topic])
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kafka", help="bootstrap servers; without it, the Kafka column is skipped")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    steps = _steps(args.hosts, args.seconds)
    recs = [r for step in steps for r in step]
    layouts = {"per-GPU message": [m for step in steps for m in per_record_messages(step)],
               "per-host message": [m for step in steps for m in per_host_messages(step)],
               "per-host columnar": [(k, v) for step in steps for k, v, _ in per_host_wire(step, COLUMNAR)]}
    print(f"{len(recs):,} GPU-samples ({args.hosts} hosts x 8 GPUs x {args.seconds}s), median of {args.repeat}")
    print(f"{'layout':<18} {'messages':>9} {'bytes/sample':>13} {'decode us/sample':>17} {'kafka consume us/sample':>24}")
    rows = []
    for name, msgs in layouts.items():
        size = sum(len(v) for _, v in msgs) / len(recs)
        dec = _decode_us(msgs, len(recs), args.repeat, columnar=name.endswith("columnar"))
        kafka_us = _kafka_us(args.kafka, msgs, len(recs), args.repeat) if args.kafka else None
        kc = f"{kafka_us:.2f}" if kafka_us is not None else "-"
        print(f"{name:<18} {len(msgs):>9,} {size:>13.0f} {dec:>17.2f} {kc:>24}")
        rows.append({"layout": name, "messages": len(msgs), "bytes_per_sample": round(size, 1),
                     "decode_us_per_sample": round(dec, 3),
                     "kafka_consume_us_per_sample": round(kafka_us, 3) if kafka_us is not None else None})
    if args.json:
        res = {"bench": "wire_format", "gpus": args.hosts * 8, "seconds": args.seconds, "gpu_samples": len(recs),
               "repeat": args.repeat, "layouts": rows,
               "machine": f"{platform.machine()} {os.cpu_count()} cores, 1 used",
               "python": platform.python_version()}
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
