"""The NIC's PCIe AER checks: a host-stage stage that judges the ``pcie_aer_*`` counters of NIC
records (``gpuwarden produce pcie-aer``), in event time, and makes ``pcie_aer_*`` alerts that name
the NIC (docs/rules.md#nic-ports).

The GPU's AER counters are catalogue fields judged by rules/pcie.yaml; a NIC is no GPU, so its
counters ride on its ``NicRecord`` and are judged here, with the same three checks: any increase
of a fatal or a non-fatal total (the NIC's own or its bridges'), and more corrected errors than
``threshold`` in ``window``. Settings are the ``pcie_aer_*`` keys of ``rules/fabric/ports.yaml``
(``pipeline.rules.portconfig``). A NIC is an entity of its own, ``host/device``; its alerts carry
the device, its PCI bus id and the GPUs behind it in ``labels``, the increases in ``evidence``.
Records are held until the engine's watermark passes them, as the port checks hold theirs, so
the alerts do not depend on how the stream was cut into batches.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from pipeline.engine.lifecycle import Transition
from pipeline.engine.stage import StageBase
from pipeline.recordchecks import MAX_COUNTER
from pipeline.rules.nicalerts import NicAlerts, gpus_label, public
from pipeline.rules.portconfig import AER_CHECKS, PortCheck, PortConfig
from pipeline.schema import AlertEvent, NicRecord

MAX_PENDING = 100_000  # NIC records waiting for the watermark; past it the oldest go first
_ORDER = ("ts", "host", "device")
_PREFIX = "pcie_aer_"


@dataclass
class _Nic:
    """One NIC's past: its counters' last values, its corrected errors within the window, the
    GPUs behind it and its PCI bus id."""

    prev: dict[str, int] = field(default_factory=dict)
    corrected: deque = field(default_factory=deque)  # (event time, corrected errors since the sample before)
    gpus: list[int] = field(default_factory=list)
    bus_id: str | None = None
    corrected_sum: int = 0  # sum of ``corrected``' errors

    def to_state(self) -> dict[str, Any]:
        return {"prev": self.prev, "cor": [list(c) for c in self.corrected], "gpus": self.gpus, "bus": self.bus_id}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "_Nic":
        corrected = deque((float(t), int(n)) for t, n in d["cor"])
        return cls(
            {str(k): int(v) for k, v in d["prev"].items()},
            corrected,
            [int(g) for g in d["gpus"]],
            None if d["bus"] is None else str(d["bus"]),
            sum(n for _, n in corrected),
        )


class NicAerStage(StageBase):
    """The NIC AER checks on NIC records that carry ``pcie_aer_*`` counters (module docstring).

    >>> from pipeline.rules.portconfig import PortConfig
    >>> st = NicAerStage(PortConfig())
    >>> st.nic_arrived([NicRecord(ts=1764403200.0 + 10 * t, host="n1", device="mlx5_0", port=1, gpus=[0, 1],
    ...                           counters={"pcie_aer_fatal": int(t >= 3)}) for t in range(6)])
    >>> [(a.state, a.rule, a.labels["device"], a.labels["gpus"]) for a in st.nic_release(1764403300.0)]
    [('firing', 'nic_pcie_aer_fatal', 'mlx5_0', '0,1')]
    """

    kind = "nic_aer"
    host_local = True  # a NIC is judged by its own host's records alone
    reads_nic = True
    state_key = "nic_aer"

    def __init__(self, config: PortConfig) -> None:
        self.config = config
        self.checks: list[Any] = []  # none of the engine's lifecycles: the stage keeps its own
        self.columns: set[int] = set()
        self._checks: list[tuple[str, PortCheck]] = [(k, c) for k, c in config.enabled() if k in AER_CHECKS]
        self._book: NicAlerts[tuple[str, str], _Nic] = NicAlerts(
            "nic_aer", "nics", "NICs", self._checks, _Nic, MAX_PENDING, _ORDER
        )

    # -- the engine's hooks ------------------------------------------------------------------

    def run(self, view: Any, entities: Any, outputs: dict[str, Any]) -> Sequence[tuple[Any, np.ndarray]]:
        """No DCGM rows are judged here."""
        return []

    @property
    def dropped(self) -> int:
        """Records the hold let go past its limit, the oldest first."""
        return self._book.hold.dropped

    def nic_arrived(self, records: Sequence[NicRecord]) -> None:
        """The NIC records that carry AER counters, held until the watermark passes them (the
        port records of ``ib-sysfs`` carry none and cost nothing here)."""
        if not self._checks:
            return
        self._book.hold.arrive(r for r in records if any(k.startswith(_PREFIX) for k in r.counters))

    def nic_release(self, upto: float) -> list[AlertEvent]:
        """Judge every held record older than ``upto`` (inf: all), in event time; their alerts."""
        go = self._book.hold.take(upto)
        return self._judge(go) if go else []

    # -- the checks ----------------------------------------------------------------------------

    def _judge(self, recs: list[NicRecord]) -> list[AlertEvent]:
        n = len(recs)
        ent = np.empty(n, np.int32)
        ts = np.fromiter((r.ts for r in recs), np.float64, n)
        conds = {key: np.zeros(n, bool) for key, _ in self._checks}
        evidence: list[dict[str, Any]] = []
        for i, r in enumerate(recs):
            nid = ent[i] = self._book.entity((r.host, r.device))
            ev = self._sample(self._book.pasts[nid], r)
            evidence.append(ev)
            for key, _ in self._checks:
                conds[key][i] = ev["_cond"][key]
        out: list[tuple[Transition, AlertEvent]] = []
        for key, c in self._checks:
            for t in self._book.step(key, ts, ent, conds[key]):
                out.append((t, self._alert(c, t, evidence[t.row])))
        out.sort(key=lambda ta: (ta[0].ts, ta[1].rule, ta[0].entity))
        return [a for _, a in out]

    def _sample(self, st: _Nic, r: NicRecord) -> dict[str, Any]:
        """Fold one record into its NIC's past; the checks' conditions and the evidence."""
        cfg = dict(self._checks)
        increased: dict[str, int] = {}
        for name, v in r.counters.items():
            if not name.startswith(_PREFIX):
                continue
            p = st.prev.get(name)
            if p is not None and v > p:
                increased[name] = v - p
            st.prev[name] = v  # a drop is a reset (reboot, hot-plug): the series restarts there; the first is history
        cond: dict[str, bool] = {}
        for key in ("pcie_aer_fatal", "pcie_aer_nonfatal"):
            if key in cfg:
                cond[key] = any(increased.get(c, 0) for c in cfg[key].counters)
        in_window = 0
        if "pcie_aer_correctable" in cfg:
            c = cfg["pcie_aer_correctable"]
            # The NIC's and its bridges' totals summed stop at 2^64-1, as each one does: a
            # snapshot holds no more (both may be read at 2^64-1: the decoder accepts it).
            cor = min(sum(increased.get(name, 0) for name in c.counters), MAX_COUNTER)
            if cor:
                st.corrected.append((r.ts, cor))
                st.corrected_sum += cor
            while st.corrected and st.corrected[0][0] <= r.ts - c.window_s:
                st.corrected_sum -= st.corrected.popleft()[1]
            in_window = st.corrected_sum
            cond["pcie_aer_correctable"] = in_window > c.threshold
        if r.gpus:
            st.gpus = list(r.gpus)
        st.bus_id = r.labels.get("pci_bus_id") or st.bus_id
        return {
            "_cond": cond,
            "increased": increased,
            "corrected_in_window": in_window,
            "totals": {k: v for k, v in r.counters.items() if k.startswith(_PREFIX)},
            "gpus": list(st.gpus),
        }

    def _alert(self, check: PortCheck, t: Transition, ev: dict[str, Any]) -> AlertEvent:
        host, device = self._book.keys[t.entity]
        st = self._book.pasts[t.entity]
        evidence = public(ev)
        labels = {"device": device}
        if st.bus_id:
            labels["pci_bus_id"] = st.bus_id
        if st.gpus:
            labels["gpus"] = gpus_label(st.gpus)
        return self._book.event(check, t, f"{host}/{device}", host, evidence, labels,
                                lambda: _summary(check, host, device, evidence))  # fmt: skip

    # -- state ----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain data: the NICs, their pasts, the lifecycles, the held records (as JSON)."""
        return self._book.to_state(_Nic.to_state)

    def load_state(self, state: Any) -> None:
        """Take back ``to_state``'s data (None: a snapshot from an engine without this stage)."""
        if state is None:
            return
        self._book.load_state(state, _key, _Nic.from_state, lambda _: None)


def _key(k: Any) -> tuple[str, str]:
    """A NIC's key from a snapshot: (host, device)."""
    host, device = k
    return str(host), str(device)


def _summary(check: PortCheck, host: str, device: str, ev: dict[str, Any]) -> str:
    where = f"NIC {device} on {host}"
    gpus = f"; GPUs {','.join(map(str, ev['gpus']))} behind it" if ev.get("gpus") else ""
    inc = ev.get("increased", {})
    if check.fault == "pcie_aer_correctable_rate":
        what = (
            f"counted {ev.get('corrected_in_window')} corrected PCIe AER errors at the NIC and the bridges above "
            f"it in {check.window_s / 60:g} minutes (more than {check.threshold:g})"
        )
    else:
        kind = "fatal" if check.fault == "pcie_aer_fatal" else "nonfatal"
        at, above = inc.get(f"pcie_aer_{kind}", 0), inc.get(f"pcie_aer_upstream_{kind}", 0)
        what = f"counted {'non-fatal' if kind == 'nonfatal' else 'fatal'} PCIe AER errors, {at} at the NIC and {above} at the bridges above it"
    return f"{where} {what}{gpus}"


__all__ = ["NicAerStage"]
