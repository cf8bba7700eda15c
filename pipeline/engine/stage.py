"""What the engine runs each tick: an ordered list of stages (docs/architecture.md §2).

A *stage* is a set of row checks with whatever they share: the built-in row checks
(``CheckStage``), the online models (``pipeline.models.ModelSet``), the YAML rules
(``pipeline.rules.RuleSet``), or a stage of one's own. The engine knows stages only through
this protocol, so it never imports the rule language or the models (CONTRIBUTING.md, layer
rules). Per tick the engine folds the rows into the GPU state and asks each stage in order for
one condition per row of each of its checks; ``outputs`` carries what earlier stages published
for later ones (the models' scores, read by the rules' ``score()``). Deciding when a condition
becomes an alert stays the lifecycle's job.
"""

from __future__ import annotations

from typing import Any, Collection, Protocol, Sequence

import numpy as np

from pipeline.catalog import FIELDS
from pipeline.engine.checks import CheckMeta, RowCheck
from pipeline.engine.entities import Entities
from pipeline.engine.frame import NcclFrame
from pipeline.engine.state import View

#: ``outputs`` key under which the models publish their per-row scores of a tick
#: (``{model name: score per row}``, NaN before a model's warm-up).
MODEL_SCORES = "model_scores"


class StageCheck(Protocol):
    """A check a stage evaluates: its lifecycle's settings, and what its alerts say."""

    @property
    def meta(self) -> CheckMeta: ...

    def evidence(self, view: View, row: int) -> dict[str, Any]: ...

    def summary(self, host: str, gpu: int | None, evidence: dict[str, Any]) -> str: ...


class Stage(Protocol):
    """One step of the engine's tick.

    State is plain data: ``to_state()`` returns numbers, strings, bytes and lists/maps of them
    (msgpack-able; arrays through ``pipeline.engine.arrays``), kept in the engine's snapshot
    under ``state_key`` (None: the stage keeps no state), and ``load_state`` takes it back
    (None: the snapshot holds none for it); a bad one is a ``StateError``.
    """

    @property
    def kind(self) -> str:
        """What the stage is ("checks", "models", "rules", ...): one stage of each kind per engine."""
        ...

    @property
    def checks(self) -> Sequence[StageCheck]:
        """The checks it evaluates: each gets an alert lifecycle, by its unique name."""
        ...

    @property
    def columns(self) -> Collection[int]:
        """The catalog columns (``FIELDS``) it reads: only those are decoded and kept."""
        ...

    @property
    def reads_nccl(self) -> bool:
        """Whether it needs NCCL records' columns (``released``); without, they are only counted."""
        ...

    @property
    def state_key(self) -> str | None: ...

    def ingest(self, gpu: np.ndarray, records: Sequence[Any]) -> None:
        """DCGM records as they arrive (before the watermark releases them), with their GPU ids."""
        ...

    def released(self, nccl: NcclFrame) -> None:
        """NCCL records the watermark released (``reads_nccl`` stages only), before their ticks run."""
        ...

    def run(self, view: View, entities: Entities, outputs: dict[str, Any]) -> Sequence[tuple[StageCheck, np.ndarray]]:
        """One tick's rows: (check, condition per row) for each check; may publish to ``outputs``."""
        ...

    def finish(self) -> None:
        """After the engine has built the tick's alerts (evidence is read before state moves on)."""
        ...

    def advanced(self, upto: float, entities: Entities) -> None:
        """After a release: every row before ``upto`` has run (ticks without rows included), so
        a stage that keeps state by spans of event time may close the spans before it."""
        ...

    def to_state(self) -> Any: ...

    def load_state(self, state: Any) -> None: ...

    def adopt(self, old: Any) -> set[str]:
        """Take over what ``old`` (the stage this one replaces, on a reload) knew where its
        definition is unchanged; return the names of the checks whose alert state is kept."""
        ...


class NicReader(Protocol):
    """What a stage that ``reads_nic`` adds to ``Stage``: NIC port records handed over as they
    arrive, judged when the watermark passes them (the engine asks, ``Engine._release_nic``)."""

    def nic_arrived(self, records: Sequence[Any]) -> None: ...

    def nic_release(self, upto: float) -> list[Any]: ...


class NcclReader(Protocol):
    """What a stage that ``reads_nccl_records`` adds to ``Stage``: NCCL records handed over as
    they arrive (they go on to the other stages and the next stage of the topology as well),
    judged when the watermark passes them (``Engine._release_held``)."""

    def nccl_arrived(self, records: Sequence[Any]) -> None: ...

    def nccl_release(self, upto: float) -> list[Any]: ...


class Holding(Protocol):
    """What a ``NicReader`` or ``NcclReader`` with a bounded hold (``hold.Hold``) adds to
    ``Stage``: how many records it let go past its bound, the oldest first, since it was built
    or restored (``Engine.held_dropped`` reads it once a batch; absent: none counted)."""

    @property
    def dropped(self) -> int: ...


class Deferring(Protocol):
    """What a ``host_local`` stage with ``deferred`` checks adds to ``Stage``: their conditions
    on rows that ran before the other hosts' rows of their tick, judged once those have run."""

    @property
    def deferred(self) -> frozenset[str]: ...

    def run_deferred(self, view: View, entities: Entities) -> Sequence[tuple[StageCheck, np.ndarray]]: ...


class StageBase:
    """Defaults for a stage: reads no NCCL records, keeps no state, has no hooks; on a reload
    the checks whose lifecycle settings did not change keep their alert state."""

    kind = "stage"
    reads_nccl = False
    # Optional in the protocol (absent: False). True for a stage that judges NIC port records
    # (``nic_arrived``, ``nic_release``): the engine hands it those instead of only counting them.
    reads_nic = False
    # Optional in the protocol (absent: False). True for a stage that judges NCCL records as
    # records (``nccl_arrived``, ``nccl_release``, ``NcclReader``), not as ``released``'s columns.
    reads_nccl_records = False
    # Optional in the protocol (absent: False). True when every condition a stage computes for
    # a row reads only that GPU's own rows and state and its own host's rows of the tick: then
    # a live engine may run a host's rows of a tick before the other hosts' (Engine._release_hosts).
    host_local = False
    # Optional in the protocol (absent: none). The checks of a ``host_local`` stage whose
    # conditions read other hosts' records of the tick all the same (the NCCL models: a rank's
    # finding comes from its communicator's other ranks), by name, which is also the name of the
    # score the stage publishes for them: on rows that ran early (``View.early``) they are
    # neither judged nor published, and ``run_deferred`` judges them once the tick is whole.
    deferred: frozenset[str] = frozenset()
    # Optional in the protocol (absent: none). The published scores (``MODEL_SCORES``) its
    # conditions read: a stage that reads a ``deferred`` one keeps every host's rows of a tick
    # together (``Engine.host_local``).
    reads_scores: frozenset[str] = frozenset()
    state_key: str | None = None

    def ingest(self, gpu: np.ndarray, records: Sequence[Any]) -> None:
        """Nothing to learn from arriving records."""

    def released(self, nccl: NcclFrame) -> None:
        """NCCL records are not read."""

    def nic_arrived(self, records: Sequence[Any]) -> None:
        """NIC port records are not read."""

    def nic_release(self, upto: float) -> list[Any]:
        """No alerts from NIC port records: what the records before ``upto`` (inf: all) raise
        or resolve, as ``AlertEvent`` s, for a stage that ``reads_nic``."""
        return []

    def run_deferred(self, view: View, entities: Entities) -> Sequence[tuple[StageCheck, np.ndarray]]:
        """No ``deferred`` checks: nothing to judge late. A stage with some returns (check,
        condition per row) for each of them on ``view``: rows that ran early, the rest of their
        tick run since (``Engine._close_early``)."""
        return []

    def finish(self) -> None:
        """Nothing to do after a tick."""

    def advanced(self, upto: float, entities: Entities) -> None:
        """Nothing kept by spans of event time."""

    def to_state(self) -> Any:
        """No state."""
        return None

    def load_state(self, state: Any) -> None:
        """No state to take back."""

    def adopt(self, old: Any) -> set[str]:
        """Checks of ``old`` with the same settings keep their alert state."""
        mine: Sequence[StageCheck] = getattr(self, "checks", ())
        before = {c.meta.name: c.meta for c in getattr(old, "checks", ())}
        return {c.meta.name for c in mine if before.get(c.meta.name) == c.meta}


class CheckStage(StageBase):
    """The engine's row checks (``checks.builtin_checks``, or those given): stateless, each a
    condition per row straight from the view."""

    kind = "checks"
    host_local = True  # the built-in row checks read one row each

    def __init__(self, checks: Sequence[RowCheck]) -> None:
        self.checks: list[RowCheck] = list(checks)

    @property
    def columns(self) -> set[int]:
        """The columns of the fields the checks name."""
        return {FIELDS.require(a).column for c in self.checks for a in getattr(c, "fields", ())}

    def run(self, view: View, entities: Entities, outputs: dict[str, Any]) -> list[tuple[RowCheck, np.ndarray]]:
        """Each check's condition on the tick's rows."""
        return [(c, c.evaluate(view)) for c in self.checks]
