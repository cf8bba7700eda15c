"""Alertmanager: alerts posted to its v2 API, and its silences honoured as maintenance windows
(docs/remediation.md#alertmanager).

Teams that run Prometheus route with Alertmanager (receivers, silences, inhibition). The
``alertmanager`` action posts each alert to ``POST /api/v2/alerts`` with the labels their
routes match on (``alertname``, ``fault``, ``severity``, ``host``, ``gpu``, ``rule``, ``job``,
``pod``, ``namespace``), and re-posts the firing ones every ``resend_interval`` the way
Prometheus does: each post says ``endsAt`` = now + 4 x ``resend_interval``, so an alert whose
sender died resolves by itself instead of firing forever. A resolved alert is posted once more
with ``endsAt`` = its resolve time and the labels it fired with (a changed job label would
otherwise make it a different alert).

``Silences`` reads ``GET /api/v2/silences`` (cached for ``cache``) and tells whether an active
silence matches an alert's labels: the remediator then leaves the node alone (``skipped:
maintenance:``). A query that fails is a ``failed`` decision and nothing runs: a maintenance
window we cannot see is not a reason to drain. A silence's regular expressions run on RE2 as
Alertmanager runs them (``regexes.py``): the same alerts match, in linear time; a silence with
one RE2 does not accept (Alertmanager would not have either) is that silence's problem: counted,
logged once, and it silences nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import msgspec

from pipeline.remediation.actions import Context, Outcome, Plan, QueryResult, entity_key, redact_url, send
from pipeline.remediation.audit import printable
from pipeline.remediation.exchange import exchange, new_client
from pipeline.remediation.incidents import INCIDENT_LABEL, VOLATILE_LABELS
from pipeline.remediation.payloads import iso8601
from pipeline.remediation.regexes import Anchored, RegexError, forget_compiled
from pipeline.remediation.safety import UnsafeValue, alert_values
from pipeline.remediation.targets import AllowList, UrlTemplate
from pipeline.schema import AlertEvent, encode

log = logging.getLogger("gpuwarden.remediation.alertmanager")

ALERTS_PATH = "/api/v2/alerts"
SILENCES_PATH = "/api/v2/silences"
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EVIDENCE_LIMIT = 4096  # characters of the evidence annotation
MAX_FIRING = 10_000  # alerts re-posted; beyond, the oldest is forgotten (a flood of forged alerts)
MAX_FIRING_BYTES = 64 * 1024 * 1024  # bytes the firing alerts may hold, as kept; the same beyond
MAX_POST_BYTES = 4 * 1024 * 1024  # bytes of one re-post request: more firing alerts, more requests
MAX_BODY = 8 * 1024 * 1024  # bytes of a silences answer read
MAX_REGEXES = 1000  # distinct regular expressions compiled from one silences answer
MAX_PROGRAM = 4_000_000  # RE2 instructions all of them may hold (about 8 bytes each)


def base_url(url: str, key: str) -> str:
    """The Alertmanager URL as written (``http://am:9093``, maybe with a path prefix), checked:
    nothing in it may come from an alert. ValueError naming ``key`` otherwise."""
    t = UrlTemplate.parse(url)
    if "{" in url:
        raise ValueError(f"{key}: {url!r}: the Alertmanager URL is the operator's; no {{...}} in it")
    return (
        f"{t.scheme}://"
        + (f"{t.userinfo}@" if t.userinfo is not None else "")
        + t.host
        + (f":{t.port}" if t.port else "")
        + t.rest.rstrip("/")
    )


def am_labels(alert: AlertEvent) -> dict[str, str]:
    """The alert's Alertmanager labels: what identifies it there and what routes and silences
    match on. The alert's own labels (a rule's ``team``, the telemetry's ``pod``) come first and
    the fixed ones win a clash; names that are not Prometheus label names are left out."""
    out = {k: str(v) for k, v in alert.labels.items() if _LABEL_NAME.fullmatch(k) and v != ""}
    if INCIDENT_LABEL in alert.labels:
        # An incident's action and policy change as it escalates; its identity there must not.
        for k in VOLATILE_LABELS:
            out.pop(k, None)
    fixed = {
        "alertname": alert.rule,
        "fault": alert.fault,
        "family": alert.family,
        "severity": alert.severity,
        "rule": alert.rule,
        "host": alert.host,
        "gpu": None if alert.gpu is None else str(alert.gpu),
        "link": None if alert.link is None else str(alert.link),
        "job": alert.job or alert.labels.get("job"),
        "source": "gpuwarden",
    }
    out.update({k: v for k, v in fixed.items() if v})
    return out


def am_alert(
    alert: AlertEvent,
    *,
    now: float,
    resend_interval: float,
    runbook_url: str | None = None,
    generator_url: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One ``postableAlert`` of the v2 API for ``alert``."""
    evidence = json.dumps(alert.evidence, separators=(",", ":"), sort_keys=True, default=str)
    ann = {"summary": alert.summary, "evidence": evidence[:EVIDENCE_LIMIT], "alert_id": alert.id}
    if runbook_url:
        ann["runbook_url"] = runbook_url
    out: dict[str, Any] = {
        "labels": labels or am_labels(alert),
        "annotations": ann,
        "startsAt": iso8601(alert.started_at),
    }
    if alert.state == "resolved":
        # After startsAt, or Alertmanager refuses the alert ("start time must be before end time").
        out["endsAt"] = iso8601(max(alert.ts, alert.started_at + 0.001))
    else:
        out["endsAt"] = iso8601(now + 4 * resend_interval)
    if generator_url:
        out["generatorURL"] = generator_url
    return out


class AlertmanagerAction:
    """Posts alerts to Alertmanager (``POST {url}/api/v2/alerts``); never disruptive.

    Put it in a receiver's ``actions`` and ``on_resolved``: the firing post starts the alert
    there, ``tick`` re-posts it while it fires, the resolved post ends it."""

    type = "alertmanager"
    disruptive = False
    breaker = False
    targets_host = False

    def __init__(
        self,
        name: str,
        url: str | None,
        *,
        timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_after: float = 60.0,
        resend_interval: float = 60.0,
        headers: dict[str, str] | None = None,
        headers_env: dict[str, str] | None = None,
        runbook_url: str | None = None,
        generator_url: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.url = ""
        if url:
            self.bind_url(url)
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.max_retry_after, self.resend_interval = max_retry_after, resend_interval
        if resend_interval <= 0:
            raise ValueError("resend_interval must be positive")
        self.headers, self.headers_env = dict(headers or {}), dict(headers_env or {})
        self.runbook_url, self.generator_url, self.clock = runbook_url, generator_url, clock
        if runbook_url:
            UrlTemplate.parse(runbook_url)  # ValueError: the action's config error
        self.firing: dict[str, tuple[AlertEvent, dict[str, str]]] = {}  # id -> (alert, labels it fired with)
        self._size: dict[str, int] = {}  # id -> bytes it holds as kept (MAX_FIRING_BYTES)
        self._held = 0  # their sum
        self._sent_at = -1e18
        self._store: Any = None
        self._client: httpx.Client | None = None

    def bind_url(self, url: str) -> None:
        """Post to this Alertmanager (an action without its own url gets ``alertmanager.url``)."""
        self.url = base_url(url, f"actions.{self.name}.url") + ALERTS_PATH

    def bind_store(self, store: Any) -> None:
        """Keep the firing set in the remediation state file, so a restart goes on re-posting."""
        self._store = store
        kept: list[tuple[_Firing, int]] = []
        for _, blob in store.kv_all(f"am:{self.name}"):
            try:
                a = msgspec.json.decode(blob, type=_Firing)
                iso8601(a.alert.started_at)  # one kept from before times were checked would fail every re-post
            except (msgspec.DecodeError, msgspec.ValidationError, UnsafeValue):
                continue
            kept.append((a, len(blob)))
        # Oldest first, as they fired (the store gives them by id): what a bound forgets first.
        for a, size in sorted(kept, key=lambda k: (k[0].alert.started_at, k[0].alert.id)):
            self.firing[a.alert.id] = (a.alert, a.labels)
            self._remember(a.alert.id, size)
        self._bound(f"am:{self.name}")

    def delay(self, attempt: int, rng: Any) -> float:
        d = min(self.max_backoff, self.backoff * (2**attempt))
        return d / 2 + rng.uniform(0, d / 2)

    def _runbook(self, alert: AlertEvent) -> str | None:
        if not self.runbook_url:
            return None
        try:
            return UrlTemplate.parse(self.runbook_url).fill(alert_values(alert), AllowList()).url
        except ValueError:
            return None

    def _body(self, alerts: list[tuple[AlertEvent, dict[str, str] | None]], now: float) -> bytes:
        return encode(
            [
                am_alert(
                    a,
                    now=now,
                    resend_interval=self.resend_interval,
                    runbook_url=self._runbook(a),
                    generator_url=self.generator_url,
                    labels=lab,
                )
                for a, lab in alerts
            ]
        )

    def plan(self, alert: AlertEvent) -> Plan:
        fired = self.firing.get(alert.id)
        # The labels it fired with: a re-post (an incident's escalation) or the resolve must name
        # the same Alertmanager alert even if a label (the job) changed since.
        labels = fired[1] if fired is not None else am_labels(alert)
        return Plan(
            self.name,
            self.type,
            False,
            False,
            entity_key("host", alert),
            alert.host,
            url=self.url,
            body=self._body([(alert, labels)], self.clock()),
            alert=alert,
            extra={"labels": labels},
        )

    def query(self, plan: Plan, ctx: Context) -> QueryResult | None:
        return None

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "User-Agent": "gpuwarden-remediate", **self.headers}
        for header, env in self.headers_env.items():
            if env in os.environ:
                h[header] = os.environ[env]
        return h

    def _post(self, body: bytes, ctx: Context) -> Outcome:
        if self._client is None:
            self._client = new_client(self.timeout)
        return send(self._client, self.url, body, self._headers(), {}, self, ctx, redact_url(self.url), self.name)

    def execute(self, plan: Plan, ctx: Context) -> Outcome:
        assert plan.alert is not None
        out = self._post(plan.body or b"[]", ctx)
        a = plan.alert
        ns = f"am:{self.name}"
        if a.state == "resolved":
            # Forgotten even when the post failed: re-posting a resolved alert as firing would keep
            # it open for good; unposted, Alertmanager resolves it at its last endsAt.
            self.firing.pop(a.id, None)
            self._remember(a.id, 0)
            if self._store is not None:
                self._store.kv_delete(ns, a.id)
        else:
            # Kept even when the post failed: the next re-post delivers it once Alertmanager answers.
            blob = encode(_Firing(alert=a, labels=plan.extra["labels"]))
            self.firing[a.id] = (a, plan.extra["labels"])
            self._remember(a.id, len(blob))
            if self._store is not None:
                self._store.kv_put(ns, a.id, blob)
            self._bound(ns)
        return out

    def _remember(self, alert_id: str, size: int) -> None:
        """``alert_id`` now holds ``size`` bytes as kept (0: forgotten); the running sum follows."""
        self._held += size - self._size.pop(alert_id, 0)
        if size:
            self._size[alert_id] = size

    def _bound(self, ns: str) -> None:
        """Forget the oldest firing alerts past ``MAX_FIRING`` of them or ``MAX_FIRING_BYTES``: a
        flood of forged alerts, or a few huge ones, must not grow memory and every re-post."""
        while self.firing and (len(self.firing) > MAX_FIRING or self._held > MAX_FIRING_BYTES):
            old = next(iter(self.firing))
            log.warning(
                "alertmanager %s: more than %d alerts or %d MiB firing; no longer re-posting %s",
                self.name,
                MAX_FIRING,
                MAX_FIRING_BYTES // 2**20,
                printable(old),  # an id from the alerts topic: no line breaks into the log
            )
            self.firing.pop(old)
            self._remember(old, 0)
            if self._store is not None:
                self._store.kv_delete(ns, old)

    def tick(self, now: float, ctx: Context) -> Outcome | None:
        """Re-post every firing alert once per ``resend_interval``, in requests of at most
        ``MAX_POST_BYTES``; the first failure is the outcome."""
        if not self.firing or now - self._sent_at < self.resend_interval:
            return None
        self._sent_at = now
        out: Outcome | None = None
        failed: Outcome | None = None
        posted = False
        for body in self._bodies(now):
            out = self._post(body, ctx)
            posted = posted or out.ok
            if not out.ok:
                failed = failed or out
                log.warning(
                    "alertmanager %s: re-posting %d firing alert(s) failed: %s", self.name, len(self.firing), out.error
                )
                if not posted:
                    break  # Alertmanager down: the rest would fail the same way, each after its retries
                # Up, but this request refused (one bad alert, a proxy's body limit): the others still go.
        return failed or out

    def _bodies(self, now: float) -> list[bytes]:
        """The firing alerts as re-post requests of at most ``MAX_POST_BYTES`` each (one alert
        larger than that alone), every alert in one of them, oldest first."""
        bodies: list[bytes] = []
        parts: list[bytes] = []
        size = 2
        for a, lab in self.firing.values():
            part = self._body([(a, lab)], now)[1:-1]  # (one alert's JSON object, without the brackets)
            if parts and size + 1 + len(part) > MAX_POST_BYTES:
                bodies.append(b"[" + b",".join(parts) + b"]")
                parts, size = [], 2
            parts.append(part)
            size += len(part) + (1 if len(parts) > 1 else 0)
        if parts:
            bodies.append(b"[" + b",".join(parts) + b"]")
        return bodies

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class _Firing(msgspec.Struct):
    alert: AlertEvent
    labels: dict[str, str]


# -- silences ------------------------------------------------------------------------------


class _Matcher(msgspec.Struct):
    name: str
    value: str
    isRegex: bool = False  # noqa: N815 - the API's names
    isEqual: bool = True  # noqa: N815


class _Status(msgspec.Struct):
    state: str


class _Silence(msgspec.Struct):
    id: str
    matchers: list[_Matcher]
    startsAt: str  # noqa: N815
    endsAt: str  # noqa: N815
    status: _Status
    createdBy: str = ""  # noqa: N815
    comment: str = ""


@dataclass(frozen=True)
class _Rule:
    """One matcher of a silence, ready to run: Alertmanager's ``labels.Matcher``."""

    name: str
    value: str
    regex: Anchored | None
    equal: bool

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.name, "")  # a missing label is the empty string, as in Alertmanager
        hit = self.regex.matches(v) if self.regex is not None else v == self.value
        return hit == self.equal


def _rules(sil: Any, compiled: Callable[[str], Anchored]) -> list[_Rule]:
    """The silence's matchers ready to run; RegexError from ``compiled`` when one cannot be."""
    return [_Rule(m.name, m.value, compiled(m.value) if m.isRegex else None, m.isEqual) for m in sil.matchers]


def silence_matches(sil: Any, labels: dict[str, str]) -> bool:
    """Whether every matcher of an Alertmanager silence matches ``labels`` as Alertmanager
    matches them (a missing label is the empty string; a regular expression must match the
    whole value, in RE2). A silence with a regular expression RE2 does not accept matches
    nothing: Alertmanager refuses such a silence, so it cannot be anyone's maintenance window."""
    try:
        rules = _rules(sil, Anchored)
    except RegexError:
        return False
    return all(r.matches(labels) for r in rules)


class SilenceError(Exception):
    """Alertmanager's silences could not be read."""


@dataclass(frozen=True)
class _Ready:
    silence: Any
    rules: list[_Rule]

    def matches(self, labels: dict[str, str]) -> bool:
        return all(r.matches(labels) for r in self.rules)


class Silences:
    """Active Alertmanager silences, read at most once per ``cache`` seconds.

    ``ignored``: the silences of the last answer that silence nothing, by id, and why;
    ``ignored_total``: how many silences have been ignored since start (each counted and logged
    once)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        cache: float = 15.0,
        headers_env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        client: httpx.Client | None = None,
    ) -> None:
        self.base = base_url(url, "alertmanager.url")
        self.url = self.base + SILENCES_PATH
        self.timeout, self.cache, self.clock = timeout, cache, clock
        self.headers_env = dict(headers_env or {})
        self._client = client
        self._at = -1e18
        self._silences: list[_Ready] | None = None
        self._error: str | None = None
        self._compiled: dict[str, Anchored | RegexError] = {}
        self.ignored: dict[str, str] = {}
        self.ignored_total = 0

    def describe(self) -> str:
        return f"Alertmanager silences from {redact_url(self.url)} (cached {self.cache:g}s)"

    def _fetch(self) -> list[_Silence]:
        if self._client is None:
            self._client = new_client(self.timeout)
        headers = {"Accept": "application/json", "User-Agent": "gpuwarden-remediate"}
        headers.update({h: os.environ[e] for h, e in self.headers_env.items() if e in os.environ})
        shown = redact_url(self.url)
        try:
            r = exchange(self._client, "GET", self.url, deadline=self.timeout, max_body=MAX_BODY, headers=headers)
        except httpx.HTTPError as e:
            raise SilenceError(f"{type(e).__name__}: {e} ({shown})") from None
        if r.status != 200:
            raise SilenceError(f"HTTP {r.status} from {shown}")
        if r.truncated:
            raise SilenceError(f"answer from {shown} larger than {MAX_BODY} bytes")
        try:
            return msgspec.json.decode(r.body, type=list[_Silence])
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise SilenceError(f"not a silences list from {shown}: {e}") from None

    def _prepare(self, silences: list[_Silence]) -> list[_Ready]:
        """Each silence with its matchers compiled; those that cannot be are ignored, counted
        and logged once. Compiled patterns are kept while a silence still uses them."""
        old, self._compiled = self._compiled, {}
        program = 0  # RE2 instructions of this answer's distinct patterns

        def compiled(pattern: str) -> Anchored:
            nonlocal program
            got = self._compiled.get(pattern) or old.get(pattern)
            if got is None:
                if len(self._compiled) >= MAX_REGEXES:
                    raise RegexError(f"more than {MAX_REGEXES} distinct regular expressions in the silences")
                try:
                    got = Anchored(pattern)
                except RegexError as e:
                    got = e
            if isinstance(got, Anchored) and pattern not in self._compiled:
                if program + got.size > MAX_PROGRAM:
                    raise RegexError(f"the silences' regular expressions exceed {MAX_PROGRAM} RE2 instructions")
                program += got.size
            self._compiled[pattern] = got
            if isinstance(got, RegexError):
                raise got
            return got

        ready: list[_Ready] = []
        ignored: dict[str, str] = {}
        for sil in silences:
            try:
                ready.append(_Ready(sil, _rules(sil, compiled)))
            except RegexError as e:
                ignored[sil.id] = str(e)
                if sil.id not in self.ignored:
                    self.ignored_total += 1
                    log.warning(
                        "Alertmanager silence %s (%s) is ignored: a regular expression RE2 does not accept (%s); "
                        "it silences nothing",
                        printable(sil.id),
                        printable(sil.createdBy),
                        printable(str(e))[:200],
                    )
        self.ignored = ignored
        forget_compiled()
        return ready

    def active(self) -> list[Any]:
        """The active silences (cached); SilenceError when they cannot be read (also cached, so
        a dead Alertmanager costs one deadline per ``cache``, not one per action)."""
        return [r.silence for r in self._active()]

    def _active(self) -> list[_Ready]:
        now = self.clock()
        if now - self._at >= self.cache:
            self._at = now
            try:
                fetched = [s for s in self._fetch() if s.status.state == "active"]
                self._silences, self._error = self._prepare(fetched), None
            except SilenceError as e:
                self._silences, self._error = None, str(e)
        if self._error is not None:
            raise SilenceError(self._error)
        return list(self._silences or [])

    def matching(self, alert: AlertEvent) -> Any | None:
        """The first active silence matching the alert's Alertmanager labels, or None."""
        labels = am_labels(alert)
        return next((r.silence for r in self._active() if r.matches(labels)), None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
