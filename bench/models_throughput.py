"""Engine throughput with the default models on, and the models' per-GPU state, on one core.

    .venv/bin/python bench/models_throughput.py [--gpus 2048] [--seconds 120] [--repeat 3] [--json OUT]

Same recording and method as ``engine_throughput.py`` (decode included, one core, median of
``--repeat`` runs), run twice: default rules alone, then default rules + ``rules/models.yaml``.
Memory: per-GPU model state (arrays indexed by GPU) in bytes, and the shared per-cohort state
(its msgpack size in the snapshot: the HST forests and friends), after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_throughput import recording  # noqa: E402

from pipeline.bus.files import read_lines  # noqa: E402
from pipeline.engine import Engine  # noqa: E402
from pipeline.models import load_models  # noqa: E402
from pipeline.rules import load_rules  # noqa: E402
from pipeline.runner import Pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run_once(lines: list, models: bool) -> tuple[float, int, Engine]:
    ruleset, diags = load_rules([ROOT / "rules"])
    assert ruleset is not None, diags
    pipe = Pipeline(Engine(rules=ruleset, models=load_models() if models else None))
    t = time.perf_counter()
    for i in range(0, len(lines), 256):
        pipe.handle(lines[i:i + 256])
    pipe.flush()
    return time.perf_counter() - t, pipe.engine.stats["records.dcgm"], pipe.engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    lines = list(read_lines(recording(args.gpus, args.seconds)))
    out = {}
    for mode in ("rules", "rules+models"):
        runs = []
        for _ in range(args.repeat):
            el, n, eng = run_once(lines, mode != "rules")
            runs.append(n / el)
        out[mode] = (statistics.median(runs), runs, n, eng)
    eng = out["rules+models"][3]
    ms = eng.models
    per = ms.nbytes_per_gpu(eng.entities.n_gpus)
    per_gpu = sum(per.values())
    shared = ms.shared_bytes()
    for mode, (med, runs, n, _) in out.items():
        print(f"{mode:13s} {args.gpus} GPUs x {args.seconds}s ({n:,} GPU-samples), 1 core: median "
              f"{med:,.0f} GPU-samples/s ({', '.join(f'{r:,.0f}' for r in runs)})")
    print(f"model state per GPU: {per_gpu:.0f} bytes ({', '.join(f'{k} {v:.0f}' for k, v in per.items())}); "
          f"engine per-GPU state {eng.state.nbytes_per_gpu():.0f} bytes; shared per-cohort model state "
          f"{shared / 1024:.0f} KiB; whole model snapshot {len(ms.snapshot()) / 1024:.0f} KiB")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps({"bench": "models_throughput", "gpus": args.gpus, "seconds": args.seconds,
                                 "rules_samples_per_s": round(out["rules"][0]),
                                 "models_samples_per_s": round(out["rules+models"][0]),
                                 "rules_runs": [round(r) for r in out["rules"][1]],
                                 "models_runs": [round(r) for r in out["rules+models"][1]],
                                 "gpu_samples": out["rules+models"][2],
                                 "engine_bytes_per_gpu": round(eng.state.nbytes_per_gpu()),
                                 "model_bytes_per_gpu": round(per_gpu), "shared_bytes": shared,
                                 "machine": f"{platform.machine()} {os.cpu_count()} cores, 1 used",
                                 "python": platform.python_version()}) + "\n")


if __name__ == "__main__":
    main()
