"""Builders of NCCL Inspector JSON "v4.1-v4.3" lines for the producer's tests: a dump's header and
metadata, a collective's ``coll_perf`` and a per-dump ``dump_stats`` record."""

from __future__ import annotations


HDR = {"id": "0x7f8c496ae9f661", "comm_name": "DP Group 0", "rank": 2, "n_ranks": 8, "nnodes": 1}


def meta(version: str) -> dict:
    return {
        "inspector_output_format_version": version,
        "git_rev": "",
        "rec_mechanism": "nccl_profiler_interface",
        "dump_timestamp_us": 1748030377748202,
        "hostname": "node-a",
        "pid": 1639453,
    }


def coll(sn: int, *, algo: str | None = "RING", proto: str | None = "LL", t: float = 61974, **extra) -> dict:
    perf = {
        "coll": "AllReduce",
        "coll_sn": sn,
        "coll_msg_size_bytes": 17179869184,
        "coll_exec_time_us": t,
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": 277.2,
        "coll_busbw_gbs": 485.1,
    }
    if algo is not None:
        perf["coll_algo"] = algo
    if proto is not None:
        perf["coll_proto"] = proto
    return {"coll_perf": {**perf, **extra}}


def dump_stats(version: str, *, since: int | None = None, total: int | None = None, with_context: bool = True) -> dict:
    st = {"coll_records": 1024, "p2p_records": 0, "p2p_dropped_total": 0}
    if since is not None:
        st["coll_dropped_since_last_dump"] = since
        st["p2p_dropped_since_last_dump"] = 0
    if total is not None:
        st["coll_dropped_total"] = total
    obj = {"dump_stats": st}
    if with_context:
        obj = {"header": HDR, "metadata": meta(version), **obj}
    return obj
