"""nccl-tests logs with hostile lines (#36): a bad line or JSON value costs only itself, is counted
by reason, and the log's wrong-results verdict survives it.

``GPUWARDEN_FUZZ_EXAMPLES`` scales the fuzz tests' examples (``factories.fuzz_examples``: 300 by
default, a few seconds in `make test`).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.nccl_tests import NcclTestsSource, ParseStats, parse, parse_text
from tests.factories import fuzz_examples
from tests.unit.producers.nccl_tests_factories import NODE8, ROWS, T, json_doc, new_run

FUZZ = settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

ROW = "{size:>12}  {count:>12}     float     sum      -1    30.00    0.00    0.00       3    30.00    0.00    0.00       0"


def with_lines(text: str, extra: list[str]) -> str:
    """``extra`` inserted after the first result row of ``text``."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:1] == ["8"]) + 1
    return "\n".join(lines[:i] + extra + lines[i:])


def test_a_unicode_or_huge_number_costs_its_row_and_the_wrong_results_verdict_survives():
    # Before: "²".isdigit() and int() of 4,300 digits raised ValueError, the whole log was lost.
    bad = [ROW.format(size="²", count=2), ROW.format(size="9" * 5000, count=2), ROW.format(size="٣", count=2)]
    st_ = ParseStats()
    recs = parse_text(with_lines(new_run("all_reduce_perf", NODE8, ROWS, wrong=3), bad), ts=T, stats=st_)
    assert sorted(r.bytes for r in recs) == [8, 1024] and st_.unparsable_rows == 3
    assert [f.wrong_sizes for f in st_.findings] == [[8, 1024]]


def test_rank_nthread_and_out_of_bounds_lines_with_bad_numbers_are_counted():
    text = new_run("all_reduce_perf", NODE8, ROWS, oob=4)
    text = text.replace("#  Rank  7 Group  0 Pid   4242", "#  Rank " + "7" * 5000 + " Group  0 Pid   4242")
    text = text.replace("# nThread 1 nGpus 1", "# nThread ² nGpus 1")
    text = text.replace("# Out of bounds values : 4 FAILED", "# Out of bounds values : ٣ FAILED")
    st_ = ParseStats()
    recs = parse_text(text, ts=T, stats=st_)
    assert len(recs) == 2 and st_.unparsable_lines == 3
    assert recs[0].nranks == 7  # rank 7's line is the one lost
    assert [f.out_of_bounds for f in st_.findings] == [1]  # FAILED stands without its count


def test_json_values_of_the_wrong_type_huge_or_deep_cost_only_themselves():
    # Before: a list where an object belongs raised AttributeError, a 4,300-digit int or deep
    # nesting made json.loads fail and the text parser found nothing: the log and its verdict lost.
    doc = json_doc()
    doc["results"][1]["out_of_place"] = [1, 2]
    doc["results"].insert(0, "not a result")
    doc["config"]["devices"].append({"rank": [], "hostname": 5})
    doc["args"] = 7
    text = json.dumps(doc)
    text = text.replace('"size": 4096', '"size": ' + "9" * 5000, 1)
    deep = "[" * 50_000 + "]" * 50_000
    text = text.replace('"type": "float"', f'"type": {deep}', 1)
    st_ = ParseStats()
    recs = parse(text, ts=T, coll="AllReduce", stats=st_)
    assert [r.bytes for r in recs] == [8]  # 1024 lost its time (wrong type), 4096 its size
    assert "type" not in recs[0].labels  # the too-deep value alone is gone
    assert st_.unparsable_rows == 2 and st_.no_time == 1 and st_.bad_json_values == 4
    assert [f.wrong_sizes for f in st_.findings] == [[8]]


def test_the_cli_still_exits_3_for_the_wrong_results_of_a_hostile_log(tmp_path, capsys):
    from pipeline.cli import main

    log = tmp_path / "burnin.log"
    log.write_text(with_lines(new_run("all_reduce_perf", NODE8, ROWS, wrong=3), [ROW.format(size="²", count=1)]))
    out = tmp_path / "o.jsonl"
    assert main(["produce", "nccl-tests", str(log), "--out", str(out), "--interval", "0"]) == 3
    assert "dropped.unparsable_row 1" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 2


STRUCTURE = ("Rank", "nThread", "Collective", "size", "perf", "(B)", "Out of bounds")
NUMBERISH = st.sampled_from(["0", "8", "1e3", "-1", "²", "٣", "9" * 400, "9" * 5000, "nan", "inf", "N/A", "", "sum"])
ROWISH = st.lists(st.one_of(NUMBERISH, st.text(max_size=6)), min_size=1, max_size=16).map(" ".join)
LINE = st.one_of(ROWISH, ROWISH.map(lambda s: "8 " + s), st.text(max_size=80), st.text(max_size=40).map(lambda s: "# " + s))


@FUZZ
@given(st.lists(LINE.filter(lambda s: not any(k in s for k in STRUCTURE)), max_size=12))
def test_fuzz_arbitrary_lines_among_good_rows(extra):
    st_ = ParseStats()
    recs = parse_text(with_lines(new_run("all_reduce_perf", NODE8, ROWS, wrong=3), extra), ts=T, stats=st_)
    assert {8, 1024} <= {r.bytes for r in recs}
    assert st_.records + st_.unparsable_rows + st_.no_time == st_.rows  # every row-like line accounted for
    assert st_.findings and {8, 1024} <= set(st_.findings[0].wrong_sizes)


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=12,
)
JSON_KEYS = st.sampled_from(["size", "type", "redop", "root", "out_of_place", "in_place"])


@FUZZ
@given(JSON_KEYS, JSON_VALUE, st.sampled_from(["args", "config", "results", "out_of_bounds"]), JSON_VALUE)
def test_fuzz_json_values_of_any_type(key, value, top, top_value):
    doc = json_doc()
    doc["results"].append({**doc["results"][0], key: value})
    st_ = ParseStats()
    recs = parse(json.dumps(doc), ts=T, coll="AllReduce", stats=st_)
    assert {8, 1024, 4096} <= {r.bytes for r in recs}
    doc = json_doc(**{top: top_value})
    parse(json.dumps(doc), ts=T, coll="AllReduce", stats=ParseStats())  # no exception, whatever it holds


def test_a_source_poll_never_raises_for_a_hostile_file(tmp_path):
    p = tmp_path / "x.log"
    p.write_bytes(b"{\"results\": " + b"[" * 100_000 + b"\xff\xfe" + "²".encode() * 1000)
    src = NcclTestsSource(str(p), ts=T)
    assert src.poll() == [] and src.done


def test_a_log_past_the_size_cap_is_read_up_to_it_and_counted(tmp_path):
    # Before: the whole file was read into memory, however large.
    p = tmp_path / "x.log"
    text = new_run("all_reduce_perf", NODE8, ROWS, wrong=3)
    p.write_text(text + "# " + "x" * 10_000 + "\n")
    src = NcclTestsSource(str(p), ts=T, max_chars=len(text) + 100)
    assert len(src.poll()) == 2 and src.summary()["dropped.truncated_log"] == 1 and src.stats.findings
