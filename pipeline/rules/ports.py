"""The NIC port checks: a host-stage stage that judges each InfiniBand/RoCE port by its own
``NicRecord``s, in event time, and makes ``network_*`` alerts (docs/rules.md#nic-ports).

The engine hands it port records as they arrive (``nic_arrived``) and, as its watermark moves,
asks for what the records before it say (``nic_release``): the stage sorts them into event
time and runs its checks port by port, each through an alert lifecycle (``for:``,
``keep_firing_for:``), so the alerts do not depend on how the stream was cut into batches.
Thresholds and severities are in ``rules/fabric/ports.yaml`` (``pipeline.rules.portconfig``).

A port is an entity of its own, ``host/device/port``; its alerts name the host, and carry the
device, port, netdev, the GPUs behind the NIC and the link partner (``peer*``, from the producer's
``--peers``) in ``labels``, and the rest in ``evidence``. One check is a
host's: ``active_ports`` counts the ports of each poll against what the host's GPU model needs,
the model learnt from the GPUs' DCGM records (``ingest``).

A port's name is the kernel's, and a driver reload (or a PCI rescan) may give the same HCA
another (``mlx5_0`` -> ``mlx5_4``); its GUID (``port_guid``) stays. A name seen for the first
time with the GUID of a port of its host that is silent is that port renamed: the old name's
``port_lost`` resolves (``resolved_by: renamed``) and the old name is judged no more.
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import Any, Iterable, Sequence

import numpy as np

from pipeline.engine.lifecycle import Transition
from pipeline.engine.stage import StageBase
from pipeline.recordchecks import MAX_COUNTER
from pipeline.rules import portrates
from pipeline.rules.nicalerts import NicAlerts, gpus_label, public
from pipeline.rules.portstate import PortPast
from pipeline.rules.portconfig import (
    AER_CHECKS,
    LOG_COUNTERS,
    RATE_CHECKS,
    SATURATES_AT,
    WINDOW_CHECKS,
    PortCheck,
    PortConfig,
)
from pipeline.rows import DcgmColumns
from pipeline.schema import NIC_ABSENT_LABEL, AlertEvent, NicRecord

ACTIVE, DOWN, INIT, ARMED = 4, 1, 2, 3
POLLING, DISABLED, LINK_ERROR_RECOVERY = 2, 3, 6
MAX_PENDING = 1_000_000  # port records waiting for the watermark; past it the oldest go first
_ORDER = ("ts", "host", "device", "port")
_STATE_CHECKS = ("port_down", "port_degraded")  # judged on the records that say the port's state
# What a training log's record says of its NCCL errors (producers/nccl_ib.py), carried into the evidence.
_NCCL_LABELS = ("peer", "peers", "status", "status_name", "opcode", "vendor_err", "direction", "event", "rank")
_GUID = re.compile(r"0x[0-9a-f]{16}")  # a normalised port GUID, as the shipped producers write it
_NO_GUID = "0x" + "0" * 16  # an unset GID 0: every such port would be one


class PortStage(StageBase):
    """Per-port checks on NIC records (see the module docstring); no DCGM columns, no row checks.

    >>> from pipeline.rules.portconfig import PortConfig
    >>> st = PortStage(PortConfig())
    >>> st.nic_arrived([NicRecord(ts=1764403200.0 + t, host="n1", device="mlx5_0", port=1, gpus=[0, 1],
    ...                           state=1 if t == 5 else 4, phys_state=3 if t == 5 else 5) for t in range(8)])
    >>> [(a.state, a.fault, a.labels["device"], a.labels["gpus"]) for a in st.nic_release(1764403300.0)]
    [('firing', 'network_port_down', 'mlx5_0', '0,1'), ('resolved', 'network_port_down', 'mlx5_0', '0,1')]
    """

    kind = "ports"
    host_local = True  # a port is judged by its own host's records alone
    reads_nic = True
    state_key = "ports"

    def __init__(self, config: PortConfig) -> None:
        self.config = config
        self.checks: list[Any] = []  # none of the engine's lifecycles: the stage keeps its own
        self.columns: set[int] = set()
        self._checks: list[tuple[str, PortCheck]] = [(k, c) for k, c in config.enabled() if k not in AER_CHECKS]
        self._book: NicAlerts[tuple[str, str, int], PortPast] = NicAlerts(
            "ports", "ports", "ports", self._checks, PortPast, MAX_PENDING, _ORDER
        )
        # ``active_ports`` is judged per host (its own entity ids) against its GPUs' model;
        # ``port_lost`` at each poll of the port's host.
        self._host_check = next(((k, c) for k, c in self._checks if k == "active_ports"), None)
        self._lost_check = next(((k, c) for k, c in self._checks if k == "port_lost"), None)
        # ``completion_errors`` speaks of events a log reports once: its alerts resolve by time.
        self._expiring = next(((k, c) for k, c in self._checks if k == "completion_errors"), None)
        self._port_checks = [(k, c) for k, c in self._checks if k not in ("active_ports", "port_lost")]
        self._polls: dict[str, list[float]] = {}  # host -> [last poll, poll step, back from a silence]
        self._host_ports: dict[str, list[int]] = {}  # host -> its polled ports' ids
        # host -> its ports ever named with GPUs behind them (the compute fabric's, for
        # ``active_ports``): remembered, so a compute port whose records stop still counts as one.
        self._gpu_ports: dict[str, set[int]] = {}
        cfg = config.checks
        self._watched = sorted(
            {n for k in ("link_errors", "completion_errors", *WINDOW_CHECKS) for n in cfg[k].counters}
        )
        self._rates = [(k, cfg[k]) for k in RATE_CHECKS if cfg[k].enabled]
        self._windows = [(k, cfg[k]) for k in WINDOW_CHECKS if k != "symbol_errors" and cfg[k].enabled]
        # The IBTA counters the checks read that stop at their width's maximum (portconfig.SATURATES_AT),
        # and for each check that reads any, those it reads: at the maximum a counter no longer
        # shows what happens, so such a check's verdict holds until the counter leaves it.
        counted = ("link_errors", "symbol_errors", *(k for k, _ in self._windows), *(k for k, _ in self._rates))
        self._capped = [
            (k, frozenset(n for n in cfg[k].counters if n in SATURATES_AT))
            for k in counted
            if cfg[k].enabled and any(n in SATURATES_AT for n in cfg[k].counters)
        ]
        self._tops = sorted({(n, SATURATES_AT[n]) for _, names in self._capped for n in names})
        self._host_ids: dict[str, int] = {}
        self._hosts: list[str] = []
        self._models: dict[str, str] = {}  # host -> its GPUs' model, from their DCGM records
        self._n_gpus = 0  # GPU ids seen: the engine's are dense, so a new one is >= this
        # Ports' GUIDs, to follow a port its driver renamed: port id -> its last GUID; (host, GUID)
        # -> the port id that last reported it; a retired old name -> (when, its new name's id).
        self._guid_of: dict[int, str] = {}
        self._by_guid: dict[tuple[str, str], int] = {}
        self._renamed: dict[int, tuple[float, int]] = {}
        self._back: dict[int, float] = {}  # retired names polled again in the batch judged: since when

    # -- the engine's hooks ------------------------------------------------------------------

    def run(self, view: Any, entities: Any, outputs: dict[str, Any]) -> Sequence[tuple[Any, np.ndarray]]:
        """No DCGM rows are judged here."""
        return []

    def ingest(self, gpu: np.ndarray, records: Sequence[Any]) -> None:
        """Learn each host's GPU model from its GPUs' first DCGM records: only GPUs new to the
        engine are looked at, so a batch costs one comparison per record."""
        if self._host_check is None or not len(gpu):
            return
        top = int(gpu.max())
        if top < self._n_gpus:
            return
        new = np.flatnonzero(gpu >= self._n_gpus).tolist()
        # Columns are read as columns: a record built per row cost more than the rest of a
        # start-up batch's ingest.
        if isinstance(records, DcgmColumns):
            pairs: Iterable[tuple[str, Any]] = ((records.hosts[i], records.models[i]) for i in new)
        else:
            pairs = ((r.host, getattr(r, "model", None)) for r in map(records.__getitem__, new))
        for host, model in pairs:
            if model and host not in self._models:
                self._models[host] = model
        self._n_gpus = top + 1

    @property
    def dropped(self) -> int:
        """Records the hold let go past its limit, the oldest first."""
        return self._book.hold.dropped

    def nic_arrived(self, records: Sequence[NicRecord]) -> None:
        """Port records the engine accepted, held until its watermark passes them."""
        self._book.hold.arrive(records)

    def nic_release(self, upto: float) -> list[AlertEvent]:
        """Judge every held record older than ``upto`` (inf: all), in event time; their alerts."""
        go = self._book.hold.take(upto)
        if not go:
            return self._expire(upto) if self._expiring is not None else []
        return self._judge(go, upto)

    # -- the checks ----------------------------------------------------------------------------

    def _expire(self, upto: float) -> list[AlertEvent]:
        """Resolve the event checks' alerts whose ``keep_firing_for`` ran out before ``upto``,
        with no record of their port since (a training log's errors come and nothing follows)."""
        _, check = self._expiring  # type: ignore[misc]
        trans = self._step_expiring(np.empty(0), np.empty(0, np.int32), np.empty(0, bool), upto)
        return [self._alert(check, t, {"expired": True}) for t in trans]

    def _step_expiring(self, ts: np.ndarray, ent: np.ndarray, cond: np.ndarray, upto: float) -> list[Transition]:
        """Step ``completion_errors``' lifecycle over its rows in event time, with a false row at
        each firing port's deadline (its last error plus ``keep_firing_for``) before ``upto``
        put where it falls among the rows, so the alert resolves then whatever the batching.
        A transition of a deadline row has ``row`` -1."""
        life = self._book.life[self._expiring[0]]  # type: ignore[index]
        n = len(self._book.keys)
        out: list[Transition] = []
        i = 0
        while True:
            life.reserve(n)
            firing = np.flatnonzero(life.firing[:n])
            due = life.last_true[firing] + life.keep_s
            d = float(due.min()) if len(firing) else math.inf
            # Up to the next deadline, and short of the first one an error in these rows sets.
            hit = np.flatnonzero(cond[i:])
            bound = min(d, float(ts[i + hit[0]]) + life.keep_s) if len(hit) else d
            j = int(np.searchsorted(ts, bound, side="left"))
            if j > i:  # the rows before the next deadline (an error among them moves it)
                out += [Transition(t.state, t.entity, t.ts, t.started_at, t.row + i)
                        for t in life.step(ts[i:j], ent[i:j], cond[i:j], n)]  # fmt: skip
                i = j
                continue
            if not d < upto:
                break
            gone = firing[due == d]
            out += [
                Transition(t.state, t.entity, t.ts, t.started_at, -1)
                for t in life.step(np.full(len(gone), d), gone.astype(np.int32), np.zeros(len(gone), bool), n)
            ]
        return out

    def _judge(self, recs: list[NicRecord], upto: float = math.inf) -> list[AlertEvent]:
        if not self._renamed and all(r.port_guid is None for r in recs):
            return self._judge_named(recs, upto, {})
        renames = self._renames(recs)
        if self._renamed:
            # A retired name's absent records (its producer still remembers it) say nothing more.
            ids = self._book.ids
            recs = [r for r in recs if not (_absent(r) and self._retired(ids[(r.host, r.device, r.port)], r.ts))]
        try:
            if not recs:
                return self._expire(upto) if self._expiring is not None else []
            return self._judge_named(recs, upto, renames)
        finally:
            for pid in self._back:
                del self._renamed[pid]
            self._back.clear()

    def _retired(self, pid: int, t: float) -> bool:
        """Whether port ``pid``'s name was retired at ``t`` (renamed before, not polled again yet)."""
        got = self._renamed.get(pid)
        return got is not None and got[0] <= t < self._back.get(pid, math.inf)

    def _judge_named(
        self, recs: list[NicRecord], upto: float, renames: dict[tuple[float, str], list[tuple[int, int, str]]]
    ) -> list[AlertEvent]:
        """The checks over ``recs`` (in event time), ``renames`` found in them (``_renames``)."""
        n = len(recs)
        ent = np.empty(n, np.int32)
        ts = np.fromiter((r.ts for r in recs), np.float64, n)
        lists: dict[str, list[bool]] = {key: [] for key, _ in self._port_checks}
        appends = [(key, lists[key].append) for key, _ in self._port_checks]
        polled = np.ones(n, bool)
        stated = np.ones(n, bool)
        evidence: list[dict[str, Any]] = []
        for i, r in enumerate(recs):
            pid = ent[i] = self._book.entity((r.host, r.device, r.port))
            polled[i] = _polled(r)
            stated[i] = r.state is not None or r.phys_state is not None
            ev = self._sample(self._book.pasts[pid], r)
            evidence.append(ev)
            cond = ev["_cond"]
            for key, add in appends:
                add(cond[key])
        if renames or self._back:
            # A renamed port is counted once among its host's compute ports: by its new name.
            moves = [(when, 0, old) for (when, _), got in renames.items() for old, _, _ in got]
            moves += [(when, 1, pid) for pid, when in self._back.items()]
            for _, back, pid in sorted(moves):
                if not back:
                    self._gpu_ports.get(self._book.keys[pid][0], set()).discard(pid)
                elif self._book.pasts[pid].gpus:
                    self._gpu_ports.setdefault(self._book.keys[pid][0], set()).add(pid)
        conds = {key: np.array(v, bool) for key, v in lists.items()}
        out: list[tuple[Transition, str, np.ndarray]] = []
        every = np.arange(n)
        only_polled = every if polled.all() else np.flatnonzero(polled)
        only_stated = every if stated.all() else np.flatnonzero(stated)
        for key, c in self._port_checks:
            # A training log's record speaks of its NCCL errors only, not of the port's state or
            # counters; one that says no state (a state file that did not read) is not a port
            # that is up: it neither resolves a down port nor restarts a degraded one's ``for:``.
            idx = every if key == "completion_errors" else only_stated if key in _STATE_CHECKS else only_polled
            if key == "completion_errors":
                out += [(t, key, idx) for t in self._step_expiring(ts[idx], ent[idx], conds[key][idx], upto)]
            elif len(idx):
                out += [(t, key, idx) for t in self._book.step(key, ts[idx], ent[idx], conds[key][idx])]
        alerts = [
            (t, self._alert(self.config.checks[key], t, evidence[idx[t.row]] if t.row >= 0 else {"expired": True}))
            for t, key, idx in out
        ]
        # The host's polls: its ports' own records, and the ones its producer says are gone.
        host_recs = recs if polled.all() else [r for r, p in zip(recs, polled) if p or _absent(r)]
        if self._host_check is not None and host_recs:
            alerts += self._judge_hosts(host_recs, *self._host_check)
        if self._lost_check is not None and host_recs:
            alerts += self._judge_lost(host_recs, *self._lost_check, renames)
        alerts.sort(key=lambda ta: (ta[0].ts, ta[1].rule, ta[1].host or "", ta[0].entity))
        return [a for _, a in alerts]

    def _renames(self, recs: list[NicRecord]) -> dict[tuple[float, str], list[tuple[int, int, str]]]:
        """Learn the ports' GUIDs from ``recs`` (in event time) and find the renamed ports: a name
        polled for the first time whose GUID a port of its host reported last, that port not in the
        same poll. Each such old name is retired (``_renamed``); a retired name polled again is a
        port of its own from then on. By poll (time, host): (old id, new id, GUID)."""
        out: dict[tuple[float, str], list[tuple[int, int, str]]] = {}
        book, pasts = self._book, self._book.pasts
        i, n = 0, len(recs)
        while i < n:
            when, host = recs[i].ts, recs[i].host
            j = i
            while j < n and recs[j].ts == when and recs[j].host == host:
                j += 1
            # Entities made in record order, as ``_judge`` makes them: the ids stay what they were.
            pids = [book.entity((r.host, r.device, r.port)) for r in recs[i:j]]
            polled = [(r, pid) for r, pid in zip(recs[i:j], pids) if not _absent(r) and _polled(r)]
            here = {pid for _, pid in polled}
            for r, pid in polled:
                if pid in self._renamed and pid not in self._back and self._renamed[pid][0] < when:
                    self._back[pid] = when  # the name back: a port of its own (``_judge`` forgets the rename)
                g = _guid(r.port_guid)
                known = self._guid_of.get(pid)
                if g is None or known == g:
                    continue
                old = self._by_guid.get((host, g))
                if known is None and old is not None and old not in here and math.isnan(pasts[pid].last_polled):
                    out.setdefault((when, host), []).append((old, pid, g))
                    self._renamed[old] = (when, pid)
                    self._back.pop(old, None)
                    del self._guid_of[old]
                elif known is not None and self._by_guid.get((host, known)) == pid:
                    del self._by_guid[(host, known)]
                self._guid_of[pid] = g
                self._by_guid[(host, g)] = pid
            i = j
        return out

    def _judge_hosts(self, recs: list[NicRecord], key: str, check: PortCheck) -> list[tuple[Transition, AlertEvent]]:
        """``active_ports``: each host's ports sent at one time (one poll), against the ports and
        rate its GPU model needs; hosts of a model not listed (or not known yet) are not judged."""
        rows: list[tuple[float, int, dict[str, Any]]] = []
        group: dict[tuple[float, str], list[NicRecord]] = {}
        for r in recs:
            group.setdefault((r.ts, r.host), []).append(r)
        for (when, host), ports in group.items():
            need = check.expected(self._models.get(host))
            if need is None or all(p.state is None and not _absent(p) for p in ports):  # says no port's state
                continue
            hid = self._host_ids.get(host)
            if hid is None:
                hid = self._host_ids[host] = len(self._hosts)
                self._hosts.append(host)
            # Where the producer named the GPUs behind enough of the host's ports to make up the
            # count, those are the compute fabric's and the others storage or management NICs:
            # counted among all, a DGX's two 400 Gb/s storage ports hid a compute port down,
            # retrained at 200 or gone. Remembered, not per poll: one gone names no GPUs.
            compute = self._gpu_ports.get(host, set())
            gpu_ports = len(compute) >= need[0]
            ids = self._book.ids
            up = sorted(  # each port once: a poll delivered twice (sent at least once) is one poll
                {
                    f"{p.device}:{p.port}"
                    for p in ports
                    if p.state == ACTIVE
                    and p.rate_gbps is not None
                    and p.rate_gbps >= need[1]
                    and (not gpu_ports or ids[(host, p.device, p.port)] in compute)
                }
            )
            ev = {"model": self._models.get(host), "expected_ports": need[0], "expected_rate_gbps": need[1],
                  "active_ports": len(up), "active": up, "counted": "ports with GPUs" if gpu_ports else "all ports"}  # fmt: skip
            rows.append((when, hid, ev))
        if not rows:
            return []
        ts = np.array([r[0] for r in rows])
        ent = np.array([r[1] for r in rows], np.int32)
        cond = np.array([r[2]["active_ports"] < r[2]["expected_ports"] for r in rows])
        out = []
        for t in self._book.life[key].step(ts, ent, cond, len(self._hosts)):  # the host's own entity ids
            ev = rows[t.row][2]
            host = self._hosts[t.entity]
            summary = (
                f"{host} has {ev['active_ports']} port(s) ACTIVE at {ev['expected_rate_gbps']:g} Gb/s or more; "
                f"its {ev['model']} GPUs need {ev['expected_ports']}"
            )
            labels = {"expected": f"{ev['expected_ports']} @ {ev['expected_rate_gbps']:g} Gb/s"}
            out.append((t, self._book.event(check, t, host, host, ev, labels, lambda: summary)))
        return out

    def _judge_lost(
        self,
        recs: list[NicRecord],
        key: str,
        check: PortCheck,
        renames: dict[tuple[float, str], list[tuple[int, int, str]]] | None = None,
    ) -> list[tuple[Transition, AlertEvent]]:
        """``port_lost``: at each poll of a host (its records sent at one time), each port the host
        reported before and left out of this poll, silent past ``window`` or two and a half of the
        host's poll steps; a host back from a silence (telemetry_gap's case) gets that long for
        its ports to come back. A port renamed at a poll (``renames``: by (time, host), the old
        id, the new id and their GUID) resolves there, ``keep_firing_for`` or not, and is no
        longer judged."""
        rows_ts: list[float] = []
        rows_ent: list[int] = []
        rows_cond: list[bool] = []
        # (port, last seen, ports in the poll, (new id, GUID) if renamed): evidence, if it changes
        rows_ev: list[tuple[int, float, int, tuple[int, str] | None]] = []
        trans: list[Transition] = []
        stepped = 0  # rows stepped through the lifecycle: a rename's rows are stepped on their own
        i, n = 0, len(recs)
        while i < n:
            when, host = recs[i].ts, recs[i].host
            j = i
            here: set[int] = set()
            gone: set[int] = set()  # ports the producer says it saw before and did not find
            while j < n and recs[j].ts == when and recs[j].host == host:
                (gone if _absent(recs[j]) else here).add(self._book.ids[(recs[j].host, recs[j].device, recs[j].port)])
                j += 1
            poll = self._polls.get(host)
            if poll is None:
                poll = self._polls[host] = [when, math.nan, when]
            else:
                gap = when - poll[0]
                if gap > 0 and not math.isfinite(poll[1]):
                    poll[1] = gap  # the host's first step (or first after a silence), however long: its sampling
                elif gap > max(check.window_s, 2.5 * poll[1]):
                    # Back from a silence: its ports come up one by one. The gap says nothing of
                    # its sampling, and a step learnt from a short gap (a restarted producer polls
                    # at once) would make every later poll look like a return: the next gap is
                    # taken as the step, whatever its length, as the first one is.
                    poll[2] = when
                    poll[1] = math.nan
                elif gap > 0:
                    poll[1] = gap
                poll[0] = max(poll[0], when)
            after = max(check.window_s, 2.5 * poll[1]) if math.isfinite(poll[1]) else check.window_s
            ports = self._host_ports.setdefault(host, [])
            renamed = renames.get((when, host)) if renames else None
            if renamed:
                trans += self._step_lost(key, rows_ts, rows_ent, rows_cond, stepped, True)
                stepped = len(rows_ts)
                for old, new, guid in renamed:
                    st = self._book.pasts[old]
                    if old in ports:
                        ports.remove(old)
                    rows_ts.append(when)
                    rows_ent.append(old)
                    rows_cond.append(False)
                    rows_ev.append((old, st.last_polled, len(here), (new, guid)))
                    st.last_polled = math.nan  # not the host's port any more: judged again only if polled
                trans += self._step_lost(key, rows_ts, rows_ent, rows_cond, stepped, False)
                stepped = len(rows_ts)
            for pid in sorted(here):
                st = self._book.pasts[pid]
                if math.isnan(st.last_polled):
                    ports.append(pid)
                st.last_polled = max(when, st.last_polled) if not math.isnan(st.last_polled) else when
            for pid in sorted(gone - here):
                st = self._book.pasts[pid]
                if self._renamed and self._retired(pid, when):  # an old name its producer still sends as absent
                    continue
                if math.isnan(st.last_polled):  # one its producer saw before this stage did: silent from now
                    ports.append(pid)
                    st.last_polled = when
            for pid in ports:
                st = self._book.pasts[pid]
                silent = when - st.last_polled
                rows_ts.append(when)
                rows_ent.append(pid)
                rows_cond.append(pid not in here and silent > after and when - poll[2] > after)
                rows_ev.append((pid, st.last_polled, len(here), None))
            i = j
        trans += self._step_lost(key, rows_ts, rows_ent, rows_cond, stepped, True)
        out = []
        for t in trans:
            pid, last, n_here, renamed_to = rows_ev[t.row]
            ev = {"last_seen": last, "silent_s": round(t.ts - last, 3), "host_ports": n_here,
                  "gpus": list(self._book.pasts[pid].gpus)}  # fmt: skip
            if renamed_to is not None:
                _, device, port = self._book.keys[renamed_to[0]]
                ev.update(resolved_by="renamed", renamed_to={"device": device, "port": port}, port_guid=renamed_to[1])
            out.append((t, self._alert(check, t, ev)))
        return out

    def _step_lost(
        self, key: str, ts: list[float], ent: list[int], cond: list[bool], start: int, keep: bool
    ) -> list[Transition]:
        """Step ``port_lost``'s lifecycle over the rows from ``start``; ``keep`` False: a false
        row resolves at once (a renamed port is not lost, whatever ``keep_firing_for`` says)."""
        if start >= len(ts):
            return []
        life = self._book.life[key]
        kept = life.keep_s
        if not keep:
            life.keep_s = 0.0
        try:
            got = self._book.step(
                key, np.array(ts[start:]), np.array(ent[start:], np.int32), np.array(cond[start:], bool)
            )
        finally:
            life.keep_s = kept
        return [Transition(t.state, t.entity, t.ts, t.started_at, t.row + start) for t in got]

    def _sample(self, st: PortPast, r: NicRecord) -> dict[str, Any]:
        """Fold one record into its port's past; the checks' conditions and the evidence."""
        cfg = self.config.checks
        counters = r.counters
        # A counter a record does not carry (a file that did not read, a record of the NIC's AER
        # or of a training log) is where the last record left it.
        pinned = st.saturated
        saturated = [n for n, top in self._tops if (v := counters.get(n)) == top or (v is None and n in pinned)]
        t = r.ts
        if r.state is not None or r.phys_state is not None:
            st.state, st.phys_state = r.state, r.phys_state
        active = r.state == ACTIVE
        down = st.seen_active and (r.state == DOWN or r.phys_state == DISABLED)
        degraded = (
            st.seen_active and not down and (r.phys_state in (POLLING, LINK_ERROR_RECOVERY) or r.state in (INIT, ARMED))
        )
        if st.up and r.state is not None and not active:
            st.went_down = True
        if active and st.went_down:
            st.flaps.append(t)
            st.went_down = False
        if r.state is not None:
            st.up = active
        st.seen_active = st.seen_active or active
        flap_window = cfg["flapping"].window_s
        while st.flaps and st.flaps[0] <= t - flap_window:
            st.flaps.popleft()
        increased: dict[str, int] = {}
        for name in self._watched:
            v = r.counters.get(name)
            if v is None:
                continue
            p = st.prev.get(name)
            if name in LOG_COUNTERS:
                # A training log counts from 0, and a new log (the next job) starts again from 0.
                if p is None or v < p:
                    p = 0
            if p is not None and v > p:
                increased[name] = v - p
            st.prev[name] = v  # a drop is a reset (driver reload): the series restarts there
        windowed: dict[str, int] = {}
        for key, c in self._windows:
            q = st.sums.get(key)
            if q is None:
                q = st.sums[key] = deque()
            # Summed counters stop at 2^64-1, as each one does: a snapshot holds no more.
            inc = min(sum(increased.get(n, 0) for n in c.counters), MAX_COUNTER) if increased else 0
            total = st.sums_total.get(key, 0)
            if inc:
                q.append((t, inc))
                total += inc
            while q and q[0][0] <= t - c.window_s:
                total -= q.popleft()[1]
            st.sums_total[key] = windowed[key] = total
        rated = {key: portrates.velocity(st.rates, key, c, r) for key, c in self._rates}
        sym = min(sum(increased.get(n, 0) for n in cfg["symbol_errors"].counters), MAX_COUNTER)
        if sym:
            st.errors.append((t, sym))
            st.errors_sum += sym
        sym_window = cfg["symbol_errors"].window_s
        while st.errors and st.errors[0][0] <= t - sym_window:
            st.errors_sum -= st.errors.popleft()[1]
        in_window = st.errors_sum
        if r.gpus:
            if not st.gpus:
                self._gpu_ports.setdefault(r.host, set()).add(self._book.ids[(r.host, r.device, r.port)])
            st.gpus = list(r.gpus)
        st.netdev = r.netdev or st.netdev
        st.link_layer = r.link_layer or st.link_layer
        if r.peer is not None:
            st.peer = _peer_labels(r)
        fatal = {n: increased[n] for n in cfg["link_errors"].counters if n in increased}
        nccl = {n: increased[n] for n in cfg["completion_errors"].counters if n in increased}
        cond = {
            "port_down": down,
            "port_degraded": degraded,
            "link_errors": bool(fatal),
            "symbol_errors": in_window > cfg["symbol_errors"].threshold,
            "flapping": len(st.flaps) >= cfg["flapping"].threshold,
            "completion_errors": bool(nccl),
        }
        for key, c in self._windows:
            cond[key] = windowed[key] > c.threshold
        for key, _ in self._rates:
            cond[key] = rated[key]
        if saturated:
            # A counter at its width's maximum counts nothing more: a check that reads it keeps
            # its verdict of the last record (firing stays firing, quiet stays quiet) until a reset
            # takes it off the maximum; a rise to the maximum in this sample still counts.
            last = st.cond
            for key, names in self._capped:
                if not cond[key] and last.get(key, False) and not names.isdisjoint(saturated):
                    cond[key] = True
        st.cond = cond  # never changed after this sample: ``_judge`` only reads it
        st.saturated = saturated
        ev: dict[str, Any] = {
            "_cond": cond,
            "state": r.state_name,
            "phys_state": r.phys_state_name,
            "rate_gbps": r.rate_gbps,
            "increased": fatal,
            "symbol_errors_in_window": in_window,
            "flaps_in_window": len(st.flaps),
            "gpus": list(st.gpus),
        }
        if windowed:
            ev["_windowed"] = windowed
        if saturated:
            ev["saturated"] = saturated
        if self._rates:
            ev["_rates"] = dict(st.rates)  # each entry is replaced, never changed: this row's snapshot
        if nccl:
            ev["nccl_errors"] = nccl
            ev.update({k: v for k, v in r.labels.items() if k in _NCCL_LABELS})
        return ev

    def _alert(self, check: PortCheck, t: Transition, ev: dict[str, Any]) -> AlertEvent:
        host, device, port = self._book.keys[t.entity]
        st = self._book.pasts[t.entity]
        evidence = public(ev)
        cfg = self.config.checks
        if "_windowed" in ev:
            evidence["in_window"] = {cfg[k].name: v for k, v in ev["_windowed"].items()}
        if "_rates" in ev:
            evidence["rates"] = portrates.evidence(cfg, ev["_rates"])
        labels = {"device": device, "port": str(port)}
        if ev.get("peer"):
            # The remote endpoint NCCL named (an IP and port), apart from the switch-side ``peer``.
            labels["nccl_peer"] = str(ev["peer"])
        if st.netdev:
            labels["netdev"] = st.netdev
        if st.link_layer:
            labels["link_layer"] = st.link_layer
        if st.gpus:
            labels["gpus"] = gpus_label(st.gpus)
        labels.update(st.peer)
        return self._book.event(check, t, f"{host}/{device}/{port}", host, evidence, labels,
                                lambda: _summary(check, host, device, port, evidence))  # fmt: skip

    # -- state ----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain data: the ports, their pasts, the lifecycles, the held records (as JSON); the
        ports' GUIDs and retired names only where there are any (the layout of before GUIDs)."""
        state = {
            **self._book.to_state(PortPast.to_state),
            "hosts": list(self._hosts),
            "models": dict(self._models),
            "n_gpus": self._n_gpus,
            "polls": {h: [None if math.isnan(x) else x for x in p] for h, p in self._polls.items()},
        }
        if self._guid_of or self._renamed:
            state["guids"] = [[pid, g] for pid, g in sorted(self._guid_of.items())]
            state["renamed"] = [[old, when, new] for old, (when, new) in sorted(self._renamed.items())]
        return state

    def load_state(self, state: Any) -> None:
        """Take back ``to_state``'s data (None: a snapshot from an engine without this stage)."""
        if state is None:
            return
        (hosts, models, n_gpus, polls), (guids, renamed) = self._book.load_state(
            state, _key, PortPast.from_state, lambda s: (_hosts_state(s), _guids_state(s))
        )
        self._hosts, self._models, self._n_gpus = hosts, models, n_gpus
        self._polls = polls
        self._guid_of, self._renamed = guids, renamed
        self._by_guid = {(self._book.keys[pid][0], g): pid for pid, g in guids.items()}
        self._host_ports = {}
        self._gpu_ports = {}
        for pid, (h, _, _) in enumerate(self._book.keys):
            if not math.isnan(self._book.pasts[pid].last_polled):
                self._host_ports.setdefault(h, []).append(pid)
            if self._book.pasts[pid].gpus and pid not in renamed:
                self._gpu_ports.setdefault(h, set()).add(pid)
        self._host_ids = {h: i for i, h in enumerate(hosts)}


def _key(k: Any) -> tuple[str, str, int]:
    """A port's key from a snapshot: (host, device, port)."""
    host, device, port = k
    return str(host), str(device), int(port)


def _hosts_state(state: Any) -> tuple[list[str], dict[str, str], int, dict[str, list[float]]]:
    """The host checks' part of a snapshot: the hosts, their GPU models, the GPU ids seen, the polls."""
    hosts = [str(h) for h in state["hosts"]]
    models = {str(k): str(v) for k, v in state["models"].items()}
    n_gpus = int(state["n_gpus"])
    polls = {str(h): [_float(x) for x in p] for h, p in state.get("polls", {}).items()}
    return hosts, models, n_gpus, polls


def _guids_state(state: Any) -> tuple[dict[int, str], dict[int, tuple[float, int]]]:
    """The ports' GUIDs and retired names of a snapshot (both absent in one from before GUIDs)."""
    n = len(state["ports"])
    guids = {int(pid): str(g) for pid, g in state.get("guids", [])}
    renamed = {int(old): (float(when), int(new)) for old, when, new in state.get("renamed", [])}
    if any(not 0 <= p < n for p in (*guids, *renamed, *(new for _, new in renamed.values()))):
        raise ValueError("a port GUID or rename of a port not in the snapshot")
    return guids, renamed


def _guid(text: str | None) -> str | None:
    """A record's ``port_guid`` when it is one (``0x`` and 16 lower-case hex digits, not all
    zero); else None: a third-party producer's other spelling identifies nothing.

    >>> _guid("0x0c42a10300a1b2c0"), _guid("0x0000000000000000"), _guid("0X0C42A10300A1B2C0")
    ('0x0c42a10300a1b2c0', None, None)
    """
    if not isinstance(text, str) or text == _NO_GUID or _GUID.fullmatch(text) is None:
        return None
    return text


def _peer_labels(r: NicRecord) -> dict[str, str]:
    """The record's link partner as alert labels (docs/remediation.md#fabric-faults).

    >>> _peer_labels(NicRecord(ts=0.0, host="n1", device="mlx5_0", port=1, peer="leaf01", peer_port=17))
    {'peer': 'leaf01', 'peer_port': '17'}
    """
    out = {"peer": str(r.peer)}
    for key in ("peer_guid", "peer_port", "peer_lid"):
        val = getattr(r, key)
        if val is not None:
            out[key] = str(val)
    return out


def _float(x: Any) -> float:
    """A number from a snapshot; None is NaN (JSON has none)."""
    return math.nan if x is None else float(x)


def _absent(r: NicRecord) -> bool:
    """A record saying its port was not there when its producer polled the host (``NIC_ABSENT_LABEL``)."""
    return r.labels.get(NIC_ABSENT_LABEL) == "1"


def _polled(r: NicRecord) -> bool:
    """A record of a poll of the port itself (its state or its own counters), not one that only
    carries a training log's NCCL errors or the NIC's PCIe AER totals (``produce pcie-aer``):
    those come on their own clock, so they neither show a port alive nor count as a poll.

    >>> _polled(NicRecord(ts=0.0, host="n1", device="mlx5_0", port=1, counters={"pcie_aer_fatal": 0}))
    False
    >>> _polled(NicRecord(ts=0.0, host="n1", device="mlx5_0", port=1, state=4))
    True
    """
    if r.state is not None or r.phys_state is not None:
        return True
    return any(k not in LOG_COUNTERS and not k.startswith("pcie_aer_") for k in r.counters)


def _summary(check: PortCheck, host: str, device: str, port: int, ev: dict[str, Any]) -> str:
    where = f"{device} port {port} on {host}"
    gpus = f"; GPUs {','.join(map(str, ev['gpus']))} behind it" if ev.get("gpus") else ""
    if check.fault == "network_port_down":
        what = f"is {ev.get('state') or '?'} ({ev.get('phys_state') or '?'}) after being ACTIVE"
    elif check.fault == "network_port_degraded":
        what = f"is {ev.get('state') or '?'} ({ev.get('phys_state') or '?'}): the link is not up cleanly"
    elif check.fault == "network_link_errors":
        inc = ", ".join(f"{k} +{v}" for k, v in sorted(ev.get("increased", {}).items()))
        what = f"counted link errors ({inc or 'an increase'})"
    elif check.fault == "network_symbol_errors":
        what = (
            f"counted {ev.get('symbol_errors_in_window')} symbol errors in {_span(check.window_s)} "
            f"(more than {check.threshold:g}: the IBTA 1e-12 bit-error bound)"
        )
    elif check.fault == "network_port_flapping":
        what = f"went down and came back {ev.get('flaps_in_window')} times in {_span(check.window_s)}"
    elif check.fault == "network_port_lost":
        what = (
            f"is no longer reported ({ev.get('silent_s', 0):g}s silent) while its host reports "
            f"{ev.get('host_ports')} other port(s)"
        )
    elif check.fault == "network_ib_completion_errors":
        what = _nccl_what(ev)
    elif check.name in ev.get("in_window", {}):
        counters = "+".join(check.counters)
        what = f"counted {ev['in_window'][check.name]} {counters} in {_span(check.window_s)} (more than {check.threshold:g})"
    else:
        counters = "+".join(check.counters)
        r = ev.get("rates", {}).get(check.name, {})
        what = (
            f"counted {counters} at {r.get('rate', math.nan):.3g} per {_span(check.window_s)} "
            f"(+{r.get('increase', 0)} in {r.get('over_s', 0):g}s; NVSentinel's bound: {check.threshold:g})"
        )
    return f"{where} {what}{gpus}"


def _nccl_what(ev: dict[str, Any]) -> str:
    errs = ev.get("nccl_errors", {})
    parts = []
    if errs.get("nccl_ib_completion_errors"):
        status = ev.get("status_name") or (f"status {ev['status']}" if ev.get("status") else "an error status")
        vendor = f", vendor err {ev['vendor_err']}" if ev.get("vendor_err") else ""
        way = f", {ev['direction']}" if ev.get("direction") else ""
        peer = f" from peer {ev['peer']}" if ev.get("peer") else ""
        parts.append(
            f"{errs['nccl_ib_completion_errors']} InfiniBand completion error(s) ({status}{vendor}{way}){peer}"
        )
    if errs.get("nccl_ib_async_fatal_events"):
        parts.append(f"{errs['nccl_ib_async_fatal_events']} fatal async event(s) ({ev.get('event') or '?'})")
    return "got " + " and ".join(parts or ["InfiniBand errors"]) + " in NCCL"


def _span(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s" if math.isfinite(seconds) else "ever"


__all__ = ["PortStage"]
