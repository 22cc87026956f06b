"""Tool calling without a model: which format each real chat template teaches, the prompt with tools as transformers
renders it, the parse of each format's answers (whole and streamed piece by piece alike), and the grammars that
keep calls within their schemas (on the bundled Qwen tokenizer, when installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_chat_templates import SPECIAL, TEMPLATES

from verispec.errors import InvalidParameterError
from verispec.models.tokenizer import Tokenizer
from verispec.server.protocol import ChatCompletionRequest
from verispec.server.tools import (
    FORMATS,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_ARGS,
    CallScanner,
    detect,
    parse_calls,
    template_messages,
    tool_grammar,
    tool_request,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "The sum of two integers",
        "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False,
        },
    },
}  # fmt: skip
# the format each template teaches, for the templates that teach one verispec parses (all others: None)
EXPECTED = {
    "Bielik-11B-v3.0-Instruct": "hermes", "MiMo-VL": "hermes", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use":
    "hermes", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes", "Qwen-QwQ-32B": "hermes",
    "Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen-Qwen3-0.6B": "hermes", "Reka-Edge": "hermes",
    "ibm-granite-granite-4.0": "hermes", "ibm-granite-granite-4.1": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3_json", "meta-llama-Llama-3.2-3B-Instruct": "llama3_json",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3_json", "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral_args", "mistralai-Ministral-3-14B-Reasoning-2512":
    "mistral_args", "unsloth-mistral-Devstral-Small-2507": "mistral_args", "openai-gpt-oss-120b": "harmony",
}  # fmt: skip
QUESTION = {"role": "user", "content": "Weather in Paris, and 2 + 3?"}
WEATHER_CALL = {"id": "a1b2c3d4e", "type": "function",  # 9 letters and digits: Mistral's templates want them
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
ADD_CALL = {"id": "f5g6h7i8j", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
CONVERSATIONS = {
    "question": [QUESTION],
    "one call": [QUESTION, {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
                 {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": '{"celsius": 18}'}],
    "two calls": [QUESTION, {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL, ADD_CALL]},
                  {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": '{"celsius": 18}'},
                  {"role": "tool", "tool_call_id": "f5g6h7i8j", "content": "5"}],
}  # fmt: skip


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.stem)
def test_each_template_teaches_the_format_verispec_names(path):
    found = detect(path.read_text())
    assert (found.name if found else None) == EXPECTED.get(path.stem)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_the_prompt_with_tools_is_what_transformers_renders(name, conversation):
    """The tools as OpenAI's objects and the calls in the history with their arguments as objects: what
    apply_chat_template(tools=...) renders, for every template whose format verispec parses."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    template = next(p for p in TEMPLATES if p.stem == name).read_text()
    raw = RawTokenizer(WordLevel({token: i for i, token in enumerate(SPECIAL.values())}, unk_token="<unk>"))
    ours = Tokenizer(raw, SPECIAL["eos_token"], template, special_tokens=SPECIAL)
    reference = PreTrainedTokenizerFast(tokenizer_object=raw, **SPECIAL)
    body = ChatCompletionRequest.model_validate({"messages": CONVERSATIONS[conversation], "tools": [WEATHER, ADD]})
    messages, tools = template_messages(body), tool_request(body, FORMATS[EXPECTED[name]]).template_tools
    try:
        expected = reference.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # Llama 3.x takes one call a turn: it refuses two, and so does verispec (a 400)
        assert conversation == "two calls" and "single tool-calls" in str(exc)
        with pytest.raises(InvalidParameterError, match="single tool-calls"):
            ours.render_chat(messages, tools=tools)
        return
    assert ours.render_chat(messages, tools=tools) == expected
    assert "get_weather" in expected


ANSWERS = [
    (HERMES, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n',
     "Checking.", [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 2, "b": 3}')]),
    (LLAMA3_JSON, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
     [("get_weather", '{"city": "Paris"}')]),
    (LLAMA3_JSON, '  {"name": "add", "parameters": {"a": 2, "b": 3}}', None, [("add", '{"a": 2, "b": 3}')]),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": '
              '{"a": 2, "b": 3}}]', None, [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 2, "b": 3}')]),
    (MISTRAL_ARGS, 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Pa\\"ris"}[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}',
     "Sure.", [("get_weather", '{"city": "Pa\\"ris"}'), ("add", '{"a": 2, "b": 3}')]),
    (HERMES, "No tools needed: <tool_ is not a call.", "No tools needed: <tool_ is not a call.", []),
    (LLAMA3_JSON, "The answer is {x}.", "The answer is {x}.", []),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), ANSWERS)
def test_answers_parse_into_content_and_calls_and_streaming_reads_them_alike(fmt, text, content, calls):
    found, parsed = parse_calls(fmt, text)
    assert found == content and [(c.name, c.arguments) for c in parsed] == calls
    scanner, names = CallScanner(fmt), []
    for end in range(1, len(text) + 1):  # a character at a time: what is sent is never taken back
        before = [(c.name, c.arguments) for c in scanner.calls]
        sent = scanner.content
        scanner.update(text[:end])
        assert scanner.content.startswith(sent)
        for (name, arguments), call in zip(before, scanner.calls, strict=False):
            assert call.name == name and call.arguments.startswith(arguments)
        names = [c.name for c in scanner.calls]
    scanner.update(text, final=True)
    assert names == [name for name, _ in calls]
    if calls:
        assert [(c.name, c.arguments) for c in scanner.calls] == calls and (scanner.content.strip() or None) == content
    for _, arguments in calls:
        json.loads(arguments)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "argu',
        '<tool_call>\n{"nme": 1}',
        '[TOOL_CALLS][{"name": "x", "arguments": ',
    ],
)
def test_a_call_that_does_not_parse_is_content(text):
    fmt = MISTRAL if text.startswith("[") else HERMES
    assert parse_calls(fmt, text) == (text, [])


# ---- the grammar, on the bundled Qwen tokenizer ----------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen():
    from verispec.models import bundled

    from real_models import require_bundled

    require_bundled()
    path = Path(bundled.bundled_path("draft"))
    from verispec.decoding.grammar import GrammarCompiler

    tokenizer = Tokenizer.from_gguf(path)
    return tokenizer, GrammarCompiler(tokenizer, 151936)


def _accepts(qwen, grammar: str, text: str) -> bool:
    from verispec.decoding.grammar import GrammarError, GrammarSpec

    tokenizer, compiler = qwen
    matcher, tokens = compiler.compile(GrammarSpec("grammar", grammar)).matcher(), tokenizer.encode(text)
    try:
        consumed = matcher._consume(tokens)
    except GrammarError:
        return False
    return consumed == len(tokens) and matcher.matcher.is_accepting()  # all of it, and it may end there


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
BAD_ARGUMENTS = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>'
OTHER = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize(
    ("choice", "parallel", "text", "accepted"),
    [
        ("auto", True, "Just an answer.", True),
        ("auto", True, "Let me check.\n" + CALL, True),
        ("auto", True, "Let me check.\n" + BAD_ARGUMENTS, False),
        ("required", True, "Just an answer.", False),
        ("required", True, CALL + "\n" + OTHER + "\n", True),
        ("required", False, CALL + "\n" + OTHER, False),
        ("required", True, BAD_ARGUMENTS, False),
        ({"type": "function", "function": {"name": "add"}}, True, OTHER, True),
        ({"type": "function", "function": {"name": "add"}}, True, CALL, False),
    ],
)
def test_the_grammar_keeps_calls_within_their_schemas(qwen, choice, parallel, text, accepted):
    body = ChatCompletionRequest.model_validate(
        {"messages": [QUESTION], "tools": [WEATHER, ADD], "tool_choice": choice, "parallel_tool_calls": parallel}
    )
    grammar = tool_grammar(tool_request(body, HERMES), qwen[0])
    assert _accepts(qwen, grammar, text) == accepted


# ---- tools whose schemas refer to their own definitions ($defs / $ref, as pydantic writes them) --------------------
USER_TOOL = {
    "type": "function",
    "function": {
        "name": "create_user",
        "parameters": {
            "$defs": {"User": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                               "additionalProperties": False}},
            "type": "object", "properties": {"user": {"$ref": "#/$defs/User"}}, "required": ["user"],
        },
    },
}  # fmt: skip


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "create_user"}}])
def test_a_tool_schema_with_defs_and_refs_builds_the_grammar_response_format_builds(choice):
    """The call's grammar embeds the tool's parameters; their `#/$defs/User` resolves against them (as it does
    when they are a response_format's whole schema): the grammar builds, and holds the call to them."""
    from verispec.decoding.grammar import GrammarCompiler, GrammarError, GrammarSpec
    from verispec.testing import tool_tokenizer

    tokenizer = tool_tokenizer()
    body = ChatCompletionRequest.model_validate(
        {"messages": [QUESTION], "tools": [USER_TOOL, ADD], "tool_choice": choice}
    )
    matcher = GrammarCompiler(tokenizer, 257).compile(
        GrammarSpec("grammar", tool_grammar(tool_request(body, HERMES), tokenizer))
    )

    def accepts(text: str) -> bool:
        state, tokens = matcher.matcher(), tokenizer.encode(text)
        try:
            return state._consume(tokens) == len(tokens)
        except GrammarError:
            return False

    good = '<tool_call>\n{"name": "create_user", "arguments": {"user": {"name": "ada"}}}\n</tool_call>'
    assert accepts(good)
    if choice != "auto":  # (under auto any text is an answer here: this tokenizer's marker is no special token)
        assert not accepts(good.replace('"name": "ada"', '"nom": "ada"'))


# ---- under auto a call in the template's tags stands only where it is valid -------------------------------------
WORD = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]+$"}}, "required": ["word"]}
LOWER = {"type": "function", "function": {"name": "lower", "parameters": WORD}}
ADD_TAGGED = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def _streamed(request, tokenizer, text: str, cut: bool = False) -> tuple[str, list[tuple[str, str]], list[list]]:
    """(content, calls, the pieces of each step) of `text` streamed a token at a time through ToolStream."""
    from verispec.server.tools import ToolStream

    stream, content, calls, steps = ToolStream(request, tokenizer), "", {}, []
    news = [stream.feed(token) for token in tokenizer.encode(text)] + [stream.finish(cut=cut)]
    for piece_content, pieces in news:
        content += piece_content
        steps.append(pieces)
        for piece in pieces:
            call = calls.setdefault(piece.index, [piece.function.name, ""])
            call[1] += piece.function.arguments or ""
    return content, [tuple(call) for call in calls.values()], steps


@pytest.mark.parametrize(
    ("text", "calls", "content"),
    [
        (ADD_TAGGED, [("add", '{"a": 2, "b": 3}')], None),
        ('<tool_call>\n{"name": "lower", "arguments": {"word": "RM -RF /"}}\n</tool_call>', [], "all"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1e999, "b": 3}}\n</tool_call>', [], "all"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>', [], "all"),
        ('<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>', [], "all"),
        (ADD_TAGGED + '\n<tool_call>\n{"name": "add", "arguments": {"a": NaN, "b": 1}}\n</tool_call>',
         [("add", '{"a": 2, "b": 3}')], '<tool_call>\n{"name": "add", "arguments": {"a": NaN, "b": 1}}\n</tool_call>'),
    ],
)  # fmt: skip
def test_under_auto_a_tagged_call_that_is_not_valid_is_text_whole_and_streamed(text, calls, content):
    """The grammar holds a call in the template's tags to its schema, but not every reading of it (a number past a
    double's range), and the parser does not take it on trust: a call that is not valid, and all after it, is the
    content it was, as written; a valid call before it stands. Streamed alike: the call is sent once complete and
    judged, its name in one piece, its arguments whole in the next."""
    from verispec.testing import tool_tokenizer

    tokenizer = tool_tokenizer()
    body = ChatCompletionRequest.model_validate({"messages": [QUESTION], "tools": [WEATHER, ADD, LOWER]})
    request = tool_request(body, HERMES)
    found, parsed = parse_calls(request, text)
    content = text if content == "all" else content
    assert found == content and [(c.name, c.arguments) for c in parsed] == calls
    streamed, sent, steps = _streamed(request, tokenizer, text)
    assert (streamed.strip() or None) == content and sent == calls
    assert all(len({piece.index for piece in pieces}) <= 1 for pieces in steps)
    if calls:  # the name, then the arguments whole
        named = next(pieces for pieces in steps if pieces)
        assert named[0].function.name == "add" and named[1].function.arguments == calls[0][1]


def test_under_required_a_tagged_call_streams_as_written_and_a_cut_one_stays_a_call():
    from verispec.testing import tool_tokenizer

    tokenizer = tool_tokenizer()
    for choice in ("required", "auto"):
        body = ChatCompletionRequest.model_validate({"messages": [QUESTION], "tools": [ADD], "tool_choice": choice})
        request = tool_request(body, HERMES)
        _, sent, steps = _streamed(request, tokenizer, ADD_TAGGED)
        assert sent == [("add", '{"a": 2, "b": 3}')]
        assert sum(1 for pieces in steps if pieces) > (3 if choice == "required" else 0)  # required: in pieces
        cut = ADD_TAGGED[: ADD_TAGGED.index(', "b"')]
        _, sent, _ = _streamed(request, tokenizer, cut, cut=True)
        assert (
            sent
            == [("add", cut.split('"arguments": ')[1])]
            == [(c.name, c.arguments) for c in parse_calls(request, cut, cut=True)[1]]
        )
