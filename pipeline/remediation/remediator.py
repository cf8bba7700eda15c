"""The decision loop: an alert (or an incident event, ``handle_incident``) -> routes -> each
receiver's actions, through the guardrails.

For every action of a matched receiver, in order, exactly one audit record says what happened.
The checks run cheapest and safest first::

    claim (once per alert id) -> group (group_wait, repeat_interval) -> plan (argv/URL; unsafe
    values refused) -> host in the inventory? -> breaker open? -> dry-run? -> host silenced in
    Alertmanager (a maintenance window)? -> undo of a node we did not take out, or that another
    firing alert holds? -> cooldown -> attempt cap -> query (already drained by someone else?) ->
    breaker admits the node? -> execute

A firing alert whose resolution came first is not acted on, and a group whose first alert
resolved while it waited acts on one of its alerts still firing, or on none.

An action that raises (a bug, an HTTP client error) is a ``failed`` record for that action; the
actions after it still each get theirs.

``force`` (a human's ``gpuwarden remediate act --force``) skips the claim (and a resolution that came first), grouping, cooldown and
attempt cap — never the breaker, dry-run or the query.

``one_shot`` (``gpuwarden remediate act``, without ``--force``) decides now: nobody would dispatch
a group after its ``group_wait``, so a group it opens acts at once (and counts for
``repeat_interval``); every other guardrail, the inventory's included, applies as usual. What it
did not wait for is in ``notes``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

from pipeline.bus.base import Message
from pipeline.errors import ConfigError
from pipeline.incidents.events import ESCALATED, IncidentEvent
from pipeline.remediation.actions import Action, Context, Outcome, WebhookAction, redact_url
from pipeline.remediation.alertmanager import AlertmanagerAction, SilenceError, Silences
from pipeline.remediation.audit import AuditLog, printable
from pipeline.remediation.config import Config, parse_duration
from pipeline.remediation.guardrails import Limits, StateStore, iso_time
from pipeline.remediation.incidents import (
    ACT,
    GPU,
    HOST,
    NO,
    claim_state,
    decode_incident,
    incident_alert,
    scope,
    what_acts,
)
from pipeline.remediation.inventory import Inventory, build_inventory
from pipeline.remediation.presets import build_action
from pipeline.remediation.routes import Route, RouteMatch, RouteTree
from pipeline.remediation.safety import MissingValue, UnsafeValue
from pipeline.remediation.targets import AllowList
from pipeline.schema import AlertEvent, encode

log = logging.getLogger("gpuwarden.remediation")


class Remediator:
    """Turns alerts into audited decisions. Feed it ``handle_message``/``handle``; call ``tick``."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        audit: AuditLog,
        *,
        ctx: Context | None = None,
        clock=time.time,
        inventory: Inventory | None = None,
    ) -> None:
        self.config, self.store, self.audit = config, store, audit
        self.ctx = ctx or Context()
        self.clock = clock
        self.tree = RouteTree.build(config.raw.route)
        self.actions: dict[str, Action] = {n: build_action(n, s) for n, s in config.actions.items()}
        self.action_dry_run = {n: s.dry_run for n, s in config.actions.items()}
        g = config.guardrails
        self.dry_run = g.dry_run
        self.inventory = inventory if inventory is not None else build_inventory(config.raw.inventory, clock=clock)
        self._check_trust()
        self.silences = self._bind_alertmanager()
        self.limits = Limits(
            max_nodes=g.breaker.max_nodes,
            max_percent=g.breaker.max_percent,
            fleet_size=g.breaker.fleet_size,
            window=parse_duration(g.breaker.window, "guardrails.breaker.window"),
            cooldown=parse_duration(g.cooldown, "guardrails.cooldown"),
            max_attempts=g.max_attempts,
            attempt_window=parse_duration(g.attempt_window, "guardrails.attempt_window"),
        )
        self.covered_for = parse_duration(config.raw.incidents.covered_for, "incidents.covered_for")
        # A dispatched group older than every route's repeat_interval decides as no group would.
        self.group_horizon = max(r.repeat_interval for r in _routes(self.tree.root))
        self._pruned_at = 0.0
        self.notes: list[str] = []  # what a one-shot decision did differently (``handle(one_shot=True)``)

    def _check_trust(self) -> None:
        """Refuse to start what would act on hosts nobody vouched for (docs/remediation.md#host-inventory)."""
        for name, spec in self.config.actions.items():
            act = self.actions[name]
            if isinstance(act, WebhookAction):
                key = f"actions.{name}.allow_hosts"
                act.bind(AllowList.parse(getattr(spec, "allow_hosts", None), key), self.inventory)
                if act.target.templated_host and not act.allow:
                    raise ConfigError(
                        key,
                        f"url {act.url!r} takes its host from the alert: list the host-name "
                        "globs, networks or `inventory` it may reach",
                    )
        live = sorted(n for n, a in self.actions.items() if getattr(a, "targets_host", False) and not self._dry(n))
        if live and self.inventory is None:
            raise ConfigError(
                "inventory",
                f"live actions on nodes ({', '.join(live)}) need a host inventory: "
                "set inventory.source to file, list, slurm or kubernetes (or `any` to trust every "
                "host an alert names)",
            )
        if live and self.inventory is not None and self.inventory.trusts_all:
            log.warning(
                "inventory.source is `any`: live actions on nodes (%s) act on any host an alert names, "
                "forged or not (docs/remediation.md#host-inventory)",
                ", ".join(live),
            )

    def _bind_alertmanager(self) -> Silences | None:
        """Point alertmanager actions at ``alertmanager.url`` (unless they name their own) and keep
        their firing alerts in the state file; the silences to honour, when configured."""
        am = self.config.raw.alertmanager
        for act in self.actions.values():
            if isinstance(act, AlertmanagerAction):
                if not act.url and am.url:
                    act.bind_url(am.url)
                act.bind_store(self.store)
        if not am.url or not am.silences:
            return None
        try:
            return Silences(
                am.url,
                timeout=parse_duration(am.timeout, "alertmanager.timeout"),
                cache=parse_duration(am.cache, "alertmanager.cache"),
                headers_env=am.headers_env,
            )
        except ValueError as e:
            raise ConfigError("alertmanager.url", str(e)) from None

    # -- input -------------------------------------------------------------------------------

    def handle_message(self, msg: Message) -> None:
        """One message of the alerts topic; a malformed one is audited as skipped, never raised."""
        try:
            alert = msgspec.json.decode(msg.value, type=AlertEvent)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
            # RecursionError: JSON nested ~1000 deep (evidence, an unknown field); raised, it
            # stopped the service on this message at every restart.
            self.audit.record(
                "skipped",
                reason=f"malformed_alert: {e}",
                origin=msg.origin,
                detail=msg.value[:300].decode("utf-8", "replace"),
            )
            return
        try:
            self.handle(alert, origin=msg.origin)
        except Exception as e:  # noqa: BLE001 - one bad alert must not stop remediation of the rest
            log.exception("remediation of alert %s from %s failed", printable(alert.id), printable(msg.origin))
            self.audit.record("failed", **self._base(alert, None, msg.origin), error=f"internal error: {e!r}")

    def handle(
        self, alert: AlertEvent, *, origin: str | None = None, force: bool = False, one_shot: bool = False
    ) -> None:
        """Route one alert and decide every action of every matched receiver. ``one_shot``: a group
        with ``group_wait`` acts now instead of being queued for a ``tick`` that never comes."""
        now = self.clock()
        if alert.state not in ("firing", "resolved"):
            self.audit.record(
                "skipped",
                **self._base(alert, None, origin),
                reason=f"unknown alert state {alert.state!r} (firing or resolved)",
            )
            return
        resolved_at = None
        if alert.state == "resolved":
            self.store.record_resolved(alert.id, now)
        else:
            resolved_at = self.store.resolved_at(alert.id)
        for m in self.tree.match(alert):
            base = self._base(alert, m, origin, forced=force)
            receiver = self.config.receivers[m.receiver]
            chain = receiver.actions if alert.state == "firing" else receiver.on_resolved
            if not chain:
                why = (
                    "resolved: no undo configured (on_resolved is empty)"
                    if alert.state == "resolved"
                    else f"receiver {receiver.name!r} has no actions"
                )
                self.audit.record("skipped", **base, reason=why)
                continue
            if resolved_at is not None and not force:
                # Delivered late (a retried produce, a replay): the fault it reports is over.
                self.audit.record(
                    "skipped",
                    **base,
                    reason=f"resolved: alert {alert.id} resolved at {iso_time(resolved_at)} "
                    "before this firing arrived; not acted on",
                )
                continue
            if alert.state == "firing" and resolved_at is None:
                self._hold(alert.host, alert.id, chain)
            if not self.store.claim(alert.id, alert.state, m.route.path, now) and not force:
                at, outcome = self.store.claimed(alert.id, alert.state, m.route.path) or (now, None)
                self.audit.record(
                    "skipped",
                    **base,
                    reason=f"duplicate: alert {alert.id} ({alert.state}) was "
                    f"already decided on this route at {iso_time(at)} ({outcome or 'outcome unknown'})",
                )
                continue
            if (
                alert.state == "firing"
                and not force
                and not self._group_admits(alert, m, base, now, origin, one_shot=one_shot)
            ):
                continue
            self._run_chain(alert, m, chain, base, now, force)

    def handle_incident_message(self, msg: Message) -> None:
        """One message of the incidents topic; a malformed one is audited as skipped, never raised."""
        try:
            ev = decode_incident(msg.value)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
            # RecursionError: JSON nested too deep for msgspec (see handle_message).
            self.audit.record(
                "skipped",
                reason=f"malformed_incident: {e}",
                origin=msg.origin,
                detail=msg.value[:300].decode("utf-8", "replace"),
            )
            return
        try:
            self.handle_incident(ev, origin=msg.origin)
        except Exception as e:  # noqa: BLE001 - one bad incident must not stop remediation of the rest
            log.exception("remediation of incident %s from %s failed", printable(ev.incident), printable(msg.origin))
            self.audit.record(
                "failed",
                **self._base(incident_alert(ev), None, msg.origin),
                **_incident_fields(ev),
                error=f"internal error: {e!r}",
            )

    def handle_incident(self, ev: IncidentEvent, *, origin: str | None = None, force: bool = False) -> None:
        """Decide one incident event (docs/remediation.md#incident-mode): ``opened`` and an
        escalation act, once per rung; ``resolved`` runs ``on_resolved``; anything else is one
        ``skipped`` record. Grouping settings do not apply: the incident is the group."""
        now = self.clock()
        alert = incident_alert(ev)
        fields = _incident_fields(ev)
        verdict, why = what_acts(ev)
        if verdict == NO:
            self.audit.record("skipped", **self._base(alert, None, origin, forced=force), **fields, reason=why)
            return
        claim = claim_state(ev)
        if verdict != ACT:
            # Its holds end: another incident's undo may bring the node back now.
            self.store.unhold(alert.id)
        for m in self.tree.match(alert):
            base = {**self._base(alert, m, origin, forced=force), **fields}
            receiver = self.config.receivers[m.receiver]
            chain = receiver.actions if verdict == ACT else receiver.on_resolved
            if verdict == ACT:
                # As an alert does (handle): an open incident that would take its node out, covered
                # or acted on, keeps another incident's undo from bringing the node back.
                self._hold(alert.host, alert.id, list(receiver.actions))
            if not chain:
                why = (
                    "resolved: no undo configured (on_resolved is empty)"
                    if verdict != ACT
                    else f"receiver {receiver.name!r} has no actions"
                )
                self.audit.record("skipped", **base, reason=why)
                continue
            if not self.store.claim(ev.incident, claim, m.route.path, now) and not force:
                at, outcome = self.store.claimed(ev.incident, claim, m.route.path) or (now, None)
                self.audit.record(
                    "skipped",
                    **base,
                    reason=f"duplicate: incident {ev.incident} ({claim}) was already decided on this route "
                    f"at {iso_time(at)} ({outcome or 'outcome unknown'})",
                )
                continue
            self._run_chain(alert, m, chain, base, now, force, claim=claim, incident=True)

    def tick(self, now: float | None = None) -> int:
        """Dispatch groups whose ``group_wait`` is over; returns how many. Prunes old counts hourly."""
        now = self.clock() if now is None else now
        if self.inventory is not None:
            self.inventory.refresh_if_due()
        if now - self._pruned_at >= 3600:
            # Older than every window that reads them: they can no longer change a decision.
            keep = max(self.limits.cooldown, self.limits.attempt_window, self.limits.window)
            self.store.prune(now - keep)
            self.store.prune_groups(now - self.group_horizon)
            self._forget_covers(now)
            self._pruned_at = now
        for act in self.actions.values():
            if isinstance(act, AlertmanagerAction):
                act.tick(now, self.ctx)  # firing alerts re-posted, or Alertmanager resolves them
        n = 0
        for key, route_path, blob in self.store.due_groups(now):
            members = self.store.members(key)
            self.store.mark_dispatched(key, now)
            try:
                alert, origin = _unpack(blob)
                if self.store.resolved_at(alert.id) is not None:
                    # It resolved while the group waited: the group acts on one of its alerts still firing.
                    firing = [p for p in map(_unpack, members) if self.store.resolved_at(p[0].id) is None]
                    alert, origin = firing[0] if firing else (alert, origin)
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as e:
                self.audit.record("failed", route=route_path, error=f"stored group {key} unreadable: {e}")
                continue
            match = next((m for m in self.tree.match(alert) if m.route.path == route_path), None)
            base = self._base(alert, match, origin)
            if self.store.resolved_at(alert.id) is not None:
                self.audit.record(
                    "skipped",
                    **{**base, "route": base["route"] or route_path},
                    reason=f"resolved: every alert of group {key} resolved before its group_wait ended; not acted on",
                )
                continue
            if match is None:
                self.audit.record(
                    "skipped",
                    **{**base, "route": route_path},
                    reason="the route no longer matches this alert (config changed while it waited)",
                )
                continue
            self._run_chain(alert, match, self.config.receivers[match.receiver].actions, base, now, False)
            n += 1
        return n

    # -- steps -------------------------------------------------------------------------------

    def _base(
        self, alert: AlertEvent, m: RouteMatch | None, origin: str | None, forced: bool = False
    ) -> dict[str, Any]:
        return {
            "alert_id": alert.id,
            "alert_state": alert.state,
            "fault": alert.fault,
            "severity": alert.severity,
            "host": alert.host,
            "gpu": alert.gpu,
            "origin": origin,
            "forced": forced,
            "route": m.describe() if m else None,
            "receiver": m.receiver if m else None,
        }

    def _group_admits(
        self,
        alert: AlertEvent,
        m: RouteMatch,
        base: dict[str, Any],
        now: float,
        origin: str | None,
        *,
        one_shot: bool = False,
    ) -> bool:
        route = m.route
        key = route.group_key(alert)
        g = self.store.group(key)
        if g is not None:
            opened_at, due, dispatched_at, blob = g
            if dispatched_at is None:
                self.store.add_member(key, alert.id, _pack(alert, origin))
                first = _unpack(blob)[0].id if blob else "?"
                self.audit.record(
                    "skipped", **base, reason=f"grouped: group {key} acts once, on alert {first}, at {iso_time(due)}"
                )
                self.store.finish(alert.id, alert.state, route.path, "grouped")
                return False
            if now - dispatched_at < route.repeat_interval:
                self.audit.record(
                    "skipped",
                    **base,
                    reason=f"repeat_interval: group {key} acted at "
                    f"{iso_time(dispatched_at)}; not again before {iso_time(dispatched_at + route.repeat_interval)}",
                )
                self.store.finish(alert.id, alert.state, route.path, "repeat_interval")
                return False
        if route.group_wait > 0 and not one_shot:
            self.store.open_group(key, route.path, now, now + route.group_wait, _pack(alert, origin))
            self.audit.record(
                "queued", **base, reason=f"group_wait: group {key} acts at {iso_time(now + route.group_wait)}"
            )
            # A duplicate of it says what became of it, not "outcome unknown".
            self.store.finish(alert.id, alert.state, route.path, f"queued until {iso_time(now + route.group_wait)}")
            return False
        if route.group_wait > 0:
            # One-shot: nobody would dispatch the group later (``tick``), so it acts now.
            self.notes.append(
                f"route {m.describe()}: group_wait {route.group_wait:g}s not waited (a one-shot act decides "
                f"now); group {key} is dispatched, so its later alerts are skipped (repeat_interval) "
                f"for {route.repeat_interval:g}s"
            )
        self.store.open_group(key, route.path, now, now, b"")
        self.store.mark_dispatched(key, now)
        return True

    def _hold(self, host: str | None, alert_id: str, chain: list[str]) -> None:
        """Hold ``host`` for ``alert_id`` when ``chain`` takes it out (an undo waits for its resolution)."""
        if host is not None and any(getattr(self.actions[n], "breaker", False) for n in chain):
            self.store.hold(host, alert_id)

    def _dry(self, name: str) -> bool:
        own = self.action_dry_run.get(name)
        return self.dry_run if own is None else own

    def _run_chain(
        self,
        alert: AlertEvent,
        m: RouteMatch,
        chain: list[str],
        base: dict[str, Any],
        now: float,
        force: bool,
        *,
        claim: str | None = None,
        incident: bool = False,
    ) -> None:
        """Decide each action of ``chain`` in order. ``incident``: an incident's chain, where
        equivalence groups apply (``_covered``, to firing ones), a host taken out is remembered
        and an undo that acts forgets it."""
        receiver = self.config.receivers[m.receiver]
        stopped_by: str | None = None
        outcomes = []
        for i, name in enumerate(chain):
            action = self.actions[name]
            rec = {**base, "action": name, "action_type": action.type}
            if stopped_by and receiver.stop_on_failure:
                self.audit.record(
                    "skipped", **rec, reason=f"not run: {stopped_by} did not succeed before it (stop_on_failure)"
                )
                outcomes.append(f"skipped:{name}")
                continue
            firing = incident and alert.state == "firing"
            covered = self._covered(alert, action, chain[i + 1 :], now) if firing else None
            if covered:
                self.audit.record("skipped", **rec, reason=f"covered: {covered}")
                outcomes.append(f"skipped:{name}")
                continue
            try:
                decision = self._decide(alert, action, rec, now, force)
            except Exception as e:  # noqa: BLE001 - a failure is this action's outcome; the chain goes on
                log.exception("action %s on alert %s", name, printable(alert.id))
                self.audit.record("failed", **rec, error=f"internal error: {type(e).__name__}: {e}")
                decision = "failed"
            outcomes.append(f"{decision}:{name}")
            if decision in ("failed", "blocked", "refused"):
                stopped_by = name
            elif incident and decision == "acted" and alert.host is not None:
                if scope(action) == HOST:
                    self.store.kv_put(_COVER, alert.host, msgspec.json.encode(_Cover(alert.id, name, now)))
                elif getattr(action, "undo", False):
                    self.store.kv_delete(_COVER, alert.host)
        self.store.finish(alert.id, claim or alert.state, m.route.path, ",".join(outcomes))

    def _covered(self, alert: AlertEvent, action: Action, later: list[str], now: float) -> str | None:
        """Why ``action`` is covered by an equivalence group, or None (docs/remediation.md,
        "Equivalence groups"): a host taken out for an incident within ``incidents.covered_for``
        is not taken out again and its GPUs are not reset; a GPU reset in a chain that goes on to
        take its host out is left to that."""
        kind = scope(action)
        if kind is None or alert.host is None:
            return None
        host = alert.host
        out = self._host_out(host, now)
        if kind == HOST and out is not None:
            return (
                f"host {host} was taken out by {out.action} for incident {out.incident} at {iso_time(out.ts)}; "
                "not again"
            )
        if kind == GPU:
            if out is not None:
                return (
                    f"host {host} was taken out by {out.action} for incident {out.incident} at "
                    f"{iso_time(out.ts)}, which covers resetting its GPU {alert.gpu}"
                )
            drain = next((n for n in later if scope(self.actions[n]) == HOST), None)
            if drain is not None:
                return f"{drain} takes host {host} out after it, which covers resetting its GPU {alert.gpu}"
        return None

    def _forget_covers(self, now: float) -> None:
        """Drop the covers ``incidents.covered_for`` has ended (or that cannot be read)."""
        for host, blob in self.store.kv_all(_COVER):
            try:
                ended = now - msgspec.json.decode(blob, type=_Cover).ts >= self.covered_for
            except (msgspec.DecodeError, msgspec.ValidationError):
                ended = True
            if ended:
                self.store.kv_delete(_COVER, host)

    def _host_out(self, host: str, now: float) -> "_Cover | None":
        blob = self.store.kv_get(_COVER, host)
        if blob is None:
            return None
        try:
            c = msgspec.json.decode(blob, type=_Cover)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return c if now - c.ts < self.covered_for else None

    def _decide(self, alert: AlertEvent, action: Action, rec: dict[str, Any], now: float, force: bool) -> str:
        a = self.audit
        try:
            plan = action.plan(alert)
        except UnsafeValue as e:
            a.record("skipped", **rec, reason=f"unsafe_value: {e}")
            return "refused"
        except MissingValue as e:
            a.record("skipped", **rec, reason=f"missing_value: {e}")
            return "skipped"
        rec = {**rec, "argv": plan.argv, "url": _shown_url(plan.url)}
        if plan.breaker and plan.host is None:
            # The breaker counts nodes: an action it would count has to name one.
            a.record(
                "skipped", **rec, reason="missing_value: alert has no host (the breaker counts this action per node)"
            )
            return "skipped"
        if (
            plan.targets_host
            and plan.host is not None
            and self.inventory is not None
            and not self.inventory.knows(plan.host)
        ):
            # Before the breaker and dry-run: an unknown host is never acted on, never counted.
            a.record("skipped", **rec, reason=f"unknown_host: {self.inventory.why_unknown(plan.host)}")
            return "refused"
        if not plan.disruptive:
            if self.action_dry_run.get(action.name):
                a.record("dry_run", **rec)
                return "dry_run"
            return self._execute(action, plan, rec, now)
        is_open, why = self.store.breaker_is_open()
        if is_open:
            a.record("blocked", **rec, reason=why)
            return "blocked"
        if self._dry(action.name):
            a.record("dry_run", **rec, reason="dry-run: a disruptive action and dry_run is on")
            return "dry_run"
        if plan.targets_host and plan.host is not None and self.silences is not None:
            # A maintenance window someone set in Alertmanager: the node is theirs for now.
            try:
                sil = self.silences.matching(alert)
            except SilenceError as e:
                a.record(
                    "failed",
                    **rec,
                    error=f"not acted: Alertmanager silences unknown ({e}); a maintenance "
                    "window we cannot see is not a reason to act",
                )
                return "failed"
            if sil is not None:
                a.record(
                    "skipped",
                    **rec,
                    reason=f"maintenance: silenced in Alertmanager by silence {sil.id} "
                    f"({printable(sil.createdBy)}: {printable(sil.comment)[:200]}) until {sil.endsAt}",
                )
                return "skipped"
        if plan.undo and (plan.host is None or not self.store.owns(plan.host)):
            a.record("skipped", **rec, reason=f"undo: gpuwarden did not take {plan.host} out; left as it is")
            return "skipped"
        if plan.undo and plan.host is not None and (others := self.store.holders(plan.host, alert.id)):
            a.record(
                "skipped",
                **rec,
                reason=f"undo: {plan.host} stays out while alert(s) {', '.join(others[:5])} that take it out still fire",
            )
            return "skipped"
        ent = plan.entity
        if ent is not None and not force:
            last = self.store.last_success(ent, action.name)
            if last is not None and now - last < self.limits.cooldown:
                a.record(
                    "skipped",
                    **rec,
                    reason=f"cooldown: {action.name} succeeded on {ent} at {iso_time(last)}; "
                    f"not again before {iso_time(last + self.limits.cooldown)}",
                )
                return "skipped"
            n = self.store.attempts_since(ent, action.name, now - self.limits.attempt_window)
            if n >= self.limits.max_attempts:
                a.record(
                    "skipped",
                    **rec,
                    reason=f"attempt_cap: {n} attempts of {action.name} on {ent} within "
                    f"{self.limits.attempt_window:g}s (max {self.limits.max_attempts})",
                )
                return "skipped"
        q = action.query(plan, self.ctx)
        if q is not None and q.error:
            if ent is not None:
                self.store.record_attempt(ent, action.name, now, False)
            a.record("failed", **rec, error=f"not acted: {q.error}")
            return "failed"
        if q is not None and q.leave_alone:
            a.record("skipped", **rec, reason=f"left alone: {q.detail}")
            return "skipped"
        if plan.breaker and plan.host is not None:
            ok, why = self.store.admit_node(plan.host, action.name, self.limits, now)
            if not ok:
                a.record("blocked", **rec, reason=why)
                return "blocked"
        return self._execute(action, plan, rec, now)

    def _execute(self, action: Action, plan, rec: dict[str, Any], now: float) -> str:
        try:
            out = action.execute(plan, self.ctx)
        except Exception as e:  # noqa: BLE001 - whatever an action raises is its failure, audited
            log.exception("action %s raised", action.name)
            out = Outcome(False, "exception", error=f"{type(e).__name__}: {e}")
        if plan.disruptive and plan.entity is not None:
            self.store.record_attempt(plan.entity, action.name, now, out.ok)
        if not out.ok:
            self.audit.record("failed", **rec, error=out.error, detail=out.detail or None, attempts=out.attempts)
            return "failed"
        if plan.disruptive and plan.host is not None:
            if plan.breaker:
                self.store.record_owned(plan.host, action.name, now)
            if plan.undo:
                self.store.release(plan.host)
        self.audit.record("acted", **rec, detail=out.detail or None, attempts=out.attempts)
        return "acted"

    def close(self) -> None:
        for act in self.actions.values():
            close = getattr(act, "close", None)
            if close:
                close()
        if self.silences is not None:
            self.silences.close()


_COVER = "cover:host"  # state-file namespace: hosts an incident's action took out


class _Cover(msgspec.Struct, array_like=True):
    incident: str
    action: str
    ts: float


def _incident_fields(ev: IncidentEvent) -> dict[str, Any]:
    """The audit fields naming an incident event (an escalation's policy and reason too)."""
    escalated = ESCALATED in ev.changes
    return {
        "incident": ev.incident,
        "incident_state": ev.state,
        "incident_action": ev.action,
        "policy": ev.policy if escalated else None,
        "escalation": (ev.reason or f"action escalated to {ev.action}") if escalated else None,
    }


def _shown_url(url: str | None) -> str | None:
    if url is None or url.startswith("kafka:"):
        return url
    return redact_url(url)


def _pack(alert: AlertEvent, origin: str | None) -> bytes:
    return encode({"alert": alert, "origin": origin})


class _Packed(msgspec.Struct):
    alert: AlertEvent
    origin: str | None = None


def _unpack(blob: bytes) -> tuple[AlertEvent, str | None]:
    p = msgspec.json.decode(blob, type=_Packed)
    return p.alert, p.origin


def _routes(root: Route) -> list[Route]:
    """``root`` and every route below it."""
    out, todo = [], [root]
    while todo:
        r = todo.pop()
        out.append(r)
        todo += r.children
    return out
