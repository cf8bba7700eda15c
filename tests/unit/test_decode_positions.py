"""The decoder says which records came in a per-host message (an array), on either path, so no
consumer has to parse ``#i`` off an origin string."""

from __future__ import annotations

import msgspec
import numpy as np

from pipeline.decode import Decoder
from pipeline.deadletters import Origins
from tests.factories import sample


def _enc(x) -> bytes:
    return msgspec.json.encode(x)


def test_a_batch_that_takes_the_slow_path_still_says_which_records_came_in_arrays():
    msgs = [_enc([sample(0, "n1", 0), sample(0, "n1", 1)]), b"{not json", _enc(sample(0, "n2", 0))]
    d = Decoder().decode_many(msgs, ["t[0]@1", "t[0]@2", "t[0]@3"])
    assert [x.reason for x in d.dead] == ["malformed_json"]
    assert isinstance(d.origins, Origins)
    assert d.origins.pos.tolist() == [0, 1, -1] and d.origins.msg.tolist() == [0, 0, 2]
    assert list(d.origins) == ["t[0]@1#0", "t[0]@1#1", "t[0]@3"]  # the dead letters' names, as ever


def test_records_refused_inside_an_array_keep_the_others_positions():
    bad = {"kind": "dcgm", "ts": "soon", "host": "n1", "gpu": 2, "fields": {}}
    msgs = [_enc([sample(0, "n1", 0), bad, sample(0, "n1", 1)]), _enc(sample(0, "n2", 0))]
    d = Decoder().decode_many(msgs, ["t[0]@1", "t[0]@2"])
    assert len(d.dead) == 1 and d.dead[0].origin == "t[0]@1#1"
    assert isinstance(d.origins, Origins)
    assert np.array_equal(d.origins.pos, [0, 2, -1]) and list(d.origins) == ["t[0]@1#0", "t[0]@1#2", "t[0]@2"]
    one = Decoder().decode(msgs[0], "t[0]@1")
    assert one.positions == [0, 2] and one.origins == ["t[0]@1#0", "t[0]@1#2"]
