"""``produce ncclras`` against what NCCL's RAS prints release by release (v2.24.3-1 to v2.30.7-1):
each fixture follows the format strings of NVIDIA/nccl ``src/ras/client_support.cc`` (the status)
or ``src/ras/client.cc`` (the client) at the tag named beside it, numbers and addresses made up;
each test failed before its fix.
"""

from __future__ import annotations

import textwrap

from producers import ncclras
from producers.ncclras import RasStatusSource
from tests.unit.producers.ras_factories import parse_ras, ras_json


# v2.26.2-1 (the same through v2.30.7-1): a dead process is missing from every communicator it
# had a rank in, and each INCOMPLETE block names its rank there ("Rank %d -- GPU %s managed by
# process %d on node %s"). The 4-rank communicator has 3 ranks left on 3 nodes, so it is group 2.
V226_DEAD_IN_TWO_COMMS = textwrap.dedent("""\
    NCCL version 2.26.2+cuda12.8 compiled with CUDA 12.8
    CUDA runtime version 12080, driver version 12080

    Job summary
    ===========

      Nodes  Processes         GPUs  Processes     GPUs
    (total)   per node  per process    (total)  (total)
          4          8            1         32       32

    Communicators... (2.05s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4       7-8        32        31   RUNNING  INCOMPLETE
        1         7         4         1         4        28   RUNNING      OK
        2         1         3         1         4         3   RUNNING  INCOMPLETE

    Errors
    ======

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213

    #2-0 (5a1b2c3d4e5f6071) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 2 -- GPU 5 managed by process 3487984 on node 172.16.64.213

    Warnings
    ========

    TIMEOUT
      Encountered 2 communication timeouts while gathering communicator data

""")


def test_a_dead_process_makes_its_rank_dead_in_every_communicator():
    # Before: only the first block's rank 21 was dead; rank 2 of #2-0, the same process, "missing".
    recs, stats = parse_ras(V226_DEAD_IN_TWO_COMMS)
    assert {(r.comm, r.rank): (r.state, r.nranks) for r in recs} == {
        ("cf264af53edbe986", 21): ("dead", 32), ("5a1b2c3d4e5f6071", 2): ("dead", 4)}  # fmt: skip
    assert stats.dead_processes == 1 and stats.unranked == 0


# v2.26.2-1: two processes on one node driving the same GPU (ranks of different communicators):
# the one under INCOMPLETE did not answer this time, the one under DEAD is dead. A rank line
# names its process, and so does the DEAD line: the GPU alone does not tell them apart.
V226_SHARED_GPU = textwrap.dedent("""\
    Errors
    ======

    INCOMPLETE
      Missing communicator data from 1 job process
      Process 3487990 on node 172.16.64.213 managing GPU 5

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 21 -- GPU 5 managed by process 3487990 on node 172.16.64.213

    #1-0 (5a1b2c3d4e5f6071) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 1 -- GPU 5 managed by process 3487984 on node 172.16.64.213

""")


def test_a_dead_process_is_matched_by_its_pid_not_by_a_gpu_another_process_shares():
    # Before: rank 21 (the live process) was dead and rank 1 (the dead one) only missing.
    recs, stats = parse_ras(V226_SHARED_GPU)
    assert {r.rank: (r.state, r.host, r.gpu) for r in recs} == {
        21: ("missing", "172.16.64.213", 5), 1: ("dead", "172.16.64.213", 5)}  # fmt: skip
    assert stats.unranked == 0


# v2.24.3-1 (and v2.25.1-1), verbose: "The missing ranks: %s" holds up to 1023 characters of rank
# numbers, a few characters a record; blocks of them (or JSON ranks) make records without end.
def _list_blocks(n_blocks: int) -> tuple[str, int]:
    listed = ",".join(str(r) for r in range(300))[:1023].rsplit(",", 1)[0]  # ranks 0 to 282, uncut
    n = listed.count(",") + 1
    text = "".join(
        f"#0-{i} ({i:016x}) INCOMPLETE\n  Missing communicator data from {n} ranks\n  The missing ranks: {listed}\n\n"
        for i in range(n_blocks)
    )
    return text, n_blocks * n


def test_the_ranks_one_input_names_are_bounded_and_the_rest_counted(monkeypatch):
    # Before: every name was a record (1 MiB of such lists: 480,000 records, 251 MiB, 18 s).
    monkeypatch.setattr(ncclras, "MAX_RECORDS", 1000, raising=False)
    text, named = _list_blocks(10)
    recs, stats = parse_ras(text)
    assert len(recs) == 1000 and stats.summary()["dropped.too_many_records"] == named - 1000
    ranks = [(r, "10.0.0.5", 4242, 7) for r in range(1500)]
    recs, stats = parse_ras(ras_json(0xAE94423CFBB2EF4A, ranks, []))  # v2.28.7-1: every rank a record
    assert len(recs) == 1000 and stats.summary()["dropped.too_many_records"] == 500


# v2.26.2-1: a status longer than the reader takes (max_chars) ends in part of a line.
V226_LAGGING = textwrap.dedent("""\
    Warnings
    ========

    #0-0 (27a079b828ff1a75) MISMATCH
      Communicator ranks have different AllReduce operation counts
      30 ranks have launched up to operation 6650
      2 ranks have launched up to operation 6649
      Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210
      Rank 2 -- GPU 2 managed by process 483074 on node 172.16.64.210

""")


def test_a_line_cut_by_the_read_limit_is_not_read_as_whole(tmp_path):
    # Before: "... on node 172.16.64.21" gave rank 2 a host it is not on.
    p = tmp_path / "ras.txt"
    p.write_text(V226_LAGGING)
    src = RasStatusSource(str(p), max_chars=V226_LAGGING.index("172.16.64.210\n\n") + len("172.16.64.21"))
    recs = src.poll()
    assert [(r.rank, r.host) for r in recs] == [(0, "172.16.64.210")]
    assert src.summary()["dropped.truncated_log"] == 1


# v2.28.7-1 on, src/ras/client.cc: the client writes its own messages to stderr, before the status
# when the 1 s handshake timed out and it connected again ("Connection timed out; retrying...") or
# when getaddrinfo's first address refused ("Connecting to %s:%s: %s"); `2>&1` keeps them.
def test_json_after_the_clients_own_messages_is_read():
    doc = ras_json(0x3F0C1B2D4E5A6978, [(0, "10.0.0.5", 4242, 120), (1, "10.0.0.6", 4243, 119)], [])
    for before in ("Connection timed out; retrying...\n", "Connecting to ::1:28028: Connection refused\n"):
        recs, stats = parse_ras(before + doc)
        # Before: read as text, no line of it RAS's: no record, and the CLI's "not one line" exit 3.
        assert {r.rank: r.state for r in recs} == {0: "progress", 1: "lagging"} and stats.recognised
