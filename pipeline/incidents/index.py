"""The incident stage's lookup indexes (``IncidentIndex``): where to look for the open incident an
alert joins. By (host, GPU); by (host, entry) and (communicator, ``reach: comm`` entry) for the
incidents that cause a ``causality`` entry; and host-level incidents by (host, root rule, the
component its root names: ``_Incident.where``). An alert
walks only those that may take it, never every incident of its host or communicator (many
bandwidth alerts, each its own incident, on one host or one job). Which one it joins is the
stage's decision (pipeline/incidents/stage.py); the index finds the candidates.

Two of them keep, per key, a heap of its incidents, latest first, lazily: an entry is current
while its incident is indexed under that key with the time it was entered at; any other entry is
dropped when it comes up, and a heap holding mostly such entries (more than twice as many as the
key's incidents, and 32) is rebuilt from the key's incidents. Ties go to the greatest id, as the
stage breaks them. Nothing of it is kept in the state: it is rebuilt from the incidents on load
(stagestate.py).
"""

from __future__ import annotations

import heapq
from typing import Any, Collection, Iterable, Mapping

from pipeline.incidents.incident import _Incident


class _Desc(str):
    """An id that sorts last first: the heaps' tie-break, the latest id on top as in the stage's
    ``_target``."""

    __slots__ = ()

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)


_Heap = list[tuple[float, _Desc, str]]
_Where = tuple[tuple[str, str], ...]
_RootKey = tuple[str | None, str, _Where]


class IncidentIndex:
    """The open incidents by where an alert may find them (see the module docstring). The stage
    adds an incident as it opens or takes a new cause or communicator, enters it afresh when an
    alert joins it, and removes it when it resolves.

    >>> from pipeline.incidents.events import IncidentRoot
    >>> from pipeline.incidents.incident import _Incident
    >>> def incident(id, ts):
    ...     return _Incident(id=id, root=IncidentRoot(alert=id, rule="nccl_comm_busbw", fault="f"), host="n1",
    ...                      gpu=None, opened_at=ts, severity="warning", action="none", last_join=ts,
    ...                      comms={"c1"}, causes={"straggler"})
    >>> index = IncidentIndex(comm_reach=["straggler"])
    >>> a, b = incident("a", 10.0), incident("b", 20.0)
    >>> for inc in (a, b):
    ...     index.add_gpu(inc); index.add_root(inc); index.add_causes(inc, inc.comms, inc.causes)
    >>> index.comm_top("c1", "straggler", 25.0, window=60.0, clock=25.0).id  # the latest joined
    'b'
    >>> index.latest_root("n1", "nccl_comm_busbw").id  # the latest opened
    'b'
    >>> index.remove(b)
    >>> index.comm_top("c1", "straggler", 25.0, window=60.0, clock=25.0).id, sorted(index.on_gpu("n1", None))
    ('a', ['a'])
    >>> print(index.comm_top("c1", "straggler", 100.0, window=60.0, clock=100.0))  # neither firing nor recent
    None
    """

    __slots__ = ("comm_reach", "_by_gpu", "_by_cause", "_by_comm", "_comm_heaps", "_by_root", "_root_heaps")

    def __init__(self, comm_reach: Iterable[str] = ()) -> None:
        # The ``causality`` entries of ``reach: comm``: an incident causing one is indexed under
        # each communicator it names too.
        self.comm_reach = frozenset(comm_reach)
        self._by_gpu: dict[tuple[str | None, int | None], dict[str, _Incident]] = {}
        self._by_cause: dict[tuple[str | None, str], dict[str, _Incident]] = {}
        self._by_comm: dict[tuple[str, str], dict[str, _Incident]] = {}
        # Per ``_by_comm`` key, its incidents by (last_join, id), latest first, kept lazily (an
        # entry is current while its incident is indexed there with that last_join): every one
        # of them explains what that entry explains, so the one an alert joins is the latest
        # still firing or recent, found at the top. A walk of them all cost each alert of a
        # communicator its thousands of straggler incidents (4,000 x 2,000 alerts: 113 s).
        self._comm_heaps: dict[tuple[str, str], _Heap] = {}
        # Host-level incidents (no GPU) by (host, root rule, where), with a heap of each key's latest
        # opened first (lazily kept, as ``_comm_heaps``): a host-level fault that recurs while its
        # incident is still open finds it there (``latest_root``).
        self._by_root: dict[_RootKey, dict[str, _Incident]] = {}
        self._root_heaps: dict[_RootKey, _Heap] = {}

    # -- adding ------------------------------------------------------------------------------

    def add_gpu(self, inc: _Incident) -> None:
        """Index ``inc`` by its (host, GPU) (``on_gpu``); a host-level incident under GPU None."""
        self._by_gpu.setdefault((inc.host, inc.gpu), {})[inc.id] = inc

    def add_root(self, inc: _Incident) -> None:
        """Index host-level incident ``inc`` by its host and root rule, on top of that key's heap
        unless one opened later is there (``latest_root``); an incident on a GPU is not indexed so."""
        if inc.gpu is not None:
            return
        key = (inc.host, inc.root.rule, inc.where)
        ids = self._by_root.setdefault(key, {})
        ids[inc.id] = inc
        heap = self._root_heaps.setdefault(key, [])
        heapq.heappush(heap, (-inc.opened_at, _Desc(inc.id), inc.id))
        if len(heap) > 2 * len(ids) + 32:  # mostly resolved incidents' entries: rebuilt
            heap[:] = [(-i.opened_at, _Desc(i.id), i.id) for i in ids.values()]
            heapq.heapify(heap)

    def add_causes(self, inc: _Incident, comms: Collection[str], causes: Collection[str]) -> None:
        """Index ``inc`` under each entry of ``causes`` on its host (``by_cause``), and, for a
        ``reach: comm`` entry, under each of ``comms``, entered in those keys' heaps at its
        ``last_join`` now (``comm_top``). ``inc.causes`` must hold ``causes`` by the time it is
        removed, and ``inc.comms`` ``comms``."""
        for name in causes:
            self._by_cause.setdefault((inc.host, name), {})[inc.id] = inc
            if name in self.comm_reach:
                for comm in comms:
                    self._by_comm.setdefault((comm, name), {})[inc.id] = inc
                self._enter(inc, [(comm, name) for comm in comms])

    def enter_comms(self, inc: _Incident) -> None:
        """Enter ``inc`` at its ``last_join`` now in the heap of each (communicator, entry) it is
        indexed under: after an alert joined it, so that ``comm_top`` finds it as it is now (its
        earlier entries are dropped when they come up)."""
        self._enter(inc, [(c, name) for name in inc.causes if name in self.comm_reach for c in inc.comms])

    def _enter(self, inc: _Incident, keys: Iterable[tuple[str, str]]) -> None:
        """Enter ``inc`` as it is now in the heaps of ``keys`` (``_comm_heaps``)."""
        for key in keys:
            heap = self._comm_heaps.setdefault(key, [])
            heapq.heappush(heap, (-inc.last_join, _Desc(inc.id), inc.id))
            ids = self._by_comm[key]
            if len(heap) > 2 * len(ids) + 32:  # mostly entries of earlier last_joins: rebuilt
                heap[:] = [(-i.last_join, _Desc(i.id), i.id) for i in ids.values()]
                heapq.heapify(heap)

    # -- finding -----------------------------------------------------------------------------

    def on_gpu(self, host: str | None, gpu: int | None) -> Mapping[str, _Incident]:
        """The incidents on (``host``, ``gpu``) by id, in the order they were added (GPU None:
        the host's host-level incidents); empty if none."""
        return self._by_gpu.get((host, gpu), {})

    def by_cause(self, host: str | None, cause: str) -> Mapping[str, _Incident]:
        """The incidents on ``host`` that cause ``causality`` entry ``cause``, by id, in the order
        they were added; empty if none."""
        return self._by_cause.get((host, cause), {})

    def comm_top(self, comm: str, cause: str, ts: float, *, window: float, clock: float) -> _Incident | None:
        """The latest (by last_join, then id) incident indexed under communicator ``comm`` and
        ``reach: comm`` entry ``cause`` that is still firing or joined within ``window`` of
        ``ts``; None if there is none.

        ``clock`` is at least every ``ts`` asked before (the stage's clock): at ``ts`` not behind
        it, the heap answers, and lets go for good the entries it passes on top (an incident
        neither firing nor recent stays so until an alert joins it, ``enter_comms``); behind it,
        the key's incidents are scanned instead."""
        ids = self._by_comm.get((comm, cause))
        if not ids:
            return None
        if ts < clock:
            # An alert behind the stage's clock: what the heap let go as neither firing nor
            # recent as of the clock may be recent for it.
            live = [inc for inc in ids.values() if inc.firing or ts - inc.last_join <= window]
            return max(live, key=lambda inc: (inc.last_join, inc.id), default=None)
        heap = self._comm_heaps.get((comm, cause), [])
        while heap:
            neg, _, iid = heap[0]
            inc = ids.get(iid)
            if inc is not None and inc.last_join == -neg:
                if inc.firing or ts - inc.last_join <= window:
                    return inc
                # Neither firing nor recent, and the clock only moves on: it can be taken again
                # only once an alert joins it, which enters it afresh (``enter_comms``).
            heapq.heappop(heap)
        return None

    def latest_root(self, host: str | None, rule: str, where: _Where = ()) -> _Incident | None:
        """The latest opened (then the greatest id) host-level incident on ``host`` rooted at an
        alert of ``rule`` naming the component ``where`` (``add_root``); None if there is none."""
        key = (host, rule, where)
        ids = self._by_root.get(key)
        heap = self._root_heaps.get(key)
        while ids and heap:
            neg, _, iid = heap[0]
            inc = ids.get(iid)
            if inc is not None and inc.opened_at == -neg:
                return inc
            heapq.heappop(heap)  # resolved (or its id opened again later: entered afresh)
        return None

    # -- removing ----------------------------------------------------------------------------

    def remove(self, inc: _Incident) -> None:
        """Take ``inc`` (resolved) out of every index, and each key with its last incident (its
        heap too): no key is left empty, and no lookup returns it again."""
        iid = inc.id
        _drop(self._by_gpu, (inc.host, inc.gpu), iid)
        if inc.gpu is None:
            key = (inc.host, inc.root.rule, inc.where)
            _drop(self._by_root, key, iid)
            if key not in self._by_root:
                del self._root_heaps[key]
        for name in inc.causes:
            _drop(self._by_cause, (inc.host, name), iid)
            for c in inc.comms if name in self.comm_reach else ():
                _drop(self._by_comm, (c, name), iid)
                if (c, name) not in self._by_comm:
                    del self._comm_heaps[(c, name)]


def _drop(index: dict[Any, dict[str, _Incident]], key: Any, iid: str) -> None:
    """Take incident ``iid`` out of ``index[key]``, and the key with its last incident."""
    ids = index[key]
    del ids[iid]
    if not ids:
        del index[key]
