"""The host inventory: the hosts remediation may act on (docs/remediation.md#host-inventory).

Alerts are only as trustworthy as the telemetry they came from, and any producer that may write
the telemetry topic can name any host. An inventory from a source the operator controls — a
file, Slurm's node list, Kubernetes' nodes — bounds what a forged or garbled alert can make
remediation touch: a host outside it is audited ``skipped: unknown_host`` and never acted on,
so invented names can neither be drained nor fill the circuit breaker's window.

Sources (``inventory.source``):

- ``file``: ``path`` holds one host per line (``#`` comments) or a YAML list; re-read every
  ``refresh``.
- ``list``: ``hosts`` written into the config.
- ``slurm``: ``sinfo -h -N -o %N`` (or ``argv``), every ``refresh``, bounded by ``timeout``.
- ``kubernetes``: ``kubectl get nodes -o name`` (or ``argv``, e.g. with ``--context``).
- ``any``: no inventory; every host an alert names is trusted. Explicit, and warned about.

A refresh that fails (the command errors or times out, the file is unreadable, or it lists no
hosts at all) keeps the last good list and is retried sooner; until a first list is loaded no
host is known.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from pipeline import yamlsafe
from pipeline.durations import duration as parse_duration
from pipeline.errors import ConfigError
from pipeline.remediation.actions import run_command
from pipeline.remediation.audit import printable
from pipeline.remediation.safety import valid_hostname

log = logging.getLogger("gpuwarden.remediation.inventory")

SOURCES = ("file", "list", "slurm", "kubernetes", "any")
DEFAULT_ARGV = {"slurm": ["sinfo", "-h", "-N", "-o", "%N"], "kubernetes": ["kubectl", "get", "nodes", "-o", "name"]}
RETRY_AFTER = 30.0  # seconds before a failed refresh is tried again (at most `refresh`)
LIST_LIMIT = 16 << 20  # characters of a listing command's output read (100k nodes fit)


def check_settings(s: Any, key: str = "inventory") -> None:
    """Validate an ``inventory`` section without touching anything; ConfigError naming the key."""
    if s.source is None:
        return
    if s.source not in SOURCES:
        raise ConfigError(f"{key}.source", f"{s.source!r}: one of {', '.join(SOURCES)}")
    if s.source == "file" and not s.path:
        raise ConfigError(f"{key}.path", "source file needs the path of the host list")
    # Written for another source they would be ignored: `source: slurm` with `hosts` trusts all of Slurm.
    if s.hosts and s.source != "list":
        raise ConfigError(f"{key}.hosts", f"for source list only (the source is {s.source or 'not set'})")
    if s.path and s.source != "file":
        raise ConfigError(f"{key}.path", f"for source file only (the source is {s.source or 'not set'})")
    if s.source == "list":
        if not s.hosts:
            raise ConfigError(f"{key}.hosts", "source list needs the hosts")
        bad = [h for h in s.hosts if not valid_hostname(h)]
        if bad:
            raise ConfigError(f"{key}.hosts", f"not RFC 1123 host names: {', '.join(map(repr, bad[:5]))}")
    if s.argv is not None and (s.source not in DEFAULT_ARGV or not s.argv):
        raise ConfigError(f"{key}.argv", "a non-empty command, for source slurm or kubernetes only")
    if s.argv and (not s.argv[0] or any("\0" in a for a in s.argv)):  # no exec can run it: no list ever
        raise ConfigError(f"{key}.argv", "a program name, and no NUL character in any argument")
    if parse_duration(s.refresh, f"{key}.refresh") < 1:
        raise ConfigError(f"{key}.refresh", "at least 1s")
    timeout = parse_duration(s.timeout, f"{key}.timeout")
    if timeout <= 0:
        raise ConfigError(f"{key}.timeout", "must be more than 0")
    if timeout > MAX_TIMEOUT_S:
        raise ConfigError(
            f"{key}.timeout", f"at most {MAX_TIMEOUT_S:.0f}s: the remediator's loop waits for the listing"
        )


# A listing runs in the remediator's tick, so while it runs no group is dispatched and no firing
# alert re-posted: a hung `sinfo` may hold them this long, not the 366 days a duration allows.
MAX_TIMEOUT_S = 300.0

LIMITS = yamlsafe.Limits(max_bytes=16 << 20, max_depth=8, max_aliases=0, max_nodes=1_000_000, max_string=1024)


def parse_hosts(text: str, source: str) -> tuple[set[str], list[str]]:
    """(valid host names, rejected entries) from a file's or a command's output."""
    entries: list[Any]
    if source == "file":
        try:
            # Bounded: an inventory is a file others write (often generated from a CMDB).
            doc = yamlsafe.compose(text, LIMITS)
        except yaml.YAMLError:  # YamlLimitError included
            doc = None
        # A list's entries as written: YAML 1.1 reads `- 010` as 8 and `- 1:30` as 90, names
        # nobody listed. A list or mapping in it is no host name.
        if isinstance(doc, yaml.SequenceNode):
            entries = [n.value if isinstance(n, yaml.ScalarNode) else None for n in doc.value]
        else:
            entries = _lines(text)
    else:
        entries = _lines(text)
    hosts, bad = set(), []
    for e in entries:
        h = str(e).strip() if isinstance(e, (str, int)) and not isinstance(e, bool) else None
        if h and source == "kubernetes" and h.startswith("node/"):
            h = h[len("node/") :]
        if h and valid_hostname(h):
            hosts.add(h)
        else:
            bad.append(printable(e))
    return hosts, bad


def _lines(text: str) -> list[str]:
    return [ln.split("#", 1)[0].strip() for ln in text.splitlines() if ln.split("#", 1)[0].strip()]


@dataclass
class Inventory:
    """What ``knows`` answers from; ``refresh_if_due`` (the remediator's tick) keeps it current."""

    source: str
    loader: Callable[[], str] | None  # returns the raw list; raises InventoryError
    refresh_s: float
    clock: Callable[[], float] = time.time
    hosts: frozenset[str] | None = None  # None until a first list loaded
    loaded_at: float | None = None
    error: str | None = None
    next_refresh: float = 0.0
    static: frozenset[str] = field(default_factory=frozenset)

    @property
    def trusts_all(self) -> bool:
        return self.source == "any"

    def knows(self, host: str | None) -> bool:
        if self.trusts_all:
            return True
        return host is not None and self.hosts is not None and host in self.hosts

    def why_unknown(self, host: str | None) -> str:
        if self.hosts is None:
            return (
                f"{printable(host)} cannot be checked: the {self.source} inventory is not loaded yet "
                f"({self.error or 'no list'}); nothing is acted on until it is"
            )
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at or 0))
        return f"{printable(host)} is not in the {self.source} host inventory ({len(self.hosts)} hosts, loaded {when})"

    def refresh(self) -> bool:
        """Load the list now; on failure keep the last good one. Returns whether it loaded."""
        now = self.clock()
        if self.loader is None:
            self.next_refresh = float("inf")
            return True
        try:
            hosts, bad = parse_hosts(self.loader(), self.source)
            if bad:
                log.warning(
                    "inventory (%s): %d entries are not host names and are ignored: %s",
                    self.source,
                    len(bad),
                    ", ".join(bad[:5]),
                )
            if not hosts:
                raise InventoryError("it lists no hosts")
        except Exception as e:  # noqa: BLE001 - whatever a refresh meets, the last good list stays
            self.error = str(e)
            self.next_refresh = now + min(self.refresh_s, RETRY_AFTER)
            kept = (
                f"keeping the last good list ({len(self.hosts)} hosts)"
                if self.hosts is not None
                else "no host is known until it loads"
            )
            log.error("inventory (%s) refresh failed: %s; %s", self.source, printable(e), kept)
            return False
        if self.hosts is not None and hosts != self.hosts:
            log.info(
                "inventory (%s): %d hosts (+%d, -%d)",
                self.source,
                len(hosts),
                len(hosts - self.hosts),
                len(self.hosts - hosts),
            )
        self.hosts, self.loaded_at, self.error = frozenset(hosts), now, None
        self.next_refresh = now + self.refresh_s
        return True

    def refresh_if_due(self) -> None:
        if self.clock() >= self.next_refresh:
            self.refresh()

    def describe(self) -> str:
        if self.trusts_all:
            return "inventory: any (every host an alert names is trusted)"
        n = "not loaded" if self.hosts is None else f"{len(self.hosts)} hosts"
        return f"inventory: {self.source}, {n}"


class InventoryError(Exception):
    """A source could not give a list (the message says why)."""


def build_inventory(
    s: Any, *, clock: Callable[[], float] = time.time, runner: Callable | None = None, key: str = "inventory"
) -> Inventory | None:
    """The inventory an ``inventory`` section describes, loaded once; None when there is none."""
    check_settings(s, key)
    if s.source is None:
        return None
    refresh = parse_duration(s.refresh, f"{key}.refresh")
    if s.source == "any":
        return Inventory("any", None, refresh, clock)
    if s.source == "list":
        inv = Inventory("list", None, refresh, clock, hosts=frozenset(s.hosts), loaded_at=clock())
        inv.next_refresh = float("inf")
        return inv
    if s.source == "file":
        path = Path(s.path)

        def load() -> str:
            try:
                with path.open("rb") as fh:
                    raw = fh.read(LIST_LIMIT + 1)
            except OSError as e:
                raise InventoryError(f"cannot read {path}: {e.strerror or e}") from None
            if len(raw) > LIST_LIMIT:  # cut off, its last line could name a host nobody wrote
                raise InventoryError(f"{path} is over the limit of {LIST_LIMIT} bytes")
            return raw.decode("utf-8-sig", errors="replace")  # a BOM is no part of the first host

        if not path.is_file():
            # A typo in the path is the operator's error, not a transient one: say so at start.
            raise ConfigError(f"{key}.path", f"{path} is not a readable file")
        inv = Inventory("file", load, refresh, clock)
    else:
        argv = list(s.argv or DEFAULT_ARGV[s.source])
        timeout = parse_duration(s.timeout, f"{key}.timeout")
        if runner is None:
            runner = run_command

        def load() -> str:
            res = runner(argv, timeout, limit=LIST_LIMIT)
            if res.error:
                raise InventoryError(f"{argv!r}: {res.error}")
            if res.returncode != 0:
                raise InventoryError(f"{argv!r}: exit {res.returncode}: {res.stderr.strip()[:300]}")
            if len(res.stdout) >= LIST_LIMIT:  # cut off at the limit: its last line may be half a name
                raise InventoryError(f"{argv!r}: its output reached the limit of {LIST_LIMIT} characters")
            return res.stdout

        inv = Inventory(s.source, load, refresh, clock)
    inv.refresh()
    return inv
