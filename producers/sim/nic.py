"""The hosts' InfiniBand ports: their link state and counters, sent as NIC records
(docs/architecture.md §3) the way ``gpuwarden produce ib-sysfs`` sends them.

Each host has one 400 Gb/s port per GPU (``PORTS_PER_HOST``, a rail-optimised H100/H200/B200
node: ``mlx5_<p>`` port 1, its IPoIB netdev ``ib<p>``, GPU ``p`` behind it; 200 Gb/s on an A100
node). Faults set a port's condition in the step's ``Mods`` (``nic_down``, ``nic_polling``,
``nic_sym_per_s``, ``nic_wait``); this model turns it into what sysfs shows: the state and
physical state, ``link_downed`` and ``carrier_changes`` counting the link's falls and returns, a
trickle of symbol errors (a few an hour, far under the IBTA bound of 120 an hour: a healthy PAM4
link corrects its raw bit errors), and data and ``port_xmit_wait`` growing with the load. Its
random draws come from their own streams, so a fleet without the ``nic`` source draws the same.
"""

from __future__ import annotations

import numpy as np

from .rng import substream

PORTS_PER_HOST = 8
ACTIVE, DOWN = 4, 1
LINK_UP, POLLING, DISABLED = 5, 2, 3
STATE_NAMES = {ACTIVE: "ACTIVE", DOWN: "DOWN"}
PHYS_NAMES = {LINK_UP: "LinkUp", POLLING: "Polling", DISABLED: "Disabled"}
SYMBOL_PER_H = (2.0, 12.0)  # a healthy port's symbol-error trickle, drawn per port
WAIT_PER_S = 4.0e5  # port_xmit_wait ticks a second on a port at full training load
COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "carrier_changes",
)


def port_rate_gbps(model: str) -> float:
    """The ports' rate on a host of this GPU model: NDR 400 Gb/s, HDR 200 on an A100.

    >>> port_rate_gbps("NVIDIA H100 80GB HBM3"), port_rate_gbps("NVIDIA A100-SXM4-80GB")
    (400.0, 200.0)
    """
    return 200.0 if "a100" in model.lower() else 400.0


class NicPorts:
    """The ``H`` x ``PORTS_PER_HOST`` ports of a fleet: state, counters, records."""

    def __init__(self, hosts: list[str], models: list[str], gpus_per_host: int, seed: int) -> None:
        H, P = len(hosts), PORTS_PER_HOST
        self.hosts = hosts
        self.gpus = [[p] if p < gpus_per_host else [] for p in range(P)]
        self.rate = [port_rate_gbps(m) for m in models]
        r = substream(seed, "nic-static")
        self.sym_rate = r.uniform(*SYMBOL_PER_H, (H, P)) / 3600.0
        # Counters since the HCA's driver loaded (days ago): some history, link_downed 0.
        self.c = {name: np.zeros((H, P), np.int64) for name in COUNTERS}
        self.c["symbol_error"] += r.integers(0, 200, (H, P))
        self.c["carrier_changes"] += 1  # the link came up once at boot
        self.c["port_xmit_data"] += r.integers(1 << 40, 1 << 44, (H, P))
        self.c["port_rcv_data"] += r.integers(1 << 40, 1 << 44, (H, P))
        self.c["port_xmit_wait"] += r.integers(1 << 30, 1 << 34, (H, P))
        self.up = np.ones((H, P), bool)
        self.phys = np.full((H, P), LINK_UP, np.int64)
        self._noise = substream(seed, "nic-noise")

    def step(self, dt: float, load: np.ndarray, down: np.ndarray, polling: np.ndarray,
             sym_per_s: np.ndarray, wait: np.ndarray) -> None:  # fmt: skip
        """Advance ``dt`` seconds: ``load`` (H, P) the share of line rate each port moves,
        ``down``/``polling`` the ports a fault holds Disabled or retraining, ``sym_per_s`` extra
        symbol errors a second, ``wait`` the fabric's congestion factor on xmit_wait (H, P)."""
        rnd, c = self._noise, self.c
        was_up = self.up
        now_up = ~(down | polling)
        fell, rose = was_up & ~now_up, ~was_up & now_up
        c["link_downed"] += fell
        c["carrier_changes"] += fell.astype(np.int64) + rose
        c["link_error_recovery"] += rnd.poisson(2.0 * fell)  # the retries before it gave up
        self.up = now_up
        self.phys = np.where(down, DISABLED, np.where(polling, POLLING, LINK_UP))
        c["symbol_error"] += rnd.poisson((self.sym_rate * now_up + sym_per_s) * dt)
        load = np.where(now_up, load, 0.0)
        words = np.array(self.rate)[:, None] * 1e9 / 32.0 * load * dt  # sysfs counts 4-byte words
        c["port_xmit_data"] += (words * rnd.uniform(0.97, 1.03, words.shape)).astype(np.int64)
        c["port_rcv_data"] += (words * rnd.uniform(0.97, 1.03, words.shape)).astype(np.int64)
        c["port_xmit_wait"] += rnd.poisson(WAIT_PER_S * load * wait * dt)

    def records(self, ts: float, hidden: np.ndarray) -> list[list[dict]]:
        """One NIC record per port at ``ts``, one list per host (none from a ``hidden`` host)."""
        out: list[list[dict]] = [[] for _ in self.hosts]
        cols = {name: a.tolist() for name, a in self.c.items()}
        up, phys = self.up.tolist(), self.phys.tolist()
        for h, host in enumerate(self.hosts):
            if hidden[h]:
                continue
            for p in range(PORTS_PER_HOST):
                state = ACTIVE if up[h][p] else DOWN
                out[h].append(
                    {
                        "v": 1,
                        "kind": "nic",
                        "ts": ts,
                        "host": host,
                        "device": f"mlx5_{p}",
                        "port": 1,
                        "link_layer": "InfiniBand",
                        "rate_gbps": self.rate[h],
                        "state": state,
                        "state_name": STATE_NAMES[state],
                        "phys_state": phys[h][p],
                        "phys_state_name": PHYS_NAMES[phys[h][p]],
                        "netdev": f"ib{p}",
                        "counters": {name: cols[name][h][p] for name in COUNTERS},
                        "gpus": list(self.gpus[p]),
                    }
                )
        return out
