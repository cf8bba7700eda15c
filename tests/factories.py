"""Test data factories: records and series built from a few parameters, never copied fixtures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from pipeline.schema import DcgmRecord, ProgressRecord, dcgm
from pipeline.canonical import record_identity, repeat_key

T0 = 1764403200.0  # 2025-11-29T08:00:00Z


def fuzz_examples(default: int) -> int:
    """A property test's example budget: ``default`` in `make test`, scaled by
    ``GPUWARDEN_FUZZ_EXAMPLES`` (300 is the default scale) for a longer hunt."""
    return max(1, round(default * int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300")) / 300))

HEALTHY = {"gpu_temp": 68, "memory_temp": 72, "sm_clock": 1980, "gpu_util": 98, "power": 650,
           "clocks_event_reasons": 0, "nvlink_replay_errors": 0, "ecc_sbe_volatile": 0}
THROTTLED = {**HEALTHY, "gpu_temp": 90, "sm_clock": 1005, "clocks_event_reasons": 0x40 | 0x20 | 0x8}


def sample(t: float, host: str = "n1", gpu: int = 0, **fields: Any) -> DcgmRecord:
    """One healthy sample at T0 + t, with ``fields`` overriding the healthy values."""
    return dcgm(T0 + t, host, gpu, {**HEALTHY, **fields})


def fleet(seconds: Iterable[float], hosts: int = 2, gpus: int = 2, overrides: Any = None) -> list[DcgmRecord]:
    """Samples for every GPU of every host at each second, sorted by time.

    ``overrides(t, host, gpu)`` may return a dict of field overrides, or None to drop that sample.
    """
    out = []
    for t in seconds:
        for h in range(hosts):
            for g in range(gpus):
                extra = {} if overrides is None else overrides(t, f"n{h}", g)
                if extra is None:
                    continue
                out.append(sample(t, f"n{h}", g, **extra))
    return out

def progress(t: float, host: str = "n1", rank: int = 0, **kw: Any) -> ProgressRecord:
    """One rank's collective progress at T0 + t (a watchdog's ``progress`` unless ``kw`` says
    otherwise): job ``j1``, communicator ``0``."""
    args: dict[str, Any] = {"job": "j1", "comm": "0", "source": "watchdog", "state": "progress", **kw}
    return ProgressRecord(ts=T0 + t, host=host, rank=rank, **args)


# The read-only real-format samples beside the checkout (../shared/data), as CI lays them out.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def run_batched(records: list, batch: int, engine: Any = None) -> Any:
    """Feed ``records`` to an engine ``batch`` at a time, then flush; all it output, in one
    ``EngineOutput``."""
    from pipeline.engine import Engine, EngineOutput

    eng = engine or Engine()
    out = EngineOutput()
    for i in range(0, len(records), batch):
        out.extend(eng.process(records[i:i + batch]))
    out.extend(eng.flush())
    return out


class ListSink:
    """A producer's sink that keeps what it is given (``got``); ``down``: each delivery raises
    ``BrokerUnavailableError``, as a broker that is down does."""

    def __init__(self) -> None:
        self.got: list = []
        self.down = False

    def deliver(self, records: Any) -> int:
        from pipeline.errors import BrokerUnavailableError

        if self.down:
            raise BrokerUnavailableError("down")
        self.got.extend(records)
        return 0

    def close(self) -> None:
        pass


class Clock:
    """A service's test clock: monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def canonical_reference(records: list) -> list[int]:
    """The fleet stage's canonical order record by record, the reference its vectorised sort is
    checked against: indices sorted by ``canonical.record_identity``, then ``canonical.repeat_key``
    (a DCGM sample's values), the first fed of a repeat kept."""
    seen: set = set()
    out = []
    for i in sorted(range(len(records)), key=lambda i: (record_identity(records[i]), repeat_key(records[i]))):
        ident = (record_identity(records[i]), repeat_key(records[i]))
        if ident not in seen:
            seen.add(ident)
            out.append(i)
    return out


def dcgm_models_file(directory: Path, rules: str | os.PathLike) -> str:
    """The default ``models.yaml`` beside ``rules`` without its NCCL models, written into
    ``directory``: a model set whose every model reads DCGM rows (``ModelSet.host_local``)."""
    import yaml

    doc = yaml.safe_load(Path(rules, "models.yaml").read_text())
    doc["models"] = [m for m in doc["models"] if not str(m["detector"]).startswith("nccl")]
    path = Path(directory) / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def alert_rows(out: Any) -> list[tuple]:
    """An output's alerts as sorted rows: two paths that meet GPUs in another order (a batch of
    both encodings has its columns first) compare equal when they say the same."""
    return sorted((a.state, a.fault, a.host or "", a.gpu or -1, a.link or -1, a.ts, a.started_at) for a in out.alerts)


def dead_rows(out: Any) -> list[tuple]:
    """An output's dead letters as sorted rows (reason, origin, action, fields, detail)."""
    return sorted((d.reason, d.origin, d.action, tuple(d.fields), d.detail) for d in out.dead)


def nccl_tests_log(host: str = "n1", *, wrong: int = 0, oob: int = 0, nodes: int = 1) -> str:
    """A 2.13+ nccl-tests all_reduce_perf log (src/common.cu's formats), 8 GPUs a node."""
    ranks = [(n * 8 + d, host if n == 0 else f"{host}-peer{n}", d) for n in range(nodes) for d in range(8)]
    out = ["# nccl-tests version 2.17.6 nccl-headers=22803 nccl-library=22803",
           "# Collective test starting: all_reduce_perf",
           "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 "
           "validation: 1 graph: 0", "#", "# Using devices"]
    out += [f"#  Rank {r:2d} Group  0 Pid   4242 on {h:>10s} device {d:2d} [0000:1b:00] NVIDIA H100 80GB HBM3"
            for r, h, d in ranks]
    out += ["#",
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)"]
    for size, t in ((8, 30.0), (1024, 31.5), (1048576, 60.0)):
        w = wrong if size >= 1024 else 0
        out.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:7.2f}   1.00   1.00  {w:6d}"
                   f"  {t:7.2f}   1.00   1.00  {0:6d}")
    out += [f"# Out of bounds values : {oob} {'FAILED' if oob else 'OK'}", "# Avg bus bandwidth    : 1.0 ", "#",
            "# Collective test concluded: all_reduce_perf", ""]
    return "\n".join(out)  # fmt: skip
