"""dcgm-exporter scrapes with hostile series: each costs only itself, counted by reason, and the
parser's work stays linear in the scrape. The fuzz test mixes generated hostile series into the
real H100 scrape (``GPUWARDEN_FUZZ_EXAMPLES`` examples, 300 by default: a few seconds)."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.dcgm_exporter import MAX_LABELS, MAX_LINE_CHARS, ExporterSource, parse_metrics

from tests.factories import SHARED_DATA as DATA  # noqa: E402

H100 = DATA / "dcgm_exporter_h100_8gpu_sampled.prom"
TS = 1764403200.0
EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "300"))


def _series(gpu: str = "0", **extra: str) -> str:
    labels = {"gpu": gpu, "UUID": "GPU-x", "Hostname": "node-9", **extra}
    return "DCGM_FI_DEV_GPU_TEMP{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "} 41\n"


def _good():
    recs, st_ = parse_metrics(H100.read_text(), ts=TS)
    return {(r.host, r.gpu, r.link): r for r in recs}, st_


@pytest.mark.parametrize(
    "label",
    [
        {"gpu": "²"},
        {"gpu": "٣"},
        {"gpu": "9" * 400},
        {"nvlink": "²"},
        {"nvlink": "٣"},
        {"GPU_I_ID": "²"},
        {"xid": "²"},
    ],
)
def test_a_bad_identity_label_costs_only_its_series(label):
    # Before: "²" passed str.isdigit and int() raised: the whole scrape lost on every poll;
    # "٣" was read as 3 and overwrote GPU 3.
    gpu = label.pop("gpu", "3")
    text = H100.read_text() + _series(gpu, **label)
    recs, st_ = parse_metrics(text, ts=TS)
    good, _ = _good()
    assert {(r.host, r.gpu, r.link): r for r in recs} == good
    assert st_.bad_label == 1


def test_xid_count_with_a_bad_code_is_dropped_not_summed():
    text = (
        'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",Hostname="h",xid="79",window_size_in_ms="300000"} 2\n'
        'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",Hostname="h",xid="²",window_size_in_ms="300000"} 5\n'
    )
    (rec,), st_ = parse_metrics(text, ts=TS)
    assert rec.fields.DCGM_EXP_XID_ERRORS_COUNT == 2 and rec.labels["xid_counts"] == "79:2"
    assert st_.bad_label == 1


def test_conflicting_duplicate_series_is_counted_first_kept():
    text = _series("0", pod="a").replace(" 41", " 41") + _series("0", pod="b").replace(" 41", " 99")
    (rec,), st_ = parse_metrics(text, ts=TS)
    assert rec.fields.DCGM_FI_DEV_GPU_TEMP == 41 and rec.labels["pod"] == "a"
    assert st_.duplicate_series == 1


def test_oversized_lines_are_dropped_before_the_parser_and_counted():
    # Before: 120,000 labels on one series took 18 s of (quadratic) parsing; 32 MiB of them hours.
    many = ",".join(f'l{i}="v"' for i in range(120_000))
    huge = 'DCGM_FI_DEV_GPU_TEMP{gpu="1",' + many + "} 5\n"
    wide = 'DCGM_FI_DEV_GPU_TEMP{gpu="2",' + ",".join(f'l{i}="v"' for i in range(MAX_LABELS + 1)) + "} 5\n"
    long_value = 'DCGM_FI_DEV_GPU_TEMP{gpu="3",l="' + "x" * MAX_LINE_CHARS + '"} 5\n'
    text = huge + wide + long_value + H100.read_text()
    t0 = time.monotonic()
    recs, st_ = parse_metrics(text, ts=TS)
    elapsed = time.monotonic() - t0
    good, _ = _good()
    assert {(r.host, r.gpu, r.link): r for r in recs} == good
    assert st_.line_too_long == 2 and st_.too_many_labels == 1
    assert elapsed < 5, f"{elapsed:.1f}s to parse 1.4 MB"  # no-hang bound; the old parser took 18 s


def test_source_counts_the_new_reasons(tmp_path):
    p = tmp_path / "s.prom"
    p.write_text(H100.read_text() + _series("²") + _series("0") + _series("0"))
    src = ExporterSource(files=[str(p)])
    assert len(src.poll()) == 9
    c = src.summary()
    assert c["dropped.bad_label"] == 1 and c["dropped.duplicate_series"] == 1


def test_unreadable_saved_scrape_is_counted_as_lost(tmp_path):
    src = ExporterSource(files=[str(tmp_path / "missing.prom")])
    assert src.poll() == [] and src.done
    assert src.summary()["dropped.unreadable_file"] == 1


_HOSTILE_VALUE = st.one_of(
    st.sampled_from(["²", "٣", "-1", "1e3", "0x1", " 1", "", "9" * 40]),
    st.text(min_size=1, max_size=12),
)


@st.composite
def _hostile(draw) -> str:
    key = draw(st.sampled_from(["gpu", "nvlink", "GPU_I_ID", "xid"]))
    value = draw(_HOSTILE_VALUE).replace("\\", "").replace('"', "").replace("\n", "")
    if value == "" or (value.isascii() and value.isdigit() and len(value) <= 9):
        value = value + "²"  # keep it hostile: a valid number (or none) here is a real series
    gpu = value if key == "gpu" else "0"
    name = draw(st.sampled_from(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT"]))
    extra = "" if key == "gpu" else f',{key}="{value}"'
    return f'{name}{{gpu="{gpu}",Hostname="gpu-node-1"{extra}}} 1\n'


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_hostile(), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_fuzz_hostile_series_mixed_with_good_ones(bad, rnd):
    good_lines = [line for line in H100.read_text().splitlines() if line and not line.startswith("#")]
    lines = good_lines + [b.rstrip("\n") for b in bad]
    rnd.shuffle(lines)
    recs, st_ = parse_metrics("\n".join(lines) + "\n", ts=TS)
    good, _ = _good()
    assert {(r.host, r.gpu, r.link): r for r in recs} == good  # every good series kept, unchanged
    assert st_.bad_label + st_.no_gpu_label + st_.bad_lines == len(bad)  # every hostile one counted


def test_a_scrape_cut_mid_line_loses_that_line_not_its_value():
    # "45" cut to "4" still parses: a body without its final newline was cut off, and its last
    # line must not become a 4 °C reading of GPU 1.
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 45\nDCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="n1"} 4'
    recs, st_ = parse_metrics(text, ts=TS)
    assert [r.gpu for r in recs] == [0] and st_.bad_lines == 1
