"""The models' work in shards by host, in one process: each shard's share of it (issue 32).

    .venv/bin/python bench/fleet_shards.py [--hosts 64] [--seconds 600] [--shards 1,2,4] [--json OUT]

Replays a ``llama3`` recording of ``--hosts`` hosts at 1 Hz the way ``gpuwarden replay
--fleet-shards N`` does (pipeline/shards.py: the DCGM records by host to N shard engines, the
NCCL records by lane to N scorers, cohort parts and NCCL findings between them) and reports,
for each N, every engine's share of the records its models scored and of the time the fleet
stage's engines spent (``ShardedFleet.busy``), each shard's (shard i and scorer i: what one
process per fleet partition runs), the busiest shard's share, and that the alerts equal the
one-engine run's. From the busiest share it projects what one process per shard would need to
score for a 100,000-GPU fleet at 1 Hz, given the one-engine rate here. The goal
(docs/performance.md): no shard above 35 % with 4 shards. Not a test: a benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.detection import build_detector  # noqa: E402
from pipeline.schema import DcgmRecord, NcclRecord, NicRecord, ProgressRecord  # noqa: E402
from pipeline.shards import ShardedFleet  # noqa: E402
from producers.sim import Simulator  # noqa: E402

FLEET_GPUS = 100_000
_DEC = msgspec.json.Decoder(list[DcgmRecord | NcclRecord | NicRecord | ProgressRecord])


def batches(hosts: int, seconds: int) -> list[list]:
    sim = Simulator(hosts=hosts, duration=seconds, seed=11, scenario="llama3")
    return [_DEC.decode(msgspec.json.encode(b)) for b in sim.batches() if b]


def run(data: list[list], shards: int) -> dict:
    det, diags = build_detector([str(ROOT / "rules")], "auto", shards=shards)
    assert det is not None, diags
    t0 = time.perf_counter()
    alerts = []
    for b in data:
        alerts += det.process(b).alerts
    alerts += det.flush().alerts
    wall = time.perf_counter() - t0
    fleet = det.fleet  # type: ignore[attr-defined]
    out: dict = {"shards": shards, "wall_s": wall, "alerts": sorted((a.id, a.state, a.ts) for a in alerts)}
    if isinstance(fleet, ShardedFleet):
        recs, busy = fleet.shard_records(), fleet.busy
        n, t = sum(recs.values()) or 1, sum(busy.values()) or 1.0
        out["engines"] = {k: {"records": recs[k], "share": recs[k] / n, "busy_s": busy[k], "busy_share": busy[k] / t}
                          for k in sorted(recs)}
        # One process per fleet partition runs shard i and scorer i.
        out["processes"] = {k: {"share": (recs[k] + recs[c]) / n, "busy_share": (busy[k] + busy[c]) / t}
                            for k, c in zip(fleet.keys, fleet.scorers)}
        out["max_share"] = max(v["share"] for v in out["processes"].values())
        out["max_busy_share"] = max(v["busy_share"] for v in out["processes"].values())
    else:
        out["max_share"] = out["max_busy_share"] = 1.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--json", help="write the result here as JSON")
    args = ap.parse_args()
    data = batches(args.hosts, args.seconds)
    gpu_samples = sum(1 for b in data for r in b if isinstance(r, DcgmRecord))
    runs = [run(data, int(n)) for n in args.shards.split(",")]
    base = next((r for r in runs if r["shards"] == 1), runs[0])
    for r in runs:
        r["same_alerts"] = r["alerts"] == base["alerts"]
    for r in runs:
        r["n_alerts"] = len(r.pop("alerts"))
    rate = gpu_samples / base["wall_s"]
    biggest = runs[-1]
    busy = sum(v["busy_s"] for v in biggest.get("engines", {}).values())
    fleet_rate = gpu_samples / busy if busy else rate  # the fleet stage's engines alone
    need = FLEET_GPUS * biggest["max_busy_share"]
    projection = {
        "replay_gpu_samples_per_s": rate,
        "fleet_engines_gpu_samples_per_s": fleet_rate,
        "busiest_share": biggest["max_busy_share"],
        "busiest_gpu_samples_per_s_at_1hz": need,
        "busiest_vs_one_engine": need / fleet_rate,
        "shards_for_1hz": FLEET_GPUS / fleet_rate,
    }
    print(f"llama3, {args.hosts} hosts x {args.seconds} s at 1 Hz: {gpu_samples:,} GPU-samples; the whole replay "
          f"{rate:,.0f} GPU-samples/s, the fleet stage's engines {fleet_rate:,.0f} per second of their time")
    for r in runs:
        print(f"  {r['shards']} shard(s): {r['n_alerts']} alert events, same as one engine: {r['same_alerts']}; "
              f"busiest shard (and its scorer) {100 * r['max_share']:.0f} % of the records, "
              f"{100 * r['max_busy_share']:.0f} % of the time")
        for k, v in r.get("engines", {}).items():
            print(f"    {k:8s} {v['records']:>9,} records ({100 * v['share']:.0f} %), {v['busy_s']:.2f} s "
                  f"({100 * v['busy_share']:.0f} %)")
    print(f"  100,000 GPUs at 1 Hz with {biggest['shards']} shards: the busiest shard's work is "
          f"{need:,.0f} GPU-samples/s, {projection['busiest_vs_one_engine']:.1f}x what one engine scores; "
          f"about {projection['shards_for_1hz']:.0f} shards (one core each) hold the fleet if the work spreads evenly")
    if args.json:
        Path(args.json).write_text(json.dumps({"hosts": args.hosts, "seconds": args.seconds, "gpu_samples": gpu_samples,
                                               "runs": runs, "projection": projection}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
