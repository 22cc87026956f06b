"""Tool calls written without the template's markers, as models of the Hermes family write them under
`tool_choice: "auto"` (Qwen2.5-Coder was not trained on its template's `<tool_call>` tags; vLLM issue #32926 found its
calls in code blocks): a fenced JSON block, a bare JSON answer, the template's own example with doubled braces
(`{{"name": ..., "arguments": ...}}`), or `<tools>`/`<tool_call>` spelled as text. Each is a call only where it names a
declared tool and its arguments are valid against that tool's schema (call_schema.py: read strictly, validated as the
grammar takes the schema); anything else stays text, as it was written. A tag named after a tool is read for that
tool only.

    find_calls(text, declared)   a finished answer: (content, calls), or None where it holds no call
    LooseStream                  a growing answer: content as far as it cannot become a call, calls once complete

Only parsing: what the model writes (and greedy output) is the same with or without it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .call_schema import STRICT, read_json, validates

FENCE_LINE = re.compile(r"(?m)^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*$\n?")
CALL_LANGUAGES = ("", "json", "JSON", "tool_call", "tool_code")
CALL_TAGS = ("tools", "tool_call", "function_call")  # tags around calls; a tag named after a tool holds its arguments
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Found:
    name: str
    arguments: str  # JSON text of the arguments object


@dataclass(frozen=True)
class Declared:
    """The tools a request declared: name -> the JSON schema of its arguments (None: no arguments)."""

    schemas: dict[str, dict | None]
    parallel: bool = True

    @cached_property
    def tags(self) -> tuple[str, ...]:
        return (*CALL_TAGS, *self.schemas)

    @cached_property
    def tagged(self) -> re.Pattern:
        names = "|".join(re.escape(tag) for tag in self.tags)
        return re.compile(rf"<({names})>\s*(.*?)\s*</\1>", re.S)

    @cached_property
    def open_tag(self) -> re.Pattern:
        return re.compile("<(" + "|".join(re.escape(tag) for tag in self.tags) + ")>")


def find_calls(text: str, declared: Declared) -> tuple[str | None, list[Found]] | None:
    """(content, calls) of a finished answer holding calls in one of the loose forms; None where it holds none. It is
    the stream's reading of the whole text at once (LooseStream), so a streamed answer says what this says."""
    content, calls = LooseStream(declared).finish(text)
    if not calls:
        return None
    return content.strip() or None, calls


@dataclass(frozen=True)
class Fence:
    """A fenced block: from its opening line's start to its closing line's end (`closed`), or to the text's end."""

    start: int
    body_start: int
    body_end: int
    end: int
    language: str
    closed: bool

    def body(self, text: str) -> str:
        return text[self.body_start : self.body_end]


def fences(text: str) -> list[Fence]:
    """The fenced blocks of `text` in order, fence lines paired as Markdown pairs them (an opening line may name a
    language; a closing line is the fence alone)."""
    found, lines = [], list(FENCE_LINE.finditer(text))
    i = 0
    while i < len(lines):
        opening = lines[i]
        start = opening.start() + opening.group(0).index("```")  # blanks before it are the line's, not the block's
        closing = next((line for line in lines[i + 1 :] if not line.group(1)), None)
        if closing is None:
            found.append(
                Fence(start, opening.end(), body_end=len(text), end=len(text), language=opening.group(1), closed=False)
            )
            break
        found.append(
            Fence(
                start,
                opening.end(),
                body_end=closing.start(),
                end=closing.end(),
                language=opening.group(1),
                closed=True,
            )
        )
        i = lines.index(closing) + 1
    return found


def _tool_of(tag: str) -> str | None:
    return None if tag in CALL_TAGS else tag


def calls_in(text: str, declared: Declared, tool: str | None = None) -> list[Found] | None:
    """The calls a JSON text holds: one call object, a list of them, or objects one after another (each naming a
    declared tool, its arguments valid against that tool's schema), or, inside a tag named after `tool`, that tool's
    arguments object (or a call object naming that tool, and no other); None where it is anything else."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```"):  # a fenced block inside a tag
        text = text[3:-3].removeprefix("json").strip()
    if text.startswith("{{") and text.endswith("}}"):  # the template's example, its doubled braces copied
        text = text[1:-1]
    values = _json_values(text)
    if values is None:
        return None
    if tool is not None:  # a tag named after a tool holds that tool's call: read for no other
        if len(values) != 1 or not isinstance(values[0], dict):
            return None
        value = values[0]
        as_call = _call(value, declared) if value.get("name") == tool else None
        call = as_call or _call({"name": tool, "arguments": value}, declared)
        return [call] if call else None
    if len(values) == 1 and isinstance(values[0], list):
        values = values[0]
    found = [_call(value, declared) for value in values]
    return found if found and all(found) else None  # type: ignore[return-value]


def _json_values(text: str) -> list[Any] | None:
    """The JSON values of `text`, one after another (read strictly: call_schema.STRICT); None where it holds
    anything else."""
    values, at = [], 0
    while at < len(text):
        try:
            value, at = STRICT.raw_decode(text, at)
        except (ValueError, RecursionError):
            return None
        values.append(value)
        while at < len(text) and text[at] in " \t\r\n,;":
            at += 1
    return values or None


def _call(value: Any, declared: Declared) -> Found | None:
    """A call object naming a declared tool whose arguments are valid against its schema, as a Found; else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = "arguments" if "arguments" in value else "parameters" if "parameters" in value else None
    if set(value) - {"name", key} or value["name"] not in declared.schemas:
        return None
    arguments = value.get(key, {}) if key else {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as the API sends them
        try:
            arguments = read_json(arguments)
        except ValueError:
            return None
    schema = declared.schemas[value["name"]] or NO_ARGUMENTS
    if not isinstance(arguments, dict) or not validates(arguments, schema):
        return None
    return Found(value["name"], json.dumps(arguments, ensure_ascii=False))


# ---- streaming ------------------------------------------------------------------------------------------------
class LooseStream:
    """A growing answer read for loose calls: `update(text)` returns the content that can no longer become part of a
    call (held back from where a fence, a tag or a bare JSON answer begins until it is complete and judged) and the
    calls found since; `finish(text)` releases the rest. Sent content is never taken back."""

    def __init__(self, declared: Declared):
        self.declared = declared
        self.sent = 0  # characters of `text` accounted for (sent as content, or consumed as a call)
        self.calls: list[Found] = []

    def update(self, text: str, final: bool = False) -> tuple[str, list[Found]]:
        content, found = "", []
        while self.sent < len(text):
            start = self._candidate(text)
            if start is None:  # nothing that can become a call: all of it is content
                rest = text[self.sent :]
                held = 0 if final else max(_partial_tag(rest, self.declared), _partial_fence(text, self.sent))
                content += text[self.sent : len(text) - held]
                self.sent = len(text) - held
                break
            content += text[self.sent : start]
            self.sent = start
            judged = self._judge(text, start, final)
            if judged is None:  # not complete yet
                break
            end, calls = judged
            if calls and (self.declared.parallel or not self.calls and not found and len(calls) == 1):
                found += calls
            else:  # not calls; or, without parallel calls, a second one: the first call stands, the rest is text
                content += text[start:end]
            self.sent = end
        self.calls += found
        return content, found

    def finish(self, text: str) -> tuple[str, list[Found]]:
        return self.update(text, final=True)

    def _candidate(self, text: str) -> int | None:
        """Where the next region that may be a call begins (at or after `sent`), or None. A fenced block that cannot
        hold a call is content: released as it comes, nothing in it starts a region."""
        starts = []
        for fence in fences(text):
            if fence.end <= self.sent:
                continue
            if fence.start >= self.sent and _could_be_call_fence(text, fence):
                starts.append(fence.start)
                break
            if not fence.closed:  # inside an open block of code: nothing after it starts a region yet
                return None
        rest = text[self.sent :]
        tag = self.declared.open_tag.search(rest)
        if tag is not None and not _inside_fence(text, self.sent + tag.start()):
            starts.append(self.sent + tag.start())
        if not text[: self.sent].strip() and rest.lstrip()[:1] in ("{", "["):
            starts.append(self.sent + len(rest) - len(rest.lstrip()))
        return min(starts) if starts else None

    def _judge(self, text: str, start: int, final: bool) -> tuple[int, list[Found]] | None:
        """(where the region from `start` ends, its calls (none: it is content)), or None while it is not complete."""
        fence = next((f for f in fences(text) if f.start == start), None)
        if fence is not None:
            if not fence.closed:
                return (len(text), []) if final else None
            return fence.end, calls_in(fence.body(text), self.declared) or []
        rest = text[start:]
        if rest.startswith("<"):
            match = self.declared.tagged.match(rest)
            if match is None:
                return (start + len(rest), []) if final else None
            return start + match.end(), calls_in(match.group(2), self.declared, _tool_of(match.group(1))) or []
        if not final:  # a bare JSON answer is a call only if it is the whole answer
            return None
        found = calls_in(rest, self.declared)
        return start + len(rest), found or []


def _could_be_call_fence(text: str, fence: Fence) -> bool:
    """A fenced block whose language and first characters do not rule out a JSON call (an open one's language may
    still be being written)."""
    opening = text[fence.start : fence.body_start]
    if not fence.closed and not opening.endswith("\n"):
        written = fence.language
        return any(language.startswith(written) for language in CALL_LANGUAGES)
    if fence.language not in CALL_LANGUAGES:
        return False
    first = fence.body(text).lstrip()[:1]
    return first in ("", "{", "[")


def _inside_fence(text: str, at: int) -> bool:
    return any(fence.body_start <= at < fence.body_end for fence in fences(text))


def _partial_fence(text: str, sent: int) -> int:
    """The length of a fence's beginning (a line of blanks and fewer than three backticks) that `text` ends with, past
    `sent` (held back: it may open a call's block)."""
    line_start = text.rfind("\n") + 1
    line = text[line_start:]
    if line_start >= sent and line.strip(" \t") in ("`", "``"):
        return len(line)
    return 0


def _partial_tag(text: str, declared: Declared) -> int:
    """The length of a tag's beginning that `text` ends with (held back: it may open a call)."""
    openings = [f"<{tag}>" for tag in declared.tags]
    for size in range(min(len(text), max(map(len, openings)) - 1), 0, -1):
        if any(opening.startswith(text[-size:]) for opening in openings):
            return size
    return 0
