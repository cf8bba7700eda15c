"""``ibstat`` and ``ibstatus`` output -> ``NicRecord``s, one per port (no counters: neither prints any).

Layouts (rdma-core ``infiniband-diags/ibstat.c`` and ``scripts/ibstatus``; docs/producers.md):

- ``ibstat``: a ``CA 'mlx5_0'`` line (``Switch``, ``Router``, ``iWARP RNIC`` for other node
  types), its attributes indented one level, then each ``Port N:`` with ``State: Active``,
  ``Physical state: LinkUp``, ``Rate: 400`` (``2.5`` for 1X SDR, ``40 (FDR10)``), newer releases
  ``Effective speed: 400``, and ``Link layer: InfiniBand`` (or ``Ethernet``), indented two levels.
  Tabs as the tool writes them, spaces where a terminal copy turned them into spaces; the names
  are ``port_state_str`` (``Down``, ``Initializing``, ``Armed``, ``Active``, ``???``) and
  ``port_phy_state_str`` (``Sleep``, ``Polling``, ``Disabled``, ``LinkUp``, ``LinkErrorRecovery``...).
  ``ibstat CA PORT`` prints one port as ``CA: 'mlx5_0'`` (a colon, ``ca_stat``) then the port
  block without indentation. A port with no CA line before it (a cut copy) has no device
  (``--device`` names it, else it is counted as ``dropped.no_device``).
- ``ibstat`` failing on a device prints ``ibpanic: [pid] main: stat of IB device 'mlx5_8' failed:
  ...`` and stops (before rdma-core v54), or ``ibwarn: [pid] main: stat of IB device 'mlx5_8'
  failed`` and goes on to the next (v54 on); ``ibwarn: [pid] ca_stat: CA: 'mlx5_0' has no port
  number 2 - max (1)`` for a port that is not there; ``ibstatus`` prints ``Fatal error:  ...``
  and stops. Each is counted as ``dropped.tool_error`` (those ports are missing from the records).
- ``Port GUID: 0x...`` (ibstat) and ``default gid: fe80:...`` (ibstatus, its low 64 bits) are the
  record's ``port_guid`` (``0x`` and 16 lower-case hex digits; all zero or not a GUID: none), which
  a driver reload that renames the CA keeps; they find the port's link partner in ``--peers``
  (``producers/ibpeers.py``), else the CA's ``<host> <CA>`` node description does; it fills the
  record's ``peer*`` fields.
- ``ibstatus``: ``Infiniband device 'mlx5_0' port 1 status:`` then the sysfs files as they are
  (``state: 4: ACTIVE``, ``phys state: 5: LinkUp``, ``rate: 200 Gb/sec (4X HDR)``,
  ``link_layer: InfiniBand``), ``unknown`` for a file it could not read.

A value that does not read (``Rate: ²``, ``State: 9: ZAP``) is counted as
``dropped.unparsable_value`` and left out of its record; the rest of the port is kept. Ports past
``MAX_PORTS`` are ``dropped.too_many``. A ``Port GUID:`` line without a value is a port without a
GUID (no ``port_guid``), not a port header.

Both tools end every port block with its link layer line (``ibstat.c``'s ``port_dump`` prints a
block whole; ``ibstatus`` prints ``link_layer:`` last, ``unknown`` or nothing after it when it
could not read the file, which still ends the block). The input's last port block without one is a
capture cut at a line's end (a file still being written, or truncated): that port is not sent (its
values are any part of the port's), it is counted as ``dropped.cut_port`` with a warning naming it,
and the CLI exits 3; the ports before it are kept, and where the same port was printed whole
earlier (captures appended to one file) that block is its record. A tool error or a CA line after
the last block ends it, so neither is a cut, nor is a CA with no port block. Where the last line
has no newline (``dropped.cut_last_line``) or the text was cut at ``max_chars``
(``dropped.truncated``), that is the cut counted, and its port keeps the values read whole.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from pipeline.decode import MAX_NIC_PORT
from pipeline.numeric import ascii_int
from pipeline.schema import NicRecord
from producers.ibports import (
    IBSTAT_PHYS_STATES,
    IBSTAT_STATES,
    PHYS_STATE_NAMES,
    STATE_NAMES,
    coded_state,
    lines,
    name_ok,
    rate_gbps,
)
from producers.ibpeers import PeerFile, PeerMap, gid_port_guid, local_names, norm_guid
from producers.textinput import (
    CUT_LAST_LINE,
    GzipDamage,
    damage_counts,
    read_input,
    split_cut_line,
    warn_cut_line,
    warn_damage,
)

log = logging.getLogger(__name__)

_CA = re.compile(r"^(CA|Switch|Router|iWARP RNIC|\?\?\?):? '(.*)'\s*$")  # "CA: '...'" for one port
# Neither is ``Port GUID:``, the key of a port's GUID line: without a value (``\t\tPort GUID: ``) it
# is a port without a GUID, not a header with no number nor a header cut.
_PORT = re.compile(r"^\s*Port (?!GUID:)(\S+):\s*$")
_PORT_CUT = re.compile(r"^\s*Port (?!GUID:)\S{1,32}\s*$")  # a header that lost its colon (a damaged copy)
_IBSTATUS = re.compile(r"^Infiniband device '(.*)' port (\S+) status:\s*$")
# A key starts with a letter and its value is stripped after the match: a run of spaces then has
# one way to be split between the parts, so a long line costs one pass.
_KV = re.compile(r"^\s*([A-Za-z_][A-Za-z_ ]*?):(.*)$")
# ibstat's IBPANIC, its IBWARN that a device or port failed (rdma-core v54 on), ibstatus's fatal().
_PANIC = re.compile(
    r"^(ibpanic:|ibwarn: \[\d+\] \w+: (stat of IB device '.*' failed|.* has no port number )|Fatal error: )"
)
_NO_GUID = norm_guid("0")  # ``Port GUID: 0x0000000000000000``: a port with no GUID set
MAX_PORT_DIGITS = 5  # MAX_NIC_PORT is 65535
# The count of a last port block cut before its link layer line (exit 3, as a cut last line).
CUT_PORT = "dropped.cut_port"
MAX_TEXT_CHARS = 16 * 1024 * 1024  # ibstat of 64 CAs is ~40 KB; this bounds what one poll holds
MAX_PORTS = 16_384  # ib-sysfs's 256 devices of 64 ports; 16 Mi characters of "Port 1:" would be 2 Mi records


@dataclass
class IbstatStats:
    cas: int = 0
    ports: int = 0
    unparsable_values: int = 0  # a State/Rate/... whose value does not read: left out of its port
    unparsable_lines: int = 0  # a CA or Port header whose name or number is not one: its ports left out
    no_device: int = 0  # a port printed without its CA (``ibstat CA PORT``) and no --device
    tool_errors: int = 0  # ibpanic/ibwarn/Fatal error lines: a device or port the tool could not read
    truncated: int = 0
    too_many: int = 0  # ports past MAX_PORTS: left out
    duplicate_ports: int = 0  # a port printed again later in the input: the earlier block left out
    cut_last_line: int = 0  # a last line without its newline ("Rate: 40" of 400): not read
    # The last port block ending before its link layer line, which ends every block either tool
    # prints: a capture cut at a line's end (still being written, or truncated); the port not sent.
    cut_ports: int = 0
    cut_port: str = ""  # that port, as "mlx5_0 port 1", for the warning


# A last line without its newline that is whole all the same: a link layer, a word no cut makes.
_WHOLE_LAST = re.compile(r"[ \t]*(?:Link layer|link_layer):[ \t]*(?:InfiniBand|Ethernet)[ \t\r]*")


_LINK_LAYER = ("link layer", "link_layer")  # the key of the line that ends a port block, in ibstat and ibstatus


def _port_num(text: str) -> int | None:
    n = ascii_int(text, MAX_PORT_DIGITS)
    return n if n is not None and n <= MAX_NIC_PORT else None


class _Port:
    def __init__(self, device: str | None, port: int) -> None:
        self.device, self.port = device, port
        self.fields: dict[str, Any] = {}
        self.guid: str | None = None  # its port GUID, for --peers
        self.keys: set[str] = set()  # the keys its block gave a value: each once in either tool
        self.ended = False  # its link layer line was read (whatever its value): the block is whole


def _set_state(p: _Port, key: str, value: str, stats: IbstatStats) -> bool:
    """One ``Key: value`` line of a port block, in either tool's spelling; whether it gave a value."""
    k = key.strip().lower()
    if k == "state":
        coded = coded_state(value) if ":" in value else None
        num = coded[0] if coded else IBSTAT_STATES.get(value)
        if num is None:
            if value not in ("???", "unknown"):
                stats.unparsable_values += 1
            return False
        p.fields["state"], p.fields["state_name"] = num, STATE_NAMES.get(num, coded[1] if coded else value)
    elif k in ("physical state", "phys state"):
        coded = coded_state(value) if value[:1].isdigit() else None
        num = coded[0] if coded else IBSTAT_PHYS_STATES.get(value)
        if num is None:
            if value not in ("???", "unknown"):
                stats.unparsable_values += 1
            return False
        p.fields["phys_state"] = num
        p.fields["phys_state_name"] = PHYS_STATE_NAMES.get(num, coded[1] if coded else value)
    elif k == "rate":
        r = rate_gbps(value)
        if r is None:
            if value != "unknown":
                stats.unparsable_values += 1
            return False
        p.fields["rate_gbps"] = r
    elif k == "port guid":
        p.guid = norm_guid(value)
    elif k == "default gid":
        p.guid = gid_port_guid(value)
    elif k in _LINK_LAYER:
        if name_ok(value):
            p.fields["link_layer"] = value
        else:
            stats.unparsable_values += 1
            return False
    return True


def parse(
    text: str,
    *,
    ts: float,
    host: str,
    device: str | None = None,
    stats: IbstatStats | None = None,
    peers: PeerMap | None = None,
    end_counted: bool = False,
) -> list[NicRecord]:
    """Every port ``ibstat`` or ``ibstatus`` printed in ``text``, as records at ``ts`` on ``host``.

    Both tools end every port block with its link layer line: a last block without one is a
    capture cut at a line's end, counted as ``cut_ports`` and not sent (its other values may be
    any part of the port's). Not where ``end_counted``: the text stops where a cut already counted
    stopped it (a last line without its newline, the cap), and that port keeps what was read whole.

    >>> out = parse("CA 'mlx5_0'\\n\\tCA type: MT4129\\n\\tPort 1:\\n\\t\\tState: Down\\n"
    ...             "\\t\\tPhysical state: Disabled\\n\\t\\tRate: 40\\n\\t\\tLink layer: Ethernet\\n",
    ...             ts=1764403200.0, host="n1")
    >>> [(r.device, r.port, r.state, r.state_name, r.phys_state_name, r.rate_gbps, r.link_layer) for r in out]
    [('mlx5_0', 1, 1, 'DOWN', 'Disabled', 40.0, 'Ethernet')]
    """
    stats = stats if stats is not None else IbstatStats()
    ports: list[_Port] = []
    ca: str | None = device
    ca_bad = False  # the CA line's name was no name: its ports are that line's one drop
    cur: _Port | None = None
    for line in lines(text):
        if not line.strip():
            continue
        if _PANIC.match(line):
            stats.tool_errors += 1
            cur = None
            continue
        m = _CA.match(line) or _IBSTATUS.match(line)
        if m is not None and m.re is _CA:
            stats.cas += 1
            cur = None
            ca = m.group(2) if name_ok(m.group(2)) else None
            ca_bad = ca is None
            if ca_bad:
                stats.unparsable_lines += 1
            continue
        if m is not None:  # ibstatus: device and port on one line
            name, num = m.group(1), _port_num(m.group(2))
            cur = None
            if not name_ok(name) or num is None:
                stats.unparsable_lines += 1
                continue
            if len(ports) >= MAX_PORTS:
                stats.too_many += 1
                continue
            cur = _Port(name, num)
            ports.append(cur)
            continue
        pm = _PORT.match(line)
        if pm is not None:
            num = _port_num(pm.group(1))
            cur = None
            if ca_bad:
                continue
            if num is None:
                stats.unparsable_lines += 1
                continue
            if len(ports) >= MAX_PORTS:
                stats.too_many += 1
                continue
            cur = _Port(ca, num)
            ports.append(cur)
            continue
        if _PORT_CUT.match(line):
            stats.unparsable_lines += 1  # the next port's values are not this one's
            cur = None
            continue
        kv = _KV.match(line)
        if kv is not None and cur is not None:
            key = kv.group(1).strip().lower()
            cur.ended = cur.ended or key in _LINK_LAYER
            if key in cur.keys:  # a key again: garbage, or the next port's values after its header was lost
                stats.unparsable_values += 1
                continue
            if _set_state(cur, key, kv.group(2).strip(), stats):
                cur.keys.add(key)
    # An infiniband-diags build without link-layer support (before rdma-core, its
    # HAVE_UMAD_PORT_LINK_LAYER guard) prints no block's link layer: then none ending is no cut.
    old_build = len(ports) > 1 and not any(p.ended for p in ports)
    if cur is not None and not cur.ended and not end_counted and not old_build:
        # The text ends inside the last port block: a tool error, a CA line or a damaged header
        # after it would have ended the block (cur None), and only a port header sets cur.
        ports.pop()
        stats.ports += 1
        stats.cut_ports += 1
        stats.cut_port = f"{cur.device or '(no CA)'} port {cur.port}"
    out = []
    # A port printed twice (captures appended to one file): the last is the latest state, and one
    # read makes one record a port, as each record of a second is the port's whole state.
    last = {(p.device, p.port): i for i, p in enumerate(ports)}
    for i, p in enumerate(ports):
        stats.ports += 1
        if p.device is None:
            stats.no_device += 1
            continue
        if last[(p.device, p.port)] != i:
            stats.duplicate_ports += 1
            continue
        found = peers.labels(p.port, p.guid, local_names(host, p.device)) if peers is not None else {}
        if p.guid is not None and p.guid != _NO_GUID:
            found = {**found, "port_guid": p.guid}
        out.append(NicRecord(ts=ts, host=host, device=p.device, port=p.port, **p.fields, **found))
    return out


class IbstatSource:
    """A finite source: the whole file (or stdin) in one poll, up to ``max_chars`` characters (the
    rest counted as ``dropped.truncated``). Records are stamped with ``clock()`` at the poll."""

    def __init__(
        self,
        path: str,
        *,
        host: str | None = None,
        device: str | None = None,
        max_chars: int = MAX_TEXT_CHARS,
        peers: PeerFile | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path, self.host, self.device = path, host or socket.gethostname(), device
        self.peers = peers
        self.max_chars, self.clock = max_chars, clock
        self.done = False
        self.stats = IbstatStats()
        self.damage: GzipDamage | None = None  # what ended a gzip input early (lost input, exit 3)
        self.unrecognised = False  # text, but not one line of ibstat or ibstatus output (the CLI exits 3)

    def poll(self) -> list[NicRecord]:
        self.done = True
        text, cut, self.damage = read_input(self.path, self.max_chars)
        warn_damage(self.path, self.damage)
        text, tail = split_cut_line(text)
        if _WHOLE_LAST.fullmatch(tail):
            # The link layer ends every port block and cannot be cut into another word: a capture
            # that dropped the final newline ($(ibstat), a strip()) is whole.
            text, tail = text + tail + "\n", ""
        if cut:
            self.stats.truncated = 1  # the line the cap cut is part of what it counts
            log.warning(
                "%s: longer than %d characters; the rest is not read (dropped.truncated)", self.path, self.max_chars
            )
        elif tail.strip():
            # Both tools end every line with a newline: one without may end inside a value.
            self.stats.cut_last_line = 1
            warn_cut_line(self.path, tail)
        peer_map = self.peers.current() if self.peers is not None else None
        recs = parse(
            text,
            ts=self.clock(),
            host=self.host,
            device=self.device,
            stats=self.stats,
            peers=peer_map,
            end_counted=bool(cut or tail.strip()),
        )
        if self.stats.cut_ports:
            log.warning(
                "%s: the last port block (%s) ends before its link layer line, which ends every block "
                "ibstat and ibstatus print: the capture was cut (still being written, or truncated); "
                "that port is not sent (%s)",
                "stdin" if self.path == "-" else self.path,
                self.stats.cut_port,
                CUT_PORT,
            )
        st = self.stats
        self.unrecognised = bool(text.strip()) and not (st.cas or st.ports or st.tool_errors or st.unparsable_lines)
        if not recs:
            log.warning("%s: no ibstat or ibstatus port found", self.path)
        return recs

    def summary(self) -> dict[str, int]:
        """Counts for the exit summary (what was read and what was left out, by reason)."""
        s = self.stats
        return {
            "cas": s.cas,
            "ports": s.ports,
            "dropped.unparsable_value": s.unparsable_values,
            "dropped.unparsable_line": s.unparsable_lines,
            "dropped.no_device": s.no_device,
            "dropped.tool_error": s.tool_errors,
            "dropped.truncated": s.truncated,
            "dropped.too_many": s.too_many,
            CUT_LAST_LINE: s.cut_last_line,
            CUT_PORT: s.cut_ports,
            "ports_superseded": s.duplicate_ports,  # not lost: a later block of the port was read
            **damage_counts(self.damage),
            **(self.peers.summary() if self.peers is not None else {}),
        }

    def close(self) -> None:
        pass


__all__ = ["IbstatSource", "IbstatStats", "parse"]
