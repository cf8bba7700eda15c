"""bench/run_all.py: the JSON and the generated docs/performance.md section, from fake results
(no benchmark runs here)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load_run_all():
    spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "bench" / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


run_all = _load_run_all()


def fake_result(**overrides) -> dict:
    """A suite result as run_suite returns it, with figures for every table."""
    fig = run_all.figure
    figures = [
        {"bench": "engine", **fig("engine.rules", "engine, rules only", "GPU-samples/s", [41_000, 52_000, 50_000],
                                  gpus=1024, gpu_samples=61_440)},
        {"bench": "models", **fig("engine.models", "engine, rules + models", "GPU-samples/s", [40_000, 43_000, 42_000],
                                  gpus=1024)},
        {"bench": "models", **fig("engine.rules_same_run", "rules, same run", "GPU-samples/s", [50_000, 46_000, 48_000],
                                  gpus=1024)},
        {"bench": "memory", **fig("memory.total", "per-GPU state: total", "bytes/GPU", [4920], gpus=1024)},
        {"bench": "memory", **fig("memory.model_shared", "shared", "bytes", [172_032], gpus=1024)},
        {"bench": "service", **fig("service.throughput", "service", "GPU-samples/s", [30_000, 31_000, 29_000],
                                   gpus=4096, gpu_samples=245_760)},
        {"bench": "service", **fig("service.raw_consume", "raw", "GPU-samples/s", [90_000, 95_000, 100_000],
                                   gpus=4096, gpu_samples=245_760)},
    ] + [{"bench": "latency", **fig(f"latency.{q}", q, "s", [v, v + 0.5, v - 0.25], gpus=16384, rate_hz=1,
                                    alerts_seen=225, faults=225, publisher_behind_s=0.2)}
         for q, v in (("p50", 1.25), ("p95", 2.5), ("p99", 3.75), ("max", 4.0))] \
      + [{"bench": "latency", **fig(f"latency_silent.{q}", q, "s", [v], gpus=16384, rate_hz=1, alerts_seen=224,
                                    faults=225, publisher_behind_s=0.1, silent_from=23)}
         for q, v in (("p50", 1.5), ("p95", 2.75), ("p99", 4.5), ("max", 9.0))] \
      + [{"bench": "replay", **fig(f"replay.{m}.{k}", k, "records/s", [v], gpus=48, seconds=7200, interval_s=5,
                                   dcgm_records=69_120, records=197_088, ticks_walked=400)}
         for m, k, v in (("rules", "dcgm", 21_000), ("rules", "all", 60_000), ("models", "dcgm", 9_000),
                         ("models", "all", 26_000))]
    result = {"suite": "gpuwarden bench", "format": 1, "started": "2026-11-29T12:00:00+00:00",
              "finished": "2026-11-29T12:30:00+00:00", "repeat": 3, "fleets": [1024, 4096, 16384],
              "machine": {"cpu": "Test CPU 9000", "arch": "x86_64", "cores": 2, "cores_usable": 2, "ram_gib": 23.5,
                          "os": "Linux-test", "python": "3.11.7", "git_sha": "abc1234", "git_dirty": False,
                          "load_avg_start": [0.5, 0.4, 0.3]},
              "benchmarks": [], "figures": figures, "skipped": [], "failed": []}
    result.update(overrides)
    return result


DOC = """# Performance

Hand-written introduction, kept as is.

<!-- bench:begin -->
old generated table | 1 |
<!-- bench:end -->

## Hand-written notes after the section
Trailing text.
"""


def test_section_is_replaced_and_the_rest_of_the_doc_kept():
    new = run_all.replace_section(DOC, "NEW SECTION\n")
    assert "old generated table" not in new
    assert new.count("NEW SECTION") == 1
    assert new.count(run_all.BEGIN) == 1 and new.count(run_all.END) == 1
    before, after = DOC.split(run_all.BEGIN)[0], DOC.split(run_all.END)[1]
    assert new.startswith(before + run_all.BEGIN + "\nNEW SECTION\n" + run_all.END)
    assert new.endswith(run_all.END + after)


def test_rewriting_twice_does_not_duplicate_the_section():
    section = run_all.render_markdown(fake_result())
    once = run_all.replace_section(DOC, section)
    twice = run_all.replace_section(once, section)
    assert twice == once
    assert twice.count("### Engine throughput") == 1


def test_doc_without_markers_gets_the_section_appended():
    doc = "# Performance\n\nSome text.\n"
    new = run_all.replace_section(doc, "GENERATED\n")
    assert new.startswith(doc.rstrip("\n"))
    assert new.rstrip().endswith(f"{run_all.BEGIN}\nGENERATED\n{run_all.END}")


@pytest.mark.parametrize("doc", [
    f"a\n{run_all.BEGIN}\nno end\n",
    f"a\n{run_all.END}\nx\n{run_all.BEGIN}\n",
    f"{run_all.BEGIN}\n1\n{run_all.END}\n{run_all.BEGIN}\n2\n{run_all.END}\n",
])
def test_broken_markers_are_refused_rather_than_guessed(doc):
    with pytest.raises(ValueError):
        run_all.replace_section(doc, "x")


def test_markdown_states_the_machine_and_the_medians_of_the_runs():
    md = run_all.render_markdown(fake_result(), "bench/results/bench-2026-11-29-abc1234.json")
    assert "Test CPU 9000, 2 cores" in md and "23.5 GiB" in md and "Python 3.11.7" in md
    assert "git abc1234" in md and "uncommitted" not in md
    assert "bench/results/bench-2026-11-29-abc1234.json" in md
    # engine: median of 41k/52k/50k is 50k, the runs beside it; models cost against the same run's rules
    assert "| 1,024 | 61,440 | 50,000 (41,000 / 52,000 / 50,000) | 42,000 (40,000 / 43,000 / 42,000) | 12 % |" in md
    assert "| 4,096 | 245,760 | 95,000 (90,000 / 95,000 / 100,000) | 30,000 (30,000 / 31,000 / 29,000) | 32 % |" in md
    assert "| 16,384 | all hosts sending | 225/225 | 1.25 (1.25 / 1.75 / 1.00) | 2.50 " in md
    assert md.count("| 0.20 |") == 1  # the publisher's worst lag: was the load really paced
    assert "| 16,384 | one host silent mid-run | 224/225 | 1.50 | 2.75 | 4.50 | 9.00 | 0.10 |" in md
    assert "69,120 DCGM of 197,088 records" in md and "400 ticks walked of 7,200 seconds" in md
    assert "| rules only | 21,000 | 60,000 |" in md and "| rules + models | 9,000 | 26,000 |" in md
    assert "168 KiB" in md
    assert "Wire format" not in md  # no wire figures, no wire table


def test_skipped_and_failed_benchmarks_are_said_in_the_doc():
    result = fake_result(skipped=[{"name": "latency", "why": "no Kafka broker"}],
                         failed=[{"name": "service", "error": "service_throughput.py exited with 1", "output": ""}],
                         machine={**fake_result()["machine"], "git_dirty": True})
    md = run_all.render_markdown(result)
    assert "Not run: latency (no Kafka broker)." in md
    assert "**Failed**: service: service_throughput.py exited with 1." in md
    assert "with uncommitted changes" in md


def test_json_file_is_named_by_date_and_sha_and_holds_every_figure(tmp_path):
    result = fake_result()
    path = run_all.write_json(result, tmp_path / "out")
    assert path.name == "bench-2026-11-29-abc1234.json"
    back = json.loads(path.read_text())
    assert back["machine"]["cpu"] == "Test CPU 9000"
    rules = next(f for f in back["figures"] if f["id"] == "engine.rules")
    assert (rules["unit"], rules["median"], rules["repeat"]) == ("GPU-samples/s", 50_000, 3)
    assert rules["runs"] == [41_000, 52_000, 50_000]


def test_models_runs_are_read_from_the_printout_when_the_json_lacks_them():
    raw = {"rules_samples_per_s": 46311, "models_samples_per_s": 43025, "_stdout": (
        "rules         2048 GPUs x 120s (245,760 GPU-samples), 1 core: median 46,311 GPU-samples/s "
        "(41,640, 46,311, 52,821)\n"
        "rules+models  2048 GPUs x 120s (245,760 GPU-samples), 1 core: median 43,025 GPU-samples/s "
        "(43,025, 40,100, 44,000)\n")}
    runs = run_all._models_runs(raw)
    assert runs == {"rules": [41_640, 46_311, 52_821], "rules+models": [43_025, 40_100, 44_000]}
    assert run_all._models_runs({**raw, "models_runs": [1, 2, 3]})["rules+models"] == [1, 2, 3]


def _run_main(monkeypatch, tmp_path, argv):
    """main() with a fake suite and a fake repository root, so nothing runs and no real doc changes."""
    docs = tmp_path / "repo" / "docs"
    docs.mkdir(parents=True)
    (docs / "performance.md").write_text(DOC)
    monkeypatch.setattr(run_all, "ROOT", tmp_path / "repo")
    monkeypatch.setattr(run_all, "run_suite", lambda plan: fake_result())
    rc = run_all.main(argv + ["--out-dir", str(tmp_path / "out")])
    return rc, (docs / "performance.md").read_text()


def test_quick_run_leaves_the_docs_alone(monkeypatch, tmp_path):
    rc, doc = _run_main(monkeypatch, tmp_path, ["--quick"])
    assert rc == 0 and doc == DOC
    assert (tmp_path / "out" / "bench-2026-11-29-abc1234.json").exists()


def test_full_run_rewrites_the_doc_section(monkeypatch, tmp_path):
    rc, doc = _run_main(monkeypatch, tmp_path, [])
    assert rc == 0
    assert "old generated table" not in doc and "### Engine throughput" in doc
    assert doc.startswith("# Performance\n\nHand-written introduction, kept as is.\n")
    assert doc.endswith("## Hand-written notes after the section\nTrailing text.\n")


def test_quick_plan_is_small_and_full_plan_covers_the_issue_fleets():
    ap_quick = run_all.Plan.from_args(_ns(quick=True))
    ap_full = run_all.Plan.from_args(_ns(quick=False))
    assert ap_quick.repeat == 1 and max(ap_quick.fleets) <= 256
    assert ap_full.repeat == 3 and ap_full.fleets == (1024, 4096, 16384)


def _ns(**kw):
    import argparse

    base = {"quick": False, "fleets": None, "repeat": None, "kafka": None, "only": list(run_all.ALL),
            "out_dir": Path("/tmp/unused"), "engine_seconds": None, "service_seconds": None, "latency_seconds": None}
    return argparse.Namespace(**{**base, **kw})


def test_recordings_older_than_the_simulator_are_dropped_and_fresh_ones_kept(monkeypatch, tmp_path):
    repo, bench = tmp_path / "repo", tmp_path / "repo" / "bench"
    (repo / "producers" / "sim").mkdir(parents=True)
    (bench / "results").mkdir(parents=True)
    sim = repo / "producers" / "sim" / "fields.py"
    sim.write_text("# simulator\n")
    monkeypatch.setattr(run_all, "ROOT", repo)
    monkeypatch.setattr(run_all, "BENCH", bench)
    plan = run_all.Plan.from_args(_ns(fleets=[64], out_dir=bench / "results"))
    stale = bench / "results" / f"fleet-64gpu-{plan.engine_seconds}s-seed7.jsonl"
    fresh = bench / "results" / f"svc-64gpu-{plan.service_seconds}s.jsonl"
    other = bench / "results" / "fleet-2048gpu-120s-seed7.jsonl"   # not a planned size: left alone
    for p in (stale, fresh, other):
        p.write_text("{}\n")
    t = sim.stat().st_mtime
    os.utime(stale, (t - 100, t - 100))
    os.utime(other, (t - 100, t - 100))
    os.utime(fresh, (t + 100, t + 100))
    dropped = run_all.drop_stale_recordings(plan, log=lambda _: None)
    assert dropped == [stale]
    assert not stale.exists() and fresh.exists() and other.exists()


def test_replicas_table_gives_each_replicas_share_and_the_projection():
    fig = run_all.figure
    figures = [{"bench": "replicas", **fig(f"replicas.max_share.{n}", "busiest", "fraction", [max(shares)],
                                           replicas=n, hosts=64, shares=shares, cpu_s=cpu, wall_s=10.0)}
               for n, shares, cpu in ((1, [1.0], [40.0]), (4, [0.97, 0.01, 0.01, 0.01], [41.0, 3.0, 3.0, 2.5]))]
    figures.append({"bench": "replicas", **fig("replicas.process_rate", "one process", "GPU-samples/s", [20_000],
                                               hosts=64, processes_even_1hz=5, processes_even_10s=1,
                                               busiest_load_1hz=4.85, busiest_load_10s=0.49)})
    md = run_all.render_markdown(fake_result(figures=figures))
    assert "64 hosts of `llama3`" in md
    assert "| 4 | 97 % / 1 % / 1 % / 1 % | 41 / 3 / 3 / 2 | 97 % |" in md
    assert "| 1 | 100 % | 40 | 100 % |" in md
    assert "20,000 GPU-samples per CPU second" in md and "needs 5 such processes at 1 Hz and 1 at one" in md
    assert "4.8x one process's rate at 1 Hz and 0.5x at 10 s" in md
