import gzip

import numpy as np

from pipeline.report.telemetry import load_telemetry
from pipeline.schema import NcclRecord, dcgm, encode
from tests.factories import T0, fleet


def test_series_are_per_gpu_sorted_and_hold_only_wanted_hosts_and_fields(tmp_path):
    recs = fleet(range(10), hosts=2, gpus=2)
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        # Newest first, several records on one line (an array), and a line of garbage.
        fh.write(encode(list(reversed(recs[:20]))) + b"\n{oops\n")
        fh.write(b"".join(encode(r) + b"\n" for r in recs[20:]))
    tel = load_telemetry([path], hosts={"n1"}, fields=["gpu_temp", "sm_clock"])
    assert set(tel.gpus) == {("n1", 0), ("n1", 1)}
    s = tel.gpus[("n1", 0)]
    assert np.all(np.diff(s.ts) > 0) and len(s.ts) == 10
    assert set(s.values) == {"gpu_temp", "sm_clock"} and np.all(s.values["gpu_temp"] == 68)
    assert tel.records == 40 and tel.dead == 1 and tel.hosts_seen == {"n0", "n1"}
    assert (tel.t_min, tel.t_max) == (T0, T0 + 9) and tel.interval == 1.0


def test_either_dcgm_spelling_fills_the_alias_and_missing_is_nan(tmp_path):
    lines = [encode(dcgm(T0, "h", 0, {"DCGM_FI_DEV_GPU_TEMP": 70})),
             encode(dcgm(T0 + 1, "h", 0, {"DCGM_FI_DEV_GPU_TEMP_CELSIUS": 71})),
             encode(dcgm(T0 + 2, "h", 0, {"power": 500}))]
    (tmp_path / "t.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    v = load_telemetry([tmp_path / "t.jsonl"], fields=["gpu_temp"]).gpus[("h", 0)].values["gpu_temp"]
    assert v[:2].tolist() == [70, 71] and np.isnan(v[2])


def test_a_communicator_is_kept_whole_when_one_of_its_ranks_is_wanted(tmp_path):
    def nccl(t, host, gpu, comm):
        return NcclRecord(ts=T0 + t, host=host, gpu=gpu, comm=comm, rank=gpu, nranks=2, coll="AllReduce",
                          bytes=1 << 20, exec_time_us=100.0 + t)
    recs = [nccl(t, h, 0, c) for t in range(3) for h, c in (("a", "c1"), ("b", "c1"), ("z", "c2"))]
    (tmp_path / "n.jsonl").write_bytes(b"".join(encode(r) + b"\n" for r in recs))
    tel = load_telemetry([tmp_path / "n.jsonl"], hosts=set(), nccl_fields=["exec_time_us"], nccl_hosts={"a"})
    assert set(tel.nccl) == {("c1", "a", 0), ("c1", "b", 0)}
    assert tel.nccl[("c1", "b", 0)].values["exec_time_us"].tolist() == [100.0, 101.0, 102.0]
    assert tel.comm_ranks("c1") == [("a", 0), ("b", 0)]
