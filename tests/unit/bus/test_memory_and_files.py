import gzip
import json

from pipeline.bus import FileSink, MemoryBus, Topics, read_lines, send_all
from pipeline.bus.telemetry import per_host_messages, per_record_messages


def test_topics_named_by_prefix():
    t = Topics("prod")
    assert t.all() == ["prod.telemetry", "prod.alerts", "prod.dlq", "prod.audit", "prod.state", "prod.fleet",
                       "prod.incidents"]


def test_same_key_same_partition_and_order_kept():
    bus = MemoryBus(partitions=4)
    prod = bus.producer()
    for i in range(50):
        for host in ("a", "b", "c"):
            prod.send("t", str(i).encode(), host.encode())
    assert prod.flush() == 150
    msgs = bus.messages("t")
    by_key = {}
    for m in msgs:
        by_key.setdefault(m.key, []).append(m)
    for ms in by_key.values():
        assert len({m.partition for m in ms}) == 1
        assert [int(m.value) for m in ms] == list(range(50))
    assert msgs[0].origin.startswith("t[") and "]@" in msgs[0].origin


def test_consumer_group_resumes_from_commit_only():
    bus = MemoryBus(partitions=2)
    send_all(bus.producer(), "t", [(b"k%d" % i, b"v%d" % i) for i in range(10)])
    c = bus.consumer("t", "g")
    first = c.poll(max_records=4)
    assert len(first) == 4
    c.commit()
    c.poll(max_records=3)               # polled but never committed: a crash loses nothing
    again = bus.consumer("t", "g")
    rest = again.poll(max_records=100)
    assert len(rest) == 6
    assert {m.value for m in first} | {m.value for m in rest} == {b"v%d" % i for i in range(10)}


def test_per_host_messages_group_a_hosts_records():
    recs = [{"host": h, "gpu": g, "ts": 1.0} for h in ("a", "b") for g in range(8)]
    msgs = list(per_host_messages(recs))
    assert [k for k, _ in msgs] == [b"a", b"b"]
    assert [r["gpu"] for r in json.loads(msgs[0][1])] == list(range(8))
    assert len(list(per_record_messages(recs))) == 16


def test_jsonl_and_gz_round_trip_with_line_origins(tmp_path):
    for name in ("x.jsonl", "x.jsonl.gz"):
        path = tmp_path / name
        with FileSink(path, atomic=True) as sink:
            sink.write_many([b'{"a":1}', b'{"a":2}'])
        msgs = list(read_lines(path))
        assert [m.value for m in msgs] == [b'{"a":1}', b'{"a":2}']
        assert [m.origin for m in msgs] == [f"{path}:1", f"{path}:2"]


def test_truncated_gzip_yields_its_complete_lines(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    data = gzip.compress(b"".join(b'{"line":%d}\n' % i for i in range(2000)))
    path.write_bytes(data[: len(data) // 2])
    lines = [m.value for m in read_lines(path)]
    assert 0 < len(lines) < 2000
    assert all(json.loads(v)["line"] == i for i, v in enumerate(lines[:-1]))


def test_blank_lines_are_skipped_but_counted(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a":1}\n\n{"a":2}\n')
    assert [m.origin for m in read_lines(path)] == [f"{path}:1", f"{path}:3"]


def test_a_gz_name_on_a_plain_file_is_a_clear_error(tmp_path):
    import pytest

    from pipeline.errors import EXIT_INPUT, InputError
    path = tmp_path / "plain.jsonl.gz"
    path.write_text('{"a":1}\n')
    # The user's file is not what its name says: an input error (exit 3), not a bus outage (4).
    with pytest.raises(InputError, match="not a gzip file") as e:
        list(read_lines(path))
    assert e.value.exit_code == EXIT_INPUT and str(e.value).count("gzip") == 1
