"""The remediation config's typed parts: msgspec Structs for every section, action and route.

Only the types, so the modules that read them (``config`` loads and checks a file, ``presets``
builds actions from their specs, ``routes`` builds the route tree) import them from here and
never from each other. Durations are numbers of seconds or strings in ``pipeline.durations``'
dialect (``90s``, ``10m``, ``1m30s``, ``4h``, ``1d``), checked when the config is loaded.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from pipeline.bus.connection import Security

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
    kafka: bool = True  # write to <prefix>.audit
    file: str | None = None  # and/or append JSONL here


class BreakerSettings(_Strict):
    max_nodes: int = 5  # K: more distinct nodes than this in the window opens it
    max_percent: float = 5.0  # P: ... or more than this percent of the known fleet
    fleet_size: int | None = None  # the known fleet; without it, the hosts seen in alerts
    window: Duration = "10m"


class Guardrails(_Strict):
    dry_run: bool = True  # disruptive actions only log what they would do
    cooldown: Duration = "1h"  # per entity and action, after a successful action
    max_attempts: int = 3  # per entity and action within attempt_window
    attempt_window: Duration = "24h"
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)


class InventorySettings(_Strict):
    # The hosts remediation may act on (pipeline/remediation/inventory.py); checked there.
    source: str | None = None  # file | list | slurm | kubernetes | any; none: live node actions refused
    path: str | None = None  # source file: one host per line or a YAML list (relative to this file)
    hosts: list[str] = []  # source list
    argv: list[str] | None = None  # slurm/kubernetes: the listing command (sinfo / kubectl get nodes)
    refresh: Duration = "5m"
    timeout: Duration = "30s"


# -- actions -------------------------------------------------------------------------------


class _Action(_Strict, tag_field="type"):
    dry_run: bool | None = None  # true keeps this one dry even when guardrails.dry_run is off


class LogAction(_Action, tag="log", kw_only=True):
    level: str = "warning"
    message: str = "{severity} {fault} on {host} gpu {gpu}: {summary}"


class WebhookAction(_Action, tag="webhook", kw_only=True):
    url: str | None = None  # or url_env; format pagerduty defaults to PagerDuty's Events API
    url_env: str | None = None  # environment variable holding the url (a Slack URL is a secret)
    format: str = "json"  # json (the alert) | slack | pagerduty (payloads.py)
    routing_key_env: str | None = None  # format pagerduty: the integration's routing key
    timeout: Duration = "5s"
    retries: int = 3  # retries after the first try, on 5xx, 429 and connection errors
    backoff: Duration = "0.5s"  # first retry's delay; doubles each time, with jitter
    max_backoff: Duration = "30s"
    max_retry_after: Duration = "60s"  # a longer Retry-After fails the action instead of blocking the loop
    headers: dict[str, str] = {}
    headers_env: dict[str, str] = {}  # header -> environment variable holding its (secret) value
    allow_hosts: list[str] = []  # where a {host} in the url's host may point (targets.py)
    # A webhook that asks another system to act (a fleet manager's drain API): disruptive, so
    # behind every guardrail, and counted on its entity (host | gpu | job) like a command.
    disruptive: bool = False
    entity: str = "host"


class AlertmanagerAction(_Action, tag="alertmanager", kw_only=True):
    # POST /api/v2/alerts (pipeline/remediation/alertmanager.py); url: the top-level alertmanager.url
    url: str | None = None
    resend_interval: Duration = "1m"  # firing alerts are re-posted this often; endsAt = now + 4x this
    runbook_url: str | None = None  # annotation runbook_url; {fault}, {rule}, ... percent-encoded
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
    entity: str = "host"  # what cooldown, attempt cap and breaker count: host | gpu | job
    query: list[str] | None = None  # run first; stdout matching query_match means leave it alone
    query_match: str | None = None
    query_reason: str = "query says it is already handled"


class SlurmDrainAction(_Action, tag="slurm_drain", kw_only=True):
    # No {gpu}: a host-level alert (an NVSwitch SXid, a NIC port) has none, and a value the argv
    # names but the alert lacks skips the action (missing_value). The alert id names the GPU.
    reason: str = "gpuwarden: {fault} alert {id}"
    scontrol: str = "scontrol"
    timeout: Duration = "30s"


class SlurmResumeAction(_Action, tag="slurm_resume", kw_only=True):
    scontrol: str = "scontrol"
    timeout: Duration = "30s"


class K8sCordonAction(_Action, tag="k8s_cordon", kw_only=True):
    kubectl: str = "kubectl"
    kubectl_args: list[str] = []  # e.g. [--context, prod]
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
    drain_timeout: Duration = "5m"  # kubectl drain --timeout: how long evictions may take
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
    via: list[str] = []  # argv prefix that reaches the host, e.g. [ssh, "{host}"]
    timeout: Duration = "60s"


class CheckpointAction(_Action, tag="checkpoint", kw_only=True):
    mode: str = "signal"  # signal (a command) | http (POST to the trainer)
    signal: str = "USR1"
    argv: list[str] = msgspec.field(default_factory=lambda: ["scancel", "--signal={signal}", "--full", "{job}"])
    url: str | None = None  # mode http: e.g. http://{host}:8471/checkpoint
    allow_hosts: list[str] = []  # ... which then needs e.g. [inventory] (targets.py)
    timeout: Duration = "30s"
    retries: int = 2
    backoff: Duration = "1s"
    max_backoff: Duration = "10s"


ActionSpec = Union[
    LogAction,
    WebhookAction,
    KafkaAction,
    CommandAction,
    SlurmDrainAction,
    SlurmResumeAction,
    K8sCordonAction,
    K8sTaintAction,
    K8sDrainAction,
    K8sUncordonAction,
    GpuResetAction,
    CheckpointAction,
    AlertmanagerAction,
]


class AlertmanagerSettings(_Strict):
    # Where alertmanager actions post, and whose silences stop node actions (alertmanager.py).
    url: str | None = None  # http://alertmanager:9093
    silences: bool = True  # with a url: a host an active silence matches is left alone
    cache: Duration = "15s"  # silences are read at most this often
    timeout: Duration = "5s"
    headers_env: dict[str, str] = {}


class Receiver(_Strict):
    name: str
    actions: list[str] = []
    on_resolved: list[str] = []  # undo actions; opt-in, nothing runs on resolve by default
    stop_on_failure: bool = True  # a failed action (a checkpoint) stops the ones after it (a drain)


class RouteSpec(_Strict):
    receiver: str | None = None  # inherited from the parent when absent
    name: str | None = None
    matchers: list[str] = []
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    repeat_interval: Duration | None = None
    routes: list["RouteSpec"] = []
    # `continue` is a Python keyword: the YAML key is renamed.
    continue_: bool = msgspec.field(default=False, name="continue")


class IncidentSettings(_Strict):
    # source: incidents (pipeline/remediation/incidents.py; docs/remediation.md#incident-mode)
    covered_for: Duration = "24h"  # a host gpuwarden took out covers it and its GPUs this long


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
    source: str = "alerts"  # alerts: <prefix>.alerts, one decision per alert | incidents: <prefix>.incidents
    incidents: IncidentSettings = msgspec.field(default_factory=IncidentSettings)


# Every action's ``type`` tag.
ACTION_TYPES = {
    "log",
    "webhook",
    "kafka",
    "command",
    "slurm_drain",
    "slurm_resume",
    "k8s_cordon",
    "k8s_taint",
    "k8s_drain",
    "k8s_uncordon",
    "gpu_reset",
    "checkpoint",
    "alertmanager",
}
