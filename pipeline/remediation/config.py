"""The remediation config file: safe YAML into typed msgspec Structs, every error naming its key.

Layout (complete examples in ``docs/remediation.md`` and ``rules/routes.yaml``)::

    kafka:      {bootstrap, prefix, group, security}  # what `gpuwarden remediate` consumes
    state_file: remediation.sqlite                  # guardrail state (relative to the config file)
    audit:      {kafka: true, file: null}
    guardrails: {dry_run, cooldown, max_attempts, attempt_window, breaker: {...}}
    inventory:  {source: file|list|slurm|kubernetes|any, path, hosts, argv, refresh, timeout}
    alertmanager: {url, silences, cache, timeout, headers_env}  # its silences stop node actions
    source:     alerts | incidents                  # which topic remediation acts on
    incidents:  {covered_for}                       # source incidents: equivalence groups
    actions:    {name: {type: log|webhook|alertmanager|kafka|command|slurm_drain|..., ...}}
    receivers:  [{name, actions: [...], on_resolved: [...], stop_on_failure}]
    route:      {receiver, matchers, group_by, group_wait, repeat_interval, continue, routes: [...]}

Durations are numbers of seconds or strings such as ``90s``, ``10m``, ``1m30s``, ``4h``, ``1d``
(``pipeline.durations``): finite, not negative, at most 366 days. The typed parts are in
``specs`` (re-exported here). The file is read with the bounds of ``pipeline.yamlsafe`` (size,
nesting, aliases); docs/remediation.md ("Limits") lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from pipeline import typedconfig, yamlsafe
from pipeline.durations import MAX_SECONDS as MAX_SECONDS
from pipeline.durations import duration
from pipeline.errors import ConfigError
from pipeline.remediation.incidents import SOURCES
from pipeline.remediation.inventory import check_settings
from pipeline.remediation.presets import build_action
from pipeline.remediation.routes import RouteTree

# The typed parts, where every user of the config has always found them.
from pipeline.remediation.specs import (
    ACTION_TYPES,
    ActionSpec,
    AlertmanagerAction,
    AlertmanagerSettings,
    AuditSettings,
    BreakerSettings,
    CheckpointAction,
    CommandAction,
    Duration,
    GpuResetAction,
    Guardrails,
    IncidentSettings,
    InventorySettings,
    K8sCordonAction,
    K8sDrainAction,
    K8sTaintAction,
    K8sUncordonAction,
    KafkaAction,
    KafkaSettings,
    LogAction,
    Receiver,
    RemediationConfig,
    RouteSpec,
    SlurmDrainAction,
    SlurmResumeAction,
    WebhookAction,
)

# Routes files are small; these bound what a hostile or runaway one can make the loader do.
LIMITS = yamlsafe.Limits(max_bytes=1 << 20, max_depth=64, max_aliases=100, max_nodes=100_000, max_string=16 << 10)
_TYPES = ACTION_TYPES


def parse_duration(value: Any, key: str) -> float:
    """``"10m"`` -> 600.0, ``"1m30s"`` -> 90.0; a plain number is seconds; anything else is a
    ConfigError naming ``key`` (``pipeline.durations.duration``).

    NaN and infinity are refused: a cooldown of NaN never holds (every comparison with NaN is
    false, so a drain repeats on every alert) and one of infinity never lets the action run again.
    """
    return duration(value, key)


class Config(msgspec.Struct, kw_only=True):
    """A loaded, checked config: typed parts plus the resolved paths and durations."""

    raw: RemediationConfig
    actions: dict[str, ActionSpec]
    receivers: dict[str, Receiver]
    state_file: Path
    audit_file: Path | None
    source: str

    @property
    def guardrails(self) -> Guardrails:
        return self.raw.guardrails


def _check_durations(cfg: RemediationConfig, actions: dict[str, ActionSpec]) -> None:
    g = cfg.guardrails
    for key, val in (
        ("guardrails.cooldown", g.cooldown),
        ("guardrails.attempt_window", g.attempt_window),
        ("guardrails.breaker.window", g.breaker.window),
    ):
        parse_duration(val, key)
    if g.max_attempts < 1:
        raise ConfigError("guardrails.max_attempts", "must be at least 1")
    if g.breaker.max_nodes < 0:
        raise ConfigError("guardrails.breaker.max_nodes", "cannot be negative")
    if not 0 <= g.breaker.max_percent <= 100:
        raise ConfigError("guardrails.breaker.max_percent", "must be between 0 and 100")
    if g.breaker.fleet_size is not None and g.breaker.fleet_size < 1:
        raise ConfigError("guardrails.breaker.fleet_size", "must be at least 1")
    for name, a in actions.items():
        for f in ("timeout", "backoff", "max_backoff", "drain_timeout", "max_retry_after", "resend_interval"):
            if hasattr(a, f):
                parse_duration(getattr(a, f), f"actions.{name}.{f}")
        if getattr(a, "retries", 0) < 0:
            raise ConfigError(f"actions.{name}.retries", "cannot be negative")

    def walk(r: RouteSpec, path: str) -> None:
        for f in ("group_wait", "repeat_interval"):
            if getattr(r, f) is not None:
                parse_duration(getattr(r, f), f"{path}.{f}")
        for i, c in enumerate(r.routes):
            walk(c, f"{path}.routes[{i}]")

    walk(cfg.route, "route")


def parse_config(data: Any, *, base_dir: Path = Path("."), source: str = "<config>") -> Config:
    """Check a config document (already parsed YAML) and build the typed ``Config``."""
    if not isinstance(data, dict):
        raise ConfigError("(top level)", "the config must be a mapping")
    raw_actions = data.get("actions") or {}
    if not isinstance(raw_actions, dict):
        raise ConfigError("actions", "must be a mapping of action name to action")
    cfg: RemediationConfig = typedconfig.convert(data, RemediationConfig)
    actions: dict[str, ActionSpec] = {}
    for name, spec in raw_actions.items():
        key = f"actions.{name}"
        if not isinstance(spec, dict):
            raise ConfigError(key, "must be a mapping with a `type`")
        if "type" not in spec:
            raise ConfigError(f"{key}.type", f"missing; one of {', '.join(sorted(_TYPES))}")
        if not isinstance(spec["type"], str) or spec["type"] not in _TYPES:  # a list is unhashable
            raise ConfigError(
                f"{key}.type", f"unknown action type {spec['type']!r}; one of {', '.join(sorted(_TYPES))}"
            )
        actions[str(name)] = typedconfig.convert(spec, ActionSpec, key)
        build_action(str(name), actions[str(name)])
    receivers: dict[str, Receiver] = {}
    for i, r in enumerate(cfg.receivers):
        if r.name in receivers:
            raise ConfigError(f"receivers[{i}].name", f"receiver {r.name!r} defined twice")
        for field in ("actions", "on_resolved"):
            for a in getattr(r, field):
                if a not in actions:
                    raise ConfigError(f"receivers[{i}].{field}", f"unknown action {a!r}")
        receivers[r.name] = r
    if cfg.route.receiver is None:
        raise ConfigError("route.receiver", "the root route needs a receiver")

    def walk(r: RouteSpec, path: str) -> None:
        if r.receiver is not None and r.receiver not in receivers:
            raise ConfigError(f"{path}.receiver", f"unknown receiver {r.receiver!r}")
        for i, c in enumerate(r.routes):
            walk(c, f"{path}.routes[{i}]")

    walk(cfg.route, "route")
    _check_durations(cfg, actions)
    am = cfg.alertmanager
    for f in ("cache", "timeout"):
        parse_duration(getattr(am, f), f"alertmanager.{f}")
    for name, a in actions.items():
        if isinstance(a, AlertmanagerAction) and not (a.url or am.url):
            raise ConfigError(f"actions.{name}.url", "an alertmanager action needs a url (or alertmanager.url)")
    if cfg.source not in SOURCES:
        raise ConfigError("source", f"{cfg.source!r}: one of {', '.join(SOURCES)}")
    parse_duration(cfg.incidents.covered_for, "incidents.covered_for")
    check_settings(cfg.inventory)
    if cfg.inventory.path and not Path(cfg.inventory.path).is_absolute():
        cfg.inventory.path = str(base_dir / cfg.inventory.path)
    # Matchers are compiled here so a bad one is a load error, not a surprise at the first alert.
    RouteTree.build(cfg.route)
    state = Path(cfg.state_file)
    audit = Path(cfg.audit.file) if cfg.audit.file else None
    return Config(
        raw=cfg,
        actions=actions,
        receivers=receivers,
        state_file=state if state.is_absolute() else base_dir / state,
        audit_file=None if audit is None else audit if audit.is_absolute() else base_dir / audit,
        source=source,
    )


def load_config(path: str | Path) -> Config:
    """Read a YAML config file safely (bounded; no tags that build objects) and check it.

    A ConfigError about a key the file holds names the file, line and column of its value (of
    the key, for an unknown key: ``typedconfig.located``)."""
    p = Path(path)
    text = typedconfig.read_text(p, LIMITS)
    data = typedconfig.parse_yaml(text, LIMITS, source=str(p))
    try:
        return parse_config(data, base_dir=p.resolve().parent, source=str(p))
    except ConfigError as e:
        raise typedconfig.located(e, text, str(p), LIMITS) from None
    except Exception as e:  # noqa: BLE001 - the trust boundary: a bad file is an error, never a crash
        raise ConfigError(
            "(top level)",
            f"{p} cannot be loaded ({type(e).__name__}: {str(e)[:200]}); this is a gpuwarden bug, please report it",
        ) from None


def locate(text: str, key: str) -> tuple[int, int] | None:
    """(line, column), from 1, of the YAML value at ``key`` (``route.routes[0].matchers[1]``), or None."""
    return typedconfig.locate(text, key, LIMITS)
