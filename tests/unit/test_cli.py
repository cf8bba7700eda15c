import json
import subprocess
import sys


from pipeline.cli import main
from pipeline.decode import Decoder


def test_sim_writes_valid_records_and_labels_identically_twice(tmp_path):
    paths = []
    for i in range(2):
        out, labels = tmp_path / f"x{i}.jsonl", tmp_path / f"y{i}.json"
        assert main(["sim", "--hosts", "4", "--duration", "600", "--seed", "1", "--scenario", "mixed",
                     "--out", str(out), "--labels-out", str(labels)]) == 0
        paths.append((out, labels))
    (a, la), (b, lb) = paths
    assert a.read_bytes() == b.read_bytes() and la.read_bytes() == lb.read_bytes()
    dec = Decoder()
    kinds = set()
    for n, line in enumerate(a.read_bytes().splitlines(), 1):
        d = dec.decode(line, f"x:{n}")
        assert len(d.records) == 1, d.dead
        kinds.add(d.records[0].__class__.__name__)
    assert kinds == {"DcgmRecord", "NcclRecord"}
    doc = json.loads(la.read_text())
    assert doc["seed"] == 1 and len(doc["hosts"]) == 4
    faults = [f for f in doc["faults"] if f.get("fault")]
    assert faults and all(f["onset"] < f["end"] for f in faults)


def test_other_seed_other_output(tmp_path):
    for seed in (1, 2):
        main(["sim", "--hosts", "2", "--duration", "60", "--seed", str(seed), "--out", str(tmp_path / f"{seed}.jsonl")])
    assert (tmp_path / "1.jsonl").read_bytes() != (tmp_path / "2.jsonl").read_bytes()


def test_sim_needs_exactly_one_destination(tmp_path, capsys):
    assert main(["sim", "--hosts", "1", "--duration", "5"]) == 2
    assert "exactly one of --out FILE or --kafka" in capsys.readouterr().err


def test_replay_writes_alerts_and_dead_letters(tmp_path, capsys):
    rec = tmp_path / "r.jsonl"
    main(["sim", "--hosts", "4", "--duration", "900", "--seed", "3", "--scenario", "gpu_lost", "--out", str(rec)])
    with rec.open("a") as fh:
        fh.write("this is not json\n")
    alerts, dlq = tmp_path / "a.jsonl", tmp_path / "d.jsonl"
    assert main(["replay", str(rec), "--alerts-out", str(alerts), "--dlq-out", str(dlq)]) == 0
    fired = [json.loads(x) for x in alerts.read_text().splitlines()]
    assert any(a["fault"] == "gpu_lost" and a["state"] == "firing" for a in fired)
    dead = [json.loads(x) for x in dlq.read_text().splitlines()]
    assert any(d["reason"] == "malformed_json" and d["origin"].endswith(f"r.jsonl:{sum(1 for _ in rec.open())}")
               for d in dead)
    err = capsys.readouterr().err
    assert "records/s" in err and "malformed_json: 1" in err


def test_demo_runs_to_its_summary_table():
    proc = subprocess.run([sys.executable, "-m", "pipeline", "demo", "--hosts", "4", "--duration", "600"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "Injected faults vs alerts" in proc.stdout
    assert "injected faults detected" in proc.stdout


def test_eval_prints_per_family_and_per_detector_tables_verdicts_and_training_time(capsys, tmp_path):
    page = tmp_path / "eval.html"
    assert main(["eval", "--scenario", "thermal", "--seeds", "1", "--hosts", "1", "--duration", "600",
                 "--markdown", "--job-gpus", "1024", "--checkpoint-interval", "900", "--html", str(page)]) == 0
    html = page.read_text()
    assert "data:image/png;base64," in html and "gpuwarden beats community" in html
    out = capsys.readouterr().out
    assert "| thermal | gpuwarden | 1 | 1 | 100%" in out
    for det in ("community", "dcgm-health"):
        assert f"| {det} |" in out and f"gpuwarden beats {det}" in out
    assert "false / 1,000 GPU-h" in out and "95% upper bound" in out
    assert "1,024 GPUs, checkpoint every 900 s" in out and "| watchdog only |" in out


def test_eval_reports_each_sampling_interval_and_re_fires(capsys):
    assert main(["eval", "--scenario", "thermal", "--seeds", "1", "--hosts", "1", "--duration", "600",
                 "--interval", "1", "10", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "sampled every 1 s" in out and "sampled every 10 s" in out
    assert "**thermal: per sampling interval**" in out and "re-fires" in out
    assert "| 10 s | gpuwarden | 1/1 (100%) |" in out


def test_serve_fleet_stage_without_models_is_a_config_error_naming_the_key(tmp_path, capsys):
    # The fleet stage runs the models, the hang detector or the incidents: with none it has
    # nothing to do (rules without a hang.yaml beside them).
    rules = tmp_path / "rules"
    rules.mkdir()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"service:\n  rules: [{rules}]\n  models: none\n  incidents: false\n")
    code = main(["serve", "--config", str(cfg), "--stage", "fleet", "--insecure-state", "--kafka", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code != 0 and "service.stage" in err and "models" in err
