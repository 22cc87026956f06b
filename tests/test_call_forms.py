"""Tool calls written without the template's markers (server/call_forms.py): each form the Hermes family writes is
read as a call where it names a declared tool with conforming arguments; text that merely looks like JSON stays text;
a growing answer is read the same way, its content never taken back and a code block not held."""

from __future__ import annotations

import json

import pytest

from verispec.server.call_forms import Declared, LooseStream, conforms, find_calls

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
ADD = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}
DECLARED = Declared({"get_weather": WEATHER, "add": ADD})
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

FORMS = [
    ("fenced", f"I will check.\n```json\n{CALL}\n```", "I will check.", [("get_weather", {"city": "Paris"})]),
    ("fenced, no language", f"```\n{CALL}\n```\n", None, [("get_weather", {"city": "Paris"})]),
    ("bare", f"  {CALL}\n", None, [("get_weather", {"city": "Paris"})]),
    ("doubled braces", '{{"name": "add", "arguments": {"a": 2, "b": 3}}}', None, [("add", {"a": 2, "b": 3})]),
    ("tools tags", f"<tools>\n{CALL}\n</tools>", None, [("get_weather", {"city": "Paris"})]),
    ("a tag named after the tool", '<add>\n{"a": 2, "b": 3}\n</add>', None, [("add", {"a": 2, "b": 3})]),
    ("tool_call as text", f"Sure.\n<tool_call>\n{CALL}\n</tool_call>", "Sure.", [("get_weather", {"city": "Paris"})]),
    ("a list", '```json\n[{"name": "add", "arguments": {"a": 1, "b": 2}}, ' + CALL + "]\n```", None,
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Paris"})]),
    ("parameters key, arguments as a string", '{"name": "add", "parameters": "{\\"a\\": 1, \\"b\\": 2}"}', None,
     [("add", {"a": 1, "b": 2})]),
    ("after a code block", f"```python\nprint(1)\n```\nThen:\n```json\n{CALL}\n```",
     "```python\nprint(1)\n```\nThen:", [("get_weather", {"city": "Paris"})]),
]  # fmt: skip

NOT_CALLS = [
    ("an undeclared tool", '```json\n{"name": "delete_all", "arguments": {}}\n```'),
    ("arguments that do not conform", '```json\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n```'),
    ("a wrong type", '{"name": "add", "arguments": {"a": "two", "b": 3}}'),
    ("other keys", '{"name": "add", "arguments": {"a": 1, "b": 2}, "id": 7}'),
    ("JSON data", '```json\n{"name": "Ada", "age": 36}\n```'),
    ("prose after a bare object", f"{CALL} is how you would call it."),
    ("a python block", "```python\nget_weather(city='Paris')\n```"),
    ("a tool's tag around arguments that do not conform", '<add>{"a": "x"}</add>'),
    ("a tool's definition echoed", '<tools>\n{"type": "function", "function": {"name": "add"}}\n</tools>'),
    ("broken JSON", '```json\n{"name": "get_weather", "arguments": {"city": \n```'),
]


@pytest.mark.parametrize(("name", "text", "content", "calls"), FORMS, ids=[form[0] for form in FORMS])
def test_each_form_is_read_as_its_calls_whole_and_streamed(name, text, content, calls):
    found = find_calls(text, DECLARED)
    assert found is not None
    assert found[0] == content and [(c.name, json.loads(c.arguments)) for c in found[1]] == calls
    streamed, got = _stream(text)
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert streamed.strip() == (content or "")


@pytest.mark.parametrize(("name", "text"), NOT_CALLS, ids=[case[0] for case in NOT_CALLS])
def test_text_that_merely_looks_like_a_call_stays_text(name, text):
    assert find_calls(text, DECLARED) is None
    streamed, got = _stream(text)
    assert not got and streamed == text


def test_one_call_only_where_parallel_calls_are_off():
    """A list of two is text; two blocks: the first is the call, the second text (streamed, the first call is sent
    before the second is written: the whole answer reads the same)."""
    one = Declared(DECLARED.schemas, parallel=False)
    two = '```json\n[{"name": "add", "arguments": {"a": 1, "b": 2}}, ' + CALL + "]\n```"
    assert find_calls(two, one) is None
    blocks = f"```json\n{CALL}\n```\nand\n```json\n{CALL}\n```"
    content, calls = find_calls(blocks, one)
    assert len(calls) == 1 and content == f"and\n```json\n{CALL}\n```"


def test_a_tag_inside_a_code_block_is_an_example_and_a_fence_inside_a_tag_is_read():
    example = f"Call it like this:\n```xml\n<tool_call>\n{CALL}\n</tool_call>\n```"
    assert find_calls(example, DECLARED) is None and _stream(example) == (example, [])
    wrapped = f"<tool_call>\n```json\n{CALL}\n```\n</tool_call>"
    assert find_calls(wrapped, DECLARED)[1][0].name == "get_weather" and _stream(wrapped)[1][0].name == "get_weather"


def test_a_code_block_streams_as_it_is_written_and_a_call_block_is_held_until_judged():
    stream = LooseStream(DECLARED)
    content, _ = stream.update("Here:\n```python\nx = 1\n")
    assert content == "Here:\n```python\nx = 1\n"  # not a call's language: not held
    stream = LooseStream(DECLARED)
    content, calls = stream.update('Here:\n```json\n{"name": "get_weather", "argu')
    assert content == "Here:\n" and not calls
    content, calls = stream.update('Here:\n```json\n{"name": "get_weather", "arguments": {"city": "P"}}\n```')
    assert content == "" and calls[0].name == "get_weather"


def test_the_schema_check_covers_what_tool_schemas_use():
    assert conforms({"city": "P", "unit": "C"}, WEATHER) and not conforms({"city": "P", "unit": "K"}, WEATHER)
    assert not conforms({}, WEATHER) and not conforms({"city": 1}, WEATHER)
    assert conforms({"a": 1.5, "b": 2}, ADD) and not conforms({"a": True, "b": 2}, ADD)
    assert conforms([1, 2], {"type": "array", "items": {"type": "integer"}, "maxItems": 2})
    assert not conforms([1, "2"], {"type": "array", "items": {"type": "integer"}})
    assert conforms(3, {"anyOf": [{"type": "string"}, {"type": "integer"}]})


def _stream(text: str):
    """A character at a time, as tokens arrive: what is sent is never taken back."""
    stream, content, calls = LooseStream(DECLARED), "", []
    for end in range(1, len(text) + 1):
        piece, found = stream.update(text[:end])
        content += piece
        calls += found
        assert text.startswith(content) or calls  # content before any call is the text's own beginning
    piece, found = stream.finish(text)
    return content + piece, calls + found
