"""What the InfiniBand/RoCE producers share: the port state tables and the value parsers.

The kernel prints a port's state as ``4: ACTIVE`` and its physical state as ``5: LinkUp``
(``drivers/infiniband/core/sysfs.c``; the ABI is ``Documentation/ABI/stable/sysfs-class-infiniband``),
``ibstat`` as ``Active`` and ``LinkUp`` (rdma-core ``infiniband-diags/ibstat.c``). A record carries
the number and the kernel's name, whichever tool read it, so a rule compares one spelling.
"""

from __future__ import annotations

import re
from typing import Iterator

from pipeline.decode import MAX_NIC_NAME, MAX_PORT_STATE, MAX_RATE_GBPS, bad_identifier
from pipeline.numeric import ascii_float, ascii_int

# IBTA port states (the kernel's names; 5 ACTIVE_DEFER is the kernel's own).
STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
# IBTA physical port states (the kernel's names, ib_port_phys_state_str).
PHYS_STATE_NAMES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
# ibstat's spellings (port_state_str, port_phy_state_str) -> the numbers.
IBSTAT_STATES = {"Down": 1, "Initializing": 2, "Armed": 3, "Active": 4}
IBSTAT_PHYS_STATES = {
    "No state change": 0,
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "PhyTest": 7,
}

_CODED = re.compile(r"^(\S+):\s*(.+)$")


def coded_state(text: str) -> tuple[int, str] | None:
    """A sysfs ``state``/``phys_state`` value (``4: ACTIVE``, ``5: LinkUp``, ``7: Phy Test``) as
    (number, name); None when it is not one (a number of Unicode digits, a name no identifier).

    >>> coded_state("4: ACTIVE"), coded_state("5: LinkUp\\n"), coded_state("٤: ACTIVE")
    ((4, 'ACTIVE'), (5, 'LinkUp'), None)
    """
    m = _CODED.match(text.strip())
    if m is None:
        return None
    num, name = ascii_int(m.group(1), 2), m.group(2).strip()
    if num is None or num > MAX_PORT_STATE or bad_identifier(name, MAX_NIC_NAME) is not None:
        return None
    return num, name


def rate_gbps(text: str) -> float | None:
    """A port's rate in Gb/s from sysfs (``400 Gb/sec (4X NDR)``, ``2.5 Gb/sec (1X SDR)``, which
    older kernels print ``2.5 Gb/sec (1X)``) or ibstat (``400``, ``2.5``, ``40 (FDR10)``); None
    when the first token is not a plausible number.

    >>> rate_gbps("400 Gb/sec (4X NDR)"), rate_gbps("2.5"), rate_gbps("40 (FDR10)"), rate_gbps("1e999")
    (400.0, 2.5, 40.0, None)
    """
    head = text.strip().split(None, 1)
    if not head:
        return None
    x = ascii_float(head[0], 16)
    return x if x is not None and 0 <= x <= MAX_RATE_GBPS else None


_LINE = re.compile(r"[^\r\n]+")


def lines(text: str) -> Iterator[str]:
    """``text``'s lines that are not empty, one at a time (``splitlines`` would hold a list of them
    all: some 50 bytes a line on top of the text, 20 times a file of short lines).

    >>> list(lines("CA 'mlx5_0'\\r\\n\\n\\tPort 1:"))
    ["CA 'mlx5_0'", '\\tPort 1:']
    """
    return (m.group() for m in _LINE.finditer(text))


def name_ok(name: str) -> bool:
    """Whether ``name`` can be a device, netdev or counter name in a record (decode's rule)."""
    return bad_identifier(name, MAX_NIC_NAME, host=True) is None


__all__ = [
    "IBSTAT_PHYS_STATES",
    "IBSTAT_STATES",
    "PHYS_STATE_NAMES",
    "STATE_NAMES",
    "coded_state",
    "lines",
    "name_ok",
    "rate_gbps",
]
