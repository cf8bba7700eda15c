"""Whatever an incidents file or a history state holds, loading it gives diagnostics or a
StateError, never another exception (bounded: GPUWARDEN_FUZZ_EXAMPLES scales the budget)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import StateError
from pipeline.incidents import RepeatHistory, parse_config
from tests.factories import fuzz_examples

SHIPPED_WORDS = ["join_window:", "quiet:", "actions:", "policies:", "causality:", "application_xids:", "- ",
                 "name:", "count:", "xid", "per:", "gpu", "threshold:", "window:", "5m", "action:", "watch",
                 "[", "]", "{", "}", ",", "\n", "  ", "&a", "*a", "!!python/object", ":", "-1", "1e999", "nvlink_*"]


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(SHIPPED_WORDS), max_size=60).map("".join)))
def test_any_text_gives_a_config_or_diagnostics(text: str) -> None:
    cfg, diags = parse_config(text, "f.yaml")
    assert (cfg is None) == bool(diags)
    assert all(str(d).startswith("f.yaml:") and d.code.startswith("I") for d in diags)


PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(st.one_of(PLAIN, st.fixed_dictionaries({"v": st.just(1), "keys": st.lists(PLAIN, max_size=4)})))
def test_any_state_loads_or_is_refused_with_a_state_error(state) -> None:
    h = RepeatHistory()
    try:
        h.load_state(state)
    except StateError:
        return
    assert RepeatHistory().load_state(h.to_state()) is None
