"""What the service benchmarks share: start a `gpuwarden serve` process, stop it, drop its topics.

The broker is shared (tests, other benches), so each run uses its own topic prefix and deletes
its topics afterwards: a 16k-GPU recording is over a GiB on the broker's disk.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

ROOT = Path(__file__).resolve().parents[1]
# serve signs its checkpoints and will not start without a key: one per bench run unless given,
# shared by every service the run starts (a restarted one must read what the last one wrote).
STATE_KEY = os.environ.get("GPUWARDEN_STATE_KEY") or secrets.token_hex(32)


class Service:
    """One `python -m pipeline serve` child with its config and log under ``workdir``."""

    def __init__(self, config: dict, workdir: Path, name: str, start_timeout_s: float = 120.0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"{name}.json"
        self.config_path.write_text(json.dumps(config))
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--config", str(self.config_path)],
                                     cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "GPUWARDEN_STATE_KEY": STATE_KEY})
        self.port = self._wait_port(start_timeout_s)

    def _wait_port(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = re.search(r'"http_port": (\d+)', self.log_path.read_text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"service did not start; see {self.log_path}:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Best effort: a failed clean-up must not hide the measurement."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            existing = set(admin.list_topics())
            gone = [t for t in topics if t in existing]
            if gone:
                admin.delete_topics(gone)
        finally:
            admin.close()
    except KafkaError as e:
        print(f"warning: could not delete topics {topics}: {e}", file=sys.stderr)

