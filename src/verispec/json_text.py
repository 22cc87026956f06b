"""JSON carried inside a request's strings (tool-call arguments, tool results, schemas sent as text), read with the
same bounds as a request body: Python's `json.loads` recurses once per level and a string of 100,000 brackets
raises RecursionError deep in a handler; this reader (pydantic's, native, no recursion into Python) stops at
MAX_DEPTH levels and says so as a user's mistake. It reads JSON as RFC 8259 writes it: NaN and Infinity are not
JSON (Python's reader takes them)."""

from __future__ import annotations

from typing import Any

from .errors import InvalidParameterError

MAX_DEPTH = 201  # the levels pydantic's parser (jiter) reads, in a request body and in a string alike


class JsonTextError(InvalidParameterError):
    """A string that should hold JSON does not, or nests deeper than MAX_DEPTH levels."""


def parse_json(text: str | bytes, what: str = "the JSON text") -> Any:
    """The value `text` holds; raises JsonTextError naming `what` when it is not JSON or nests too deep."""
    from pydantic_core import from_json  # here: a command that reads no such JSON starts without it

    try:
        return from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise JsonTextError(f"{what} nests deeper than {MAX_DEPTH} levels") from None
        raise JsonTextError(f"{what} is not valid JSON ({exc})") from None


def nests_too_deep(error: Exception) -> bool:
    """Whether a parser's error says the JSON nested past its recursion limit."""
    return "recursion limit" in str(error)
