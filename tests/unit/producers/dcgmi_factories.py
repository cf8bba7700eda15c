"""Builders of ``dcgmi dmon`` output for the producer's tests, laid out as DCGM's
``dcgmi/DeviceMonitor.cpp`` prints it."""

from __future__ import annotations

from producers.dcgmi import DmonParser


def dmon(entity_width: int, cols: list[tuple[str, str, int]], rows: list[tuple[str, list[str]]]) -> str:
    """Heading, units row and ``rows`` left-aligned as DeviceMonitor.cpp prints them: the entity
    cell padded to ``entity_width`` (and not cut, so a longer one touches the next cell), each
    value padded to its column's width (trailing padding kept)."""
    head = "#Entity".ljust(entity_width) + "".join(n.ljust(w) for n, _, w in cols)
    units = "ID".ljust(entity_width) + "".join(u.ljust(w) for _, u, w in cols)
    body = [e.ljust(entity_width) + "".join(v.ljust(w) for v, (_, _, w) in zip(vals, cols)) for e, vals in rows]
    return "\n".join([head, units, *body]) + "\n"


def parse_dmon(text: str) -> tuple[list, DmonParser]:
    """The records of ``text`` read by one parser (host ``h``), and the parser for its counts."""
    p = DmonParser("h", clock=lambda: 1.0e9)
    return list(p.parse(text.splitlines())), p
