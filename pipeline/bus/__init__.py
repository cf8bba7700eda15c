"""Message buses: Kafka (production, integration tests), in-process (demo, unit tests), files."""

from pipeline.bus.base import Message, Topics, send_all
from pipeline.bus.files import FileSink, read_lines
from pipeline.bus.memory import MemoryBus

__all__ = ["FileSink", "MemoryBus", "Message", "Topics", "read_lines", "send_all"]
