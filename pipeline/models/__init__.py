"""Online anomaly models (river's protocol) that run in the engine next to the rules.

``load_models(path) -> ModelSet``; ``Engine(rules=..., models=ModelSet)``. See docs/models.md.
"""

from pipeline.models.config import ModelSpec, load_model_specs
from pipeline.models.modelset import ModelSet, load_models

__all__ = ["ModelSet", "ModelSpec", "load_model_specs", "load_models"]
