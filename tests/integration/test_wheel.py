"""The wheel works installed: built from this tree, installed into a fresh virtual environment
outside the repository, and run from a directory that is not a checkout.

Offline and quick: the wheel is built with the project environment's setuptools
(``--no-build-isolation``; setuptools and wheel are in the test extra) and installed with
``--no-deps --no-index``. The fresh environment has no packages of its own besides gpuwarden;
its dependencies (numpy, river, ...) come from the project environment through a ``.pth``
line, which adds that site-packages directory as a plain path: its ``.pth`` files (the
editable install's finder among them) are not run, so ``pipeline`` can only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _source_copy(dest: Path) -> Path:
    """The tree as a checkout would build it: tracked and not-ignored files, no build leftovers."""
    try:
        files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                               capture_output=True, timeout=30).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: build the wheel from a clone")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp / "src")
    wheels = tmp / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", str(src), "-w", str(wheels)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = wheels.glob("gpuwarden-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MPLCONFIGDIR=str(tmp / "mpl"), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    return {"wheel": wheel, "venv": venv, "py": py, "work": work, "env": env}


def gw(installed: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["venv"] / "bin" / "gpuwarden"), *args], cwd=installed["work"],
                          env=installed["env"], capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_packs_data_and_templates(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for f in (ROOT / "rules").rglob("*"):
        if f.is_file():
            assert f"pipeline/packs/{f.relative_to(ROOT / 'rules')}" in names
    for f in (ROOT / "pipeline" / "data").glob("*.csv"):
        assert f"pipeline/data/{f.name}" in names
    assert any(n.startswith("pipeline/report/templates/") for n in names)


def test_installed_gpuwarden_reads_its_own_packs(installed):
    out = subprocess.run([str(installed["py"]), "-c", "import pipeline, json; from pipeline.resources import "
                          "rules_dir, default_models, default_routes; print(json.dumps([pipeline.__file__, "
                          "str(rules_dir()), str(default_models()), str(default_routes())]))"],
                         cwd=installed["work"], env=installed["env"], capture_output=True, text=True, check=True)
    paths = [Path(p) for p in json.loads(out.stdout)]
    for p in paths:
        assert installed["venv"] in p.parents and ROOT not in p.parents, p
    assert paths[1].name == "packs" and paths[2].is_file() and paths[3].is_file()
    v = gw(installed, "--version")
    assert v.returncode == 0 and v.stdout.strip() == "gpuwarden 0.1.0"


def test_sim_replay_report_and_the_rule_checks_from_the_wheel(installed):
    work = installed["work"]
    done = gw(installed, "sim", "--scenario", "gpu_lost", "--hosts", "2", "--duration", "300", "--seed", "1",
              "--out", "rec.jsonl")
    assert done.returncode == 0, done.stderr
    done = gw(installed, "replay", "rec.jsonl", "--alerts-out", "alerts.jsonl")
    assert done.returncode == 0, done.stderr
    alerts = [json.loads(x) for x in (work / "alerts.jsonl").read_text().splitlines()]
    assert any(a["fault"] == "gpu_fallen_off_bus" and a["state"] == "firing" for a in alerts), alerts
    done = gw(installed, "report", "--telemetry", "rec.jsonl", "--alerts", "alerts.jsonl", "--out", "report.html")
    assert done.returncode == 0, done.stderr
    assert "gpu_fallen_off_bus" in (work / "report.html").read_text()

    check = gw(installed, "rules", "check")
    assert check.returncode == 0 and "ok: " in check.stderr, check.stdout + check.stderr
    tests = gw(installed, "rules", "test")
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed, 0 failed" in tests.stdout and not tests.stdout.startswith("0 passed")
    # The shipped example routes are the default of `routes test`.
    routes = gw(installed, "routes", "test", "fault=gpu_fallen_off_bus", "severity=critical", "host=gpu-node-1")
    assert routes.returncode == 0, routes.stdout + routes.stderr
