#!/usr/bin/env python3
"""Check the NVML producer on a real GPU machine (CI has no GPU and tests it on a fake NVML).

    .venv/bin/python scripts/check_nvml_on_gpu.py [--polls 3] [--interval 1]

Polls the real driver through ``producers.nvml.NvmlSource`` and checks, per GPU, that the
record decodes with the pipeline's decoder, that the core fields are present and plausible
(temperature, SM clock, power, utilisation, energy growing between polls), and reports which
optional fields this GPU/driver leaves absent (ECC on consumer parts, NVLink on PCIe cards,
remapped rows before Ampere). Exit 0 when every check passes, 1 otherwise, 2 without NVML.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.decode import Decoder  # noqa: E402
from pipeline.schema import encode  # noqa: E402

CORE = {"DCGM_FI_DEV_GPU_TEMP": (0, 120), "DCGM_FI_DEV_SM_CLOCK": (1, 5000), "DCGM_FI_DEV_POWER_USAGE": (1, 2000),
        "DCGM_FI_DEV_GPU_UTIL": (0, 100), "DCGM_FI_DEV_MEM_CLOCK": (1, 20000)}
OPTIONAL = ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_XID_ERRORS")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    try:
        from producers.nvml import NvmlSource

        src = NvmlSource()
    except Exception as e:  # noqa: BLE001 - no driver, no library: say so plainly
        print(f"NVML unavailable: {e!r}")
        return 2
    failures: list[str] = []
    polls = []
    try:
        for i in range(args.polls):
            if i:
                time.sleep(args.interval)
            polls.append(src.poll())
    finally:
        src.close()
    if not polls[-1]:
        print("FAIL: no records (no GPU visible?)")
        return 1
    dec = Decoder(wall_clock=time.time)
    for recs in polls:
        out = dec.decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "nvml")
        if out.dead:
            failures.append(f"dead letters: {[d.detail for d in out.dead]}")
    gpus = [r for r in polls[-1] if r.link is None]
    links = [r for r in polls[-1] if r.link is not None]
    print(f"{len(gpus)} GPU(s), {len(links)} NVLink record(s) on {gpus[0].host}")
    for r in gpus:
        f = r.fields
        print(f"GPU {r.gpu} {r.model} {r.uuid}")
        for name, (lo, hi) in CORE.items():
            v = getattr(f, name)
            ok = not math.isnan(v) and lo <= v <= hi
            print(f"  {'ok  ' if ok else 'FAIL'} {name} = {v}")
            if not ok:
                failures.append(f"GPU {r.gpu}: {name} = {v} outside [{lo}, {hi}]")
        for name in OPTIONAL:
            v = getattr(f, name)
            print(f"  {'    ' if not math.isnan(v) else 'n/a '} {name} = {v}")
        first = next(x for x in polls[0] if x.gpu == r.gpu and x.link is None)
        e0, e1 = first.fields.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, f.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION
        if len(polls) > 1 and not math.isnan(e0) and not e1 > e0:
            failures.append(f"GPU {r.gpu}: energy did not grow between polls ({e0} -> {e1})")
    for msg in failures:
        print("FAIL:", msg)
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
