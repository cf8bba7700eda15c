"""Which XIDs NVIDIA's catalogue files under which immediate-action bucket (``RESTART_APP``,
``IGNORE``, ``RESET_GPU`` ...): the incident policies name buckets, not lists of numbers, so a
catalogue update reaches them (pipeline/data/xid_catalog.csv, docs/rules.md#xids)."""

from __future__ import annotations

import csv
import functools
import io
from importlib import resources


@functools.lru_cache(maxsize=1)
def buckets() -> dict[str, frozenset[int]]:
    """Immediate-action bucket -> the XIDs in it.

    >>> 13 in buckets()["RESTART_APP"], 79 in buckets()["RESTART_APP"]
    (True, False)
    """
    text = (resources.files("pipeline") / "data" / "xid_catalog.csv").read_text(encoding="utf-8")
    body = "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("#"))
    out: dict[str, set[int]] = {}
    for row in csv.DictReader(io.StringIO(body)):
        out.setdefault(row["immediate_action"].strip(), set()).add(int(row["xid"]))
    return {k: frozenset(v) for k, v in out.items()}
