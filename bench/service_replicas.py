"""Identical `serve` replicas in one group: each one's share of the model work, and its CPU.

    .venv/bin/python bench/service_replicas.py --kafka 127.0.0.1:9092 [--hosts 64] [--seconds 120]
        [--replicas 1,2,4] [--shard-models on|off] [--json OUT] [--workdir bench/results]

Scale-out is meant to come from Kafka's partitions and consumer groups: more identical
replicas of `serve` (both stages, the default models, in shards by host: ``service.shard_models``,
``--shard-models off`` for every model on the one fleet key) should each take a part of the work.
For each replica count, on a fresh topic prefix (8 telemetry and 8 fleet partitions):

1. starts that many identical `gpuwarden serve` processes in one consumer group and waits until
   both of its groups (telemetry and fleet) are Stable with every replica holding partitions
   (a replica that joins after the records came would find them taken);
2. publishes a `llama3` recording of ``--hosts`` hosts (per-host messages) and waits until
   their host stages took every record and the records their fleet stages released
   (``gpuwarden_fleet_records_total`` on each /metrics: the records its models scored) stop
   moving;
3. reports for each replica its host-stage records (``gpuwarden_records_total``), its
   fleet-stage records and their share of all, and its CPU seconds (``/proc/<pid>/stat``);
4. deletes the prefix's topics.

From the one-replica run it projects a 100,000-GPU fleet: the single process's rate with the
models (GPU-samples per CPU second it spent from the publish on, so one process per core; the
wall time, from the publish on, is reported beside it), the
processes a fleet needs at 1 Hz and at one sample per 10 s if the model work spread evenly, and
what the busiest replica of the largest run would have to score at those rates, as a multiple of
one process's rate. The goal (docs/performance.md): no replica's models score more than 35 % of
the records with 4 replicas. A rebalance while the replicas start moves partitions, and records
read again after it count again, so shares are of the sum over replicas.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from service_harness import Service, delete_topics  # noqa: E402
from service_throughput import metrics_text  # noqa: E402

from pipeline.bus import Topics  # noqa: E402
from pipeline.bus.kafka import ensure_topics, group_settled  # noqa: E402
from pipeline.recording import publish  # noqa: E402

FLEET_GPUS = 100_000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (utime and stime, fields 14-15 of its stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def counter(text: str, name: str) -> float:
    """One unlabelled sample of /metrics text; 0 when absent."""
    m = re.search(rf"^{name} (\S+)", text, re.M)
    return float(m.group(1)) if m else 0.0


def recording(hosts: int, seconds: int, workdir: Path) -> Path:
    """A cached `gpuwarden sim --scenario llama3` recording, one record per line."""
    rec = workdir / f"replicas-llama3-{hosts}h-{seconds}s.jsonl"
    workdir.mkdir(parents=True, exist_ok=True)
    if not rec.exists():
        tmp = rec.with_suffix(".tmp")
        subprocess.run([sys.executable, "-m", "pipeline", "sim", "--hosts", str(hosts), "--duration", str(seconds),
                        "--seed", "7", "--scenario", "llama3", "--out", str(tmp)], check=True, cwd=ROOT)
        tmp.rename(rec)
    return rec


def run(bootstrap: str, rec: Path, n_records: int, replicas: int, workdir: Path,
        timeout_s: float = 1800.0, shard_models: bool = True, n_fleet: int = 0) -> dict:
    """One run of ``replicas`` identical services on a fresh prefix: per-replica counts and CPU."""
    prefix = f"bench-rep-{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    group = f"{prefix}-g"
    config = {"kafka": {"bootstrap": bootstrap, "prefix": prefix, "group": group}, "http": {"port": 0},
              "service": {"rules": [str(ROOT / "rules")], "flush_idle_s": 2, "models": "auto",
                          "shard_models": shard_models},
              "engine": {"idle_timeout": 0.5}}
    svcs: list[Service] = []
    try:
        ensure_topics(bootstrap, topics, partitions=8, fleet_partitions=8)
        svcs = [Service(config, workdir, f"{group}-{i}") for i in range(replicas)]
        deadline = time.monotonic() + timeout_s
        for g in (group, f"{group}.fleet"):
            while not group_settled(bootstrap, g, replicas, hold_s=3.0):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"group {g} did not settle with {replicas} members in {timeout_s:.0f}s")
                time.sleep(1.0)
        cpu0 = [cpu_seconds(s.proc.pid) for s in svcs]
        t0, last, last_change = time.perf_counter(), -1.0, time.perf_counter()
        publish([str(rec)], bootstrap, topics.telemetry)
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replicas} replicas did not score {n_records} records in {timeout_s:.0f}s")
            for s in svcs:
                if s.proc.poll() is not None:
                    raise RuntimeError(f"a replica exited with {s.proc.returncode}; see {s.log_path}")
            texts = [metrics_text(s) for s in svcs]
            host = sum(counter(t, "gpuwarden_records_total") for t in texts)
            fleet = sum(counter(t, "gpuwarden_fleet_records_total") for t in texts)
            now = time.perf_counter()
            # Done once the host stages took every record and the fleet stages released every
            # record the models read (``n_fleet``: all but the NIC port records; more when a
            # rebalance made a partition read some again) and stopped moving: a rebalance
            # pauses them for seconds, which is no end.
            if fleet != last:
                last, last_change = fleet, now
            elif host >= 0.999 * n_records and fleet >= n_fleet and fleet > 0 and now - last_change > 3.0:
                break
            time.sleep(0.1)
        wall = last_change - t0
        rows = []
        for s, t, c0 in zip(svcs, texts, cpu0):
            rows.append({"host_records": int(counter(t, "gpuwarden_records_total")),
                         "fleet_records": int(counter(t, "gpuwarden_fleet_records_total")),
                         "cpu_s": round(cpu_seconds(s.proc.pid) - c0, 2)})
        total = sum(r["fleet_records"] for r in rows) or 1
        for r in rows:
            r["fleet_share"] = round(r["fleet_records"] / total, 3)
        return {"replicas": replicas, "wall_s": round(wall, 2), "per_replica": rows,
                "max_fleet_share": max(r["fleet_share"] for r in rows)}
    finally:
        for s in svcs:
            s.stop()
        delete_topics(bootstrap, topics.all())


def projection(one: dict, largest: dict, gpu_samples: int) -> dict:
    """The 100,000-GPU projection from the one-replica rate and the largest run's busiest share."""
    rate = gpu_samples / one["per_replica"][0]["cpu_s"]
    out = {"process_gpu_samples_per_s": round(rate), "wall_gpu_samples_per_s": round(gpu_samples / one["wall_s"]),
           "fleet_gpus": FLEET_GPUS}
    for label, interval in (("1hz", 1.0), ("10s", 10.0)):
        need = FLEET_GPUS / interval
        out[f"processes_even_{label}"] = math.ceil(need / rate)
        out[f"busiest_load_{label}"] = round(largest["max_fleet_share"] * need / rate, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kafka", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--replicas", default="1,2,4", help="comma-separated replica counts; the first should be 1")
    ap.add_argument("--shard-models", choices=("on", "off"), default="on",
                    help="the models in shards by host, one per fleet partition (service.shard_models)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results",
                    help="where the recording, service configs and logs go")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    rec = recording(args.hosts, args.seconds, args.workdir)
    n_all = n_dcgm = n_nic = 0
    with rec.open() as fh:
        for line in fh:
            n_all += 1
            n_dcgm += '"kind":"dcgm"' in line
            n_nic += '"kind":"nic"' in line
    counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    sharded = args.shard_models == "on"
    runs = [run(args.kafka, rec, n_all, r, args.workdir, shard_models=sharded, n_fleet=n_all - n_nic) for r in counts]
    res = {"bench": "service_replicas", "hosts": args.hosts, "seconds": args.seconds, "records": n_all,
           "shard_models": sharded,
           "gpu_samples": n_dcgm, "runs": runs,
           "machine": f"{os.cpu_count()} cores; broker and replicas on the same machine"}
    if counts and counts[0] == 1:
        res["projection"] = projection(runs[0], runs[-1], n_dcgm)
    for r in runs:
        shares = ", ".join(f"{100 * x['fleet_share']:.0f}% ({x['cpu_s']:.0f} s CPU)" for x in r["per_replica"])
        print(f"{r['replicas']} replica(s), {n_all:,} records in {r['wall_s']} s: model work and CPU per replica "
              f"{shares}; busiest {100 * r['max_fleet_share']:.0f}% (goal with 4: <= 35%)")
    if "projection" in res:
        p = res["projection"]
        print(f"one process with the models: {p['process_gpu_samples_per_s']:,} GPU-samples per CPU second "
              f"({p['wall_gpu_samples_per_s']:,}/s of wall time); 100,000 GPUs need "
              f"{p['processes_even_1hz']} processes at 1 Hz and {p['processes_even_10s']} at 10 s if the model "
              f"work spread evenly; the busiest replica of the largest run would carry {p['busiest_load_1hz']}x "
              f"one process's rate at 1 Hz and {p['busiest_load_10s']}x at 10 s")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
