"""NVIDIA's XID catalogue (``data/xid_catalog.csv``): what each XID means and what to do.

The rule language reads it through ``xid_severity(xid)`` (a number per sample, vectorised by a
lookup table) and alerts of rules that read ``xid`` carry its text (``xid_meaning``,
``xid_action``, ...) in their evidence and summary; see docs/rules.md#xids.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources

import numpy as np

SEVERITY_LEVEL = {"critical": 3.0, "warning": 2.0, "info": 1.0}

# Evidence and summary names every rule that reads ``xid`` may use.
TEXT_NAMES = ("xid_mnemonic", "xid_meaning", "xid_action", "xid_severity_name", "xid_immediate_action")


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One row of the catalogue."""

    xid: int
    mnemonic: str
    description: str
    immediate_action: str  # NVIDIA's resolution bucket (RESET_GPU, RESTART_APP, ...); "" if none
    investigatory_action: str
    severity: str  # critical | warning | info (docs/rules.md#xids)
    action: str  # what to do, in words


def _load() -> dict[int, XidEntry]:
    text = (resources.files("pipeline") / "data" / "xid_catalog.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(io.StringIO("".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("#"))))
    out: dict[int, XidEntry] = {}
    for r in rows:
        e = XidEntry(
            int(r["xid"]),
            r["mnemonic"],
            r["description"],
            r["immediate_action"],
            r["investigatory_action"],
            r["severity"],
            r["action"],
        )
        if e.severity not in SEVERITY_LEVEL:
            raise ValueError(
                f"xid_catalog.csv: XID {e.xid}: severity {e.severity!r} is not one of {', '.join(SEVERITY_LEVEL)}"
            )
        out[e.xid] = e
    return out


CATALOG: dict[int, XidEntry] = _load()

# An XID newer than the catalogue must not pass unnoticed: it counts as a warning.
UNKNOWN_SEVERITY = "warning"
UNKNOWN_ACTION = (
    "not in gpuwarden's XID catalogue (a newer driver?): look it up in NVIDIA's XID "
    "documentation and collect nvidia-bug-report.sh output"
)

_TABLE = np.full(max(CATALOG) + 1, SEVERITY_LEVEL[UNKNOWN_SEVERITY])
for _x, _e in CATALOG.items():
    _TABLE[_x] = SEVERITY_LEVEL[_e.severity]


def lookup(xid: float | int | None) -> XidEntry | None:
    """The catalogue's entry for an XID value (None for no XID: unknown, 0 or not an integer).

    An XID the catalogue does not have gets an entry of its own saying so (severity warning)."""
    if xid is None or xid != xid or xid <= 0 or float(xid) != int(xid):
        return None
    x = int(xid)
    return CATALOG.get(x) or XidEntry(x, "", "XID not in the catalogue", "", "", UNKNOWN_SEVERITY, UNKNOWN_ACTION)


def severity_levels(xid: np.ndarray) -> np.ndarray:
    """``xid_severity()``: 3 critical, 2 warning, 1 info per value; NaN (unknown) for no XID (NaN
    or 0). XIDs outside the catalogue are warnings."""
    out = np.full(len(xid), np.nan)
    with np.errstate(invalid="ignore"):
        have = (xid > 0) & (xid == np.floor(xid))  # NaN compares false
    if have.any():
        x = xid[have]
        inside = x < len(_TABLE)
        lv = np.full(len(x), SEVERITY_LEVEL[UNKNOWN_SEVERITY])
        lv[inside] = _TABLE[x[inside].astype(np.int64)]
        out[have] = lv
    return out


def evidence_text(xid: float | None) -> dict[str, str]:
    """What an alert about XID ``xid`` says beside the number: its mnemonic, meaning, severity and
    what to do (empty strings for no XID)."""
    e = lookup(xid)
    if e is None:
        return dict.fromkeys(TEXT_NAMES, "")
    return {
        "xid_mnemonic": e.mnemonic,
        "xid_meaning": e.description,
        "xid_action": e.action,
        "xid_severity_name": e.severity,
        "xid_immediate_action": e.immediate_action,
    }
