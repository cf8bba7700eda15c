"""NCCL 2.24-2.25's RAS names a missing rank by number only (``The missing rank: 21``): the
producer gives it the host ``unknown``, which is no host. It must not become the alert's host
(an incident grouping hangs of different jobs by it, a page naming node "unknown") nor replace the
host another report of that rank named."""

from __future__ import annotations

import textwrap

from pipeline.hang import RAS_NO_HOST, HangDetector
from producers.ncclras import RasStats, parse
from tests.factories import T0

# v2.24.3-1 / v2.25.1-1: the missing rank by number; its process is dead, but which rank it ran
# is not printed (the DEAD line's process cannot be tied to rank 21).
V224_MISSING = textwrap.dedent("""\
    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      The missing rank: 21
""")

# An earlier status of the same communicator (2.26 and later print the node of each named rank).
V226_LAGGING = textwrap.dedent("""\
    #0-0 (cf264af53edbe986) MISMATCH
      Communicator ranks have different collective operation counts
      31 ranks have launched up to operation 6650
      1 rank has launched up to operation 6640
      Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213
""")


def _alerts(*statuses: tuple[float, str]) -> list:
    recs = []
    for t, text in statuses:
        recs += parse(text, ts=T0 + t, job="pretrain", stats=RasStats())
    det = HangDetector()
    return det.observe(recs) + det.advance(float("inf"))


def test_a_rank_ras_names_by_number_only_gives_an_alert_without_a_host():
    assert [r.host for r in parse(V224_MISSING, ts=T0, job="pretrain", stats=RasStats())] == [RAS_NO_HOST]
    (a,) = _alerts((0.0, V224_MISSING))
    assert a.state == "firing" and a.host is None and a.gpu is None
    assert "rank 21 on an unknown host" in a.summary
    assert "suspect_hosts" not in a.labels


def test_two_jobs_hanging_on_unnamed_ranks_share_no_host():
    recs = parse(V224_MISSING, ts=T0, job="a", stats=RasStats()) + parse(V224_MISSING, ts=T0, job="b", stats=RasStats())
    det = HangDetector()
    got = det.observe(recs) + det.advance(float("inf"))
    assert sorted((a.job, a.host) for a in got) == [("a", None), ("b", None)]


def test_the_node_an_earlier_report_named_is_kept():
    (a,) = [e for e in _alerts((0.0, V226_LAGGING), (30.0, V224_MISSING)) if e.state == "firing"]
    assert a.host == "172.16.64.213" and a.gpu == 5
    assert a.labels["suspect_hosts"] == "172.16.64.213"
    assert "rank 21 on 172.16.64.213 GPU 5" in a.summary
