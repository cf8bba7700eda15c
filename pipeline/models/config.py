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
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import typedconfig
from pipeline.durations import duration
from pipeline.errors import ConfigError
from pipeline.models.detectors.halfspace import MAX_NODES
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
# Detector parameters that count (trees, samples, ranks): whole numbers, at most an int32, so the
# detectors' int64 arithmetic cannot overflow (a period of 2**63 raised on every tick).
WHOLE = {"n_trees", "height", "window_size", "seed", "period", "learn_every", "min_ranks", "min_peers"}
MAX_WHOLE = (1 << 31) - 1
# Parameters that divide or regularise: 0 raised on every batch (a division by zero, a singular
# matrix), which the engine dead-letters, so the model never scored; a counter window of 0 never
# warmed up (long_s) or expected no error at all, so any one scored the maximum (short_s, mid_s).
POSITIVE = {"forget_s", "ridge", "short_s", "mid_s", "long_s"}
MAX_MODELS = 100  # in one file: each is built to be checked, then runs on every tick
# A summary's format spec: no nested field, no width or precision past 3 digits (``{score:>99999999999}``
# asked str.format for 100 GB at every alert).
_SPEC = re.compile(r"[^{}]*")
_WIDE = re.compile(r"\d{4,}")
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


def _whole(v: Any, key: str) -> int:
    """A whole number from 0 to ``MAX_WHOLE`` at ``key`` (``600.0`` is 600; ``2.5`` is refused,
    not cut to 2)."""
    f = _num(v, key, 0)
    if f != int(f) or f > MAX_WHOLE:
        raise ConfigError(key, f"expected a whole number from 0 to {MAX_WHOLE}, got {str(v)[:40]}")
    return int(f)


def _summary(tmpl: Any, key: str) -> str:
    """A summary template: ``{name}`` fields, with a conversion and a short format spec at most.

    >>> _summary("{host}: {score:.1f}", "models[0].summary")
    '{host}: {score:.1f}'
    """
    if not isinstance(tmpl, str):
        raise ConfigError(key, f"expected a string, got {tmpl!r}")
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(tmpl) if f is not None]
    except ValueError as e:  # an unmatched brace
        raise ConfigError(key, f"not a template ({e}); write {{{{ and }}}} for literal braces") from None
    for f, spec, conv in fields:
        spec = spec or ""
        if not (f.isascii() and f.isidentifier()) or conv not in (None, "r", "s", "a"):
            raise ConfigError(key, f"{{{f[:40]}}}: a field is a plain name such as {{host}} or {{score}}")
        if not _SPEC.fullmatch(spec) or _WIDE.search(spec):
            raise ConfigError(
                key, f"{{{f}:{spec[:40]}}}: a format spec such as .1f, with no nested field or width past 999"
            )
    return tmpl


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
        if out["threshold"] <= 0:  # the default clear level (60% of it) must lie below it
            raise ConfigError(f"{key}.threshold", f"must be above 0, got {out['threshold']}")
        if "clear" in out and out["clear"] >= out["threshold"]:
            raise ConfigError(f"{key}.clear", f"must be below threshold ({out['threshold']}), got {out['clear']}")
    # The quantile decider's own bounds, checked here so the error names the model: a half-life
    # of 0 divides by zero, a clear level at or above the raising one drops a flag on its next row.
    if kind == "quantile" and "q" in out and not 0.5 <= out["q"] < 1:
        raise ConfigError(f"{key}.q", f"must be within [0.5, 1), got {out['q']}")
    if kind == "quantile" and out.get("margin", 1.0) < 1:
        raise ConfigError(f"{key}.margin", f"must be >= 1, got {out['margin']}")
    if kind == "quantile" and out.get("clear_ratio", 0.0) >= 1:
        raise ConfigError(f"{key}.clear_ratio", f"must be below 1, got {out['clear_ratio']}")
    if kind == "quantile" and out.get("half_life", 1.0) <= 0:
        raise ConfigError(f"{key}.half_life", f"must be above 0, got {out['half_life']}")
    return out


def _given(d: dict[str, Any], k: str, empty: Any) -> Any:
    """``d[k]``, ``empty`` when absent or null: a wrong type (``models: {}``, ``params: []``) is
    the caller's to refuse, not taken for nothing."""
    v = d.get(k)
    return empty if v is None else v


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
    if not (name.isascii() and name.isidentifier()):  # score(name) reads ASCII names only
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
    params = _given(d, "params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"{key}.params", f"expected a mapping, got {type(params).__name__}")
    accepted = set(inspect.signature(info.factory.__init__).parameters) - {"self", "params"}
    params = dict(params)
    for k, v in params.items():
        if k not in accepted:
            raise ConfigError(f"{key}.params.{k}", f"unknown parameter of {det} (known: {', '.join(sorted(accepted))})")
        if k == info.feature_param:  # else the catalogue check of `features` is skipped
            raise ConfigError(f"{key}.params.{k}", "set the features with 'features', not params")
        if k in WHOLE:
            params[k] = _whole(v, f"{key}.params.{k}")
        elif _num(v, f"{key}.params.{k}", 0.0) == 0 and k in POSITIVE:
            raise ConfigError(f"{key}.params.{k}", "must be above 0")
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
    warmup = _whole(d.get("warmup", 600), f"{key}.warmup")
    if "warmup" in accepted:
        params["warmup"] = warmup
    try:  # the detector's own checks (a forest's height in 1..20) as a ConfigError, not at start-up
        build(det, params)
    except (ValueError, TypeError, OverflowError, MemoryError) as e:
        raise ConfigError(f"{key}.params", f"{det}: {str(e)[:200]}") from None
    alert = d.get("alert", True)
    if not isinstance(alert, bool):
        raise ConfigError(f"{key}.alert", f"expected true/false, got {alert!r}")
    labels = _given(d, "labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ConfigError(f"{key}.labels", "expected a mapping of strings")
    explained = _given(d, "explained_by", [])
    if not isinstance(explained, list) or not all(isinstance(c, str) for c in explained):
        raise ConfigError(f"{key}.explained_by", f"expected a list of causes, got {explained!r}")
    for j, c in enumerate(explained):
        if c not in CAUSES:
            raise ConfigError(f"{key}.explained_by[{j}]", f"unknown cause {c!r} (known: {', '.join(CAUSES)})")
    if "description" in d and not isinstance(d["description"], str):
        raise ConfigError(f"{key}.description", f"expected a string, got {d['description']!r}")
    summary = _summary(d["summary"], f"{key}.summary") if "summary" in d else ""
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
        summary=summary,
        description=d.get("description", ""),
        labels=dict(labels),
        explained_by=tuple(explained),
    )


def _forest_nodes(spec: ModelSpec) -> int:
    """The nodes of a model's Half-Space forest; 0 for a detector without one.

    >>> _forest_nodes(ModelSpec("m", "cohort_hst", "gpu_x", params={"n_trees": 2, "height": 3}))
    30
    """
    sig = inspect.signature(REGISTRY[spec.detector].factory.__init__).parameters
    if "n_trees" not in sig or "height" not in sig:
        return 0
    n_trees = spec.params.get("n_trees", sig["n_trees"].default)
    height = spec.params.get("height", sig["height"].default)
    return int(n_trees) * (2 ** (int(height) + 1) - 1)


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
    items = _given(data, "models", [])
    if not isinstance(items, list):
        raise ConfigError("models", f"expected a list, got {type(items).__name__}")
    if len(items) > MAX_MODELS:
        raise ConfigError("models", f"more than {MAX_MODELS} models in one file")
    specs, nodes = [], 0
    for j, d in enumerate(items):
        specs.append(spec_from_mapping(d, f"models[{j}]"))
        # Each forest is bounded alone; together they are too, or a file of them holds ~120 MB
        # and takes ~3 s to start per forest.
        nodes += _forest_nodes(specs[-1])
        if nodes > MAX_NODES:
            raise ConfigError(
                f"models[{j}].params",
                f"the forests of this file hold n_trees x (2^(height+1) - 1) nodes each, at most {MAX_NODES} together",
            )
    seen: set[str] = set()
    for j, s in enumerate(specs):
        if s.name in seen:
            raise ConfigError(f"models[{j}].name", f"duplicate model name {s.name!r}")
        seen.add(s.name)
    return specs
