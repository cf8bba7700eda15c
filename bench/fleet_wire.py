"""What the host stage forwards to ``<prefix>.fleet``: bytes and CPU per forwarded record, measured.

    .venv/bin/python bench/fleet_wire.py [--hosts 64] [--seconds 60] [--repeat 3] [--json OUT]

A simulated ``mixed`` recording goes through the host stage (default rules, the default models'
fleet stage as the field set) as the service's host stage runs it; what it forwards is encoded
in messages of ``MAX_FORWARD`` records inside the signed envelope, as a JSON array of records
(the encoding of earlier builds, still read) and as columns (pipeline/service/forwarded.py).
Prints per forwarded record: the bytes on the topic, the host stage's encode (from records, and
from the rows of the same recording sent as columnar telemetry), the fleet stage's
decode (rows ready for its engine) plus canonical order, and the whole fleet stage (decode,
buffer, canonical order and its engine with the default models, start-up included), in CPU
time. Median of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import rows  # noqa: E402
from pipeline.bus.telemetry import COLUMNAR, per_host_wire  # noqa: E402
from pipeline.decode import Decoder  # noqa: E402
from pipeline.detection import build_detector  # noqa: E402
from pipeline.service.fleetwire import ENVELOPE_VERSION, Envelope, mac  # noqa: E402
from pipeline.service.forwarded import MAX_FORWARD, Builder, Columns, Decoded, Encoder  # noqa: E402
from pipeline.canonical import canonical_order  # noqa: E402
from pipeline.fleetstage import FleetStage, records_decoder  # noqa: E402
from pipeline.topology import Topology  # noqa: E402
from producers.sim import Simulator  # noqa: E402

KEY = b"k" * 32


def forwarded(hosts: int, seconds: int) -> tuple[list[Any], tuple[str, ...]]:
    """The records the host stage forwards for a simulated recording, and the fleet engine's fields."""
    det, _ = build_detector([str(ROOT / "rules")], "auto")
    assert isinstance(det, Topology)
    fields = det.fleet_engine().decode_fields
    dec = Decoder()
    dec.set_fields(det.decode_fields)
    out: list[Any] = []
    sim = Simulator(hosts=hosts, duration=seconds, seed=5, scenario="mixed")
    for batch in sim.batches():
        recs = dec.decode(msgspec.json.encode(batch), "sim").records
        out.extend(det.host.process(recs).forwarded)
    out.extend(det.host.flush().forwarded)
    return out, fields


def forwarded_columns(hosts: int, seconds: int) -> list[Any]:
    """What the host stage forwards of the same recording sent as the producers send it (the DCGM
    producer's per-host messages columnar, the NCCL producer's JSON): each batch's rows in their
    shape (``rows.Batches``' parts)."""
    det, _ = build_detector([str(ROOT / "rules")], "auto")
    assert isinstance(det, Topology)
    dec = Decoder()
    dec.set_fields(det.decode_fields)
    parts: list[Any] = []
    sim = Simulator(hosts=hosts, duration=seconds, seed=5, scenario="mixed")
    for batch in sim.batches():
        dcgm = [r for r in batch if r.get("kind", "dcgm") == "dcgm"]
        wire = list(per_host_wire(dcgm, COLUMNAR)) + list(per_host_wire([r for r in batch if r not in dcgm], "json"))
        got = dec.decode_many([v for _, v, _ in wire], ["sim"] * len(wire), [h is not None for _, _, h in wire])
        parts += det.host.process(got.records).forwarded.parts
    parts += det.host.flush().forwarded.parts
    return parts


def _wrap(body: bytes) -> bytes:
    return msgspec.msgpack.encode(Envelope(ENVELOPE_VERSION, 0, body, mac(KEY, "t.fleet", "g", 0, body)))


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    runs, got = [], None
    for _ in range(repeat):
        # CPU time of this process: the machine's other load does not count.
        t = time.process_time()
        got = fn()
        runs.append(time.process_time() - t)
    return statistics.median(runs), got


def measure(records: list[Any], fields: tuple[str, ...], repeat: int, parts: list[Any] | None = None) -> dict:
    chunks = [records[i : i + MAX_FORWARD] for i in range(0, len(records), MAX_FORWARD)]
    n = len(records)
    json_enc = msgspec.json.Encoder()
    col_enc = Encoder(fields)
    env = msgspec.msgpack.Decoder(Envelope)
    json_dec = records_decoder(fields)
    col_dec = msgspec.msgpack.Decoder(Columns)
    build = Builder(fields)

    def json_in(msgs: list[bytes]) -> None:
        for v in msgs:
            recs = json_dec(env.decode(v).body)
            canonical_order(recs, np.fromiter((r.ts for r in recs), np.float64, len(recs)))

    def col_in(msgs: list[bytes]) -> None:
        for v in msgs:
            d = Decoded(col_dec.decode(env.decode(v).body))
            recs, cols = build.build(d, np.ones(d.n, bool), np.ones(len(d.other), bool))
            canonical_order(recs, recs.ts, cols)

    def stage(decode: Callable[[bytes], tuple[Any, Any, Any]]) -> Callable[[list[bytes]], None]:
        """The fleet stage over the messages: decoded, buffered, put in canonical order and
        run through the fleet engine (the default models), a release every 20 messages."""

        def run(msgs: list[bytes]) -> None:
            det, _ = build_detector([str(ROOT / "rules")], "auto")
            assert isinstance(det, Topology)
            st = FleetStage(det.fleet_engine)
            for k, v in enumerate(msgs):
                recs, ts, cols = decode(env.decode(v).body)
                st.feed(recs, at=k, upstream=0, ts=ts, cols=cols)
                if k % 20 == 19:
                    st.mark(0, float(ts.min()) - 5.0)
                    st.advance()
            st.flush()

        return run

    def json_rows(body: bytes) -> tuple[Any, Any, Any]:
        recs = json_dec(body)
        return recs, rows.times(recs), None

    def col_rows(body: bytes) -> tuple[Any, Any, Any]:
        d = Decoded(col_dec.decode(body))
        recs, cols = build.build(d, np.ones(d.n, bool), np.ones(len(d.other), bool))
        return recs, recs.ts, cols

    out: dict = {"records": n}
    if parts is not None:
        # The host stage's encode of what it forwards from columnar telemetry: from the arrays.
        joined = rows.concat(parts)[0]
        m = len(joined)
        t_cols, _ = _timed(
            lambda: [col_enc.encode(joined[i : i + MAX_FORWARD]) for i in range(0, m, MAX_FORWARD)], repeat
        )
        out["encode_from_columnar_telemetry_us"] = round(t_cols / m * 1e6, 3)
    for name, enc, dec, whole in (
        ("json", json_enc.encode, json_in, stage(json_rows)),
        ("columns", col_enc.encode, col_in, stage(col_rows)),
    ):
        t_enc, msgs = _timed(lambda enc=enc: [_wrap(enc(c)) for c in chunks], repeat)
        t_dec, _ = _timed(lambda dec=dec, msgs=msgs: dec(msgs), repeat)
        t_stage, _ = _timed(lambda whole=whole, msgs=msgs: whole(msgs), repeat)
        out[name] = {
            "bytes_per_record": round(sum(map(len, msgs)) / n, 1),
            "encode_us": round(t_enc / n * 1e6, 3),
            "decode_and_order_us": round(t_dec / n * 1e6, 3),
            "fleet_stage_us": round(t_stage / n * 1e6, 3),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="append the result as one JSON line to this file")
    a = ap.parse_args()
    records, fields = forwarded(a.hosts, a.seconds)
    parts = forwarded_columns(a.hosts, a.seconds)
    res = {"bench": "fleet_wire", "hosts": a.hosts, "seconds": a.seconds, **measure(records, fields, a.repeat, parts)}
    print(json.dumps(res, indent=2))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
