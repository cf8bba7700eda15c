"""Builders of nccl-tests logs for the producer's tests, from the printf formats of nccl-tests'
src/common.cu and src/util.cu (not copied from a log): the 2.13+ text layout, the older one, and a
JSON output document."""

from __future__ import annotations


T = 1764403200.0


def rank_line(rank: int, host: str, dev: int, pid: int = 4242, *, group: bool = True) -> str:
    if group:  # "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
        return (
            f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {dev:2d} [0000:1b:00] NVIDIA H100 80GB HBM3"
        )
    return f"#   Rank {rank:2d} Pid {pid:6d} on {host:>10s} device {dev:2d} [0x1b] Tesla V100-SXM2-32GB"


def new_run(
    prog: str,
    ranks: list[tuple[int, str, int]],
    rows: list[tuple],
    *,
    redop: str = "sum",
    wrong: int = 0,
    oob: int = 0,
    pid: int = 4242,
) -> str:
    """2.13+ layout: 'Collective test starting', Group in rank lines, #wrong columns."""
    out = [
        "# nccl-tests version 2.17.6 nccl-headers=22803 nccl-library=22803",
        f"# Collective test starting: {prog}",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 "
        "validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    out += [rank_line(r, h, d, pid) for r, h, d in ranks]
    out += [
        "#",
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)",
    ]
    for size, t, bw in rows:
        out.append(
            f"{size:12d}  {size // 4:12d}     float  {redop:>6s}      -1  {t:7.2f}  {bw:6.2f}  {bw:6.2f}  {wrong:6d}"
            f"  {t:7.2f}  {bw:6.2f}  {bw:6.2f}  {0:6d}"
        )
    out += [
        f"# Out of bounds values : {oob} {'FAILED' if oob else 'OK'}",
        "# Avg bus bandwidth    : 1.5 ",
        "#",
        f"# Collective test concluded: {prog}",
        "",
    ]
    return "\n".join(out)


def old_run(ranks: list[tuple[int, str, int]], rows: list[tuple], *, redop: str = "sum", oob: int = 0) -> str:
    """Pre-2.13 layout: no 'Collective test starting', rank lines without Group, 'error' column
    kept with a root column; tests without a reduction print an empty redop cell."""
    out = [
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 validation: 1",
        "#",
        "# Using devices",
    ]
    out += [rank_line(r, h, d, group=False) for r, h, d in ranks]
    out += [
        "#",
        "#                                                     out-of-place                       in-place",
        "#       size         count    type   redop    root     time   algbw   busbw  error     time   algbw   busbw  error",
        "#        (B)    (elements)                             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    for size, t, bw in rows:
        out.append(
            f"{size:12d}  {size // 4:12d}   float  {redop:>6s}      -1  {t:7.2f}  {bw:6.2f}  {bw:6.2f}  0e+00"
            f"  {t:7.2f}  {bw:6.2f}  {bw:6.2f}  0e+00"
        )
    out += [f"# Out of bounds values : {oob} {'FAILED' if oob else 'OK'}", "# Avg bus bandwidth    : 1.5 ", "#", ""]
    return "\n".join(out)


ROWS = [(8, 30.0, 0.0), (1024, 31.5, 0.03)]
NODE8 = [(r, "dgx01", r) for r in range(8)]


def json_doc(**over):
    doc = {
        "args": ["all_reduce_perf"],
        "config": {"devices": [{"rank": 0, "pid": 5, "hostname": "n1", "device": 3}]},
        "results": [
            {
                "size": s,
                "type": "float",
                "redop": "sum",
                "root": -1,
                "out_of_place": {"time": 30.0, "alg_bw": 1.0, "bus_bw": 1.0, "nwrong": 2},
                "in_place": {"time": 30.0, "nwrong": 0},
            }
            for s in (8, 1024, 4096)
        ],
        "out_of_bounds": {"count": 0, "okay": True},
    }
    doc.update(over)
    return doc
