"""Actions: log, webhook (httpx, retries with backoff and jitter), kafka, command (argv, no shell).

An action first *plans* (fills its templates from the alert: the exact argv or URL, or an
``UnsafeValue``/``MissingValue`` when the alert cannot be acted on safely), and only then, when
the guardrails allow it, *executes*. Planning never touches the outside world, which is what
makes dry-run exact: the audit shows the argv that would have run.
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import math
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from pipeline.remediation.audit import printable
from pipeline.remediation.exchange import exchange, new_client
from pipeline.remediation.regexes import Searching
from pipeline.remediation.safety import alert_values, fill, fill_argv, template_vars
from pipeline.remediation.targets import AllowList, Filled, UrlTemplate, pin, resolve
from pipeline.schema import AlertEvent, encode

log = logging.getLogger("gpuwarden.remediation")

OUTPUT_LIMIT = 2000  # characters of a command's stdout/stderr kept in the audit
ANSWER_LIMIT = 64 * 1024  # bytes of a webhook's answer read (the audit keeps OUTPUT_LIMIT of them)


@dataclass
class Plan:
    """What an action would do for one alert: enough for the audit and for ``execute``."""

    action: str
    type: str
    disruptive: bool
    breaker: bool  # counts as a node acted on (drain, cordon, reset)
    entity: str | None  # cooldown/attempt key: "host:n1", "gpu:n1/3", "job:42"
    host: str | None
    argv: list[str] | None = None
    url: str | None = None
    query: list[str] | None = None
    body: bytes | None = None
    undo: bool = False  # an undo (uncordon, resume): only where gpuwarden itself acted
    targets_host: bool = False  # acts on the alert's host: only on a host in the inventory
    alert: AlertEvent | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    ok: bool
    detail: str = ""
    error: str | None = None
    attempts: int = 1
    stdout: str = ""


@dataclass
class QueryResult:
    leave_alone: bool
    detail: str
    error: str | None = None


@dataclass
class Context:
    """What executing actions may use; tests swap ``sleep`` and ``rng``."""

    producer: Any = None  # pipeline.bus Producer for kafka actions
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    resolve: Callable[[str, int], list[str]] = resolve  # a templated webhook host's addresses


class Action(Protocol):
    name: str
    type: str
    disruptive: bool

    def plan(self, alert: AlertEvent) -> Plan: ...

    def query(self, plan: Plan, ctx: Context) -> QueryResult | None: ...

    def execute(self, plan: Plan, ctx: Context) -> Outcome: ...


def redact_url(url: str) -> str:
    """The URL as audited: a password in it or query-string values replaced by ``***``."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = p.netloc
    if p.password is not None:
        netloc = f"{p.username}:***@{p.hostname}" + (f":{p.port}" if p.port else "")
    query = "&".join(f"{kv.partition('=')[0]}=***" if "=" in kv else kv for kv in p.query.split("&")) if p.query else ""
    return urlunsplit((p.scheme, netloc, p.path, query, p.fragment))


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait: delay-seconds or an HTTP-date (RFC 9110
    §10.2.3); None when absent or unreadable (then the backoff applies)."""
    if not value:
        return None
    v = value.strip()
    if v.isdigit():
        return float(v) if len(v) <= 9 else math.inf
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - now)


class RetryPolicy(Protocol):
    retries: int
    max_retry_after: float
    timeout: float  # one attempt's deadline: connect, request, headers and body

    def delay(self, attempt: int, rng: random.Random) -> float: ...


def send(
    client: httpx.Client,
    url: str,
    body: bytes,
    headers: dict[str, str],
    extensions: dict[str, Any],
    policy: RetryPolicy,
    ctx: Context,
    shown: str,
    name: str,
) -> Outcome:
    """POST ``body``; retry connection errors, timeouts, 429 and 5xx (a 429's or 503's
    ``Retry-After`` is waited, up to ``max_retry_after``; else backoff with jitter); never other
    4xx, nor redirects. Each attempt has ``policy.timeout`` for all of it (exchange.py).
    ``shown``: the URL as it may be logged."""
    last = ""
    for attempt in range(policy.retries + 1):
        wait: float | None = None
        try:
            r = exchange(
                client,
                "POST",
                url,
                deadline=policy.timeout,
                max_body=ANSWER_LIMIT,
                content=body,
                headers=headers,
                extensions=extensions,
            )
        except httpx.TransportError as e:
            last = f"{type(e).__name__}: {e}"
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            # Not the network: the request itself cannot be made; trying again cannot help.
            return Outcome(False, type(e).__name__, error=f"{type(e).__name__}: {e} ({shown})", attempts=attempt + 1)
        else:
            if r.status < 300:
                return Outcome(True, f"HTTP {r.status}", attempts=attempt + 1, stdout=r.text[:OUTPUT_LIMIT])
            if r.status < 500 and r.status != 429:
                # 4xx: the request itself is wrong; 3xx: redirects are not followed (a POST
                # carrying an alert should reach the configured URL or fail visibly).
                return Outcome(
                    False,
                    f"HTTP {r.status}",
                    error=f"HTTP {r.status} from {shown} (not retried: the same request would get the same answer)",
                    attempts=attempt + 1,
                )
            last = f"HTTP {r.status}"
            wait = retry_after(r.headers.get("Retry-After"), time.time())
            if wait is not None and wait > policy.max_retry_after:
                # Waiting that long would hold every other alert back (one loop, one thread).
                return Outcome(
                    False,
                    last,
                    error=f"{last} from {shown} with Retry-After {wait:.0f}s, beyond "
                    f"max_retry_after {policy.max_retry_after:g}s: not waited for",
                    attempts=attempt + 1,
                )
        if attempt < policy.retries:
            if wait is None:
                wait = policy.delay(attempt, ctx.rng)
            log.info(
                "webhook %s: %s from %s; retry %d/%d in %.2fs", name, last, shown, attempt + 1, policy.retries, wait
            )
            ctx.sleep(wait)
    return Outcome(
        False, last, error=f"{last} from {shown} after {policy.retries + 1} attempt(s)", attempts=policy.retries + 1
    )


# -- command execution ---------------------------------------------------------------------


@dataclass
class CommandResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    error: str | None = None


def run_command(
    argv: list[str], timeout: float, kill_grace: float = 2.0, *, limit: int = OUTPUT_LIMIT
) -> CommandResult:
    """Run ``argv`` without a shell in its own process group; on timeout kill the whole group.

    ``limit``: characters of stdout/stderr kept (the audit keeps little; a node list needs all).

    A new session means a ``scontrol`` wrapper's children (ssh, a script's subprocesses) die with
    it instead of lingering and acting after we reported a failure.
    """
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            shell=False,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        return CommandResult(None, "", "", error=f"cannot run {argv[0]!r}: {e.strerror or e}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        if proc.poll() is not None:
            # It exited; a descendant that left its process group (setsid, a daemon) holds the
            # pipes, and waiting for their end could take forever.
            _close_pipes(proc)
            return CommandResult(proc.returncode, _text(e.output, limit), _text(e.stderr, limit))
        _kill_group(proc, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=kill_grace)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=kill_grace)
            except subprocess.TimeoutExpired as e:
                # Killed, but a descendant outside its group holds the pipes: stop reading.
                out, err = e.output or b"", e.stderr or b""
                _close_pipes(proc)
                proc.wait()
        return CommandResult(
            proc.returncode,
            _text(out, limit),
            _text(err, limit),
            timed_out=True,
            error=f"timed out after {timeout:g}s; process group killed",
        )
    return CommandResult(proc.returncode, _text(out, limit), _text(err, limit))


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _text(b: bytes | None, limit: int = OUTPUT_LIMIT) -> str:
    return (b or b"").decode("utf-8", "replace")[:limit]


# -- the actions ---------------------------------------------------------------------------


class LogAction:
    """Writes the alert to the service log; never disruptive."""

    type = "log"
    disruptive = False

    def __init__(self, name: str, level: str = "warning", message: str = "") -> None:
        self.name = name
        self.level = logging.getLevelName(level.upper())
        if not isinstance(self.level, int):
            raise ValueError(f"unknown log level {level!r}")
        self.message = message

    def plan(self, alert: AlertEvent) -> Plan:
        # Alert values are escaped: a summary or host with a newline must not forge log lines.
        vals = {k: ("-" if v is None else printable(v)) for k, v in alert_values(alert).items()}
        return Plan(
            self.name,
            self.type,
            False,
            False,
            None,
            alert.host,
            alert=alert,
            extra={"message": fill(self.message, vals, for_argv=False)},
        )

    def query(self, plan: Plan, ctx: Context) -> QueryResult | None:
        return None

    def execute(self, plan: Plan, ctx: Context) -> Outcome:
        log.log(self.level, "%s", plan.extra["message"])
        return Outcome(True, "logged")


class WebhookAction:
    """HTTP POST of the alert JSON (or a Slack or PagerDuty Events v2 body: ``format``); retries
    with exponential backoff and jitter on 5xx, 429 and connection errors, waiting a
    ``Retry-After`` where the answer has one; never on other 4xx (the request itself is wrong:
    repeating it cannot help).

    Alert values only reach the URL's path and query, percent-encoded; a templated host needs
    ``allow_hosts`` and is resolved, checked and pinned (pipeline/remediation/targets.py).
    ``shown_url``: what the audit shows instead of the URL (a Slack URL is itself the secret)."""

    type = "webhook"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        headers: dict[str, str] | None = None,
        headers_env: dict[str, str] | None = None,
        disruptive: bool = False,
        breaker: bool = False,
        entity: str = "host",
        type_name: str = "webhook",
        allow_hosts: list[str] | None = None,
        max_retry_after: float = 60.0,
        payload: Callable[[AlertEvent], bytes] = encode,
        shown_url: str | None = None,
    ) -> None:
        self.name, self.url, self.timeout, self.retries = name, url, timeout, retries
        self.backoff, self.max_backoff, self.max_retry_after = backoff, max_backoff, max_retry_after
        self.payload, self.shown_url = payload, shown_url
        self.headers = dict(headers or {})
        self.headers_env = dict(headers_env or {})
        self.disruptive, self.breaker, self.entity, self.type = disruptive, breaker, entity, type_name
        self.target = UrlTemplate.parse(url)
        if self.target.templated_host and self.headers_env:
            raise ValueError(
                f"headers_env: secrets are only sent to a host written in the url, and {url!r} "
                "takes its host from the alert"
            )
        self.allow = AllowList.parse(allow_hosts, f"actions.{name}.allow_hosts")
        self.inventory: Any = None
        self.targets_host = disruptive and (self.target.templated_host or "host" in template_vars(url) or breaker)
        self._client: httpx.Client | None = None

    def bind(self, allow: AllowList, inventory: Any) -> None:
        """Set ``allow_hosts`` and the host inventory (the remediator does, from the config)."""
        self.allow, self.inventory = allow, inventory

    def plan(self, alert: AlertEvent) -> Plan:
        filled = self.target.fill(alert_values(alert), self.allow, self.inventory)
        return Plan(
            self.name,
            self.type,
            self.disruptive,
            self.breaker,
            entity_key(self.entity, alert),
            alert.host,
            url=self.shown_url or filled.url,
            body=self.payload(alert),
            alert=alert,
            targets_host=self.targets_host,
            extra={"filled": filled},
        )

    def query(self, plan: Plan, ctx: Context) -> QueryResult | None:
        return None

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds before retry ``attempt`` (0-based): half of the doubled backoff plus up to as much again."""
        d = min(self.max_backoff, self.backoff * (2**attempt))
        return d / 2 + rng.uniform(0, d / 2)

    def _headers(self, secrets: bool) -> dict[str, str]:
        h = {"Content-Type": "application/json", "User-Agent": "gpuwarden-remediate", **self.headers}
        if secrets:
            for header, env in self.headers_env.items():
                if env in os.environ:
                    h[header] = os.environ[env]
        return h

    def _request(self, plan: Plan, ctx: Context) -> tuple[str, dict[str, str], dict[str, Any]] | str:
        """(url to connect to, headers, httpx extensions), or why it may not be sent."""
        filled: Filled = plan.extra.get("filled") or Filled(plan.url or "")
        if filled.host is None:
            # The host is the one written in the config: the secrets may go there.
            return filled.url, self._headers(secrets=True), {}
        addr, why = pin(filled, self.allow, ctx.resolve)
        if why:
            return why
        t = self.target
        port = f":{t.port}" if t.port else ""
        url = f"{t.scheme}://{f'[{addr}]' if ':' in addr else addr}{port}{filled.rest}"
        headers = {**self._headers(secrets=False), "Host": filled.host + port}
        return url, headers, ({"sni_hostname": filled.host} if t.scheme == "https" else {})

    def execute(self, plan: Plan, ctx: Context) -> Outcome:
        if self._client is None:
            self._client = new_client(self.timeout)
        req = self._request(plan, ctx)
        if isinstance(req, str):
            return Outcome(False, "refused", error=f"not sent: {req}", attempts=0)
        url, headers, extensions = req
        return send(
            self._client,
            url,
            plan.body or b"",
            headers,
            extensions,
            self,
            ctx,
            self.shown_url or redact_url(plan.url or ""),
            self.name,
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class KafkaAction:
    """Forwards the alert JSON to another Kafka topic (keyed by host), acknowledged before success."""

    type = "kafka"
    disruptive = False

    def __init__(self, name: str, topic: str) -> None:
        self.name, self.topic = name, topic

    def plan(self, alert: AlertEvent) -> Plan:
        return Plan(
            self.name,
            self.type,
            False,
            False,
            None,
            alert.host,
            url=f"kafka:{self.topic}",
            body=encode(alert),
            alert=alert,
        )

    def query(self, plan: Plan, ctx: Context) -> QueryResult | None:
        return None

    def execute(self, plan: Plan, ctx: Context) -> Outcome:
        if ctx.producer is None:
            return Outcome(False, error="no Kafka producer configured for kafka actions")
        try:
            ctx.producer.send(self.topic, plan.body or b"", (plan.host or "").encode() or None)
            ctx.producer.flush()
        except Exception as e:  # noqa: BLE001 - any producer failure is this action's failure
            return Outcome(False, error=f"kafka send to {self.topic} failed: {e}")
        return Outcome(True, f"sent to {self.topic}")


class CommandAction:
    """An argv template filled from the alert, run without a shell, with a timeout.

    ``query`` (optional) runs first: stdout matching ``query_match`` means someone else already
    took care of the entity (a node drained by a human) and it is left alone.
    """

    type = "command"

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        timeout: float = 30.0,
        disruptive: bool = True,
        entity: str = "host",
        breaker: bool = True,
        query: list[str] | None = None,
        query_match: str | None = None,
        query_reason: str = "query says it is already handled",
        undo: bool = False,
        type_name: str = "command",
        values: dict[str, str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv is empty")
        if entity not in ("host", "gpu", "job"):
            raise ValueError(f"entity must be host, gpu or job, not {entity!r}")
        self.name, self.argv, self.timeout = name, list(argv), timeout
        self.disruptive, self.entity, self.breaker, self.undo, self.type = disruptive, entity, breaker, undo, type_name
        self.query_argv = list(query) if query else None
        # RE2: the query's stdout is searched in time linear in its length, whatever the pattern.
        self.query_match = Searching(query_match) if query_match else None
        if self.query_argv and self.query_match is None:
            raise ValueError("query needs query_match")
        self.query_reason = query_reason
        self.values = dict(values or {})
        uses_host = any("host" in template_vars(a) for a in [*self.argv, *(self.query_argv or [])])
        self.targets_host = disruptive and (uses_host or breaker)

    def plan(self, alert: AlertEvent) -> Plan:
        vals = alert_values(alert, self.values)
        return Plan(
            self.name,
            self.type,
            self.disruptive,
            self.breaker,
            entity_key(self.entity, alert),
            alert.host,
            argv=fill_argv(self.argv, vals),
            query=fill_argv(self.query_argv, vals) if self.query_argv else None,
            undo=self.undo,
            alert=alert,
            targets_host=self.targets_host,
        )

    def query(self, plan: Plan, ctx: Context) -> QueryResult | None:
        if not plan.query:
            return None
        res = run_command(plan.query, self.timeout)
        if res.error or res.returncode != 0:
            why = res.error or f"exit {res.returncode}: {res.stderr.strip()[:200]}"
            return QueryResult(False, "", error=f"query {plan.query!r} failed ({why})")
        assert self.query_match is not None
        m = self.query_match.search(res.stdout)
        if m is not None:
            return QueryResult(True, f"{self.query_reason} ({m.strip()})")
        return QueryResult(False, res.stdout.strip()[:200])

    def execute(self, plan: Plan, ctx: Context) -> Outcome:
        res = run_command(plan.argv or [], self.timeout)
        if res.error:
            return Outcome(False, error=res.error, stdout=res.stdout)
        if res.returncode != 0:
            return Outcome(
                False,
                f"exit {res.returncode}",
                error=f"exit {res.returncode}: {res.stderr.strip()[:500]}",
                stdout=res.stdout,
            )
        return Outcome(True, "exit 0", stdout=res.stdout)


def entity_key(kind: str, alert: AlertEvent) -> str | None:
    """What cooldown and the attempt cap count: a node, a GPU or a job."""
    if kind == "gpu":
        return None if alert.host is None else f"gpu:{alert.host}/{alert.gpu if alert.gpu is not None else '-'}"
    if kind == "job":
        job = alert.job or alert.labels.get("job")
        return None if job is None else f"job:{job}"
    return None if alert.host is None else f"host:{alert.host}"
