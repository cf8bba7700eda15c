"""System tools the integration tests run (Debian packages that `make systools` installs).

A missing tool skips its test on a developer machine and fails it under CI=true, so CI cannot
pass without running it (the same contract as Chromium for the report test).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest


def require_tool(*names: str, package: str) -> str:
    """The path of the first of ``names`` on PATH; else skip (locally) or fail (CI)."""
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    msg = f"{names[0]} is not installed: `make systools` installs it (Debian package {package})"
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(msg)
    pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log=None) -> None:
    """Until ``url`` answers 200 (or the process dies, or ``timeout`` passes: AssertionError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {url} answered"
                                 + (f":\n{log.read_text()[-3000:]}" if log else ""))
        if http_get(url, timeout=2)[0] == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout}s"
                         + (f":\n{log.read_text()[-3000:]}" if log else ""))


def stop(proc: subprocess.Popen, timeout: float = 15) -> int:
    """SIGTERM, then SIGKILL when it does not go: a test never leaves a server behind."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode



@contextlib.contextmanager
def run_alertmanager(config: Path, workdir: Path) -> Iterator[str]:
    """A real Alertmanager on 127.0.0.1 with ``config``, its data and log in ``workdir``; yields
    its base URL once it is ready, and stops it afterwards."""
    binary = require_tool("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
    port = free_port()
    log = workdir / "am.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.path={workdir / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/ready", 30, proc, log)
        yield url
    finally:
        stop(proc, 10)

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-proxy-server", "--hide-scrollbars"]


def chromium() -> str:
    """Headless Chromium's path: a system package (``make browser``); skip locally, fail under CI."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        msg = "chromium is not installed: `make browser` installs it (apt package chromium)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def headless(browser: str, url: str, profile, *, screenshot=None, dump_dom: bool = False,
             size: tuple[int, int] = (1280, 2000)) -> str:
    """Load ``url`` in headless Chromium: a screenshot to ``screenshot`` (a path), or the DOM
    as the page's scripts and parser left it (``dump_dom``, returned)."""
    argv = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}"]
    if screenshot is not None:
        argv.append(f"--screenshot={screenshot}")
    if dump_dom:
        argv.append("--dump-dom")
    res = subprocess.run([*argv, url], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, f"chromium failed ({res.returncode}): {res.stderr[-2000:]}"
    assert screenshot is None or os.path.isfile(screenshot), f"chromium wrote no screenshot: {res.stderr[-2000:]}"
    return res.stdout
