"""``rules/fabric/ports.yaml`` -> a ``PortConfig``: the NIC port checks' severities, durations and
thresholds, or every problem at once as ``file:line:col`` diagnostics with the rule files' codes
(docs/rules.md#nic-ports).

Read through ``pipeline.yamlsafe`` (bounded size, nesting and aliases) into nodes, so each value
keeps its position; any tag outside plain YAML is refused and nothing in it is executed. Every
key is optional: a check absent from the file runs with its defaults, ``enabled: false`` turns
it off.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from pipeline import typedconfig, yamlsafe
from pipeline.durations import parse_duration
from pipeline.errors import ConfigError
from pipeline.rules import diagnostics as D
from pipeline.rules.diagnostics import Diagnostic

LIMITS = yamlsafe.Limits(max_bytes=64 << 10, max_depth=8, max_aliases=20, max_nodes=2_000, max_string=1024)
_LIMIT_CODES = {yamlsafe.SIZE: D.TOO_LARGE, yamlsafe.STRING: D.TOO_LARGE, yamlsafe.ALIAS: D.YAML_ALIAS,
                yamlsafe.DEPTH: D.YAML_DEPTH}  # fmt: skip
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_COUNTER = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SEVERITIES = ("info", "warning", "critical")
MAX_COUNTERS = 64
# Counter names a record is known to carry: the kernel's IBTA port counters (``counters/``,
# ``counters_ext/``; drivers/infiniband/core/sysfs.c), mlx5's ``hw_counters``, the netdev's
# ``carrier_changes`` and what gpuwarden's own producers add. Other drivers write other names, so
# a name outside the set is fine; one a letter or two from a name in it is likely a typo (W204).
KNOWN_COUNTERS = frozenset(
    "excessive_buffer_overrun_errors link_downed link_error_recovery local_link_integrity_errors "
    "multicast_rcv_packets multicast_xmit_packets port_rcv_constraint_errors port_rcv_data "
    "port_rcv_errors port_rcv_packets port_rcv_remote_physical_errors port_rcv_switch_relay_errors "
    "port_xmit_constraint_errors port_xmit_data port_xmit_discards port_xmit_packets port_xmit_wait "
    "symbol_error unicast_rcv_packets unicast_xmit_packets VL15_dropped "
    "port_xmit_data_64 port_rcv_data_64 port_xmit_packets_64 port_rcv_packets_64 port_unicast_xmit_packets "
    "port_unicast_rcv_packets port_multicast_xmit_packets port_multicast_rcv_packets "
    "rx_write_requests rx_read_requests rx_atomic_requests rx_dct_connect out_of_buffer out_of_sequence "
    "duplicate_request rnr_nak_retry_err packet_seq_err implied_nak_seq_err local_ack_timeout_err "
    "resp_local_length_error resp_cqe_error req_cqe_error req_remote_invalid_request "
    "req_remote_access_errors resp_remote_access_errors resp_cqe_flush_error req_cqe_flush_error "
    "req_transport_retries_exceeded req_rnr_retries_exceeded roce_adp_retrans roce_adp_retrans_to "
    "roce_slow_restart roce_slow_restart_cnps roce_slow_restart_trans rp_cnp_ignored rp_cnp_handled "
    "np_ecn_marked_roce_packets np_cnp_sent rx_icrc_encapsulated "
    "carrier_changes pcie_aer_fatal pcie_aer_nonfatal pcie_aer_correctable pcie_aer_upstream_fatal "
    "pcie_aer_upstream_nonfatal pcie_aer_upstream_correctable nccl_ib_completion_errors "
    "nccl_ib_async_fatal_events".split()
)


# The IBTA PortCounters' widths in bits, as the kernel reads them (drivers/infiniband/core/sysfs.c,
# ``PORT_PMA_ATTR``): these counters stop at their maximum, ``2**width - 1`` (they saturate), and
# count again only once cleared (``perfquery -R``, a driver reload). Only the error counters: the
# data and packet counters are 32 or 64 bits as the device has extended counters, and the vendors'
# ``hw_counters`` are 64 bits.
PMA_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
# Counter name -> the value it saturates at.
SATURATES_AT: dict[str, int] = {name: (1 << bits) - 1 for name, bits in PMA_WIDTHS.items()}


@dataclass(frozen=True)
class PortCheck:
    """One check's settings: its alerts' rule name and fault, severity, ``for:``,
    ``keep_firing_for:``, and the check's own numbers (``threshold``, ``window``, ``counters``)."""

    name: str
    fault: str
    severity: str
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    enabled: bool = True
    threshold: float = 0.0
    window_s: float = 0.0
    counters: tuple[str, ...] = ()
    # active_ports: (GPU model substring, ports, Gb/s), longest substring first ("gb200" before "b200").
    models: tuple[tuple[str, int, float], ...] = ()
    description: str = ""

    def expected(self, model: str | None) -> tuple[int, float] | None:
        """(ports, Gb/s) a host of GPU ``model`` needs ACTIVE, or None (a model not listed).

        >>> DEFAULTS["active_ports"].expected("NVIDIA GB200"), DEFAULTS["active_ports"].expected("Tesla T4")
        ((8, 400.0), None)
        """
        low = (model or "").lower()
        return next(((n, r) for key, n, r in self.models if key in low), None)


# The defaults cite their sources (shared/reference/fabric-and-incidents.md §2a).
DEFAULTS: dict[str, PortCheck] = {
    # NVSentinel: DOWN or Disabled is fatal. Only a port seen ACTIVE before: cabled-out ports stay quiet.
    "port_down": PortCheck("network_port_down", "network_port_down", "critical"),
    # NVSentinel: INIT, ARMED, Polling and LinkErrorRecovery at runtime are non-fatal.
    "port_degraded": PortCheck("network_port_degraded", "network_port_degraded", "warning", for_s=30.0),
    # NVSentinel's fatal set: any increase.
    "link_errors": PortCheck(
        "network_link_errors",
        "network_link_errors",
        "critical",
        keep_firing_for_s=600.0,
        counters=("link_downed", "excessive_buffer_overrun_errors", "local_link_integrity_errors", "rnr_nak_retry_err"),
    ),
    # The IBTA bit-error bound (1e-12 at the port's rate): 120 symbol errors an hour.
    "symbol_errors": PortCheck(
        "network_symbol_errors",
        "network_symbol_errors",
        "critical",
        keep_firing_for_s=600.0,
        threshold=120,
        window_s=3600.0,
        counters=("symbol_error",),
    ),  # fmt: skip
    # GPUd (threshold_default.go): at least 8 ports ACTIVE at 400 Gb/s on an H100, H200, B200 or
    # GB200 node, 1 at 200 on an A100; for: GPUd's "drop" is a port down 4 minutes.
    "active_ports": PortCheck(
        "network_active_ports_low",
        "network_active_ports_low",
        "critical",
        for_s=240.0,
        models=(("gb200", 8, 400.0), ("b200", 8, 400.0), ("h200", 8, 400.0), ("h100", 8, 400.0), ("a100", 1, 200.0)),
    ),  # fmt: skip
    # GPUd: down then ACTIVE again, 3 times in 12 hours.
    "flapping": PortCheck(
        "network_port_flapping",
        "network_port_flapping",
        "critical",
        keep_firing_for_s=3600.0,
        threshold=3,
        window_s=12 * 3600.0,
    ),  # fmt: skip
    # PCIe AER of the NIC and the bridges above it (``produce pcie-aer``; pipeline/rules/nicaer.py),
    # the NIC's side of rules/pcie.yaml's GPU rules: a fatal or non-fatal error is the event, a
    # corrected-error rate past 100 in 10 minutes a marginal link, as pcie_aer_correctable_rate.
    "pcie_aer_fatal": PortCheck(
        "nic_pcie_aer_fatal",
        "pcie_aer_fatal",
        "critical",
        keep_firing_for_s=600.0,
        counters=("pcie_aer_fatal", "pcie_aer_upstream_fatal"),
    ),  # fmt: skip
    "pcie_aer_nonfatal": PortCheck(
        "nic_pcie_aer_nonfatal",
        "pcie_aer_nonfatal",
        "warning",
        keep_firing_for_s=600.0,
        counters=("pcie_aer_nonfatal", "pcie_aer_upstream_nonfatal"),
    ),  # fmt: skip
    "pcie_aer_correctable": PortCheck(
        "nic_pcie_aer_correctable_rate",
        "pcie_aer_correctable_rate",
        "warning",
        keep_firing_for_s=600.0,
        threshold=100,
        window_s=600.0,
        counters=("pcie_aer_correctable", "pcie_aer_upstream_correctable"),
    ),  # fmt: skip
    # NVSentinel nic-health-monitor (charts/nic-health-monitor/values.yaml, counterDetection): its
    # non-fatal velocity thresholds, each judged over a span of at least `window` (its velocityUnit).
    "rcv_errors": PortCheck("network_rcv_errors", "network_rcv_errors", "warning", keep_firing_for_s=600.0,
                            threshold=10, window_s=1.0, counters=("port_rcv_errors",)),
    "link_error_recovery": PortCheck("network_link_error_recovery", "network_link_error_recovery", "warning",
                                     keep_firing_for_s=600.0, threshold=5, window_s=60.0,
                                     counters=("link_error_recovery",)),
    "symbol_error_rate": PortCheck("network_symbol_error_rate", "network_symbol_error_rate", "warning",
                                   keep_firing_for_s=600.0, threshold=10, window_s=1.0, counters=("symbol_error",)),
    "ack_timeouts": PortCheck("network_ack_timeouts", "network_ack_timeouts", "warning", keep_firing_for_s=600.0,
                              threshold=1, window_s=1.0, counters=("local_ack_timeout_err",)),
    "roce_slow_restart": PortCheck("network_roce_slow_restart", "network_roce_slow_restart", "warning",
                                   keep_firing_for_s=600.0, threshold=10, window_s=1.0,
                                   counters=("roce_slow_restart",)),
    # NVSentinel's congestion indicator: off unless a file turns it on, since a congested fabric
    # discards under load with no fault (docs/rules.md#nic-ports).
    "xmit_discards": PortCheck("network_xmit_discards", "network_xmit_discards", "warning", enabled=False,
                               keep_firing_for_s=600.0, threshold=100, window_s=1.0, counters=("port_xmit_discards",)),
    # NVSentinel: carrier_changes, a delta of more than 2 in one poll interval (its 1 s).
    "carrier_changes": PortCheck("network_carrier_changes", "network_carrier_changes", "warning",
                                 keep_firing_for_s=600.0, threshold=2, window_s=1.0, counters=("carrier_changes",)),
    # GPUd and NVSentinel: an expected port that disappears is a fault; silent past `window` (or
    # two and a half of its host's polls) while the host reports its other ports.
    "port_lost": PortCheck("network_port_lost", "network_port_lost", "critical", window_s=30.0),
    # NCCL's InfiniBand completion errors and fatal async events, from a training log
    # (gpuwarden produce torch-watchdog): any.
    "completion_errors": PortCheck("network_ib_completion_errors", "network_ib_completion_errors", "warning",
                                   keep_firing_for_s=600.0,
                                   counters=("nccl_ib_completion_errors", "nccl_ib_async_fatal_events")),
}  # fmt: skip
#: Checks judged by rate (NVSentinel's velocity): the increase over a span of at least ``window``.
RATE_CHECKS = ("rcv_errors", "link_error_recovery", "symbol_error_rate", "ack_timeouts", "roce_slow_restart",
               "xmit_discards")  # fmt: skip
#: Checks whose threshold is a count reached at ``>=`` (``len(flaps) >= threshold``).
WHOLE_THRESHOLDS = ("flapping",)
#: Checks judged by the increase within the trailing ``window``.
WINDOW_CHECKS = ("symbol_errors", "carrier_changes")
#: Counters a training log's NCCL lines count from 0 (``gpuwarden produce torch-watchdog``).
LOG_COUNTERS = ("nccl_ib_completion_errors", "nccl_ib_async_fatal_events")
MAX_MODELS = 64
# The checks of the NIC's PCIe AER counters: their own stage judges them (pipeline/rules/nicaer.py).
AER_CHECKS = ("pcie_aer_fatal", "pcie_aer_nonfatal", "pcie_aer_correctable")
# Which keys mean something for which check.
_OWN = {"link_errors": {"counters"}, "symbol_errors": {"threshold", "window", "counters"},
        "flapping": {"threshold", "window"}, "active_ports": {"models"}, "port_lost": {"window"},
        "completion_errors": {"counters"}, "carrier_changes": {"threshold", "window", "counters"},
        "pcie_aer_fatal": {"counters"}, "pcie_aer_nonfatal": {"counters"},
        "pcie_aer_correctable": {"threshold", "window", "counters"},
        **{k: {"threshold", "window", "counters"} for k in RATE_CHECKS}}  # fmt: skip


@dataclass(frozen=True)
class PortConfig:
    """The NIC port checks, by key of ``DEFAULTS``."""

    checks: dict[str, PortCheck] = field(default_factory=lambda: dict(DEFAULTS))
    source: str = "<defaults>"

    def enabled(self) -> list[tuple[str, PortCheck]]:
        return [(k, c) for k, c in self.checks.items() if c.enabled]


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.diags: list[Diagnostic] = []
        self._ctor = yaml.SafeLoader("")

    def err(self, node: Any, message: str, code: str, check: str | None = None, severity: str = "error") -> None:
        mark = getattr(node, "start_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        self.diags.append(Diagnostic(self.path, line, col, check, message, code, severity))

    def scalar(self, node: Any) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return yamlsafe.Shape(node)
        try:
            return self._ctor.construct_object(node, deep=True)
        except yamlsafe.BAD_SCALAR as e:  # an integer of 5000 digits, ``!!bool maybe``
            self.err(node, yamlsafe.unbuilt(node, e), D.BAD_VALUE)
            return None

    def tags_ok(self, root: Any) -> bool:
        ok, stack = True, [root]
        while stack:
            n = stack.pop()
            if n.tag not in _SAFE_TAGS:
                self.err(n, f"YAML tag {n.tag!r} is not allowed (plain data only)", D.YAML_TAG)
                ok = False
            elif isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    stack += [k, v]
            elif isinstance(n, yaml.SequenceNode):
                stack += list(n.value)
        return ok

    def mapping(self, node: Any, keys: set[str], what: str, check: str | None) -> dict[str, Any]:
        if not isinstance(node, yaml.MappingNode):
            self.err(node, f"{what} must be a mapping", D.SHAPE, check)
            return {}
        out: dict[str, Any] = {}
        for k, v in node.value:
            key = self.scalar(k)
            if not isinstance(key, str) or key not in keys:
                self.err(k, f"{what}: unknown key {key!r} (expected: {', '.join(sorted(keys))})", D.UNKNOWN_KEY, check)
            elif key in out:
                self.err(k, f"{what}: key {key!r} given twice", D.DUPLICATE, check)
            else:
                out[key] = v
        return out


def _check(r: _Reader, key: str, node: Any, base: PortCheck) -> PortCheck:
    allowed = {"enabled", "severity", "for", "keep_firing_for", "description"} | _OWN.get(key, set())
    m = r.mapping(node, allowed, key, key)
    changes: dict[str, Any] = {}
    for k, v in m.items():
        val = r.scalar(v)
        if k == "enabled":
            if not isinstance(val, bool):
                r.err(v, f"{key}.enabled: {val!r} is not true or false", D.BAD_VALUE, key)
            else:
                changes["enabled"] = val
        elif k == "severity":
            if val not in SEVERITIES:
                r.err(v, f"{key}.severity: {val!r} is not one of {', '.join(SEVERITIES)}", D.BAD_VALUE, key)
            else:
                changes["severity"] = val
        elif k in ("for", "keep_firing_for", "window"):
            try:
                if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                    raise ValueError(f"{val!r} is not a duration")
                secs = parse_duration(val)
            except ValueError as e:
                r.err(v, f"{key}.{k}: {e}", D.BAD_DURATION, key)
                continue
            if k == "window" and secs <= 0:
                r.err(v, f"{key}.window: must be longer than 0s", D.BAD_DURATION, key)
                continue
            changes[{"for": "for_s", "keep_firing_for": "keep_firing_for_s", "window": "window_s"}[k]] = secs
        elif k == "threshold":
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 1e12:
                r.err(v, f"{key}.threshold: {val!r} is not a number from 0 to 1e12", D.BAD_VALUE, key)
            elif key in WHOLE_THRESHOLDS and (val < 1 or val != int(val)):
                # A count of flaps that is reached with none: every port would be flapping.
                r.err(v, f"{key}.threshold: {val!r} is not a whole number from 1 to 1e12", D.BAD_VALUE, key)
            else:
                changes["threshold"] = float(val)
        elif k == "counters":
            names = [r.scalar(x) for x in v.value] if isinstance(v, yaml.SequenceNode) else None
            if names is None or not 0 < len(names) <= MAX_COUNTERS:
                r.err(v, f"{key}.counters: a list of 1 to {MAX_COUNTERS} counter names", D.SHAPE, key)
            elif not all(isinstance(n, str) and _COUNTER.fullmatch(n) for n in names):
                r.err(v, f"{key}.counters: {names!r} holds a name that is no counter file name", D.BAD_VALUE, key)
            else:
                changes["counters"] = tuple(names)
                for name, item in zip(names, v.value):
                    if name not in KNOWN_COUNTERS and (
                        near := difflib.get_close_matches(name, KNOWN_COUNTERS, 1, 0.85)
                    ):
                        r.err(
                            item,
                            f"{key}.counters: {name!r} is no counter the kernel, mlx5 or gpuwarden's producers "
                            f"write (did you mean {near[0]!r}?); a port without it is never judged by it",
                            D.LINT_UNKNOWN_COUNTER,
                            key,
                            "warning",
                        )
        elif k == "models":
            models = _models(r, key, v)
            if models is not None:
                changes["models"] = models
        elif k == "description":
            if not isinstance(val, str):
                r.err(v, f"{key}.description: a text", D.BAD_VALUE, key)
            else:
                changes["description"] = val
    return replace(base, **changes)


def _models(r: _Reader, key: str, node: Any) -> tuple[tuple[str, int, float], ...] | None:
    """``models:``: GPU model substring -> ``{ports: N, rate_gbps: R}``, longest substring first."""
    if not isinstance(node, yaml.MappingNode) or not 0 < len(node.value) <= MAX_MODELS:
        r.err(node, f"{key}.models: a mapping of 1 to {MAX_MODELS} GPU models", D.SHAPE, key)
        return None
    out: list[tuple[str, int, float]] = []
    for k, v in node.value:
        name = r.scalar(k)
        if not isinstance(name, str) or not _COUNTER.fullmatch(name):
            r.err(k, f"{key}.models: {name!r} is not a GPU model name (h100, b200, ...)", D.BAD_VALUE, key)
            continue
        if any(name.lower() == seen for seen, _, _ in out):  # matched case folded: the first would win
            r.err(k, f"{key}.models: {name!r} is given twice", D.DUPLICATE, key)
            continue
        m = r.mapping(v, {"ports", "rate_gbps"}, f"{key}.models.{name}", key)
        ports, rate = (r.scalar(m[x]) if x in m else None for x in ("ports", "rate_gbps"))
        if type(ports) is not int or not 1 <= ports <= 1024:
            r.err(m.get("ports", v), f"{key}.models.{name}.ports: {ports!r} is not a whole number from 1 to 1024",
                  D.BAD_VALUE, key)  # fmt: skip
            continue
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 100_000:
            r.err(m.get("rate_gbps", v), f"{key}.models.{name}.rate_gbps: {rate!r} is not a rate from 0 to 100000",
                  D.BAD_VALUE, key)  # fmt: skip
            continue
        out.append((name.lower(), ports, float(rate)))
    return tuple(sorted(out, key=lambda m: -len(m[0])))


def parse_port_config(text: str, path: str = "<ports.yaml>") -> tuple[PortConfig | None, list[Diagnostic]]:
    """The config in ``text`` and its warnings, or None and every problem found.

    >>> cfg, diags = parse_port_config("symbol_errors: {threshold: 60, window: 30m}\\nflapping: {enabled: false}")
    >>> (cfg.checks["symbol_errors"].threshold, cfg.checks["symbol_errors"].window_s, cfg.checks["flapping"].enabled)
    (60.0, 1800.0, False)
    >>> print(parse_port_config("port_down: {severity: fatal}", "p.yaml")[1][0])
    p.yaml:1:23: rule "port_down": port_down.severity: 'fatal' is not one of info, warning, critical [R006]
    """
    r = _Reader(path)
    try:
        root = yamlsafe.compose(text, LIMITS)
    except yamlsafe.YamlLimitError as e:
        return None, [Diagnostic(path, e.line, e.col, None, e.message, _LIMIT_CODES.get(e.kind, D.TOO_LARGE))]
    except yaml.YAMLError as e:
        problem, line, col = yamlsafe.syntax_error(e, text)
        return None, [Diagnostic(path, line, col, None, f"not valid YAML: {problem}", D.YAML_SYNTAX)]
    if root is None:
        return PortConfig(source=path), []
    if not r.tags_ok(root):
        return None, r.diags
    keys = set(DEFAULTS) | {"description"}
    top = r.mapping(root, keys, "the file", None)
    checks = dict(DEFAULTS)
    for key, node in top.items():
        if key == "description":
            continue
        checks[key] = _check(r, key, node, DEFAULTS[key])
    if any(d.is_error for d in r.diags):
        return None, r.diags
    return PortConfig(checks, path), r.diags


def load_port_config(path: str | Path) -> tuple[PortConfig | None, list[Diagnostic]]:
    """``parse_port_config`` of a file; an unreadable file is one diagnostic (R013)."""
    try:  # no more than the limit allows into memory (/dev/zero): the parser then says it is too large
        text = typedconfig.read_text(path, LIMITS)
    except ConfigError as e:
        return None, [Diagnostic(str(path), 1, 1, None, f"cannot read the file: {e.reason}", D.INTERNAL)]
    return parse_port_config(text, str(path))


__all__ = [
    "DEFAULTS",
    "KNOWN_COUNTERS",
    "LOG_COUNTERS",
    "PMA_WIDTHS",
    "RATE_CHECKS",
    "SATURATES_AT",
    "WINDOW_CHECKS",
    "PortCheck",
    "PortConfig",
    "load_port_config",
    "parse_port_config",
]
