"""Helpers of the NCCL RAS producer's tests."""

from __future__ import annotations

import json
import textwrap

from producers.ncclras import RasStats, parse
from tests.factories import T0


def parse_ras(text: str) -> tuple[list, RasStats]:
    """The records ``text`` gives (job ``pretrain``, read at ``T0``) and the counts of reading it."""
    stats = RasStats()
    return parse(text, ts=T0, job="pretrain", stats=stats), stats


# ``DOC_*``: the sample outputs of NVIDIA/nccl ``docs/userguide/source/troubleshooting/ras.rst``
# @ 5067397c, dedented as the tool prints them; ``NEW_*``: lines from the format strings of
# ``src/ras/client_support.cc`` @ 5067397c, their numbers and addresses made up (see
# test_producer_ncclras.py).
DOC_HEALTHY = textwrap.dedent("""\
    Job summary
    ===========

      Nodes  Processes         GPUs  Processes     GPUs
    (total)   per node  per process    (total)  (total)
          4          8            1         32       32

    Communicators... (0.00s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         8         4         1         4        32   RUNNING      OK
""")

DOC_MISMATCH = textwrap.dedent("""\
    Communicators... (0.00s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4         8        32        32   RUNNING  MISMATCH

    Warnings
    ========

    #0-0 (27a079b828ff1a75) MISMATCH
      Communicator ranks have different collective operation counts
      26 ranks have launched up to operation 6650
      6 ranks have launched up to operation 6649
      Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210
      Rank 2 -- GPU 2 managed by process 483074 on node 172.16.64.210
      Rank 3 -- GPU 3 managed by process 483075 on node 172.16.64.210
      Rank 4 -- GPU 4 managed by process 483076 on node 172.16.64.210
      Rank 5 -- GPU 5 managed by process 483077 on node 172.16.64.210
      Rank 7 -- GPU 7 managed by process 483079 on node 172.16.64.210
""")

DOC_STATUS = textwrap.dedent("""\
    #0-0 (9e17999afaa87dbb) MISMATCH
      Communicator ranks have different status
      26 ranks have status UNKNOWN
      4 ranks have status RUNNING
      Rank 0 -- GPU 0 managed by process 507285 on node 172.16.64.210
      Rank 8 -- GPU 0 managed by process 1598388 on node 172.16.64.212
      Rank 16 -- GPU 0 managed by process 3500071 on node 172.16.64.213
      Rank 24 -- GPU 0 managed by process 2405067 on node 172.16.64.222
      2 ranks have status FINALIZE
      Rank 4 -- GPU 4 managed by process 507289 on node 172.16.64.210
      Rank 20 -- GPU 4 managed by process 3500075 on node 172.16.64.213
""")

NEW_INCOMPLETE = textwrap.dedent("""\
    Errors
    ======

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213

    #0-0 (cf264af53edbe986) ERROR
      Asynchronous error on 1 rank
      Rank 13 reported Remote process error -- GPU 5 (NVML 6) managed by process 3487976 on node 172.16.64.212
""")

DOC_JSON = json.dumps({
    "nccl_version": "2.29.1", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
    "timestamp": "2025-12-19 13:06:53", "communicators_count": 1,
    "communicators": [{
        "hash": "0xae94423cfbb2ef4a", "secondary_hash": "0xb7e7187447156001:0xb8242ed28a71381e", "size": 2,
        "ranks_count": 1, "missing_ranks_count": 1,
        "ranks": [{"rank": 0, "host": "172.16.64.245", "pid": 1524344, "cuda_dev": 0, "nvml_dev": 0,
                   "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                              "abort_flag": False},
                   "collective_counts": {"Broadcast": 0, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0,
                                         "AllReduce": 0}}],
        "missing_ranks": [{"rank": 1, "host": "172.16.64.245", "pid": 1524345, "cuda_dev": 1, "nvml_dev": 1,
                           "status": {"unresponsive": True, "considered_dead": False}}],
    }],
    "ras": {"collection_time_sec": 0.000, "timeouts_count": 0},
}, indent=2)  # fmt: skip


def ras_json(comm_hash, ranks, missing, *, comma=True):
    """A ``ncclras -f json`` document as jsonWriteHeader ... jsonWriteFooter print it (v2.28.7-1;
    ``comma=False``: 2.28.7-2.28.9's missing rank, no comma after ``nvml_dev``, fixed in v2.29.2-1)."""
    out = ['{\n  "nccl_version": "2.28.7",\n  "cuda_runtime_version": 12090,\n  "cuda_driver_version": 12090,\n'
           '  "timestamp": "2025-11-29 09:00:00",\n  "communicators_count": 1,\n  "communicators": [\n',
           f'    {{\n      "hash": "0x{comm_hash:x}",\n      "secondary_hash": "0x1f:0x2e",\n'
           f'      "size": {len(ranks) + len(missing)},\n      "ranks_count": {len(ranks)},\n'
           f'      "missing_ranks_count": {len(missing)},\n      "ranks": [\n']  # fmt: skip
    for i, (rank, host, pid, ops) in enumerate(ranks):
        out.append(",\n" if i else "")
        out.append(f'        {{\n          "rank": {rank},\n          "host": "{host}",\n          "pid": {pid},\n'
                   f'          "cuda_dev": {rank % 8},\n          "nvml_dev": {rank % 8},\n'
                   '          "status": {\n            "init_state": 0,\n            "async_error": 0,\n'
                   '            "finalize_called": false,\n            "destroy_flag": false,\n'
                   '            "abort_flag": false\n          },\n          "collective_counts": {\n'
                   '            "Broadcast": 0,\n            "Reduce": 0,\n            "AllGather": 0,\n'
                   f'            "ReduceScatter": 0,\n            "AllReduce": {ops}\n          }}\n        }}')  # fmt: skip
    out.append('\n      ],\n      "missing_ranks": [\n')
    for i, (rank, host, pid, unresponsive, dead) in enumerate(missing):
        out.append(",\n" if i else "")
        out.append(f'        {{\n          "rank": {rank},\n          "host": "{host}",\n          "pid": {pid},\n'
                   f'          "cuda_dev": {rank % 8},\n          "nvml_dev": {rank % 8}{"," if comma else ""}\n'
                   f'          "status": {{\n            "unresponsive": {json.dumps(unresponsive)},\n'
                   f'            "considered_dead": {json.dumps(dead)}\n          }}\n        }}')  # fmt: skip
    out.append(
        '\n      ]\n    }\n  ],\n  "ras": {\n    "collection_time_sec": 0.002,\n    "timeouts_count": 0\n  }\n}\n'
    )
    return "".join(out)


# v2.26.2-1: the layout NVIDIA/nccl#1911 shows from a 2.26.2 job: per-operation counts, the two
# ranks named are ahead of the 30 others (which RAS does not name).
V226_AHEAD = textwrap.dedent("""\
    NCCL version 2.26.2+cuda12.6 compiled with CUDA 12.6
    CUDA runtime version 12060, driver version 12060

    Job summary
    ===========

      Nodes  Processes         GPUs  Processes     GPUs
    (total)   per node  per process    (total)  (total)
          4          8            1         32       32

    Communicators... (0.00s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4         8        32        32   RUNNING  MISMATCH

    Errors
    ======

    Warnings
    ========

    #0-0 (5d0e3c1b2a497f68) MISMATCH
      Communicator ranks have different AllGather operation counts
      30 ranks have launched up to operation 512
      2 ranks have launched up to operation 513
      Rank 9 -- GPU 1 managed by process 20011 on node 10.0.1.12
      Rank 10 -- GPU 2 managed by process 20012 on node 10.0.1.12

""")
