"""Replay throughput of a sparsely sampled recording, in records/s on one core (issue 17).

    .venv/bin/python bench/replay_throughput.py [--gpus 48] [--seconds 7200] [--interval 5]
        [--models auto|none] [--stages two|one] [--repeat 3] [--json OUT]

What `gpuwarden sim --hosts 6 --duration 7200 --interval 5` writes (one line per record: DCGM
samples every 5 s, NCCL aggregates), replayed the way `gpuwarden replay` does it (batches of
2,000 lines through decoder + engine, default rule packs, with ``--models auto`` the default
models too, in the two stages ``gpuwarden replay`` builds: rules per host, models across hosts,
pipeline/topology.py; ``--stages one``: models and rules in one engine), pinned to one core. Event time runs 5 s per sample, so a replay whose cost grew
with seconds of event time (a tick per second) would pay 5 ticks per sample. Reported: DCGM
records/s (the goal in docs/performance.md is about these) and all records/s.
Not a test: a benchmark, run by hand or by `bench/run_all.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.bus.files import FileSink, read_lines  # noqa: E402
from pipeline.detection import build_detector, build_engine  # noqa: E402
from pipeline.engine import EngineOutput  # noqa: E402
from pipeline.replay import replay  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def recording(gpus: int, seconds: int, interval: float, seed: int = 7) -> Path:
    """The simulator's JSONL, one record per line (as `gpuwarden sim --out` writes it), cached."""
    from producers.sim import Simulator

    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"sparse-{gpus}gpu-{seconds}s-every{interval:g}s-seed{seed}.jsonl"
    if not path.exists():
        sim = Simulator(hosts=max(1, gpus // 8), duration=seconds, interval=interval, seed=seed, scenario="mixed")
        enc = msgspec.json.Encoder()
        with FileSink(path, atomic=True) as sink:
            for batch in sim.batches():
                sink.write_many(enc.encode(r) for r in batch)
    return path


def run_once(path: Path, models: str, stages: str = "two") -> tuple[float, int, int, int]:
    """(seconds, records, DCGM records, ticks walked by the rules' engine) of one replay of ``path``."""
    build = build_detector if stages == "two" else build_engine
    eng, diags = build([str(ROOT / "rules")], None if models == "none" else models)
    assert eng is not None, diags
    host = getattr(eng, "host", eng)  # a Topology's host stage, or the one engine
    ticks = [0]
    real = host._tick

    def counted(t: float, out: EngineOutput) -> None:
        ticks[0] += 1
        real(t, out)

    host._tick = counted
    res = replay([path], engine=eng)
    return res.seconds, res.totals.records, eng.stats["records.dcgm"], ticks[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--seconds", type=int, default=7200)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--models", default="none", help="'none': rules only (default); 'auto': the default models too")
    ap.add_argument("--stages", default="two", choices=("two", "one"), help="'two': as gpuwarden replay runs it")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    path = recording(args.gpus, args.seconds, args.interval)
    sum(1 for _ in read_lines(path))   # warm the page cache
    runs = [run_once(path, args.models, args.stages) for _ in range(args.repeat)]
    secs, records, dcgm, ticks = zip(*runs)
    dcgm_rates = [d / s for d, s in zip(dcgm, secs)]
    all_rates = [r / s for r, s in zip(records, secs)]
    res = {"bench": "replay_throughput", "gpus": args.gpus, "seconds": args.seconds, "interval_s": args.interval,
           "models": args.models, "stages": args.stages, "records": records[0], "dcgm_records": dcgm[0], "ticks_walked": ticks[0],
           "dcgm_records_per_s": round(statistics.median(dcgm_rates)), "dcgm_runs": [round(r) for r in dcgm_rates],
           "records_per_s": round(statistics.median(all_rates)), "records_runs": [round(r) for r in all_rates],
           "machine": f"{platform.machine()} {os.cpu_count()} cores, 1 used", "python": platform.python_version()}
    print(f"{args.gpus} GPUs every {args.interval:g}s for {args.seconds}s ({dcgm[0]:,} DCGM of {records[0]:,} records, "
          f"{ticks[0]:,} ticks walked), models {args.models}, stages {args.stages}, 1 core: median {res['dcgm_records_per_s']:,} DCGM "
          f"records/s ({', '.join(f'{r:,.0f}' for r in dcgm_rates)}), {res['records_per_s']:,} records/s")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
