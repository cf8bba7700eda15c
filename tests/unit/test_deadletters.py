"""Dead-letter reason codes and origins live beside DeadLetter; the decoder still names them."""

from __future__ import annotations

from pipeline import deadletters, decode, schema


def test_one_definition_under_every_old_name():
    for name in ("LATE", "TS_OUT_OF_RANGE", "ENTITY_LIMIT", "BLANK_SENTINEL", "NAN_FIELD", "NEGATIVE_VALUE",
                 "INTERNAL", "REASONS", "Origins", "take_origins"):
        assert getattr(decode, name) is getattr(deadletters, name) is getattr(schema, name), name
    assert len(set(deadletters.REASONS)) == len(deadletters.REASONS) == 25
