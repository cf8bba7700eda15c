"""bench/run_all.py end to end at a tiny size: the scripts it drives still speak its protocol
(--json lines it can read back), and a quick run writes JSON and a doc section, not docs/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_suite_without_kafka_writes_figures_and_the_doc_section(tmp_path):
    doc = tmp_path / "perf.md"
    doc.write_text("# Performance\n\nkept\n")
    perf_before = (ROOT / "docs" / "performance.md").read_text()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), "--quick", "--fleets", "32",
                           "--only", "engine,models,memory,service", "--out-dir", str(tmp_path / "out"),
                           "--doc", str(doc)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=_env_without_kafka())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (out,) = (tmp_path / "out").glob("bench-*.json")
    result = json.loads(out.read_text())
    by_id = {f["id"]: f for f in result["figures"]}
    for fid in ("engine.rules", "engine.models", "memory.total"):
        assert by_id[fid]["gpus"] == 32 and by_id[fid]["median"] > 0, fid
    assert by_id["engine.rules"]["unit"] == "GPU-samples/s" and by_id["engine.rules"]["repeat"] == 1
    assert result["machine"]["cores"] >= 1 and result["machine"]["python"]
    assert [s["name"] for s in result["skipped"]] == ["service"]  # no broker given
    text = doc.read_text()
    assert text.startswith("# Performance\n\nkept\n") and "### Engine throughput" in text
    assert "Not run: service" in text
    assert (ROOT / "docs" / "performance.md").read_text() == perf_before


def _env_without_kafka() -> dict:
    return {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
