"""Produce-to-alert latency of the service at a paced fleet load (default 16,384 GPUs at 1 Hz).

    .venv/bin/python bench/service_latency.py --kafka 127.0.0.1:9092 [--gpus 16384] [--seconds 40]
        [--phases same|spread] [--tick 1] [--silent-from S] [--shard-models] [--encoding json|columnar]
        [--models probe|default]
        [--repeat 1] [--json OUT]
        [--workdir bench/results]

A publisher sends one message per host per second, paced in real time, each sample stamped
with the current wall clock as its event time. Every second a few random GPUs report XID 79,
which the default rules alert on at once in the host stage (`gpu_fallen_off_bus`), and a burst
of 1,000 single-bit ECC errors, which a probe model (a `counter_rate` detector with a 5-sample
warm-up, written beside the logs) alerts on in the fleet stage, behind the `<prefix>.fleet` hop
(docs/operations.md, Topology). The latency of an alert is its Kafka timestamp (set when the
service produced it) minus the wall time its triggering sample was produced: `host` for the
first, `fleet` for the second, end to end through both stages. One `gpuwarden serve` process
(both stages) per repeat, on a fresh topic prefix deleted afterwards; broker, service and
publisher share the machine. Percentiles are per run; reported: their median.

``--phases spread`` gives each host its own phase of the second (one of 20 slots of 50 ms), as
independent exporters sample; by default every host samples at the start of the second, the
best case of the release rule (docs/operations.md, "When an alert can fire").

With ``--models default`` the probe runs beside the default ``rules/models.yaml`` (its DCGM and
NCCL models; the load carries no NCCL records, so the NCCL ones find nothing, but every row still
waits for their judgement as it would in a fleet): the fleet stage's work and release rule as
shipped, not the probe's alone.

With ``--shard-models`` the service runs the models in shards by host, one per fleet partition
(``service.shard_models``): the fleet alerts then also wait for every shard's cohort parts
(docs/operations.md, Model shards).

With ``--silent-from S`` the last host sends nothing from second S on (a dead node). Its own
partition's hosts ("mates") are what its silence can hold back, so from S on one fault a second
goes to a mate, and their latencies are reported apart from the other partitions' ("others"):
a p99 over the whole fleet would let the mates' few alerts hide in the tail, or miss them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import yaml
from kafka import KafkaConsumer
from kafka.partitioner.default import murmur2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from service_harness import Service, delete_topics  # noqa: E402

from pipeline.bus import Topics  # noqa: E402
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics  # noqa: E402
from pipeline.bus.publish import Pacer  # noqa: E402
from pipeline.bus.telemetry import per_host_wire  # noqa: E402
from pipeline.engine.hostclock import SAMPLE_SHIFT  # noqa: E402


def partition_of(host: str, partitions: int) -> int:
    """The telemetry partition of ``host``'s messages: kafka-python's default partitioner on the
    message key (the host name, pipeline/bus/telemetry.py), as the publisher's producer has it."""
    return (murmur2(host.encode()) & 0x7FFFFFFF) % partitions


def publish_paced(bootstrap: str, topic: str, hosts: list[str], seconds: int, warmup: int, cooldown: int,
                  faults_per_s: int, rng: random.Random, silent_from: int | None = None,
                  mates: list[str] | None = None, spread: bool = False, encoding: str = "json"
                  ) -> tuple[dict[tuple[str, int, int], float], float, set[tuple]]:
    """Send one message per host per second in real time; return (host, gpu, second) -> produce time
    of each injected XID 79, and how far behind its schedule the publisher fell at worst (a
    second's messages sent later than the next second's start mean the load was not paced), and
    which of the faults fell on the silent host's partition-mates during its silence.

    No fault in the last ``cooldown`` seconds: a second's samples are evaluated once later event
    time closes its tick, so a fault in the very last second would only be seen at the idle flush.
    ``silent_from``: the last host sends nothing from that second on (a dead node); it gets no
    fault, so what is measured is what its silence does to the other hosts' alerts.
    The silent host's partition-mates (``mates``) get one fault a second from ``silent_from`` on.
    ``spread``: each host samples at its own phase of the second (one of 20 slots of 50 ms, drawn
    once per host), as independent exporters do, instead of all hosts at the second's start.
    ``encoding``: the messages' (pipeline/bus/telemetry.py: ``columnar`` is the producers' default).
    """
    produced: dict[tuple[str, int, int], float] = {}
    held: set[tuple[str, int, int]] = set()
    lost: set[tuple[str, int]] = set()
    p = KafkaBusProducer(bootstrap, linger_ms=2)
    pacer = Pacer(1.0)   # second s of the run is due s seconds after the start
    behind = 0.0
    slots = 20
    phase_rng = random.Random(len(hosts))  # its own stream: the faults drawn stay those of the seed
    slot_of = {h: phase_rng.randrange(slots) if spread else 0 for h in hosts}
    by_slot = [[h for h in hosts if slot_of[h] == k] for k in range(slots)]

    def send_host(h: str, ts: float, silenced: bool, faulty: set[tuple[str, int]]) -> None:
        if silenced and h == hosts[-1]:
            return
        recs = [{"v": 1, "kind": "dcgm", "ts": ts, "host": h, "gpu": g,
                 "fields": {"DCGM_FI_DEV_GPU_UTIL": 99, "DCGM_FI_DEV_GPU_TEMP": 65, "DCGM_FI_DEV_SM_CLOCK": 1980,
                            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 1000 if (h, g) in lost else 0,
                            "DCGM_FI_DEV_XID_ERRORS": 79 if (h, g) in lost else 0}}
                for g in range(8)]
        ((key, value, headers),) = per_host_wire(recs, encoding)
        now = time.time()
        for g in range(8):
            if (h, g) in faulty:
                produced[(h, g, int(ts))] = now
                if silenced and mates and h in mates:
                    held.add((h, g, int(ts)))
        p.send(topic, value, key, headers=headers)

    for s in range(seconds):
        silenced = silent_from is not None and s >= silent_from and len(hosts) > 1
        faulty: set[tuple[str, int]] = set()
        if warmup <= s < seconds - cooldown:  # after the engine's start-up window
            live = hosts[:-1] if silent_from is not None and len(hosts) > 1 else hosts
            if silenced and mates:
                for _ in range(100):
                    c = (rng.choice(mates), rng.randrange(8))
                    if c not in lost:
                        faulty.add(c)
                        lost.add(c)
                        break
            while len(faulty) < faults_per_s and len(lost) < 8 * len(live):
                c = (rng.choice(live), rng.randrange(8))
                if c not in lost:
                    faulty.add(c)
                    lost.add(c)
        for k, slot_hosts in enumerate(by_slot):
            if not slot_hosts:
                continue
            pacer.wait(s + k / slots)
            ts = round(time.time(), 3)
            for h in slot_hosts:
                send_host(h, ts, silenced, faulty)
            p.flush()
        behind = max(behind, -pacer.delay(s + 1))
    p.close()
    return produced, behind, held


PROBE = "probe_sbe_burst"
PROBE_MODELS = f"""models:
  - name: {PROBE}
    detector: counter_rate
    fault: hbm_sbe_rate_anomaly
    severity: info
    cohort: gpu_model
    features: [ecc_sbe_volatile]
    params: {{warmup: 5}}
    decider: {{kind: threshold, threshold: 8, clear: 4}}
    warmup: 5
    keep_firing_for: 30s
"""
STAGE_OF = {"gpu_fallen_off_bus": "host", PROBE: "fleet"}


def models_yaml(which: str) -> str:
    """The service's models: the probe alone, or the probe after the default ``models.yaml``'s."""
    if which == "probe":
        return PROBE_MODELS
    doc = yaml.safe_load((ROOT / "rules" / "models.yaml").read_text())
    doc["models"] += yaml.safe_load(PROBE_MODELS)["models"]
    return yaml.safe_dump(doc, sort_keys=False)


def collect(bootstrap: str, topic: str, produced: dict, drain_s: float, tick: float = 1.0) -> dict[str, dict[tuple, float]]:
    """Latencies (alert's Kafka timestamp - produce time) of the injected faults' alerts, per
    stage, waiting up to ``drain_s`` for the last ones. An alert's time is its sample's as the
    engine took it: a sample moved to the next tick's start (one sample a tick, up to
    ``SAMPLE_SHIFT`` of a tick, docs/architecture.md §4) is found under its second as sent."""
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    lat: dict[str, dict[tuple, float]] = {"host": {}, "fleet": {}}
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline and min(len(v) for v in lat.values()) < len(produced):
        for recs in c.poll(timeout_ms=500).values():
            for r in recs:
                a = json.loads(r.value)
                key = (a["host"], a["gpu"], int(a["ts"]))
                if key not in produced:
                    key = (a["host"], a["gpu"], int(a["ts"] - SAMPLE_SHIFT * tick))
                stage = STAGE_OF.get(a["rule"])
                if a["state"] == "firing" and stage and key in produced:
                    lat[stage].setdefault(key, r.timestamp / 1000.0 - produced[key])
    c.close()
    return lat


def run_once(args: argparse.Namespace, seed: int) -> dict:
    """One service, one paced load on a fresh topic prefix; the latency percentiles of that run."""
    prefix = f"lat-{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    hosts = [f"node-{i:05d}" for i in range(max(1, args.gpus // 8))]
    silent_part = partition_of(hosts[-1], 8)
    mates = [h for h in hosts[:-1] if partition_of(h, 8) == silent_part]
    try:
        ensure_topics(args.kafka, topics, partitions=8)
        args.workdir.mkdir(parents=True, exist_ok=True)
        probe = args.workdir / f"{prefix}-models.yaml"
        probe.write_text(models_yaml(args.models))
        svc = Service({"kafka": {"bootstrap": args.kafka, "prefix": prefix, "group": prefix, "partitions": 8},
                       "engine": {"allowed_lateness": args.allowed_lateness, "tick": args.tick},
                       "http": {"port": 0}, "service": {"rules": [str(ROOT / "rules")], "models": str(probe),
                                                       "shard_models": args.shard_models}},
                      args.workdir, prefix)
        try:
            produced, behind, held = publish_paced(args.kafka, topics.telemetry, hosts, args.seconds, args.warmup,
                                             args.cooldown, args.faults_per_s, random.Random(seed),
                                             args.silent_from, mates, args.phases == "spread", args.encoding)
            by_stage = collect(args.kafka, topics.alerts, produced, args.drain_s, args.tick)
        finally:
            svc.stop()
    finally:
        delete_topics(args.kafka, topics.all())
    out: dict = {"faults": len(produced), "publisher_behind_s": max(0.0, behind)}

    def group(lat: dict[tuple, float], name: str) -> dict[tuple, float]:
        if name == "all":
            return lat
        # mates: faults of the silent host's partition from its silence on; others: the rest.
        return {k: v for k, v in lat.items() if (k in held) == (name == "mates")}

    groups = ["all"] + (["others", "mates"] if args.silent_from is not None else [])
    for stage, by_key in by_stage.items():
        for name in groups:
            lat = sorted(group(by_key, name).values())
            pct = np.percentile(lat, [50, 95, 99], method="inverted_cdf") if lat else [float("nan")] * 3
            pre = ("" if stage == "host" else "fleet_") + ("" if name == "all" else f"{name}_")
            out.update({f"{pre}alerts_seen": len(lat), f"{pre}p50_s": float(pct[0]), f"{pre}p95_s": float(pct[1]),
                        f"{pre}p99_s": float(pct[2]), f"{pre}max_s": lat[-1] if lat else float("nan")})
    if args.silent_from is not None:
        out["mates_faults"] = len(held)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kafka", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=15, help="seconds of load before the first fault")
    ap.add_argument("--cooldown", type=int, default=3, help="seconds of load after the last fault")
    ap.add_argument("--faults-per-s", type=int, default=3)
    ap.add_argument("--drain-s", type=float, default=30.0, help="how long to wait for the last alerts")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--silent-from", type=int, help="one host (never faulty) sends nothing from this second on")
    ap.add_argument("--phases", choices=("same", "spread"), default="same",
                    help="'same': every host samples at the start of the second (one publisher's "
                         "clock); 'spread': each host at its own phase, in 20 slots of 50 ms")
    ap.add_argument("--tick", type=float, default=1.0,
                    help="engine.tick: a tick shorter than the 1 s step lets a sample go before its whole second "
                         "is in (docs/operations.md, When an alert can fire)")
    ap.add_argument("--allowed-lateness", type=float, default=10.0,
                    help="engine.allowed_lateness: by event time, how long a silent host holds its "
                         "partition-mates back, plus its sampling step (default 10)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results", help="service configs and logs")
    ap.add_argument("--shard-models", action="store_true", help="the models in shards by host (service.shard_models)")
    ap.add_argument("--models", choices=("probe", "default"), default="probe",
                    help="the probe model alone, or beside the default models.yaml")
    ap.add_argument("--encoding", choices=("json", "columnar"), default="json",
                    help="the telemetry messages' encoding (columnar: what the producers send by default)")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    if args.seconds <= args.warmup + args.cooldown:
        ap.error("--seconds must exceed --warmup + --cooldown, or no fault is injected")
    runs = [run_once(args, seed) for seed in range(1, args.repeat + 1)]

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)

    res = {"bench": "service_latency", "gpus": args.gpus, "seconds": args.seconds, "repeat": args.repeat,
           "silent_from": args.silent_from, "allowed_lateness": args.allowed_lateness, "phases": args.phases,
           "tick": args.tick, "shard_models": args.shard_models, "encoding": args.encoding, "models": args.models,
           "faults": sum(r["faults"] for r in runs), "alerts_seen": sum(r["alerts_seen"] for r in runs),
           "p50_s": med("p50_s"), "p95_s": med("p95_s"), "p99_s": med("p99_s"), "max_s": med("max_s"),
           "fleet_alerts_seen": sum(r["fleet_alerts_seen"] for r in runs), "fleet_p50_s": med("fleet_p50_s"),
           "fleet_p95_s": med("fleet_p95_s"), "fleet_p99_s": med("fleet_p99_s"), "fleet_max_s": med("fleet_max_s"),
           "publisher_behind_s": round(max(r["publisher_behind_s"] for r in runs), 3),
           **({"mates_faults": sum(r["mates_faults"] for r in runs),
               **{f"{g}_{k}": (sum(r[f"{g}_{k}"] for r in runs) if k == "alerts_seen" else med(f"{g}_{k}"))
                  for g in ("others", "mates") for k in ("alerts_seen", "p50_s", "p95_s", "p99_s", "max_s")}}
              if args.silent_from is not None else {}),
           "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs],
           "machine": f"{os.cpu_count()} cores, shared by broker, publisher and service"}
    silent = f", one host silent from {args.silent_from}s (allowed_lateness {args.allowed_lateness:g}s)" \
        if args.silent_from is not None else ""
    silent += ", hosts at spread phases" if args.phases == "spread" else ""
    silent += f", engine.tick {args.tick:g}s" if args.tick != 1.0 else ""
    silent += ", the models in shards" if args.shard_models else ""
    silent += ", the probe beside the default models" if args.models == "default" else ""
    silent += ", columnar messages" if args.encoding == "columnar" else ""
    print(f"{args.gpus:,} GPUs at 1 Hz for {args.seconds}s{silent}, median of {args.repeat}: {res['alerts_seen']}/"
          f"{res['faults']} alerts seen, produce-to-alert latency p50 {res['p50_s']}s, p95 {res['p95_s']}s, "
          f"p99 {res['p99_s']}s, max {res['max_s']}s; through the fleet stage: {res['fleet_alerts_seen']}/"
          f"{res['faults']} seen, p50 {res['fleet_p50_s']}s, p95 {res['fleet_p95_s']}s, p99 {res['fleet_p99_s']}s, "
          f"max {res['fleet_max_s']}s; publisher at worst {res['publisher_behind_s']}s behind")
    if args.silent_from is not None:
        print(f"  host stage, other partitions: {res['others_alerts_seen']} seen, p50 {res['others_p50_s']}s, "
              f"p99 {res['others_p99_s']}s; the silent host's partition-mates: {res['mates_alerts_seen']}/"
              f"{res['mates_faults']} seen, p50 {res['mates_p50_s']}s, p99 {res['mates_p99_s']}s, "
              f"max {res['mates_max_s']}s")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
