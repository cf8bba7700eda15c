"""NCCL Inspector dumps with hostile lines (#36): a bad line costs only itself and is counted, the
good lines of the same poll are kept, read offsets stay consistent, and an unterminated line is
capped instead of held without bound.

``GPUWARDEN_FUZZ_EXAMPLES`` scales the fuzz tests' examples (``factories.fuzz_examples``: 300 by
default, a few seconds in `make test`).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.nccl_inspector import InspectorFollower, parse_prom
from tests.factories import fuzz_examples
from tests.unit.producers.nccl_inspector_factories import HDR, coll, dump_stats, meta

FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def op(sn: int) -> str:
    return json.dumps({"header": HDR, "metadata": meta("v4.2"), **coll(sn)})


def seqs(recs) -> list[int]:
    return sorted(r.seq for r in recs)


def test_a_deep_line_or_an_absurd_ring_count_costs_only_itself(tmp_path):
    # Before: json.loads raised RecursionError and int(1e308 + 1e308) OverflowError out of poll(),
    # after the offsets had moved past every line of the file: its good lines were lost for good.
    huge = dump_stats("v4.2", since=0)
    huge["dump_stats"]["coll_dropped_since_last_dump"] = 1e308
    huge["dump_stats"]["p2p_dropped_since_last_dump"] = 1e308
    lines = [op(1), "[" * 100_000 + "]" * 100_000, op(2), json.dumps(huge), op(3)]
    (tmp_path / "node-a-pid1.log").write_text("\n".join(lines) + "\n")
    fol = InspectorFollower(tmp_path, aggregate_ops=False)
    assert seqs(fol.poll()) == [1, 2, 3]
    s = fol.summary()
    assert s["dropped.bad_json"] == 1 and s["dropped.bad_dump_stats"] == 2 and s["dump_stats"] == 1
    assert s["dropped.inspector_ring_overwritten"] == 0
    with open(tmp_path / "node-a-pid1.log", "a") as fh:
        fh.write(op(4) + "\n")
    assert seqs(fol.poll()) == [4]  # offsets stayed consistent: nothing read twice, nothing skipped


def test_an_unterminated_line_is_capped_and_other_files_keep_being_read(tmp_path):
    # Before: the partial line grew by max_read_bytes every poll (a 2 GiB dump: memory ran out).
    big, other = tmp_path / "node-a-pid1.log", tmp_path / "node-b-pid2.log"
    big.write_bytes(b'{"coll_perf": "' + b"x" * 5000)
    other.write_text(op(1) + "\n")
    fol = InspectorFollower(tmp_path, aggregate_ops=False, max_read_bytes=1024, max_line_bytes=2048)
    held, seen = [], []
    for n in range(2, 10):
        recs = fol.poll()
        assert n - 1 in [r.seq for r in recs]  # the other file is read every poll
        seen += [r.seq for r in recs]
        held.append(len(fol._tails[big].partial))
        with open(other, "a") as fh:
            fh.write(op(n) + "\n")
        if n == 5:
            with open(big, "ab") as fh:  # the long line ends; the next line is whole
                fh.write(b"y" * 100 + b"\n" + op(100).encode() + b"\n")
    assert max(held) <= 2048 + 1024
    assert fol.summary()["dropped.oversize_line"] == 1
    assert sorted(seen) == [1, 2, 3, 4, 5, 6, 7, 8, 100]
    # A whole line past the cap in one read is dropped the same way.
    f = tmp_path / "node-c-pid3.log"
    f.write_text("[" + "1," * 2000 + "1]\n" + op(200) + "\n")
    fol = InspectorFollower(tmp_path, aggregate_ops=False, max_line_bytes=2048)
    assert 200 in seqs(fol.poll()) and fol.summary()["dropped.oversize_line"] >= 1


def test_prometheus_mode_reads_ascii_numbers_only():
    text = (
        '# TYPE nccl_collective_exec_time_microseconds gauge\n'
        'nccl_collective_exec_time_microseconds{node="n1",gpu="GPU٣",comm_name="c",nranks="8",n_nodes="²",'
        'collective="AllReduce",message_size="4-5GB"} 10\n'
        'nccl_collective_exec_time_microseconds{node="n1",gpu="GPU1",comm_name="c",nranks="' + "9" * 5000 + '",'
        'collective="AllReduce",message_size="4-5GB"} 10\n'
        'nccl_collective_exec_time_microseconds{node="n1",gpu="GPU2",comm_name="c",nranks="8",n_nodes="1",'
        'collective="AllReduce",message_size="²-5GB"} 10\n'
    )
    counts: dict[str, int] = {}
    recs = parse_prom(text, ts=1.0, counts=counts)
    # Before: int("9" * 5000) and int("²") raised (the whole file lost), "GPU٣" was GPU 3.
    assert sorted(((r.gpu, r.nnodes, r.bytes) for r in recs), key=str) == [(2, 1, 0), (None, None, 4 << 30)]
    assert counts == {"dropped.bad_rank": 1, "dropped.bad_value": 1}  # the size bucket "²-5GB" left at 0


JSON_ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=10,
)
OPERATION_LIKE = st.builds(
    lambda key, value: json.dumps({"header": HDR, "metadata": meta("v4.1"), **coll(7, **{key: value})}),
    st.sampled_from(["coll_sn", "coll_msg_size_bytes", "coll_exec_time_us", "coll_algo", "coll_busbw_gbs"]),
    JSON_ANY,
)
DUMP_STATS_LIKE = st.builds(
    lambda key, value: json.dumps({"header": {**HDR, key: value} if key in HDR else HDR, "metadata": meta("v4.3"),
                                   "dump_stats": {"coll_dropped_since_last_dump": value, "p2p_dropped_total": value}}),
    st.sampled_from(["id", "rank", "n_ranks", "other"]),
    JSON_ANY,
)
BAD = st.one_of(
    st.text(max_size=60).filter(lambda s: "\n" not in s and "\r" not in s),
    JSON_ANY.map(json.dumps),
    OPERATION_LIKE,
    DUMP_STATS_LIKE,
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(['{"coll_perf": {"coll_exec_time_us": ' + "9" * 5000 + "}}", '{"a": NaN}', '{"a": 1e999}']),
)


@FUZZ
@given(st.lists(st.tuples(st.booleans(), BAD), max_size=12))
def test_fuzz_arbitrary_lines_among_good_ones(tmp_path_factory, lines):
    d = tmp_path_factory.mktemp("insp")
    body = [op(sn) if ok else bad for sn, (ok, bad) in enumerate(lines, 1)]
    (d / "node-a-pid1.log").write_text("\n".join(body) + "\n")
    fol = InspectorFollower(d, aggregate_ops=False)
    recs = fol.poll()
    want = [sn for sn, (ok, _) in enumerate(lines, 1) if ok]
    assert set(want) <= {r.seq for r in recs}  # every good line kept
    s = fol.stats  # every other line counted once: an operation, a dump_stats marker or a drop
    lines_dropped = s.bad_json + s.skipped - s.skipped_by.get("bad_dump_stats", 0)
    assert s.records + s.dump_stats + lines_dropped == s.lines
