"""``gpuwarden replay``'s options that a run would ignore are usage errors (README, Exit status: 2),
not runs that do something other than what was asked."""

from __future__ import annotations

import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_USAGE
from pipeline.schema import dcgm, encode
from tests.factories import T0


def _recording(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(encode(dcgm(T0 + s, "n0", 0, {"gpu_temp": 60})) + b"\n" for s in range(3)))
    return str(path)


@pytest.mark.parametrize(
    "extra,says",
    [
        (["--speed", "10"], "--speed: not used without --to-kafka"),
        (["--kafka-config", "k.yaml"], "--kafka-config: not used without --to-kafka"),
        (["--incidents-config", "i.yaml"], "--incidents-config: not used without --incidents-out"),
        (["--to-kafka", "127.0.0.1:1", "--alerts-out", "a.jsonl"], "--alerts-out: not used with --to-kafka"),
        (["--to-kafka", "127.0.0.1:1", "--rules", "rules"], "--rules: not used with --to-kafka"),
        (["--to-kafka", "127.0.0.1:1", "--speed", "fast"], "--speed: 'max' or a positive factor"),
        (["--to-kafka", "127.0.0.1:1", "--speed", "-1"], "--speed: 'max' or a positive factor"),
        (["--fleet-shards", "0"], "--fleet-shards"),
    ],
)
def test_an_option_the_run_would_ignore_is_a_usage_error(tmp_path, capsys, extra, says) -> None:
    # Found by an audit: --speed 10 without --to-kafka replayed at full speed, --incidents-config
    # without --incidents-out grouped nothing (both exit 0), --fleet-shards 0 was exit 3.
    assert main(["replay", _recording(tmp_path), *extra]) == EXIT_USAGE == 2
    assert says in capsys.readouterr().err


def test_the_options_of_each_mode_still_work(tmp_path, capsys) -> None:
    out = tmp_path / "a.jsonl"
    assert main(["replay", _recording(tmp_path), "--models", "none", "--alerts-out", str(out),
                 "--fleet-shards", "2"]) == 0
    assert out.exists() and "replayed 3 records" in capsys.readouterr().err
