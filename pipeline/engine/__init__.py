"""The detection engine (DESIGN §1, §3): a plain object fed batches of records in event time."""

from pipeline.engine.config import EngineConfig
from pipeline.engine.engine import Engine, EngineOutput

__all__ = ["Engine", "EngineConfig", "EngineOutput"]
