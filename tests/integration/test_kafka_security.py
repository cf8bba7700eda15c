"""Every Kafka client over TLS + SASL/SCRAM-SHA-512, against a real broker of the test's own.

The test makes a CA and a server certificate (openssl argv), starts Apache Kafka with a
SASL_SSL listener whose SCRAM credentials are added at format time (scripts/kafka,
KAFKA_SASL_SSL_PORT), and then runs the commands as a user would: one connection file
(``--kafka-config``) with the password only in the environment. ``topics``, ``sim``, ``produce``,
``serve``, ``replay --to-kafka``, ``record`` and ``remediate`` exchange records through it; with a
wrong password each says so in one line and exits 4 instead of waiting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.factories import SHARED_DATA
from tests.systools import free_port, http_get, require_tool, stop

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "gpuwarden-test", "scram-Secret-7f3a"
WRONG = "not-the-password-91c2"


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run([require_tool("openssl", package="openssl"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def make_tls(d: Path) -> tuple[Path, Path, str]:
    """A CA, a server certificate for 127.0.0.1 signed by it, and the server's PKCS12 keystore."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=gpuwarden-test-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    store_pw = "keystore-pw-1"
    _openssl("pkcs12", "-export", "-in", "server.pem", "-inkey", "server.key", "-certfile", "ca.pem",
             "-out", "server.p12", "-passout", f"pass:{store_pw}", cwd=d)
    return d / "ca.pem", d / "server.p12", store_pw


class SecuredBroker:
    def __init__(self, tmp: Path) -> None:
        require_tool("java", package="default-jre-headless")
        ca, keystore, store_pw = make_tls(tmp / "tls")
        self.ca = ca
        self.port, self.sasl_port = free_port(), free_port()
        self.env = {**os.environ, "KAFKA_DIR": str(tmp / "kafka"), "KAFKA_PORT": str(self.port),
                    "KAFKA_CONTROLLER_PORT": str(free_port()), "KAFKA_SASL_SSL_PORT": str(self.sasl_port),
                    "KAFKA_SSL_KEYSTORE": str(keystore), "KAFKA_SSL_KEYSTORE_PASSWORD": store_pw,
                    "KAFKA_SASL_USERS": f"{USER}:{PASSWORD}", "KAFKA_START_TIMEOUT": "90",
                    "PYTHON": sys.executable}
        self.bootstrap = f"127.0.0.1:{self.sasl_port}"

    def run(self, cmd: str) -> None:
        done = subprocess.run([str(ROOT / "scripts" / "kafka"), cmd], env=self.env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = SecuredBroker(tmp_path_factory.mktemp("secured"))
    b.run("start")
    try:
        yield b
    finally:
        b.run("stop")


@pytest.fixture
def work(broker, tmp_path):
    """A connection file without the password, and a cwd outside the repository."""
    conf = tmp_path / "kafka.yaml"
    conf.write_text(f"bootstrap: {broker.bootstrap}\n"
                    "security:\n"
                    "  security_protocol: SASL_SSL\n"
                    "  sasl_mechanism: SCRAM-SHA-512\n"
                    f"  sasl_plain_username: {USER}\n"
                    f"  ssl_cafile: {broker.ca}\n")
    return conf


def env(password: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_KAFKA_")}
    return {**e, "GPUWARDEN_KAFKA_PASSWORD": password, "PYTHONUNBUFFERED": "1"}


def gw(*args: str, cwd: Path, password: str = PASSWORD, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env(password), capture_output=True,
                          text=True, timeout=timeout)


def remediation_config(tmp: Path, prefix: str) -> Path:
    doc = {"kafka": {"prefix": prefix, "group": f"{prefix}-remediate"},
           "state_file": str(tmp / "rem.sqlite"),
           "audit": {"kafka": True, "file": str(tmp / "audit.jsonl")},
           "actions": {"note": {"type": "log"}},
           "receivers": [{"name": "r", "actions": ["note"]}],
           "route": {"receiver": "r"}}
    p = tmp / "remediate.yaml"
    p.write_text(json.dumps(doc))
    return p


def serve_config(tmp: Path, prefix: str) -> Path:
    p = tmp / "serve.yaml"
    p.write_text(json.dumps({"kafka": {"prefix": prefix, "group": f"{prefix}-svc", "partitions": 2},
                             "http": {"port": 0},
                             "service": {"flush_idle_s": 2, "rules": [str(ROOT / "rules")], "models": "none"}}))
    return p


def test_every_client_exchanges_records_over_sasl_ssl(broker, work, tmp_path, topic_prefix):
    p = topic_prefix
    outputs: list[str] = []

    def ok(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        done = gw(*args, cwd=tmp_path, timeout=timeout)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done

    assert "created" in ok("topics", "--kafka-config", str(work), "--prefix", p, "--partitions", "2").stdout
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        svc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--config", str(serve_config(tmp_path, p)),
                                "--kafka-config", str(work)], cwd=tmp_path, env=env(PASSWORD), stdout=fh, stderr=fh)
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            assert svc.poll() is None, log.read_text()
            port = next((x["http_port"] for x in _json_lines(log) if "http_port" in x), None)
            time.sleep(0.3)
        assert port, log.read_text()

        # Producers: the simulator (a GPU that falls off the bus) and a real dcgm-exporter scrape.
        ok("sim", "--kafka-config", str(work), "--prefix", p, "--scenario", "gpu_lost", "--hosts", "2",
           "--duration", "300", "--seed", "1")
        ok("produce", "dcgm-exporter", "--file", str(SHARED_DATA / "dcgm_exporter_h100_8gpu_sampled.prom"),
           "--count", "1", "--host", "sec-node-9", "--kafka-config", str(work), "--prefix", p)
        sim_records = sum(1 for _ in open(_sim_out(tmp_path)))
        want = sim_records + 8   # the scrape is 8 GPUs: one record each

        def counted() -> float:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            return sum(float(x.rsplit(" ", 1)[1]) for x in body.decode().splitlines()
                       if x.startswith("gpuwarden_records_total"))
        deadline = time.monotonic() + 60
        while counted() < want and time.monotonic() < deadline:
            time.sleep(0.5)
        assert counted() == want

        # The service's alerts, read back over the same secured connection.
        alerts = tmp_path / "alerts.jsonl"
        deadline = time.monotonic() + 30
        got: list[dict] = []
        while not any(a.get("fault") == "gpu_fallen_off_bus" for a in got) and time.monotonic() < deadline:
            ok("record", "--kafka-config", str(work), "--topic", f"{p}.alerts", "--out", str(alerts),
               "--idle-timeout", "1")
            got = [json.loads(x) for x in alerts.read_text().splitlines()]
        assert any(a.get("fault") == "gpu_fallen_off_bus" and a.get("state") == "firing" for a in got), got
    finally:
        stop(svc)
    outputs.append(log.read_text())

    # remediate consumes those alerts and audits them to <prefix>.audit, both through the connection.
    done = ok("remediate", "--config", str(remediation_config(tmp_path, p)), "--kafka-config", str(work),
              "--idle-exit", "2")
    handled = int(re.search(r"(\d+) alerts handled", done.stderr).group(1))
    assert handled == len(got)
    audit = tmp_path / "audit.out.jsonl"
    ok("record", "--kafka-config", str(work), "--topic", f"{p}.audit", "--out", str(audit), "--idle-timeout", "1")
    assert len(audit.read_text().splitlines()) >= handled > 0

    # replay --to-kafka publishes a recording; record copies it back: nothing lost.
    rec = tmp_path / "sim.jsonl"
    ok("sim", "--out", str(rec), "--hosts", "1", "--duration", "60")
    ok("replay", str(rec), "--to-kafka", broker.bootstrap, "--kafka-config", str(work), "--prefix", f"{p}-rp")
    back = tmp_path / "back.jsonl"
    ok("record", "--kafka-config", str(work), "--prefix", f"{p}-rp", "--out", str(back), "--idle-timeout", "1")
    assert sorted(back.read_text().splitlines()) == sorted(rec.read_text().splitlines())

    for out in outputs:
        assert PASSWORD not in out


def _json_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _sim_out(tmp: Path) -> Path:
    """The records `sim --kafka` sent: the same seed written to a file (the simulator is deterministic)."""
    out = tmp / "sim-copy.jsonl"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "pipeline", "sim", "--scenario", "gpu_lost", "--hosts", "2",
                        "--duration", "300", "--seed", "1", "--out", str(out)], cwd=tmp, check=True,
                       capture_output=True)
    return out


def test_a_wrong_password_is_one_line_and_exit_4_for_every_client(broker, work, tmp_path, topic_prefix):
    p = topic_prefix
    rec = tmp_path / "r.jsonl"
    rec.write_text("")
    commands = {
        "topics": ["topics", "--kafka-config", str(work), "--prefix", p],
        "sim": ["sim", "--kafka-config", str(work), "--prefix", p, "--duration", "10"],
        "produce": ["produce", "dcgm-exporter", "--file", str(SHARED_DATA / "dcgm_exporter_h100_8gpu_sampled.prom"),
                    "--count", "1", "--kafka-config", str(work), "--prefix", p],
        "serve": ["serve", "--config", str(serve_config(tmp_path, p)), "--kafka-config", str(work)],
        "record": ["record", "--kafka-config", str(work), "--prefix", p, "--out", str(tmp_path / "o.jsonl")],
        "replay": ["replay", str(rec), "--to-kafka", broker.bootstrap, "--kafka-config", str(work), "--prefix", p],
        "remediate": ["remediate", "--config", str(remediation_config(tmp_path, p)), "--kafka-config", str(work)],
    }
    t0 = time.monotonic()
    # All at once: each waits for its login to be refused (kafka-python retries until its timeout).
    procs = {name: subprocess.Popen([sys.executable, "-m", "pipeline", *argv], cwd=tmp_path, env=env(WRONG),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, argv in commands.items()}
    results = {name: (proc.wait(90), *proc.communicate()) for name, proc in procs.items()}
    assert time.monotonic() - t0 < 60
    for name, (rc, out, err) in results.items():
        assert rc == 4, f"{name}: {rc} {out}{err}"
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"{name}: {err}"
        assert f"refused the SASL SCRAM-SHA-512 login of user '{USER}'" in lines[0], name
        assert WRONG not in out + err and "Traceback" not in err


def test_an_untrusted_certificate_is_a_tls_error(broker, work, tmp_path, topic_prefix):
    other, _, _ = make_tls(tmp_path / "other-ca")
    conf = tmp_path / "other.yaml"
    conf.write_text(work.read_text().replace(str(broker.ca), str(other)))
    done = gw("topics", "--kafka-config", str(conf), "--prefix", topic_prefix, cwd=tmp_path)
    assert done.returncode == 4
    assert "TLS with the Kafka broker" in done.stderr and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
