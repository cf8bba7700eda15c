"""The engine runs stages (pipeline/engine/stage.py): built-in checks, models, rules, or one's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.catalog import FIELDS
from pipeline.engine import Engine
from pipeline.engine.checks import CheckMeta
from pipeline.engine.stage import MODEL_SCORES, Stage, StageBase
from pipeline.engine.state import View
from pipeline.schema import NcclRecord
from tests.factories import T0, fleet, sample


class _Hot:
    meta = CheckMeta("custom_hot", "thermal_custom", "warning", for_s=2.0)

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        return {"gpu_temp": float(view.value("gpu_temp")[row])}

    def summary(self, host: str, gpu: int | None, evidence: dict[str, Any]) -> str:
        return f"GPU {gpu} on {host} runs at {evidence['gpu_temp']}"


class HotStage(StageBase):
    """A stage of one's own: a threshold on a field, publishing what it found, with state."""

    kind = "hot"
    state_key = "hot"

    def __init__(self, threshold: float = 85.0) -> None:
        self.threshold = threshold
        self.checks = [_Hot()]
        self.columns = {FIELDS.require("gpu_temp").column}
        self.rows = 0
        self.ingested = 0

    def ingest(self, gpu: np.ndarray, records: Any) -> None:
        self.ingested += len(records)

    def run(self, view: View, entities: Any, outputs: dict[str, Any]) -> list[tuple[Any, np.ndarray]]:
        self.rows += len(view.frame)
        with np.errstate(invalid="ignore"):
            hot = view.value("gpu_temp") > self.threshold
        outputs["hot"] = hot
        return [(self.checks[0], hot)]

    def to_state(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state(self, state: Any) -> None:
        self.rows = int(state["rows"]) if state else 0


class _Echo:
    meta = CheckMeta("custom_echo", "thermal_echo", "info")

    def evidence(self, view: View, row: int) -> dict[str, Any]:
        return {}

    def summary(self, host: str, gpu: int | None, evidence: dict[str, Any]) -> str:
        return "echo"


class EchoStage(StageBase):
    """Fires where an earlier stage published ``hot``; records what it saw of the outputs."""

    kind = "echo"

    def __init__(self) -> None:
        self.checks = [_Echo()]
        self.columns: set[int] = set()
        self.seen: list[set[str]] = []
        self.scores_ok: list[bool] = []

    def run(self, view: View, entities: Any, outputs: dict[str, Any]) -> list[tuple[Any, np.ndarray]]:
        self.seen.append(set(outputs))
        if MODEL_SCORES in outputs:
            self.scores_ok.append(all(len(s) == len(view.frame) for s in outputs[MODEL_SCORES].values()))
        return [(self.checks[0], outputs.get("hot", np.zeros(len(view.frame), bool)))]


def _hot_gpu1(t: float, h: str, g: int) -> dict[str, Any]:
    return {"gpu_temp": 95} if (h, g) == ("n0", 1) and 20 <= t < 60 else {}


def _run(eng: Engine, recs: list) -> list:
    out = eng.process(recs)
    out.extend(eng.flush())
    return out.alerts


def test_a_stage_of_ones_own_alerts_and_its_fields_are_decoded() -> None:
    hot = HotStage()
    eng = Engine(row_checks=[], tick_checks=[], stages=[hot])
    assert "DCGM_FI_DEV_GPU_TEMP" in eng.decode_fields and "DCGM_FI_DEV_SM_CLOCK" not in eng.decode_fields
    recs = fleet(range(100), hosts=1, gpus=2, overrides=_hot_gpu1)
    alerts = _run(eng, recs)
    assert [(a.state, a.rule, a.host, a.gpu, a.ts - T0) for a in alerts] == [
        ("firing", "custom_hot", "n0", 1, 22.0), ("resolved", "custom_hot", "n0", 1, 60.0)]
    assert alerts[0].summary == "GPU 1 on n0 runs at 95.0"
    assert hot.ingested == len(recs) and hot.rows == len(recs)
    assert eng.stage("hot") is hot and eng.rules is None and eng.models is None


def test_later_stages_see_what_earlier_ones_published() -> None:
    echo = EchoStage()
    eng = Engine(row_checks=[], tick_checks=[], stages=[HotStage(), echo])
    alerts = _run(eng, fleet(range(100), hosts=1, gpus=2, overrides=_hot_gpu1))
    assert echo.seen and all(s == {"hot"} for s in echo.seen)
    assert {(a.rule, a.state) for a in alerts} >= {("custom_echo", "firing"), ("custom_echo", "resolved")}


def test_a_stage_state_is_in_the_snapshot_and_comes_back() -> None:
    recs = fleet(range(100), hosts=1, gpus=2, overrides=_hot_gpu1)
    golden = _run(Engine(row_checks=[], tick_checks=[], stages=[HotStage()]), recs)
    eng = Engine(row_checks=[], tick_checks=[], stages=[HotStage()])
    first = eng.process(recs[:100]).alerts
    back = HotStage()
    eng2 = Engine(row_checks=[], tick_checks=[], stages=[back])
    eng2.restore(eng.snapshot())
    assert back.rows == eng.stage("hot").rows > 0
    rest = eng2.process(recs[100:]).alerts + eng2.flush().alerts
    assert [a.id for a in first + rest] == [a.id for a in golden]


def test_set_stage_keeps_alert_state_of_unchanged_checks() -> None:
    eng = Engine(row_checks=[], tick_checks=[], stages=[HotStage()])
    alerts = eng.process(fleet(range(40), hosts=1, gpus=2, overrides=_hot_gpu1)).alerts
    eng.set_stage(HotStage())          # same check settings: the firing alert stays firing
    alerts += _run(eng, fleet(range(40, 100), hosts=1, gpus=2, overrides=_hot_gpu1))
    assert [a.state for a in alerts] == ["firing", "resolved"]


def test_one_stage_of_each_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        Engine(stages=[HotStage(), HotStage()])


def test_nccl_columns_reach_only_stages_that_read_them() -> None:
    class Nccl(StageBase):
        kind, reads_nccl = "nccl", True
        checks: list[Any] = []
        columns: set[int] = set()

        def __init__(self) -> None:
            self.got = 0

        def released(self, nccl: Any) -> None:
            self.got += len(nccl)

        def run(self, view: View, entities: Any, outputs: dict[str, Any]) -> list:
            return []

    st = Nccl()
    eng = Engine(stages=[st])
    n = NcclRecord(ts=T0 + 1, host="n0", gpu=0, comm="0x1", rank=0, nranks=8, coll="AllReduce", bytes=1 << 30,
                   exec_time_us=4000.0, busbw_gbs=460.0)
    _run(eng, [n, sample(0, "n0"), sample(2, "n0")])
    assert st.got == 1 and eng.stats["records.nccl"] == 1


def test_rules_and_models_are_stages_models_first() -> None:
    from pipeline.detection import build_engine
    from pipeline.models import ModelSet
    from pipeline.resources import rules_dir
    from pipeline.rules import RuleSet

    eng, diags = build_engine([str(rules_dir())], "auto")
    assert eng is not None, diags
    # The shipped packs' NIC port checks and the NICs' AER checks (rules/fabric/ports.yaml) are stages of their own,
    # as is the built-in check on NCCL records (wrong results).
    assert [s.kind for s in eng.stages] == ["models", "checks", "rules", "ports", "nic_aer", "nccl_results"]
    assert isinstance(eng.rules, RuleSet) and isinstance(eng.models, ModelSet)
    stage: Stage = eng.rules   # RuleSet and ModelSet are stages to the type checker too
    assert stage.state_key == "windows" and eng.models.state_key == "models"
    echo = EchoStage()
    eng.set_stage(echo)            # a new kind goes after the row checks: it sees the models' scores
    assert [s.kind for s in eng.stages] == ["models", "checks", "echo", "rules", "ports", "nic_aer", "nccl_results"]
    _run(eng, fleet(range(5), hosts=1, gpus=2))
    assert echo.seen and all(MODEL_SCORES in s for s in echo.seen) and all(echo.scores_ok)


def test_the_engine_package_loads_without_rules_or_models() -> None:
    code = ("import sys, pipeline.engine, pipeline.engine.stage, pipeline.engine.snapshot; "
            "bad = sorted(m for m in sys.modules if m.startswith(('pipeline.rules', 'pipeline.models'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    root = Path(__file__).resolve().parents[3]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert res.returncode == 0, res.stdout + res.stderr
