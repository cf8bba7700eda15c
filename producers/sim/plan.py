"""Turn a scenario into concrete events on a concrete fleet, and the ground-truth labels.

Everything random here (placement, drawn parameters, checkpoints, benign background events) is
decided before the first step, so ``Simulator.labels()`` is complete before iterating. Each kind
of draw has its own seeded stream: the checkpoints and background events of a seed are the same
whatever the scenario, so a fault scenario and ``healthy`` differ only by the faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import llama3
from .faults import NVLINK_TYPES, NVLINKS_PER_GPU, TYPES, Event
from .rng import substream
from .scenarios import (
    ScenarioError,
    LLAMA3_DEFAULTS,
    RANDOM_DEFAULTS,
    FaultSpec,
    Scenario,
    resolve_time,
)


@dataclass
class Plan:
    events: list[Event]  # faults and conditions, in (onset, id) order
    labels: list[dict]


class _Occupancy:
    """Which GPU is busy with a fault when, so random faults do not overlap on one GPU."""

    def __init__(self, gpus_per_host: int) -> None:
        self.G = gpus_per_host
        self.busy: dict[tuple[int, int], list[tuple[float, float]]] = {}

    def free(self, host: int, gpus: range | list[int], t0: float, t1: float) -> bool:
        for g in gpus:
            for a, b in self.busy.get((host, g), ()):
                if t0 < b + 1e-9 and a < t1 + 1e-9:
                    return False
        return True

    def take(self, host: int, gpus: range | list[int], t0: float, t1: float) -> None:
        for g in gpus:
            self.busy.setdefault((host, g), []).append((t0, t1))


def _expand_options(sc: Scenario, hosts: int, rng: np.random.Generator) -> list[tuple[str, FaultSpec]]:
    """Fleet options (``power_cap``, ``afternoon_heat``) as fault-list entries."""
    out: list[tuple[str, FaultSpec]] = []
    if sc.power_cap is not None:
        pc = sc.power_cap
        if "hosts" in pc:
            chosen: list[Any] = list(pc["hosts"])
        else:
            k = int(pc["count"]) if "count" in pc else max(1, int(round(pc.get("fraction", 0.25) * hosts)))
            chosen = sorted(int(h) for h in rng.choice(hosts, size=min(k, hosts), replace=False))
        params = {"limit_w": float(pc["limit_w"])} if "limit_w" in pc else {}
        for h in chosen:
            out.append(
                (
                    "power_cap",
                    FaultSpec(
                        type="power_cap", host=h, onset=pc.get("onset", 0.0), duration=pc.get("duration"), params=params
                    ),
                )
            )
    if sc.afternoon_heat is not None:
        ah = sc.afternoon_heat
        params = {k: ah[k] for k in ("delta_c", "ramp_s") if k in ah}
        out.append(
            (
                "afternoon_heat",
                FaultSpec(
                    type="afternoon_heat", onset=ah.get("onset", 0.0), duration=ah.get("duration"), params=params
                ),
            )
        )
    return out


def make_plan(
    sc: Scenario, *, host_names: list[str], gpus_per_host: int, duration: float, seed: int, start_ts: float, job: str
) -> Plan:
    """Place every scheduled and drawn event on the fleet; build the labels."""
    H, G, D = len(host_names), gpus_per_host, duration
    name_to_idx = {n: i for i, n in enumerate(host_names)}
    rng = substream(seed, "plan")
    occ = _Occupancy(G)

    # (where, spec, placement) -- placement: "given" (scenario list / options) or "random" (llama3)
    items: list[tuple[str, FaultSpec, str]] = [(f"faults[{j}]", f, "given") for j, f in enumerate(sc.faults)]
    items += [(where, f, "given") for where, f in _expand_options(sc, H, rng)]
    if sc.llama3 is not None:
        acc = float({**LLAMA3_DEFAULTS, **sc.llama3}["acceleration"])
        drawn = llama3.draw(substream(seed, "llama3"), H * G, D, acc, lambda t: TYPES[t].RANDOM_DURATION)
        items += [(f"llama3[{j}]", f, "random") for j, f in enumerate(drawn)]

    # Resolve times and explicit hosts first, so spreading can avoid hosts already named.
    resolved: list[dict[str, Any]] = []
    for where, spec, how in items:
        kind = TYPES[spec.type]
        t0 = resolve_time(spec.onset, D)
        if t0 >= D:
            raise ScenarioError(f"{where}.onset: {t0:g} s is not inside the run (duration {D:g} s)")
        dur = resolve_time(spec.duration, D)
        t1 = t0 if kind.instant else (D if dur is None else min(t0 + dur, D))
        host = spec.host
        if isinstance(host, str):
            if host not in name_to_idx:
                raise ScenarioError(
                    f"{where}.host: no host named {host!r} (hosts are {host_names[0]} .. {host_names[-1]})"
                )
            host = name_to_idx[host]
        elif isinstance(host, int) and host >= H:
            raise ScenarioError(f"{where}.host: host index {host} out of range (the fleet has {H} hosts)")
        if spec.gpu is not None and spec.gpu >= G:
            raise ScenarioError(f"{where}.gpu: GPU index {spec.gpu} out of range ({G} GPUs per host)")
        resolved.append({"where": where, "spec": spec, "how": how, "t0": t0, "t1": t1, "host": host})

    # Spread scenario faults without a host over distinct hosts, hosts nobody named first.
    named = {r["host"] for r in resolved if r["host"] is not None}
    perm = [int(h) for h in rng.permutation(H)]
    order = [h for h in perm if h not in named] + [h for h in perm if h in named]
    need = [
        r
        for r in resolved
        if r["host"] is None and r["how"] == "given" and TYPES[r["spec"].type].scope in ("gpu", "host")
    ]
    if len(need) <= H:
        for k, r in enumerate(need):
            r["host"] = order[k]
    else:
        groups: dict[str, int] = {}
        for k, r in enumerate(need):
            key = r["spec"].host_group or f"#{k}"
            if key not in groups:
                groups[key] = order[len(groups) % H]
            r["host"] = groups[key]

    # GPUs: scenario faults get distinct GPUs per host where possible.
    used: dict[int, set[int]] = {}
    for r in resolved:
        if r["spec"].gpu is not None and r["host"] is not None:
            used.setdefault(r["host"], set()).add(r["spec"].gpu)
    events_raw: list[dict[str, Any]] = []
    for r in resolved:
        spec, kind = r["spec"], TYPES[r["spec"].type]
        if r["how"] == "random":
            if not _place_random(r, kind, rng, occ, H, G):
                continue  # no free GPU for it: dropped (faults never overlap on one GPU)
        else:
            gpu = spec.gpu
            if kind.scope == "gpu" and gpu is None:
                taken = used.setdefault(r["host"], set())
                free = [g for g in range(G) if g not in taken]
                gpu = int(rng.choice(free)) if free else int(rng.integers(G))
                taken.add(gpu)
            r["gpu"] = gpu
            if kind.scope == "gpu" and kind.fault:
                occ.take(r["host"], [gpu], r["t0"], r["t1"])
            elif kind.scope == "host" and kind.fault:
                occ.take(r["host"], range(G), r["t0"], r["t1"])
        link = spec.link
        if spec.type in NVLINK_TYPES and link is None:
            link = int(rng.integers(NVLINKS_PER_GPU))
        prng = substream(seed, "params", r["where"])
        try:
            params = kind.resolve(dict(spec.params), prng, r["t1"] - r["t0"])
        except ValueError as e:
            raise ValueError(f"{r['where']}.{e}") from None
        events_raw.append(
            {
                "type": spec.type,
                "host": r["host"],
                "gpu": r["gpu"],
                "link": link,
                "t0": r["t0"],
                "t1": r["t1"],
                "params": params,
            }
        )
        # A lost GPU that comes back inside the run was reset: a benign GPU-level reload.
        if spec.type == "gpu_lost" and r["t1"] < D:
            events_raw.append(
                {
                    "type": "driver_reload",
                    "host": r["host"],
                    "gpu": r["gpu"],
                    "link": None,
                    "t0": r["t1"],
                    "t1": r["t1"],
                    "params": {},
                }
            )

    events_raw += _checkpoints(sc, D, seed)
    events_raw += _background(sc, H, G, D, seed)
    return _finish(events_raw, host_names, start_ts, job)


def _place_random(r: dict, kind, rng: np.random.Generator, occ: _Occupancy, H: int, G: int) -> bool:
    """Uniform placement for drawn faults, retrying to avoid overlap on a GPU."""
    for _ in range(50):
        host = int(rng.integers(H)) if r["host"] is None else r["host"]
        gpus = range(G) if kind.scope == "host" else [int(rng.integers(G))]
        if occ.free(host, gpus, r["t0"], r["t1"]):
            occ.take(host, gpus, r["t0"], r["t1"])
            r["host"] = host
            r["gpu"] = None if kind.scope == "host" else gpus[0]
            return True
    return False


def _checkpoints(sc: Scenario, D: float, seed: int) -> list[dict]:
    """Job-wide checkpoint pauses: periodic (+-2 %), first one somewhere in the first period."""
    if not sc.checkpoint_every:
        return []
    rng = substream(seed, "checkpoints")
    lo, hi = sc.checkpoint_duration
    every = float(sc.checkpoint_every)
    out, t = [], every * float(rng.uniform(0.3, 1.0))
    while t < D:
        d = float(rng.uniform(lo, hi))
        out.append(
            {
                "type": "checkpoint",
                "host": None,
                "gpu": None,
                "link": None,
                "t0": t,
                "t1": min(t + d, D),
                "params": {"every_s": every},
            }
        )
        t += every * (1.0 + float(rng.uniform(-0.02, 0.02)))
    return out


def _background(sc: Scenario, H: int, G: int, D: float, seed: int) -> list[dict]:
    """Benign events drawn as Poisson processes: isolated SBEs, lone corrected PCIe errors,
    driver reloads."""
    rates = {**RANDOM_DEFAULTS, **sc.random}
    out: list[dict] = []
    rng = substream(seed, "sbe-isolated")
    for _ in range(int(rng.poisson(rates["sbe_per_gpu_day"] / 86_400.0 * H * G * D))):
        gi, t = int(rng.integers(H * G)), float(rng.uniform(0.0, D))
        out.append(
            {"type": "ecc_sbe_isolated", "host": gi // G, "gpu": gi % G, "link": None, "t0": t, "t1": t, "params": {}}
        )
    rng = substream(seed, "aer-corrected")
    for _ in range(int(rng.poisson(rates["aer_corrected_per_gpu_day"] / 86_400.0 * H * G * D))):
        gi, t = int(rng.integers(H * G)), float(rng.uniform(0.0, D))
        out.append(
            {"type": "pcie_aer_corrected", "host": gi // G, "gpu": gi % G, "link": None, "t0": t, "t1": t, "params": {}}
        )
    rng = substream(seed, "driver-reloads")
    for _ in range(int(rng.poisson(rates["driver_reloads_per_host_day"] / 86_400.0 * H * D))):
        h, t = int(rng.integers(H)), float(rng.uniform(0.0, D))
        out.append({"type": "driver_reload", "host": h, "gpu": None, "link": None, "t0": t, "t1": t, "params": {}})
    return out


def _finish(raw: list[dict], host_names: list[str], start_ts: float, job: str) -> Plan:
    """Assign ids (f001.. faults, c001.. conditions, in time order) and build the labels."""

    def key(e: dict) -> tuple:
        return (e["t0"], e["type"], -1 if e["host"] is None else e["host"], -1 if e["gpu"] is None else e["gpu"])

    raw = sorted(raw, key=key)
    events: list[Event] = []
    nf = nc = 0
    for e in raw:
        if TYPES[e["type"]].fault:
            nf += 1
            eid = f"f{nf:03d}"
        else:
            nc += 1
            eid = f"c{nc:03d}"
        events.append(
            Event(
                id=eid,
                type=e["type"],
                host=e["host"],
                gpu=e["gpu"],
                link=e["link"],
                t0=float(e["t0"]),
                t1=float(e["t1"]),
                params=_plain(e["params"]),
            )
        )
    labels = []
    for ev in events:
        kind = TYPES[ev.type]
        labels.append(
            {
                "id": ev.id,
                "fault": ev.type if kind.fault else None,
                "family": kind.family,
                "condition": None if kind.fault else ev.type,
                "host": None if ev.host is None else host_names[ev.host],
                "gpu": ev.gpu,
                "link": ev.link,
                "job": job,
                "onset": round(start_ts + ev.t0, 3),
                "end": round(start_ts + ev.t1, 3),
                "params": dict(ev.params),
            }
        )
    return Plan(events=events, labels=labels)


def _plain(params: dict[str, Any]) -> dict[str, Any]:
    """JSON-friendly params: numpy scalars to Python, floats rounded for byte-stable output."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, (bool, np.bool_)):
            out[k] = bool(v)
        elif isinstance(v, (int, np.integer)):
            out[k] = int(v)
        elif isinstance(v, (float, np.floating)):
            out[k] = round(float(v), 6)
        else:
            out[k] = v
    return out
