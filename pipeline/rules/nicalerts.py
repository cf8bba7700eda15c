"""What a NIC stage keeps to make its alerts: the bookkeeping the port checks (``ports.PortStage``)
and the NICs' AER checks (``nicaer.NicAerStage``) share, each stage keeping only its judging.

``NicAlerts`` holds a stage's records until the watermark passes them (``engine.hold.Hold``),
its entities (a port ``host/device/port``, a NIC ``host/device``: dense ids, each with its past),
one lifecycle per check, and the summary of each firing alert, kept by alert id so that its
resolved event says what the firing one said. ``event`` builds an ``AlertEvent`` from a
lifecycle's transition; ``to_state``/``load_state`` are the snapshot layout both stages write:
``version``, the entities' keys, ``past``, ``life``, ``pending``, ``summaries``, then the
stage's own keys.

>>> from pipeline.engine.lifecycle import Transition
>>> from pipeline.rules.portconfig import DEFAULTS
>>> book = NicAlerts("nic_aer", "nics", "NICs", [("pcie_aer_fatal", DEFAULTS["pcie_aer_fatal"])], dict, 10, ("ts",))
>>> nid = book.entity(("n1", "mlx5_0"))
>>> fired = book.event(DEFAULTS["pcie_aer_fatal"], Transition("firing", nid, 5.0, 5.0, 0), "n1/mlx5_0", "n1",
...                    {}, {"device": "mlx5_0"}, lambda: "fired")
>>> done = book.event(DEFAULTS["pcie_aer_fatal"], Transition("resolved", nid, 9.0, 5.0, 3), "n1/mlx5_0", "n1",
...                   {}, {"device": "mlx5_0"}, lambda: "other")
>>> (fired.id == done.id, done.summary, book.summaries)
(True, 'fired', {})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import msgspec
import numpy as np

from pipeline.engine.arrays import from_dict, to_dict
from pipeline.engine.alerts import transition_event
from pipeline.engine.lifecycle import Lifecycle, Transition
from pipeline.errors import StateError
from pipeline.engine.hold import Hold
from pipeline.rules.portconfig import PortCheck
from pipeline.schema import AlertEvent, NicRecord

K = TypeVar("K", bound=tuple)  # an entity's key: (host, device, port) or (host, device)
P = TypeVar("P")  # an entity's past, the stage's own
T = TypeVar("T")

STATE_VERSION = 1


class NicAlerts(Generic[K, P]):
    """A NIC stage's held records, entities, lifecycles and kept summaries (module docstring).

    ``stage`` names the stage in a ``StateError``; ``entities`` is the snapshot key of the
    entities' keys and ``noun`` their name in an error; ``checks`` get a lifecycle each;
    ``past`` makes a new entity's past; ``limit`` and ``order`` are the hold's.
    """

    def __init__(
        self,
        stage: str,
        entities: str,
        noun: str,
        checks: Iterable[tuple[str, PortCheck]],
        past: Callable[[], P],
        limit: int,
        order: tuple[str, ...],
    ) -> None:
        self.stage, self.entities, self.noun = stage, entities, noun
        self.life = {key: Lifecycle(c.for_s, c.keep_firing_for_s) for key, c in checks}
        self._past, self._limit, self._order = past, limit, order
        self.hold: Hold[NicRecord] = Hold(NicRecord, limit, order)
        self.ids: dict[K, int] = {}
        self.keys: list[K] = []
        self.pasts: list[P] = []
        self.summaries: dict[str, str] = {}  # alert id -> the firing event's summary, until it resolves

    def entity(self, key: K) -> int:
        """The dense id of ``key``, a new one (with a new past) the first time it is seen."""
        eid = self.ids.get(key)
        if eid is None:
            eid = self.ids[key] = len(self.keys)
            self.keys.append(key)
            self.pasts.append(self._past())
        return eid

    def step(self, key: str, ts: np.ndarray, ent: np.ndarray, cond: np.ndarray) -> list[Transition]:
        """Check ``key``'s lifecycle over rows of these entities; its transitions."""
        return self.life[key].step(ts, ent, cond, len(self.keys))

    def event(
        self,
        check: PortCheck,
        t: Transition,
        where: str,
        host: str,
        evidence: dict[str, Any],
        labels: dict[str, str],
        summary: Callable[[], str],
    ) -> AlertEvent:
        """The alert of ``check``'s transition ``t`` on entity ``where`` (its id's key). A firing
        one keeps ``summary()`` under its id; a resolved one says what its firing one said
        (``summary()`` when none was kept)."""
        return transition_event(
            t,
            rule=check.name,
            fault=check.fault,
            severity=check.severity,
            key=where,
            host=host,
            evidence=evidence,
            labels=labels,
            summary=summary,
            summaries=self.summaries,
        )

    # -- state ----------------------------------------------------------------------------------

    def to_state(self, past: Callable[[P], Any]) -> dict[str, Any]:
        """Plain data: the entities, their pasts (``past`` of each), the lifecycles, the held
        records (as JSON), the kept summaries; the stage adds its own keys after these."""
        return {
            "version": STATE_VERSION,
            self.entities: [list(k) for k in self.keys],
            "past": [past(p) for p in self.pasts],
            "life": {k: {n: to_dict(a) for n, a in lc.to_state().items()} for k, lc in self.life.items()},
            "pending": self.hold.to_state(),
            "summaries": dict(self.summaries),
        }

    def load_state(self, state: Any, key: Callable[[Any], K], past: Callable[[Any], P], more: Callable[[Any], T]) -> T:
        """Take back ``to_state``'s data: ``key`` and ``past`` read an entity's key and past,
        ``more`` the stage's own keys (its result is returned). A bad snapshot is a
        ``StateError`` naming the stage."""
        try:
            if state["version"] != STATE_VERSION:
                raise StateError(f"{self.stage} stage state version {state['version']!r}")
            keys = [key(k) for k in state[self.entities]]
            pasts = [past(d) for d in state["past"]]
            if len(keys) != len(pasts):
                raise StateError(f"{self.stage} stage state: {self.noun} and their pasts differ in number")
            for k, lc in self.life.items():
                if k in state["life"]:
                    lc.load_state({n: from_dict(a) for n, a in state["life"][k].items()})
            hold: Hold[NicRecord] = Hold(NicRecord, self._limit, self._order)
            hold.load_state(state["pending"])
            summaries = {str(k): str(v) for k, v in state["summaries"].items()}
            own = more(state)
        except (KeyError, TypeError, ValueError, msgspec.DecodeError) as e:
            raise StateError(f"{self.stage} stage state: {type(e).__name__}: {e}") from e
        self.keys, self.pasts, self.hold, self.summaries = keys, pasts, hold, summaries
        self.ids = {k: i for i, k in enumerate(keys)}
        return own


def public(evidence: dict[str, Any]) -> dict[str, Any]:
    """An alert's evidence: the sample's, less the keys a stage keeps for itself (``_`` first).

    >>> public({"_cond": {"x": True}, "gpus": [0]})
    {'gpus': [0]}
    """
    return {k: v for k, v in evidence.items() if not k.startswith("_")}


def gpus_label(gpus: list[int]) -> str:
    """The GPUs behind a NIC as an alert label.

    >>> gpus_label([0, 1])
    '0,1'
    """
    return ",".join(map(str, gpus))


__all__ = ["NicAlerts", "public", "gpus_label", "STATE_VERSION"]
