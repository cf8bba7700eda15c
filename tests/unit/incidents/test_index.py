"""The incident stage's lookup indexes (pipeline/incidents/index.py) on their own: latest first,
ties to the greatest id, nothing of a removed incident found again, a heap rebuilt when mostly
stale answering as before, and no key left empty; against a plain list scanned in full."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.incidents.events import IncidentRoot
from pipeline.incidents.incident import _Incident
from pipeline.incidents.index import IncidentIndex
from tests.factories import fuzz_examples

COMM = "comm_cause"  # a ``reach: comm`` entry
HOST = "host_cause"  # any other
WINDOW = 5.0


def incident(
    id: str,
    t: float,
    host: str = "n1",
    gpu: int | None = None,
    *,
    rule: str = "r",
    comms: tuple[str, ...] = (),
    causes: tuple[str, ...] = (),
    firing: bool = True,
) -> _Incident:
    return _Incident(
        id=id,
        root=IncidentRoot(alert=id, rule=rule, fault="f"),
        host=host,
        gpu=gpu,
        opened_at=t,
        severity="warning",
        action="none",
        last_join=t,
        comms=set(comms),
        causes=set(causes),
        firing={f"{id}/a"} if firing else set(),
    )


def added(index: IncidentIndex, *incs: _Incident) -> IncidentIndex:
    """``incs`` added to ``index`` as the stage adds an incident it opens."""
    for inc in incs:
        index.add_gpu(inc)
        index.add_root(inc)
        index.add_causes(inc, inc.comms, inc.causes)
    return index


def keys(index: IncidentIndex) -> dict[str, int]:
    """How many keys each of ``index``'s tables holds."""
    names = ("_by_gpu", "_by_cause", "_by_comm", "_comm_heaps", "_by_root", "_root_heaps")
    return {n: len(getattr(index, n)) for n in names}


def test_comm_top_is_the_latest_joined_ties_to_the_greatest_id() -> None:
    a, b, c = (incident(i, t, comms=("c1",), causes=(COMM,)) for i, t in (("a", 10.0), ("c", 12.0), ("b", 12.0)))
    index = added(IncidentIndex([COMM]), a, b, c)
    assert index.comm_top("c1", COMM, 12.0, window=WINDOW, clock=12.0) is b  # "c" > "b" at 12
    b.last_join = 20.0
    index.enter_comms(b)  # an alert joined it
    assert index.comm_top("c1", COMM, 20.0, window=WINDOW, clock=20.0) is b
    b.firing.clear()  # its alerts resolved: still recent, then neither firing nor recent
    assert index.comm_top("c1", COMM, 25.0, window=WINDOW, clock=25.0) is b
    assert index.comm_top("c1", COMM, 26.0, window=WINDOW, clock=26.0) is c  # still firing
    assert index.comm_top("c2", COMM, 26.0, window=WINDOW, clock=26.0) is None


def test_an_entry_not_of_reach_comm_is_not_indexed_by_communicator() -> None:
    a = incident("a", 10.0, comms=("c1",), causes=(HOST,))
    index = added(IncidentIndex([COMM]), a)
    assert index.comm_top("c1", HOST, 10.0, window=WINDOW, clock=10.0) is None
    assert dict(index.by_cause("n1", HOST)) == {"a": a} and dict(index.by_cause("n2", HOST)) == {}


def test_behind_the_clock_comm_top_finds_what_the_heap_let_go() -> None:
    a = incident("a", 10.0, comms=("c1",), causes=(COMM,), firing=False)
    index = added(IncidentIndex([COMM]), a)
    assert index.comm_top("c1", COMM, 100.0, window=WINDOW, clock=100.0) is None  # popped
    assert index.comm_top("c1", COMM, 14.0, window=WINDOW, clock=100.0) is a  # recent at 14


def test_latest_root_is_the_latest_opened_host_level_incident_of_its_rule() -> None:
    a, b, c = incident("a", 10.0), incident("c", 20.0), incident("b", 20.0)
    gpu = incident("z", 30.0, gpu=0)  # on a GPU: no root index
    other = incident("y", 40.0, rule="other")
    index = added(IncidentIndex(), a, b, c, gpu, other)
    assert index.latest_root("n1", "r") is b  # "c" > "b" at 20
    index.remove(b)
    assert index.latest_root("n1", "r") is c
    index.remove(c)
    assert index.latest_root("n1", "r") is a and index.latest_root("n2", "r") is None
    assert index.latest_root("n1", "other") is other


def test_latest_root_is_per_component_its_root_names() -> None:
    port7, port4 = incident("p7", 10.0), incident("p4", 20.0)
    port7.where, port4.where = (("device", "mlx5_7"), ("port", "1")), (("device", "mlx5_4"), ("port", "1"))
    index = added(IncidentIndex(), port7, port4)
    assert index.latest_root("n1", "r", port7.where) is port7  # not the one opened later elsewhere
    assert index.latest_root("n1", "r") is None  # nothing rooted without a component
    index.remove(port7)
    assert index.latest_root("n1", "r", port7.where) is None and index.latest_root("n1", "r", port4.where) is port4


def test_an_id_opened_again_is_found_as_it_is_now() -> None:
    # Its incident resolved, the same id opens again, by a late alert before another's time: the
    # entry it left in the heap, above the other's, is not it any more.
    x, y = incident("x", 10.0), incident("y", 9.0)
    index = added(IncidentIndex(), x, y)
    index.remove(x)
    again = incident("x", 8.0)
    added(index, again)
    assert index.latest_root("n1", "r") is y
    index.remove(y)
    assert index.latest_root("n1", "r") is again


def test_a_removed_incident_is_never_found_again_and_leaves_no_key() -> None:
    a = incident("a", 10.0, comms=("c1", "c2"), causes=(COMM, HOST))
    b = incident("b", 11.0, gpu=3, comms=("c1",), causes=(COMM,))
    index = added(IncidentIndex([COMM]), a, b)
    assert list(index.on_gpu("n1", None)) == ["a"] and list(index.on_gpu("n1", 3)) == ["b"]
    index.remove(b)
    assert index.comm_top("c1", COMM, 11.0, window=WINDOW, clock=11.0) is a
    assert dict(index.on_gpu("n1", 3)) == {} and list(index.by_cause("n1", COMM)) == ["a"]
    index.remove(a)
    for comm in ("c1", "c2"):
        assert index.comm_top(comm, COMM, 11.0, window=WINDOW, clock=11.0) is None
        assert index.comm_top(comm, COMM, 10.0, window=WINDOW, clock=11.0) is None
    assert index.latest_root("n1", "r") is None and dict(index.by_cause("n1", HOST)) == {}
    assert keys(index) == dict.fromkeys(keys(index), 0)


def test_a_heap_mostly_stale_is_rebuilt_and_answers_the_same() -> None:
    keep = incident("keep", 0.0, gpu=0, comms=("c1",), causes=(COMM,))
    hot = incident("hot", 0.0, gpu=1, comms=("c1",), causes=(COMM,))
    index = added(IncidentIndex([COMM]), keep, hot)
    for t in range(1, 500):  # "hot" joined again and again: its earlier entries are stale
        hot.last_join = float(t)
        index.enter_comms(hot)
        assert len(index._comm_heaps[("c1", COMM)]) <= 2 * 2 + 32 + 1
    assert index.comm_top("c1", COMM, 499.0, window=WINDOW, clock=499.0) is hot
    hot.firing.clear()
    assert index.comm_top("c1", COMM, 600.0, window=WINDOW, clock=600.0) is keep  # still firing
    # Host-level incidents opened and resolved under one key, one old one staying open.
    old = incident("old", 0.0)
    added(index, old)
    for t in range(1, 500):
        added(index, incident(f"i{t}", float(t)))
        assert len(index._root_heaps[("n1", "r", ())]) <= 2 * 2 + 32 + 1
        top = index.latest_root("n1", "r")
        assert top is not None and top.id == f"i{t}"
        index.remove(top)  # resolved: its entry stays in the heap until it comes up
    assert index.latest_root("n1", "r") is old and list(index.on_gpu("n1", None)) == ["old"]


# -- against a plain list ----------------------------------------------------------------------

HOSTS = ("n1", "n2")
COMMS = ("c1", "c2")
CAUSES = (COMM, HOST)
ROOT_RULES = ("r1", "r2")

step = st.tuples(
    st.sampled_from(["open", "open", "join", "join", "quiet", "remove", "advance"]),
    st.integers(0, 9),  # which id or incident
    st.integers(0, 3),  # lateness: how far behind the clock, or how far it moves
    st.sets(st.sampled_from(COMMS)),
    st.sets(st.sampled_from(CAUSES)),
)


def same_answers(index: IncidentIndex, live: list[_Incident], clock: float, behind: float) -> None:
    """Every lookup of ``index`` gives what scanning ``live`` (in the order opened) gives."""
    for comm in COMMS:
        for at in (clock, behind):  # the heap answers at the clock, a scan behind it
            want = max(
                (i for i in live if COMM in i.causes and comm in i.comms and (i.firing or at - i.last_join <= WINDOW)),
                key=lambda i: (i.last_join, i.id),
                default=None,
            )
            assert index.comm_top(comm, COMM, at, window=WINDOW, clock=clock) is want
    for host in HOSTS:
        for rule in ROOT_RULES:
            roots = [i for i in live if i.gpu is None and i.host == host and i.root.rule == rule]
            assert index.latest_root(host, rule) is max(roots, key=lambda i: (i.opened_at, i.id), default=None)
        for gpu in (None, 0):
            assert list(index.on_gpu(host, gpu)) == [i.id for i in live if (i.host, i.gpu) == (host, gpu)]
        for cause in CAUSES:
            assert sorted(index.by_cause(host, cause)) == sorted(
                i.id for i in live if i.host == host and cause in i.causes
            )


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(st.lists(step, min_size=1, max_size=60))
def test_the_index_answers_as_a_plain_list_scanned_in_full(steps) -> None:
    index = IncidentIndex([COMM])
    live: list[_Incident] = []  # the reference: the open incidents in the order they opened
    clock = 0.0
    for n, (kind, k, late, comms, causes) in enumerate(steps):
        ts = max(0.0, clock - late)  # an alert may come behind the clock, also one that opens
        if kind == "open":
            iid = f"i{k}"  # an id may open again once its incident is gone
            if any(i.id == iid for i in live):
                continue
            gpu = 0 if k % 4 == 3 else None  # four host-level ones of one host and root rule: i0, i2, i4, i6
            inc = incident(iid, ts, HOSTS[k % 2], gpu, rule=ROOT_RULES[k // 8], firing=False)
            inc.last_join = 0.0  # as the stage opens one: its first alert joins it next
            index.add_gpu(inc)
            index.add_root(inc)
            live.append(inc)
            kind = "join"
        if kind == "join" and live:
            # As the stage's ``_add``: new causes, then a new communicator, then entered afresh.
            inc = live[k % len(live)]
            new = causes - inc.causes
            inc.causes |= new
            index.add_causes(inc, inc.comms, new)
            for comm in sorted(comms - inc.comms):
                inc.comms.add(comm)
                index.add_causes(inc, {comm}, inc.causes)
            inc.last_join = max(inc.last_join, ts)
            inc.firing.add(f"a{n}")
            index.enter_comms(inc)
        elif kind == "quiet" and live:  # its alerts resolved: no longer firing, not entered again
            live[k % len(live)].firing.clear()
        elif kind == "remove" and live:
            index.remove(live.pop(k % len(live)))
        elif kind == "advance":
            clock += (1.0, 2.0, 3.0, 7.0)[late]
        same_answers(index, live, clock, max(0.0, clock - 4.0))
    for inc in list(live):
        index.remove(inc)
    assert keys(index) == dict.fromkeys(keys(index), 0)
