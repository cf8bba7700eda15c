"""DCGM samples moved to the next tick (``HostClock.one_per_tick``) are counted where an operator
sees them: the engine's ``stats``, the service's ``gpuwarden_samples_moved_total`` (once, across
a restore) and replay's summary."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from pipeline.bus.base import Message
from pipeline.bus.telemetry import per_host_messages
from pipeline.cli import main
from pipeline.engine import Engine
from pipeline.engine.engine import MOVED
from pipeline.runner import Pipeline
from pipeline.schema import DcgmRecord, dcgm, encode
from tests.factories import Clock

T = 1764403200.0
RULES = str(Path(__file__).resolve().parents[3] / "rules")


def jittering(seconds: int, host: str = "n1", start: int = 0) -> list[DcgmRecord]:
    """Two GPUs sampled every second at .02 and .97 in turn: every second sample of an odd
    second but the first shares its tick with the one before and moves to the next."""
    out = []
    for s in range(start, start + seconds):
        t = T + s + (0.97 if s % 2 else 0.02) - (1.0 if s % 2 else 0.0)
        out += [dcgm(t, host, g, {"gpu_temp": 60}) for g in range(2)]
    return out


def messages(records, start: int = 0) -> list[Message]:
    return [Message("t", 0, start + i, k, v) for i, (k, v) in enumerate(per_host_messages(records))]


def test_the_moves_are_taken_once_and_a_restored_count_is_not_taken_again() -> None:
    pipe = Pipeline(Engine())
    pipe.handle(messages(jittering(6)))  # .02, .97 (moved), 2.02, 2.97 (moved), 4.02, 4.97 (moved)
    assert pipe.engine.stats[MOVED] == 6  # three samples of two GPUs
    assert pipe.take_moved() == 6
    assert pipe.take_moved() == 0
    again = Pipeline(Engine())
    again.restore(pipe.snapshot())
    assert again.take_moved() == 0  # moved by the process before
    again.handle(messages(jittering(2, start=6), 6))  # 6.02, 6.97 (moved)
    assert again.take_moved() == 2


def test_the_service_counts_the_moves_on_metrics() -> None:
    from tests.unit.service.service_factories import services

    clock = Clock()
    _, host, _ = services(list(per_host_messages(jittering(6))), clock)
    for _ in range(5):
        host.step()
        clock.t += 0.5
    text = generate_latest(host.metrics.registry).decode()
    assert "gpuwarden_samples_moved_total 6.0" in text


def test_replay_says_how_many_samples_it_moved_and_nothing_when_none(tmp_path, capsys) -> None:
    rec = tmp_path / "jittering.jsonl"
    rec.write_bytes(b"\n".join(encode(r) for r in jittering(6)) + b"\n")
    assert main(["replay", str(rec), "--rules", RULES]) == 0
    assert "DCGM samples moved to the next tick (each the second of its host's samples in one tick): 6" in (
        capsys.readouterr().err
    )
    steady = tmp_path / "steady.jsonl"
    steady.write_bytes(b"\n".join(encode(dcgm(T + s, "n1", 0, {"gpu_temp": 60})) for s in range(6)) + b"\n")
    assert main(["replay", str(steady), "--rules", RULES]) == 0
    assert "moved to the next tick" not in capsys.readouterr().err
