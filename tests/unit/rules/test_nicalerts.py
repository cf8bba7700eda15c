"""The NIC stages' alert bookkeeping (``pipeline.rules.nicalerts``): a resolved alert says what its
firing one said, entity ids are dense, and the snapshot layout both stages write (version 1:
``version``, the entities' keys, ``past``, ``life``, ``pending``, ``summaries``, the stage's
own keys) is the one they read back, a snapshot written by hand in that layout included."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from pipeline.engine.arrays import to_dict
from pipeline.engine.lifecycle import Transition, alert_id
from pipeline.errors import StateError
from pipeline.rules.nicaer import NicAerStage
from pipeline.rules.nicalerts import NicAlerts
from pipeline.rules.portconfig import DEFAULTS, PortConfig
from pipeline.rules.ports import PortStage
from pipeline.schema import NicRecord
from tests.factories import T0

FATAL = DEFAULTS["pcie_aer_fatal"]


def _book() -> NicAlerts:
    return NicAlerts("nic_aer", "nics", "NICs", [("pcie_aer_fatal", FATAL)], dict, 10, ("ts", "host", "device"))


def _event(book: NicAlerts, state: str, ts: float, summary: str):
    calls = []
    t = Transition(state, 0, ts, T0, 0)

    def text():
        calls.append(summary)
        return summary

    return book.event(FATAL, t, "n1/mlx5_0", "n1", {"x": 1}, {"device": "mlx5_0"}, text), calls


def test_a_resolved_alert_says_what_its_firing_one_said():
    book = _book()
    book.entity(("n1", "mlx5_0"))
    fired, _ = _event(book, "firing", T0, "first words")
    done, calls = _event(book, "resolved", T0 + 60, "other words")
    assert (fired.id, done.id) == (alert_id(FATAL.name, "n1/mlx5_0", T0),) * 2
    assert (fired.summary, done.summary, calls, book.summaries) == ("first words", "first words", [], {})
    assert (done.rule, done.fault, done.severity, done.host, done.started_at) == (
        "nic_pcie_aer_fatal", "pcie_aer_fatal", "critical", "n1", T0)
    # No summary kept (its firing event made by an engine before the snapshot's): its own words.
    again, calls = _event(book, "resolved", T0 + 60, "own words")
    assert (again.summary, calls) == ("own words", ["own words"])


def test_entities_get_dense_ids_and_a_past_each():
    book = _book()
    assert [book.entity(k) for k in [("n1", "a"), ("n2", "a"), ("n1", "a"), ("n1", "b")]] == [0, 1, 0, 2]
    assert book.keys == [("n1", "a"), ("n2", "a"), ("n1", "b")] and len(book.pasts) == 3


def test_the_state_comes_back_whole_and_a_bad_one_is_a_state_error():
    book = _book()
    book.entity(("n1", "mlx5_0"))
    book.pasts[0]["seen"] = 3
    book.hold.arrive([NicRecord(ts=T0, host="n1", device="mlx5_0", port=1)])
    book.step("pcie_aer_fatal", np.array([T0]), np.array([0], np.int32), np.array([True]))
    _event(book, "firing", T0, "kept")
    state = book.to_state(dict)
    assert list(state) == ["version", "nics", "past", "life", "pending", "summaries"]
    back = _book()
    assert back.load_state(state, tuple, dict, lambda s: "own") == "own"
    assert msgspec.msgpack.encode(back.to_state(dict)) == msgspec.msgpack.encode(state)
    assert back.ids == {("n1", "mlx5_0"): 0} and len(back.hold) == 1
    for bad, says in [({**state, "version": 2}, "nic_aer stage state version 2"),
                      ({**state, "past": []}, "nic_aer stage state: NICs and their pasts differ in number"),
                      ({**state, "pending": b"[{"}, "nic_aer stage state: DecodeError"),
                      ({k: v for k, v in state.items() if k != "summaries"}, "nic_aer stage state: KeyError")]:
        with pytest.raises(StateError, match=says):
            _book().load_state(bad, tuple, dict, lambda s: None)


def _life(firing_since: float | None) -> dict:
    """One entity's lifecycle arrays as a snapshot holds them: firing since ``firing_since``, or idle."""
    t = math.nan if firing_since is None else firing_since
    arrays = {"since": np.array([t]), "last_true": np.array([t]), "started": np.array([t]),
              "firing": np.array([firing_since is not None])}
    return {name: to_dict(a) for name, a in arrays.items()}


def _pending(*records: NicRecord) -> bytes:
    return msgspec.json.encode(list(records))


def test_a_ports_snapshot_in_the_version_1_layout_restores():
    aid = alert_id("network_port_down", "n1/mlx5_0/1", T0 + 5)
    state = {
        "version": 1,
        "ports": [["n1", "mlx5_0", 1]],
        "past": [{"seen": True, "up": 0, "down": True, "flaps": [], "errors": [], "prev": {}, "gpus": [0, 1],
                  "netdev": "ib0", "ll": "InfiniBand", "peer": {"peer": "leaf01"}, "rates": {}, "sums": {},
                  "polled": T0 + 6, "st": [1, 3]}],
        "life": {"port_down": _life(T0 + 5)},
        "pending": _pending(NicRecord(ts=T0 + 7, host="n1", device="mlx5_0", port=1, state=1, phys_state=3)),
        "summaries": {aid: "written before"},
        "hosts": [],
        "models": {},
        "n_gpus": 0,
        "polls": {"n1": [T0 + 6, 1.0, T0]},
    }
    stage = PortStage(PortConfig())
    stage.load_state(state)
    assert list(stage.to_state()) == list(state)
    assert stage.to_state()["summaries"] == {aid: "written before"} and stage.dropped == 0
    stage.nic_arrived([NicRecord(ts=T0 + 8, host="n1", device="mlx5_0", port=1, state=4, phys_state=5)])
    (a,) = stage.nic_release(math.inf)
    assert (a.id, a.state, a.ts, a.summary) == (aid, "resolved", T0 + 8, "written before")
    assert a.labels == {"device": "mlx5_0", "port": "1", "netdev": "ib0", "link_layer": "InfiniBand", "gpus": "0,1",
                        "peer": "leaf01"}  # fmt: skip


def test_a_nic_aer_snapshot_in_the_version_1_layout_restores():
    aid = alert_id("nic_pcie_aer_fatal", "n1/mlx5_0", T0 + 30)
    state = {
        "version": 1,
        "nics": [["n1", "mlx5_0"]],
        "past": [{"prev": {"pcie_aer_fatal": 1}, "cor": [], "gpus": [0, 1], "bus": "0000:05:00.0"}],
        "life": {"pcie_aer_fatal": _life(T0 + 30)},
        "pending": _pending(),
        "summaries": {aid: "written before"},
    }
    stage = NicAerStage(PortConfig())
    stage.load_state(state)
    assert list(stage.to_state()) == list(state)
    stage.nic_arrived([NicRecord(ts=T0 + 700, host="n1", device="mlx5_0", port=1, counters={"pcie_aer_fatal": 1})])
    (a,) = stage.nic_release(math.inf)
    assert (a.id, a.state, a.summary) == (aid, "resolved", "written before")
    assert a.labels == {"device": "mlx5_0", "pci_bus_id": "0000:05:00.0", "gpus": "0,1"}
