"""Ready actions built on ``command`` (and ``webhook``): Slurm, Kubernetes, GPU reset, checkpoint.

Every disruptive preset that takes a node out of service has a query command that tells whether
the node is already out (drained, down, cordoned) — by a human, another tool or an earlier
gpuwarden action — so it is left alone instead of being drained again with our reason over theirs.
The GPU reset's query asks whether processes still run on the GPU: a reset under a live job is
refused (drain first).
"""

from __future__ import annotations

import os
import re
from typing import Callable

from pipeline.durations import duration as parse_duration
from pipeline.errors import ConfigError
from pipeline.remediation import actions as A
from pipeline.remediation import payloads
from pipeline.remediation import specs as C
from pipeline.remediation.alertmanager import AlertmanagerAction
from pipeline.remediation.regexes import RegexError, Searching
from pipeline.remediation.safety import UnsafeValue, check_value
from pipeline.schema import AlertEvent


def _reason_ok(name: str, reason: str) -> str:
    # The reason becomes one argv element `reason=...`; a newline would confuse scontrol's output.
    if any(ch in reason for ch in "\n\r\0"):
        raise ConfigError(f"actions.{name}.reason", "must be one line")
    return reason


def build_action(name: str, spec: C.ActionSpec) -> A.Action:
    """The runnable action for a config entry; ConfigError naming the key when it cannot be built."""
    key = f"actions.{name}"
    try:
        return _build(name, spec, key)
    except ValueError as e:
        raise ConfigError(key, str(e)) from None


def _build(name: str, spec: C.ActionSpec, key: str) -> A.Action:
    t = lambda v, f="timeout": parse_duration(v, f"{key}.{f}")
    if isinstance(spec, C.LogAction):
        return A.LogAction(name, spec.level, spec.message)
    if isinstance(spec, C.WebhookAction):
        return _webhook(name, spec, key, t)
    if isinstance(spec, C.AlertmanagerAction):
        # The url defaults to the top-level alertmanager.url; the remediator sets it (bind_url).
        return AlertmanagerAction(
            name,
            spec.url,
            timeout=t(spec.timeout),
            retries=spec.retries,
            backoff=t(spec.backoff, "backoff"),
            max_backoff=t(spec.max_backoff, "max_backoff"),
            max_retry_after=t(spec.max_retry_after, "max_retry_after"),
            resend_interval=t(spec.resend_interval, "resend_interval"),
            headers=spec.headers,
            headers_env=spec.headers_env,
            runbook_url=spec.runbook_url,
            generator_url=spec.generator_url,
        )
    if isinstance(spec, C.KafkaAction):
        return A.KafkaAction(name, spec.topic)
    if isinstance(spec, C.CommandAction):
        # The query's stdout is searched with this pattern, in RE2 like the route matchers
        # (pipeline/remediation/regexes.py): one RE2 does not accept is this key's error.
        if spec.query_match:
            try:
                Searching(spec.query_match)
            except RegexError as e:
                raise ConfigError(f"{key}.query_match", f"bad regular expression (RE2 syntax): {e}") from None
        return A.CommandAction(
            name,
            spec.argv,
            timeout=t(spec.timeout),
            disruptive=spec.disruptive,
            entity=spec.entity,
            breaker=spec.disruptive and spec.entity != "job",
            query=spec.query,
            query_match=spec.query_match,
            query_reason=spec.query_reason,
        )
    if isinstance(spec, C.SlurmDrainAction):
        return A.CommandAction(
            name,
            [spec.scontrol, "update", "nodename={host}", "state=drain", f"reason={_reason_ok(name, spec.reason)}"],
            timeout=t(spec.timeout),
            query=[spec.scontrol, "show", "node", "-o", "{host}"],
            # scontrol prints compound states such as IDLE+DRAIN, MIXED+DRAIN, DOWN+NOT_RESPONDING.
            query_match=r"\bState=\S*(?:DRAIN|DOWN|FAIL|MAINT)\S*(?:.*?\bReason=.*)?",
            query_reason="node already drained or down in Slurm",
            type_name="slurm_drain",
        )
    if isinstance(spec, C.SlurmResumeAction):
        return A.CommandAction(
            name,
            [spec.scontrol, "update", "nodename={host}", "state=resume"],
            timeout=t(spec.timeout),
            breaker=False,
            undo=True,
            type_name="slurm_resume",
        )
    if isinstance(spec, C.K8sCordonAction):
        k = [spec.kubectl, *spec.kubectl_args]
        return A.CommandAction(
            name,
            [*k, "cordon", "{host}"],
            timeout=t(spec.timeout),
            query=[*k, "get", "node", "{host}", "-o", "jsonpath={.spec.unschedulable}"],
            query_match=r"^\s*true\b",
            query_reason="node already cordoned",
            type_name="k8s_cordon",
        )
    if isinstance(spec, C.K8sTaintAction):
        k = [spec.kubectl, *spec.kubectl_args]
        if spec.effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ConfigError(f"{key}.effect", "one of NoSchedule, PreferNoSchedule, NoExecute")
        try:
            check_value("labels.key", spec.key)
        except UnsafeValue:
            raise ConfigError(f"{key}.key", f"{spec.key!r} is not a taint key") from None
        return A.CommandAction(
            name,
            [*k, "taint", "nodes", "{host}", f"{spec.key}={spec.value}:{spec.effect}", "--overwrite"],
            timeout=t(spec.timeout),
            query=[*k, "get", "node", "{host}", "-o", "jsonpath={.spec.unschedulable} {.spec.taints[*].key}"],
            query_match=rf"^\s*true\b|(?:^|\s){_re_escape(spec.key)}(?:\s|$)",
            query_reason="node already cordoned or tainted",
            type_name="k8s_taint",
        )
    if isinstance(spec, C.K8sDrainAction):
        # No "already out" query: a node this chain cordoned or tainted a moment ago must still
        # be drained, and draining a drained node only evicts what came back (idempotent).
        argv = [
            spec.kubectl,
            *spec.kubectl_args,
            "drain",
            "{host}",
            "--ignore-daemonsets",
            f"--timeout={t(spec.drain_timeout, 'drain_timeout'):g}s",
        ]
        if spec.delete_emptydir_data:
            argv.append("--delete-emptydir-data")
        if spec.grace_period is not None:
            argv.append(f"--grace-period={t(spec.grace_period, 'grace_period'):g}")
        if spec.force:
            argv.append("--force")
        return A.CommandAction(name, argv, timeout=t(spec.timeout), type_name="k8s_drain")
    if isinstance(spec, C.K8sUncordonAction):
        k = [spec.kubectl, *spec.kubectl_args]
        return A.CommandAction(
            name,
            [*k, "uncordon", "{host}"],
            timeout=t(spec.timeout),
            breaker=False,
            undo=True,
            type_name="k8s_uncordon",
        )
    if isinstance(spec, C.GpuResetAction):
        via = list(spec.via)
        return A.CommandAction(
            name,
            [*via, spec.nvidia_smi, "-r", "-i", "{gpu}"],
            timeout=t(spec.timeout),
            entity="gpu",
            query=[*via, spec.nvidia_smi, "--query-compute-apps=pid", "--format=csv,noheader", "-i", "{gpu}"],
            query_match=r"\d+",
            query_reason="processes still run on the GPU (drain first)",
            type_name="gpu_reset",
        )
    if isinstance(spec, C.CheckpointAction):
        if spec.mode == "http":
            if not spec.url:
                raise ConfigError(f"{key}.url", "mode http needs the trainer's url")
            return A.WebhookAction(
                name,
                spec.url,
                timeout=t(spec.timeout),
                retries=spec.retries,
                backoff=t(spec.backoff, "backoff"),
                max_backoff=t(spec.max_backoff, "max_backoff"),
                disruptive=True,
                breaker=False,
                entity="job",
                type_name="checkpoint",
            )
        if spec.mode != "signal":
            raise ConfigError(f"{key}.mode", "signal or http")
        try:
            check_value("signal", spec.signal)
        except UnsafeValue:
            raise ConfigError(f"{key}.signal", f"{spec.signal!r} is not a signal name") from None
        return A.CommandAction(
            name,
            spec.argv,
            timeout=t(spec.timeout),
            entity="job",
            breaker=False,
            type_name="checkpoint",
            values={"signal": spec.signal},
        )
    raise ConfigError(f"{key}.type", f"unsupported action {type(spec).__name__}")


def _webhook(name: str, spec: C.WebhookAction, key: str, t) -> A.WebhookAction:
    """A webhook, its body in ``format``: the alert JSON, a Slack message, a PagerDuty event."""
    if spec.format not in ("json", "slack", "pagerduty"):
        raise ConfigError(f"{key}.format", f"{spec.format!r}: one of json, slack, pagerduty")
    if spec.url and spec.url_env:
        raise ConfigError(f"{key}.url_env", "give url or url_env, not both")
    url, shown = spec.url, None
    if spec.url_env:
        url = os.environ.get(spec.url_env)
        if not url:
            raise ConfigError(f"{key}.url_env", f"environment variable {spec.url_env} is not set")
        try:
            t_ = A.UrlTemplate.parse(url)
        except ValueError:
            raise ConfigError(f"{key}.url_env", f"environment variable {spec.url_env} is not an http(s) url") from None
        if "{" in url:
            raise ConfigError(f"{key}.url_env", "a url from the environment cannot be a template")
        # The audit shows where it goes, never the secret path (a Slack webhook's token).
        shown = f"{t_.scheme}://{t_.host}{':' + t_.port if t_.port else ''}/*** (from ${spec.url_env})"
    if not url and spec.format == "pagerduty":
        url = payloads.PAGERDUTY_URL
    if not url:
        raise ConfigError(f"{key}.url", "a webhook needs url (or url_env)")
    if spec.entity not in ("host", "gpu", "job"):
        raise ConfigError(f"{key}.entity", f"{spec.entity!r}: one of host, gpu, job")
    body: Callable[[AlertEvent], bytes] = A.encode
    if spec.format == "slack":
        body = payloads.slack_body
    elif spec.format == "pagerduty":
        if not spec.routing_key_env:
            raise ConfigError(
                f"{key}.routing_key_env",
                "format pagerduty needs the environment variable holding the integration's routing key",
            )
        body = payloads.pagerduty_body(spec.routing_key_env)
    return A.WebhookAction(
        name,
        url,
        timeout=t(spec.timeout),
        retries=spec.retries,
        backoff=t(spec.backoff, "backoff"),
        max_backoff=t(spec.max_backoff, "max_backoff"),
        max_retry_after=t(spec.max_retry_after, "max_retry_after"),
        headers=spec.headers,
        headers_env=spec.headers_env,
        payload=body,
        shown_url=shown,
        disruptive=spec.disruptive,
        breaker=spec.disruptive and spec.entity != "job",
        entity=spec.entity,
    )


def _re_escape(s: str) -> str:
    return re.escape(s)
