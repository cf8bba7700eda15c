"""Where a webhook may send an alert: URL templates that alert values cannot redirect
(docs/remediation.md#webhook-urls-and-ssrf).

A webhook URL is written by the operator; alert values come from telemetry anyone on the
telemetry topic can write. So alert values only ever fill the path, query and fragment, each one
percent-encoded (a value cannot add a path segment, a query parameter or an ``@``). The scheme,
the user/password and the port are never templated. The host may be templated (the trainer's
side-car on the alert's node: ``http://{host}:8471/checkpoint``) only with an ``allow_hosts``
list, and then:

- the filled host must be a host name allowed by that list (a glob such as ``gpu-*.cluster``,
  or ``inventory``: the host inventory) or resolve only into one of its networks (``10.8.0.0/16``);
- it is resolved once, every address is checked, and the request goes to the checked address
  (the name stays in ``Host`` and TLS SNI), so DNS cannot answer differently the second time;
- loopback, link-local and unspecified addresses are never a target: a host ``127.0.0.1`` (or a
  name resolving there) must not reach a local admin port;
- ``headers_env`` secrets are never sent to a templated host: they go to the host written in
  the URL or nowhere.

A URL the operator wrote literally (``http://127.0.0.1:9000/hook``, a local side-car) is sent
as written.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import quote

from pipeline.errors import ConfigError
from pipeline.remediation.safety import (
    TEMPLATE_VAR,
    TEXT_ONLY,
    MissingValue,
    UnsafeValue,
    check_value,
    fill,
    valid_hostname,
)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never the target of a templated URL: this machine and its link (cloud metadata at 169.254.169.254).
# fd00:ec2::254: the cloud metadata service's IPv6 address (AWS), outside link-local unlike its IPv4 one.
_METADATA6 = ipaddress.ip_address("fd00:ec2::254")
REFUSED = tuple(
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128", f"{_METADATA6}/128")
)

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", re.DOTALL)
_GLOB = re.compile(r"[A-Za-z0-9*?.-]+")


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def refused(addr: IpAddress) -> str | None:
    """Why ``addr`` may not be a templated URL's target (None: it may). IPv4 addresses inside
    IPv6 ones (mapped, 6to4, NAT64) are judged as the IPv4 address they carry."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.sixtofour is not None:
            addr = addr.sixtofour
        elif addr in _NAT64:
            addr = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    for net in REFUSED:
        if addr.version == net.version and addr in net:
            kind = (
                "loopback"
                if addr.is_loopback
                else "link-local"
                if addr.is_link_local
                else "cloud metadata"
                if addr == _METADATA6
                else "unspecified"
            )
            return f"{addr} is a {kind} address"
    return None


@dataclass(frozen=True)
class AllowList:
    """``allow_hosts``: host-name globs, ``inventory``, networks (CIDR) a templated host may reach."""

    globs: tuple[str, ...] = ()
    networks: tuple[IpNetwork, ...] = ()
    inventory: bool = False

    @classmethod
    def parse(cls, entries: list[str] | None, key: str) -> "AllowList":
        globs, nets, inv = [], [], False
        for i, e in enumerate(entries or []):
            e = str(e).strip()
            if e == "inventory":
                inv = True
                continue
            try:
                nets.append(ipaddress.ip_network(e, strict=False))
                continue
            except ValueError:
                pass
            if not _GLOB.fullmatch(e) or "/" in e:
                raise ConfigError(f"{key}[{i}]", f"{e!r} is not a host-name glob, a network (10.0.0.0/8) or inventory")
            globs.append(e.lower())
        return cls(tuple(globs), tuple(nets), inv)

    def __bool__(self) -> bool:
        return bool(self.globs or self.networks or self.inventory)

    def admits_name(self, host: str, inventory: Any) -> bool:
        if self.inventory and inventory is not None and not inventory.trusts_all and inventory.knows(host):
            return True
        return any(fnmatch.fnmatchcase(host.lower(), g) for g in self.globs)

    def in_networks(self, addr: IpAddress) -> bool:
        return any(addr.version == n.version and addr in n for n in self.networks)


@dataclass(frozen=True)
class Filled:
    """A filled URL: ``url`` as audited; ``host``/``port`` when the host came from the alert."""

    url: str
    host: str | None = None  # templated host, to resolve and check before sending
    port: int | None = None
    by_name: bool = False  # allowed by name (glob/inventory); else every address must be in a network
    rest: str = ""  # the filled path, query and fragment


@dataclass(frozen=True)
class UrlTemplate:
    """A webhook URL split where alert values may and may not go."""

    scheme: str
    userinfo: str | None
    host: str
    port: str
    rest: str  # path, query and fragment

    @classmethod
    def parse(cls, url: str) -> "UrlTemplate":
        """ValueError (the action's config error) for a URL alert values could redirect."""
        m = _URL.fullmatch(url)
        if not m:
            raise ValueError(f"url {url!r} must be absolute: http(s)://host[:port]/path")
        scheme, netloc, rest = m.groups()
        if TEMPLATE_VAR.search(scheme) or scheme.lower() not in ("http", "https"):
            raise ValueError(f"url {url!r}: the scheme must be http or https, written out")
        userinfo, at, hostport = netloc.rpartition("@")
        if TEMPLATE_VAR.search(userinfo):
            raise ValueError(f"url {url!r}: the user/password part cannot come from the alert")
        if hostport.startswith("["):
            inner, _, tail = hostport[1:].partition("]")
            host, port = f"[{inner}]", tail[1:] if tail.startswith(":") else tail
        else:
            host, _, port = hostport.partition(":")
        if TEMPLATE_VAR.search(port):
            raise ValueError(f"url {url!r}: the port cannot come from the alert")
        if port and not port.isdigit():
            raise ValueError(f"url {url!r}: port {port!r} is not a number")
        if not host:
            raise ValueError(f"url {url!r} has no host")
        if TEMPLATE_VAR.search(host) and host.startswith("["):
            raise ValueError(f"url {url!r}: an IPv6 literal cannot come from the alert")
        if TEMPLATE_VAR.search(host) and at:
            raise ValueError(f"url {url!r}: a user/password is only sent to a host written in the url")
        return cls(scheme.lower(), userinfo if at else None, host, port, rest)

    @property
    def templated_host(self) -> bool:
        return bool(TEMPLATE_VAR.search(self.host))

    def fill(self, values: Mapping[str, Any], allow: AllowList, inventory: Any = None) -> Filled:
        """The URL for these alert values, or UnsafeValue/MissingValue (nothing is resolved here)."""
        rest = TEMPLATE_VAR.sub(lambda m: _encoded(m.group(1), values), self.rest)
        host, by_name = self.host, True
        if self.templated_host:
            if not allow:
                raise UnsafeValue("the url's host comes from the alert and allow_hosts is empty")
            host = fill(self.host, values)
            if not valid_hostname(host):
                raise UnsafeValue(f"url host {host!r} is not an RFC 1123 hostname")
            by_name = allow.admits_name(host, inventory)
            literal = _ip(host)
            if literal is not None:
                why = refused(literal)
                if why:
                    raise UnsafeValue(f"url host from the alert: {why}")
            if not by_name and not allow.networks:
                raise UnsafeValue(f"url host {host!r} is not in allow_hosts")
            if not by_name and literal is not None and not allow.in_networks(literal):
                raise UnsafeValue(f"url host {host!r} is not in allow_hosts' networks")
        netloc = (
            (f"{self.userinfo}@" if self.userinfo is not None else "") + host + (f":{self.port}" if self.port else "")
        )
        url = f"{self.scheme}://{netloc}{rest}"
        if not self.templated_host:
            return Filled(url)
        return Filled(
            url, host, int(self.port) if self.port else (443 if self.scheme == "https" else 80), by_name, rest
        )


def _encoded(name: str, values: Mapping[str, Any]) -> str:
    val = values.get(name)
    if val is None:
        raise MissingValue(name)
    if name in TEXT_ONLY:
        raise UnsafeValue(f"{name} is free text and cannot be placed in a command line or URL")
    return quote(check_value(name, val), safe="")


def _ip(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (TCP), in the resolver's order."""
    seen: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        a = str(sockaddr[0]).split("%", 1)[0]
        if a not in seen:
            seen.append(a)
    return seen


def pin(filled: Filled, allow: AllowList, resolver: Callable[[str, int], list[str]]) -> tuple[str, str]:
    """(the checked address to connect to, or why not) for a templated host: ``("10.0.0.5", "")``
    or ``("", "why")``. Resolved once; every address must pass, so no answer is left to chance."""
    assert filled.host is not None and filled.port is not None
    try:
        addrs = [ipaddress.ip_address(a) for a in resolver(filled.host, filled.port)]
    except (OSError, UnicodeError, ValueError) as e:
        return "", f"cannot resolve {filled.host}: {e}"
    if not addrs:
        return "", f"{filled.host} resolves to no address"
    for a in addrs:
        why = refused(a)
        if why:
            return "", f"{filled.host} resolves to {a}: {why}; not a webhook target"
        if not filled.by_name and not allow.in_networks(a):
            return "", f"{filled.host} resolves to {a}, outside allow_hosts' networks"
    return str(addrs[0]), ""
