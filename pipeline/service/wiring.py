"""The service's parts on Kafka and its process set-up: the consumer, producer and state store
of a stage, the live decoder, the start-up check of the rules, JSON logging."""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

from pipeline.bus import connection
from pipeline.bus.base import Producer, Topics
from pipeline.bus.group import GroupConsumer, KafkaGroupConsumer
from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
from pipeline.decode import Decoder
from pipeline.errors import BrokerUnavailableError, ConfigError, InputError
from pipeline.incidents import IncidentConfig
from pipeline.rules import load_rules
from pipeline.rules.loader import no_rules_warnings, without_rule_files
from pipeline.service.config import Config, check_rule_paths
from pipeline.service.state import KafkaStateStore, StateStore, state_key

log = logging.getLogger("gpuwarden.service")
STATE_MAX_BYTES = 64 * 1024 * 1024  # the state topic's max.message.bytes (pipeline.bus.kafka.ensure_topics)
# Event time further ahead of the service's wall clock than this is ts_out_of_range (a producer
# whose clock is wrong). No bound on age: a recording replayed into the topic is old by nature.
MAX_FUTURE_S = 300.0


def max_poll(cfg: Config, stage: str) -> int:
    """Messages a poll may return: a fleet-topic message holds up to MAX_FORWARD records, so that
    stage takes fewer of them per turn (the turn of the host stage beside it waits for it)."""
    n = cfg.kafka.max_poll_records
    return n if stage == "host" else max(4, n // 20)


def fleet_on(cfg: Config) -> bool:
    """Whether a fleet stage runs: for the models, the hang detector or the incidents."""
    return cfg.service.incidents or models_on(cfg) or hang_on(cfg)


def hang_on(cfg: Config) -> bool:
    """Whether a ``hang.yaml`` is beside the service's rules (the fleet stage's hang detector)."""
    from pipeline.detection import hang_path

    return hang_path([str(Path(p)) for p in cfg.service.rules]) is not None


def models_on(cfg: Config) -> bool:
    """Whether the service's rules run with models (then a fleet stage runs them)."""
    from pipeline.detection import models_path

    return models_path([str(Path(p)) for p in cfg.service.rules], cfg.service.models) is not None


def kafka_parts(cfg: Config, stage: str = "host") -> tuple[GroupConsumer, Producer, StateStore, int]:
    """Consumer, producer and state store on the Kafka cluster of ``cfg.kafka`` for ``stage``,
    and the rule count. The fleet stage is its own consumer group (``<group>.fleet``) on the
    fleet topic, with its own checkpoints in the state topic."""
    k = cfg.kafka
    topics = Topics(k.prefix)
    source = topics.telemetry if stage == "host" else topics.fleet
    group = k.group if stage == "host" else f"{k.group}.fleet"
    security = k.security.options()
    # Before anything else: no key (and no --insecure-state) is a refusal to start, not a
    # service that trusts whatever the state topic holds (docs/operations.md, Security).
    mac_key = state_key(os.environ, cfg.service.insecure_state)
    if mac_key is None:
        log.warning(
            "INSECURE STATE: GPUWARDEN_STATE_KEY is not set and --insecure-state is on; checkpoints are "
            "unsigned and anyone who can write %s can feed the engines a forged history",
            topics.state,
            extra={"insecure_state": True},
        )
    check_rule_paths(cfg.service.rules, cfg)  # as given, and where the config file gives them
    n_rules = check_rules_load([str(Path(p)) for p in cfg.service.rules])
    # Nobody listening: one line and exit 4 now, not kafka-python's connection errors logged
    # for its 30 s bootstrap timeout (TLS and SASL were checked by ``serve`` already).
    problem = connection.transport_problem(k.bootstrap, security, 5.0)
    if problem:
        raise BrokerUnavailableError(problem)
    created = ensure_topics(k.bootstrap, topics, partitions=k.partitions, security=security)
    if created:
        # Said, since a mistyped prefix makes a whole new topic set that nobody writes to.
        log.warning("created topics %s (they did not exist under prefix %r)", ", ".join(created), topics.prefix)
    producer = KafkaBusProducer(
        k.bootstrap, security=security, client_id="gpuwarden-service", max_request_size=STATE_MAX_BYTES
    )
    state = KafkaStateStore(
        k.bootstrap,
        topics.state,
        group,
        source,
        producer,
        security,
        key=mac_key,
        max_bytes=cfg.service.state_max_mib << 20,
    )
    consumer = KafkaGroupConsumer(
        k.bootstrap,
        source,
        group,
        security=security,
        client_id=f"gpuwarden-service-{stage}",
        auto_offset_reset="earliest",
        max_poll_records=max_poll(cfg, stage),
        max_poll_interval_ms=k.max_poll_interval_ms,
        session_timeout_ms=k.session_timeout_ms,
        fetch_max_bytes=k.fetch_max_bytes,
        max_partition_fetch_bytes=k.max_partition_fetch_bytes,
    )
    return consumer, producer, state, n_rules


def incident_config(cfg: Config) -> IncidentConfig | None:
    """The incident stage's config (None: ``service.incidents`` is off); ``ConfigError`` naming
    ``service.incidents_config`` when its file does not load, each problem logged."""
    from pipeline.incidents import default_config
    from pipeline.incidents.config import IncidentConfigError, require_config

    svc = cfg.service
    if not svc.incidents:
        return None
    try:
        if svc.incidents_config != "auto":
            return require_config(svc.incidents_config)
        return default_config(svc.rules[0] if svc.rules else None)
    except IncidentConfigError as e:
        for d in e.diagnostics:
            log.error("incidents: %s", d)
        raise ConfigError("service.incidents_config", f"{svc.incidents_config}: does not load (see the log)") from None


def check_rules_load(paths: list[str]) -> int:
    """The number of rules; ``InputError`` (exit 3) naming the files when they do not load,
    ``ConfigError`` naming ``service.rules`` when one of ``paths`` does not exist."""
    check_rule_paths(paths)
    empty = without_rule_files(paths)
    if empty:  # the built-in checks alone, saying nothing: a wrong path, a pack not written yet
        raise InputError(f"service.rules: {', '.join(empty)}: no rule files (*.yaml, *.yml) in this directory")
    ruleset, diags = load_rules(paths)
    if ruleset is not None:  # an empty rule file, as `rules check` warns; a hot reload says it again
        diags = [*diags, *no_rules_warnings(ruleset)]
    for d in diags:
        (log.error if d.is_error else log.warning)("rules: %s", d)
    if ruleset is None:
        raise InputError(f"rules in {', '.join(paths)} do not load")
    return len(ruleset)


def live_decoder() -> Decoder:
    """The host stage's decoder: event time bounded against the wall clock ahead, not behind."""
    return Decoder(wall_clock=time.time, max_future_s=MAX_FUTURE_S, max_age_s=math.inf)


def setup_logging(level: str = "INFO") -> None:
    """JSON lines on stderr: every problem record names its topic[partition]@offset."""
    from pythonjsonlogger.json import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level", "asctime": "time"}
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kafka").setLevel(logging.ERROR)
