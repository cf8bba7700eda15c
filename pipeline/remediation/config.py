"""The remediation config file: safe YAML into typed msgspec Structs, every error naming its key.

Layout (complete examples in ``docs/remediation.md`` and ``rules/routes.yaml``)::

    kafka:      {bootstrap, prefix, group, security}  # what `gpuwarden remediate` consumes
    state_file: remediation.sqlite                  # guardrail state (relative to the config file)
    audit:      {kafka: true, file: null}
    guardrails: {dry_run, cooldown, max_attempts, attempt_window, breaker: {...}}
    inventory:  {source: file|list|slurm|kubernetes|any, path, hosts, argv, refresh, timeout}
    alertmanager: {url, silences, cache, timeout, headers_env}  # its silences stop node actions
    actions:    {name: {type: log|webhook|alertmanager|kafka|command|slurm_drain|..., ...}}
    receivers:  [{name, actions: [...], on_resolved: [...], stop_on_failure}]
    route:      {receiver, matchers, group_by, group_wait, repeat_interval, continue, routes: [...]}

Durations are numbers of seconds or strings such as ``90s``, ``10m``, ``4h``, ``1d``: finite, not
negative, at most 366 days. The file is read with the bounds of ``pipeline.yamlsafe`` (size,
nesting, aliases); docs/remediation.md ("Limits") lists them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Union

import msgspec
import yaml

from pipeline import yamlsafe
from pipeline.bus.connection import Security
from pipeline.errors import ConfigError

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
MAX_SECONDS = 366 * 86400.0   # as rule durations (pipeline/rules/durations.py), without importing the rules
# Routes files are small; these bound what a hostile or runaway one can make the loader do.
LIMITS = yamlsafe.Limits(max_bytes=1 << 20, max_depth=64, max_aliases=100, max_nodes=100_000, max_string=16 << 10)


def parse_duration(value: Any, key: str) -> float:
    """``"10m"`` -> 600.0; a plain number is seconds; anything else is a ConfigError naming ``key``.

    NaN and infinity are refused: a cooldown of NaN never holds (every comparison with NaN is
    false, so a drain repeats on every alert) and one of infinity never lets the action run again.
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration such as 30s, 10m, 4h, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ConfigError(key, "a duration must be at most 366d") from None
    else:
        m = _DURATION.fullmatch(str(value))
        if not m:
            raise ConfigError(key, f"expected a duration such as 30s, 10m, 4h, got {str(value)[:60]!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(key, f"a duration must be finite, got {str(value)[:60]}")
    if seconds < 0:
        raise ConfigError(key, f"a duration cannot be negative, got {value!r}")
    if seconds > MAX_SECONDS:
        raise ConfigError(key, f"a duration must be at most 366d, got {str(value)[:60]}")
    return seconds


Duration = Union[float, str]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class KafkaSettings(_Strict):
    bootstrap: str = "127.0.0.1:9092"
    prefix: str = "gpuwarden"
    group: str = "gpuwarden-remediate"
    # TLS and SASL, as serve's kafka.security (pipeline/bus/connection.py; docs/operations.md, Secured Kafka).
    security: Security = msgspec.field(default_factory=Security)


class AuditSettings(_Strict):
    kafka: bool = True          # write to <prefix>.audit
    file: str | None = None     # and/or append JSONL here


class BreakerSettings(_Strict):
    max_nodes: int = 5                # K: more distinct nodes than this in the window opens it
    max_percent: float = 5.0          # P: ... or more than this percent of the known fleet
    fleet_size: int | None = None     # the known fleet; without it, the hosts seen in alerts
    window: Duration = "10m"


class Guardrails(_Strict):
    dry_run: bool = True              # disruptive actions only log what they would do
    cooldown: Duration = "1h"         # per entity and action, after a successful action
    max_attempts: int = 3             # per entity and action within attempt_window
    attempt_window: Duration = "24h"
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)


class InventorySettings(_Strict):
    # The hosts remediation may act on (pipeline/remediation/inventory.py); checked there.
    source: str | None = None         # file | list | slurm | kubernetes | any; none: live node actions refused
    path: str | None = None           # source file: one host per line or a YAML list (relative to this file)
    hosts: list[str] = []             # source list
    argv: list[str] | None = None     # slurm/kubernetes: the listing command (sinfo / kubectl get nodes)
    refresh: Duration = "5m"
    timeout: Duration = "30s"


# -- actions -------------------------------------------------------------------------------

class _Action(_Strict, tag_field="type"):
    dry_run: bool | None = None       # true keeps this one dry even when guardrails.dry_run is off


class LogAction(_Action, tag="log", kw_only=True):
    level: str = "warning"
    message: str = "{severity} {fault} on {host} gpu {gpu}: {summary}"


class WebhookAction(_Action, tag="webhook", kw_only=True):
    url: str | None = None            # or url_env; format pagerduty defaults to PagerDuty's Events API
    url_env: str | None = None        # environment variable holding the url (a Slack URL is a secret)
    format: str = "json"              # json (the alert) | slack | pagerduty (payloads.py)
    routing_key_env: str | None = None  # format pagerduty: the integration's routing key
    timeout: Duration = "5s"
    retries: int = 3                  # retries after the first try, on 5xx, 429 and connection errors
    backoff: Duration = "0.5s"        # first retry's delay; doubles each time, with jitter
    max_backoff: Duration = "30s"
    max_retry_after: Duration = "60s"  # a longer Retry-After fails the action instead of blocking the loop
    headers: dict[str, str] = {}
    headers_env: dict[str, str] = {}  # header -> environment variable holding its (secret) value
    allow_hosts: list[str] = []       # where a {host} in the url's host may point (targets.py)


class AlertmanagerAction(_Action, tag="alertmanager", kw_only=True):
    # POST /api/v2/alerts (pipeline/remediation/alertmanager.py); url: the top-level alertmanager.url
    url: str | None = None
    resend_interval: Duration = "1m"  # firing alerts are re-posted this often; endsAt = now + 4x this
    runbook_url: str | None = None    # annotation runbook_url; {fault}, {rule}, ... percent-encoded
    generator_url: str | None = None
    timeout: Duration = "5s"
    retries: int = 3
    backoff: Duration = "0.5s"
    max_backoff: Duration = "30s"
    max_retry_after: Duration = "60s"
    headers: dict[str, str] = {}
    headers_env: dict[str, str] = {}


class KafkaAction(_Action, tag="kafka", kw_only=True):
    topic: str


class CommandAction(_Action, tag="command", kw_only=True):
    argv: list[str]
    timeout: Duration = "30s"
    disruptive: bool = True
    entity: str = "host"              # what cooldown, attempt cap and breaker count: host | gpu | job
    query: list[str] | None = None    # run first; stdout matching query_match means leave it alone
    query_match: str | None = None
    query_reason: str = "query says it is already handled"


class SlurmDrainAction(_Action, tag="slurm_drain", kw_only=True):
    reason: str = "gpuwarden: {fault} gpu {gpu} alert {id}"
    scontrol: str = "scontrol"
    timeout: Duration = "30s"


class SlurmResumeAction(_Action, tag="slurm_resume", kw_only=True):
    scontrol: str = "scontrol"
    timeout: Duration = "30s"


class K8sCordonAction(_Action, tag="k8s_cordon", kw_only=True):
    kubectl: str = "kubectl"
    kubectl_args: list[str] = []      # e.g. [--context, prod]
    timeout: Duration = "30s"


class K8sTaintAction(_Action, tag="k8s_taint", kw_only=True):
    key: str = "gpuwarden.io/fault"
    value: str = "{family}"
    effect: str = "NoSchedule"
    kubectl: str = "kubectl"
    kubectl_args: list[str] = []
    timeout: Duration = "30s"


class K8sDrainAction(_Action, tag="k8s_drain", kw_only=True):
    # kubectl drain: cordon, then evict every pod through the Eviction API (PodDisruptionBudgets
    # are honoured); DaemonSet pods stay, as do pods without a controller unless force.
    kubectl: str = "kubectl"
    kubectl_args: list[str] = []
    drain_timeout: Duration = "5m"    # kubectl drain --timeout: how long evictions may take
    grace_period: Duration | None = None  # pods' own terminationGracePeriodSeconds when absent
    delete_emptydir_data: bool = True
    force: bool = False
    timeout: Duration = "6m"


class K8sUncordonAction(_Action, tag="k8s_uncordon", kw_only=True):
    kubectl: str = "kubectl"
    kubectl_args: list[str] = []
    timeout: Duration = "30s"


class GpuResetAction(_Action, tag="gpu_reset", kw_only=True):
    nvidia_smi: str = "nvidia-smi"
    via: list[str] = []               # argv prefix that reaches the host, e.g. [ssh, "{host}"]
    timeout: Duration = "60s"


class CheckpointAction(_Action, tag="checkpoint", kw_only=True):
    mode: str = "signal"              # signal (a command) | http (POST to the trainer)
    signal: str = "USR1"
    argv: list[str] = msgspec.field(default_factory=lambda: ["scancel", "--signal={signal}", "--full", "{job}"])
    url: str | None = None            # mode http: e.g. http://{host}:8471/checkpoint
    allow_hosts: list[str] = []       # ... which then needs e.g. [inventory] (targets.py)
    timeout: Duration = "30s"
    retries: int = 2
    backoff: Duration = "1s"
    max_backoff: Duration = "10s"


ActionSpec = Union[LogAction, WebhookAction, KafkaAction, CommandAction, SlurmDrainAction, SlurmResumeAction,
                   K8sCordonAction, K8sTaintAction, K8sDrainAction, K8sUncordonAction, GpuResetAction, CheckpointAction,
                   AlertmanagerAction]


class AlertmanagerSettings(_Strict):
    # Where alertmanager actions post, and whose silences stop node actions (alertmanager.py).
    url: str | None = None            # http://alertmanager:9093
    silences: bool = True             # with a url: a host an active silence matches is left alone
    cache: Duration = "15s"           # silences are read at most this often
    timeout: Duration = "5s"
    headers_env: dict[str, str] = {}


class Receiver(_Strict):
    name: str
    actions: list[str] = []
    on_resolved: list[str] = []       # undo actions; opt-in, nothing runs on resolve by default
    stop_on_failure: bool = True      # a failed action (a checkpoint) stops the ones after it (a drain)


class RouteSpec(_Strict):
    receiver: str | None = None       # inherited from the parent when absent
    name: str | None = None
    matchers: list[str] = []
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    repeat_interval: Duration | None = None
    routes: list["RouteSpec"] = []
    # `continue` is a Python keyword: the YAML key is renamed.
    continue_: bool = msgspec.field(default=False, name="continue")


class RemediationConfig(_Strict):
    route: RouteSpec
    receivers: list[Receiver]
    actions: dict[str, Any] = {}
    kafka: KafkaSettings = msgspec.field(default_factory=KafkaSettings)
    audit: AuditSettings = msgspec.field(default_factory=AuditSettings)
    guardrails: Guardrails = msgspec.field(default_factory=Guardrails)
    inventory: InventorySettings = msgspec.field(default_factory=InventorySettings)
    alertmanager: AlertmanagerSettings = msgspec.field(default_factory=AlertmanagerSettings)
    state_file: str = "remediation-state.sqlite"


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


_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`(?: - at `\$(.*)`)?")
_AT = re.compile(r"^(.*) - at `\$(.*)`$")


def _key(prefix: str, path: str) -> str:
    path = path.replace("[...]", "")
    path = path.lstrip(".")
    return ".".join(p for p in (prefix, path) if p) or "(top level)"


def _convert(data: Any, typ: Any, prefix: str) -> Any:
    try:
        return msgspec.convert(data, typ)
    except msgspec.ValidationError as e:
        msg = str(e)
        m = _UNKNOWN.match(msg)
        if m:
            raise ConfigError(_key(prefix, f"{m.group(2) or ''}.{m.group(1)}"), "unknown key") from None
        m = _AT.match(msg)
        if m:
            raise ConfigError(_key(prefix, m.group(2)), m.group(1)) from None
        raise ConfigError(prefix or "(top level)", msg) from None


_TYPES = {"log", "webhook", "kafka", "command", "slurm_drain", "slurm_resume", "k8s_cordon", "k8s_taint",
          "k8s_drain", "k8s_uncordon", "gpu_reset", "checkpoint", "alertmanager"}


def _check_durations(cfg: RemediationConfig, actions: dict[str, ActionSpec]) -> None:
    g = cfg.guardrails
    for key, val in (("guardrails.cooldown", g.cooldown), ("guardrails.attempt_window", g.attempt_window),
                     ("guardrails.breaker.window", g.breaker.window)):
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
    cfg: RemediationConfig = _convert(data, RemediationConfig, "")
    from pipeline.remediation.presets import build_action
    actions: dict[str, ActionSpec] = {}
    for name, spec in raw_actions.items():
        key = f"actions.{name}"
        if not isinstance(spec, dict):
            raise ConfigError(key, "must be a mapping with a `type`")
        if "type" not in spec:
            raise ConfigError(f"{key}.type", f"missing; one of {', '.join(sorted(_TYPES))}")
        if spec["type"] not in _TYPES:
            raise ConfigError(f"{key}.type", f"unknown action type {spec['type']!r}; one of {', '.join(sorted(_TYPES))}")
        actions[str(name)] = _convert(spec, ActionSpec, key)
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
    from pipeline.remediation.inventory import check_settings
    check_settings(cfg.inventory)
    if cfg.inventory.path and not Path(cfg.inventory.path).is_absolute():
        cfg.inventory.path = str(base_dir / cfg.inventory.path)
    # Matchers are compiled here so a bad one is a load error, not a surprise at the first alert.
    from pipeline.remediation.routes import RouteTree
    RouteTree.build(cfg.route)
    state = Path(cfg.state_file)
    audit = Path(cfg.audit.file) if cfg.audit.file else None
    return Config(raw=cfg, actions=actions, receivers=receivers,
                  state_file=state if state.is_absolute() else base_dir / state,
                  audit_file=None if audit is None else audit if audit.is_absolute() else base_dir / audit,
                  source=source)


def load_config(path: str | Path) -> Config:
    """Read a YAML config file safely (no tags that build objects) and check it."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(LIMITS.max_bytes + 1)   # never more than the limit into memory
        text = raw.decode("utf-8")
    except OSError as e:
        raise ConfigError("--config", f"cannot read {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError("(yaml)", f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = yamlsafe.load(text, LIMITS)
    except yamlsafe.YamlLimitError as e:
        raise ConfigError("(yaml)", f"{p}:{e.line}:{e.col}: {e.message}") from None
    except yaml.YAMLError as e:
        raise ConfigError("(yaml)", f"{p}: {e}") from None
    except (ValueError, OverflowError) as e:   # a scalar PyYAML cannot build: an int of 5000 digits
        raise ConfigError("(yaml)", f"{p}: cannot read a value ({str(e).split(':')[0]})") from None
    try:
        return parse_config(data, base_dir=p.resolve().parent, source=str(p))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the trust boundary: a bad file is an error, never a crash
        raise ConfigError("(top level)", f"{p} cannot be loaded ({type(e).__name__}: {str(e)[:200]}); "
                          "this is a gpuwarden bug, please report it") from None
