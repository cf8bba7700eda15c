"""A NIC port's link partner from a saved ``iblinkinfo`` or ``ibnetdiscover`` output (``--peers``).

sysfs knows a port's own state, not what the cable plugs into; the subnet does. rdma-core's
infiniband-diags print every link of the fabric (``infiniband-diags/iblinkinfo.c`` and
``ibnetdiscover.c``; docs/producers.md#peers), in four layouts this module reads:

- ``iblinkinfo``: a ``CA: <node description>:`` or ``Switch: 0x<guid> <node description>:``
  header (``Switch 0x<guid> <node description>:`` before 2011), then one line a port:
  ``[0x<port guid>] <lid> <port>[<ext>] ==(<width> <speed> <state>/<phys>)==>  <peer lid>
  <peer port>[<ext>] "<peer description>" (<notes>)``; a port with no link ends ``[  ] "" ( )``
  or ``"Port not available"``; descriptions are printed as they are, quotes unescaped;
- ``iblinkinfo -l``: one line a port, the node on it: ``0x<port guid> "<description>" <lid>
  <port>[<ext>] ==(...)==>  0x<peer port guid> <peer lid> <peer port>[<ext>] "<peer description>" (...)``;
- ``ibnetdiscover``: a node block (``switchguid=0x<guid>(<port guid>)`` then ``Switch <n>
  "S-<guid>" # "<description>" <base|enhanced> port 0 lid <lid> lmc <lmc>``, or ``caguid=...`` then
  ``Ca <n> "H-<guid>" # "<description>"``), then one line a linked port: a switch's ``[<port>]
  "<H|S|R>-<peer guid>"[<peer port>](<peer port guid>) # "<peer description>" lid <peer lid>
  <speed>``, a CA's ``[<port>](<port guid>) "S-<peer guid>"[<peer port>] # lid <lid> lmc <lmc>
  "<peer description>" lid <peer lid> <speed>``;
- ``ibnetdiscover -p``: ``CA <lid> <port> 0x<port guid> <width> <speed> - SW <peer lid>
  <peer port> 0x<peer port guid> ( '<description>' - '<peer description>' )``, a port with no link
  ``SW <lid> <port> 0x<port guid> <width> <speed>`` then 36 spaces and ``'<description>'``.

Every link is kept both ways, so a CA's port is found from its own line or from the switch's.
A local port is looked up by its port GUID and number, else by its node description
(``<host> <device>``, rdma-ndd's default) and number. Descriptions repeat in real fabrics (every
SHARP Aggregation Node is ``Mellanox Technologies Aggregation Node``, a CA without rdma-ndd keeps
its firmware's): a line without a GUID is tied to one with it by description, port and LID, and a
description and port that two nodes' links share answers no lookup by name. A line that starts
like a port line and does not read is ``dropped.peers_unparsable_line``; a description over
``MAX_DESC`` characters or not printable is ``dropped.peers_bad_value``; past ``MAX_LINKS`` links
the rest are ``dropped.peers_too_many``; a file over ``MAX_TEXT_CHARS`` is read that far
(``dropped.peers_truncated``).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Iterable, TypeVar

from pipeline.numeric import ascii_int
from producers.ibports import lines
from producers.textinput import read_capped

log = logging.getLogger(__name__)
_K = TypeVar("_K")

MAX_DESC = 64  # an IBTA NodeDescription is 64 bytes
MAX_LID = 0xFFFF  # a LID is 16 bits
MAX_PORT = 255  # a port number is a u8 in the SMPs these tools send
MAX_LINKS = 500_000  # a 10,000-node fat tree has ~60,000 links
MAX_TEXT_CHARS = 64 * 1024 * 1024  # iblinkinfo of such a fabric is ~10 MB
MAX_LINE = 4096  # a real line is under 300 characters

_HEX = r"[0-9a-fA-F]{1,16}"
# iblinkinfo headers and port lines (iblinkinfo.c print_node_header / print_port).
_LI_CA = re.compile(r"^(CA|Router|\?\?): (.*):\s*$")
_LI_SW = re.compile(rf"^Switch:? 0x({_HEX}) (.*):\s*$")  # "Switch 0x<guid>" before 2011 (no colon)
# The part up to the link is atomic and the brackets and link bounded (print_port: "[%2s]", a
# 256-byte link_str), so a hostile line costs one pass, not one per quote it holds.
_LI_PORT = re.compile(
    rf'^(?>\s*(?:0x(?P<guid>{_HEX})\s+)?(?:"(?P<desc>.*?)"\s+)?(?P<lid>\d+)\s+(?P<port>\d+)\[[^\]]{{0,8}}\]\s+'
    rf"==\(.{{0,256}}?\)==>)\s+(?:0x(?P<rguid>{_HEX})\s+)?(?P<rlid>\d+)\s+(?P<rport>\d+)\[[^\]]{{0,8}}\]\s+"
    rf'"(?P<rdesc>.*)"\s+\('
)  # a description is printed as it is, quotes and all: the last '" (' ends the partner's
_LI_NOLINK = re.compile(r'==>\s+(?:\[\s*\]\s+""|"Port not available")')
# ibnetdiscover topology (out_switch_detail / out_ca_detail / out_switch_port / out_ca_port).
_ND_SW = re.compile(rf'^Switch\s+\d+\s+"S-({_HEX})"\s+#\s+"(.*)"\s+\S+\s+port 0 lid (\d+)\s+lmc \d+')
_ND_CA = re.compile(rf'^(?:Ca|Rt)\s+\d+\s+"[HR?]-({_HEX})"\s+#\s+"(.*)"')
_ND_PORT_SW = re.compile(
    rf'^\[(\d+)\](?:\[ext \d+\])?\s+"([HSR?])-({_HEX})"\[(\d+)\](?:\[ext \d+\])?\s*(?:\(({_HEX})\))?\s*'
    rf'#\s+"(.*)"\s+lid (\d+)\b'
)
_ND_PORT_CA = re.compile(
    rf'^\[(\d+)\]\(({_HEX})\)\s+"([HSR?])-({_HEX})"\[(\d+)\](?:\[ext \d+\])?\s*(?:\(({_HEX})\))?\s*'
    rf'#\s+lid (\d+) lmc \d+ "(.*)"\s+lid (\d+)\b'
)
# ibnetdiscover -p (dump_ports_report).
_ND_P = re.compile(  # atomic up to the descriptions, their end checked once: one pass a line (as _LI_PORT)
    rf"^(?>\s*(CA|SW|RT|\?\?)\s+(\d+)\s+(\d+)\s+0x({_HEX})\s+.*?\s+-\s+(CA|SW|RT|\?\?)\s+(\d+)\s+(\d+)\s+0x({_HEX})"
    r"\s+\( ')(?=.*' \)\s*$)(.*)' - '(.*)' \)\s*$"
)
_ND_P_START = re.compile(r"^\s*(CA|SW|RT|\?\?)\s+\d+\s+\d+\s+0x")
_ND_P_NOLINK = re.compile(rf"^\s*(CA|SW|RT|\?\?)\s+\d+\s+\d+\s+0x{_HEX}\s+\S+\s+\S+\s+'.*'\s*$")  # "%36s'%s'"


@dataclass(frozen=True)
class End:
    """One end of a link: a node's description and GUID as the tool printed them, its port and LID."""

    desc: str
    guid: str | None
    port: int
    lid: int | None
    switch: bool = False


@dataclass
class PeerStats:
    links: int = 0
    unparsable_lines: int = 0
    bad_values: int = 0
    too_many: int = 0
    truncated: int = 0


@dataclass
class PeerMap:
    """Each known port's link partner, by (port GUID, port) and by (node description, port)."""

    by_guid: dict[tuple[str, int], End] = field(default_factory=dict)
    by_name: dict[tuple[str, int], End] = field(default_factory=dict)
    stats: PeerStats = field(default_factory=PeerStats)
    # (desc, port, LID) -> port GUID, None where two ports print the same three (SHARP Aggregation
    # Nodes, CAs left at their firmware's description): a line without a GUID is then tied to neither.
    _guids: dict[tuple[str, int, int | None], str | None] = field(default_factory=dict, repr=False)
    _ends: dict[tuple[str, int, int | None], End] = field(default_factory=dict, repr=False)
    _ambiguous: set[tuple[str, int]] = field(default_factory=set, repr=False)  # names with different peers

    def add(self, a: End, b: End) -> None:
        if self.stats.links >= MAX_LINKS:
            self.stats.too_many += 1
            return
        self.stats.links += 1
        for x, y in ((a, b), (b, a)):
            self._name((x.desc, x.port), y)
            key = (x.desc, x.port, x.lid)
            own = x.guid if not x.switch else None  # a switch's ports share its GUID: the name keys them
            if own is not None and self._guids.setdefault(key, own) != own:
                self._guids[key] = None
            _put(self._ends, key, y)
            guid = self._guids.get(key)
            if guid is not None:  # a port seen by GUID once is found by it with what its other lines learn
                _put(self.by_guid, (guid, x.port), self._ends[key])
            elif own is not None:
                _put(self.by_guid, (own, x.port), y)

    def _name(self, name: tuple[str, int], end: End) -> None:
        """Index ``end`` by name unless another node of that description and port has another peer
        (one such name answers no lookup: it would label a port with a stranger's switch port)."""
        if name in self._ambiguous:
            return
        old = self.by_name.get(name)
        if old is not None and not _same(old, end):
            del self.by_name[name]
            self._ambiguous.add(name)
            return
        _put(self.by_name, name, end)

    def peer(self, port: int, guid: str | None = None, names: Iterable[str] = ()) -> End | None:
        """The partner of local ``port``, found by its port GUID, else by a node description.

        >>> m = parse('CA: n1 mlx5_0:\\n      0x0000000000000123      2    1[  ] ==( 4X 25.78125 Gbps '
        ...           'Active/  LinkUp)==>       1    7[  ] "leaf01" ( )\\n')
        >>> m.peer(1, "0x0000000000000123"), m.peer(1, names=["n1 mlx5_0"]).port, m.peer(2, names=["n1 mlx5_0"])
        (End(desc='leaf01', guid=None, port=7, lid=1, switch=False), 7, None)
        """
        if guid is not None and (hit := self.by_guid.get((guid, port))) is not None:
            return hit
        for n in names:
            if (hit := self.by_name.get((n, port))) is not None:
                return hit
        return None

    def labels(self, port: int, guid: str | None = None, names: Iterable[str] = ()) -> dict[str, Any]:
        """``NicRecord`` keyword arguments naming ``port``'s partner (none when it is not known).

        >>> PeerMap().labels(1, "0x0000000000000001")
        {}
        """
        p = self.peer(port, guid, names)
        if p is None:
            return {}
        out: dict[str, Any] = {"peer": p.desc, "peer_port": p.port}
        if p.guid is not None:
            out["peer_guid"] = p.guid
        if p.lid is not None:
            out["peer_lid"] = p.lid
        return out


def _same(a: End, b: End) -> bool:
    """Whether two ends name the same port (a LID printed on one side only does not tell them apart)."""
    return a.desc == b.desc and a.port == b.port and (a.lid is None or b.lid is None or a.lid == b.lid)


def _put(index: dict[_K, End], key: _K, end: End) -> None:
    """Index ``end``; a link seen from both sides keeps the side that printed the GUID
    (iblinkinfo prints a CA's partner without one, the switch's block with it)."""
    old = index.get(key)
    if old is None or not (old.guid is not None and end.guid is None and old.desc == end.desc and old.port == end.port):
        index[key] = end


def norm_guid(text: str) -> str | None:
    """A GUID as ``0x`` and 16 lower-case hex digits (ibnetdiscover drops the zeros and the ``0x``).

    >>> norm_guid("2c903000d7aad"), norm_guid("0x0002C903000D7AAD"), norm_guid("xyz")
    ('0x0002c903000d7aad', '0x0002c903000d7aad', None)
    """
    t = text[2:] if text[:2] in ("0x", "0X") else text
    if not 0 < len(t) <= 16 or not all(c in "0123456789abcdefABCDEF" for c in t):
        return None
    return "0x" + t.lower().rjust(16, "0")


def gid_port_guid(gid: str) -> str | None:
    """The port GUID of a port's GID 0 (sysfs ``ports/<n>/gids/0``: its low 64 bits).

    >>> gid_port_guid("fe80:0000:0000:0000:0002:c903:0029:3e1f"), gid_port_guid("fe80::1")
    ('0x0002c90300293e1f', None)
    """
    parts = gid.strip().split(":")
    if len(parts) != 8 or not all(len(p) == 4 for p in parts):
        return None
    return norm_guid("".join(parts[4:]))


def local_names(host: str, device: str, node_desc: str | None = None) -> list[str]:
    """The node descriptions a local device may have in the fabric: sysfs ``node_desc`` when read,
    then rdma-ndd's default ``<host> <device>`` with the full and the short host name.

    >>> local_names("gpu-7.example.org", "mlx5_0")
    ['gpu-7.example.org mlx5_0', 'gpu-7 mlx5_0']
    """
    out = [node_desc] if node_desc else []
    for h in (host, host.split(".")[0]):
        n = f"{h} {device}"
        if n not in out:
            out.append(n)
    return out


def _desc(text: str, stats: PeerStats) -> str | None:
    d = text.strip()
    if not d or len(d) > MAX_DESC or not d.isprintable():
        stats.bad_values += 1
        return None
    return d


def _num(text: str, limit: int) -> int | None:
    n = ascii_int(text, 6)
    return n if n is not None and n <= limit else None


def _end(
    desc: str | None, guid: str | None, port: str, lid: str | None, stats: PeerStats, switch: bool = False
) -> End | None:
    p = _num(port, MAX_PORT)
    l_ = None if lid is None else _num(lid, MAX_LID)
    g = None if guid is None else norm_guid(guid)
    if desc is None or p is None or (lid is not None and l_ is None) or (guid is not None and g is None):
        if desc is not None:
            stats.bad_values += 1
        return None
    return End(desc, g, p, l_, switch)


def parse(text: str, stats: PeerStats | None = None) -> PeerMap:
    """Every link ``text`` (any of the four layouts, even mixed) names, both ways.

    >>> m = parse('Ca  1 "H-0002c903000d7aac"  # "n1 HCA-1"\\n'
    ...           '[1](2c903000d7aad)  "S-0002c9020046c588"[33]  # lid 5 lmc 0 "sw1" lid 2 4xQDR\\n')
    >>> m.peer(1, "0x0002c903000d7aad")
    End(desc='sw1', guid='0x0002c9020046c588', port=33, lid=2, switch=True)
    """
    m = PeerMap(stats=stats if stats is not None else PeerStats())
    st = m.stats
    node: End | None = None  # the node whose block the lines are in (desc, guid, lid; port 0)
    for raw in lines(text):
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if len(line) > MAX_LINE:
            st.unparsable_lines += 1
            continue
        if (h := _LI_SW.match(line)) is not None:
            d = _desc(h.group(2), st)
            node = None if d is None else End(d, norm_guid(h.group(1)), 0, None, True)
            continue
        if (h := _LI_CA.match(line)) is not None:
            d = _desc(h.group(2), st)
            node = None if d is None else End(d, None, 0, None, False)
            continue
        if (h := _ND_SW.match(line)) is not None:
            d = _desc(h.group(2), st)
            node = None if d is None else End(d, norm_guid(h.group(1)), 0, _num(h.group(3), MAX_LID), True)
            continue
        if (h := _ND_CA.match(line)) is not None:
            d = _desc(h.group(2), st)
            node = None if d is None else End(d, None, 0, None, False)
            continue
        if _has_link(line):
            _iblinkinfo_port(m, node, line)
        elif line.startswith("["):
            _ibnetdiscover_port(m, node, line)
        elif _ND_P_START.match(line):
            _ports_line(m, line)
    return m


def _has_link(line: str) -> bool:
    """Whether ``line`` holds iblinkinfo's ``==(...)==>`` (a search, not a regex: one pass)."""
    i = line.find("==(")
    return i >= 0 and line.find(")==>", i + 3) >= 0


def _iblinkinfo_port(m: PeerMap, node: End | None, line: str) -> None:
    st = m.stats
    if _LI_NOLINK.search(line):
        return  # a port with no link: nothing to learn
    p = _LI_PORT.match(line)
    if p is None:
        st.unparsable_lines += 1
        return
    if p.group("desc") is not None:  # -l: the node is on the line
        d = _desc(p.group("desc"), st)
        switch = False
    elif node is not None:
        d, switch = node.desc, node.switch
    else:
        st.unparsable_lines += 1  # a port line outside any node's block
        return
    guid = p.group("guid")
    if switch and guid is None and node is not None:
        guid = node.guid
    a = _end(d, guid, p.group("port"), p.group("lid"), st, switch)
    b = _end(_desc(p.group("rdesc"), st), p.group("rguid"), p.group("rport"), p.group("rlid"), st)
    if a is not None and b is not None:
        m.add(a, b)


def _ibnetdiscover_port(m: PeerMap, node: End | None, line: str) -> None:
    st = m.stats
    if node is None:
        st.unparsable_lines += 1
        return
    if node.switch:
        p = _ND_PORT_SW.match(line)
        if p is None:
            st.unparsable_lines += 1
            return
        port, kind, rnode, rport, rport_guid, rdesc, rlid = p.groups()
        a = _end(node.desc, node.guid, port, str(node.lid) if node.lid is not None else None, st, True)
        b = _end(_desc(rdesc, st), rport_guid if kind != "S" else rnode, rport, rlid, st, kind == "S")
    else:
        p = _ND_PORT_CA.match(line)
        if p is None:
            st.unparsable_lines += 1
            return
        port, guid, kind, rnode, rport, rport_guid, lid, rdesc, rlid = p.groups()
        a = _end(node.desc, guid, port, lid, st)
        b = _end(_desc(rdesc, st), rport_guid if kind != "S" else rnode, rport, rlid, st, kind == "S")
    if a is not None and b is not None:
        m.add(a, b)


def _ports_line(m: PeerMap, line: str) -> None:
    st = m.stats
    p = _ND_P.match(line)
    if p is None:
        if not _ND_P_NOLINK.match(line):  # a port with no link: nothing to learn
            st.unparsable_lines += 1
        return
    kind, lid, port, guid, rkind, rlid, rport, rguid, desc, rdesc = p.groups()
    a = _end(_desc(desc, st), guid, port, lid, st, kind == "SW")
    b = _end(_desc(rdesc, st), rguid, rport, rlid, st, rkind == "SW")
    if a is not None and b is not None:
        m.add(a, b)


class PeerFile:
    """A ``--peers`` file, read at start and again whenever its modification time, size or inode
    changes (a cron job that refreshes it is picked up on the next poll); counts go to ``stats``."""

    def __init__(self, path: str, max_chars: int = MAX_TEXT_CHARS) -> None:
        self.path, self.max_chars = path, max_chars
        self.stats = PeerStats()
        self.map = PeerMap(stats=self.stats)
        self._version: tuple[int, ...] | None = None
        self.current()

    def current(self) -> PeerMap:
        """The map of the file as it is now (the last one read when it has not changed or cannot be read)."""
        try:
            st = os.stat(self.path)
        except OSError as e:
            if self._version is None:
                log.warning("--peers %s: %s; no port is given a peer", self.path, e)
                self._version = ()
            return self.map
        # The size and inode too: a write within one tick of a coarse clock (ext4's, xfs's) keeps the mtime.
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        if version == self._version:
            return self.map
        again, self._version = self._version is not None, version
        if again and not stat.S_ISREG(st.st_mode):  # a FIFO would block every poll from here on
            log.warning("--peers %s: no longer a regular file; the links read before are kept", self.path)
            return self.map
        try:
            text, cut = read_capped(self.path, self.max_chars)
        except OSError as e:
            if not again:
                raise  # at start: the producer says it cannot start, and why
            log.warning("--peers %s: %s; the links read before are kept", self.path, e)
            return self.map
        stats = PeerStats(truncated=int(cut))
        self.map = parse(text, stats)
        self.stats = stats
        if cut:
            log.warning("--peers %s: longer than %d characters; the rest is not read", self.path, self.max_chars)
        log.info("--peers %s: %d links", self.path, stats.links)
        return self.map

    def summary(self) -> dict[str, int]:
        """Counts for the producer's summary (``peers.links`` and ``dropped.peers_*``)."""
        s = self.stats
        return {
            "peers.links": s.links,
            "dropped.peers_unparsable_line": s.unparsable_lines,
            "dropped.peers_bad_value": s.bad_values,
            "dropped.peers_too_many": s.too_many,
            "dropped.peers_truncated": s.truncated,
        }


__all__ = ["End", "PeerFile", "PeerMap", "PeerStats", "gid_port_guid", "local_names", "norm_guid", "parse"]
