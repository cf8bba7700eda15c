"""A gzip file given to a producer that reads text (a rotated ``kern.log.2.gz``, a saved log kept
compressed) is read as the text it holds, told by its magic bytes whatever its name: the same
records as the text itself, member after member as ``zcat`` reads them, within the caps plain text
has (a bomb costs no memory past them). A gzip cut short or damaged gives the records of the text
before the damage and exits 3 (``dropped.cut_gzip`` / ``dropped.damaged_gzip``). Before, each of
these producers refused a gzip file (exit 3, "give it decompressed").
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from pipeline.cli import main
from producers.textinput import gzip_damage, open_text, read_input
from tests.factories import SHARED_DATA
from tests.unit.producers.fabric_manager_factories import CRITICAL, NO_TID, TRUNK_LINK
from tests.unit.producers.ibstat_factories import ONE_PORT
from tests.unit.producers.kmsg_factories import EVENTS, PCI_MAP
from tests.unit.producers.ras_factories import V226_AHEAD
from tests.unit.producers.torch_watchdog_factories import (
    PT24_NOISE,
    PT24_STATUS_0,
    PT24_STATUS_1,
    PT24_TIMEOUT_0,
    PT24_TIMEOUT_1,
)

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ["kmsg", "fabric-manager", "torch-watchdog", "nccl-tests", "ibstat", "ncclras", "dcgmi"]
STDIN_SOURCES = [s for s in SOURCES if s != "dcgmi"]  # dcgmi's --file is a path: its rounds end at its mtime
IBSTAT = "CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Down\n" + (
    "\t\tPhysical state: Polling\n\t\tRate: 10\n\t\tLink layer: InfiniBand\n"
)


def _sample(source: str) -> str:
    """A real input of ``source``, several lines long."""
    if source == "kmsg":
        return "".join(f"[Mon Mar  3 10:0{i}:00 2025] {ev}\n" for i, ev in enumerate(EVENTS))
    if source == "fabric-manager":
        return f"{CRITICAL}\n{NO_TID}\n{TRUNK_LINK}\n"
    if source == "torch-watchdog":
        return "".join(f"{ln}\n" for ln in (PT24_TIMEOUT_0, PT24_TIMEOUT_1, PT24_STATUS_1, PT24_STATUS_0, PT24_NOISE))
    if source == "nccl-tests":
        return (SHARED_DATA / "nccl_tests_all_reduce_perf_2x8_h100.txt").read_text()
    if source == "ibstat":
        return ONE_PORT + IBSTAT
    if source == "ncclras":
        return V226_AHEAD
    return (SHARED_DATA / "dcgmi_dmon_a100_dcgm3_sample.txt").read_text()


def _extra(source: str, tmp_path: Path) -> list[str]:
    if source in ("kmsg", "fabric-manager"):
        pci = tmp_path / "pci.csv"
        pci.write_text(PCI_MAP)
        # The events alone: a 2025 log sampled up to its file's time is thousands of records.
        return ["--pci-map", str(pci), "--host", "node1", "--events-only"]
    if source == "torch-watchdog":
        return ["--job", "4242", "--host", "node1"]
    if source in ("nccl-tests", "dcgmi", "ibstat"):
        return ["--host", "node1"]
    return []


def _comparable(source: str, recs: list[dict]) -> list[dict]:
    # ibstat, and nccl-tests for a log without a date, stamp records with the time they read them.
    return [{k: v for k, v in r.items() if k != "ts"} for r in recs] if source in ("ibstat", "nccl-tests") else recs


def _produce(source: str, path: Path, tmp_path: Path, capsys, *extra: str) -> tuple[int, list[dict], str]:
    out = tmp_path / f"out-{path.name}.jsonl"
    out.unlink(missing_ok=True)
    rc = main(["produce", source, "--file", str(path), "--out", str(out), *_extra(source, tmp_path), *extra])
    recs = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    return rc, _comparable(source, recs), capsys.readouterr().err


def _pair(tmp_path: Path, data: bytes, gz: bytes, name: str = "rotated.1") -> tuple[Path, Path]:
    """The plain file and the gzip one (named without ``.gz``: it is told by its bytes), with the
    same modification time, which stamps lines without a time."""
    plain, packed = tmp_path / "plain.log", tmp_path / name
    plain.write_bytes(data)
    packed.write_bytes(gz)
    st = plain.stat()
    os.utime(packed, ns=(st.st_atime_ns, st.st_mtime_ns))
    return plain, packed


def _lost(err: str) -> str:
    return next((ln for ln in err.splitlines() if "LOST input:" in ln), "")


def _unpacked_before_damage(gz: bytes) -> bytes:
    """What zlib unpacks of ``gz``, member after member, up to where it ends or is damaged."""
    out, rest = [], gz
    while rest[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(31)
        try:
            out.append(d.decompress(rest))
        except zlib.error:
            break
        if not d.eof:
            break
        rest = d.unused_data
    return b"".join(out)


@pytest.mark.parametrize("source", SOURCES)
def test_a_gzip_file_gives_the_records_of_its_text(tmp_path, capsys, source):
    data = _sample(source).encode()
    plain, packed = _pair(tmp_path, data, gzip.compress(data))
    rc, recs, _ = _produce(source, plain, tmp_path, capsys)
    assert recs, "the sample makes records"
    assert _produce(source, packed, tmp_path, capsys)[:2] == (rc, recs)


@pytest.mark.parametrize("source", SOURCES)
def test_concatenated_gzip_members_are_all_read_as_zcat_reads_them(tmp_path, capsys, source):
    # `cat a.gz b.gz > c.gz`: one stream; the members split the text anywhere, mid-line too.
    data = _sample(source).encode()
    a, b = len(data) // 3, 2 * len(data) // 3
    members = gzip.compress(data[:a]) + gzip.compress(b"") + gzip.compress(data[a:b]) + gzip.compress(data[b:])
    plain, packed = _pair(tmp_path, data, members)
    rc, recs, _ = _produce(source, plain, tmp_path, capsys)
    assert _produce(source, packed, tmp_path, capsys)[:2] == (rc, recs)


@pytest.mark.parametrize("source", SOURCES)
def test_a_cut_gzip_gives_the_records_before_the_cut_and_exits_3(tmp_path, capsys, caplog, source):
    # A copy taken while logrotate compressed: the first member whole, the second cut in its middle.
    data = _sample(source).encode()
    half = data.rindex(b"\n", 0, len(data) // 2) + 1
    second = gzip.compress(data[half:])
    gz = gzip.compress(data[:half]) + second[: len(second) // 2]
    before = _unpacked_before_damage(gz)
    assert data[:half] <= before < data  # the cut is inside the second member's text
    plain, packed = _pair(tmp_path, before, gz)
    _, recs, _ = _produce(source, plain, tmp_path, capsys)
    rc, got, err = _produce(source, packed, tmp_path, capsys)
    assert (rc, got) == (3, recs), err
    assert "dropped.cut_gzip 1" in _lost(err), err
    assert f"{packed}: gzip input cut short" in caplog.text


def _bad_crc(gz: bytes) -> bytes:
    return gz[:-8] + struct.pack("<I", zlib.crc32(gz[:-8]) ^ 0xFFFF) + gz[-4:]


DAMAGES = {
    # name: (what is done to a whole gzip of the sample, whether all its text is read, the reason)
    "bad_crc": (_bad_crc, True, "damaged_gzip"),
    "trailing_garbage": (lambda gz: gz + b"not gzip\n", True, "damaged_gzip"),
    "garbage_after_header": (lambda gz: gz[:10] + b"\xff" * 64, False, "damaged_gzip"),
    "magic_only": (lambda gz: gz[:2], False, "cut_gzip"),
    "cut_in_trailer": (lambda gz: gz[:-3], True, "cut_gzip"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("source", SOURCES)
def test_a_damaged_gzip_is_lost_input_after_the_text_before_it(tmp_path, capsys, source, damage):
    spoil, whole, reason = DAMAGES[damage]
    data = _sample(source).encode()
    plain, packed = _pair(tmp_path, data if whole else b"", spoil(gzip.compress(data)))
    _, recs, _ = _produce(source, plain, tmp_path, capsys)
    rc, got, err = _produce(source, packed, tmp_path, capsys)
    assert (rc, got) == (3, recs), err
    assert f"dropped.{reason} 1" in _lost(err), err
    assert "Traceback" not in err


@pytest.mark.parametrize("source", SOURCES)
def test_hostile_bytes_inside_a_gzip_are_read_as_in_plain_text(tmp_path, capsys, source):
    # A byte-order mark, bytes that are not UTF-8, NULs and CRLF; and a header with every optional
    # field (extra, name, comment, header CRC), which no common tool writes but gzip reads.
    data = b"\xef\xbb\xbf" + b"\xff\xfe junk \x00\x80\r\n" + _sample(source).encode() + b"\xc3\x28 tail\n"
    body = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = body.compress(data) + body.flush()
    head = b"\x1f\x8b\x08\x1e" + bytes(6) + struct.pack("<H", 4) + b"ab\x00\x00" + b"x" * 5000 + b"\x00c\x00"
    head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    gz = head + deflated + struct.pack("<II", zlib.crc32(data), len(data)) + bytes(512)  # tape padding: NULs
    plain, packed = _pair(tmp_path, data, gz)
    rc, recs, _ = _produce(source, plain, tmp_path, capsys)
    assert recs
    assert _produce(source, packed, tmp_path, capsys)[:2] == (rc, recs)


@pytest.mark.parametrize("source", STDIN_SOURCES)
def test_gzip_on_stdin_is_read_as_its_text(tmp_path, capsys, monkeypatch, source):
    # `cat kern.log.2.gz | gpuwarden produce kmsg --file -`: stdin's buffer is looked at, not taken.
    data = _sample(source).encode()
    got = []
    for raw in (data, gzip.compress(data[:100]) + gzip.compress(data[100:])):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(raw)), encoding="utf-8"))
        # Lines without a time are stamped now on stdin: records are compared without times.
        rc, recs, _ = _produce(source, Path("-"), tmp_path, capsys)
        got.append((rc, [{k: v for k, v in r.items() if k != "ts"} for r in recs]))
    assert got[0][1] and got[1] == got[0]


def test_gzip_on_a_real_pipe_is_read_as_its_text(tmp_path):
    data = _sample("nccl-tests").encode()
    outs = []
    for i, raw in enumerate((data, gzip.compress(data))):
        out = tmp_path / f"o{i}.jsonl"
        cmd = [sys.executable, "-m", "pipeline", "produce", "nccl-tests", "--file", "-", "--out", str(out)]
        done = subprocess.run(cmd, cwd=ROOT, input=raw, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr[-500:]
        outs.append(_comparable("nccl-tests", [json.loads(ln) for ln in out.read_text().splitlines()]))
    assert outs[0] and outs[1] == outs[0]


def test_a_gzip_log_given_to_follow_is_read_once_whole(tmp_path, capsys):
    # A rotated fabricmanager.log.1.gz grows no more: followed, it would be bytes read as lines.
    data = _sample("fabric-manager").encode()
    plain, packed = _pair(tmp_path, data, gzip.compress(data), "fabricmanager.log.1.gz")
    rc, recs, _ = _produce("fabric-manager", plain, tmp_path, capsys)
    out = tmp_path / "followed.jsonl"
    extra = _extra("fabric-manager", tmp_path)
    got = main(["produce", "fabric-manager", "--follow", str(packed), "--count", "1", "--out", str(out), *extra])
    assert (got, [json.loads(ln) for ln in out.read_text().splitlines()]) == (rc, recs)


@pytest.fixture(scope="module")
def zeros_member(tmp_path_factory) -> Path:
    """One gzip member of 1 GiB of NULs (~5 MB), written a MiB at a time."""
    path = tmp_path_factory.mktemp("bomb") / "zeros.gz"
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    with path.open("wb") as fh:
        for _ in range(1024):
            fh.write(c.compress(chunk))
        fh.write(c.flush())
    return path


@pytest.mark.parametrize("source", SOURCES)
def test_a_gzip_bomb_is_read_within_the_caps_of_plain_text(tmp_path, capsys, zeros_member, source):
    # The sample, then 1 GiB of NULs on one line: unpacked whole it would not fit the memory limit
    # (1.5 GiB of address space); read a bounded piece at a time, the sample's records come out
    # and the rest is cut at the producer's cap or skipped a line at a time, as in plain text.
    data = _sample(source).encode()
    plain, packed = _pair(tmp_path, data, gzip.compress(data) + zeros_member.read_bytes())
    _, recs, _ = _produce(source, plain, tmp_path, capsys)
    out = tmp_path / "bomb.jsonl"
    argv = ["produce", source, "--file", str(packed), "--out", str(out), *_extra(source, tmp_path)]
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))
        from pipeline.cli import main
        sys.exit(main({argv!r}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 3) and "Traceback" not in done.stderr, done.stderr[-800:]
    assert "MemoryError" not in done.stderr
    got = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    assert _comparable(source, got) == recs


def _unpacked_byte_by_byte(gz: bytes) -> bytes:
    """What zlib unpacks of one member fed a byte at a time, up to the damage."""
    d, out = zlib.decompressobj(31), []
    for i in range(len(gz)):
        try:
            out.append(d.decompress(gz[i : i + 1]))
        except zlib.error:
            break
    return b"".join(out)


def _spoiled_after(data: bytes) -> bytes:
    """``data`` in one gzip member flushed whole, then bytes that are no deflate block."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH) + b"\xff" * 16


def test_damage_inside_a_member_keeps_the_text_unpacked_before_it_in_every_reader(tmp_path):
    data = b"".join(b"%06d kernel: line of a rotated log\n" % i for i in range(20_000))
    gz = _spoiled_after(data)
    assert _unpacked_byte_by_byte(gz) == data
    (tmp_path / "k.1").write_bytes(gz)
    text, more, damage = read_input(str(tmp_path / "k.1"), 1 << 24)  # one read of it all
    assert damage is not None and damage.reason == "dropped.damaged_gzip" and not more
    assert data.decode().startswith(text) and len(text) >= len(data) - 2048
    with open_text(str(tmp_path / "k.1")) as fh:  # line by line
        lines = "".join(fh)
        assert gzip_damage(fh) is not None
    assert data.decode().startswith(lines) and len(lines) >= len(data) - 2048


@pytest.mark.parametrize("source", ["nccl-tests"])
def test_damage_inside_a_member_keeps_the_records_before_it(tmp_path, capsys, source):
    # Found by review: GzipFile unpacked 8 KiB of compressed input a step (ncclras, ibstat and
    # nccl-tests read far more a call), and zlib's error lost the whole step: a log damaged after
    # its last line gave no record. Now at most the few lines of the last 64 compressed bytes go.
    data = _sample(source).encode()
    gz = _spoiled_after(data)
    before = _unpacked_byte_by_byte(gz)
    assert before == data  # every byte of the text came before the damage
    plain, packed = _pair(tmp_path, data, gz)
    _, recs, _ = _produce(source, plain, tmp_path, capsys)
    rc, got, err = _produce(source, packed, tmp_path, capsys)
    assert rc == 3 and "dropped.damaged_gzip 1" in _lost(err), err
    assert len(recs) >= 3 and got == recs[: len(got)] and len(got) >= len(recs) - 2, (len(got), len(recs))
