"""``produce ncclras`` against the job-level process lists of NCCL's RAS status and captures
appended to one file: each fixture follows the format strings of NVIDIA/nccl
``src/ras/client_support.cc`` (``rasClientRunComms``) at the tag named beside it, numbers and
addresses made up; each test failed before its fix.
"""

from __future__ import annotations

import textwrap

from tests.unit.producers.ras_factories import parse_ras


# v2.26.2-1 (the same through v2.29.7-1 and HEAD): the Errors section opens with "INCOMPLETE\n  Missing
# communicator data from %d job process%s" and, the count being an outlier, "  Process %d on node %s
# managing GPU%s %s" for each process that did not answer. Process 3487990 has rank 21 of #0-0 (named);
# process 3488001 drives GPUs 0-7 of a 16-rank communicator whose 8 missing ranks are too many to
# list (rasCountIsOutlier: at most 25 %), so no block names a rank of it.
V226_JOB_INCOMPLETE = textwrap.dedent("""\
    NCCL version 2.26.2+cuda12.8 compiled with CUDA 12.8
    CUDA runtime version 12080, driver version 12080

    Communicators... (2.051s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4       7-8        32        31   RUNNING  INCOMPLETE
        1         1         2         8        16         8   RUNNING  INCOMPLETE

    Errors
    ======

    INCOMPLETE
      Missing communicator data from 2 job processes
      Process 3487990 on node 172.16.64.213 managing GPU 5
      Process 3488001 on node 172.16.64.214 managing GPUs 0,1,2,3,4,5,6,7

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 21 -- GPU 5 managed by process 3487990 on node 172.16.64.213

    #1-0 (5a1b2c3d4e5f6071) INCOMPLETE
      Missing communicator data from 8 ranks

    Warnings
    ========

""")


def test_the_job_level_incomplete_processes_are_read_and_those_without_a_named_rank_counted():
    # Before: the list was passed over unread; nothing said RAS named a process whose ranks no
    # record carries (3488001). Its processes name no rank, so they make no record of their own:
    # rank 21 is missing (not dead) either way.
    recs, stats = parse_ras(V226_JOB_INCOMPLETE)
    assert [(r.comm, r.rank, r.state, r.host, r.gpu, r.nranks) for r in recs] == [
        ("cf264af53edbe986", 21, "missing", "172.16.64.213", 5, 32)]  # fmt: skip
    summary = stats.summary()
    assert summary["missing_processes"] == 2 and summary["unranked_missing_processes"] == 1
    assert summary["dead_processes"] == 0 and summary["unranked_dead_processes"] == 0


# v2.26.2-1: two captures appended to one file, a minute apart. In the first, process 3487990 did not
# answer (job-level INCOMPLETE) and group 0 holds the 32-rank communicator; in the second it is DEAD,
# the 32-rank communicator is gone and group 0 is the 4-rank one. "#G-C" numbers the groups of the
# table printed with it (vcIdx), and the process lists describe that status only.
V226_TWO_CAPTURES = textwrap.dedent("""\
    NCCL version 2.26.2+cuda12.8 compiled with CUDA 12.8
    CUDA runtime version 12080, driver version 12080

    Communicators... (2.051s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4       7-8        32        31   RUNNING  INCOMPLETE

    Errors
    ======

    INCOMPLETE
      Missing communicator data from 1 job process
      Process 3487990 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 21 -- GPU 5 managed by process 3487990 on node 172.16.64.213

    Warnings
    ========

    NCCL version 2.26.2+cuda12.8 compiled with CUDA 12.8
    CUDA runtime version 12080, driver version 12080

    Communicators... (0.012s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         3         1         4         3   RUNNING  INCOMPLETE

    Errors
    ======

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487990 on node 172.16.64.213 managing GPU 5

    #0-0 (5a1b2c3d4e5f6071) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 2 -- GPU 5 managed by process 3487990 on node 172.16.64.213

    Warnings
    ========

""")


def test_appended_captures_are_each_matched_within_themselves():
    # Before: the second capture's DEAD made the first capture's rank 21 dead, and its table (group
    # 0: 4 ranks) gave rank 21 of the 32-rank communicator no size.
    recs, stats = parse_ras(V226_TWO_CAPTURES)
    assert [(r.comm, r.rank, r.state, r.nranks) for r in recs] == [
        ("cf264af53edbe986", 21, "missing", 32), ("5a1b2c3d4e5f6071", 2, "dead", 4)]  # fmt: skip
    summary = stats.summary()
    assert summary["missing_processes"] == 1 and summary["unranked_missing_processes"] == 0
    assert summary["dead_processes"] == 1 and summary["unranked_dead_processes"] == 0
    assert summary["dropped.cut_status"] == 0


def test_processes_ras_could_not_name_are_counted():
    # client_support.cc (v2.26.2-1 to HEAD) ends a DEAD or INCOMPLETE list with "  [could not find
    # information on %d process%s]" for processes it has no pid or node of; they were passed over.
    text = V226_JOB_INCOMPLETE.replace(
        "managing GPUs 0,1,2,3,4,5,6,7\n", "managing GPUs 0,1,2,3,4,5,6,7\n  [could not find information on 3 processes]\n"
    )
    recs, stats = parse_ras(text)
    assert len(recs) == 1 and stats.summary()["unidentified_processes"] == 3
    assert stats.summary()["dropped.unparsable_line"] == 0
