"""nccl-tests logs checked against nccl-tests' own source (NVIDIA/nccl-tests src/util.cu,
src/common.cu at v2.19.6): interleaved processes, the -J writer's infinities and string booleans,
and echoed command lines whose directories look like programs."""

from __future__ import annotations

import itertools
import json

from producers import nccl_tests
from producers.nccl_tests import ParseStats, parse, parse_text
from tests.fleet_factories import no_hang
from tests.unit.producers.nccl_tests_factories import NODE8, ROWS, T, json_doc, new_run, old_run


def interleave(*streams: list[str]) -> str:
    return "\n".join(x for group in itertools.zip_longest(*streams) for x in group if x is not None)


def test_processes_interleaved_by_the_launcher_are_read_apart():
    # A build without MPI launched as two processes (mpirun --tag-output, srun -l): each prints a
    # whole run as rank 0 (util.cu's PRINT on the main thread of each process). Read as one stream,
    # nodeA's rows were attributed to nodeB, and nodeA's wrong results named nodeB for removal.
    a = new_run("all_reduce_perf", [(0, "nodeA", 0)], ROWS, pid=1, wrong=5).splitlines()
    b = new_run("all_reduce_perf", [(0, "nodeB", 0)], ROWS, pid=2).splitlines()
    for ta, tb in (("[1,0]<stdout>:", "[1,1]<stdout>:"), ("0: ", "1: ")):
        st = ParseStats()
        recs = parse_text(interleave([ta + x for x in a], [tb + x for x in b]), ts=T, stats=st)
        got = sorted((r.host, r.bytes, r.labels.get("wrong")) for r in recs)
        assert got == [("nodeA", 8, "5"), ("nodeA", 1024, "5"), ("nodeB", 8, "0"), ("nodeB", 1024, "0")], ta
        assert [f.host for f in st.findings] == ["nodeA"] and {r.coll for r in recs} == {"AllReduce"}
        assert st.unparsable_rows == 0 and st.records == 4


def test_an_untagged_command_line_names_the_collective_of_tagged_runs():
    # A script's `set -x` echo is untagged; the runs that follow are printed by tagged processes.
    text = "+ mpirun --tag-output -np 8 /opt/nccl-tests/build/all_gather_perf -b 8\n"
    text += "\n".join("[1,0]<stdout>:" + x for x in old_run(NODE8, ROWS).splitlines())
    assert [r.coll for r in parse_text(text, ts=T)] == ["AllGather", "AllGather"]


def test_a_directory_named_like_a_program_does_not_name_the_collective():
    # "my_perf/" in a path matched first and named no collective: the run came out "unknown".
    text = "+ mpirun /home/x/my_perf/build/all_gather_perf -b 8\n" + old_run(NODE8, ROWS)
    assert {r.coll for r in parse_text(text, ts=T)} == {"AllGather"}
    text = "+ mpirun /scratch/alltoall_perf/build/all_gather_perf -b 8\n" + old_run(NODE8, ROWS)
    assert {r.coll for r in parse_text(text, ts=T)} == {"AllGather"}
    # the file name as the last resort: its own name before its directories'
    st = ParseStats()
    recs = parse_text(old_run(NODE8, ROWS), ts=T, name_hint="/logs/reduce_scatter/all_reduce.log", stats=st)
    assert {r.coll for r in recs} == {"AllReduce"} and st.coll_from_file_name == 1


def test_json_infinities_as_printf_writes_them_cost_only_their_values():
    # util.cu's jsonDouble quotes NaN but prints an infinite bandwidth with printf("%lf"): a bare
    # `inf`, which is not JSON. The whole document and its wrong-results verdict were lost.
    doc = json.dumps(json_doc())
    text = doc.replace('"bus_bw": 1.0', '"bus_bw": inf', 1).replace('"alg_bw": 1.0', '"alg_bw": -inf', 1)
    st = ParseStats()
    recs = parse(text, ts=T, coll="AllReduce", stats=st)
    assert [r.bytes for r in recs] == [8, 1024, 4096]
    assert recs[0].busbw_gbs is None and recs[0].algbw_gbs is None and recs[1].busbw_gbs == 1.0
    assert [f.wrong_sizes for f in st.findings] == [[8, 1024, 4096]]
    # text inside strings is left alone
    text = doc.replace('"all_reduce_perf"', '"x: inf, y"').replace('"bus_bw": 1.0', '"bus_bw": inf', 1)
    assert len(parse(text, ts=T, coll="AllReduce")) == 3


def test_json_okay_false_is_a_string_and_still_the_verdict():
    # util.cu's jsonBool writes jsonStr("false"): "okay": "false", never a JSON false.
    doc = json_doc(out_of_bounds={"count": "x", "okay": "false"})
    for r in doc["results"]:
        r["out_of_place"]["nwrong"] = 0
    st = ParseStats()
    parse(json.dumps(doc), ts=T, coll="AllReduce", stats=st)
    assert [f.out_of_bounds for f in st.findings] == [1]
    doc["out_of_bounds"] = {"count": 0, "okay": "true"}
    st = ParseStats()
    parse(json.dumps(doc), ts=T, coll="AllReduce", stats=st)
    assert st.findings == []


def test_a_file_of_stray_quotes_is_read_in_linear_time():
    # Found in review: the -J fallback's string pattern, failing on an unterminated string, was
    # tried again at every later quote: 40 KB took 6.5 s, 400 KB would take ten minutes.
    with no_hang(30):
        assert parse("{" + '"\\' * 200_000, stats=ParseStats()) == []


def test_command_lines_cost_the_runs_they_close_not_every_stream(monkeypatch):
    # Found in review: each untagged command line stepped through every stream of the log, so
    # 40,000 tags and 40,000 command lines were ~1.6 billion steps; and every distinct tag held a
    # stream (~500 bytes for a 9-byte line): at most MAX_STREAMS are read, the rest counted.
    lines = [f"{i}: # nThread 1 nGpus 1" for i in range(40_000)] + ["mpirun all_reduce_perf -b 8"] * 40_000
    with no_hang(30):
        parse_text("\n".join(lines), stats=ParseStats())
    monkeypatch.setattr(nccl_tests, "MAX_STREAMS", 2)
    stats = ParseStats()
    a = new_run("all_reduce_perf", [(0, "nodeA", 0)], ROWS, pid=1).splitlines()
    b = new_run("all_reduce_perf", [(0, "nodeB", 0)], ROWS, pid=2).splitlines()
    text = "\n".join([f"0: {x}" for x in a] + [f"1: {x}" for x in b] + ["7: # nThread 1 nGpus 1"])
    recs = parse_text(text, ts=T, stats=stats)
    assert stats.too_many_streams == 1 and sorted({r.host for r in recs}) == ["nodeA", "nodeB"]


def test_a_row_size_past_an_int64_is_an_unparsable_row():
    # Found in review: 19 nines passed the 19-digit bound and became bytes the decoder refuses.
    rows = new_run("all_reduce_perf", [(0, "nodeA", 0)], ROWS).replace(f"{1024:12d}  {1024 // 4:12d}", f"{'9' * 19}  {256:12d}")
    st = ParseStats()
    recs = parse_text(rows, ts=T, stats=st)
    assert [r.bytes for r in recs] == [8] and st.unparsable_rows == 1
