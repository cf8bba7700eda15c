"""NCCL Inspector output shaped exactly as NVIDIA/nccl's C code writes it (one clause per test says
which file and tag): JSON lines of ``inspector_json.cc``/``inspector.cc`` and both layouts of
``inspector_prom.cc``. Every format version it writes says ``"v4.0"``."""

from __future__ import annotations

import json
import os

from producers.nccl_inspector import InspectorFollower, PromFileSource, bucket_bytes, parse_prom, parse_record

# plugins/profiler/inspector/inspector_json.cc at v2.30.7-1 (73cf1122): jsonKey order, %lf doubles.
META = (
    '"metadata":{"inspector_output_format_version":"v4.0","git_rev":"standalone-build",'
    '"rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1752867229276385,"hostname":"node-a",'
    '"pid":438776}'
)
COLL_230 = (
    '{"header":{"id":"0xe62dedaa97644a","comm_name":"%s","rank":4,"n_ranks":8,"nnodes":1},' + META + ","
    '"coll_perf":{"coll":"ReduceScatter","coll_sn":1231,"coll_msg_size_bytes":2147483648,'
    '"coll_exec_time_us":41057,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":418.439467,'
    '"coll_busbw_gbs":366.134533}}'
)
VERBOSE_P2P_230 = (
    '{"header":{"id":"0xe62dedaa97644a","comm_name":"PP","rank":4,"n_ranks":8,"nnodes":1},' + META + ","
    '"p2p_perf":{"p2p":"Send","p2p_sn":77,"p2p_peer":5,"p2p_msg_size_bytes":1048576,"p2p_exec_time_us":52,'
    '"p2p_timing_source":"kernel_gpu","p2p_algobw_gbs":20.164923,"p2p_busbw_gbs":20.164923,'
    '"event_trace_sn":{"p2p_start_sn":1,"p2p_stop_sn":2,"kernel_events":[{"channel_id":0,"kernel_start_sn":3,'
    '"kernel_stop_sn":5,"kernel_record_sn":4}]},"event_trace_ts":{"p2p_start_ts":1752867229235059,'
    '"p2p_stop_ts":1752867229235064,"kernel_events":[{"channel_id":0,"kernel_start_ts":1752867229235181,'
    '"kernel_stop_ts":1752867229235233,"kernel_record_ts":1752867229235233}]}}}'
)
# ext-profiler/inspector/inspector.cc at v2.28.3-1 (f1308997): no comm_name, coll_perf only.
COLL_228 = (
    '{"header":{"id":"0x7f8c496ae9f661","rank":2,"n_ranks":8,"nnodes":1},' + META + ","
    '"coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,"coll_exec_time_us":61974,'
    '"coll_timing_source":"kernel_gpu","coll_algobw_gbs":"nan","coll_busbw_gbs":"nan"}}'
)


def test_every_json_layout_the_plugin_writes_parses(tmp_path):
    (tmp_path / "node-a-pid438776.log").write_text(
        "\n".join([COLL_230 % "DP Group 0", VERBOSE_P2P_230, COLL_228]) + "\n"
    )
    fol = InspectorFollower(tmp_path, aggregate_ops=False)
    recs = {r.coll: r for r in fol.poll()}
    assert set(recs) == {"ReduceScatter", "Send", "AllReduce"} and fol.summary()["operations"] == 3
    rs, send, ar = recs["ReduceScatter"], recs["Send"], recs["AllReduce"]
    assert (rs.comm, rs.comm_name, rs.rank, rs.nranks, rs.seq, rs.busbw_gbs) == (
        "0xe62dedaa97644a",
        "DP Group 0",
        4,
        8,
        1231,
        366.134533,
    )
    assert (send.labels["peer"], send.bytes, send.exec_time_us, send.comm_name) == ("5", 1048576, 52, "PP")
    assert (ar.comm_name, ar.busbw_gbs, ar.labels["version"], ar.host) == (None, None, "v4.0", "node-a")


def test_unnamed_communicator_placeholder_is_no_name():
    # inspector_json.cc and inspector_prom.cc at v2.30.7-1 (73cf1122) write "unknown" for an unnamed
    # communicator; before the fix it became a communicator name shared by every unnamed one.
    r = parse_record(json.loads(COLL_230 % "unknown"))
    assert (r.comm, r.comm_name) == ("0xe62dedaa97644a", None)
    [p] = parse_prom(PROM_230.format(nranks=8, n_nodes=1, bus=1, t=2), ts=1.0)
    assert p.comm_name is None


# plugins/profiler/inspector/inspector_prom.cc at v2.30.7-1 (73cf1122): labels and "%.6g" values.
PROM_230 = (
    'nccl_bus_bandwidth_gbs{{version="v5.1",slurm_job_id="4242",node="node-a",gpu="GPU3",comm_name="unknown",'
    'n_nodes="{n_nodes}",nranks="{nranks}",collective="AllReduce",message_size="1-2MB",algo_proto="Ring_Simple"}} '
    "{bus}\n"
    'nccl_collective_exec_time_microseconds{{version="v5.1",slurm_job_id="4242",node="node-a",gpu="GPU3",'
    'comm_name="unknown",n_nodes="{n_nodes}",nranks="{nranks}",collective="AllReduce",message_size="1-2MB",'
    'algo_proto="Ring_Simple"}} {t}\n'
)


def test_prom_unnamed_communicators_of_other_sizes_stay_apart():
    # inspector_prom.cc at v2.30.7-1 (73cf1122) buckets by nranks and nnodes too; before the fix a
    # TP and a DP communicator, both "unknown", became one row: the first's labels, the last's values.
    text = PROM_230.format(nranks=8, n_nodes=1, bus=180.5, t=95.25) + PROM_230.format(
        nranks=64, n_nodes=8, bus=41.2, t=512
    )
    recs = sorted(parse_prom(text, ts=1.0), key=lambda r: r.nranks)
    assert [(r.nranks, r.nnodes, r.busbw_gbs, r.exec_time_us) for r in recs] == [
        (8, 1, 180.5, 95.25),
        (64, 8, 41.2, 512),
    ]
    assert all((r.gpu, r.rank, r.job, r.bytes) == (3, 3, "4242", 1 << 20) for r in recs)


# plugins/profiler/inspector/inspector_prom.cc at v2.29.7-1 (b91894bd): per-communicator series.
PROM_229 = "".join(
    f'{metric}{{comm_id="{cid}",hostname="node-b",rank="{rank}",slurm_job="train",slurm_job_id="unknown",'
    f'nranks="16",n_nodes="2",gpu_device_id="GPU5",collective="AllReduce",coll_sn="{sn}",'
    f'timestamp="2025-10-17T03:31:47Z",message_size="2.00GB"}} {value}\n'
    for cid, rank, sn, vals in [
        ("0xd152c00f111816", 13, 228924, (301.2, 527.1, 7130)),
        ("0x5a1e", 5, 17, (9, 15.75, 238609)),
    ]
    for metric, value in zip(
        ("nccl_algorithm_bandwidth_gbs", "nccl_bus_bandwidth_gbs", "nccl_collective_exec_time_microseconds"), vals
    )
)


def test_prom_229_layout_keeps_communicator_rank_and_size():
    # Before the fix: both communicators' series became one row (comm "unknown", rank 0, 0 bytes, no
    # algorithm bandwidth, the reading host's name) and the algorithm bandwidth was an unknown metric.
    counts: dict[str, int] = {}
    recs = sorted(parse_prom(PROM_229, ts=1.0, counts=counts), key=lambda r: r.rank)
    assert [(r.comm, r.rank, r.seq, r.algbw_gbs, r.busbw_gbs, r.exec_time_us) for r in recs] == [
        ("0x5a1e", 5, 17, 9, 15.75, 238609),
        ("0xd152c00f111816", 13, 228924, 301.2, 527.1, 7130),
    ]
    assert all((r.host, r.gpu, r.nranks, r.nnodes, r.bytes) == ("node-b", 5, 16, 2, 2 << 30) for r in recs)
    assert recs[0].labels["rank_source"] == "label" and counts == {}


def test_bucket_bytes_reads_the_229_exact_sizes():
    # inspector_prom.cc at v2.29.7-1 (b91894bd) prints "%zuB" below 1 KiB, else "%.2f<unit>".
    assert (bucket_bytes("512B"), bucket_bytes("1.50KB"), bucket_bytes("2.00GB")) == (512, 1536, 2 << 30)
    assert (bucket_bytes("0B"), bucket_bytes("4-5GB")) == (0, 4 << 30)


def _prom_230(gpu: str, bus: float) -> str:
    return (
        f'nccl_bus_bandwidth_gbs{{version="v5.1",slurm_job_id="7",node="node-a",gpu="{gpu}",comm_name="DP",'
        f'n_nodes="2",nranks="16",collective="AllReduce",message_size="1-2MB",algo_proto="Ring_Simple"}} {bus}\n'
        f'nccl_collective_exec_time_microseconds{{version="v5.1",slurm_job_id="7",node="node-a",gpu="{gpu}",'
        f'comm_name="DP",n_nodes="2",nranks="16",collective="AllReduce",message_size="1-2MB",'
        f'algo_proto="Ring_Simple"}} 95\n'
    )


def test_a_dump_directory_is_read_file_by_file_as_each_is_rewritten(tmp_path):
    # inspector_prom.cc writes nccl_inspector_metrics_<GPU UUID>.prom per GPU into the dump directory.
    uuids = ["GPU-0b5a1f2c-1111-2222-3333-444455556666", "GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff"]
    for k, u in enumerate(uuids):
        (tmp_path / f"nccl_inspector_metrics_{u}.prom").write_text(_prom_230(f"GPU{k}", 100 + k))
    src = PromFileSource(tmp_path)
    recs = sorted(src.poll(), key=lambda r: r.gpu)
    assert [(r.gpu, r.rank, r.busbw_gbs, r.labels["gpu_uuid"]) for r in recs] == [(0, 0, 100, uuids[0]), (1, 1, 101, uuids[1])]
    assert src.poll() == []
    os.utime(tmp_path / f"nccl_inspector_metrics_{uuids[1]}.prom", (1, 1))
    assert [r.labels["gpu_uuid"] for r in src.poll()] == [uuids[1]]


def test_files_of_processes_that_each_see_one_gpu_name_no_gpu_index(tmp_path):
    # A Slurm task per GPU: each process's only device is its CUDA device 0, so every file says GPU0.
    for u in ("GPU-aaaa", "GPU-bbbb"):
        (tmp_path / f"nccl_inspector_metrics_{u}.prom").write_text(_prom_230("GPU0", 50))
    recs = PromFileSource(tmp_path).poll()
    assert sorted(r.labels["gpu_uuid"] for r in recs) == ["GPU-aaaa", "GPU-bbbb"]
    assert all((r.gpu, r.rank, r.labels["rank_source"]) == (None, 0, "unknown") for r in recs)


def test_a_dump_directory_reads_the_plugins_files_only_never_a_link(tmp_path):
    # The dump directory is the job's to write: a link (to a log of gigabytes) or another name is
    # not the plugin's, and is not read.
    (tmp_path / "nccl_inspector_metrics_GPU-aaaa.prom").write_text(_prom_230("GPU0", 10))
    (tmp_path / "other.prom").write_text(_prom_230("GPU1", 20))
    (tmp_path / "elsewhere.txt").write_text(_prom_230("GPU2", 30))
    (tmp_path / "nccl_inspector_metrics_GPU-bbbb.prom").symlink_to(tmp_path / "elsewhere.txt")
    assert [r.busbw_gbs for r in PromFileSource(tmp_path).poll()] == [10]


def test_a_gpu_index_is_ambiguous_only_while_two_gpus_files_claim_it(tmp_path):
    # A job of a process per GPU ends (its files go); the next job's one process names GPU0 rightly.
    a, b = tmp_path / "nccl_inspector_metrics_GPU-aaaa.prom", tmp_path / "nccl_inspector_metrics_GPU-bbbb.prom"
    a.write_text(_prom_230("GPU0", 10))
    b.write_text(_prom_230("GPU0", 20))
    src = PromFileSource(tmp_path)
    assert {r.gpu for r in src.poll()} == {None}
    b.unlink()
    os.utime(a, (5, 5))
    assert [(r.gpu, r.rank) for r in src.poll()] == [(0, 0)]
