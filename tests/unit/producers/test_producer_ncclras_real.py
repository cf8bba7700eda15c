"""``produce ncclras`` against the layouts NCCL's RAS really prints that the documented samples
do not show: each fixture follows the format strings of NVIDIA/nccl ``src/ras/client_support.cc``
at the tag named beside it (numbers and addresses made up), and each test failed before its fix.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.unit.producers.ras_factories import V226_AHEAD, parse_ras, ras_json


# v2.24.3-1 (and v2.25.1-1): ranks that report no data on a communicator are UNKNOWN, listed by
# number only ("The unknown ranks: %s", or "Rank %s has status %s" for one); 2.26 made them NOCOMM.
V224_UNKNOWN = textwrap.dedent("""\
    Warnings
    ========

    #0-0 (9e17999afaa87dbb) MISMATCH
      Communicator ranks have different status
      27 ranks have status RUNNING
      2 ranks have status FINALIZE
      Rank 4 -- GPU 4 managed by process 507289 on node 172.16.64.210
      Rank 20 -- GPU 4 managed by process 3500075 on node 172.16.64.213
      2 ranks have status UNKNOWN
      The unknown ranks: 30,31
      Rank 29 has status UNKNOWN

""")


def test_224_unknown_ranks_are_transitional_not_unparsable():
    recs, stats = parse_ras(V224_UNKNOWN)
    assert recs == [] and stats.unparsable == 0
    assert stats.transitional == 5  # FINALIZE 4 and 20, UNKNOWN 30, 31 and 29


# v2.26.2-1 on: a DEAD process's GPUs are rasGpuDevsToString's "0,1", with " (NVML 4,5)" when the
# CUDA indices differ (CUDA_VISIBLE_DEVICES); a missing rank's GPU is "c (NVML n)" the same way.
@pytest.mark.parametrize(
    "processes",
    [
        # one GPU per process, each seeing its own as CUDA device 0 (a Slurm task per GPU)
        "  2 job processes are considered dead (unreachable via the RAS network)\n"
        "  Process 3487984 on node 172.16.64.213 managing GPU 0 (NVML 4)\n"
        "  Process 3487985 on node 172.16.64.213 managing GPU 0 (NVML 5)\n",
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        "  Process 3487984 on node 172.16.64.213 managing GPUs 0,1 (NVML 4,5)\n",
    ],
)
def test_a_dead_processs_ranks_with_nvml_gpus_are_dead(processes):
    text = (
        "Errors\n======\n\nDEAD\n" + processes + "\n"
        "#0-0 (cf264af53edbe986) INCOMPLETE\n"
        "  Missing communicator data from 2 ranks\n"
        "  Rank 20 -- GPU 0 (NVML 4) managed by process 3487984 on node 172.16.64.213\n"
        f"  Rank 21 -- GPU {0 if 'GPU 0 (NVML 5)' in processes else 1} (NVML 5) managed by process "
        f"{3487985 if 'GPU 0 (NVML 5)' in processes else 3487984} on node 172.16.64.213\n\n"
    )
    recs, stats = parse_ras(text)
    assert {r.rank: (r.state, r.gpu) for r in recs} == {20: ("dead", 4), 21: ("dead", 5)}
    assert stats.unranked == 0


# v2.24.3-1 (and v2.25.1-1): the missing ranks are listed with snprintf into lineBuf[1024], so a
# verbose report of many keeps 1023 characters and may end in part of a number.
def test_a_cut_224_missing_rank_list_drops_its_last_number():
    listed = ",".join(str(r) for r in range(1000, 1300))[:1023]
    assert listed.endswith(",120")  # rank 1204, cut: rank 120 never went missing
    text = (
        "#0-0 (cf264af53edbe986) INCOMPLETE\n"
        "  Missing communicator data from 300 ranks\n"
        f"  The missing ranks: {listed}\n\n"
    )
    recs, stats = parse_ras(text)
    assert [r.rank for r in recs] == list(range(1000, 1204))
    assert stats.bad_number == 1


def test_the_2287_json_without_a_comma_after_a_missing_ranks_nvml_dev_is_read():
    doc = ras_json(0x3F0C1B2D4E5A6978, [(0, "10.0.0.5", 4242, 120)], [(1, "10.0.0.5", 4243, True, False)],
                    comma=False)  # fmt: skip
    with pytest.raises(json.JSONDecodeError):
        json.loads(doc)  # as 2.28.7 prints it
    recs, _ = parse_ras(doc)
    assert {r.rank: (r.state, r.last_enqueued) for r in recs} == {0: ("progress", 120), 1: ("missing", None)}


def test_a_json_hash_is_the_texts_16_digits():
    # jsonStartCommunicator prints "0x%lx"; the text's #G-C header prints "%016lx" (v2.28.7-1).
    text = (
        "#0-0 (00c3a1e5b7d90f12) INCOMPLETE\n  Missing communicator data from 1 rank\n"
        "  Rank 1 -- GPU 1 managed by process 4243 on node 10.0.0.5\n\n"
    )
    doc = ras_json(0x00C3A1E5B7D90F12, [(0, "10.0.0.5", 4242, 7)], [(1, "10.0.0.5", 4243, True, False)])
    assert '"hash": "0xc3a1e5b7d90f12"' in doc
    assert {r.comm for r in parse_ras(text)[0]} == {r.comm for r in parse_ras(doc)[0]} == {"00c3a1e5b7d90f12"}


def test_a_json_missing_rank_that_answered_is_the_texts_nocomm_not_missing():
    # v2.29.2-1: "unresponsive" false is a rank whose process answered but is no longer a member
    # (the text prints it as NOCOMM in a status MISMATCH); a dead one stays dead.
    doc = ras_json(0xAE94423CFBB2EF4A, [(0, "10.0.0.5", 4242, 7)],
                    [(1, "10.0.0.5", 4243, False, False), (2, "10.0.0.6", 4300, True, True)])  # fmt: skip
    recs, stats = parse_ras(doc)
    assert {r.rank: r.state for r in recs} == {0: "progress", 2: "dead"}
    assert stats.transitional == 1


def test_named_ranks_ahead_of_the_unnamed_majority_are_progress():
    recs, stats = parse_ras(V226_AHEAD)
    assert {r.rank: (r.state, r.last_enqueued, r.nranks) for r in recs} == {
        9: ("progress", 513, 32), 10: ("progress", 513, 32)}  # fmt: skip
    assert stats.unparsable == 0
