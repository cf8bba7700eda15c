"""The service's configuration: YAML -> typed, validated objects; unknown keys are errors.

Environment variables override the file for what differs per deployment and what is secret:
``GPUWARDEN_KAFKA_BOOTSTRAP``, ``GPUWARDEN_KAFKA_USERNAME``, ``GPUWARDEN_KAFKA_PASSWORD``
(SASL), so credentials never need to be written into a file; the checkpoint key is only ever
the environment's (``GPUWARDEN_STATE_KEY``, read by ``service/state.py``).

>>> cfg = load_config_text("kafka: {bootstrap: '127.0.0.1:9092'}", env={})
>>> cfg.kafka.prefix, cfg.http.port
('gpuwarden', 9108)
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import msgspec

from pipeline import typedconfig
from pipeline.bus import connection
from pipeline.durations import MAX_SECONDS
from pipeline.engine import EngineConfig
from pipeline.errors import ConfigError
from pipeline.resources import rules_dir


# TLS and SASL options: the one definition every Kafka client shares (pipeline/bus/connection.py).
Security = connection.Security
INT32_MAX = (1 << 31) - 1


class KafkaSection(msgspec.Struct, forbid_unknown_fields=True):
    bootstrap: str = "127.0.0.1:9092"
    prefix: str = "gpuwarden"
    group: str = "gpuwarden-service"
    partitions: int = 8  # for topics the service creates
    # kafka-python consumer settings (docs/operations.md#performance): a batch big enough to
    # amortise the per-batch costs (delivery flush, metrics), fetches big enough that a poll is
    # served from what was already fetched.
    max_poll_records: int = 2000
    fetch_max_bytes: int = 64 << 20
    max_partition_fetch_bytes: int = 8 << 20
    max_poll_interval_ms: int = 300_000
    session_timeout_ms: int = 10_000
    security: Security = msgspec.field(default_factory=Security)


class HttpSection(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 9108  # 0: pick a free port (tests)


class ServiceSection(msgspec.Struct, forbid_unknown_fields=True):
    # Default: the shipped packs (pipeline/resources.py), wherever gpuwarden is installed.
    rules: list[str] = msgspec.field(default_factory=lambda: [str(rules_dir())])
    # Online models: a models.yaml, "auto" (the one beside the rules) or "none".
    models: str = "auto"
    # A partition with no new records for this long (wall clock) is flushed: everything it
    # buffered is evaluated, as at the end of a replay. Later records older than that are late.
    flush_idle_s: float = 30.0
    reload_check_s: float = 5.0  # how often rule files are checked for changes
    # Checkpoint cadence (docs/operations.md, How it keeps its promises): a partition with new
    # input is checkpointed, and only then its offsets committed, once per
    # checkpoint_interval_s (one grid for all partitions, so they go in one round) or after
    # checkpoint_records records, and always after its first batch, on revoke, idle flush and
    # shutdown. A crash replays what came after the partition's last checkpoint.
    checkpoint_interval_s: float = 5.0
    checkpoint_records: int = 200_000
    # The most records a fleet-stage partition holds for telemetry partitions that have not
    # marked past them (docs/operations.md, Topology): ~630 bytes each. Past it, the stage follows
    # the most advanced partition and what the others send later for released seconds is lost
    # to the models. It must cover the fleet's records over the host stage's start-up hold
    # (allowed_lateness plus the largest sampling step): 16,384 GPUs x 30 s is ~650,000.
    fleet_max_buffer: int = 2_000_000
    log_level: str = "INFO"
    # Checkpoints are signed with GPUWARDEN_STATE_KEY; without the key serve refuses to start
    # unless this is true (or --insecure-state): then anyone who can write the state topic can
    # feed the engines a forged history (docs/operations.md, Security).
    insecure_state: bool = False
    # The most a checkpoint may decompress to (MiB); above any real snapshot (docs/performance.md).
    state_max_mib: int = 512
    # Which stages this replica runs (docs/operations.md, Topology): "all" (the host stage and,
    # with models, the fleet stage), "host" (rules and absence, keyed by host) or "fleet" (the
    # models, fed through <prefix>.fleet). Each is its own consumer group, scaled on its own.
    stage: Literal["all", "host", "fleet"] = "all"
    # Incidents (docs/operations.md, "Incidents"): the fleet stage groups the alerts of both
    # stages into incident events on <prefix>.incidents (it runs for them also without models).
    incidents: bool = True
    # Model shards (docs/operations.md, "Model shards"): the fleet stage's models run split by
    # host, one shard per fleet partition, so the model work spreads over the fleet stage's
    # replicas; the shards exchange cohort state and NCCL findings over <prefix>.fleet. Every
    # replica of both stages must agree on it. Off: every model runs on the partition of the
    # one fleet key.
    shard_models: bool = False
    # The incidents YAML: "auto" (incidents.yaml beside the first rule directory, else the
    # shipped one) or a path.
    incidents_config: str = "auto"


# dict=True: a loaded config remembers its file (``_origin``), for errors found after loading
# (``check_rule_paths``); an attribute outside the fields, so never a key of the file.
class Config(msgspec.Struct, forbid_unknown_fields=True, dict=True):
    kafka: KafkaSection = msgspec.field(default_factory=KafkaSection)
    http: HttpSection = msgspec.field(default_factory=HttpSection)
    # EngineConfig's own fields (pipeline/engine/config.py), validated by it: one definition.
    # Any value: its type is checked there, so an error names engine.<key>, not the section.
    engine: dict[str, Any] = {}
    service: ServiceSection = msgspec.field(default_factory=ServiceSection)

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.engine)


def load_config_text(text: str, env: Mapping[str, str] | None = None, *, source: str = "<config>") -> Config:
    """Parse and validate; raise ``ConfigError`` naming the offending key and ``source`` (the
    file), with the line and column of the key's value (of the key, for an unknown one) where
    the file holds it.

    >>> load_config_text("kafka:\\n  bootstrp: x\\n", env={}, source="serve.yaml")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: config key 'kafka.bootstrp': serve.yaml:2:3: unknown key; did you mean 'bootstrap'? [GW100]
    """
    env = os.environ if env is None else env
    data = typedconfig.parse_yaml(text, source=source, key="(file)") or {}
    try:
        cfg = _checked(data, env, source)
    except ConfigError as e:
        raise typedconfig.located(e, text, source) from None
    cfg.__dict__["_origin"] = (source, text)
    return cfg


def _checked(data: Any, env: Mapping[str, str], source: str) -> Config:
    if not isinstance(data, dict):
        raise ConfigError(typedconfig.TOP, "the config is a mapping of sections (kafka, http, engine, service)")
    cfg = typedconfig.convert(data, Config, source=source)
    if env.get("GPUWARDEN_KAFKA_BOOTSTRAP"):
        cfg.kafka.bootstrap = env["GPUWARDEN_KAFKA_BOOTSTRAP"]
    if env.get("GPUWARDEN_KAFKA_USERNAME"):
        cfg.kafka.security.sasl_plain_username = env["GPUWARDEN_KAFKA_USERNAME"]
    if env.get("GPUWARDEN_KAFKA_PASSWORD"):
        cfg.kafka.security.sasl_plain_password = env["GPUWARDEN_KAFKA_PASSWORD"]
    _validate(cfg)
    return cfg


def _validate(cfg: Config) -> None:
    if not cfg.kafka.bootstrap:
        raise ConfigError("kafka.bootstrap", "empty (set it or GPUWARDEN_KAFKA_BOOTSTRAP)")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", cfg.kafka.prefix):
        raise ConfigError("kafka.prefix", f"{cfg.kafka.prefix!r}: letters, digits, '.', '_' and '-' only")
    for key in (
        "partitions",
        "max_poll_records",
        "fetch_max_bytes",
        "max_partition_fetch_bytes",
        "max_poll_interval_ms",
        "session_timeout_ms",
    ):
        # Kafka's protocol carries each as an int32: a larger one fails at the first request.
        if not 0 < getattr(cfg.kafka, key) <= INT32_MAX:
            raise ConfigError(f"kafka.{key}", f"{getattr(cfg.kafka, key)}: must be > 0 and at most {INT32_MAX}")
    if not 0 <= cfg.http.port <= 65535:
        raise ConfigError("http.port", f"{cfg.http.port} is not a port")
    cfg.engine_config()  # raises ConfigError naming engine.<key>
    # NaN never compares true (no idle flush, no reload check); 0 or less flushes every turn, and
    # infinity never sends the final mark a fleet stage waits for.
    for key in ("flush_idle_s", "reload_check_s"):
        val = getattr(cfg.service, key)
        if not (math.isfinite(val) and 0 < val <= MAX_SECONDS):
            raise ConfigError(f"service.{key}", f"{val}: seconds, above 0 and at most {MAX_SECONDS:.0f}")
    if not (math.isfinite(cfg.service.checkpoint_interval_s) and 0 < cfg.service.checkpoint_interval_s <= 3600):
        raise ConfigError(
            "service.checkpoint_interval_s", f"{cfg.service.checkpoint_interval_s}: seconds, above 0 and at most 3600"
        )
    # An empty list (or path) of rules ran a service that detects nothing, silently.
    if not cfg.service.rules or not all(isinstance(r, str) and r.strip() for r in cfg.service.rules):
        raise ConfigError("service.rules", f"{cfg.service.rules!r}: one or more rule files or directories")
    if not cfg.service.models.strip():
        raise ConfigError("service.models", "empty: 'auto', 'none' or the path of a models.yaml")
    for key in ("checkpoint_records", "fleet_max_buffer"):
        if not 0 < getattr(cfg.service, key) <= INT32_MAX:
            raise ConfigError(f"service.{key}", f"{getattr(cfg.service, key)}: must be > 0 and at most {INT32_MAX}")
    if not 0 < cfg.service.state_max_mib <= 16384:
        raise ConfigError("service.state_max_mib", f"{cfg.service.state_max_mib}: between 1 and 16384")
    if cfg.service.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("service.log_level", f"{cfg.service.log_level!r}: DEBUG, INFO, WARNING or ERROR")


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> Config:
    """The service config file at ``path`` (none: the defaults), checked, with the environment's
    overrides; ``ConfigError`` naming the key on any mistake."""
    if path is None:
        return load_config_text("", env)
    text = typedconfig.read_text(path, key="(file)", yaml_key="(file)")
    return load_config_text(text, env, source=str(path))


def check_rule_paths(paths: Sequence[str], cfg: Config | None = None) -> None:
    """``ConfigError`` naming ``service.rules`` for a rule path that does not exist: the path as
    given, the directory a relative one was resolved against (the current directory, as every
    path of this config), and, when ``cfg`` was loaded from a file that gives the path, its
    ``file:line:col``. Not part of loading: a config is checked on machines without its rules."""
    for p in paths:
        path = Path(p)
        if path.exists():
            continue
        what = "rules file" if path.suffix in (".yaml", ".yml") else "rules directory"
        rel = ""
        if not path.is_absolute():
            try:
                rel = f" (relative to the current directory {Path.cwd()})"
            except OSError:
                rel = " (relative to the current directory, which no longer exists)"
        raise ConfigError("service.rules", f"{_where(cfg, p)}{what} {p!r} does not exist{rel}")


def _where(cfg: Config | None, path: str) -> str:
    """``file:line:col: `` of the ``service.rules`` item that gives ``path`` in the file ``cfg``
    was loaded from; "" when none does (the defaults, ``--rules``)."""
    origin = getattr(cfg, "_origin", None)
    if cfg is None or origin is None:
        return ""
    source, text = origin
    for i, given in enumerate(cfg.service.rules):
        found = typedconfig.node_at(text, f"service.rules[{i}]") if given == path else None
        if found is not None and getattr(found[1], "value", None) == path:
            mark = found[1].start_mark
            return f"{source}:{mark.line + 1}:{mark.column + 1}: "
    return ""
