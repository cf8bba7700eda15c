"""nccl-tests text logs in every layout its releases print (built from the printf formats of
nccl-tests' src/common.cu and src/util.cu, not copied from a log): the 2.13+ layout with
``Group`` and ``#wrong``, the older one with an ``error`` column, rank lines without ``Group``
and an empty ``redop`` cell for alltoall; several runs in one log; elided rank lists; wrong
results as a critical finding."""

from __future__ import annotations

import logging

from producers.nccl_tests import ParseStats, collective_name, parse_text
from tests.unit.producers.nccl_tests_factories import NODE8, ROWS, T, new_run, old_run


def test_old_layout_blank_redop_alltoall_keeps_every_row():
    text = old_run(NODE8, ROWS, redop="")
    recs = parse_text(text, ts=T, coll="AllToAll")
    assert [(r.bytes, r.exec_time_us, r.busbw_gbs) for r in recs] == [(8, 30.0, 0.0), (1024, 31.5, 0.03)]
    assert recs[0].labels["root"] == "-1" and "redop" not in recs[0].labels and recs[0].labels["in_time_us"] == "30"


def test_old_layout_rank_lines_without_group_give_host_gpu_and_nranks():
    recs = parse_text(old_run(NODE8, ROWS), ts=T, coll="AllReduce", host="fallback")
    r = recs[0]
    assert (r.host, r.gpu, r.rank, r.nranks, r.nnodes) == ("dgx01", 0, 0, 8, 1)
    assert r.comm.startswith("nccl-tests:dgx01:4242:")


def test_collective_comes_from_the_log_not_the_file_name():
    text = new_run("all_gather_perf", NODE8, ROWS, redop="none")
    [r, _] = parse_text(text, ts=T, name_hint="/logs/gather-burnin.log")
    assert r.coll == "AllGather" and "coll_source" not in r.labels
    # an echoed command line names it in logs that predate 'Collective test starting'
    text = "+ mpirun -np 16 /opt/nccl-tests/build/all_gather_perf -b 8 -e 1K\n" + old_run(NODE8, ROWS)
    assert parse_text(text, ts=T, name_hint="/logs/gather.log")[0].coll == "AllGather"
    # only as a last resort, and then labelled so
    st = ParseStats()
    [r, _] = parse_text(old_run(NODE8, ROWS), ts=T, name_hint="/logs/allgather.log", stats=st)
    assert r.coll == "AllGather" and r.labels["coll_source"] == "file_name" and st.coll_from_file_name == 1
    assert collective_name("allgather") == "AllGather" and collective_name("reduce_scatter_perf") == "ReduceScatter"


def test_elided_rank_list_takes_nranks_from_the_highest_rank():
    ranks = [(0, "n1", 0), (7, "n1", 7), (8, "n2", 0), (15, "n2", 7)]
    recs = parse_text(new_run("all_reduce_perf", ranks, ROWS), ts=T)
    assert {(r.nranks, r.nnodes, r.host, r.gpu) for r in recs} == {(16, 2, "n1", 0)}


def test_two_runs_in_one_log_are_split_with_their_own_run_ids():
    ranks = [(r, "n1", r) for r in range(8)] + [(r, "n2", r - 8) for r in range(8, 16)]
    text = new_run("all_reduce_perf", ranks, ROWS, pid=11) + new_run("alltoall_perf", ranks, ROWS, redop="none", pid=11)
    recs = parse_text(text, ts=T)
    assert len(recs) == 4
    assert [r.coll for r in recs] == ["AllReduce", "AllReduce", "AllToAll", "AllToAll"]
    assert {r.nranks for r in recs} == {16}
    assert len({r.comm for r in recs[:2]}) == 1 and recs[0].comm != recs[2].comm
    assert [r.labels["run"] for r in recs] == ["run1", "run1", "run2", "run2"]
    # old layout: two runs back to back, told apart by their nThread header
    recs = parse_text(old_run(NODE8, ROWS) + old_run(NODE8, ROWS, redop=""), ts=T, coll="AllToAll")
    assert len(recs) == 4 and recs[0].comm != recs[2].comm and {r.nranks for r in recs} == {8}


def test_wrong_results_are_a_critical_finding(caplog):
    st = ParseStats()
    with caplog.at_level(logging.CRITICAL, logger="producers.nccl_tests"):
        recs = parse_text(new_run("all_reduce_perf", NODE8, ROWS, wrong=3, oob=6), ts=T, stats=st)
    [f] = st.findings
    assert f.severity == "critical" and f.wrong_sizes == [8, 1024] and f.wrong_elements == 6 and f.out_of_bounds == 6
    assert all(r.labels["wrong_results"] == "true" for r in recs)
    assert any("wrong results" in m for m in caplog.messages)
    # the footer alone (a build that prints N/A in #wrong) is enough
    st = ParseStats()
    parse_text(old_run(NODE8, ROWS, oob=2), ts=T, coll="AllReduce", stats=st)
    assert [f.out_of_bounds for f in st.findings] == [2]
    st = ParseStats()
    parse_text(new_run("all_reduce_perf", NODE8, ROWS), ts=T, stats=st)
    assert st.findings == []


def test_the_old_error_column_is_a_deviation_not_wrong_elements():
    # Before 2.13 the column is maxDelta (printf "%5.0le"): a healthy float run prints 2e-07
    # and the like (V100, NCCL 2.8.3, in public logs). Read as a count of wrong elements, every
    # row made a critical "silent data corruption" finding; the verdict is the footer's.
    text = old_run(NODE8, ROWS).replace("0e+00", "2e-07")
    st = ParseStats()
    recs = parse_text(text, ts=T, coll="AllReduce", stats=st)
    assert st.findings == [] and len(recs) == 2
    assert all("wrong_results" not in r.labels and "wrong" not in r.labels for r in recs)
    assert recs[0].labels["max_error"] == "2e-07" and recs[0].labels["in_max_error"] == "2e-07"
    st = ParseStats()
    parse_text(old_run(NODE8, ROWS, oob=1).replace("0e+00", "3e+02"), ts=T, coll="AllReduce", stats=st)
    assert [f.out_of_bounds for f in st.findings] == [1]


def test_lines_tagged_by_the_launcher_read_as_untagged():
    # mpirun --tag-output prefixes every line with [job,rank]<stdout>:, srun -l with "rank: ":
    # each rule above missed its line, and the log gave no record and no drop.
    text = new_run("all_reduce_perf", NODE8, ROWS, wrong=1, oob=2)
    plain = parse_text(text, ts=T)
    assert len(plain) == 2
    for tag in ("[1,0]<stdout>:", "0: "):
        st = ParseStats()
        got = parse_text("\n".join(tag + line for line in text.splitlines()), ts=T, stats=st)
        assert got == plain and [f.out_of_bounds for f in st.findings] == [2], tag

def test_rows_that_do_not_fit_are_counted_not_silent():
    lines = new_run("all_reduce_perf", NODE8, ROWS).splitlines()
    i = next(i for i, l in enumerate(lines) if l.split()[:1] == ["1024"])
    lines[i] = " ".join(lines[i].split()[:-3])          # a row cut short
    st = ParseStats()
    recs = parse_text("\n".join(lines), ts=T, stats=st)
    assert len(recs) == 1 and st.unparsable_rows == 1 and st.rows == 2


def test_first_releases_print_times_in_ms():
    text = old_run(NODE8, ROWS).replace("(us)", "(ms)")
    recs = parse_text(text, ts=T, coll="AllReduce")
    assert recs[0].exec_time_us == 30000.0


def test_cli_exits_non_zero_and_names_the_finding(tmp_path, capsys):
    from pipeline.cli import main

    log = tmp_path / "burnin.log"
    log.write_text(new_run("all_reduce_perf", NODE8, ROWS, oob=4))
    out = tmp_path / "o.jsonl"
    assert main(["produce", "nccl-tests", str(log), "--out", str(out), "--interval", "0"]) == 3
    err = capsys.readouterr().err
    assert "CRITICAL nccl-tests AllReduce run run1 on dgx01: wrong results" in err and "wrong_result_runs 1" in err
    assert len(out.read_text().splitlines()) == 2
    log.write_text(new_run("all_reduce_perf", NODE8, ROWS))
    assert main(["produce", "nccl-tests", str(log), "--out", str(out), "--interval", "0"]) == 0
