"""Per-GPU state memory of the engine with the default rules and models, by part.

    .venv/bin/python bench/state_memory.py [--gpus 2048] [--seconds 30] [--json OUT]

Feeds a simulated fleet (``mixed`` scenario) through an engine built as the service builds it
(default rule packs + ``rules/models.yaml``), then reports the bytes each GPU costs:

* core: last value and last-reported time of every catalog field (``GpuState``);
* rule windows and baselines, and alert lifecycles: their per-entity arrays summed and
  divided by the number of GPUs (host-level entities are amortised over the host's GPUs);
* models: per-GPU model arrays (``ModelSet.nbytes_per_gpu``), plus the shared per-cohort state
  (fleet-size independent, reported apart);
* the whole engine snapshot per GPU, raw and as the service writes it to the state topic
  (zlib in the signed envelope, ``KafkaStateStore.encode``), with the models and, from a second
  engine fed the same records, with the rules only. Goal: <= 2 KiB per GPU as written
  (docs/performance.md#memory).

State is allocated per entity on first sight and windows have a fixed number of panes, so a
short run measures the steady state. Deterministic: no repeats needed.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
from pathlib import Path

import msgspec
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.detection import build_engine  # noqa: E402
from pipeline.schema import DcgmRecord, NcclRecord  # noqa: E402
from pipeline.service.state import Checkpoint, KafkaStateStore  # noqa: E402
from producers.sim import Simulator  # noqa: E402


def _array_bytes(obj) -> int:
    """Bytes of every numpy array inside nested dicts/lists/tuples."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_array_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_array_bytes(v) for v in obj)
    return 0


def _checkpoint_bytes(snapshot: bytes) -> int:
    """Bytes of the state-topic message for this snapshot: compressed, enveloped, signed."""
    store = KafkaStateStore("", "state", "group", "telemetry", None, key=b"k" * 32)  # type: ignore[arg-type]
    return len(store.encode(Checkpoint(0, 0, snapshot)))


def measure(gpus: int, seconds: float, seed: int = 7) -> dict:
    """Run the fleet through a fresh engine and return the per-GPU byte counts."""
    eng, diags = build_engine([str(ROOT / "rules")], models="auto")
    rules_only, _ = build_engine([str(ROOT / "rules")], models="none")
    if eng is None or rules_only is None:
        raise SystemExit(f"rules do not load: {diags}")
    dec = msgspec.json.Decoder(list[DcgmRecord | NcclRecord])
    enc = msgspec.json.Encoder()
    sim = Simulator(hosts=max(1, gpus // 8), duration=seconds, seed=seed, scenario="mixed")
    for batch in sim.batches():
        recs = dec.decode(enc.encode(batch))
        eng.process(recs)
        rules_only.process(recs)
    eng.flush()
    rules_only.flush()
    n = eng.entities.n_gpus
    out = {"gpus_seen": n, "core_bytes_per_gpu": eng.state.nbytes_per_gpu()}
    out["rule_windows_bytes_per_gpu"] = (_array_bytes(eng.rules.windows.to_state()) / n) if eng.rules else 0.0
    out["lifecycle_bytes_per_gpu"] = _array_bytes([lc.to_state() for lc in eng.lifecycles.values()]) / n
    if eng.models is not None:
        out["model_bytes_per_gpu"] = sum(eng.models.nbytes_per_gpu(n).values())
        out["model_shared_bytes"] = eng.models.shared_bytes()
    else:
        out["model_bytes_per_gpu"], out["model_shared_bytes"] = 0.0, 0
    out["total_bytes_per_gpu"] = (out["core_bytes_per_gpu"] + out["rule_windows_bytes_per_gpu"]
                                  + out["lifecycle_bytes_per_gpu"] + out["model_bytes_per_gpu"])
    snap, rules_snap = eng.snapshot(), rules_only.snapshot()
    out["snapshot_bytes_per_gpu"] = len(snap) / n
    out["checkpoint_bytes_per_gpu"] = _checkpoint_bytes(snap) / n
    out["rules_snapshot_bytes_per_gpu"] = len(rules_snap) / n
    out["rules_checkpoint_bytes_per_gpu"] = _checkpoint_bytes(rules_snap) / n
    # ru_maxrss is KiB on Linux: the whole process, interpreter and simulator included.
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    res = {"bench": "state_memory", "gpus": args.gpus, "seconds": args.seconds, **measure(args.gpus, args.seconds),
           "python": platform.python_version()}
    print(f"{res['gpus_seen']:,} GPUs: per-GPU state {res['total_bytes_per_gpu']:,.0f} bytes (core "
          f"{res['core_bytes_per_gpu']:,.0f}, rule windows {res['rule_windows_bytes_per_gpu']:,.0f}, lifecycles "
          f"{res['lifecycle_bytes_per_gpu']:,.0f}, models {res['model_bytes_per_gpu']:,.0f}); shared model state "
          f"{res['model_shared_bytes'] / 1024:,.0f} KiB; snapshot {res['snapshot_bytes_per_gpu']:,.0f} bytes/GPU "
          f"({res['checkpoint_bytes_per_gpu']:,.0f} as written; rules only {res['rules_snapshot_bytes_per_gpu']:,.0f}, "
          f"{res['rules_checkpoint_bytes_per_gpu']:,.0f} as written); "
          f"peak RSS {res['peak_rss_mib']:,.0f} MiB")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
