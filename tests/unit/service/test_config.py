import pytest

from pipeline.errors import ConfigError
from pipeline.service.config import load_config, load_config_text


def test_defaults_and_overrides_from_the_environment():
    cfg = load_config_text("kafka: {prefix: prod, security: {security_protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-512}}",
                           env={"GPUWARDEN_KAFKA_BOOTSTRAP": "k1:9093,k2:9093", "GPUWARDEN_KAFKA_USERNAME": "svc",
                                "GPUWARDEN_KAFKA_PASSWORD": "s3cret"})
    assert cfg.kafka.bootstrap == "k1:9093,k2:9093" and cfg.kafka.prefix == "prod"
    opts = cfg.kafka.security.options()
    assert opts == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "svc", "sasl_plain_password": "s3cret"}
    assert "s3cret" not in repr(cfg.kafka.security)           # secrets never printed
    assert cfg.engine_config().allowed_lateness == 30.0


def test_engine_seconds_given_as_whole_numbers_are_floats():
    eng = load_config_text("engine: {tick: 2, allowed_lateness: 10, max_hosts: 64}", env={}).engine_config()
    assert (eng.tick, eng.allowed_lateness, eng.max_hosts) == (2.0, 10.0, 64)
    assert isinstance(eng.tick, float) and isinstance(eng.max_hosts, int)


@pytest.mark.parametrize("text, key", [
    ("kafka: {bootstrp: x}", "kafka.bootstrp"),
    ("kafka: {security: {sasl_password: x}}", "kafka.security.sasl_password"),
    ("http: {port: 'eighty'}", "http.port"),
    ("http: {port: 70000}", "http.port"),
    ("engine: {tick: 0}", "engine.tick"),
    ("engine: {allowed_lateness: -1}", "engine.allowed_lateness"),
    ("engine: {lateness: 5}", "engine.lateness"),
    ("kafka: {prefix: 'a b'}", "kafka.prefix"),
    ("kafka: {max_poll_records: 0}", "kafka.max_poll_records"),
    ("service: {log_level: loud}", "service.log_level"),
    ("service: {fleet_max_buffer: 0}", "service.fleet_max_buffer"),
    ("sevice: {}", "sevice"),
    ("- 1", "(top level)"),
    ("kafka: [", "(file)"),
    # Accepted before, and then the engine crashed (a NaN tick or max_hosts, a NaN lateness) ...
    ("engine: {tick: .nan}", "engine.tick"),
    ("engine: {max_hosts: .nan}", "engine.max_hosts"),
    ("engine: {allowed_lateness: .inf}", "engine.allowed_lateness"),
    # ... or the service never flushed or reloaded (NaN), flushed every turn (<= 0), ...
    ("service: {flush_idle_s: .nan}", "service.flush_idle_s"),
    ("service: {flush_idle_s: -1}", "service.flush_idle_s"),
    ("service: {flush_idle_s: .inf}", "service.flush_idle_s"),
    ("service: {reload_check_s: .nan}", "service.reload_check_s"),
    ("service: {reload_check_s: 0}", "service.reload_check_s"),
    # ... or the first Kafka request failed (an int32 in the protocol) ...
    ("kafka: {fetch_max_bytes: 4294967296}", "kafka.fetch_max_bytes"),
    ("kafka: {partitions: 99999999999999999999}", "kafka.partitions"),
    # ... or the loader itself crashed (KeyError from PyYAML's bool constructor).
    ("kafka: {partitions: !!bool maybe}", "(file)"),
    # ... or the service ran detecting nothing (no rules), or a count was cut (1.5 hosts).
    ("service: {rules: []}", "service.rules"),
    ("service: {rules: ['']}", "service.rules"),
    ("service: {models: ''}", "service.models"),
    ("service: {checkpoint_records: 99999999999999}", "service.checkpoint_records"),
    ("engine: {max_hosts: 1.5}", "engine.max_hosts"),
    ("engine: {max_pending: 0.5}", "engine.max_pending"),
    # A value of the wrong type named only the section: "config key 'engine': Expected `float`".
    ("engine: {tick: fast}", "engine.tick"),
    ("engine: {max_hosts: [1]}", "engine.max_hosts"),
    ("engine: {allowed_lateness: true}", "engine.allowed_lateness"),
    # Found in review: past a float's range, an int raised OverflowError out of the loader (exit 70).
    ("engine: {tick: " + "9" * 400 + "}", "engine.tick"),
    ("engine: {max_hosts: " + "9" * 400 + "}", "engine.max_hosts"),
    # ... and one past 4,300 digits (YAML's hex ints have no digit limit) raised again in repr().
    ("engine: {tick: 0x" + "f" * 5000 + "}", "engine.tick"),
])
def test_bad_config_names_the_key(text, key):
    with pytest.raises(ConfigError) as err:
        load_config_text(text, env={})
    assert err.value.key == key and key in str(err.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_the_shipped_example_config_loads():
    from pathlib import Path
    cfg = load_config(Path(__file__).resolve().parents[3] / "docs" / "serve.example.yaml", env={})
    assert cfg.kafka.group and cfg.service.rules


def test_an_incidents_config_that_does_not_load_names_the_key_and_its_problems(tmp_path, caplog):
    from pipeline.service.wiring import incident_config

    bad = tmp_path / "incidents.yaml"
    bad.write_text("actions: [watch]\npolicies:\n  - name: x\n    count: sometimes\n")
    cfg = load_config_text(f"service: {{incidents_config: '{bad}'}}", env={})
    with pytest.raises(ConfigError) as err:
        incident_config(cfg)
    assert err.value.key == "service.incidents_config"
    assert any(str(bad) in r.getMessage() for r in caplog.records)      # file:line:col problems logged
    assert incident_config(load_config_text("service: {incidents: false}", env={})) is None
    assert incident_config(load_config_text("", env={})) is not None      # on, with the shipped config


def test_a_whole_count_given_as_a_float_is_an_int():
    # A float that is a whole number (10000.0) is that count; the engine sizes arrays with it.
    cfg = load_config_text("engine: {max_hosts: 10000.0}", env={})
    assert cfg.engine_config().max_hosts == 10_000 and type(cfg.engine_config().max_hosts) is int
