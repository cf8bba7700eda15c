"""Faults drawn at the rate and mix Meta reported for Llama 3 405B pre-training.

Source: "The Llama 3 Herd of Models" (Meta, arXiv:2407.21783, July 2024), Table 5 -- root-cause
categorisation of the 419 unexpected interruptions during a 54-day snapshot of pre-training on
16,384 H100 80GB GPUs (466 interruptions in all, 47 planned):

    Component                        Category                 Interruptions  % of unexpected
    Faulty GPU                       GPU                      148            30.1 %
    GPU HBM3 Memory                  GPU                       72            17.2 %
    Software Bug                     Dependency                54            12.9 %
    Network Switch/Cable             Network                   35             8.4 %
    Host Maintenance                 Unplanned Maintenance     32             7.6 %
    GPU SRAM Memory                  GPU                       19             4.5 %
    GPU System Processor             GPU                       17             4.1 %
    NIC                              Host                       7             1.7 %
    NCCL Watchdog Timeouts           Unknown                    7             1.7 %
    Silent Data Corruption           GPU                        6             1.4 %
    GPU Thermal Interface + Sensor   GPU                        6             1.4 %
    SSD                              Host                       3             0.7 %
    Power Supply                     Host                       3             0.7 %
    Server Chassis                   Host                       2             0.5 %
    IO Expansion Board               Host                       2             0.5 %
    Dependency                       Dependency                 2             0.5 %
    CPU                              Host                       2             0.5 %
    System Memory                    Host                       2             0.5 %

(The paper's "Faulty GPU" count and percentage do not agree with each other; the percentages
are used here.) Only categories that show in GPU telemetry become faults; the rest are drawn and
dropped (thinning the Poisson process), except host maintenance, which silences the host
(``telemetry_gap``). "Faulty GPU" includes the GPU's PCIe path (``pcie_aer_fatal``) and the
host's NVSwitches (``nvswitch_fatal``) beside the GPU's own faults, and the IO expansion board
(the PCIe switch board of a Grand Teton host) is a PCIe fault. An NCCL watchdog timeout is a rank
hung in a collective (``hang_collective``, seen in the ranks' progress records). Network
switch/cable faults show on the hosts' InfiniBand ports (the ``nic`` source; Meta's fabric is
RoCE, whose ports the same records describe): a flapping cable (``network_link_flap``) or one
whose symbol errors drift up (``network_symbol_drift``); a NIC fault takes its port down
(``network_nic_down``).

Rate: 419 / (54 d * 86,400 s * 16,384 GPUs) = 5.48e-9 interruptions per GPU-second -- one every
~3 hours for the whole cluster, i.e. ~0.0006 in an hour on 32 GPUs. ``acceleration`` (default
12,000) scales it so that a 4-host, 1-hour run sees about five faults.
"""

from __future__ import annotations

import numpy as np

from .scenarios import FaultSpec

UNEXPECTED_INTERRUPTIONS = 419
SNAPSHOT_DAYS = 54
CLUSTER_GPUS = 16_384
RATE_PER_GPU_S = UNEXPECTED_INTERRUPTIONS / (SNAPSHOT_DAYS * 86_400 * CLUSTER_GPUS)

# (category, share %, [(fault type, weight within the category, params), ...]); [] = dropped.
MIX: tuple[tuple[str, float, list[tuple[str, float, dict]]], ...] = (
    (
        "Faulty GPU",
        30.1,
        [
            ("thermal_throttling", 1.0, {}),
            ("nvlink_degradation", 1.0, {}),
            ("nvlink_link_down", 1.0, {}),
            ("gpu_lost", 1.0, {}),
            ("nccl_straggler", 1.0, {}),
            # The GPU's interconnect beyond its own die: its PCIe path and the host's NVSwitches.
            ("pcie_aer_fatal", 1.0, {}),
            ("nvswitch_fatal", 1.0, {}),
        ],
    ),
    ("GPU HBM3 Memory", 17.2, [("hbm_ecc_burst", 1.0, {"memory": "hbm"})]),
    ("Software Bug", 12.9, []),
    ("Network Switch/Cable", 8.4, [("network_link_flap", 1.0, {}), ("network_symbol_drift", 1.0, {})]),
    ("Host Maintenance", 7.6, [("telemetry_gap", 1.0, {})]),
    ("GPU SRAM Memory", 4.5, [("hbm_ecc_burst", 1.0, {"memory": "sram", "escalate": True})]),
    ("GPU System Processor", 4.1, [("gpu_lost", 1.0, {"xid": 119})]),
    ("NIC", 1.7, [("network_nic_down", 1.0, {})]),
    ("NCCL Watchdog Timeouts", 1.7, [("hang_collective", 1.0, {})]),
    ("Silent Data Corruption", 1.4, []),
    (
        "GPU Thermal Interface + Sensor",
        1.4,
        [
            ("thermal_throttling", 1.0, {}),
            ("thermal_hbm_throttling", 1.0, {}),
        ],
    ),
    ("SSD", 0.7, []),
    ("Power Supply", 0.7, []),
    ("Server Chassis", 0.5, []),
    ("IO Expansion Board", 0.5, [("pcie_aer_fatal", 1.0, {})]),  # the PCIe switch board
    ("Dependency", 0.5, []),
    ("CPU", 0.5, []),
    ("System Memory", 0.5, []),
)


def expected_faults(n_gpus: int, duration: float, acceleration: float) -> float:
    """Expected number of interruptions (all categories, before dropping) in a run."""
    return RATE_PER_GPU_S * n_gpus * duration * acceleration


def draw(
    rng: np.random.Generator, n_gpus: int, duration: float, acceleration: float, random_duration
) -> list[FaultSpec]:
    """Draw the run's faults: a Poisson count, categories by Meta's shares, onsets uniform over
    the run (leaving the last minute or 10 % so each fault has time to show). Placement on hosts
    and GPUs (uniform, without overlap on one GPU) is done by the planner (``plan.py``). ``random_duration(type)`` gives
    the (min, max) seconds of a fault type, or None for "until the end of the run"."""
    lam = expected_faults(n_gpus, duration, acceleration)
    count = int(rng.poisson(lam))
    shares = np.array([m[1] for m in MIX])
    shares = shares / shares.sum()
    latest = max(duration - min(60.0, 0.1 * duration), 0.0)
    out: list[FaultSpec] = []
    for _ in range(count):
        _cat, _share, options = MIX[int(rng.choice(len(MIX), p=shares))]
        onset = float(rng.uniform(0.0, latest))
        if not options:
            continue
        w = np.array([o[1] for o in options])
        ftype, _w, params = options[int(rng.choice(len(options), p=w / w.sum()))]
        span = random_duration(ftype)
        dur = None if span is None else float(rng.uniform(*span))
        out.append(
            FaultSpec(
                type=ftype, onset=round(onset, 3), duration=None if dur is None else round(dur, 3), params={**params}
            )
        )
    return out
