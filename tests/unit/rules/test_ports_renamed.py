"""A port renamed by a driver reload (``mlx5_0`` -> ``mlx5_4``) is the same port: its
``port_guid`` says so. ``port_lost`` of the old name resolves when the new name reports the GUID,
the old name is no longer tracked (its producer's absent records raise nothing), a port with no
GUID match stays lost, and records without GUIDs are judged as before."""

from __future__ import annotations

import msgspec

from pipeline.engine import Engine, EngineConfig
from pipeline.rules.portconfig import parse_port_config
from pipeline.rules.ports import PortStage
from pipeline.schema import NIC_ABSENT_LABEL, NicRecord, dcgm
from tests.factories import T0
from tests.unit.rules.factories import port_series, run_ports

G = {"mlx5_0": "0x0c42a10300a1b2c0", "mlx5_1": "0x0c42a10300a1b2c1", "mlx5_2": "0x0c42a10300a1b2c2"}
RELOAD, BACK, END = 100, 200, 600  # the old names go at RELOAD, the new ones report from BACK


def _absent(t: float, device: str, host: str = "n1", gpus: list[int] | None = None) -> NicRecord:
    return NicRecord(ts=T0 + t, host=host, device=device, port=1, gpus=gpus or [], labels={NIC_ABSENT_LABEL: "1"})


def _at(recs: list[NicRecord], lo: float, hi: float) -> list[NicRecord]:
    return [r for r in recs if lo <= r.ts - T0 < hi]


def _reload(renames: dict[str, str], guids: dict[str, str | None] | None = None, end: float = END) -> list[NicRecord]:
    """Host n1's ports mlx5_0..2 every 10 s; at RELOAD the ports of ``renames`` go (sent as absent
    from then on, as ``produce ib-sysfs`` does) and from BACK report under their new names, with the
    GUIDs of ``guids`` (device -> GUID, None: none; default ``G`` and each new name its old one's)."""
    guids = dict(G) if guids is None else guids
    for old, new in renames.items():
        guids.setdefault(new, guids.get(old))
    recs: list[NicRecord] = []
    for dev in G:
        series = port_series(end, device=dev, port_guid=guids.get(dev))
        recs += series if dev not in renames else _at(series, 0, RELOAD)
    for old, new in renames.items():
        recs += [_absent(t, old) for t in range(RELOAD, int(end), 10)]
        recs += _at(port_series(end, device=new, port_guid=guids.get(new)), BACK, end)
    return sorted(recs, key=lambda r: (r.ts, r.device))


def _lost(alerts: list) -> list[tuple[str, str, float]]:
    return [(a.state, a.labels["device"], a.ts - T0) for a in alerts if a.rule == "network_port_lost"]


def test_a_driver_reload_that_renames_two_ports_resolves_their_port_lost_when_the_new_names_report():
    alerts, _ = run_ports(_reload({"mlx5_0": "mlx5_4", "mlx5_1": "mlx5_5"}))
    lost = _lost(alerts)
    fired = {dev for state, dev, t in lost if state == "firing" and RELOAD < t < BACK}
    assert fired == {"mlx5_0", "mlx5_1"}  # the page the reload raised
    assert sorted(x for x in lost if x[0] == "resolved") == [
        ("resolved", "mlx5_0", float(BACK)), ("resolved", "mlx5_1", float(BACK))]  # fmt: skip
    assert len(lost) == 4  # never again for the old names, though their absent records go on
    done = {a.labels["device"]: a for a in alerts if a.rule == "network_port_lost" and a.state == "resolved"}
    assert done["mlx5_0"].evidence["resolved_by"] == "renamed"
    assert done["mlx5_0"].evidence["renamed_to"] == {"device": "mlx5_4", "port": 1}
    assert done["mlx5_1"].evidence["renamed_to"] == {"device": "mlx5_5", "port": 1}
    assert done["mlx5_1"].evidence["port_guid"] == G["mlx5_1"]
    firing = {a.labels["device"]: a for a in alerts if a.rule == "network_port_lost" and a.state == "firing"}
    assert done["mlx5_0"].id == firing["mlx5_0"].id


def test_the_rename_resolves_alike_however_the_stream_is_cut():
    recs = _reload({"mlx5_0": "mlx5_4", "mlx5_1": "mlx5_5"})
    whole = _lost(run_ports(recs)[0])
    assert [x[0] for x in whole].count("resolved") == 2
    for batch in (1, 4, 7):
        assert _lost(run_ports(recs, batch=batch)[0]) == whole


def test_a_port_truly_lost_still_fires_and_stays_beside_a_renamed_one():
    # mlx5_0 comes back as mlx5_4; mlx5_1 never does: its alert stays open.
    alerts, _ = run_ports(_one_gone())
    lost = _lost(alerts)
    assert ("resolved", "mlx5_0", float(BACK)) in lost
    assert [x[:2] for x in lost if x[1] == "mlx5_1"] == [("firing", "mlx5_1")]


def _one_gone() -> list[NicRecord]:
    """mlx5_0 renamed to mlx5_4 at BACK; mlx5_1 gone at RELOAD for good (sent as absent)."""
    recs = [r for r in _reload({"mlx5_0": "mlx5_4"}) if r.device != "mlx5_1" or r.ts - T0 < RELOAD]
    recs += [_absent(t, "mlx5_1") for t in range(RELOAD, END, 10)]
    return sorted(recs, key=lambda r: (r.ts, r.device))


def test_a_new_port_with_another_guid_is_no_rename():
    # A new name whose GUID is not the lost port's (another HCA, a spare cabled in): still lost.
    guids: dict[str, str | None] = {**G, "mlx5_4": "0x0c42a10300ffff00"}
    lost = _lost(run_ports(_reload({"mlx5_0": "mlx5_4"}, guids))[0])
    assert [x[:2] for x in lost] == [("firing", "mlx5_0")]


def test_without_guids_the_old_names_stay_lost_as_before():
    guids: dict[str, str | None] = {d: None for d in (*G, "mlx5_4", "mlx5_5")}
    lost = _lost(run_ports(_reload({"mlx5_0": "mlx5_4", "mlx5_1": "mlx5_5"}, guids))[0])
    assert sorted(x[:2] for x in lost) == [("firing", "mlx5_0"), ("firing", "mlx5_1")]


def test_guids_that_are_not_a_normalised_guid_match_nothing():
    # A third-party producer's junk (all zero, upper case, not hex) is no identity.
    for junk in ("0x0000000000000000", "0X0C42A10300A1B2C0", "not-a-guid", ""):
        guids: dict[str, str | None] = {**G, "mlx5_0": junk, "mlx5_4": junk}
        lost = _lost(run_ports(_reload({"mlx5_0": "mlx5_4"}, guids))[0])
        assert [x[:2] for x in lost] == [("firing", "mlx5_0")], junk


def test_a_port_seen_before_that_takes_a_lost_ports_guid_is_no_rename():
    # Only a name seen for the first time can be the lost port's new one.
    # mlx5_0 goes quiet at RELOAD and mlx5_2 reports its GUID only from BACK, both seen before.
    recs = [r for r in _reload({}) if not (r.device == "mlx5_0" and r.ts - T0 >= RELOAD)]
    recs += [_absent(t, "mlx5_0") for t in range(RELOAD, END, 10)]
    recs = [msgspec.structs.replace(r, port_guid=G["mlx5_0"]) if r.device == "mlx5_2" and r.ts - T0 >= BACK else r
            for r in recs]  # fmt: skip
    lost = _lost(run_ports(sorted(recs, key=lambda r: (r.ts, r.device)))[0])
    assert [x[:2] for x in lost] == [("firing", "mlx5_0")]


def _stage() -> tuple[Engine, PortStage]:
    cfg, _ = parse_port_config("")
    stage = PortStage(cfg)
    return Engine(EngineConfig(), row_checks=[], tick_checks=[], stages=[stage]), stage


def test_a_snapshot_keeps_the_guids_and_the_renames():
    recs = _reload({"mlx5_0": "mlx5_4", "mlx5_1": "mlx5_5"})
    whole = _lost(run_ports(recs)[0])
    assert [x[0] for x in whole].count("resolved") == 2
    for cut in (BACK - 30, BACK + 50):  # port_lost firing, then the old names retired
        eng, stage = _stage()
        first, _ = run_ports(_at(recs, 0, cut), engine=eng, flush=False)
        state = msgspec.msgpack.decode(msgspec.msgpack.encode(stage.to_state()))  # as the service stores it
        held = msgspec.json.decode(state["pending"], type=list[NicRecord])
        assert {r.port_guid for r in held if not r.labels} >= {G["mlx5_2"]}  # the held records keep theirs
        eng2, stage2 = _stage()
        stage2.load_state(state)
        rest, _ = run_ports(_at(recs, cut, END), engine=eng2)
        assert _lost(first + rest) == whole, cut


def test_a_snapshot_from_before_guids_loads_and_judges_the_old_way():
    recs = _reload({"mlx5_0": "mlx5_4", "mlx5_1": "mlx5_5"})
    eng, stage = _stage()
    first, _ = run_ports(_at(recs, 0, BACK - 30), engine=eng)
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(stage.to_state()))  # as the service stores it
    old = {k: v for k, v in state.items() if k in ("version", "ports", "past", "life", "pending", "summaries",
                                                   "hosts", "models", "n_gpus", "polls")}  # fmt: skip
    assert old != state  # the stage writes more than an old snapshot has
    eng2, stage2 = _stage()
    stage2.load_state(old)
    rest, _ = run_ports(_at(recs, BACK - 30, END), engine=eng2)
    # The old names' GUIDs are not in that snapshot: they stay lost, as before this change.
    assert sorted(x[:2] for x in _lost(first + rest)) == [("firing", "mlx5_0"), ("firing", "mlx5_1")]


def test_a_renamed_compute_port_is_counted_once_for_active_ports():
    # An H100 node needs 8 ports at 400 Gb/s: 4 with GPUs behind them, 4 without. With fewer
    # than 8 named with GPUs every port counts; the reload renames the 4 compute ports, and had
    # the old names stayed among them, 8 "compute" ports would count only the 4 live ones.
    end = 900
    recs: list = [dcgm(T0 + t, "n1", g, {"gpu_temp": 60}, model="NVIDIA H100 80GB HBM3")
                  for t in range(0, end, 10) for g in range(4)]  # fmt: skip
    for p in range(4):
        old, new, guid = f"mlx5_{p}", f"mlx5_{p + 4}", f"0x0c42a10300a1b2d{p}"
        series = port_series(end, device=old, gpus=[p], port_guid=guid)
        recs += _at(series, 0, RELOAD) + [_absent(t, old, gpus=[p]) for t in range(RELOAD, end, 10)]
        recs += _at(port_series(end, device=new, gpus=[p], port_guid=guid), BACK, end)
    for p in range(8, 12):
        recs += port_series(end, device=f"mlx5_{p}", port_guid=f"0x0c42a10300a1b2e{p - 8}")
    alerts, _ = run_ports(sorted(recs, key=lambda r: r.ts))
    assert [a for a in alerts if a.rule == "network_active_ports_low"] == []
    lost = [(a.state, a.labels["device"]) for a in alerts if a.rule == "network_port_lost"]
    assert sorted(lost) == sorted((s, f"mlx5_{p}") for p in range(4) for s in ("firing", "resolved"))


def test_a_renamed_port_resolves_at_once_whatever_keep_firing_for_says():
    recs = _reload({"mlx5_0": "mlx5_4"})
    alerts, _ = run_ports(recs, config_text="port_lost:\n  keep_firing_for: 10m\n")
    assert [x for x in _lost(alerts) if x[0] == "resolved"] == [("resolved", "mlx5_0", float(BACK))]


def test_a_name_renamed_back_is_that_port_again():
    # A second reload gives the port its first name back: mlx5_4's silence resolves nothing
    # firing, and neither name is left lost.
    recs = [r for r in _reload({"mlx5_0": "mlx5_4"}) if not (r.device == "mlx5_4" and r.ts - T0 >= 400)]
    recs = [r for r in recs if not (r.device == "mlx5_0" and r.ts - T0 >= 400)]
    recs += [r for r in port_series(END, device="mlx5_0", port_guid=G["mlx5_0"]) if r.ts - T0 >= 400]
    recs += [_absent(t, "mlx5_4") for t in range(400, END, 10)]
    recs.sort(key=lambda r: (r.ts, r.device))
    lost = _lost(run_ports(recs)[0])
    assert sorted(x[:2] for x in lost) == [("firing", "mlx5_0"), ("resolved", "mlx5_0")]
    for batch in (1, 3, 8):  # the rename and the return in one batch or in many
        assert _lost(run_ports(recs, batch=batch)[0]) == lost
