"""Webhook URLs alert values cannot redirect: values only in the path and query, percent-encoded;
a templated host needs allow_hosts, is resolved, checked and pinned, never loopback/link-local;
headers_env secrets only go to the host written in the URL. Against a real server on 127.0.0.1."""

from __future__ import annotations

import httpx
import pytest

from pipeline.errors import ConfigError
from pipeline.remediation.actions import Context, WebhookAction
from pipeline.remediation.targets import AllowList
from tests.unit.remediation.factories import ScriptedServer as Server
from tests.unit.remediation.factories import alert, config


@pytest.fixture
def server():
    made: list[Server] = []

    def make(script):
        made.append(Server(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


def hook(url: str, **kw) -> dict:
    return {"page": {"type": "webhook", "url": url, "retries": 0, **kw}}


PAGE = [{"name": "drain", "actions": ["page"]}]


def test_a_templated_host_with_headers_env_is_a_config_error(tmp_path):
    # The reported leak: host 127.0.0.1 made remediate POST the pager token to a local port.
    with pytest.raises(ConfigError) as e:
        config(tmp_path, actions=hook("http://{host}:9000/hook", headers_env={"Authorization": "TOKEN"}),
               receivers=PAGE)
    assert e.value.key == "actions.page" and "headers_env" in str(e.value)


def test_a_templated_host_without_allow_hosts_refuses_to_start(tmp_path, harness):
    cfg = config(tmp_path, actions=hook("http://{host}:9000/hook"), receivers=PAGE)
    with pytest.raises(ConfigError) as e:
        harness(cfg)
    assert e.value.key == "actions.page.allow_hosts"


@pytest.mark.parametrize("url", ["{labels.scheme}://example.internal/x", "http://example.internal:{gpu}/x",
                                 "http://{job}@example.internal/x", "http://u:p@{host}/x", "ftp://example.internal/x",
                                 "/relative/{host}"])
def test_scheme_port_and_userinfo_never_come_from_the_alert(tmp_path, url):
    with pytest.raises(ConfigError) as e:
        config(tmp_path, actions=hook(url, allow_hosts=["*"]), receivers=PAGE)
    assert e.value.key == "actions.page"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "169.254.169.254", "0.0.0.0"])
def test_loopback_and_link_local_hosts_are_refused_before_anything_is_sent(tmp_path, server, harness, host):
    s = server([200])
    port = s.url.rsplit(":", 1)[1]
    cfg = config(tmp_path, actions=hook(f"http://{{host}}:{port}/hook", allow_hosts=["*", "0.0.0.0/0"]),
                 receivers=PAGE)
    out = harness(cfg).handle(alert(host))
    assert out[0].decision == "skipped" and out[0].reason.startswith("unsafe_value:")
    assert s.hits == []


@pytest.mark.parametrize("host", ["localhost", "2130706433"])   # names (a decimal IP) that resolve to loopback
def test_names_that_resolve_to_loopback_are_refused(tmp_path, server, harness, host):
    s = server([200])
    port = s.url.rsplit(":", 1)[1]
    cfg = config(tmp_path, actions=hook(f"http://{{host}}:{port}/hook", allow_hosts=["*"]), receivers=PAGE)
    out = harness(cfg).handle(alert(host))
    assert out[0].decision == "failed" and "loopback" in out[0].error
    assert s.hits == []


def test_a_literal_loopback_url_stays_allowed_and_gets_its_secret(tmp_path, server, harness, monkeypatch):
    monkeypatch.setenv("PAGER_TOKEN", "s3cret")
    s = server([200])
    cfg = config(tmp_path, actions=hook(s.url + "/hook/{host}", headers_env={"Authorization": "PAGER_TOKEN"}),
                 receivers=PAGE)
    assert harness(cfg).handle(alert("gpu-node-1"))[0].decision == "acted"
    assert s.hits[0]["path"] == "/hook/gpu-node-1" and s.hits[0]["headers"]["Authorization"] == "s3cret"


def test_values_in_path_and_query_are_percent_encoded(tmp_path, server, harness):
    s = server([200])
    cfg = config(tmp_path, actions=hook(s.url + "/p/{labels.team}?job={job}"), receivers=PAGE)
    harness(cfg).handle(alert("n1", job="a@b+c:1", labels={"team": "ml/../admin"}))
    assert s.hits[0]["path"] == "/p/ml%2F..%2Fadmin?job=a%40b%2Bc%3A1"


class Recorder:
    """An httpx transport that records requests instead of sending them (no non-loopback server here)."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200)


def _pinned(url: str, allow: list[str], addrs: list[str], host: str = "gpu-node-1", inventory=None):
    act = WebhookAction("ckpt", url, retries=0, disruptive=True)
    act.bind(AllowList.parse(allow, "allow_hosts"), inventory)
    rec = Recorder()
    act._client = httpx.Client(transport=httpx.MockTransport(rec))
    asked = []

    def resolver(h, port):
        asked.append((h, port))
        return addrs

    out = act.execute(act.plan(alert(host)), Context(resolve=resolver))
    return out, rec.requests, asked


def test_an_allowed_templated_host_is_resolved_once_and_the_checked_address_is_used():
    out, reqs, asked = _pinned("https://{host}:8471/checkpoint", ["gpu-node-*"], ["10.1.2.3"])
    assert out.ok and asked == [("gpu-node-1", 8471)]
    r = reqs[0]
    assert str(r.url) == "https://10.1.2.3:8471/checkpoint"
    assert r.headers["Host"] == "gpu-node-1:8471" and r.extensions["sni_hostname"] == "gpu-node-1"
    assert "Authorization" not in r.headers


def test_allow_hosts_networks_need_every_address_inside():
    out, reqs, _ = _pinned("http://{host}:8471/c", ["10.1.0.0/16"], ["10.1.2.3"])
    assert out.ok and str(reqs[0].url) == "http://10.1.2.3:8471/c"
    out, reqs, _ = _pinned("http://{host}:8471/c", ["10.1.0.0/16"], ["10.1.2.3", "192.168.1.1"])
    assert not out.ok and "outside allow_hosts" in out.error and reqs == []
    out, reqs, _ = _pinned("http://{host}:8471/c", ["gpu-node-*"], ["10.1.2.3", "127.0.0.1"])
    assert not out.ok and "loopback" in out.error and reqs == []


def test_a_host_not_in_allow_hosts_is_refused(tmp_path, harness):
    cfg = config(tmp_path, actions=hook("http://{host}:8471/c", allow_hosts=["gpu-node-*"]), receivers=PAGE)
    out = harness(cfg).handle(alert("db-1"))
    assert out[0].decision == "skipped" and "not in allow_hosts" in out[0].reason


def test_allow_hosts_inventory_means_the_host_inventory(tmp_path, harness):
    cfg = config(tmp_path, actions={"ckpt": {"type": "checkpoint", "mode": "http", "url": "http://{host}:8471/c",
                                             "allow_hosts": ["inventory"]}},
                 receivers=[{"name": "drain", "actions": ["ckpt"]}],
                 inventory={"source": "list", "hosts": ["gpu-node-1"]})
    h = harness(cfg)
    act = h.rem.actions["ckpt"]
    rec = Recorder()
    act._client = httpx.Client(transport=httpx.MockTransport(rec))
    h.rem.ctx.resolve = lambda host, port: ["10.9.9.9"]
    assert h.handle(alert("gpu-node-1", job="7"))[0].decision == "acted"
    assert str(rec.requests[0].url) == "http://10.9.9.9:8471/c"
    # not in the inventory: refused before anything is resolved or sent
    out = h.handle(alert("gpu-node-2", job="8"))
    assert out[0].decision == "skipped" and "'gpu-node-2' is not in allow_hosts" in out[0].reason
    assert len(rec.requests) == 1


def test_bad_allow_hosts_entry_names_the_key(tmp_path, harness):
    cfg = config(tmp_path, actions=hook("http://{host}:8471/c", allow_hosts=["gpu-*", "bad/entry!"]), receivers=PAGE)
    with pytest.raises(ConfigError) as e:
        harness(cfg)
    assert e.value.key == "actions.page.allow_hosts[1]"


def test_ipv4_inside_ipv6_is_judged_as_the_ipv4_it_carries():
    # Found in review: NAT64 and 6to4 forms of loopback and the metadata address passed.
    import ipaddress

    from pipeline.remediation.targets import refused

    for a in ("::ffff:127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::"):
        assert refused(ipaddress.ip_address(a)) is not None, a
    for a in ("2001:db8::1", "64:ff9b::a00:1", "10.0.0.1"):
        assert refused(ipaddress.ip_address(a)) is None, a
