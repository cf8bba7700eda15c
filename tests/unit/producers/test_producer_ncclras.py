"""``gpuwarden produce ncclras``: NCCL RAS status output, text and ``-f json``, becomes a
progress record for every rank RAS names (behind, missing, dead, in error).

``DOC_*`` are the sample outputs of NVIDIA/nccl ``docs/userguide/source/troubleshooting/ras.rst``
@ 5067397c (2.24-2.29), dedented as the tool prints them (the page indents its code blocks).
``NEW_*`` lines follow the format strings of ``src/ras/client_support.cc`` @ 5067397c for what
the page shows no sample of (per-operation counts since 2.26, a group of one, the missing rank
with its process, an asynchronous error); their numbers and addresses are made up.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.ncclras import RasStatusSource
from tests.factories import fuzz_examples
from tests.unit.producers.ras_factories import (
    DOC_HEALTHY,
    DOC_JSON,
    DOC_MISMATCH,
    DOC_STATUS,
    NEW_INCOMPLETE,
    parse_ras,
)


DOC_DEAD = textwrap.dedent("""\
    Communicators... (2.05s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4       7-8        32        32   RUNNING  INCOMPLETE

    Errors
    ======

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      The missing rank: 21

    Warnings
    ========

    TIMEOUT
      Encountered 2 communication timeouts while gathering communicator data
""")


NEW_PER_OP = textwrap.dedent("""\
    Warnings
    ========

    #1-0 (00000000deadbeef) MISMATCH
      Communicator ranks have different AllReduce operation counts
      7 ranks have launched up to operation 120
      Rank 6 has launched up to operation 119 -- GPU 6 managed by process 1200 on node gpu-node-3
      Communicator ranks have different Broadcast operation counts
      7 ranks have launched up to operation 4
      Rank 2 has launched up to operation 5 -- GPU 2 managed by process 1196 on node gpu-node-3
""")


def test_a_healthy_job_names_no_rank():
    recs, stats = parse_ras(DOC_HEALTHY)
    assert recs == [] and stats.summary()["dropped.unparsable_line"] == 0


def test_a_count_mismatch_names_the_ranks_behind_as_lagging():
    recs, stats = parse_ras(DOC_MISMATCH)
    assert [r.rank for r in recs] == [0, 2, 3, 4, 5, 7]
    assert {r.state for r in recs} == {"lagging"}
    r = recs[0]
    assert (r.host, r.gpu, r.comm, r.nranks, r.last_enqueued, r.job, r.source) == (
        "172.16.64.210", 0, "27a079b828ff1a75", 32, 6649, "pretrain", "ras")
    assert r.labels["ras.max_ops"] == "6650" and "ras.op" not in r.labels
    assert stats.communicators == 1


def test_per_operation_counts_judge_each_operation_apart():
    recs, _ = parse_ras(NEW_PER_OP)
    got = {r.rank: (r.state, r.last_enqueued, r.labels["ras.op"]) for r in recs}
    # Rank 6 is one AllReduce behind; rank 2 one Broadcast ahead (the others wait for it).
    assert got == {6: ("lagging", 119, "AllReduce"), 2: ("progress", 5, "Broadcast")}


def test_a_status_mismatch_in_transition_makes_no_record():
    recs, stats = parse_ras(DOC_STATUS)
    assert recs == [] and stats.transitional == 6
    aborted, _ = parse_ras(DOC_STATUS.replace("Rank 20 -- GPU 4", "Rank 20 has status ABORT -- GPU 4"))
    assert [(r.rank, r.state, r.labels["ras.error"]) for r in aborted] == [(20, "error", "ABORT")]


def test_the_24_missing_rank_line_is_missing_without_a_node():
    recs, stats = parse_ras(DOC_DEAD)
    assert [(r.rank, r.state, r.host, r.nranks) for r in recs] == [(21, "missing", "unknown", 32)]
    assert stats.dead_processes == 1 and stats.unranked == 1


def test_a_missing_rank_on_a_dead_process_is_dead_and_async_errors_are_errors():
    recs, _ = parse_ras(NEW_INCOMPLETE)
    got = {r.rank: (r.state, r.host, r.gpu) for r in recs}
    assert got == {21: ("dead", "172.16.64.213", 5), 13: ("error", "172.16.64.212", 6)}  # NVML index
    assert next(r for r in recs if r.rank == 13).labels["ras.error"] == "Remote process error"


def test_json_names_every_rank_and_the_missing_one():
    recs, stats = parse_ras(DOC_JSON)
    got = {r.rank: (r.state, r.host, r.gpu, r.nranks, r.last_enqueued) for r in recs}
    assert got == {0: ("progress", "172.16.64.245", 0, 2, 0), 1: ("missing", "172.16.64.245", 1, 2, None)}
    import time
    assert time.localtime(recs[0].ts)[:6] == (2025, 12, 19, 13, 6, 53)


def test_json_counts_behind_the_highest_are_lagging_and_flags_are_errors():
    doc = json.loads(DOC_JSON)
    c = doc["communicators"][0]
    r0 = c["ranks"][0]
    c["ranks"] = [dict(r0, collective_counts={"AllReduce": 10}), dict(r0, rank=1, collective_counts={"AllReduce": 9}),
                  dict(r0, rank=2, status={"async_error": 6}, collective_counts={"AllReduce": 10})]
    c["size"], c["missing_ranks"] = 4, [dict(c["missing_ranks"][0], rank=3, status={"considered_dead": True})]
    recs, _ = parse_ras(json.dumps(doc))
    assert {r.rank: r.state for r in recs} == {0: "progress", 1: "lagging", 2: "error", 3: "dead"}


def test_every_record_passes_the_decoder():
    recs = [r for t in (DOC_MISMATCH, DOC_DEAD, NEW_INCOMPLETE, NEW_PER_OP, DOC_JSON) for r in parse_ras(t)[0]]
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
    assert len(out.records) == len(recs) == 13 and not out.dead


def test_the_source_reads_a_file_once(tmp_path):
    p = tmp_path / "ras.txt"
    p.write_text(DOC_MISMATCH)
    src = RasStatusSource(str(p), job="j")
    assert len(src.poll()) == 6 and src.poll() == [] and src.summary()["records"] == 6


# -- hostile input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, reason",
    [
        (("Rank 3 --", "Rank ３ --"), "dropped.bad_number"),  # a full-width digit
        (("Rank 3 --", "Rank 99999999999 --"), "dropped.bad_number"),
        (("GPU 3 managed", "GPU 9999 managed"), "dropped.bad_number"),
        (("process 483075", "process 4e5"), "dropped.bad_number"),
        (("Rank 3 -- GPU 3 managed by process 483075 on node 172.16.64.210", "Rank 3 -- GPU 3 managed by"),
         "dropped.unparsable_line"),  # cut short
    ],
)
def test_a_hostile_rank_line_is_counted_and_costs_only_itself(change, reason):
    recs, stats = parse_ras(DOC_MISMATCH.replace(*change))
    assert [r.rank for r in recs] == [0, 2, 4, 5, 7]
    assert stats.summary()[reason] == 1


def test_a_block_header_whose_number_is_not_one_drops_its_lines_counted():
    recs, stats = parse_ras(DOC_MISMATCH.replace("#0-0 (27a0", "#٣-0 (27a0") + NEW_PER_OP.split("========\n", 1)[1])
    assert [r.rank for r in recs] == [6, 2]  # the next block is read
    assert stats.bad_number == 1 and stats.orphan == 9


def test_a_garbage_group_count_is_counted_and_its_ranks_carry_no_count():
    recs, stats = parse_ras(DOC_MISMATCH.replace("up to operation 6649", "up to operation 66٤9"))
    assert stats.bad_number == 1 and all(r.last_enqueued is None for r in recs)


def test_huge_lines_and_hostile_json_cost_only_themselves():
    recs, stats = parse_ras(DOC_MISMATCH.replace("Rank 4 --", "x" * 70_000 + "\nRank 4 --"))
    assert len(recs) == 6 and stats.oversize == 1
    doc = json.loads(DOC_JSON)
    c = doc["communicators"][0]
    c["ranks"].append({"rank": "one", "host": "h"})
    c["ranks"].append({"rank": 2**70, "host": "h"})
    c["ranks"].append({"rank": 4, "host": 7})
    c["ranks"].append([1, 2])
    doc["communicators"].append({"hash": 5})
    deep = json.dumps(doc)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    recs, stats = parse_ras(deep)
    assert sorted(r.rank for r in recs) == [0, 1] and stats.bad_json_values >= 5
    assert parse_ras("{not json")[0] == []


NUM = st.sampled_from(["0", "12", "²", "٣", "9" * 400, "1e400", "-1", "", "１", "0x10"])
HOSTILE = st.one_of(
    st.text(max_size=80),
    st.builds(lambda r, g, p: f"  Rank {r} -- GPU {g} managed by process {p} on node n9", NUM, NUM, NUM),
    st.builds(lambda r, o: f"  Rank {r} has launched up to operation {o} -- GPU 1 managed by process 5 on node n9",
              NUM, NUM),  # fmt: skip
    st.builds(lambda k, o: f"  {k} ranks have launched up to operation {o}", NUM, NUM),
    st.builds(lambda r: f"  The missing rank: {r}", NUM),
    st.just("  Rank 3 -- GPU 3 managed by"),
)


@settings(max_examples=fuzz_examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(HOSTILE, max_size=10))
def test_fuzz_hostile_lines_inside_a_block_cost_only_themselves(lines):
    # A line that is a good block header starts a block of its own: not a hostile line.
    assume(not any(re.match(r"#\d+-\d+ \(", h.strip()) for h in lines))  # \d: Unicode digits too
    head, tail = DOC_MISMATCH.split("  Rank 0 --", 1)
    text = head + "".join(h.replace("\n", " ").replace("\r", " ") + "\n" for h in lines) + "  Rank 0 --" + tail
    recs, _ = parse_ras(text)
    assert {0, 2, 3, 4, 5, 7} <= {r.rank for r in recs if r.comm == "27a079b828ff1a75" and r.host == "172.16.64.210"}
    out = Decoder().decode(b"[" + b",".join(encode(r) for r in recs) + b"]", "f:1")
    assert len(out.records) == len(recs) and not out.dead
