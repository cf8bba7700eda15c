"""Helpers of the NCCL RAS producer's tests."""

from __future__ import annotations

from producers.ncclras import RasStats, parse
from tests.factories import T0


def parse_ras(text: str) -> tuple[list, RasStats]:
    """The records ``text`` gives (job ``pretrain``, read at ``T0``) and the counts of reading it."""
    stats = RasStats()
    return parse(text, ts=T0, job="pretrain", stats=stats), stats
