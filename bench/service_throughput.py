"""The service through the local broker: max-speed throughput next to the raw consume ceiling.

    .venv/bin/python bench/service_throughput.py --kafka 127.0.0.1:9092 [--gpus 2048] [--seconds 60]
        [--repeat 1] [--models auto,none] [--json OUT] [--workdir bench/results] [--encoding json|columnar]

Each repeat, on a fresh topic prefix:

1. publishes a simulated recording (per-host messages) to ``<prefix>.telemetry``: its JSON
   lines as ``replay --to-kafka`` sends them, or with ``--encoding columnar`` each DCGM-only
   message in the columnar encoding a producer sends by default (docs/architecture.md §7);
2. measures the raw kafka-python consume rate of that topic (the ceiling of any consumer);
3. for each of ``--models`` (``auto``: what ``serve`` runs by default, rules and models;
   ``none``: the rules alone, and the incident stage in the fleet stage; ``none-noinc``: the rules
   alone, ``service.incidents`` off; ``split``: the models, with the two stages in two processes,
   ``serve --stage host`` and ``serve --stage fleet``), runs one `gpuwarden serve` process, in a consumer group of its
   own, from the beginning of the topic and measures the time from its partition assignment
   until its /metrics say every record was processed (GPU-samples/s; decode, rules, models,
   delivery, checkpoints and commits included), and reads from its /metrics where that time
   went (``gpuwarden_loop_seconds``: poll, process = decode and engine, deliver, checkpoint,
   commit) and what one partition's checkpoint took (snapshot, sign, write; mean). The
   engine's live start-up hold (``engine.idle_timeout``, 10 s by default: wait for every
   partition before judging a host gone) is set to 0.5 s here: it is a one-off wait of wall
   time, not work, and would otherwise dominate a one-minute recording;
4. deletes the prefix's topics.

Reports the median of the repeats. Broker, publisher and service share the machine; the goals
(docs/performance.md): the service with the models at >= 60 % of the raw consume rate measured
in the same run, the rules alone at >= 85 %. ``BENCH_MODELS`` sets the default of ``--models``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from kafka import KafkaConsumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from service_harness import Service, delete_topics  # noqa: E402

from pipeline.bus import Topics  # noqa: E402
from pipeline.bus.kafka import ensure_topics  # noqa: E402
from pipeline.recording import publish  # noqa: E402


def publish_columnar(rec: Path, bootstrap: str, topic: str) -> int:
    """The recording's per-host messages as the producers send them by default: columnar where
    the records allow it (with its header), else the JSON lines; how many were sent."""
    from pipeline.bus.files import read_lines
    from pipeline.bus.kafka import KafkaBusProducer
    from pipeline.bus.telemetry import COLUMNAR_HEADERS, recorded_messages
    from pipeline.colwire import encode_dcgm

    p = KafkaBusProducer(bootstrap)
    n = 0
    for m in recorded_messages(read_lines(rec)):
        cols = encode_dcgm(json.loads(m.value)) if m.key is not None else None
        if cols is not None:
            p.send(topic, cols, m.key, headers=COLUMNAR_HEADERS)
        else:
            p.send(topic, m.value, m.key)
        n += 1
        if n % 20_000 == 0:
            p.flush()
    p.flush()
    p.close()
    return n


def raw_consume(bootstrap: str, topic: str, n_msgs: int, timeout_s: float = 600.0) -> float:
    """Seconds for a bare kafka-python consumer to read ``n_msgs`` messages of ``topic``."""
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                      enable_auto_commit=False, fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
    c.topics()  # metadata and connection set-up outside the timing
    got, t = 0, time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while got < n_msgs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"raw consume: {got}/{n_msgs} messages after {timeout_s:.0f}s")
        got += sum(len(v) for v in c.poll(timeout_ms=1000, max_records=10000).values())
    dt = time.perf_counter() - t
    c.close()
    return dt


def metrics_text(svc: Service) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/metrics", timeout=10).read().decode()


def loop_profile(text: str) -> dict:
    """Seconds per loop phase and the mean seconds of one partition's checkpoint, from /metrics."""
    phases = {m.group(1): round(float(m.group(2)), 3)
              for m in re.finditer(r'^gpuwarden_loop_seconds_total\{phase="(\w+)"\} (\S+)', text, re.M)}
    total = re.search(r"^gpuwarden_state_checkpoint_seconds_sum (\S+)", text, re.M)
    count = re.search(r"^gpuwarden_state_checkpoint_seconds_count (\S+)", text, re.M)
    n = float(count.group(1)) if count else 0.0
    return {"phases_s": phases, "checkpoints": int(n),
            "checkpoint_s_per_partition": round(float(total.group(1)) / n, 4) if n and total else None}


SCRAPE_MIN_S = 0.02  # the timing's resolution near the end
SCRAPE_MAX_S = 0.5


def scrape_pause(done: float, total: float, elapsed: float) -> float:
    """Seconds to wait before the next /metrics scrape: half the time the rate so far says is
    left, between ``SCRAPE_MIN_S`` and ``SCRAPE_MAX_S``: each scrape costs the measured process
    ~2 ms of its GIL, so only the end, which sets the timing, is scraped often.

    >>> scrape_pause(0, 100, 1.0), scrape_pause(50, 100, 1.0), scrape_pause(99, 100, 1.0)
    (0.02, 0.5, 0.02)
    """
    if done <= 0 or elapsed <= 0:
        return SCRAPE_MIN_S  # nothing to go by yet: the assignment's moment is timed too
    left = (total - done) * elapsed / done
    return min(SCRAPE_MAX_S, max(SCRAPE_MIN_S, left / 2))


def service_seconds(svc: Service, n_records: int, timeout_s: float = 1800.0, fleet: bool = False,
                    fleet_svc: Service | None = None) -> float:
    """Seconds from the service's partition assignment until it has processed ``n_records``.

    Timed from the assignment, not from the first processed record: a small recording can be
    done before the first /metrics poll sees anything. ``fleet_svc``: the fleet stage runs in
    that process (``--stage fleet``) rather than in ``svc``'s. Scraped every ``SCRAPE_MIN_S``
    only near the end (``scrape_pause``): each scrape costs the measured process ~2 ms.
    """
    t0 = None
    t_start = time.perf_counter()
    fleet_seen = [-1.0, 0.0]   # the fleet stage's count, and when it last moved
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if svc.proc.poll() is not None:
            raise RuntimeError(f"service exited with {svc.proc.returncode}; see {svc.log_path}")
        text = metrics_text(svc)
        now = time.perf_counter()
        m = re.search(r"^gpuwarden_assigned_partitions (\S+)", text, re.M)
        if t0 is None and m and float(m.group(1)) > 0:
            t0 = now
        m = re.search(r"^gpuwarden_records_total (\S+)", text, re.M)
        f = re.search(r"^gpuwarden_fleet_records_total (\S+)", metrics_text(fleet_svc) if fleet_svc else text, re.M)
        # With models, done once the fleet stage has run them on every record too (it sees them
        # after the host stage, the last ones once the host stage's partitions are idle; a
        # record the host stage refused never reaches it, hence "all but 0.1 %, and no more").
        if t0 is not None and m and float(m.group(1)) >= n_records:
            if not fleet:
                return now - t0
            got = float(f.group(1)) if f else 0.0
            if got != fleet_seen[0]:
                fleet_seen[:] = [got, now]
            elif got >= 0.999 * n_records and now - fleet_seen[1] > 1.0:
                return fleet_seen[1] - t0
            time.sleep(scrape_pause(got, n_records, now - t0))
            continue
        done = float(m.group(1)) if m and t0 is not None else 0.0
        time.sleep(scrape_pause(done, n_records, now - (t0 if t0 is not None else t_start)))
    raise RuntimeError(f"service did not process {n_records} records in {timeout_s:.0f}s; see {svc.log_path}")


def recording(gpus: int, seconds: int, workdir: Path) -> Path:
    """A cached `gpuwarden sim` recording of the fleet, one record per line."""
    rec = workdir / f"svc-{gpus}gpu-{seconds}s.jsonl"
    workdir.mkdir(parents=True, exist_ok=True)
    if not rec.exists():
        tmp = rec.with_suffix(".tmp")
        subprocess.run([sys.executable, "-m", "pipeline", "sim", "--hosts", str(max(1, gpus // 8)), "--duration",
                        str(seconds), "--seed", "3", "--scenario", "mixed", "--out", str(tmp)], check=True, cwd=ROOT)
        tmp.rename(rec)
    return rec


def run_once(bootstrap: str, rec: Path, n_records: int, workdir: Path,
             models: list[str], encoding: str = "json") -> tuple[int, float, float, dict[str, tuple[float, dict]]]:
    """(messages, publish s, raw consume s, {models: (service s, loop profile)}) on a fresh prefix.

    Each repeat publishes again: on the same prefix the service would resume from its checkpoint.
    """
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    try:
        ensure_topics(bootstrap, topics, partitions=8)
        t = time.perf_counter()
        if encoding == "columnar":
            n_msgs = publish_columnar(rec, bootstrap, topics.telemetry)
        else:
            n_msgs = publish([str(rec)], bootstrap, topics.telemetry)
        pub_s = time.perf_counter() - t
        raw_s = raw_consume(bootstrap, topics.telemetry, n_msgs)
        out = {}
        for mode in models:
            group = f"{prefix}-{mode}"
            split = mode == "split"   # the models, the stages in two processes (--stage host, --stage fleet)
            # "<models>-noinc": service.incidents off (rules only: no fleet stage at all).
            models, incidents = mode.removesuffix("-noinc"), not mode.endswith("-noinc")

            def config(stage: str) -> dict:
                return {"kafka": {"bootstrap": bootstrap, "prefix": prefix, "group": group},
                        "http": {"port": 0}, "service": {"rules": [str(ROOT / "rules")], "flush_idle_s": 2,
                                                         "models": "auto" if split else models, "stage": stage,
                                                         "incidents": incidents},
                        "engine": {"idle_timeout": 0.5}}

            svc = Service(config("host" if split else "all"), workdir, group)
            fleet_svc = Service(config("fleet"), workdir, group + "-fleet") if split else None
            try:
                svc_s = service_seconds(svc, n_records, fleet=models != "none", fleet_svc=fleet_svc)
                # A small run can be done before its first checkpoint; the idle flush
                # (flush_idle_s) writes one soon after.
                deadline = time.monotonic() + 15
                while loop_profile(metrics_text(svc))["checkpoints"] == 0 and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(0.5)       # the round in flight: its broker wait and commit
                prof = loop_profile(metrics_text(svc))
                if fleet_svc is not None:
                    prof["fleet_process"] = loop_profile(metrics_text(fleet_svc))
                out[mode] = (svc_s, prof)
            finally:
                svc.stop()
                if fleet_svc is not None:
                    fleet_svc.stop()
        return n_msgs, pub_s, raw_s, out
    finally:
        delete_topics(bootstrap, topics.all())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kafka", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench" / "results",
                    help="where the recording, service configs and logs go")
    ap.add_argument("--models", default=os.environ.get("BENCH_MODELS", "auto,none"),
                    help="comma-separated service.models values to run, each next to the same raw consume")
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    ap.add_argument("--encoding", choices=("json", "columnar"), default="json",
                    help="the telemetry messages' encoding (docs/architecture.md §7)")
    args = ap.parse_args()
    rec = recording(args.gpus, args.seconds, args.workdir)
    n_dcgm = n_all = 0
    with rec.open() as fh:
        for line in fh:
            n_all += 1
            n_dcgm += '"kind":"dcgm"' in line
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    raw, pub = [], []
    svc: dict[str, list[float]] = {m: [] for m in models}
    profiles: dict[str, list[dict]] = {m: [] for m in models}
    for _ in range(args.repeat):
        n_msgs, pub_s, raw_s, out = run_once(args.kafka, rec, n_all, args.workdir, models, args.encoding)
        pub.append(round(pub_s, 2))
        raw.append(n_dcgm / raw_s)
        for m, (svc_s, prof) in out.items():
            svc[m].append(n_dcgm / svc_s)
            profiles[m].append(prof)
    raw_med = statistics.median(raw)
    res = {"bench": "service_throughput", "encoding": args.encoding, "gpus": args.gpus, "seconds": args.seconds, "messages": n_msgs,
           "gpu_samples": n_dcgm, "records": n_all, "repeat": args.repeat,
           "raw_consume_gpu_samples_per_s": round(raw_med), "raw_consume_runs": [round(r) for r in raw],
           "modes": {}, "publish_s": pub, "machine": f"{os.cpu_count()} cores; broker and service on the same machine"}
    for m in models:
        med = statistics.median(svc[m])
        cps = [p["checkpoint_s_per_partition"] for p in profiles[m] if p["checkpoint_s_per_partition"] is not None]
        res["modes"][m] = {"service_gpu_samples_per_s": round(med), "service_runs": [round(r) for r in svc[m]],
                           "ratio": round(med / raw_med, 3),
                           "checkpoint_s_per_partition": round(statistics.median(cps), 4) if cps else None,
                           "checkpoint_runs": cps, "profiles": profiles[m]}
        print(f"{n_dcgm:,} GPU-samples in {n_msgs:,} per-host messages, median of {args.repeat}: raw kafka-python "
              f"consume {res['raw_consume_gpu_samples_per_s']:,}/s, service (models: {m}) {round(med):,}/s "
              f"({100 * med / raw_med:.0f}% of raw); checkpoint {res['modes'][m]['checkpoint_s_per_partition']} s "
              f"per partition; loop {profiles[m][-1]['phases_s']}")
    first = res["modes"][models[0]]      # the keys of one-mode runs, for older readers of the JSON
    res.update(service_gpu_samples_per_s=first["service_gpu_samples_per_s"], service_runs=first["service_runs"],
               ratio=first["ratio"])
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
