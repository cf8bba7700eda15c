"""What detection speed buys: the share of a synchronous training job's wall time that is useful
training, given how fast (and how often wrongly) faults are detected.

The model (docs/evaluation.md, "Effective training time"):

* Faults arrive as a Poisson process while the job runs, at Meta's Llama 3 405B rate (419
  unexpected interruptions in 54 days on 16,384 GPUs, ``producers/sim/llama3.py``) scaled to the
  job's GPU count, in Meta's mix of causes. A synchronous job stops making progress at a fault.
* Each fault of family ``f`` is found after the detector's mean measured latency for ``f`` with
  probability ``recall_f``; otherwise the job hangs until the collective watchdog times out
  (PyTorch's ProcessGroupNCCL default: 10 minutes, pytorch/pytorch#110947).
* Causes outside GPU telemetry (software bugs, network, host parts other than maintenance) are
  the same for every detector: ``other_latency_s`` each (default 0: the job fails on its own).
* False alerts arrive at the measured rate per 1,000 GPU-hours times the job's GPUs; each drains
  a node and restarts the job, like a fault found at once.
* Every interruption costs ``restart_cost_s`` and rolls back to the last checkpoint; checkpoints
  are taken every ``checkpoint_interval_s`` of running time (their own cost is not modelled).

With interruptions at rate L = fault rate + false-alert rate, a run between two interruptions is
X ~ Exp(L); the work kept is the completed checkpoint intervals, E = T q / (1 - q) with
q = exp(-L T); a cycle's wall time is 1/L + restart + (fault share) x mean wait. The useful
fraction is E over the wall time of a cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.evaluation.score import Score
from pipeline.schema import fault_family

LLAMA3_JOB_GPUS = 16_384
WATCHDOG_TIMEOUT_S = 600.0  # PyTorch ProcessGroupNCCL default timeout (10 min), pytorch/pytorch#110947
OTHER = "other"  # causes no GPU-telemetry detector can see


def family_shares() -> dict[str, float]:
    """Each fault family's share of unexpected interruptions in Meta's Llama 3 mix (sums to 1);
    the simulator's mapping of causes to fault types (``producers/sim/llama3.py``)."""
    from producers.sim.llama3 import MIX

    total = sum(share for _cat, share, _opts in MIX)
    out: dict[str, float] = {}
    for _cat, share, options in MIX:
        if not options:
            out[OTHER] = out.get(OTHER, 0.0) + share / total
            continue
        wsum = sum(w for _t, w, _p in options)
        for ftype, w, _params in options:
            fam = fault_family(ftype)
            out[fam] = out.get(fam, 0.0) + share / total * w / wsum
    return out


@dataclass(frozen=True)
class Job:
    """A synchronous training job and what an interruption costs it."""

    gpus: int = LLAMA3_JOB_GPUS
    checkpoint_interval_s: float = 1800.0
    restart_cost_s: float = 600.0
    watchdog_timeout_s: float = WATCHDOG_TIMEOUT_S
    other_latency_s: float = 0.0
    fault_rate_per_gpu_s: float | None = None  # None: the Llama 3 rate

    @property
    def fault_rate_s(self) -> float:
        """Faults per second of running time for the whole job."""
        from producers.sim.llama3 import RATE_PER_GPU_S

        rate = RATE_PER_GPU_S if self.fault_rate_per_gpu_s is None else self.fault_rate_per_gpu_s
        return rate * self.gpus


@dataclass
class Detection:
    """A detector's measured figures: per family (recall, mean latency in s), false alerts."""

    name: str
    families: dict[str, tuple[float, float]]
    false_per_1000_gpu_h: float = 0.0
    unmeasured: list[str] = field(default_factory=list)  # families charged as never detected

    @classmethod
    def from_score(cls, score: Score, false_per_1000_gpu_h: float | None = None) -> "Detection":
        fams = {}
        for name, fs in score.families.items():
            if fs.injected:
                fams[name] = (fs.recall, fs.mean_latency if fs.detected else 0.0)
        fa = score.false_per_1000_gpu_h if false_per_1000_gpu_h is None else false_per_1000_gpu_h
        return cls(score.detector, fams, fa)


@dataclass
class Goodput:
    """Shares of wall time (they sum to 1) and interruption counts per day."""

    detector: str
    useful: float
    rollback: float  # work since the last checkpoint, redone
    restarts: float  # restart cost
    detecting: float  # faults found: waiting for the detector
    hung: float  # faults missed: waiting for the watchdog
    faults_per_day: float
    false_restarts_per_day: float
    unmeasured: list[str] = field(default_factory=list)


def expected_wait(job: Job, det: Detection, shares: dict[str, float] | None = None) -> tuple[float, float]:
    """Mean seconds a fault keeps the job stopped before a restart begins, split into (waiting
    for the detector, waiting for the watchdog on a missed fault)."""
    shares = shares or family_shares()
    det.unmeasured = []
    found = missed = 0.0
    for fam, p in shares.items():
        if fam == OTHER:
            found += p * job.other_latency_s
            continue
        if fam not in det.families:
            det.unmeasured.append(fam)
            missed += p * job.watchdog_timeout_s
            continue
        recall, latency = det.families[fam]
        found += p * recall * latency
        missed += p * (1.0 - recall) * job.watchdog_timeout_s
    return found, missed


def goodput(job: Job, det: Detection, shares: dict[str, float] | None = None) -> Goodput:
    """The share of wall time the job trains usefully, with ``det`` watching it."""
    lam = job.fault_rate_s
    phi = det.false_per_1000_gpu_h / 1000.0 * job.gpus / 3600.0
    total = lam + phi
    found, missed = expected_wait(job, det, shares)
    if total <= 0:
        return Goodput(det.name, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, list(det.unmeasured))
    T = job.checkpoint_interval_s
    q = math.exp(-total * T)
    kept = T * q / (1.0 - q) if q < 1.0 else 1.0 / total
    fault_share = lam / total
    cycle = 1.0 / total + job.restart_cost_s + fault_share * (found + missed)
    day = 86_400.0
    cycles_per_day = day / cycle
    return Goodput(
        det.name,
        useful=kept / cycle,
        rollback=(1.0 / total - kept) / cycle,
        restarts=job.restart_cost_s / cycle,
        detecting=fault_share * found / cycle,
        hung=fault_share * missed / cycle,
        faults_per_day=cycles_per_day * fault_share,
        false_restarts_per_day=cycles_per_day * (1.0 - fault_share),
        unmeasured=list(det.unmeasured),
    )


def references(families: list[str] | None = None) -> list[Detection]:
    """Two yardsticks: no detector at all (every fault waits for the watchdog) and an ideal one
    (every fault found at once, never a false alert)."""
    families = families if families is not None else [f for f in family_shares() if f != OTHER]
    return [
        Detection("watchdog only", {f: (0.0, 0.0) for f in families}),
        Detection("ideal (0 s)", {f: (1.0, 0.0) for f in families}),
    ]
