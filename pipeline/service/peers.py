"""What the fleet partitions send each other when the models run in shards by host
(``service.shard_models``; pipeline/shardstage.py): the body of a version-2 envelope on
``<prefix>.fleet``, whose sender is a fleet partition.

A body is msgpack (arrays as the model state's extension type, ``pipeline.engine.arrays``) of::

    {"parts": [<cohort part>, ...],     # the sender's new cohort parts, in order (to every shard)
     "findings": [<findings>, ...],     # the sender's scorer to shard q: its lanes' findings of q's GPUs
     "scored": <ts> | None,             # ... complete for every tick before it
     "alerts": [<alert event>, ...],    # shard q to shard 0 (incidents on): its models' alerts
     "done": <ts> | None}               # ... complete before it

Each is checked field by field before anything is applied (``decode``): a part as
``ModelSet.check_part`` says this build's models make one, findings as
``pipeline.models.findings.from_wire`` does, times finite and in the decoder's range (or +inf:
flushed), sizes bounded, and each kind only on the way it travels (findings only of the
sender's own lanes, ``shards.scorer_of``; alerts only to shard 0). The alerts come back typed,
for the fleet task to check one by one as it does the host stage's.

>>> body = encode({"parts": [{"epoch": 5, "until": 6}], "scored": 1.7e9})
>>> from pipeline.models import load_models
>>> msg = decode(body, load_models(), sender=0, receiver=1, shards=4)
>>> msg.parts, msg.scored, msg.done
([{'epoch': 5, 'until': 6}], 1700000000.0, None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgspec

from pipeline.decode import TS_MAX, TS_MIN
from pipeline.models.cohorts import PartError
from pipeline.models.findings import Findings, FindingsError, from_wire, to_wire
from pipeline.models.modelset import ModelSet
from pipeline.models.statecodec import decode_state, encode_state
from pipeline.schema import AlertEvent

# The envelope version of a message between fleet partitions (3: its MAC names the partition it
# is for; a 2 of earlier builds, which did not, is refused as another version).
PEER_ENVELOPE = 3
# What one message may carry (a forged one costs bounded work): a part is ~1-100 KiB (a
# Half-Space forest's masses), findings ~40 bytes a GPU.
MAX_PARTS = 8
MAX_FINDINGS = 256
MAX_ALERTS = 500
_KEYS = frozenset({"parts", "findings", "scored", "alerts", "done"})
_ALERTS = msgspec.msgpack.Decoder(list[AlertEvent])


class PeerError(ValueError):
    """A peer body that is not what a fleet partition sends: ``kind`` is ``"size"`` (too
    large) or ``"shape"`` (anything else)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@dataclass
class PeerMessage:
    parts: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Findings] = field(default_factory=list)
    scored: float | None = None
    alerts: list[AlertEvent] = field(default_factory=list)  # each checked again by the fleet task
    done: float | None = None


def encode(body: dict[str, Any]) -> bytes:
    """A peer body of ``parts``, ``findings`` (``Findings``), ``scored``, ``alerts``
    (``AlertEvent``) and ``done``, each optional."""
    d = {
        "parts": list(body.get("parts", ())),
        "findings": [to_wire(f) for f in body.get("findings", ())],
        "scored": _time_out(body.get("scored")),
        "alerts": [msgspec.to_builtins(a) for a in body.get("alerts", ())],
        "done": _time_out(body.get("done")),
    }
    return encode_state(d)


def chunks(
    parts: Sequence[dict[str, Any]],
    findings: Sequence[Findings],
    alerts: Sequence[AlertEvent],
    scored: float | None,
    done: float | None,
) -> list[bytes]:
    """The bodies that carry all of it within the bounds of one message, the progress
    (``scored``, ``done``) in the last, after what it covers."""
    out: list[bytes] = []
    n = max(
        1,
        math.ceil(len(parts) / MAX_PARTS),
        math.ceil(len(findings) / MAX_FINDINGS),
        math.ceil(len(alerts) / MAX_ALERTS),
    )
    for i in range(n):
        last = i == n - 1
        out.append(
            encode(
                {
                    "parts": parts[i * MAX_PARTS : (i + 1) * MAX_PARTS],
                    "findings": findings[i * MAX_FINDINGS : (i + 1) * MAX_FINDINGS],
                    "alerts": alerts[i * MAX_ALERTS : (i + 1) * MAX_ALERTS],
                    "scored": scored if last else None,
                    "done": done if last else None,
                }
            )
        )
    return out


def decode(body: bytes, models: ModelSet, sender: int, receiver: int, shards: int) -> PeerMessage:
    """The message in ``body`` from fleet partition ``sender`` to ``receiver`` (of ``shards``),
    checked (``PeerError`` saying what is wrong)."""
    try:
        d = decode_state(body)
    except (msgspec.DecodeError, ValueError) as e:
        raise PeerError("shape", f"not a peer body: {e}") from None
    if not isinstance(d, dict) or set(d) != _KEYS:
        raise PeerError("shape", f"a peer body is a map of {', '.join(sorted(_KEYS))}")
    parts, found, alerts = d["parts"], d["findings"], d["alerts"]
    if not isinstance(parts, list) or not isinstance(found, list) or not isinstance(alerts, list):
        raise PeerError("shape", "parts, findings and alerts are lists")
    if len(parts) > MAX_PARTS or len(found) > MAX_FINDINGS or len(alerts) > MAX_ALERTS:
        raise PeerError("size", f"at most {MAX_PARTS} parts, {MAX_FINDINGS} findings and {MAX_ALERTS} alerts")
    if alerts or d["done"] is not None:
        if receiver != 0:
            raise PeerError("shape", f"alerts to shard {receiver}: only shard 0 runs the incident stage")
    msg = PeerMessage(scored=_time_in(d["scored"], "scored"), done=_time_in(d["done"], "done"))
    if alerts:
        try:
            # Typed again from plain msgpack: an array (the extension type) is no alert's field.
            msg.alerts = _ALERTS.decode(msgspec.msgpack.encode(alerts))
        except (TypeError, OverflowError, msgspec.ValidationError, msgspec.DecodeError) as e:
            raise PeerError("shape", f"alerts: {e}") from None
    for p in parts:
        try:
            models.check_part(p)
        except PartError as e:
            raise PeerError("shape", f"cohort part: {e}") from None
        msg.parts.append(p)
    level_gpu = models.nccl_levels()
    for f in found:
        try:
            got = from_wire(f, level_gpu)
        except FindingsError as e:
            raise PeerError("shape", str(e)) from None
        # A shard scores its own lanes only (a build before lanes: shard 0 scored them all).
        owner = 0 if got.lane < 0 else got.lane % shards
        if owner != sender:
            raise PeerError("shape", f"findings of lane {got.lane} from shard {sender}: shard {owner} scores it")
        msg.findings.append(got)
    return msg


def _time_out(t: float | None) -> float | None:
    return None if t is None or t == -math.inf else float(t)


def _time_in(t: Any, what: str) -> float | None:
    """A progress time: None (nothing yet), +inf (flushed) or a time the decoder accepts."""
    if t is None:
        return None
    if type(t) is not float or not (t == math.inf or TS_MIN <= t <= TS_MAX):
        raise PeerError("shape", f"{what} {t!r}: a time within {TS_MIN:.0f}..{TS_MAX:.0f}, or +inf")
    return t
