"""The service's Prometheus metrics, served with /healthz by ``pipeline.httpendpoint.HttpEndpoint``."""

from __future__ import annotations

import time
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline.decode import REASONS
from pipeline.schema import FAMILIES


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.records = Counter("gpuwarden_records", "Telemetry records decoded and processed", registry=r)
        self.fleet_records = Counter(
            "gpuwarden_fleet_records",
            "Records the fleet stage released to its models (docs/operations.md#topology)",
            registry=r,
        )
        self.fleet_early = Counter(
            "gpuwarden_fleet_early_records",
            "Of gpuwarden_fleet_records, those released a host at a time before their second was "
            "(host-local models, docs/architecture.md#8-the-service-and-its-two-stages)",
            registry=r,
        )
        self.fleet_dropped = Counter(
            "gpuwarden_fleet_dropped_records",
            "Records the fleet stage did not give its models, by why: duplicate (forwarded twice by "
            "an upstream replay) or late (sent for a second already released)",
            ["why"],
            registry=r,
        )
        self.incident_dropped = Counter(
            "gpuwarden_incident_alerts_dropped",
            "Alerts the incident stage did not group, by why: late (for a second it had released), "
            "duplicate, bad_ts, too_many_open, too_many_firing, bad_alert, bad_state",
            ["why"],
            registry=r,
        )
        self.held_dropped = Counter(
            "gpuwarden_held_dropped_records",
            "Records held for the watermark and let go unjudged past the hold's bound, the oldest "
            "first, by the host-stage stage that held them (ports, nic_aer, nccl_results)",
            ["stage"],
            registry=r,
        )
        self.samples_moved = Counter(
            "gpuwarden_samples_moved",
            "DCGM samples moved to the next tick's start, each the second of its host's samples in "
            "one tick (docs/architecture.md#4-time, one sample a tick)",
            registry=r,
        )
        self.fleet_forced = Counter(
            "gpuwarden_fleet_forced_releases",
            "Times the fleet stage followed the most advanced telemetry partition past "
            "service.fleet_max_buffer (what the others send later for those seconds is late)",
            registry=r,
        )
        self.records_per_s = Gauge(
            "gpuwarden_records_per_second", "Records processed per second (last batch)", registry=r
        )
        self.dead = Counter("gpuwarden_dead_letters", "Dead letters by reason", ["reason"], registry=r)
        self.alerts = Counter(
            "gpuwarden_alerts", "Alert events by fault family and state", ["family", "state"], registry=r
        )
        # Every series from zero: increase() over a series born with its first alert reads 0
        # (Prometheus sees no earlier sample), so a dashboard would miss every family's first one.
        for family in FAMILIES:
            for state in ("firing", "resolved"):
                self.alerts.labels(family, state)
        for reason in REASONS:
            self.dead.labels(reason)
        self.incidents = Counter(
            "gpuwarden_incidents",
            "Incident events the fleet stage sent to <prefix>.incidents, by state (opened, updated, resolved)",
            ["state"],
            registry=r,
        )
        for state in ("opened", "updated", "resolved"):
            self.incidents.labels(state)
        self.lag = Gauge(
            "gpuwarden_consumer_lag", "Messages behind the end of each assigned partition", ["partition"], registry=r
        )
        self.batch_seconds = Histogram(
            "gpuwarden_batch_processing_seconds",
            "Time to decode, detect and deliver one polled batch",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.event_lag = Gauge(
            "gpuwarden_event_time_lag_seconds", "Wall clock minus the newest event time processed", registry=r
        )
        self.partitions = Gauge("gpuwarden_assigned_partitions", "Telemetry partitions assigned", registry=r)
        self.split_hosts = Gauge(
            "gpuwarden_hosts_on_several_partitions",
            "Hosts whose recent records came on more than one of this process's telemetry partitions "
            "(their producer does not key messages by host)",
            registry=r,
        )
        self.fleet_split_hosts = Gauge(
            "gpuwarden_fleet_hosts_on_several_partitions",
            "Hosts whose recent DCGM records reached this process's fleet partitions from more than one "
            "telemetry partition's host stage, any replica's (models on)",
            registry=r,
        )
        self.rules = Gauge("gpuwarden_rules_loaded", "Rules in the working set", registry=r)
        self.reload_failures = Counter(
            "gpuwarden_rule_reload_failures", "Rule reloads refused (broken files)", registry=r
        )
        self.delivery_retries = Counter(
            "gpuwarden_delivery_retries", "Batches whose output had to be re-sent", registry=r
        )
        self.loop_seconds = Counter(
            "gpuwarden_loop_seconds",
            "Time spent in each phase of the service loop (poll, process: decode and "
            "engine, deliver, checkpoint, commit)",
            ["phase"],
            registry=r,
        )
        self.checkpoints = Counter(
            "gpuwarden_state_checkpoints",
            "Partition checkpoints written, by why (first after assignment, interval, records, idle, revoke, shutdown)",
            ["why"],
            registry=r,
        )
        self.checkpoint_seconds = Histogram(
            "gpuwarden_state_checkpoint_seconds",
            "Time to snapshot, sign and write one partition's checkpoint",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.checkpoint_failures = Counter(
            "gpuwarden_state_checkpoint_failures",
            "Checkpoint rounds the broker refused (the previous checkpoint stays)",
            registry=r,
        )
        self.commit_failures = Counter(
            "gpuwarden_offset_commit_failures", "Offset commits refused (the checkpoint holds the position)", registry=r
        )
        self.state_skipped = Counter(
            "gpuwarden_state_checkpoints_skipped",
            "Checkpoints read from the state topic and not used, by reason "
            "(unsigned, bad_signature, misplaced, too_large, corrupt, version, rollback)",
            ["reason"],
            registry=r,
        )


def now() -> float:
    return time.monotonic()
