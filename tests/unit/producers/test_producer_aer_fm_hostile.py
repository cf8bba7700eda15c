"""Hostile input for the PCIe AER and Fabric Manager producers: each input costs only itself,
ends in bounded time, and what the producer sends passes the decoder."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.decode import Decoder
from pipeline.schema import encode
from producers.fabric_manager import FabricManagerLog, FileFollower, classify, parse_fm_line
from producers.kmsg import KmsgFileSource, parse_pci_map
from producers.pcie_aer import AerSource, parse_aer_file
from tests.factories import T0
from tests.unit.producers.pcie_factories import dgx_like, ib_class
from tests.unit.producers.kmsg_factories import PCI_MAP

U64 = (1 << 64) - 1
FATAL = (
    "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus "
    "id 00000000:86:00.0 physical id 3 port 33"
)


def _dead(recs) -> list[tuple[str, str]]:
    """The dead letters the decoder makes of ``recs``, one message a record."""
    dec = Decoder()
    return [(d.reason, d.detail) for r in recs for d in dec.decode(encode(r), "t").dead]


# -- PCIe AER ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "TOTAL_ERR_COR 99999999999999999999\n",  # 20 digits, past a u64
        f"TOTAL_ERR_COR {U64 + 1}\n",
        f"RxErr {U64}\nBadTLP 1\n",  # no total line: the bits' sum past a u64
        "TOTAL_ERR_COR 5\nTOTAL_ERR_COR 0\n",  # which one? aer.c prints each name once
        "RxErr 1\nRxErr 1\n",
    ],
)
def test_a_count_past_u64_or_a_repeated_name_is_not_the_format(text: str) -> None:
    assert parse_aer_file(text, "TOTAL_ERR_COR") is None


def test_an_upstream_sum_past_u64_is_left_out_and_counted(tmp_path: Path) -> None:
    dev = dgx_like(tmp_path)
    ib_class(tmp_path, "mlx5_0", dev["nic"])
    for bridge in ("switch_up", "switch_dn1"):  # above GPU 1 and the NIC; GPU 0 is under switch_up only
        (dev[bridge] / "aer_dev_correctable").write_text(f"TOTAL_ERR_COR {U64}\n")
    src = AerSource(tmp_path, host="n1", clock=lambda: T0)
    recs = src.poll()
    assert _dead(recs) == []
    by = {r.gpu if hasattr(r, "gpu") else r.device: r for r in recs}
    assert by[0].fields.GPUWARDEN_PCIE_AER_UPSTREAM_CORRECTABLE == float(U64)
    assert math.isnan(by[1].fields.GPUWARDEN_PCIE_AER_UPSTREAM_CORRECTABLE)  # left out
    assert by[1].fields.GPUWARDEN_PCIE_AER_UPSTREAM_FATAL == 0  # the rest of the record is kept
    assert "pcie_aer_upstream_correctable" not in by["mlx5_0"].counters
    assert by["mlx5_0"].counters["pcie_aer_upstream_fatal"] == 0
    assert src.counts["dropped.counter_overflow"] == 2


@pytest.mark.parametrize("ports,expected", [((99999,), 1), ((99999, 2), 2)])
def test_a_port_number_a_record_cannot_carry_is_no_port(tmp_path: Path, ports: tuple[int, ...], expected: int) -> None:
    dev = dgx_like(tmp_path)
    ib_class(tmp_path, "mlx5_0", dev["nic"], ports=ports)
    recs = AerSource(tmp_path, host="n1", clock=lambda: T0).poll()
    assert [r.port for r in recs if not hasattr(r, "gpu")] == [expected]
    assert _dead(recs) == []


def test_a_name_with_a_newline_or_an_alias_is_not_another_gpu(tmp_path: Path) -> None:
    dgx_like(tmp_path)
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    target = os.readlink(bus / "0000:04:00.0")
    os.symlink(target, bus / "0000:04:00.0\n")  # "$" would match before the newline
    os.symlink(target, bus / "0000:00:00.0")  # sorts first: would take GPU 0's index
    src = AerSource(tmp_path, host="n1", clock=lambda: T0)
    recs = src.poll()
    assert sorted((r.gpu, r.labels["pci_bus_id"]) for r in recs) == [
        (0, "0000:03:00.0"),
        (1, "0000:04:00.0"),
        (2, "0000:81:00.0"),
    ]
    assert src.counts["dropped.alias_link"] == 1


# -- Fabric Manager ---------------------------------------------------------------------------


def test_a_long_line_of_repeated_words_is_classified_in_linear_time() -> None:
    # "(?:fail\w*).{0,80}nvlink" backtracked over every word character: a 64 KiB line of "fail"
    # took minutes. A generous bound on a subprocess: a regex holds the interpreter.
    code = (
        "from producers.fabric_manager import classify, parse_fm_line\n"
        "for word in ('fail', 'train', 'FAIL'):\n"
        "    ln = parse_fm_line('[Jul 13 2023 06:39:42] [ERROR] [tid 1] ' + word * (60000 // len(word)))\n"
        "    assert classify(ln.msg)[0] == 'fm_errors'\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("year", ["1970", "1990", "2200", "9999"])
def test_a_year_the_decoder_refuses_is_a_bad_timestamp(year: str) -> None:
    assert parse_fm_line(FATAL.replace("2024", year)).error == "bad_timestamp"


def test_one_line_of_year_2200_costs_only_itself(tmp_path: Path) -> None:
    p = tmp_path / "fabricmanager.log"
    p.write_text(FATAL + "\n" + FATAL.replace("2024", "2200") + "\n")
    pci = parse_pci_map(PCI_MAP)
    src = KmsgFileSource(str(p), pci, host="n1", log=FabricManagerLog(pci, host="n1"), parse=parse_fm_line)
    recs = src.poll()
    s = src.summary()
    assert s["dropped.bad_timestamp"] == 1 and s["samples_capped"] == 0 and s["error_lines"] == 1
    assert len(recs) < 2000  # an hour's window of 5 GPUs, not samples to the year 2200
    assert _dead(recs[:50] + recs[-50:]) == []


def test_a_number_too_long_for_its_label_gives_no_label() -> None:
    line = FATAL.replace("physical id 3 port 33", "physical id 31337 port 123456")
    kind, labels = classify(parse_fm_line(line).msg)
    assert kind == "fm_nvswitch_fatal_errors" and labels["fm.sxid"] == "20034"
    assert "fm.nvswitch_phys" not in labels and "fm.nvswitch_port" not in labels  # not "3133", "1234"
    assert labels["fm.nvswitch_pci"] == "00000000:86:00.0"


def test_nul_blocks_before_a_line_cost_nothing() -> None:
    # A crash leaves the file's unwritten blocks as NULs; Fabric Manager appends after them.
    ln = parse_fm_line("\0" * 4096 + FATAL)
    assert ln is not None and ln.error is None and classify(ln.msg)[0] == "fm_nvswitch_fatal_errors"


def test_a_follower_pointed_at_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "fabricmanager.log"
    os.mkfifo(fifo)
    rd = FileFollower(str(fifo))
    got: list[list[str]] = []
    t = threading.Thread(target=lambda: got.append(rd.read()), daemon=True)
    t.start()
    t.join(5)
    blocked = t.is_alive()
    if blocked:  # let the blocked open return, so the thread ends
        with open(fifo, "wb"):
            pass
        t.join(5)
    rd.close()
    assert not blocked and got == [[]]
