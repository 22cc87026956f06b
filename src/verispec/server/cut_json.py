"""JSON cut short (a call's arguments when max_tokens ran out: `{"path": "/`), closed: what was written, up to the
last value that is whole or a string value as far as it goes, with its open strings, arrays and objects closed
(`{"path": "/"}`). A key, a number or a literal cut in the middle is left out with what leads to it. Used where a
cut call must be read again (a stored response continued, a custom tool's input) rather than refused."""

from __future__ import annotations

import json
from typing import Any

from ..json_text import JsonTextError, parse_json

MAX_TRIES = 32  # candidate cuts parsed, from the longest; each but the last few is whole or fails at its end


def closed_object(text: str) -> dict[str, Any]:
    """The object `text` (a JSON object, perhaps cut short) holds as far as it is written; {} where nothing of it
    is an object."""
    for end, closing in reversed(_cuts(text)[-MAX_TRIES:]):
        try:
            value = parse_json(_without_cut_escape(text[:end]) + closing, "a cut call's arguments")
            json.dumps(value, allow_nan=False)  # NaN and Infinity are not JSON, whatever the reader allows
        except (JsonTextError, ValueError):
            continue
        return value if isinstance(value, dict) else {}
    return {}


def _cuts(text: str) -> list[tuple[int, str]]:
    """Where `text` may be cut and what closes it there, shortest first: after each character that may end a value
    (outside strings) or opens a container, with its containers closed; the whole text with its last string closed
    where that string is a value."""
    stack: list[str] = []  # the open containers' closing brackets
    cuts: list[tuple[int, str]] = []
    in_string = escaped = key = False
    expect_key = False  # in an object, after "{" or ","
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if not key:
                    cuts.append((i + 1, "".join(reversed(stack))))
            continue
        if char == '"':
            in_string, key, expect_key = True, expect_key, False
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
            expect_key = char == "{"
            cuts.append((i + 1, "".join(reversed(stack))))
        elif char in "}]":
            if stack:
                stack.pop()
            cuts.append((i + 1, "".join(reversed(stack))))
        elif char == ",":
            expect_key = bool(stack) and stack[-1] == "}"
        elif not char.isspace() and char != ":":
            cuts.append((i + 1, "".join(reversed(stack))))  # perhaps the end of a number or a literal
    if in_string and not key:
        cuts.append((len(text) - 1 if escaped else len(text), '"' + "".join(reversed(stack))))
    return cuts


def _without_cut_escape(text: str) -> str:
    """`text` without a \\u escape cut before its four digits."""
    at = text.rfind("\\u")
    if at >= 0 and len(text) - at < 6 and (at == 0 or text[at - 1] != "\\"):
        return text[:at]
    return text
