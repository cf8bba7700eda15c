"""``rules/models.yaml``: which models run, on which features and cohorts, decided how.

Loaded through ``pipeline.yamlsafe`` (safe loading, bounded). Every mistake is a ``ConfigError`` whose key names the
place (``models[2].decider.on``), unknown keys included. Format::

    models:
      - name: thermal_hotter_than_load     # unique; also the rule language's score(name)
        detector: thermal_residual         # a registry name (pipeline/models/registry.py)
        fault: thermal_cooling_degraded    # family-prefixed
        severity: warning
        cohort: gpu_model                  # gpu_model | fleet: who shares a model
        features: [...]                    # only for detectors with configurable features
        params: {...}                      # detector parameters
        decider: {kind: threshold, threshold: 6, clear: 3}   # or {kind: quantile, q: 0.999, margin: 2}
        warmup: 600                        # samples per entity (or per cohort) before any alert
        for: 20s
        keep_firing_for: 1m
        alert: true                        # false: score only (for rules' score())
        summary: "..."                     # {host} {gpu} {score} {expected} {observed}
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import typedconfig
from pipeline.durations import duration
from pipeline.errors import ConfigError
from pipeline.models.registry import REGISTRY, build
from pipeline.schema import FAMILIES

_dur = duration  # the name the models' tests know

MODEL_KEYS = {
    "name",
    "detector",
    "fault",
    "severity",
    "cohort",
    "features",
    "params",
    "decider",
    "warmup",
    "for",
    "keep_firing_for",
    "alert",
    "summary",
    "description",
    "labels",
    "explained_by",
}
DECIDER_KEYS = {
    "threshold": {"kind", "threshold", "clear"},
    "quantile": {"kind", "q", "margin", "clear_ratio", "floor", "half_life"},
}
SEVERITIES = ("info", "warning", "critical")
CAUSES = ("fleet_power_cap",)  # pipeline/models/context.py
COHORTS = ("gpu_model", "fleet")


@dataclass
class ModelSpec:
    name: str
    detector: str
    fault: str
    severity: str = "warning"
    cohort: str = "gpu_model"
    params: dict[str, Any] = field(default_factory=dict)
    decider: dict[str, Any] = field(default_factory=lambda: {"kind": "threshold", "threshold": 6.0})
    warmup: int = 600
    for_s: float = 0.0
    keep_firing_for_s: float = 60.0
    alert: bool = True
    summary: str = ""
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    explained_by: tuple[str, ...] = ()  # fleet-wide causes that explain this model's findings away

    def definition(self) -> tuple:
        return (
            self.detector,
            self.fault,
            self.cohort,
            repr(sorted(self.params.items())),
            repr(sorted(self.decider.items())),
            self.warmup,
            self.for_s,
            self.keep_firing_for_s,
        )


def _num(v: Any, key: str, lo: float | None = None) -> float:
    """A finite number at ``key``: ``.inf`` and an int past a float's range (``warmup``, a
    parameter) raise OverflowError where they are used."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise ConfigError(key, f"expected a number, got {v!r}")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(key, f"expected a finite number, got {str(v)[:40]}")
    if lo is not None and f < lo:
        raise ConfigError(key, f"must be >= {lo}, got {v!r}")
    return f


def _decider(d: Any, key: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(key, f"expected a mapping, got {type(d).__name__}")
    kind = d.get("kind", "threshold")
    if not isinstance(kind, str) or kind not in DECIDER_KEYS:  # a list is unhashable
        raise ConfigError(f"{key}.kind", f"unknown decider {kind!r} (known: {', '.join(DECIDER_KEYS)})")
    for k in d:
        if k not in DECIDER_KEYS[kind]:
            raise ConfigError(
                f"{key}.{k}", f"unknown key for a {kind} decider (known: {', '.join(sorted(DECIDER_KEYS[kind]))})"
            )
    out: dict[str, Any] = {"kind": kind}
    for k, v in d.items():
        if k != "kind":
            out[k] = _num(v, f"{key}.{k}", 0.0)
    if kind == "threshold":
        if "threshold" not in out:
            raise ConfigError(f"{key}.threshold", "missing")
        if "clear" in out and out["clear"] >= out["threshold"]:
            raise ConfigError(f"{key}.clear", f"must be below threshold ({out['threshold']}), got {out['clear']}")
    if kind == "quantile" and "q" in out and not 0.5 <= out["q"] < 1:
        raise ConfigError(f"{key}.q", f"must be within [0.5, 1), got {out['q']}")
    return out


def spec_from_mapping(d: Any, key: str) -> ModelSpec:
    """Validate one entry of ``models:``."""
    if not isinstance(d, dict):
        raise ConfigError(key, f"expected a mapping, got {type(d).__name__}")
    for k in d:
        if k not in MODEL_KEYS:
            raise ConfigError(f"{key}.{k}", f"unknown key (known: {', '.join(sorted(MODEL_KEYS))})")
    for k in ("name", "detector", "fault"):
        if not isinstance(d.get(k), str) or not d.get(k):
            raise ConfigError(f"{key}.{k}", "missing" if k not in d else f"expected a non-empty string, got {d[k]!r}")
    name = d["name"]
    if not name.isidentifier():
        raise ConfigError(f"{key}.name", f"must be an identifier (letters, digits, _), got {name!r}")
    det = d["detector"]
    if det not in REGISTRY:
        raise ConfigError(f"{key}.detector", f"unknown detector {det!r} (known: {', '.join(sorted(REGISTRY))})")
    info = REGISTRY[det]
    fault = d["fault"]
    if fault.split("_", 1)[0] not in FAMILIES or "_" not in fault:
        raise ConfigError(f"{key}.fault", f"must start with a family prefix ({', '.join(FAMILIES)}_...), got {fault!r}")
    sev = d.get("severity", "warning")
    if sev not in SEVERITIES:
        raise ConfigError(f"{key}.severity", f"expected one of {', '.join(SEVERITIES)}, got {sev!r}")
    cohort = d.get("cohort", "gpu_model")
    if cohort not in COHORTS:
        raise ConfigError(f"{key}.cohort", f"expected one of {', '.join(COHORTS)}, got {cohort!r}")
    params = d.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{key}.params", f"expected a mapping, got {type(params).__name__}")
    accepted = set(inspect.signature(info.factory.__init__).parameters) - {"self", "params"}
    for k, v in params.items():
        if k not in accepted:
            raise ConfigError(f"{key}.params.{k}", f"unknown parameter of {det} (known: {', '.join(sorted(accepted))})")
        if k != info.feature_param:
            _num(v, f"{key}.params.{k}", 0.0)
    params = dict(params)
    if "features" in d:
        feats = d["features"]
        if info.feature_param is None:
            raise ConfigError(f"{key}.features", f"{det} has fixed features; remove 'features'")
        if not isinstance(feats, list) or not feats or not all(isinstance(f, str) for f in feats):
            raise ConfigError(f"{key}.features", f"expected a non-empty list of field names, got {feats!r}")
        from pipeline.catalog import COUNTER, FIELDS

        aliases = []
        for j, f in enumerate(feats):
            fld = FIELDS.resolve(f)
            if fld is None or fld.kind != COUNTER:
                raise ConfigError(f"{key}.features[{j}]", f"{f!r} is not a counter field of the catalog")
            aliases.append(fld.alias)
        params[info.feature_param] = aliases
    warmup = int(_num(d.get("warmup", 600), f"{key}.warmup", 0))
    if "warmup" in accepted:
        params["warmup"] = warmup
    try:  # the detector's own checks (a forest's height in 1..20) as a ConfigError, not at start-up
        build(det, params)
    except (ValueError, TypeError, OverflowError, MemoryError) as e:
        raise ConfigError(f"{key}.params", f"{det}: {str(e)[:200]}") from None
    alert = d.get("alert", True)
    if not isinstance(alert, bool):
        raise ConfigError(f"{key}.alert", f"expected true/false, got {alert!r}")
    labels = d.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ConfigError(f"{key}.labels", "expected a mapping of strings")
    explained = d.get("explained_by") or []
    if not isinstance(explained, list) or not all(isinstance(c, str) for c in explained):
        raise ConfigError(f"{key}.explained_by", f"expected a list of causes, got {explained!r}")
    for j, c in enumerate(explained):
        if c not in CAUSES:
            raise ConfigError(f"{key}.explained_by[{j}]", f"unknown cause {c!r} (known: {', '.join(CAUSES)})")
    for k in ("summary", "description"):
        if k in d and not isinstance(d[k], str):
            raise ConfigError(f"{key}.{k}", f"expected a string, got {d[k]!r}")
    return ModelSpec(
        name=name,
        detector=det,
        fault=fault,
        severity=sev,
        cohort=cohort,
        params=params,
        decider=_decider(d.get("decider", {"kind": "threshold", "threshold": 6.0}), f"{key}.decider"),
        warmup=warmup,
        for_s=duration(d.get("for", 0), f"{key}.for"),
        keep_firing_for_s=duration(d.get("keep_firing_for", 60), f"{key}.keep_firing_for"),
        alert=alert,
        summary=d.get("summary", ""),
        description=d.get("description", ""),
        labels=dict(labels),
        explained_by=tuple(explained),
    )


def load_model_specs(path: str | Path) -> list[ModelSpec]:
    """Read and validate a models file; raises ``ConfigError`` naming the key on any mistake."""
    p = Path(path)
    return specs_from_data(typedconfig.load_yaml(p, key=str(p), yaml_key=str(p)))


def specs_from_data(data: Any) -> list[ModelSpec]:
    if not isinstance(data, dict):
        raise ConfigError("models", "the file must be a mapping with a 'models' list")
    for k in data:
        if k != "models":
            raise ConfigError(str(k), "unknown key (known: models)")
    items = data.get("models") or []
    if not isinstance(items, list):
        raise ConfigError("models", f"expected a list, got {type(items).__name__}")
    specs = [spec_from_mapping(d, f"models[{j}]") for j, d in enumerate(items)]
    seen: set[str] = set()
    for j, s in enumerate(specs):
        if s.name in seen:
            raise ConfigError(f"models[{j}].name", f"duplicate model name {s.name!r}")
        seen.add(s.name)
    return specs
