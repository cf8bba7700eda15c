import textwrap

from pipeline.rules import diagnostics as D
from pipeline.rules import load_rules


def check(tmp_path, text, name="r.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    rs, diags = load_rules([p])
    return rs, diags, str(p)


GOOD = """
rules:
  - name: hot
    fault: thermal_hot
    severity: warning
    condition: gpu_temp > 85
"""


def test_a_good_file_loads(tmp_path):
    rs, diags, _ = check(tmp_path, GOOD)
    assert diags == [] and [r.meta.name for r in rs.rules] == ["hot"]
    assert rs.rules[0].spec.source.endswith("r.yaml:3")


def test_every_error_at_once_with_file_line_col_and_code(tmp_path):
    rs, diags, path = check(tmp_path, """
        rules:
          - name: hot
            fault: thermal_hot
            severity: urgent
            condition: gpu_tmp > 85
            for: soon
            summry: x
          - name: hot
            fault: heat
            severity: warning
            condition: >
              increase(ecc_sbe_volatile, 1m) > 5
              and clocks_event_reasons has HW_HOT
            summary: "{nope}"
          - name: Bad-Name
            severity: info
            condition: "1 >"
        """)
    assert rs is None
    got = {(d.line, d.col, d.code) for d in diags}
    assert (5, 15, D.BAD_VALUE) in got                  # severity
    assert (6, 16, D.UNKNOWN_METRIC) in got             # gpu_tmp, pointing at the name
    assert (7, 10, D.BAD_DURATION) in got
    assert (8, 5, D.UNKNOWN_KEY) in got                 # summry
    assert (9, 11, D.DUPLICATE) in got
    assert (10, 12, D.BAD_VALUE) in got                 # fault without a family
    assert (14, 36, D.UNKNOWN_BIT) in got               # HW_HOT inside a folded block scalar
    assert (15, 15, D.TEMPLATE) in got
    assert (16, 11, D.BAD_VALUE) in got                 # rule name
    assert (16, 5, D.MISSING_KEY) in got                # no fault
    assert (18, 20, D.EXPR_SYNTAX) in got               # the end of "1 >"
    text = [str(d) for d in diags]
    assert any(t.startswith(f'{path}:6:16: rule "hot": unknown metric \'gpu_tmp\'; did you mean \'gpu_temp\'')
               and t.endswith("[E102]") for t in text)
    assert any("did you mean 'summary'" in t for t in text)


def test_yaml_syntax_error(tmp_path):
    rs, diags, path = check(tmp_path, "rules:\n  - name: [unclosed\n")
    assert rs is None and diags[0].code == D.YAML_SYNTAX and diags[0].line >= 2


def test_python_tags_are_refused_never_built(tmp_path):
    rs, diags, _ = check(tmp_path, """
        rules:
          - !!python/object/apply:os.system ["touch /tmp/gw-pwned"]
          - name: ok
            fault: gpu_x
            severity: info
            condition: gpu_temp > 1
        """)
    assert rs is None and [d.code for d in diags] == [D.YAML_TAG]
    import os
    assert not os.path.exists("/tmp/gw-pwned")


def test_unsupported_level_and_unknown_top_level_key(tmp_path):
    rs, diags, _ = check(tmp_path, """
        groups: []
        rules:
          - name: a
            fault: nccl_slow
            severity: info
            level: comm
            condition: gpu_temp > 1
        """)
    assert {d.code for d in diags} == {D.UNKNOWN_KEY, D.UNSUPPORTED}


def test_empty_file_has_no_rules(tmp_path):
    rs, diags, _ = check(tmp_path, "")
    assert diags == [] and len(rs) == 0


def test_directory_loads_every_rule_file_but_not_tests(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yml").write_text(GOOD.replace("name: hot", "name: hot2"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yaml").write_text("tests: []")
    rs, diags = load_rules([tmp_path])
    assert diags == [] and sorted(r.meta.name for r in rs.rules) == ["hot", "hot2"]
