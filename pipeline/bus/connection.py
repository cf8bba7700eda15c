"""One Kafka connection setting for every client: bootstrap, TLS files and SASL (PLAIN, SCRAM).

``serve``, every ``produce`` source, ``remediate``, ``record``, ``replay --to-kafka``, ``sim
--kafka`` and ``topics`` read it the same way (docs/operations.md, Secured Kafka). Later sources
win over earlier ones:

1. the command's own config section (``kafka:`` of serve's or remediate's config), if any;
2. a connection file (``--kafka-config FILE`` or ``GPUWARDEN_KAFKA_CONFIG``): ``bootstrap`` and
   ``security`` (kafka-python's names), the same shape as serve's ``kafka:`` section;
3. the environment (``ENV``), so credentials never need to be in a file;
4. ``--kafka BOOTSTRAP`` on the command line.

Secrets (``sasl_plain_password``, ``ssl_password``) are never logged: ``repr`` and
``describe`` leave them out.

>>> c = resolve(env={"GPUWARDEN_KAFKA_BOOTSTRAP": "k1:9093"})
>>> c.bootstrap, c.security.options()
('k1:9093', {})
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
from pathlib import Path
from typing import Any, Iterator, Mapping

import msgspec

from pipeline import typedconfig
from pipeline.errors import BrokerUnavailableError, ConfigError

# Settings every Kafka client of the product gets. kafka-python backs off reconnecting to a
# broker exponentially up to 30 s: after a broker restart a client sat idle for up to that long
# before it tried again, so alerts came up to 30 s late (measured in the broker-restart fault
# test). A 2 s cap costs one connection attempt per broker every 2 s while it is down.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect_backoff_max_ms": 2000}
# A group member learns of partitions added to its topic (scaling out) at its next metadata
# refresh: kafka-python's 5 minutes left a new partition unread that long (a test saw it). A
# fetch of a quiet topic is answered after fetch_max_wait_ms, and kafka-python's end-offsets
# query (the lag gauge, the idle check) waits behind it: at its 500 ms, the fleet stage's
# 5-second lag update stalled the loop of both stages ~0.3-0.5 s, the p99 of the latency
# benchmark (docs/performance.md).
CONSUMER_DEFAULTS: dict[str, Any] = {"metadata_max_age_ms": 10_000, "fetch_max_wait_ms": 100}

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Environment variable -> the security option it sets (bootstrap and the file are handled apart).
ENV = {
    "GPUWARDEN_KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "GPUWARDEN_KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "GPUWARDEN_KAFKA_USERNAME": "sasl_plain_username",
    "GPUWARDEN_KAFKA_PASSWORD": "sasl_plain_password",
    "GPUWARDEN_KAFKA_SSL_CAFILE": "ssl_cafile",
    "GPUWARDEN_KAFKA_SSL_CERTFILE": "ssl_certfile",
    "GPUWARDEN_KAFKA_SSL_KEYFILE": "ssl_keyfile",
}
ENV_BOOTSTRAP = "GPUWARDEN_KAFKA_BOOTSTRAP"
ENV_FILE = "GPUWARDEN_KAFKA_CONFIG"
_SECRETS = ("sasl_plain_password", "ssl_password")
_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


class Security(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """TLS and SASL options, passed through to kafka-python under its own names."""

    security_protocol: str | None = None  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    ssl_check_hostname: bool | None = None

    def options(self) -> dict[str, Any]:
        """The kafka-python keyword arguments (only those set)."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}

    def __repr__(self) -> str:  # never print secrets
        return f"Security(protocol={self.security_protocol!r}, mechanism={self.sasl_mechanism!r}, ...)"


class _File(msgspec.Struct, forbid_unknown_fields=True):
    bootstrap: str | None = None
    security: Security = msgspec.field(default_factory=Security)


class KafkaConnection(msgspec.Struct, forbid_unknown_fields=True):
    """Where the brokers are and how to log in: what a ``--kafka-config`` file holds."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    security: Security = msgspec.field(default_factory=Security)

    def options(self) -> dict[str, Any]:
        """kafka-python's security keyword arguments."""
        return self.security.options()

    def describe(self) -> str:
        """For logs and messages: the protocol, mechanism and user, never a secret."""
        s = self.security
        proto = s.security_protocol or "PLAINTEXT"
        who = f" {s.sasl_mechanism} as {s.sasl_plain_username!r}" if proto.startswith("SASL") else ""
        return f"{self.bootstrap} ({proto}{who})"

    def __repr__(self) -> str:
        return f"KafkaConnection({self.describe()})"


def _key_of(err: msgspec.ValidationError, prefix: str) -> tuple[str, str]:
    import re

    msg = str(err)
    m = re.search(r"at `\$((?:\.\w+|\[\d+\])*)`", msg)
    path = m.group(1).lstrip(".") if m else ""
    unknown = re.search(r"unknown field `([^`]+)`", msg)
    if unknown:
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
    return (f"{prefix}{path}" if path else prefix.rstrip(".") or "(top level)"), msg.split(" - at ")[0]


def load_file(path: str | Path) -> _File:
    """A connection file (YAML: ``bootstrap``, ``security``); ``ConfigError`` names the bad key."""
    # Bounded and UTF-8 checked (typedconfig): a Latin-1 file is a ConfigError, not a
    # UnicodeDecodeError, and --kafka-config /dev/zero is not read without end.
    text = typedconfig.read_text(path, key="--kafka-config", yaml_key="--kafka-config")
    data = typedconfig.parse_yaml(text, source=str(path), key="--kafka-config") or {}
    if not isinstance(data, dict):
        raise ConfigError("--kafka-config", f"{path}: a mapping with bootstrap and security")
    try:
        return msgspec.convert(data, _File)
    except msgspec.ValidationError as e:
        key, msg = _key_of(e, "")
        raise ConfigError(key, f"{msg} (in {path})") from e


def resolve(
    *,
    bootstrap: str | None = None,
    config_file: str | None = None,
    base: KafkaConnection | None = None,
    env: Mapping[str, str] | None = None,
    key_prefix: str = "kafka.",
) -> KafkaConnection:
    """The connection a command uses: ``base`` < file < environment < ``bootstrap`` (see above).

    Validated: an unknown protocol or mechanism, SASL without a user or password, credentials
    that a non-SASL protocol would silently ignore, or a TLS file that cannot be read is a
    ``ConfigError`` naming the key.
    """
    env = os.environ if env is None else env
    conn = msgspec.structs.replace(base) if base is not None else KafkaConnection()
    conn.security = msgspec.structs.replace(conn.security)
    path = config_file or env.get(ENV_FILE) or None
    if path:
        loaded = load_file(path)
        if loaded.bootstrap:
            conn.bootstrap = loaded.bootstrap
        for k, v in loaded.security.options().items():
            setattr(conn.security, k, v)
    if env.get(ENV_BOOTSTRAP):
        conn.bootstrap = env[ENV_BOOTSTRAP]
    for var, key in ENV.items():
        if env.get(var):
            setattr(conn.security, key, env[var])
    if bootstrap:
        conn.bootstrap = bootstrap
    validate(conn, key_prefix)
    return conn


def validate(conn: KafkaConnection, key_prefix: str = "kafka.") -> None:
    """Raise ``ConfigError`` (naming ``<prefix>security.<key>``) for a setting that cannot work."""
    s = conn.security
    sec = f"{key_prefix}security."
    if not conn.bootstrap.strip():
        raise ConfigError(f"{key_prefix}bootstrap", f"empty (set it, --kafka or {ENV_BOOTSTRAP})")
    proto = s.security_protocol or "PLAINTEXT"
    if proto not in PROTOCOLS:
        raise ConfigError(f"{sec}security_protocol", f"{proto!r}: one of {', '.join(PROTOCOLS)}")
    if proto.startswith("SASL"):
        if s.sasl_mechanism not in MECHANISMS:
            raise ConfigError(
                f"{sec}sasl_mechanism", f"{s.sasl_mechanism!r}: {proto} needs one of {', '.join(MECHANISMS)}"
            )
        if not s.sasl_plain_username:
            raise ConfigError(f"{sec}sasl_plain_username", f"{proto} needs a user (or GPUWARDEN_KAFKA_USERNAME)")
        if not s.sasl_plain_password:
            raise ConfigError(f"{sec}sasl_plain_password", f"{proto} needs a password (or GPUWARDEN_KAFKA_PASSWORD)")
    else:
        for key in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password"):
            if getattr(s, key):
                raise ConfigError(
                    f"{sec}{key}", f"set, but security_protocol {proto} does not use SASL (SASL_SSL or SASL_PLAINTEXT?)"
                )
    for key in _FILES:
        p = getattr(s, key)
        if p and not os.access(p, os.R_OK):
            raise ConfigError(f"{sec}{key}", f"{p}: " + ("not readable" if Path(p).exists() else "no such file"))


def add_arguments(parser: Any, *, bootstrap_help: str = "Kafka bootstrap servers (host:port[,...])") -> None:
    """``--kafka BOOTSTRAP`` and ``--kafka-config FILE``, the same on every command that talks to Kafka."""
    parser.add_argument("--kafka", metavar="BOOTSTRAP", help=bootstrap_help + f" (or {ENV_BOOTSTRAP})")
    parser.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="Kafka connection file: bootstrap, TLS files, SASL (or GPUWARDEN_KAFKA_CONFIG; "
        "docs/operations.md, Secured Kafka)",
    )


def wanted(args: Any) -> bool:
    """Whether the command line asks for Kafka (for commands that write ``--out FILE`` otherwise)."""
    return bool(getattr(args, "kafka", None) or getattr(args, "kafka_config", None))


def from_args(
    args: Any, *, base: KafkaConnection | None = None, env: Mapping[str, str] | None = None, key_prefix: str = "kafka."
) -> KafkaConnection:
    """The connection for a parsed command line (``add_arguments``)."""
    return resolve(
        bootstrap=getattr(args, "kafka", None),
        config_file=getattr(args, "kafka_config", None),
        base=base,
        env=env,
        key_prefix=key_prefix,
    )


# -- telling what went wrong --------------------------------------------------------------------


def _servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for hostport in filter(None, (x.strip() for x in bootstrap.split(","))):
        host, _, port = hostport.rpartition(":")
        out.append((host.strip("[]") or "127.0.0.1", int(port) if port.isdigit() else 9092))
    return out or [("127.0.0.1", 9092)]


def _transport(host: str, port: int, s: Mapping[str, Any], timeout_s: float) -> str | None:
    """What stops TCP or TLS to one server (the stdlib's own handshake), else ``None``."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as e:
        return f"no Kafka broker answered at {host}:{port}: {e.strerror or e}"
    try:
        if (s.get("security_protocol") or "PLAINTEXT") in ("SSL", "SASL_SSL"):
            try:
                ctx = ssl.create_default_context(cafile=s.get("ssl_cafile"))
                ctx.check_hostname = bool(s.get("ssl_check_hostname", True))
                if s.get("ssl_certfile"):
                    ctx.load_cert_chain(s["ssl_certfile"], s.get("ssl_keyfile"), s.get("ssl_password"))
                sock = ctx.wrap_socket(sock, server_hostname=host)
            except (ssl.SSLError, OSError) as e:
                return (
                    f"TLS with the Kafka broker at {host}:{port} failed: {getattr(e, 'reason', None) or e} "
                    "(ssl_cafile, ssl_certfile, or a listener that is not TLS?)"
                )
    finally:
        sock.close()
    return None


def transport_problem(bootstrap: str, security: Mapping[str, Any] | None, timeout_s: float = 5.0) -> str | None:
    """Why no bootstrap server can be reached over TCP (and TLS, when configured); ``None`` if one can."""
    first = None
    for host, port in _servers(bootstrap):
        problem = _transport(host, port, dict(security or {}), timeout_s)
        if problem is None:
            return None
        first = first or problem
    return first


def diagnose(bootstrap: str, security: Mapping[str, Any] | None, timeout_s: float = 5.0) -> str:
    """Why a client could not get going: TCP, then TLS, then SASL.

    kafka-python reports every one of these as "Unable to bootstrap" after its timeout; a broker
    that finishes the TLS handshake and then drops the connection refused the SASL login.
    """
    s = dict(security or {})
    proto = s.get("security_protocol") or "PLAINTEXT"
    problem = transport_problem(bootstrap, s, timeout_s)
    if problem:
        return problem
    if proto.startswith("SASL"):
        return (
            f"the Kafka broker at {bootstrap} refused the SASL {s.get('sasl_mechanism')} login of user "
            f"{s.get('sasl_plain_username')!r} (wrong user or password, or a mechanism it has no credentials for)"
        )
    return f"the Kafka broker at {bootstrap} did not complete a {proto} connection (is that listener {proto}?)"


def unavailable(bootstrap: str, security: Mapping[str, Any] | None, err: BaseException) -> BrokerUnavailableError:
    """A ``BrokerUnavailableError`` (exit 4) saying which step failed, never a secret."""
    return BrokerUnavailableError(f"{diagnose(bootstrap, security)} [{type(err).__name__}]")


def check(conn: KafkaConnection, timeout_s: float = 10.0) -> None:
    """Log in once (an admin metadata request); ``BrokerUnavailableError`` says why it failed.

    For commands that would otherwise wait silently: a consumer with refused credentials polls
    empty batches forever.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    # Nobody there, or a certificate refused: said at once, without kafka-python's retries.
    problem = transport_problem(conn.bootstrap, conn.options(), min(timeout_s, 5.0))
    if problem:
        raise BrokerUnavailableError(problem)
    ms = int(timeout_s * 1000)
    with _quiet_kafka():
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=conn.bootstrap,
                request_timeout_ms=ms,
                bootstrap_timeout_ms=ms,
                client_id="gpuwarden-check",
                **conn.options(),
                **CLIENT_DEFAULTS,
            )
        except KafkaError as e:
            raise unavailable(conn.bootstrap, conn.options(), e) from None
        try:
            admin.list_topics()
        except KafkaError as e:
            raise unavailable(conn.bootstrap, conn.options(), e) from None
        finally:
            admin.close()


@contextlib.contextmanager
def _quiet_kafka() -> Iterator[None]:
    """kafka-python's per-attempt warnings while ``check`` runs: its one-line diagnosis says it
    all (``-v``, DEBUG logging, keeps them)."""
    kafka_log = logging.getLogger("kafka")
    old = kafka_log.level
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        kafka_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        kafka_log.setLevel(old)


def login_refused(conn: KafkaConnection, timeout_s: float = 5.0) -> str | None:
    """The reason when the broker answers but refuses TLS or the login, else ``None``.

    For producers: a broker that is down is an outage to ride out (they buffer), but refused
    credentials never heal by waiting.
    """
    try:
        check(conn, timeout_s)
    except BrokerUnavailableError as e:
        return None if e.message.startswith("no Kafka broker answered") else e.message
    return None
