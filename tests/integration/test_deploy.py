"""deploy/: the Kubernetes manifests render offline and pass the Kubernetes schemas and the
project's structure rules; the systemd units pass `systemd-analyze verify` and their ExecStart
lines run for real against the test broker; the compose file's commands are real commands.

kubectl (Debian: kubernetes-client) and systemd-analyze are system tools (`make systools`).
"""

from __future__ import annotations

import configparser
import http.server
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.factories import SHARED_DATA
from tests.systools import free_port, http_get, require_tool, stop, wait_http

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
UNITS = sorted(SYSTEMD.glob("*.service"))
# The entry point `pip install` made beside this interpreter: what /opt/gpuwarden/bin/gpuwarden is.
GPUWARDEN = str(Path(sys.executable).parent / "gpuwarden")
# The oldest Kubernetes the manifests are for (internalTrafficPolicy is GA in 1.26) and the newest.
K8S_VERSIONS = ("1.26", "1.33")


# -- Kubernetes ------------------------------------------------------------------------------

def render(overlay: str) -> list[dict]:
    kubectl = require_tool("kubectl", package="kubernetes-client")
    done = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]):
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            yield d, d["spec"]["template"]["spec"]


def test_overlays_exist():
    assert {"dev", "production"} <= set(OVERLAYS)


def test_manifests_pass_the_kubernetes_schemas(rendered):
    import kubernetes_validate

    overlay, docs = rendered
    assert docs
    for version in K8S_VERSIONS:
        for d in docs:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{overlay}: {d['kind']}/{d['metadata']['name']} fails Kubernetes {version}: {e.message}")


def test_the_schema_check_catches_a_broken_manifest():
    import kubernetes_validate

    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {}, "template": {"spec": {"containers": [{"name": "a"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_every_component_is_there(rendered):
    overlay, docs = rendered
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for want in [("Namespace", "gpuwarden"), ("Deployment", "gpuwarden-serve"), ("Service", "gpuwarden-serve"),
                 ("PodDisruptionBudget", "gpuwarden-serve"), ("DaemonSet", "gpuwarden-producers"),
                 ("Deployment", "gpuwarden-remediate"), ("ServiceAccount", "gpuwarden-remediate"),
                 ("ClusterRole", "gpuwarden-remediate"), ("ClusterRoleBinding", "gpuwarden-remediate"),
                 ("PersistentVolumeClaim", "gpuwarden-remediate-state")]:
        assert want in kinds, f"{overlay}: no {want[0]}/{want[1]}"
    cms = {n.rsplit("-", 1)[0] for n in by_kind(docs, "ConfigMap")}
    assert {"gpuwarden-kafka", "gpuwarden-serve", "gpuwarden-remediation"} <= cms


def test_selectors_references_and_variables_hold_together(rendered):
    overlay, docs = rendered
    configmaps = by_kind(docs, "ConfigMap")
    pods = []
    for d, spec in pod_specs(docs):
        name = d["metadata"]["name"]
        tmpl_labels = d["spec"]["template"]["metadata"]["labels"]
        sel = d["spec"]["selector"]["matchLabels"]
        assert sel.items() <= tmpl_labels.items(), f"{name}: selector does not select its own pods"
        pods.append((d["metadata"]["namespace"], tmpl_labels))
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, f"{name}: volume {v['name']} names a missing ConfigMap"
        for c in spec["containers"]:
            assert c["image"].split(":")[0].endswith("gpuwarden") and ":" in c["image"], c["image"]
            assert "limits" in c.get("resources", {}), f"{name}/{c['name']}: no resource limits"
            defined = {e["name"] for e in c.get("env", [])}
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    cm = src["configMapRef"]["name"]
                    assert cm in configmaps, f"{name}/{c['name']}: envFrom names a missing ConfigMap {cm}"
                    defined |= set(configmaps[cm].get("data", {}))
                else:
                    assert src["secretRef"].get("optional") is True, "a Secret the user may not have made"
            for arg in c.get("args", []):
                for var in re.findall(r"\$\((\w+)\)", arg):
                    assert var in defined, f"{name}/{c['name']}: $({var}) is not in the container's environment"
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{name}/{c['name']}: mounts an undefined volume {m['name']}"
    for svc in by_kind(docs, "Service").values():
        if svc["metadata"]["name"] == "gpuwarden-dcgm-exporter-local":
            continue  # selects dcgm-exporter's pods, not ours
        sel = svc["spec"]["selector"]
        assert any(ns == svc["metadata"]["namespace"] and sel.items() <= labels.items() for ns, labels in pods), \
            f"Service {svc['metadata']['name']} selects no pod"
    pdb = by_kind(docs, "PodDisruptionBudget")["gpuwarden-serve"]
    serve = by_kind(docs, "Deployment")["gpuwarden-serve"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= serve["spec"]["template"]["metadata"]["labels"].items()
    if "minAvailable" in pdb["spec"]:
        assert pdb["spec"]["minAvailable"] < serve["spec"]["replicas"], "the PDB would block every drain"


def test_producers_take_the_node_name_and_stay_on_faulty_nodes(rendered):
    overlay, docs = rendered
    ds = by_kind(docs, "DaemonSet")["gpuwarden-producers"]
    spec = ds["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in spec["tolerations"], "a tainted (faulty) node must keep its producers"
    for c in spec["containers"]:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        args = c["args"]
        assert args[args.index("--host") + 1] == "$(NODE_NAME)", c["name"]
    assert all(not c.get("securityContext", {}).get("privileged") for c in spec["containers"])


def test_remediation_rbac_is_what_cordon_taint_and_drain_need(rendered):
    overlay, docs = rendered
    role = by_kind(docs, "ClusterRole")["gpuwarden-remediate"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "patch"), ("", "pods", "get"),
                       ("", "pods", "list"),
                       ("", "pods/eviction", "create"), ("apps", "daemonsets", "get")}
    binding = by_kind(docs, "ClusterRoleBinding")["gpuwarden-remediate"]
    assert binding["roleRef"]["name"] == "gpuwarden-remediate"
    (subject,) = binding["subjects"]
    dep = by_kind(docs, "Deployment")["gpuwarden-remediate"]
    assert subject == {"kind": "ServiceAccount", "name": dep["spec"]["template"]["spec"]["serviceAccountName"],
                       "namespace": dep["metadata"]["namespace"]}
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate", \
        "one remediation instance at a time: the breaker and cooldowns are fleet-wide"
    for d, spec in pod_specs(docs):
        if d is not dep:
            assert spec.get("automountServiceAccountToken") is False, f"{d['metadata']['name']} needs no API access"


def test_the_configs_inside_the_manifests_load(rendered):
    from pipeline.remediation.config import parse_config
    from pipeline.service.config import load_config_text

    overlay, docs = rendered
    cms = {n.rsplit("-", 1)[0]: d for n, d in by_kind(docs, "ConfigMap").items()}
    serve = load_config_text(cms["gpuwarden-serve"]["data"]["serve.yaml"], env={})
    assert serve.http.host == "0.0.0.0"
    port = by_kind(docs, "Deployment")["gpuwarden-serve"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert port["containerPort"] == serve.http.port
    rem = parse_config(yaml.safe_load(cms["gpuwarden-remediation"]["data"]["remediation.yaml"]))
    assert rem.guardrails.dry_run is True, "a fresh install only audits what it would do"
    assert str(rem.state_file).startswith("/var/lib/gpuwarden/")
    mounts = by_kind(docs, "Deployment")["gpuwarden-remediate"]["spec"]["template"]["spec"]["containers"][0]
    assert any(m["mountPath"] == "/var/lib/gpuwarden" for m in mounts["volumeMounts"])


def _parse_cli(argv: list[str]) -> None:
    from pipeline.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"not a gpuwarden command line: {argv} (exit {e.code})")


def test_every_container_runs_a_real_gpuwarden_command(rendered):
    overlay, docs = rendered
    checked = set()
    for d, spec in pod_specs(docs):
        for c in spec["containers"]:
            # $(VAR) as Kubernetes expands it: the container's env value, else a stand-in (a Secret's).
            env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
            _parse_cli([re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), "x"), a) for a in c["args"]])
            checked.add(d["metadata"]["name"])
    # Every workload was looked at: a render that lost them would otherwise check nothing.
    assert checked >= {"gpuwarden-serve", "gpuwarden-remediate", "gpuwarden-producers"}, checked


# -- compose ---------------------------------------------------------------------------------

def test_compose_services_run_real_commands_with_real_configs():
    from pipeline.remediation.config import load_config
    from pipeline.service.config import load_config as load_serve

    path = DEPLOY / "compose" / "compose.yaml"
    doc = yaml.safe_load(path.read_text())
    services = doc["services"]
    assert {"kafka", "serve", "remediate"} <= set(services)
    kafka_image = services["kafka"]["image"]
    pom = (ROOT / "scripts" / "kafka-pom.xml").read_text()
    assert kafka_image == "apache/kafka:" + re.search(r"<kafka\.version>([^<]+)<", pom).group(1), \
        "the compose broker is the Kafka version the tests run against"
    for name, svc in services.items():
        if name == "kafka":
            continue
        _parse_cli(svc["command"])
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (path.parent / src).resolve().is_file(), f"{name}: {src} is missing"
                target = vol.split(":")[1]
                if target.endswith("remediation.yaml"):
                    assert load_config(path.parent / src).guardrails.dry_run
                if target.endswith("serve.yaml"):
                    load_serve(path.parent / src, env={})
    build = services["serve"]["build"]
    assert (path.parent / build["context"] / build["dockerfile"]).resolve().is_file()


# -- systemd ---------------------------------------------------------------------------------

def _units_for_this_machine(dst: Path, gpuwarden: str) -> list[Path]:
    # verify checks that ExecStart's program exists: point the install prefix at this checkout's.
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for u in UNITS:
        p = dst / u.name
        p.write_text(u.read_text().replace("/opt/gpuwarden/bin/gpuwarden", gpuwarden))
        out.append(p)
    return out


def _verify(tool: str, units: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([tool, "verify", *map(str, units)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""})


def test_systemd_units_verify(tmp_path):
    tool = require_tool("systemd-analyze", package="systemd")
    assert {u.name for u in UNITS} >= {"gpuwarden-serve.service", "gpuwarden-remediate.service",
                                       "gpuwarden-produce-dcgm-exporter.service"}
    units = _units_for_this_machine(tmp_path / "units", GPUWARDEN)
    done = _verify(tool, units)
    mentions = [line for line in (done.stdout + done.stderr).splitlines() if "gpuwarden" in line]
    assert done.returncode == 0 and not mentions, done.stdout + done.stderr
    # ... and the verifier does catch a mistake in such a unit (the check above can fail).
    broken = tmp_path / "broken" / "gpuwarden-serve.service"
    broken.parent.mkdir()
    broken.write_text(units[0].read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    done = _verify(tool, [broken])
    assert "Unknown key" in done.stdout + done.stderr


def exec_start(unit: Path) -> list[str]:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read_string(unit.read_text())
    return shlex.split(cp["Service"]["ExecStart"])


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """What systemd does to an ExecStart line: %H, then ${VAR} and $VAR from the environment."""
    host = socket.gethostname()
    out = []
    for a in argv:
        a = a.replace("%H", host)
        a = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env[m.group(1) or m.group(2)], a)
        out.append(a)
    return out


class _Exporter(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.kafka
def test_systemd_execstart_lines_run_against_the_broker(kafka_bootstrap, topic_prefix, tmp_path):
    from pipeline.bus import Topics
    from pipeline.bus.kafka import KafkaBusProducer, ensure_topics
    from tests.factories import T0

    gpuwarden = GPUWARDEN
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    state.mkdir()
    http_port = free_port()

    def localise(text: str) -> str:
        return (text.replace("/opt/gpuwarden/bin/gpuwarden", gpuwarden).replace("/etc/gpuwarden", str(etc))
                .replace("/var/lib/gpuwarden", str(state)).replace("/opt/gpuwarden/rules", str(ROOT / "rules"))
                .replace("port: 9108", f"port: {http_port}").replace("host: 0.0.0.0", "host: 127.0.0.1"))

    for f in (SYSTEMD / "etc").iterdir():
        (etc / f.name).write_text(localise(f.read_text()))
    (etc / "remediation.yaml").write_text((etc / "remediation.yaml").read_text().replace(
        "group: gpuwarden-remediate", f"group: {topic_prefix}-remediate").replace(
        "prefix: gpuwarden", f"prefix: {topic_prefix}"))
    (etc / "serve.yaml").write_text((etc / "serve.yaml").read_text().replace(
        "group: gpuwarden-service", f"group: {topic_prefix}-svc").replace("prefix: gpuwarden", f"prefix: {topic_prefix}")
        .replace("models: auto", "models: none"))

    exporter_body = (SHARED_DATA / "dcgm_exporter_h100_8gpu_sampled.prom").read_bytes()
    handler = type("Exporter", (_Exporter,), {"body": exporter_body})
    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()

    env = dict(line.split("=", 1) for line in (etc / "gpuwarden.env").read_text().splitlines()
               if line.strip() and not line.startswith("#"))
    env.update(GPUWARDEN_KAFKA_BOOTSTRAP=kafka_bootstrap, GPUWARDEN_PREFIX=topic_prefix, GPUWARDEN_INTERVAL="1",
               DCGM_EXPORTER_URL=f"http://127.0.0.1:{exporter.server_address[1]}/metrics")
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=2)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for name in ("serve", "remediate", "produce-dcgm-exporter"):
            argv = expand(shlex.split(localise(shlex.join(exec_start(SYSTEMD / f"gpuwarden-{name}.service")))), env)
            logs[name] = tmp_path / f"{name}.log"
            procs[name] = subprocess.Popen(argv, stdout=logs[name].open("wb"), stderr=subprocess.STDOUT,
                                           env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path)
        metrics = f"http://127.0.0.1:{http_port}/metrics"
        wait_http(f"http://127.0.0.1:{http_port}/healthz", 60, procs["serve"], logs["serve"])

        def records() -> float:
            text = http_get(metrics)[1].decode()
            return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("gpuwarden_records_total"))

        deadline = time.monotonic() + 60
        while records() < 8 and time.monotonic() < deadline:
            assert procs["produce-dcgm-exporter"].poll() is None, logs["produce-dcgm-exporter"].read_text()
            time.sleep(0.5)
        assert records() >= 8, "the producer's scrapes (8 GPUs each) reached the service: " + \
            logs["produce-dcgm-exporter"].read_text()[-2000:]

        alert = {"kind": "alert", "v": 1, "id": "deploy-test-1", "state": "firing", "fault": "gpu_fallen_off_bus",
                 "severity": "critical", "rule": "gpu_fallen_off_bus", "host": socket.gethostname(), "gpu": 3,
                 "ts": T0, "started_at": T0, "summary": "XID 79"}
        p = KafkaBusProducer(kafka_bootstrap)
        p.send(Topics(topic_prefix).alerts, json.dumps(alert).encode(), b"n1")
        p.flush()
        p.close()
        audit = state / "audit.jsonl"
        deadline = time.monotonic() + 60
        while not (audit.is_file() and "deploy-test-1" in audit.read_text()) and time.monotonic() < deadline:
            assert procs["remediate"].poll() is None, logs["remediate"].read_text()
            time.sleep(0.5)
        decisions = [json.loads(x) for x in audit.read_text().splitlines()]
        drains = [d for d in decisions if d.get("alert_id") == "deploy-test-1" and d.get("action") == "drain"]
        assert drains and drains[0]["decision"] == "dry_run", decisions
        assert drains[0]["argv"][:3] == ["scontrol", "update", f"nodename={socket.gethostname()}"]
    finally:
        exit_codes = {n: stop(p, 90) for n, p in procs.items()}
        exporter.shutdown()
    assert exit_codes["serve"] == 0 and exit_codes["remediate"] == 0, {n: logs[n].read_text()[-2000:] for n in logs}
