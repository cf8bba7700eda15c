import pytest

from pipeline.rules.template import TemplateError, parse_template, render


def fmt(text, **values):
    return render(parse_template(text), values)


def test_placeholders_formats_and_literal_braces():
    assert fmt("GPU {gpu} at {t:.1f} °C {{ok}}", gpu=3, t=88.25) == "GPU 3 at 88.2 °C {ok}"
    assert fmt("{n:d} errors", n=7.9) == "7 errors"
    assert fmt("{x}", x=5.0) == "5" and fmt("{x}", x=None) == "?" and fmt("{x:.0f}", x=float("nan")) == "?"


@pytest.mark.parametrize("value, text", [(-0.2, "0"), (-0.0, "0"), (-0.6, "-1"), (0.4, "0"), (-3.0, "-3")])
def test_a_rounded_zero_has_no_sign(value, text):
    assert fmt("{v:.0f}", v=value) == text


def test_negative_decimals_keep_their_sign():
    assert fmt("{v:.2f}", v=-0.004) == "0.00" and fmt("{v:.2f}", v=-0.25) == "-0.25"


def test_bad_placeholders_are_errors_with_their_offset():
    with pytest.raises(TemplateError) as e:
        parse_template("ok {a.b}")
    assert e.value.pos == 3
