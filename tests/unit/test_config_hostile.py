"""Hostile config files for the loaders an operator writes YAML for: models.yaml, incidents.yaml,
the NIC ports file, the remediation inventory and the typed (serve, remediation) configs.

Each case is one that a loader accepted or crashed on: every bad input must be refused with a
message naming its key (and line), never accepted into a value that crashes later or silently
turns detection off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pipeline.bus.connection import load_file
from pipeline.errors import ConfigError
from pipeline.incidents.config import load_config as load_incidents
from pipeline.incidents.config import parse_config
from pipeline.models import load_models
from pipeline.models.config import load_model_specs
from pipeline.remediation import inventory
from pipeline.remediation.config import InventorySettings
from pipeline.remediation.config import load_config as load_remediation
from pipeline.rules.portconfig import load_port_config, parse_port_config
from pipeline.service.config import load_config as load_service
from pipeline.service.config import load_config_text
from pipeline.typedconfig import load_yaml
from tests.unit.remediation.factories import config as remediation_config

ROOT = Path(__file__).resolve().parents[2]

MODEL = """\
models:
  - name: m1
    detector: {detector}
    fault: {fault}
"""


def _models(tmp_path: Path, extra: str, detector: str = "counter_rate", fault: str = "hbm_x") -> Path:
    p = tmp_path / "models.yaml"
    p.write_text(MODEL.format(detector=detector, fault=fault) + textwrap.indent(textwrap.dedent(extra), "    "))
    return p


@pytest.mark.parametrize(
    "detector, extra, key",
    [
        # ZeroDivisionError while the model set was built: `replay --models` exited 70, "internal error".
        ("counter_rate", "decider: {kind: quantile, half_life: 0}", "models[0].decider.half_life"),
        # Refused only by the decider, under a key that names no model ('decider.margin').
        ("counter_rate", "decider: {kind: quantile, margin: 0.5}", "models[0].decider.margin"),
        ("counter_rate", "decider: {kind: threshold, threshold: 0}", "models[0].decider.threshold"),
        # A clear level above the raising one drops a flag on its next row: `for:` never holds.
        ("counter_rate", "decider: {kind: quantile, clear_ratio: 5}", "models[0].decider.clear_ratio"),
        # The feature list set through params skipped the catalogue check: a KeyError at build, or
        # a model of no features that never scores.
        ("counter_rate", "params: {counters: [bogus]}", "models[0].params.counters"),
        ("counter_rate", "params: {counters: []}", "models[0].params.counters"),
        # Each batch then raised (a division by zero, a singular matrix, an int64 overflow) and was
        # dead-lettered: the model never scored.
        ("thermal_residual", "params: {forget_s: 0}", "models[0].params.forget_s"),
        ("thermal_residual", "params: {ridge: 0}", "models[0].params.ridge"),
        ("cohort_hst", "params: {period: 9223372036854775808}", "models[0].params.period"),
        ("cohort_hst", "params: {n_trees: 1.5}", "models[0].params.n_trees"),
        ("counter_rate", "warmup: 2.5", "models[0].warmup"),
        # Wrong types that read as "nothing" were taken for it.
        ("counter_rate", "params: []", "models[0].params"),
        ("counter_rate", "labels: false", "models[0].labels"),
        ("counter_rate", "explained_by: {}", "models[0].explained_by"),
        # str.format of the summary at every alert: a width of 10^11 raised MemoryError in the
        # driver, attribute access reads what the template should not, a malformed one fell back
        # silently.
        ("counter_rate", "summary: '{score:>99999999999}'", "models[0].summary"),
        ("counter_rate", "summary: '{host.__class__}'", "models[0].summary"),
        ("counter_rate", "summary: 'score {score'", "models[0].summary"),
        ("counter_rate", "summary: '{score:{host}}'", "models[0].summary"),
    ],
)
def test_models_yaml_refuses_values_that_crash_or_disable_a_model(tmp_path, detector, extra, key):
    fault = {"thermal_residual": "thermal_x", "cohort_hst": "gpu_x"}.get(detector, "hbm_x")
    if detector == "counter_rate" and "counters" not in extra:
        extra = "features: [ecc_sbe_volatile]\n" + extra
    with pytest.raises(ConfigError) as e:
        load_models(_models(tmp_path, extra, detector, fault))
    assert e.value.key == key, str(e.value)


@pytest.mark.parametrize("top", ["models: {}", "models: 0", "models: false", "models: ''"])
def test_a_models_key_that_is_no_list_is_refused_not_read_as_no_models(tmp_path, top):
    p = tmp_path / "models.yaml"
    p.write_text(top + "\n")
    with pytest.raises(ConfigError) as e:
        load_models(p)
    assert e.value.key == "models", str(e.value)


def test_models_yaml_still_takes_plain_summaries_and_whole_floats(tmp_path):
    extra = """\
    features: [ecc_sbe_volatile]
    warmup: 600.0
    summary: "GPU {gpu} on {host}: {observed!s} vs {expected:.1f} ({{score}} {score:>8.2f})"
    """
    (m,) = load_models(_models(tmp_path, extra)).models.values()
    assert m.spec.warmup == 600 and m.spec.summary.startswith("GPU {gpu}")


@pytest.mark.parametrize(
    "text, line",
    [
        ("models:\n  - name: a\n    name: b\n    detector: counter_rate\n    fault: hbm_x\n", 3),
        ("kafka: {prefix: a, prefix: b}\n", 1),
        ("kafka: {prefix: a}\nhttp: {}\nkafka: {prefix: b}\n", 3),
    ],
)
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, text, line):
    # PyYAML keeps the last of two equal keys: the first value, the one reviewed, was silently lost.
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        if text.startswith("models:"):
            load_models(p)
        else:
            load_config_text(text, env={}, source=str(p))
    assert f"{p}:{line}:" in str(e.value) and "given twice" in str(e.value), str(e.value)


def test_merge_keys_and_shared_anchors_still_load_in_typed_configs(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nover: {<<: *b, y: 3}\nsame: *b\n")
    assert load_yaml(p) == {"base": {"x": 1, "y": 2}, "over": {"x": 1, "y": 3}, "same": {"x": 1, "y": 2}}


@pytest.mark.parametrize(
    "text, expected",
    [
        # The first pattern wins: the second action, the one meant, was silently dropped.
        ("rule_actions: {'*': watch, '*': drain_node}\n", "1:28: rule_actions: '*' is given twice [I008]"),
        # Nothing repeats within 0 s: every application XID was suppressed, and the policy never escalated.
        ("application_xids: {rules: [x], xids: [13], repeat: 3, window: 0}\n", "window: must be longer than 0s [I007]"),
        (
            "policies:\n  - {name: p, count: xid, xids: [79], per: gpu, threshold: 2, window: 0s, action: watch}\n",
            "2:71: policy p: window: must be longer than 0s [I007]",
        ),
        # A list where a value belongs was printed as PyYAML's repr of every node in it.
        ("join_window: [[a, b], {c: d}]\n", "1:14: join_window: a list is not a duration [I007]"),
    ],
)
def test_incidents_yaml_refuses_duplicates_empty_windows_and_says_what_it_got(text, expected):
    cfg, diags = parse_config(text, "inc.yaml")
    shown = "\n".join(map(str, diags))
    assert cfg is None and expected in shown, shown


def test_a_node_in_a_message_is_named_not_dumped():
    big = "join_window: [" + ", ".join(["[" + ", ".join(["x" * 20] * 10) + "]"] * 800) + "]\n"
    _, diags = parse_config(big, "inc.yaml")
    assert len(str(diags[0])) < 200, str(diags[0])[:300]
    _, pdiags = parse_port_config("symbol_errors: {window: [" + ", ".join(["[a, b]"] * 200) + "]}\n", "p.yaml")
    assert len(str(pdiags[0])) < 200 and "a list is not a duration" in str(pdiags[0]), str(pdiags[0])[:300]


@pytest.mark.parametrize(
    "text, expected",
    [
        # `len(flaps) >= 0` holds for every port: each raised network_port_flapping (drain_node).
        ("flapping: {threshold: 0}\n", '1:23: rule "flapping": flapping.threshold: 0 is not a whole number from 1'),
        ("flapping: {threshold: 0.5}\n", "flapping.threshold: 0.5 is not a whole number from 1"),
        # Both entries were kept and the first silently won, case folded.
        (
            "active_ports: {models: {h100: {ports: 8, rate_gbps: 400}, H100: {ports: 1, rate_gbps: 1}}}\n",
            "1:59: rule \"active_ports\": active_ports.models: 'H100' is given twice [R008]",
        ),
    ],
)
def test_ports_yaml_refuses_a_flap_threshold_that_always_fires_and_duplicate_models(text, expected):
    cfg, diags = parse_port_config(text, "p.yaml")
    shown = "\n".join(map(str, diags))
    assert cfg is None and expected in shown, shown


def test_a_healthy_port_does_not_flap_with_the_smallest_threshold_allowed():
    from tests.unit.rules.factories import port_series, run_ports

    alerts, _ = run_ports(port_series(300), config_text="flapping: {threshold: 1}\n")
    assert alerts == []


def test_incidents_and_ports_files_are_read_bounded(tmp_path):
    # Both read the whole file before their size limit: a 3 GiB file (a log given by mistake)
    # filled the memory. Run apart, under a memory limit, so a regression cannot take the host.
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(3 << 30)  # sparse: no disk, every byte reads as 0
    code = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
        from pipeline.incidents.config import load_config
        from pipeline.rules.portconfig import load_port_config
        print(load_config({str(big)!r})[1][0].code, load_port_config({str(big)!r})[1][0].code)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["I010", "R010"], out.stderr[-500:]


def test_a_device_given_as_a_config_is_refused():
    # /dev/zero never ends and /dev/stdin waits: neither is a config file.
    cfg, diags = load_incidents("/dev/zero")
    assert cfg is None and [d.code for d in diags] == ["I013"] and "not a regular file" in diags[0].message


def test_inventory_yaml_list_keeps_host_names_as_written():
    # YAML 1.1 read `- 010` as 8, `- 0x1f` as 31 and `- 1:30` as 90: hosts never listed were
    # trusted and the listed ones were not.
    hosts, bad = inventory.parse_hosts("- 010\n- 0x1f\n- 1:30\n- gpu-node-1\n", "file")
    assert hosts == {"010", "0x1f", "gpu-node-1"} and bad == ["1:30"]


def test_inventory_file_with_a_bom_keeps_its_first_host(tmp_path):
    p = tmp_path / "hosts.txt"
    p.write_bytes("\ufeffgpu-node-1\ngpu-node-2\n".encode())
    inv = inventory.build_inventory(InventorySettings(source="file", path=str(p)))
    assert inv is not None and inv.hosts == {"gpu-node-1", "gpu-node-2"}


def test_an_inventory_file_over_the_limit_is_a_failed_refresh(tmp_path, monkeypatch):
    p = tmp_path / "hosts.txt"
    p.write_text("gpu-node-1\n")
    inv = inventory.build_inventory(InventorySettings(source="file", path=str(p)))
    assert inv is not None and inv.hosts == {"gpu-node-1"}
    # The file was read whole at every refresh, whatever its size; past the limit a cut-off last
    # line would be a host name nobody wrote.
    monkeypatch.setattr(inventory, "LIST_LIMIT", 64)
    p.write_text("".join(f"gpu-node-{i}\n" for i in range(2, 40)))
    assert inv.refresh() is False and "limit" in (inv.error or "")
    assert inv.hosts == {"gpu-node-1"}


def test_a_listing_cut_off_at_the_limit_is_a_failed_refresh(monkeypatch):
    from pipeline.remediation.actions import CommandResult

    out = {"text": "gpu-node-1\n"}
    inv = inventory.build_inventory(
        InventorySettings(source="slurm"), runner=lambda *a, **k: CommandResult(0, out["text"], "")
    )
    assert inv is not None and inv.hosts == {"gpu-node-1"}
    # run_command keeps the first LIST_LIMIT characters: "gpu-node-12" cut to "gpu-node-1" was trusted.
    monkeypatch.setattr(inventory, "LIST_LIMIT", 64)
    out["text"] = "".join(f"gpu-node-{i}\n" for i in range(2, 40))[:64]
    assert inv.refresh() is False and "limit" in (inv.error or "")
    assert inv.hosts == {"gpu-node-1"}


@pytest.mark.parametrize(
    "inv, key",
    [
        # Ignored: Slurm's whole node list was trusted, not the hosts written.
        ({"source": "slurm", "hosts": ["gpu-node-1"]}, "inventory.hosts"),
        ({"source": "any", "hosts": ["gpu-node-1"]}, "inventory.hosts"),
        ({"source": "list", "hosts": ["gpu-node-1"], "path": "hosts.txt"}, "inventory.path"),
        # Every refresh then failed at run time, and no host was ever known.
        ({"source": "slurm", "argv": [""]}, "inventory.argv"),
        ({"source": "slurm", "argv": ["sinfo\x00"]}, "inventory.argv"),
    ],
)
def test_inventory_settings_that_would_be_ignored_or_never_run_are_refused(tmp_path, inv, key):
    with pytest.raises(ConfigError) as e:
        remediation_config(tmp_path, inventory=inv)
    assert e.value.key == key, str(e.value)


@pytest.mark.parametrize(
    "args, files",
    [
        (["rules", "check", "{d}"], {"gpu.yaml": "", "fabric/ports.yaml": "flapping: {threshold: 0}\n"}),
        (
            ["replay", "--models", "{d}/models.yaml", "{d}/r.jsonl"],
            {
                "models.yaml": "models:\n  - {name: m, detector: counter_rate, fault: hbm_x, features: [ecc_sbe_volatile],"
                " decider: {kind: quantile, half_life: 0}}\n",
                "r.jsonl": "",
            },
        ),
    ],
)
def test_the_cli_exits_cleanly_on_a_hostile_file(tmp_path, args, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    argv = [a.format(d=tmp_path) for a in args]
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode not in (0, 70) and "Traceback" not in out.stderr and "internal error" not in out.stderr, (
        out.returncode,
        out.stderr[-800:],
    )


def _fifo_readers() -> list:
    def diagnostics(load):
        def run(p):
            cfg, diags = load(p)
            assert cfg is None
            raise ConfigError("(diagnostic)", "; ".join(d.message for d in diags))

        return run

    return [
        pytest.param(load_service, id="serve --config"),
        pytest.param(load_file, id="serve --kafka-config"),
        pytest.param(load_remediation, id="remediation config"),
        pytest.param(load_model_specs, id="models.yaml"),
        pytest.param(diagnostics(load_incidents), id="incidents.yaml"),
        pytest.param(diagnostics(load_port_config), id="ports file"),
    ]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("load", _fifo_readers())
def test_a_config_that_is_a_fifo_is_refused_not_waited_on(tmp_path, load):
    # open() of a FIFO waits for a writer: `serve --config FIFO` hung before saying anything.
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    got: list = []

    def read():
        try:
            load(fifo)
        except ConfigError as e:
            got.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    finished = not t.is_alive()
    if not finished:  # a writer lets the blocked open() return
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
    assert finished, "the reader waited on the FIFO"
    assert got and "not a regular file (a FIFO)" in str(got[0])


REMEDIATION = """\
state_file: {d}/state.sqlite
audit: {{kafka: false, file: {d}/audit.jsonl}}
inventory: {{source: any}}
guardrails:
  cooldown: {cooldown}
actions: {{drain: {{type: slurm_drain}}}}
receivers: [{{name: drain, actions: [drain]}}]
route:
  receiver: drain
  group_wait: {wait}
"""


@pytest.mark.parametrize(
    ("cooldown", "wait", "key", "where", "read"),
    [
        ("1:30", "30s", "cooldown", "5:13", "90"),  # 90 s, or was it 1h30m?
        ("1h", "010", "group_wait", "10:15", "8"),
        ("1h", "-010", "group_wait", "10:15", "-8"),
        ("1:30.5", "30s", "cooldown", "5:13", "90.5"),
    ],
)
def test_a_remediation_duration_yaml_reads_as_another_number_is_refused(tmp_path, cooldown, wait, key, where, read):
    # The remediation config's durations took YAML 1.1's reading silently: a 1:30 cooldown held
    # 90 s and a group_wait of 010 waited 8 s.
    p = tmp_path / "remediation.yaml"
    p.write_text(REMEDIATION.format(d=tmp_path, cooldown=cooldown, wait=wait))
    with pytest.raises(ConfigError) as e:
        load_remediation(p)
    assert e.value.key == key and f"{p}:{where}: YAML 1.1 reads" in e.value.reason and f" as {read}:" in e.value.reason


def test_the_same_durations_quoted_or_in_units_load(tmp_path):
    p = tmp_path / "remediation.yaml"
    p.write_text(REMEDIATION.format(d=tmp_path, cooldown="1m30s", wait="'010'"))
    cfg = load_remediation(p)
    assert cfg.raw.guardrails.cooldown == "1m30s" and cfg.raw.route.group_wait == "010"
    p.write_text(REMEDIATION.format(d=tmp_path, cooldown="'1:30'", wait="10"))
    with pytest.raises(ConfigError, match=r"'1:30' is not a duration: write minutes and seconds as 1m30s"):
        load_remediation(p)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[1, 010]", "(file)"),  # an entry of a list has no key of its own: its line says where
        ("{a: {b: 0_17}}", "b"),
        ("{x: 12:30:00}", "x"),
    ],
)
def test_typed_configs_refuse_octal_and_sexagesimal_numbers_anywhere(text, key):
    with pytest.raises(ConfigError) as e:
        load_config_text(f"service:\n  anything: {text}\n", "svc.yaml")
    assert e.value.key == key and "YAML 1.1 reads" in e.value.reason


def test_other_number_spellings_still_load(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("a: 1_000\nb: 0x10\nc: 0\nd: 0.5\ne: 012.5\nf: '010'\ng: 08\nh: '1:30'\n")
    assert load_yaml(p) == {"a": 1000, "b": 16, "c": 0, "d": 0.5, "e": 12.5, "f": "010", "g": "08", "h": "1:30"}


def test_a_model_param_with_a_leading_zero_is_refused(tmp_path):
    p = tmp_path / "models.yaml"
    p.write_text("models:\n  - name: m1\n    detector: counter_rate\n    fault: hbm_x\n    params: {warmup: 030}\n")
    with pytest.raises(ConfigError) as e:
        load_models(p)
    assert e.value.key == "warmup" and ":5:22: YAML 1.1 reads 030 as 24" in e.value.reason
