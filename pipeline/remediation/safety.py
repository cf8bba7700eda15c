"""Values from alerts that may reach a command line or URL, and the templates that place them.

Commands run without a shell, so ``;`` or ``$(...)`` would not be interpreted; they are refused
anyway, because the programs we call parse their own arguments: a host named ``--all`` or
``-h`` would be an option to ``scontrol``/``kubectl``. Hostnames follow RFC 1123; every other
value has its own narrow pattern, and no value may start with ``-``.

Templates use ``{name}`` only (no format specs, no attribute access: ``str.format`` would let
``{host.__class__}`` walk objects).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pipeline.schema import AlertEvent

# Every pattern is applied with fullmatch: with re.match, ``$`` also matches before a trailing
# newline, so ``gpu-node-007\n`` passed and became a broken URL or a two-line argv element.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/+-]{0,255}")
_SIGNAL = re.compile(r"(?:SIG)?[A-Z0-9]{2,8}")

TEMPLATE_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_.-]+)?)\}")
# Free text: fine in a log line or a JSON body, never in argv.
TEXT_ONLY = {"summary"}


class UnsafeValue(ValueError):
    """A value that may not be placed into a command or URL; the message says which and why."""


class MissingValue(KeyError):
    """The alert has no value for a template variable (a job-wide alert has no host)."""

    def __str__(self) -> str:
        return f"alert has no {self.args[0]}"


def valid_hostname(value: str) -> bool:
    """RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, <= 253 chars."""
    return len(value) <= 253 and bool(HOSTNAME.fullmatch(value))


def check_value(name: str, value: Any) -> str:
    """The value as it may appear in argv/URLs, or ``UnsafeValue`` naming the variable."""
    if isinstance(value, bool) or value is None:
        raise UnsafeValue(f"{name}={value!r} is not a usable value")
    if name in ("gpu", "link"):
        if not isinstance(value, int) or value < 0 or value > 1023:
            raise UnsafeValue(f"{name}={value!r} is not a GPU/link index")
        return str(value)
    s = str(value)
    if name == "host":
        if not valid_hostname(s):
            raise UnsafeValue(f"host {s!r} is not an RFC 1123 hostname")
        if s.lower() == "all":
            # Slurm reads a node name ALL (any case) as every node: one alert would drain the fleet.
            raise UnsafeValue(f"host {s!r} means every node to Slurm (scontrol, sinfo); not a node name")
        return s
    if name == "job":
        ok = _JOB.fullmatch(s)
    elif name == "signal":
        ok = _SIGNAL.fullmatch(s)
    elif name.startswith("labels."):
        ok = _LABEL_VALUE.fullmatch(s)
    else:
        ok = _NAME.fullmatch(s)
    if not ok:
        raise UnsafeValue(f"{name} {s!r} contains characters not allowed in a command line")
    return s


def alert_values(alert: AlertEvent, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The variables a template may name: alert fields, ``family``, ``labels.<name>``."""
    v: dict[str, Any] = {
        "id": alert.id,
        "state": alert.state,
        "fault": alert.fault,
        "family": alert.family,
        "severity": alert.severity,
        "rule": alert.rule,
        "host": alert.host,
        "gpu": alert.gpu,
        "link": alert.link,
        "job": alert.job or alert.labels.get("job"),
        "summary": alert.summary,
    }
    for k, val in alert.labels.items():
        v[f"labels.{k}"] = val
    if extra:
        v.update(extra)
    return v


def template_vars(template: str) -> list[str]:
    return TEMPLATE_VAR.findall(template)


def fill(template: str, values: Mapping[str, Any], *, for_argv: bool = True) -> str:
    """Replace each ``{name}``; for argv/URLs every value is checked first (``UnsafeValue``)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        val = values.get(name)
        if val is None:
            raise MissingValue(name)
        if not for_argv:
            return str(val)
        if name in TEXT_ONLY:
            raise UnsafeValue(f"{name} is free text and cannot be placed in a command line or URL")
        return check_value(name, val)

    return TEMPLATE_VAR.sub(sub, template)


def fill_argv(argv: list[str], values: Mapping[str, Any]) -> list[str]:
    """Each argv element filled on its own: a value never becomes two arguments."""
    return [fill(a, values) for a in argv]
