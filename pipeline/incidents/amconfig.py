"""The causality of ``incidents.yaml`` as an Alertmanager configuration: a route that groups a
GPU's alerts, and one inhibition per way an entry can be expressed there
(docs/remediation.md#alertmanager-configuration-from-the-causality).

For teams that route gpuwarden's alerts in Alertmanager without the incident stage: the alerts
an entry's ``cause`` rules explain are inhibited while a cause fires, on the same GPU (``reach:
gpu``), on the same host (``reach: host``), or for ``reach: comm`` on the same GPU and the host's
alerts that name no GPU (Alertmanager sees labels, not communicators: a straggler on another
host is not inhibited). An alert matching both sides never inhibits itself: the explained rules
that are causes too are left out of the target, and an entry whose every explained rule is a
cause (one failing HBM stack) is the route's grouping, not an inhibition.
"""

from __future__ import annotations

from typing import Any

import yaml

from pipeline.incidents.config import Cause, IncidentConfig

SOURCE = 'source="gpuwarden"'
NOT_AN_INCIDENT = 'incident=""'  # incidents posted by `remediate` already group their alerts
GROUP_BY = ["host", "gpu"]


def glob_regex(patterns: tuple[str, ...] | list[str]) -> str:
    """Shell-style rule patterns as one RE2 alternation (Alertmanager anchors it), matching what
    ``fnmatch`` matches: a ``[`` with no set after it is itself (``[]`` and ``[!]`` too, as a
    ``]`` right after ``[`` or ``[!`` is in the set), and every other character is literal (a ``-``
    too: the loader allows none, so no range).

    >>> glob_regex(["nvlink_*", "gpu_lost", "hbm_?x", "[]a]"])
    'nvlink_.*|gpu_lost|hbm_.x|[\\\\]a]'
    """
    return "|".join(_one_glob(p) for p in patterns)


def _literal(c: str) -> str:
    # Go's regexp takes a backslash before ASCII punctuation only (``\a`` is a bell, ``\é`` an error).
    return "\\" + c if c.isascii() and not (c.isalnum() or c == "_") else c


def _one_glob(p: str) -> str:
    re_: list[str] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        i += 1
        if c == "*":
            re_.append(".*")
        elif c == "?":
            re_.append(".")
        elif c == "[":
            j = i + 1 if i < n and p[i] == "!" else i
            j = j + 1 if j < n and p[j] == "]" else j
            while j < n and p[j] != "]":
                j += 1
            if j >= n:  # no set: a literal "["
                re_.append("\\[")
                continue
            body = p[i:j]
            neg = body.startswith("!")
            re_.append("[" + ("^" if neg else "") + "".join(map(_literal, body[neg:])) + "]")
            i = j + 1
        else:
            re_.append(_literal(c))
    return "".join(re_)


def _quoted(name: str, op: str, value: str) -> str:
    return f'{name}{op}"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def inhibit_rules(cause: Cause) -> list[dict[str, Any]]:
    """The inhibitions of one causality entry (none when it only groups by entity)."""
    explained = [p for p in cause.explains if p not in cause.cause]
    if not explained:
        return []
    source = [SOURCE, _quoted("alertname", "=~", glob_regex(cause.cause))]
    target = [
        SOURCE,
        NOT_AN_INCIDENT,
        _quoted("alertname", "=~", glob_regex(explained)),
        _quoted("alertname", "!~", glob_regex(cause.cause)),
    ]
    if cause.reach == "host":
        return [{"source_matchers": source, "target_matchers": target, "equal": ["host"]}]
    same_gpu = {"source_matchers": list(source), "target_matchers": target, "equal": ["host", "gpu"]}
    if cause.reach == "gpu":
        return [same_gpu]
    host_level = {"source_matchers": list(source), "target_matchers": [*target, 'gpu=""'], "equal": ["host"]}
    return [same_gpu, host_level]


def alertmanager_config(cfg: IncidentConfig, receiver: str = "gpuwarden") -> dict[str, Any]:
    """An Alertmanager configuration (route, receiver, inhibit_rules) reproducing ``cfg``'s causality.

    >>> from pipeline.incidents.config import Cause, IncidentConfig
    >>> c = IncidentConfig(causality=(Cause("nvlink_down", ("nvlink_*",), ("nccl_comm_busbw",), "host"),))
    >>> r = alertmanager_config(c)["inhibit_rules"][0]
    >>> r["source_matchers"][1], r["target_matchers"][2], r["equal"]
    ('alertname=~"nvlink_.*"', 'alertname=~"nccl_comm_busbw"', ['host'])
    """
    rules = [r for c in cfg.causality for r in inhibit_rules(c)]
    return {
        "route": {
            "receiver": receiver,
            "group_by": list(GROUP_BY),
            "routes": [{"matchers": ['incident=~".+"'], "group_by": ["incident"]}],
        },
        "receivers": [{"name": receiver}],
        "inhibit_rules": rules,
    }


def render(cfg: IncidentConfig, source: str, receiver: str = "gpuwarden") -> str:
    """``alertmanager_config`` as YAML, with a header naming where it came from and what each
    causality entry became."""
    doc = alertmanager_config(cfg, receiver)
    head = [
        f"# Generated by `gpuwarden rules alertmanager-config` from {source}.",
        "# Alerts of one GPU are one group; an incident posted by `gpuwarden remediate` is one group.",
        "# Causality entries (docs/remediation.md#alertmanager-configuration-from-the-causality):",
    ]
    for c in cfg.causality:
        n = len(inhibit_rules(c))
        what = f"{n} inhibit rule(s), reach {c.reach}" if n else "grouping only (its rules explain each other)"
        if c.within is not None and n:  # Alertmanager has no time bound: it inhibits while a cause fires
            what += f"; its within ({c.within:g}s) is not expressible: inhibited while a cause fires"
        head.append(f"#   {c.name}: {what}")
    return "\n".join(head) + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)
