"""Summary templates: ``"GPU {gpu} on {host}: SM clock {sm_clock:.0f} MHz"``.

Our own tiny format, not ``str.format``: only ``{name}`` and ``{name:.Nf}``/``{name:d}``, so a
template can never reach attributes or items of anything. ``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import re
from typing import Any

_PART = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::(\.\d{1,2}f|d))?$")


class TemplateError(ValueError):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message, self.pos = message, pos


def parse_template(text: str) -> list[str | tuple[str, str | None]]:
    """Literal strings and (name, format) pairs; raises ``TemplateError`` with the offset."""
    out: list[str | tuple[str, str | None]] = []
    pos = 0
    for m in _PART.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        tok = m.group()
        if tok in ("{{", "}}"):
            out.append(tok[0])
        elif tok in ("{", "}"):
            raise TemplateError(f"unmatched {tok!r} (write {tok * 2} for a literal brace)", m.start())
        else:
            fm = _FIELD.match(m.group(1).strip())
            if not fm:
                raise TemplateError(f"bad placeholder {tok!r}: use {{name}} or {{name:.1f}}", m.start())
            out.append((fm.group(1), fm.group(2)))
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def render(parts: list[str | tuple[str, str | None]], values: dict[str, Any]) -> str:
    out = []
    for p in parts:
        if isinstance(p, str):
            out.append(p)
            continue
        name, fmt = p
        v = values.get(name)
        if v is None or (isinstance(v, float) and v != v):
            out.append("?")
        elif fmt and isinstance(v, (int, float)):
            text = format(int(v), "d") if fmt == "d" else format(float(v), fmt)
            # -0.2 at .0f is "-0": a sign on a zero reads as a finding, so drop it.
            out.append(text[1:] if text.startswith("-") and not text.strip("-0.") else text)
        elif isinstance(v, float) and v.is_integer():
            out.append(str(int(v)))
        else:
            out.append(str(v))
    return "".join(out)
