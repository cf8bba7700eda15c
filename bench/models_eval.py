"""What the online models add to the rules, measured on simulator scenarios.

    .venv/bin/python bench/models_eval.py [--seeds 5] [--quick] [--json OUT]

Runs the engine with the default rule packs and the default models (rules/models.yaml) over:

* gradual NVLink degradation, a cooling failure and a straggler, each injected after the
  models' warm-up, one run per seed: for each fault, when the first alert of a rule and of a
  model on the faulty GPU (or its host) fired; lead time = rule time - model time. For the
  cooling failure the reference is the thermal-throttling rule (what fires once it throttles);
* fault-free runs (64 GPUs, 2 hours by default: healthy with checkpoints, power capping,
  afternoon heat): every firing alert is a false alert.

Prints a markdown table (pasted into docs/models.md). Not a test: a benchmark, and a quality
one, so `bench/run_all.py` (speed and memory) leaves it out. ``--quick``: one seed and
15-minute fault-free runs, a smoke check of the script rather than a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.engine import Engine  # noqa: E402
from pipeline.models import load_models  # noqa: E402
from pipeline.rules import load_rules  # noqa: E402
from pipeline.schema import DcgmRecord, NcclRecord  # noqa: E402
from producers.sim import Simulator  # noqa: E402
from producers.sim.scenarios import FaultSpec, Scenario  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
_DEC = msgspec.json.Decoder(list[DcgmRecord | NcclRecord])
_ENC = msgspec.json.Encoder()

FAULTS = {
    # name: (fault type, family of the reference rule, reference rule fault or None = any of family)
    "nvlink_degradation": ("nvlink_degradation", "nvlink", None),
    "cooling_before_throttling": ("thermal_throttling", "thermal", "thermal_throttling"),
    "nccl_straggler": ("nccl_straggler", "nccl", None),
    "hbm_ecc_burst": ("hbm_ecc_burst", "hbm", None),
}


def run(sim: Simulator) -> list:
    rules, diags = load_rules([ROOT / "rules"])
    assert rules is not None, diags
    eng = Engine(rules=rules, models=load_models(ROOT / "rules" / "models.yaml"))
    alerts = []
    for batch in sim.batches():
        alerts += eng.process(_DEC.decode(_ENC.encode(batch))).alerts
    return alerts + eng.flush().alerts


def fault_run(kind: str, seed: int, hosts: int, duration: float, onset: float) -> dict:
    ftype, family, ref_fault = FAULTS[kind]
    sc = Scenario(name=kind, faults=[FaultSpec(type=ftype, onset=onset, duration=duration - onset)])
    sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=sc)
    lab = next(lb for lb in sim.labels() if lb["fault"])
    alerts = [a for a in run(sim) if a.state == "firing"]

    def on_target(a) -> bool:
        return a.host == lab["host"] and (a.gpu is None or a.gpu == lab["gpu"]) and a.ts >= lab["onset"]

    def first(pred) -> float | None:
        ts = [a.ts for a in alerts if on_target(a) and pred(a)]
        return min(ts) - lab["onset"] if ts else None

    is_model = lambda a: a.labels.get("source") == "model"  # noqa: E731
    rule_t = first(lambda a: not is_model(a) and (a.fault == ref_fault if ref_fault else a.family == family))
    model_t = first(lambda a: is_model(a) and a.family in (family, "nccl" if family == "nvlink" else family))
    off_target = [a.rule for a in alerts if not on_target(a) and not (a.host == lab["host"] and a.ts >= lab["onset"])]
    return {"kind": kind, "seed": seed, "rule_s": rule_t, "model_s": model_t, "off_target": off_target}


def clean_run(scenario: str, seed: int, hosts: int, duration: float) -> dict:
    sim = Simulator(hosts=hosts, duration=duration, seed=seed, scenario=scenario)
    alerts = [a for a in run(sim) if a.state == "firing"]
    rules = [f"{a.rule}@{a.host}/{a.gpu}" for a in alerts if a.labels.get("source") != "model"]
    models = [f"{a.rule}@{a.host}/{a.gpu}" for a in alerts if a.labels.get("source") == "model"]
    return {"scenario": scenario, "seed": seed, "gpus": hosts * 8, "duration": duration,
            "rule_alerts": rules, "model_alerts": models}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--duration", type=float, default=2400.0)
    ap.add_argument("--onset", type=float, default=900.0)
    ap.add_argument("--clean-hours", type=float, default=2.0)
    ap.add_argument("--only", choices=["faults", "clean"], default=None)
    ap.add_argument("--kinds", nargs="*", choices=list(FAULTS), default=list(FAULTS))
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--json", help="append results as JSON lines")
    ap.add_argument("--quick", action="store_true", help="one seed, 15-minute fault-free runs")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.clean_hours = 1, 0.25
    results = []
    if args.only != "clean":
        for kind in args.kinds:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                r = fault_run(kind, seed, args.hosts, args.duration, args.onset)
                print(json.dumps(r), flush=True)
                results.append(r)
    if args.only != "faults":
        for scen in ("healthy", "power_cap", "afternoon_heat"):
            r = clean_run(scen, 11, 8, args.clean_hours * 3600.0)
            print(json.dumps(r), flush=True)
            results.append(r)
    if args.json:
        with open(args.json, "a") as fh:
            for r in results:
                fh.write(json.dumps(r) + "\n")
    print()
    print("| fault | rule detects (median s after onset) | model detects | median lead | detected rules / models |")
    print("|---|---|---|---|---|")
    for kind in FAULTS:
        rs = [r for r in results if r.get("kind") == kind]
        if not rs:
            continue
        rt = [r["rule_s"] for r in rs if r["rule_s"] is not None]
        mt = [r["model_s"] for r in rs if r["model_s"] is not None]
        leads = [r["rule_s"] - r["model_s"] if r["rule_s"] is not None else None for r in rs
                 if r["model_s"] is not None]
        lead_txt = ("n/a (no rule)" if all(x is None for x in leads) else
                    f"{statistics.median([x for x in leads if x is not None]):.0f} s") if leads else "-"
        print(f"| {kind} | {statistics.median(rt) if rt else '-'} | {statistics.median(mt) if mt else '-'} | "
              f"{lead_txt} | {len(rt)}/{len(rs)} / {len(mt)}/{len(rs)} |")
    for r in results:
        if "scenario" in r:
            print(f"| fault-free {r['scenario']} ({r['gpus']} GPUs, {r['duration'] / 3600:.0f} h) | "
                  f"rule alerts {len(r['rule_alerts'])} | model alerts {len(r['model_alerts'])} | | |")


if __name__ == "__main__":
    main()
