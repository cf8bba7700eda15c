"""Helpers of the incident tests: alert events built from a few parameters, and the stage fed
them in batches."""

from __future__ import annotations

from typing import Any, Iterable

from hypothesis import strategies as st

from pipeline.incidents import IncidentStage, default_config
from pipeline.incidents.events import IncidentEvent
from pipeline.incidents.stage import _comm, _Incident
from pipeline.schema import AlertEvent, encode, fault_family

T0 = 1764403200.0

# rule -> (fault, severity), as the shipped packs and the engine's absence checks name them
RULES = {
    "gpu_fallen_off_bus": ("gpu_fallen_off_bus", "critical"),
    "builtin_gpu_lost": ("gpu_lost", "critical"),
    "gpu_xid_critical": ("gpu_xid_critical", "critical"),
    "gpu_xid_warning": ("gpu_xid_warning", "warning"),
    "gpu_xid_repeated": ("gpu_xid_repeated", "warning"),
    "hbm_sbe_burst": ("hbm_ecc_burst", "warning"),
    "hbm_ecc_xid": ("hbm_ecc_xid", "critical"),
    "hbm_row_remap_pending": ("hbm_row_remap_pending", "warning"),
    "hbm_dbe": ("hbm_uncorrectable_error", "critical"),
    "nvlink_xid74": ("nvlink_xid74", "critical"),
    "nvlink_crc_errors": ("nvlink_crc_errors", "warning"),
    "nvlink_recoveries": ("nvlink_recovery_errors", "critical"),
    "nvlink_replays": ("nvlink_replay_errors", "warning"),
    "nvlink_error_rate": ("nvlink_error_rate_drift", "warning"),
    "nccl_comm_busbw": ("nccl_busbw_degraded", "warning"),
    "nccl_rank_straggler": ("nccl_straggler", "warning"),
    "gpu_cooling_degraded": ("thermal_cooling_degraded", "warning"),
    "gpu_thermal_throttling": ("thermal_throttling", "critical"),
    "builtin_telemetry_gap": ("telemetry_gap", "warning"),
    "pcie_replay_rate": ("pcie_replay_rate", "warning"),
    "pcie_aer_fatal": ("pcie_aer_fatal", "critical"),
    "pcie_aer_nonfatal": ("pcie_aer_nonfatal", "warning"),
    "network_port_down": ("network_port_down", "critical"),
    "network_link_errors": ("network_link_errors", "critical"),
    "network_port_flapping": ("network_port_flapping", "critical"),
    "nvlink_nvswitch_fatal_sxid": ("nvlink_nvswitch_fatal", "critical"),
}


def alert(
    rule: str,
    t: float,
    host: str = "n1",
    gpu: int | None = 0,
    *,
    state: str = "firing",
    id: str | None = None,
    started: float | None = None,
    **evidence: Any,
) -> AlertEvent:
    """An alert event of ``rule`` at T0 + ``t``; its id names the rule, place and start, so a
    ``resolved`` built with the same ``started`` pairs with its ``firing``."""
    fault, severity = RULES[rule]
    start = T0 + (t if started is None else started)
    labels = {k: str(evidence.pop(k)) for k in ("pod", "namespace", "GPU_I_ID", "GPU_I_PROFILE", "device", "port") if k in evidence}
    job = evidence.pop("job", None)
    return AlertEvent(
        id=id or f"{rule}/{host}/{gpu}/{start - T0:g}",
        state=state,
        fault=fault,
        severity=severity,
        rule=rule,
        host=host,
        gpu=gpu,
        job=job,
        ts=T0 + t,
        started_at=start,
        evidence=evidence,
        labels=labels,
    )


def resolved(a: AlertEvent, t: float) -> AlertEvent:
    """The ``resolved`` event of firing alert ``a`` at T0 + ``t``."""
    return AlertEvent(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "state": "resolved", "ts": T0 + t})


def run(alerts: Iterable[AlertEvent], batch: int = 1000, stage: IncidentStage | None = None) -> list[IncidentEvent]:
    """Feed ``alerts`` to a stage (the shipped config) ``batch`` at a time; every incident event."""
    st = stage or IncidentStage(default_config())
    items = list(alerts)
    out: list[IncidentEvent] = []
    for i in range(0, len(items), max(1, batch)):
        out += st.process(items[i : i + batch])
    return out


def wire(events: Iterable[IncidentEvent]) -> list[bytes]:
    """The events as their JSON lines: what two runs are compared on."""
    return [encode(e) for e in events]


HOUR = 3600.0


def two_open_incidents(host: str = "n1", other: str = "n2") -> list[AlertEvent]:
    """Alerts that leave two incidents open: on ``host`` GPU 0 the fifth XID 79 in 16 hours (the
    four before each opened and resolved an incident), escalated by ``xid79_repeat``; on
    ``other`` GPU 3 an SBE burst on a MIG instance, joined by a PCIe replay alert of its GPU
    (severity and action stay)."""
    out: list[AlertEvent] = []
    for i in range(5):
        a = alert("gpu_fallen_off_bus", i * 4 * HOUR, host, 0, id=f"x79-{i}", xid=79, job="train-7", pod="llm-0")
        out.append(a)
        if i < 4:
            out.append(resolved(a, i * 4 * HOUR + 600))
    t = 16 * HOUR
    out += [
        alert("hbm_sbe_burst", t + 60, other, 3, id="sbe-1", GPU_I_ID="2", GPU_I_PROFILE="1g.18gb"),
        alert("pcie_replay_rate", t + 90, other, 3, id="pcie-1"),
    ]
    return out


HOSTS = ("n1", "n2")
RULE_NAMES = sorted(RULES)


@st.composite
def alert_streams(draw):
    """Alerts of any rule on two hosts' GPUs, some resolved later, a few out of order, with XIDs."""
    out = []
    t = 0.0
    for i in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 5.0, 30.0, 200.0, 400.0, 4000.0]))
        rule = draw(st.sampled_from(RULE_NAMES))
        gpu = None if rule in ("nccl_comm_busbw", "builtin_telemetry_gap") else draw(st.integers(0, 2))
        ev = {"xid": draw(st.sampled_from([13, 79, 92]))} if "xid" in rule or rule == "gpu_fallen_off_bus" else {}
        if rule.startswith("nccl"):
            ev["comm"] = draw(st.sampled_from(["c1", "c2"]))
        late = draw(st.sampled_from([0.0, 0.0, 0.0, 20.0]))  # a model alert's ts is behind
        a = alert(rule, t - late, draw(st.sampled_from(HOSTS)), gpu, id=f"a{i}", **ev)
        out.append(a)
        if draw(st.booleans()):
            out.append(resolved(a, t + draw(st.sampled_from([10.0, 300.0, 900.0]))))
    # Resolutions go where their time puts them, as the engine emits them.
    return sorted(out, key=lambda a: a.ts)


class EveryIncident(IncidentStage):
    """The reference: the incident an alert joins, found by walking every open incident with the
    rule of docs/rules.md ("Incidents"), no index."""

    def _target(self, a: AlertEvent) -> _Incident | None:
        fam, window = fault_family(a.fault), self.config.join_window
        same = [
            inc
            for inc in self._open.values()
            if a.gpu is not None
            and (inc.host, inc.gpu) == (a.host, a.gpu)
            and (fam in inc.families or a.ts - inc.last_join <= window or self._explains(inc, a, None))
        ]
        if same:
            return max(same, key=lambda inc: (inc.opened_at, inc.id))
        live = [
            inc
            for inc in self._open.values()
            if (inc.firing or a.ts - inc.last_join <= window) and self._explains(inc, a, _comm(a))
        ]
        return max(live, key=lambda inc: (inc.last_join, inc.id), default=None)


# Rules of the feed's tests: host-level ones (no GPU) and the rest on a GPU; causes, their
# symptoms and rules that are neither (pipeline/incidents/hold.py).
HOST_LEVEL = ("nccl_comm_busbw", "builtin_telemetry_gap", "pcie_aer_fatal", "nvlink_nvswitch_fatal_sxid")


@st.composite
def feed_alerts(draw, rules: tuple[str, ...]):
    """Alerts of ``rules`` on two hosts at a few times (many at the same second), some resolved."""
    out = []
    for i in range(draw(st.integers(0, 30))):
        t = float(draw(st.integers(0, 12)))
        rule = draw(st.sampled_from(rules))
        gpu = None if rule in HOST_LEVEL else draw(st.integers(0, 2))
        a = alert(rule, t, draw(st.sampled_from(HOSTS)), gpu, id=f"a{i}")
        out.append(a)
        if draw(st.booleans()):
            out.append(resolved(a, t + draw(st.integers(0, 5))))
    return out


@st.composite
def feed_deliveries(draw, rules: tuple[str, ...]):
    """``feed_alerts``, some twice (an upstream replay), cut into batches released at increasing
    watermarks, each alert delivered no later than the release that passes its ts: (the alerts,
    the watermarks, the batches: one more than the watermarks, the last for the flush)."""
    items = draw(feed_alerts(rules))
    items = items + [a for a in items if draw(st.integers(0, 4)) == 0]
    marks = sorted(set(draw(st.lists(st.integers(0, 20), max_size=8))))
    waves: list[list] = [[] for _ in range(len(marks) + 1)]
    for a in draw(st.permutations(items)):
        due = next((i for i, m in enumerate(marks) if a.ts < T0 + m), len(marks))
        waves[draw(st.integers(0, due))].append(a)
    return items, [T0 + m for m in marks], waves
