"""``/sys/class/infiniband`` -> ``NicRecord``s: every port's state, rate and counters, each poll.

What is read, under ``--root`` (``/`` on a host; a container mounts the host's ``/sys`` below one;
the kernel's ABI is ``Documentation/ABI/stable/sysfs-class-infiniband``, docs/producers.md):

- ``sys/class/infiniband/<device>/ports/<port>/{state,phys_state,rate,link_layer}``:
  ``4: ACTIVE``, ``5: LinkUp``, ``400 Gb/sec (4X NDR)``, ``InfiniBand`` or ``Ethernet`` (RoCE);
- ``.../counters/*`` (the IBTA port counters), ``.../counters_ext/*`` (the 64-bit ones,
  ``port_xmit_data_64``..., where older kernels and MLNX_OFED drivers put them) and
  ``.../hw_counters/*`` (the driver's), each a decimal integer, by file name, as the kernel
  prints it: the IBTA counters are 4 to 64 bits wide and stop at their maximum (``link_downed``
  255, ``excessive_buffer_overrun_errors`` 15; ``port_xmit_data`` 2^32-1 without the extended
  counters), ``port_xmit_data``/``port_rcv_data`` count 4-byte words. ``hw_counters/lifespan``
  is left out: it is the counters' cache period in ms (a setting), not a counter. A directory
  that is absent (``hw_counters`` on older drivers, ``counters`` on some RoCE functions) is no
  drop; a file that does not read (EINVAL; ``N/A (no PMA)`` on older kernels) is ``unreadable``;
- the port's netdev from ``<device>/device/net/<if>`` (the one there, else the one whose
  ``dev_port`` is the port less one), and its ``carrier_changes`` from
  ``sys/class/net/<if>/carrier_changes`` (``statistics/carrier_changes`` where only that exists);
- with ``--pci-map`` (``nvidia-smi --query-gpu=index,pci.bus_id --format=csv``), the GPUs behind
  each NIC: for each GPU (``sys/bus/pci/devices/<bus id>``), the NICs that share its deepest PCIe
  bridge (the nearest common one), as NVIDIA's resiliency extension pairs them;
- ``.../gids/0``, the port's GID 0 (``fe80:0000:0000:0000:0002:c903:0029:3e1f``): its low 64
  bits are the port GUID (RoCE's made from the MAC), the record's ``port_guid``, which a driver
  reload that renames the device keeps; all zero (no GID) or absent is none, other text
  ``dropped.bad_value``. A port not found whose GUID another port now has was renamed: it is not
  sent as absent;
- with ``--peers`` (a saved ``iblinkinfo`` or ``ibnetdiscover``, ``producers/ibpeers.py``), each
  port's link partner: found by the port GUID of ``ports/<port>/gids/0``, else by the device's
  ``node_desc`` (or ``<host> <device>``) and port, it fills the record's ``peer*`` fields.

Hostile trees: every path is resolved and must stay under ``--root`` (a link out of it is
``dropped.outside_root``), a link loop or a file that does not read is ``dropped.unreadable``, a
file is read with ``O_NOFOLLOW``/``O_NONBLOCK`` and at most ``MAX_FILE_BYTES`` (more is
``dropped.oversized_file``, a FIFO or link is ``dropped.not_a_file``, as is a file where a
directory belongs), a value that is not ASCII digits is ``dropped.bad_value``, a name no record
could carry (or a port not named as the kernel names it: ``01``) is ``dropped.bad_name``, and at
most ``MAX_DEVICES`` devices, ``MAX_PORTS`` ports each and ``MAX_NIC_COUNTERS`` counters a port
are read (more is ``dropped.too_many``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import time
from dataclasses import dataclass
from typing import Callable

import msgspec

from pipeline.decode import MAX_COUNTER, MAX_NIC_COUNTERS
from pipeline.numeric import ascii_int
from pipeline.schema import NIC_ABSENT_LABEL, NicRecord
from producers.ibpeers import PeerFile, gid_port_guid, local_names, norm_guid
from producers.ibports import coded_state, name_ok, rate_gbps

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 4096  # a sysfs attribute is at most a page
MAX_DEVICES = 256  # an 8-GPU node has ~10 RDMA devices
MAX_PORTS = 64  # a switch's device exposes its ports; a HCA one or two
MAX_NETDEVS = 16
COUNTER_DIRS = ("counters", "counters_ext", "hw_counters")
NOT_COUNTERS = {"lifespan"}  # hw_counters/lifespan: the cache period in ms, written by the admin
NO_GUID = norm_guid("0")  # an unset GID (a RoCE port without its link-local address): no identity
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass
class SysfsStats:
    polls: int = 0
    devices: int = 0
    ports: int = 0
    unreadable: int = 0
    not_a_file: int = 0
    oversized_file: int = 0
    bad_value: int = 0
    bad_name: int = 0
    outside_root: int = 0
    too_many: int = 0
    absent: int = 0  # records of ports seen before and not found (NIC_ABSENT_LABEL), one a poll each


class SysfsTree:
    """Bounded, root-confined reads of a sysfs tree, each problem counted in ``stats``."""

    def __init__(self, root: str, stats: SysfsStats) -> None:
        self.root = os.path.realpath(root)
        self.stats = stats

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def resolve(self, path: str) -> str | None:
        """``path`` with its links resolved, if it stays under the root and exists; else None
        (counted, except a path that is simply absent)."""
        try:
            real = os.path.realpath(path)
        except FileNotFoundError:  # a link removed while it was walked: a device going away
            return None
        except (OSError, RecursionError):  # a chain of links deeper than the stack (the kernel stops at 40)
            self.stats.unreadable += 1
            return None
        if self.root != os.sep and not (real == self.root or real.startswith(self.root + os.sep)):
            self.stats.outside_root += 1
            return None
        try:
            os.stat(real)
        except FileNotFoundError:
            return None
        except OSError:  # a link loop (ELOOP), a permission
            self.stats.unreadable += 1
            return None
        return real

    def listdir(self, path: str, limit: int) -> list[str]:
        """The sorted names in a directory (at most ``limit``: the rest counted as ``too_many``);
        [] when it is absent."""
        names: list[str] = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if len(names) == limit:
                        self.stats.too_many += 1
                        break
                    names.append(entry.name)
        except FileNotFoundError:
            return []
        except NotADirectoryError:  # a file where the kernel has a directory
            self.stats.not_a_file += 1
            return []
        except OSError:
            self.stats.unreadable += 1
            return []
        return sorted(names)

    def read(self, path: str, absent_ok: bool = True) -> str | None:
        """A small regular file's text (stripped), or None (counted unless absent)."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            if not absent_ok:
                self.stats.unreadable += 1
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link: attributes never are
                self.stats.not_a_file += 1
            else:
                self.stats.unreadable += 1
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.stats.not_a_file += 1
                return None
            data = os.read(fd, MAX_FILE_BYTES + 1)
        except OSError:  # EINVAL: a counter the device does not support reading
            self.stats.unreadable += 1
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_FILE_BYTES:
            self.stats.oversized_file += 1
            return None
        try:
            return data.decode("ascii").strip()
        except UnicodeDecodeError:
            self.stats.bad_value += 1
            return None

    def read_int(self, path: str) -> int | None:
        """A decimal counter (``0``, ``2489603687``), else None (``bad_value``)."""
        text = self.read(path)
        if text is None:
            return None
        if text == "N/A (no PMA)":  # older kernels' answer where newer ones fail the read (EINVAL)
            self.stats.unreadable += 1
            return None
        n = ascii_int(text, 20)
        if n is None or n > MAX_COUNTER:
            self.stats.bad_value += 1
            return None
        return n


def _pci_chain(real: str) -> list[str]:
    """The PCI functions on a resolved device path, from the root port down
    (``.../pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0`` -> the two BDFs)."""
    parts = real.split(os.sep)
    return [p for p in parts if len(p) == 12 and p[4] == ":" and p[7] == ":" and p[10] == "."]


def gpus_behind(nic_chains: dict[str, list[str]], gpu_chains: dict[int, list[str]]) -> dict[str, list[int]]:
    """For each NIC, the GPUs whose nearest common PCIe bridge with any NIC is with this one
    (ties: every NIC at that depth). A GPU that shares no bridge with any NIC (only the root
    complex) is behind none.

    >>> nics = {"mlx5_0": ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"],
    ...         "mlx5_1": ["0000:80:01.0", "0000:81:00.0", "0000:82:00.0", "0000:83:00.0"]}
    >>> gpus = {0: ["0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0"],
    ...         1: ["0000:80:01.0", "0000:81:00.0", "0000:82:01.0", "0000:85:00.0"], 2: ["0000:c0:01.0"]}
    >>> gpus_behind(nics, gpus)
    {'mlx5_0': [0], 'mlx5_1': [1]}
    """

    def depth(a: list[str], b: list[str]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    out: dict[str, list[int]] = {name: [] for name in nic_chains}
    for gpu, chain in sorted(gpu_chains.items()):
        d = {name: depth(chain, c) for name, c in nic_chains.items()}
        best = max(d.values(), default=0)
        if best < 1:
            continue
        for name, v in d.items():
            if v == best:
                out[name].append(gpu)
    return out


class IbSysfsSource:
    """Polls every InfiniBand/RoCE port under ``root`` (a live source: never done)."""

    def __init__(
        self,
        root: str = "/",
        *,
        host: str | None = None,
        gpu_bus_ids: dict[int, str] | None = None,
        peers: PeerFile | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``gpu_bus_ids``: GPU index -> its sysfs PCI name (``0000:3b:00.0``), for ``gpus``;
        ``peers``: the fabric's links, for ``peer*``."""
        self.peers = peers
        self.stats = SysfsStats()
        self.tree = SysfsTree(root, self.stats)
        self.host = host or socket.gethostname()
        self.gpu_bus_ids = gpu_bus_ids or {}
        self.clock = clock
        self.done = False
        self._gpus: dict[str, list[int]] | None = None
        self._mapped_for: tuple[tuple[str, str], ...] | None = None
        # Every port read since start, with the GPUs behind it: one not found in a later poll is
        # sent as absent (a driver unloaded, a NIC off the bus), since sending nothing for it
        # looks the same as a host whose producer stopped, and with every port gone the port
        # checks would hear nothing at all. Each with its port GUID, to tell a port renamed.
        self._known: dict[tuple[str, int], tuple[list[int], str | None]] = {}

    def poll(self) -> list[NicRecord]:
        self.stats.polls += 1
        ts = self.clock()
        t = self.tree
        base = t.path("sys", "class", "infiniband")
        devices = []
        for name in t.listdir(base, MAX_DEVICES):
            if not name_ok(name):
                self.stats.bad_name += 1
                continue
            real = t.resolve(os.path.join(base, name))
            if real is not None:
                devices.append((name, real))
        self.stats.devices += len(devices)
        seen = tuple(devices)  # names and paths: a driver reload can give the names out in another order
        if self.gpu_bus_ids and seen != self._mapped_for:  # at start, and when a device comes, goes or moves
            self._gpus, self._mapped_for = self._map_gpus(devices), seen
        out: list[NicRecord] = []
        peer_map = self.peers.current() if self.peers is not None else None
        for name, real in devices:
            netdevs = self._netdevs(real)
            descs = local_names(self.host, name, t.read(os.path.join(real, "node_desc"))) if peer_map else []
            ports_dir = t.resolve(os.path.join(real, "ports"))
            if ports_dir is None:
                continue
            for pname in t.listdir(ports_dir, MAX_PORTS):
                port = ascii_int(pname, 5)
                if port is None or port > 65535 or pname != str(port):  # "01" would be port 1 twice
                    self.stats.bad_name += 1
                    continue
                pdir = t.resolve(os.path.join(ports_dir, pname))
                if pdir is None:
                    continue
                gids = t.resolve(os.path.join(pdir, "gids"))  # a link in the path stays under the root too
                gid = t.read(os.path.join(gids, "0")) if gids is not None else None
                rec = self._port(ts, name, port, pdir, netdevs, self._guid(gid))
                if peer_map is not None:
                    found = peer_map.labels(port, gid_port_guid(gid) if gid else None, descs)
                    if found:
                        rec = msgspec.structs.replace(rec, **found)
                out.append(rec)
        return out + self._absent(ts, out)

    def _absent(self, ts: float, found: list[NicRecord]) -> list[NicRecord]:
        """A record for each port seen before and not in ``found``, labelled ``NIC_ABSENT_LABEL``;
        one whose GUID a port in ``found`` has is that port renamed, and forgotten."""
        here = {(r.device, r.port) for r in found}
        for r in found:
            if (r.device, r.port) in self._known or len(self._known) < MAX_DEVICES * MAX_PORTS:
                self._known[(r.device, r.port)] = (list(r.gpus), r.port_guid)
        guids = {r.port_guid for r in found if r.port_guid is not None}
        gone = []
        for (d, p), (g, guid) in sorted(self._known.items()):
            if (d, p) in here:
                continue
            if guid is not None and guid in guids:
                del self._known[(d, p)]  # a driver reload renamed it: here under its new name
                continue
            gone.append(NicRecord(ts=ts, host=self.host, device=d, port=p, gpus=g, labels={NIC_ABSENT_LABEL: "1"}))
        self.stats.absent += len(gone)
        return gone

    def _guid(self, gid: str | None) -> str | None:
        """The port GUID of a GID 0's text (its low 64 bits, normalised); None when there is no
        text or the GID is all zero (no identity), and text that is no GID is ``bad_value``."""
        if not gid:
            return None
        guid = gid_port_guid(gid)
        if guid is None:
            self.stats.bad_value += 1
        return None if guid == NO_GUID else guid

    def _port(
        self, ts: float, device: str, port: int, pdir: str, netdevs: dict[int | None, str], guid: str | None = None
    ) -> NicRecord:
        t = self.tree
        self.stats.ports += 1
        kw: dict = {} if guid is None else {"port_guid": guid}
        for key in ("state", "phys_state"):
            text = t.read(os.path.join(pdir, key))
            if text is None:
                continue
            coded = coded_state(text)
            if coded is None:
                self.stats.bad_value += 1
                continue
            kw[key], kw[key + "_name"] = coded
        text = t.read(os.path.join(pdir, "rate"))
        if text is not None:
            r = rate_gbps(text)
            if r is None:
                self.stats.bad_value += 1
            else:
                kw["rate_gbps"] = r
        text = t.read(os.path.join(pdir, "link_layer"))
        if text is not None:
            if name_ok(text):
                kw["link_layer"] = text
            else:
                self.stats.bad_value += 1
        counters: dict[str, int] = {}
        for sub in COUNTER_DIRS:
            cdir = t.resolve(os.path.join(pdir, sub))
            if cdir is None:
                continue
            for cname in t.listdir(cdir, MAX_NIC_COUNTERS + 1):
                if not name_ok(cname):
                    self.stats.bad_name += 1
                    continue
                if cname in counters:  # the IBTA name wins over a driver's of the same name
                    continue
                if cname in NOT_COUNTERS:
                    continue
                if len(counters) >= MAX_NIC_COUNTERS:
                    self.stats.too_many += 1
                    break
                v = t.read_int(os.path.join(cdir, cname))
                if v is not None:
                    counters[cname] = v
        netdev = netdevs.get(port, netdevs.get(None))
        if netdev is not None:
            kw["netdev"] = netdev
            cc = self._carrier_changes(netdev)
            if cc is not None and len(counters) < MAX_NIC_COUNTERS:
                counters["carrier_changes"] = cc
            elif cc is not None:  # no room left in the record
                self.stats.too_many += 1
        gpus = (self._gpus or {}).get(device)
        return NicRecord(ts=ts, host=self.host, device=device, port=port, counters=counters, gpus=gpus or [], **kw)

    def _netdevs(self, dev_real: str) -> dict[int | None, str]:
        """The device's netdevs by port (None: the only one, whatever the port)."""
        t = self.tree
        ndir = t.resolve(os.path.join(dev_real, "device", "net"))
        if ndir is None:
            return {}
        listed = t.listdir(ndir, MAX_NETDEVS)
        names = [n for n in listed if name_ok(n)]
        self.stats.bad_name += len(listed) - len(names)
        if len(names) == 1:
            return {None: names[0]}
        out: dict[int | None, str] = {}
        for n in names:
            ndev = t.resolve(os.path.join(ndir, n))
            dp = t.read(os.path.join(ndev, "dev_port")) if ndev is not None else None
            k = ascii_int(dp or "", 5)
            if k is not None:
                out.setdefault(k + 1, n)
            elif dp is not None:  # not a number (one absent, before Linux 3.15, is no drop)
                self.stats.bad_value += 1
        return out

    def _carrier_changes(self, netdev: str) -> int | None:
        t = self.tree
        ndir = t.resolve(t.path("sys", "class", "net", netdev))
        if ndir is None:
            return None
        if os.path.exists(os.path.join(ndir, "carrier_changes")):
            return t.read_int(os.path.join(ndir, "carrier_changes"))
        sdir = t.resolve(os.path.join(ndir, "statistics"))  # a link in the path stays under the root too
        if sdir is not None and os.path.exists(os.path.join(sdir, "carrier_changes")):
            return t.read_int(os.path.join(sdir, "carrier_changes"))
        return None

    def _map_gpus(self, devices: list[tuple[str, str]]) -> dict[str, list[int]]:
        t = self.tree
        nic_chains = {}
        for name, real in devices:
            dev = t.resolve(os.path.join(real, "device"))
            if dev is not None:
                nic_chains[name] = _pci_chain(dev)
        gpu_chains = {}
        for idx, bdf in self.gpu_bus_ids.items():
            dev = t.resolve(t.path("sys", "bus", "pci", "devices", bdf))
            if dev is not None:
                gpu_chains[idx] = _pci_chain(dev)
        mapping = gpus_behind(nic_chains, gpu_chains)
        log.info("GPUs behind each NIC: %s", {k: v for k, v in mapping.items() if v} or "none found")
        return mapping

    def summary(self) -> dict[str, int]:
        """Counts for the exit summary and ``/metrics`` (what was read, what left out by reason)."""
        s = self.stats
        return {
            "polls": s.polls,
            "devices": s.devices,
            "ports": s.ports,
            "dropped.unreadable": s.unreadable,
            "dropped.not_a_file": s.not_a_file,
            "dropped.oversized_file": s.oversized_file,
            "dropped.bad_value": s.bad_value,
            "dropped.bad_name": s.bad_name,
            "dropped.outside_root": s.outside_root,
            "dropped.too_many": s.too_many,
            "absent_ports": s.absent,
            **(self.peers.summary() if self.peers is not None else {}),
        }

    def close(self) -> None:
        pass


def bus_ids(pci_map: dict[tuple[int, int, int], int]) -> dict[int, str]:
    """``producers.kmsg.parse_pci_map``'s map as GPU index -> sysfs PCI name (function 0).

    >>> bus_ids({(0, 0x3B, 0): 0, (1, 0x05, 0x1F): 1})
    {0: '0000:3b:00.0', 1: '0001:05:1f.0'}
    """
    return {idx: f"{dom:04x}:{bus:02x}:{dev:02x}.0" for (dom, bus, dev), idx in sorted(pci_map.items())}


__all__ = ["IbSysfsSource", "SysfsStats", "SysfsTree", "bus_ids", "gpus_behind"]
