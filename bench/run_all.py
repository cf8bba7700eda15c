"""Run the whole benchmark suite and publish it: one JSON file of figures and docs/performance.md.

    .venv/bin/python bench/run_all.py [--repeat 3] [--kafka 127.0.0.1:9092] [--quick]
        [--fleets 1024,4096,16384] [--only engine,models,memory,service,latency,wire]
        [--out-dir bench/results] [--doc docs/performance.md | --no-doc]

``make bench`` runs it with a broker of its own unless ``KAFKA_BOOTSTRAP`` names one.

Each benchmark is one of the scripts beside this file, run as a subprocess (so one's memory
and pinning never leak into the next) with ``--json``; its machine-readable result is read
back. Every figure is the median of ``--repeat`` runs (memory is deterministic: one run).

* engine: ``engine_throughput.py``, rules only, decode included, one core, per fleet size;
* models: ``models_throughput.py``, rules + default models, one core, per fleet size;
* memory: ``state_memory.py``, per-GPU state bytes by part, per fleet size;
* service: ``service_throughput.py``, the service through Kafka, with the models (one process,
  and the two stages as two processes) and with the rules only, next to the raw kafka-python
  consume ceiling, and its checkpoint time per
  partition, per fleet size;
* latency: ``service_latency.py``, produce-to-alert p50/p95/p99 at a paced 1 Hz load, per fleet
  size (the 16,384-GPU row is the headline): every host sampling at the second's start, every
  host at its own phase, and one host silent (its partition-mates apart from the others);
* replicas: ``service_replicas.py``, 1, 2 and 4 identical `serve` replicas (both stages, the
  models in shards by host: ``service.shard_models``) on a 64-host `llama3` recording: each
  replica's share of the model work and its CPU, and the 100,000-GPU projection from one
  process's rate;
* shards: ``fleet_shards.py``, the models' work in 1, 2 and 4 shards by host plus an NCCL
  scorer, in one process (``replay --fleet-shards``): each engine's share of the records and of
  the time, and that the alerts are one engine's;
* wire: ``wire_format.py``, per-GPU vs per-host messages, JSON vs columnar;
* replay: ``replay_throughput.py``, a 48-GPU, 2-hour recording sampled every 5 s replayed as
  ``gpuwarden replay`` does (rules only, and with the default models), one core.

The Kafka benchmarks need a broker: ``--kafka`` or ``KAFKA_BOOTSTRAP``; without one they are
skipped, and the report says so. Writes ``<out-dir>/bench-<date>-<git sha>.json`` (figures,
units, runs, medians, the machine) and rewrites the part of ``--doc`` between
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` (appended when the markers are missing);
the rest of the document is left as it is. ``--quick``: tiny fleets and one repeat, a smoke
run of the machinery, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
ALL = ("engine", "models", "memory", "service", "latency", "replicas", "shards", "wire", "replay")
KAFKA_BENCHES = {"service", "latency", "replicas", "wire"}
FULL_FLEETS = (1024, 4096, 16384)
QUICK_FLEETS = (64, 256)


# ---------------------------------------------------------------------------------------------
# The machine

def machine_info() -> dict:
    """CPU model, cores, RAM, OS, Python and the git revision the figures belong to."""
    cpu = "unknown"
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else platform.processor() or "unknown"
    except OSError:
        cpu = platform.processor() or "unknown"
    ram_gib = None
    try:
        m = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        ram_gib = round(int(m.group(1)) / 2**20, 1) if m else None
    except OSError:
        pass
    sha, dirty = _git("rev-parse", "--short", "HEAD") or "unknown", None
    if sha != "unknown":
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "arch": platform.machine(), "cores": os.cpu_count(), "cores_usable": usable,
            "ram_gib": ram_gib, "os": platform.platform(), "python": platform.python_version(),
            "git_sha": sha, "git_dirty": dirty, "load_avg_start": _loadavg()}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


# ---------------------------------------------------------------------------------------------
# Running the scripts

@dataclass
class Plan:
    """What to run and how big: the full suite or ``--quick``."""

    fleets: tuple[int, ...]
    repeat: int
    engine_seconds: int
    memory_seconds: int
    service_seconds: int
    latency_seconds: int
    latency_warmup: int
    wire_hosts: int
    wire_seconds: int
    kafka: str | None
    only: tuple[str, ...] = ALL
    workdir: Path = field(default_factory=lambda: BENCH / "results")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        fleets = tuple(args.fleets) if args.fleets else (QUICK_FLEETS if quick else FULL_FLEETS)
        return cls(fleets=fleets, repeat=args.repeat or (1 if quick else 3),
                   engine_seconds=args.engine_seconds or (20 if quick else 60), memory_seconds=10 if quick else 30,
                   service_seconds=args.service_seconds or (20 if quick else 60),
                   latency_seconds=args.latency_seconds or (16 if quick else 40),
                   latency_warmup=8 if quick else 15, wire_hosts=8 if quick else 64,
                   wire_seconds=10 if quick else 60, kafka=args.kafka, only=tuple(args.only),
                   workdir=args.out_dir)


def run_script(script: str, argv: list[str], log: Callable[[str], None] = print) -> tuple[list[dict], float]:
    """Run ``bench/<script> argv --json TMP``; return the JSON lines it wrote and the wall seconds.

    Its output is echoed as it comes (a full run takes a while) and kept for parsing.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.jsonl"
        cmd = [sys.executable, str(BENCH / script), *argv, "--json", str(out)]
        log("$ " + " ".join(cmd[1:]).replace(str(ROOT) + "/", ""))
        t = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            log("  " + line.rstrip())
        rc = proc.wait()
        wall = time.monotonic() - t
        if rc != 0:
            raise BenchError(f"{script} exited with {rc}", "".join(lines[-40:]))
        results = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.exists() else []
        if not results:
            raise BenchError(f"{script} wrote no result", "".join(lines[-40:]))
        results[-1]["_stdout"] = "".join(lines)
        return results, wall


class BenchError(RuntimeError):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def figure(fid: str, label: str, unit: str, runs: list[float], **where) -> dict:
    """One reported number: its runs and their median, with what it was measured on."""
    runs = [float(r) for r in runs]
    return {"id": fid, "label": label, "unit": unit, "median": statistics.median(runs) if runs else None,
            "runs": runs, "repeat": len(runs), **where}


def _models_runs(raw: dict) -> dict[str, list[float]]:
    """Per-run rates of models_throughput.py: from its JSON when it has them, else its printout."""
    out = {}
    for mode, key in (("rules", "rules_runs"), ("rules+models", "models_runs")):
        if raw.get(key):
            out[mode] = raw[key]
            continue
        m = re.search(rf"^{re.escape(mode)}\s+.*median [\d,]+ GPU-samples/s \(([^)]*)\)", raw.get("_stdout", ""), re.M)
        if m:
            out[mode] = [float(x.replace(",", "")) for x in m.group(1).split(", ")]
        else:
            out[mode] = [raw["rules_samples_per_s" if mode == "rules" else "models_samples_per_s"]]
    return out


def bench_engine(plan: Plan, gpus: int) -> tuple[dict, list[dict]]:
    (raw,), wall = run_script("engine_throughput.py", ["--gpus", str(gpus), "--seconds", str(plan.engine_seconds),
                                                         "--repeat", str(plan.repeat)])
    figs = [figure("engine.rules", "engine, rules only, 1 core", "GPU-samples/s", raw["runs"], gpus=gpus,
                   gpu_samples=raw["gpu_samples"], seconds=plan.engine_seconds)]
    return {"name": "engine", "gpus": gpus, "wall_s": wall, "raw": raw}, figs


def bench_models(plan: Plan, gpus: int) -> tuple[dict, list[dict]]:
    (raw,), wall = run_script("models_throughput.py", ["--gpus", str(gpus), "--seconds", str(plan.engine_seconds),
                                                         "--repeat", str(plan.repeat)])
    runs = _models_runs(raw)
    figs = [figure("engine.models", "engine, rules + models, 1 core", "GPU-samples/s", runs["rules+models"],
                   gpus=gpus, seconds=plan.engine_seconds),
            figure("engine.rules_same_run", "engine, rules only (same process as rules + models)",
                   "GPU-samples/s", runs["rules"], gpus=gpus, seconds=plan.engine_seconds)]
    return {"name": "models", "gpus": gpus, "wall_s": wall, "raw": raw}, figs


MEMORY_PARTS = (("core_bytes_per_gpu", "core state"), ("rule_windows_bytes_per_gpu", "rule windows + baselines"),
                ("lifecycle_bytes_per_gpu", "alert lifecycles"), ("model_bytes_per_gpu", "models"),
                ("total_bytes_per_gpu", "total"), ("snapshot_bytes_per_gpu", "checkpoint snapshot"),
                # As the service writes it (zlib, signed envelope); goal <= 2 KiB (docs/performance.md#memory).
                ("checkpoint_bytes_per_gpu", "checkpoint as written"),
                ("rules_checkpoint_bytes_per_gpu", "checkpoint as written, rules only"))


def bench_memory(plan: Plan, gpus: int) -> tuple[dict, list[dict]]:
    (raw,), wall = run_script("state_memory.py", ["--gpus", str(gpus), "--seconds", str(plan.memory_seconds)])
    figs = [figure(f"memory.{key.removesuffix('_bytes_per_gpu')}", f"per-GPU state: {label}", "bytes/GPU",
                   [raw[key]], gpus=gpus) for key, label in MEMORY_PARTS]
    figs.append(figure("memory.model_shared", "shared per-cohort model state", "bytes", [raw["model_shared_bytes"]],
                       gpus=gpus))
    return {"name": "memory", "gpus": gpus, "wall_s": wall, "raw": raw}, figs


def bench_service(plan: Plan, gpus: int) -> tuple[dict, list[dict]]:
    (raw,), wall = run_script("service_throughput.py", ["--kafka", plan.kafka, "--gpus", str(gpus), "--seconds",
                                                          str(plan.service_seconds), "--repeat", str(plan.repeat),
                                                          "--models", "auto,none,split", "--workdir", str(plan.workdir)])
    figs = [figure("service.raw_consume", "raw kafka-python consume", "GPU-samples/s", raw["raw_consume_runs"],
                   gpus=gpus, gpu_samples=raw["gpu_samples"])]
    for mode, slug, label in (("auto", "throughput", "service through Kafka, rules and models"),
                              ("none", "throughput_rules", "service through Kafka, rules only"),
                              ("split", "throughput_split", "service through Kafka, models, stages in two processes")):
        m = raw["modes"].get(mode)
        if not m:
            continue
        figs.append(figure(f"service.{slug}", label, "GPU-samples/s", m["service_runs"], gpus=gpus,
                           gpu_samples=raw["gpu_samples"]))
        if m["checkpoint_runs"]:
            # Snapshot, sign and queue one partition's checkpoint (docs/operations.md#performance).
            figs.append(figure(f"service.checkpoint_s.{mode}", f"checkpoint per partition ({label})", "s",
                               m["checkpoint_runs"], gpus=gpus))
    return {"name": "service", "gpus": gpus, "wall_s": wall, "raw": raw}, figs


def bench_latency(plan: Plan, gpus: int) -> tuple[dict, list[dict]]:
    argv = ["--kafka", plan.kafka, "--gpus", str(gpus), "--seconds", str(plan.latency_seconds), "--warmup",
            str(plan.latency_warmup), "--repeat", str(plan.repeat), "--workdir", str(plan.workdir)]
    (raw,), wall = run_script("service_latency.py", argv)
    # The same load with one (never faulty) host going silent halfway through the faults.
    silent_from = plan.latency_warmup + (plan.latency_seconds - plan.latency_warmup) // 3
    (quiet,), wall2 = run_script("service_latency.py", argv + ["--silent-from", str(silent_from)])
    # Every host at its own phase of the second, as independent exporters sample, through the
    # default models (their NCCL ones judge each second once it is whole) beside the probe.
    (spread,), wall3 = run_script("service_latency.py", argv + ["--phases", "spread", "--models", "default"])
    figs = []
    for prefix, label, r in (("latency", "", raw), ("latency_silent", ", one host silent mid-run", quiet),
                             ("latency_spread", ", hosts at spread phases", spread)):
        figs += [figure(f"{prefix}.{q}", f"produce-to-alert latency {q}{label}", "s", [x[f"{q}_s"] for x in r["runs"]],
                        gpus=gpus, rate_hz=1, alerts_seen=r["alerts_seen"], faults=r["faults"],
                        publisher_behind_s=r.get("publisher_behind_s"), silent_from=r.get("silent_from"))
                 for q in ("p50", "p95", "p99", "max")]
        # End to end through both stages: a probe model's alerts, behind the <prefix>.fleet hop.
        figs += [figure(f"{prefix}.fleet.{q}", f"produce-to-alert latency through the fleet stage {q}{label}", "s",
                        [x[f"fleet_{q}_s"] for x in r["runs"]], gpus=gpus, rate_hz=1,
                        alerts_seen=r.get("fleet_alerts_seen"), faults=r["faults"])
                 for q in ("p50", "p99")]
    # The silent host's partition-mates (what its silence holds back) apart from the other partitions.
    for grp, label in (("others", "other partitions"), ("mates", "the silent host's partition-mates")):
        figs += [figure(f"latency_silent.{grp}.{q}", f"produce-to-alert latency {q}, one host silent mid-run, {label}",
                        "s", [x[f"{grp}_{q}_s"] for x in quiet["runs"]], gpus=gpus, rate_hz=1,
                        alerts_seen=quiet.get(f"{grp}_alerts_seen"),
                        faults=quiet.get("mates_faults") if grp == "mates" else None,
                        silent_from=quiet.get("silent_from"))
                 for q in ("p50", "p95", "p99", "max")]
    return {"name": "latency", "gpus": gpus, "wall_s": wall + wall2 + wall3, "raw": raw, "raw_silent": quiet,
            "raw_spread": spread}, figs


def bench_replicas(plan: Plan) -> tuple[dict, list[dict]]:
    hosts, seconds = (16, 30) if plan.engine_seconds < 60 else (64, 120)   # --quick: a smaller fleet
    (raw,), wall = run_script("service_replicas.py", ["--kafka", plan.kafka, "--hosts", str(hosts), "--seconds",
                                                        str(seconds), "--replicas", "1,2,4", "--workdir",
                                                        str(plan.workdir)])
    figs = []
    for run in raw["runs"]:
        n = run["replicas"]
        figs.append(figure(f"replicas.max_share.{n}", f"busiest replica's share of the model work, {n} replica(s)",
                           "fraction", [run["max_fleet_share"]], replicas=n, hosts=hosts,
                           shard_models=raw.get("shard_models", False),
                           shares=[r["fleet_share"] for r in run["per_replica"]],
                           cpu_s=[r["cpu_s"] for r in run["per_replica"]], wall_s=run["wall_s"]))
    p = raw.get("projection")
    if p:
        figs.append(figure("replicas.process_rate", "one process with the models", "GPU-samples/s",
                           [p["process_gpu_samples_per_s"]], hosts=hosts, **{k: v for k, v in p.items()
                                                                            if k != "process_gpu_samples_per_s"}))
    return {"name": "replicas", "gpus": hosts * 8, "wall_s": wall, "raw": raw}, figs


def bench_shards(plan: Plan) -> tuple[dict, list[dict]]:
    hosts, seconds = (16, 120) if plan.engine_seconds < 60 else (64, 600)   # --quick: a smaller fleet
    (raw,), wall = run_script("fleet_shards.py", ["--hosts", str(hosts), "--seconds", str(seconds),
                                                    "--shards", "1,2,4"])
    figs = []
    for run in raw["runs"]:
        n = run["shards"]
        shards = run.get("processes", {})
        figs.append(figure(f"shards.max_busy_share.{n}",
                           f"busiest shard's (and its scorer's) share of the model time, {n} shard(s)",
                           "fraction", [run["max_busy_share"]], shards=n, hosts=hosts,
                           record_share=run["max_share"], same_alerts=run["same_alerts"],
                           engines={k: [v["share"], v["busy_share"]] for k, v in shards.items()}))
    return {"name": "shards", "gpus": hosts * 8, "wall_s": wall, "raw": raw}, figs


def bench_replay(plan: Plan) -> tuple[dict, list[dict]]:
    seconds = 1800 if plan.engine_seconds < 60 else 7200   # --quick: a shorter recording
    figs, raws, wall = [], {}, 0.0
    for models, slug, label in (("none", "rules", "rules only"), ("auto", "models", "rules + models")):
        (raw,), w = run_script("replay_throughput.py", ["--gpus", "48", "--seconds", str(seconds), "--interval", "5",
                                                          "--models", models, "--repeat", str(plan.repeat)])
        wall += w
        raws[models] = raw
        where = dict(gpus=48, seconds=seconds, interval_s=5, dcgm_records=raw["dcgm_records"],
                     records=raw["records"], ticks_walked=raw["ticks_walked"])
        figs += [figure(f"replay.{slug}.dcgm", f"replay, {label}: DCGM records/s", "records/s", raw["dcgm_runs"],
                        **where),
                 figure(f"replay.{slug}.all", f"replay, {label}: all records/s", "records/s", raw["records_runs"],
                        **where)]
    return {"name": "replay", "gpus": 48, "wall_s": wall, "raw": raws}, figs


def bench_wire(plan: Plan) -> tuple[dict, list[dict]]:
    (raw,), wall = run_script("wire_format.py", ["--kafka", plan.kafka, "--hosts", str(plan.wire_hosts), "--seconds",
                                                   str(plan.wire_seconds), "--repeat", str(plan.repeat)])
    figs = []
    for row in raw["layouts"]:
        slug = {"per-GPU message": "per_gpu", "per-host columnar": "per_host_columnar"}.get(row["layout"], "per_host")
        figs.append(figure(f"wire.{slug}.decode", f"{row['layout']}: decode", "µs/GPU-sample",
                           [row["decode_us_per_sample"]], gpus=raw["gpus"]))
        if row["kafka_consume_us_per_sample"] is not None:
            figs.append(figure(f"wire.{slug}.kafka_consume", f"{row['layout']}: raw kafka-python consume",
                               "µs/GPU-sample", [row["kafka_consume_us_per_sample"]], gpus=raw["gpus"]))
    # wire_format.py takes its own median over --repeat; the figure is that median.
    for f in figs:
        f["repeat"] = raw["repeat"]
    return {"name": "wire", "gpus": raw["gpus"], "wall_s": wall, "raw": raw}, figs


def drop_stale_recordings(plan: Plan, log: Callable[[str], None] = print) -> list[Path]:
    """Delete cached simulator recordings of the planned sizes that are older than the simulator.

    The scripts cache recordings by fleet size and duration only; after a simulator change they
    would measure the old telemetry without a word.
    """
    sim_mtime = max(p.stat().st_mtime for p in (ROOT / "producers" / "sim").rglob("*.py"))
    candidates = [BENCH / "results" / f"fleet-{g}gpu-{plan.engine_seconds}s-seed7.jsonl" for g in plan.fleets]
    candidates += [plan.workdir / f"svc-{g}gpu-{plan.service_seconds}s.jsonl" for g in plan.fleets]
    dropped = []
    for path in candidates:
        if path.exists() and path.stat().st_mtime < sim_mtime:
            log(f"recording {path.name} is older than producers/sim: simulating it again")
            path.unlink()
            dropped.append(path)
    return dropped


def run_suite(plan: Plan, log: Callable[[str], None] = print) -> dict:
    """Run the planned benchmarks; a failed one is recorded and the others still run."""
    drop_stale_recordings(plan, log)
    started = dt.datetime.now(dt.timezone.utc)
    result = {"suite": "gpuwarden bench", "format": 1, "started": started.isoformat(timespec="seconds"),
              "machine": machine_info(), "repeat": plan.repeat, "fleets": list(plan.fleets),
              "kafka": plan.kafka, "benchmarks": [], "figures": [], "skipped": [], "failed": []}
    jobs: list[tuple[str, Callable[[], tuple[dict, list[dict]]]]] = []
    per_fleet = {"engine": bench_engine, "models": bench_models, "memory": bench_memory,
                 "service": bench_service, "latency": bench_latency}
    for name in ALL:
        if name not in plan.only:
            continue
        if name in KAFKA_BENCHES and not plan.kafka:
            result["skipped"].append({"name": name, "why": "no Kafka broker (--kafka or KAFKA_BOOTSTRAP)"})
            continue
        if name == "wire":
            jobs.append((name, lambda: bench_wire(plan)))
        elif name == "replicas":
            jobs.append((name, lambda: bench_replicas(plan)))
        elif name == "shards":
            jobs.append((name, lambda: bench_shards(plan)))
        elif name == "replay":
            jobs.append((name, lambda: bench_replay(plan)))
        else:
            jobs += [(name, lambda fn=per_fleet[name], g=g: fn(plan, g)) for g in plan.fleets]
    for name, job in jobs:
        try:
            bench, figs = job()
        except (RuntimeError, KeyError, ValueError, TypeError, OSError) as e:
            log(f"FAILED {name}: {e}")
            result["failed"].append({"name": name, "error": str(e), "output": getattr(e, "output", "")[-4000:]})
            continue
        bench["raw"].pop("_stdout", None)
        result["benchmarks"].append(bench)
        result["figures"] += [{"bench": name, **f} for f in figs]
    result["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result["machine"]["load_avg_end"] = _loadavg()
    return result


# ---------------------------------------------------------------------------------------------
# Writing: JSON and the markdown section

def results_path(result: dict, out_dir: Path) -> Path:
    date = result["started"][:10]
    return out_dir / f"bench-{date}-{result['machine']['git_sha']}.json"


def write_json(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = results_path(result, out_dir)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None or v != v:  # None or NaN
        return "-"
    return f"{v:,.{digits}f}"


def _cell(f: dict | None, digits: int = 0) -> str:
    """Median, and the runs when there were several."""
    if f is None:
        return "-"
    text = _fmt(f["median"], digits)
    if len(f["runs"]) > 1:
        text += " (" + " / ".join(_fmt(r, digits) for r in f["runs"]) + ")"
    return text


def _table(header: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def render_markdown(result: dict, json_path: str | None = None) -> str:
    """The generated section of docs/performance.md: the machine, then one table per topic."""
    figs = result["figures"]

    def get(fid: str, gpus: int | None = None) -> dict | None:
        return next((f for f in figs if f["id"] == fid and (gpus is None or f.get("gpus") == gpus)), None)

    def fleets(prefix: str) -> list[int]:
        return sorted({f["gpus"] for f in figs if f["id"].startswith(prefix)})

    m = result["machine"]
    sha = m["git_sha"] + (" with uncommitted changes" if m.get("git_dirty") else "")
    load = m.get("load_avg_start")
    out = [f"Generated by `bench/run_all.py` (`make bench`) on {result['started'][:10]} from git {sha}; "
           f"do not edit by hand between the markers.",
           "",
           f"Machine: {m['cpu']}, {m['cores']} cores ({m['cores_usable']} usable), {_fmt(m['ram_gib'], 1)} GiB RAM, "
           f"Python {m['python']}, {m['os']}"
           + (f"; load average {load[0]} at the start" if load else "") + ". "
           f"Each figure is the median of {result['repeat']} run(s), the runs in brackets; engine figures "
           f"use one pinned core, the Kafka ones share the machine with the broker."
           + (f" All figures, with units and runs: `{json_path}`." if json_path else ""),
           ""]
    eng = fleets("engine.")
    if eng:
        out += ["### Engine throughput, decode included, one core", "",
                "A `mixed`-scenario fleet with faults, replayed line by line (one host's GPUs at one second) "
                "through decoder + engine with the default rule packs; with models: plus `rules/models.yaml`.", ""]
        rows = []
        for g in eng:
            rules, models = get("engine.rules", g), get("engine.models", g)
            same = get("engine.rules_same_run", g)
            cost = (f"{100 * (1 - models['median'] / same['median']):.0f} %"
                    if models and same and same["median"] else "-")
            rows.append([f"{g:,}", _fmt((rules or {}).get("gpu_samples")), _cell(rules), _cell(models), cost])
        out += _table(["GPUs", "GPU-samples", "rules only (GPU-samples/s)", "rules + models (GPU-samples/s)",
                       "models' cost"], rows) + [""]
    mem = fleets("memory.")
    if mem:
        out += ["### Per-GPU state memory", "",
                "Engine with the default rules and models after a simulated run; per-entity arrays divided by the "
                "number of GPUs (host-level state amortised over its GPUs). Shared model state does not grow with "
                "the fleet.", ""]
        rows = []
        for g in mem:
            shared = (get("memory.model_shared", g) or {}).get("median")
            rows.append([f"{g:,}"] + [_fmt((get(f"memory.{k.removesuffix('_bytes_per_gpu')}", g) or {}).get("median"))
                                      for k, _ in MEMORY_PARTS]
                        + [f"{_fmt(shared / 1024)} KiB" if shared is not None else "-"])
        out += _table(["GPUs"] + [f"{label} (B)" for _, label in MEMORY_PARTS] + ["shared model state"], rows) + [""]
    svc = fleets("service.")
    if svc:
        out += ["### Service through Kafka, at full speed", "",
                "A recording published to a fresh topic (per-host messages, 8 partitions); a bare kafka-python "
                "consumer reads it (the ceiling of any consumer), then one `gpuwarden serve` process per mode "
                "(rules and the default models; rules only), each in a group of its own, processes it from its "
                "partition assignment until its /metrics count every record (decode, rules, models, alert "
                "delivery, checkpoints and commits included). Goals: with the models >= 60 % of raw, rules "
                "only >= 85 %. Checkpoint: one partition's snapshot, signature and write, mean over the run.", ""]
        rows = []
        for g in svc:
            r = get("service.raw_consume", g)
            s, s0 = get("service.throughput", g), get("service.throughput_rules", g)

            def pct(x: dict | None) -> str:
                return f"{100 * x['median'] / r['median']:.0f} %" if x and r and r["median"] else "-"
            cp, cp0 = get("service.checkpoint_s.auto", g), get("service.checkpoint_s.none", g)
            rows.append([f"{g:,}", _fmt((s or r or {}).get("gpu_samples")), _cell(r), _cell(s), pct(s), _cell(s0),
                         pct(s0), _cell(cp, 3), _cell(cp0, 3)])
        out += _table(["GPUs", "GPU-samples", "raw kafka-python consume (GPU-samples/s)",
                       "service, models (GPU-samples/s)", "models / raw (goal 60 %)", "service, rules only",
                       "rules / raw (goal 85 %)", "checkpoint per partition, models (s)",
                       "rules only (s)"], rows) + [""]
    lat = fleets("latency.")
    if lat:
        out += ["### Produce-to-alert latency at a paced 1 Hz load", "",
                "One message per host per second in real time; from the warm-up on, a few GPUs a second report "
                "XID 79. Latency: the alert's Kafka timestamp minus the time its sample was produced. Percentiles "
                "per run, then the median over runs.", ""]
        out += ["Goals: p99 <= 0.5 s at 2,048 GPUs and <= 1.0 s at 16,384; with one host silent from a third "
                      "of the way through the faults on (it gets none; its partition-mates get one a second from "
                      "then on), the other hosts' p99 within 1.5 s.", ""]
        rows = []
        for g in lat:
            for prefix, what in (("latency", "all hosts sending"), ("latency_spread", "hosts at spread phases"),
                                 ("latency_silent", "one host silent mid-run"),
                                 ("latency_silent.others", "one host silent: other partitions"),
                                 ("latency_silent.mates", "one host silent: its partition-mates")):
                p = {q: get(f"{prefix}.{q}", g) for q in ("p50", "p95", "p99", "max")}
                if not p["p50"]:
                    continue
                seen = f"{p['p50']['alerts_seen']}/{p['p50']['faults'] if p['p50'].get('faults') else '-'}"
                rows.append([f"{g:,}", what, seen] + [_cell(p[q], 2) for q in ("p50", "p95", "p99", "max")]
                            + [_fmt(p["p50"].get("publisher_behind_s"), 2)])
        out += _table(["GPUs at 1 Hz", "load", "alerts seen / faults", "p50 (s)", "p95 (s)", "p99 (s)", "max (s)",
                       "publisher behind, worst (s)"], rows, right_from=2) + [""]
    shares = [f for f in figs if f["id"].startswith("replicas.max_share.")]
    if shares:
        out += [f"### Identical replicas: who runs the models ({shares[0]['hosts']} hosts of `llama3`, 8 telemetry "
                f"and 8 fleet partitions)", "",
                "Each replica is a whole `serve` (both stages, the default models) in one consumer group; its share "
                "is of the records the fleet stages' models scored (`gpuwarden_fleet_records_total`), its CPU from "
                "/proc. Goal: with 4 replicas no replica above 35 %.", ""]
        rows = [[str(f["replicas"]), " / ".join(f"{100 * x:.0f} %" for x in f["shares"]),
                 " / ".join(_fmt(c) for c in f["cpu_s"]), f"{100 * f['median']:.0f} %"] for f in shares]
        out += _table(["replicas", "model work per replica", "CPU per replica (s)", "busiest"], rows) + [""]
        p = get("replicas.process_rate")
        if p:
            out += [f"One process with the models scores {_fmt(p['median'])} GPU-samples per CPU second here. A "
                    f"100,000-GPU fleet "
                    f"needs {p['processes_even_1hz']} such processes at 1 Hz and {p['processes_even_10s']} at one "
                    f"sample per 10 s if the model work spreads evenly; with the largest run's shares its busiest "
                    f"replica would carry {_fmt(p['busiest_load_1hz'], 1)}x one process's rate at 1 Hz and "
                    f"{_fmt(p['busiest_load_10s'], 1)}x at 10 s (above 1: it does not hold).", ""]
    sh = [f for f in figs if f["id"].startswith("shards.max_busy_share.")]
    if sh:
        out += [f"### The models in shards by host, one process ({sh[0]['hosts']} hosts of `llama3` at 1 Hz)", "",
                "`replay --fleet-shards N` (pipeline/shards.py): the DCGM records by host to N shard engines, the "
                "NCCL records by lane to N scorers; shard i and scorer i are what one process per fleet partition "
                "runs. Shares are of the records their models scored and of the time they spent "
                "(`ShardedFleet.busy`). Goal: with 4 shards no shard above 35 %.", ""]
        rows = [[str(f["shards"]), " / ".join(f"{k} {100 * v[0]:.0f} %" for k, v in sorted(f["engines"].items())) or "-",
                 " / ".join(f"{k} {100 * v[1]:.0f} %" for k, v in sorted(f["engines"].items())) or "-",
                 f"{100 * f['median']:.0f} %", "yes" if f["same_alerts"] else "NO"] for f in sh]
        out += _table(["shards", "records per shard", "time per shard", "busiest (time)", "alerts as one engine"],
                      rows) + [""]
    rep = [f for f in figs if f["id"].startswith("replay.")]
    if rep:
        r0 = rep[0]
        out += [f"### Replay of a sparsely sampled recording ({r0['gpus']} GPUs every {r0['interval_s']} s for "
                f"{r0['seconds']:,} s, one core)", "",
                f"`gpuwarden sim --hosts 6 --interval 5` written one record per line ({r0['dcgm_records']:,} DCGM of "
                f"{r0['records']:,} records), replayed as `gpuwarden replay` does; {r0['ticks_walked']:,} ticks walked "
                f"of {r0['seconds']:,} seconds of event time. Goal: >= 50,000 DCGM records/s.", ""]
        rows = [[label, _cell(get(f"replay.{slug}.dcgm")), _cell(get(f"replay.{slug}.all"))]
                for slug, label in (("rules", "rules only"), ("models", "rules + models"))
                if get(f"replay.{slug}.dcgm")]
        out += _table(["engine", "DCGM records/s", "all records/s"], rows) + [""]
    wire = [f for f in figs if f["id"].startswith("wire.")]
    if wire:
        out += [f"### Wire format: per-GPU vs per-host messages, JSON vs columnar ({wire[0]['gpus']:,} GPUs, one core)",
                ""]
        rows = []
        for slug, name in (("per_gpu", "per-GPU message"), ("per_host", "per-host message"),
                           ("per_host_columnar", "per-host columnar message")):
            if get(f"wire.{slug}.decode") is None:
                continue
            rows.append([name, _fmt((get(f"wire.{slug}.decode") or {}).get("median"), 2),
                         _fmt((get(f"wire.{slug}.kafka_consume") or {}).get("median"), 2)])
        out += _table(["layout", "decode (µs/GPU-sample)", "raw kafka-python consume (µs/GPU-sample)"], rows) + [""]
    for s in result.get("skipped", []):
        out.append(f"Not run: {s['name']} ({s['why']}).")
    for f in result.get("failed", []):
        out.append(f"**Failed**: {f['name']}: {f['error']}.")
    return "\n".join(out).rstrip() + "\n"


def replace_section(doc: str, section: str) -> str:
    """``doc`` with the text between the markers replaced by ``section``; the markers and a new
    section are appended when the document has none. Text outside the markers is kept as is."""
    b, e = doc.count(BEGIN), doc.count(END)
    if b == 0 and e == 0:
        return doc.rstrip("\n") + f"\n\n{BEGIN}\n{section.rstrip()}\n{END}\n"
    if b != 1 or e != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError(f"expected one {BEGIN} followed by one {END}, found {b} and {e}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{section.rstrip()}\n{END}{tail}"


def write_doc(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    path.write_text(replace_section(text, section))


# ---------------------------------------------------------------------------------------------

def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _csv_names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = sorted(set(names) - set(ALL))
    if bad:
        raise argparse.ArgumentTypeError(f"unknown benchmark(s) {', '.join(bad)}; choose from {', '.join(ALL)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny fleets and one repeat: a smoke run, not a measurement")
    ap.add_argument("--repeat", type=int, help="runs per figure (default 3; 1 with --quick)")
    ap.add_argument("--fleets", type=_csv_ints, help="fleet sizes in GPUs, comma-separated (default 1024,4096,16384)")
    ap.add_argument("--engine-seconds", type=int, help="simulated seconds replayed by the engine benches (default 60)")
    ap.add_argument("--service-seconds", type=int, help="simulated seconds published per service repeat (default 60)")
    ap.add_argument("--latency-seconds", type=int, help="seconds of paced load per latency repeat (default 40)")
    ap.add_argument("--only", type=_csv_names, default=list(ALL), help=f"benchmarks to run (default {','.join(ALL)})")
    ap.add_argument("--kafka", default=os.environ.get("KAFKA_BOOTSTRAP") or None,
                    help="bootstrap servers for the Kafka benchmarks (default: $KAFKA_BOOTSTRAP; none: skip them)")
    ap.add_argument("--out-dir", type=Path, default=BENCH / "results", help="where the JSON (and work files) go")
    doc = ap.add_mutually_exclusive_group()
    doc.add_argument("--doc", type=Path, help="markdown file whose bench section is rewritten "
                     "(default docs/performance.md; with --quick, none unless given)")
    doc.add_argument("--no-doc", action="store_true", help="write the JSON only")
    args = ap.parse_args(argv)
    plan = Plan.from_args(args)
    result = run_suite(plan)
    result["quick"] = args.quick
    path = write_json(result, args.out_dir)
    shown = path.resolve()
    section = render_markdown(result, str(shown.relative_to(ROOT)) if shown.is_relative_to(ROOT) else shown.name)
    target = None if args.no_doc else (args.doc or (None if args.quick else ROOT / "docs" / "performance.md"))
    if target is not None:
        write_doc(target, section)
    print()
    print(section)
    print(f"results: {path}" + (f"; section rewritten in {target}" if target else ""))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
