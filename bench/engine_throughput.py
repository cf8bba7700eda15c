"""Engine throughput, decode included, in GPU-samples/s on one core.

    .venv/bin/python bench/engine_throughput.py [--gpus 2048] [--seconds 120] [--repeat 3] [--json OUT]
        [--encoding json|columnar]

Simulates a fleet once (cached under bench/results/), then replays the recording's lines
through decoder + engine with the default rule packs, pinned to one core, and reports the
median of ``--repeat`` runs. Counted: DCGM GPU-samples (NCCL records ride along, uncounted).
``--encoding columnar``: each DCGM-only line is handed over as the columnar message a producer
sends (pipeline/colwire.py, with its header), the rest as JSON (docs/architecture.md §7).
Not a test: a benchmark, run by hand or by `bench/run_all.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path


from pipeline.bus.base import Message
from pipeline.bus.files import FileSink, read_lines
from pipeline.bus.telemetry import COLUMNAR_HEADERS
from pipeline.colwire import encode_dcgm
from pipeline.bus.telemetry import per_host_messages
from pipeline.engine import Engine
from pipeline.rules import load_rules
from pipeline.runner import Pipeline

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


def recording(gpus: int, seconds: int, seed: int = 7) -> Path:
    from producers.sim import Simulator

    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"fleet-{gpus}gpu-{seconds}s-seed{seed}.jsonl"
    if not path.exists():
        sim = Simulator(hosts=gpus // 8, duration=seconds, seed=seed, scenario="mixed")
        with FileSink(path, atomic=True) as sink:
            for batch in sim.batches():
                # One line per host per step: how the wire carries it (docs/architecture.md §7).
                sink.write_many(value for _, value in per_host_messages(batch))
    return path


def columnar(lines: list[Message]) -> list[Message]:
    """Each line as a producer's default encoding sends it: columnar where it can be."""
    out = []
    for m in lines:
        value = encode_dcgm(json.loads(m.value))
        headers = tuple(COLUMNAR_HEADERS) if value is not None else None
        out.append(Message(m.topic, m.partition, m.offset, m.key, value if value is not None else m.value, None,
                           headers))
    return out


def run_once(lines: list, rules_dir: str) -> tuple[float, int]:
    ruleset, diags = load_rules([rules_dir])
    assert ruleset is not None, diags
    pipe = Pipeline(Engine(rules=ruleset))
    t = time.perf_counter()
    for i in range(0, len(lines), 256):
        pipe.handle(lines[i:i + 256])
    pipe.flush()
    elapsed = time.perf_counter() - t
    return elapsed, pipe.engine.stats["records.dcgm"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rules", default=str(ROOT.parent / "rules"))
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    ap.add_argument("--encoding", choices=("json", "columnar"), default="json",
                    help="the messages' encoding (docs/architecture.md §7)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    path = recording(args.gpus, args.seconds)
    lines = list(read_lines(path))
    if args.encoding == "columnar":
        lines = columnar(lines)
    runs = []
    for _ in range(args.repeat):
        elapsed, samples = run_once(lines, args.rules)
        runs.append(samples / elapsed)
    med = statistics.median(runs)
    n_rules = len(load_rules([args.rules])[0] or [])
    result = {"bench": "engine_throughput", "mode": "rules", "encoding": args.encoding, "gpus": args.gpus, "seconds": args.seconds,
              "rules": n_rules, "gpu_samples": samples, "samples_per_s": round(med),
              "runs": [round(r) for r in runs], "machine": f"{platform.machine()} {os.cpu_count()} cores, 1 used",
              "python": platform.python_version()}
    print(f"{args.gpus} GPUs x {args.seconds}s ({samples:,} GPU-samples), {n_rules} rules, {args.encoding}, "
          f"decode included, "
          f"1 core: median {med:,.0f} GPU-samples/s over {args.repeat} runs ({', '.join(f'{r:,.0f}' for r in runs)})")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
