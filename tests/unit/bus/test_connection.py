"""pipeline/bus/connection.py: where a Kafka client's bootstrap and credentials come from, and what
is refused before any connection is tried."""

from __future__ import annotations

import socket

import pytest

from pipeline.bus import connection
from pipeline.bus.connection import KafkaConnection, Security, diagnose, resolve
from pipeline.errors import ConfigError


def write(tmp_path, text: str):
    p = tmp_path / "kafka.yaml"
    p.write_text(text)
    return str(p)


def test_file_then_environment_then_command_line(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    f = write(tmp_path, f"bootstrap: file:9093\nsecurity: {{security_protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-512,"
                        f" sasl_plain_username: fileuser, ssl_cafile: {ca}}}\n")
    env = {"GPUWARDEN_KAFKA_PASSWORD": "pw-from-env", "GPUWARDEN_KAFKA_USERNAME": "envuser"}
    c = resolve(config_file=f, env=env)
    assert c.bootstrap == "file:9093"
    assert c.options() == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                           "sasl_plain_username": "envuser", "sasl_plain_password": "pw-from-env",
                           "ssl_cafile": str(ca)}
    assert resolve(config_file=f, env={**env, "GPUWARDEN_KAFKA_BOOTSTRAP": "env:1"}).bootstrap == "env:1"
    assert resolve(bootstrap="cli:2", config_file=f, env={**env, "GPUWARDEN_KAFKA_BOOTSTRAP": "env:1"}).bootstrap \
        == "cli:2"
    # GPUWARDEN_KAFKA_CONFIG names the file when --kafka-config does not.
    assert resolve(env={**env, "GPUWARDEN_KAFKA_CONFIG": f}).security.sasl_plain_username == "envuser"


def test_a_config_section_is_the_base_the_file_overrides(tmp_path):
    base = KafkaConnection("section:9092", Security(security_protocol="SSL"))
    assert resolve(base=base, env={}).options() == {"security_protocol": "SSL"}
    assert base.security.security_protocol == "SSL"
    f = write(tmp_path, "security: {security_protocol: PLAINTEXT}\n")
    c = resolve(base=base, config_file=f, env={})
    assert (c.bootstrap, c.security.security_protocol) == ("section:9092", "PLAINTEXT")
    assert base.security.security_protocol == "SSL"          # the caller's section is not changed


@pytest.mark.parametrize("text, env, key", [
    ("security: {security_protocol: SASL_TLS}", {}, "kafka.security.security_protocol"),
    ("security: {security_protocol: SASL_SSL, sasl_plain_username: u}", {"GPUWARDEN_KAFKA_PASSWORD": "p"},
     "kafka.security.sasl_mechanism"),
    ("security: {security_protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-512, sasl_plain_username: u}", {},
     "kafka.security.sasl_plain_password"),
    ("security: {security_protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-512}", {"GPUWARDEN_KAFKA_PASSWORD": "p"},
     "kafka.security.sasl_plain_username"),
    ("bootstrap: k:1", {"GPUWARDEN_KAFKA_USERNAME": "u"}, "kafka.security.sasl_plain_username"),
    ("security: {security_protocol: SSL, ssl_cafile: /nonexistent/ca.pem}", {}, "kafka.security.ssl_cafile"),
    ("security: {sasl_password: x}", {}, "security.sasl_password"),
    ("brokers: k:1", {}, "brokers"),
])
def test_settings_that_cannot_work_name_their_key(tmp_path, text, env, key):
    with pytest.raises(ConfigError) as e:
        resolve(config_file=write(tmp_path, text), env=env)
    assert e.value.key == key


def test_an_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        resolve(config_file=str(tmp_path / "missing.yaml"), env={})


@pytest.mark.parametrize("content, words", [
    (b"bootstrap: k\xe9:9092\n", "not UTF-8"),                        # was UnicodeDecodeError
    (b"bootstrap: !!bool maybe\n", ":1:12: not valid YAML"),            # was KeyError
    (b"# pad\n" * 200_000, "the limit is"),                              # was read whole
])
def test_a_file_that_is_not_a_config_is_a_config_error_naming_the_option(tmp_path, content, words):
    p = tmp_path / "kafka.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        resolve(config_file=str(p), env={})
    assert e.value.key == "--kafka-config" and words in str(e.value) and str(p) in str(e.value), str(e.value)


def test_secrets_are_never_in_repr_or_describe(tmp_path):
    c = resolve(env={"GPUWARDEN_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GPUWARDEN_KAFKA_SASL_MECHANISM": "PLAIN",
                     "GPUWARDEN_KAFKA_USERNAME": "svc", "GPUWARDEN_KAFKA_PASSWORD": "hunter2-secret"})
    for text in (repr(c), c.describe(), repr(c.security)):
        assert "hunter2-secret" not in text
    assert "PLAIN as 'svc'" in c.describe()


def test_diagnose_tells_nobody_there_from_a_refused_login():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert diagnose(f"127.0.0.1:{port}", {}).startswith("no Kafka broker answered")
    with socket.socket() as listener:      # something accepts TCP: a SASL failure is the login's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        msg = diagnose(f"127.0.0.1:{port}", {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                             "sasl_plain_username": "u", "sasl_plain_password": "pw"})
        assert "refused the SASL PLAIN login of user 'u'" in msg and "pw" not in msg.replace("password", "")
        # ... and a TLS listener that is not TLS fails the handshake (the peer never answers it).
        msg = diagnose(f"127.0.0.1:{port}", {"security_protocol": "SSL"}, timeout_s=0.5)
        assert msg.startswith("TLS with the Kafka broker")


def test_login_refused_is_none_when_nobody_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert connection.login_refused(KafkaConnection(f"127.0.0.1:{port}")) is None
