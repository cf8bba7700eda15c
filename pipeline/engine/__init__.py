"""The detection engine (docs/architecture.md §1, §4): a plain object fed batches of records in event time."""

from pipeline.engine.config import EngineConfig
from pipeline.engine.engine import Engine
from pipeline.engine.output import EngineOutput

__all__ = ["Engine", "EngineConfig", "EngineOutput"]
