"""gpt-oss's harmony format in the server's answers (server/harmony.py): reasoning to reasoning_content and Responses
reasoning items, the final channel to content, messages to functions.NAME to tool calls; a stream's pieces add up to
the finished answer's; the grammar of tool_choice required keeps its call within the schema.

The vocabulary is the architectures' byte-level fixture with harmony's special tokens added (no package ships
gpt-oss's o200k_harmony offline); the texts are harmony as gpt-oss's template renders it (openai-gpt-oss-120b.jinja).
"""

from __future__ import annotations

import pytest

from verispec.decoding.stats import GenerationStats
from verispec.engine.requests import GenerationOutput
from verispec.models.tokenizer import Tokenizer
from verispec.server.harmony import HarmonyStream, is_harmony, read_answer
from verispec.server.protocol import ChatCompletionRequest
from verispec.server.responses import Job, _message
from verispec.server.responses_api import output_items
from verispec.server.tools import HARMONY, tool_grammar, tool_request

from architectures import tokenizer as byte_tokenizer

SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
REASONED = (
    "<|channel|>analysis<|message|>The user asks about Paris.<|end|><|start|>assistant<|channel|>final<|message|>"
)
ANSWERS = {
    "answer": (REASONED + "It is sunny in Paris.<|return|>", "The user asks about Paris.", "It is sunny in Paris.", []),
    "call": ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather'
             '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>', "Need the weather.", "",
             [("get_weather", '{"city": "Paris"}')]),
    "recipient after the channel": ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                                    '{"city": "Rome"}<|call|>', "", "", [("get_weather", '{"city": "Rome"}')]),
    "cut by max_tokens": ("<|channel|>analysis<|message|>Thinking abo", "Thinking abo", "", []),
    "no harmony at all": ("Just text.", "", "Just text.", []),
    "an undeclared function": ('<|start|>assistant to=functions.delete_all<|channel|>commentary json<|message|>{}'
                               "<|call|>", "", "functions.delete_all {}", []),
    "a header cut by max_tokens": ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin", "Hm.",
                                   "", []),
    # under auto (no grammar) a call stands only where it is valid against its schema; else it is content
    "arguments outside the schema": ('<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                                     '<|message|>{"town": "Rome"}<|call|>', "",
                                     'functions.get_weather {"town": "Rome"}', []),
    "arguments that are not JSON": ('<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                                    '<|message|>{"city": NaN}<|call|>', "", 'functions.get_weather {"city": NaN}', []),
}  # fmt: skip


@pytest.fixture(scope="module")
def harmony() -> Tokenizer:
    raw = byte_tokenizer().backend_tokenizer
    raw.add_special_tokens(SPECIALS)
    return Tokenizer(raw, eos_token="<eos>")


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.raw.encode(text, add_special_tokens=False).ids


def _tools(choice="auto"):
    body = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "tool_choice": choice}
    )
    return tool_request(body, HARMONY)


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_an_answer_reads_into_reasoning_content_and_calls_and_a_stream_adds_up_to_it(harmony, name):
    text, reasoning, content, calls = ANSWERS[name]
    assert is_harmony(harmony)
    ids, tools = _ids(harmony, text), _tools()
    read = read_answer(harmony, ids, tools)
    assert (read.reader.reasoning, read.content, [tuple(c) for c in read.taken]) == (reasoning, content, calls)
    stream, streamed = HarmonyStream(harmony, _tools()), ["", "", {}]
    for news in [*(stream.feed(token) for token in ids), stream.finish()]:
        streamed[0] += news[0]
        streamed[1] += news[1]
        for piece in news[2]:
            name_and_args = streamed[2].setdefault(piece.index, [piece.function.name, ""])
            name_and_args[1] += piece.function.arguments
    assert (streamed[0], streamed[1], [tuple(c) for c in streamed[2].values()]) == (reasoning, content, calls)


def test_under_auto_a_call_cut_by_max_tokens_stays_a_call(harmony):
    cut = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Ro'
    read = read_answer(harmony, _ids(harmony, cut), _tools(), cut=True)
    assert [tuple(call) for call in read.taken] == [("get_weather", '{"city": "Ro')] and read.content == ""
    assert read_answer(harmony, _ids(harmony, cut), _tools()).taken == []  # not cut: an answer that is not valid


def _output(tokenizer: Tokenizer, text: str, reason: str = "stop") -> GenerationOutput:
    ids = _ids(tokenizer, text)
    stats = GenerationStats(new_tokens=len(ids))
    return GenerationOutput(text=tokenizer.decode(ids), token_ids=ids, finish_reason=reason, stats=stats)


def test_a_chat_answer_carries_reasoning_content_and_tool_calls(harmony):
    plain = Job("chatcmpl-1", "gpt-oss", requests=[], sink=None, stream=False, include_usage=False, tokenizer=harmony,
                harmony=True)  # fmt: skip
    message, reason = _message(plain, _output(harmony, ANSWERS["answer"][0]), 0)
    assert message.model_dump() == {"role": "assistant", "content": "It is sunny in Paris.",
                                    "reasoning_content": "The user asks about Paris."}  # fmt: skip
    assert reason == "stop"
    calling = Job("chatcmpl-2", "gpt-oss", requests=[], sink=None, stream=False, include_usage=False,
                  tokenizer=harmony, tools=_tools(), harmony=True)  # fmt: skip
    message, reason = _message(calling, _output(harmony, ANSWERS["call"][0]), 0)
    assert reason == "tool_calls" and message.reasoning_content == "Need the weather." and message.content is None
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    items = output_items(calling, _output(harmony, ANSWERS["call"][0]), {"get_weather": "function"})
    assert [item["type"] for item in items] == ["reasoning", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Need the weather."}]
    # without tools, a call's arguments stay content: nothing is lost
    message, _ = _message(plain, _output(harmony, ANSWERS["call"][0]), 0)
    assert message.content == 'functions.get_weather {"city": "Paris"}' and message.tool_calls is None


def test_tool_choice_required_keeps_the_call_within_its_schema(harmony):
    from verispec.decoding.grammar import GrammarCompiler, GrammarError, GrammarSpec

    assert tool_grammar(_tools("auto"), harmony) is None  # auto: the model's own channels decide
    compiler = GrammarCompiler(harmony, harmony.raw.get_vocab_size())
    grammar = GrammarSpec("grammar", tool_grammar(_tools("required"), harmony))

    def accepts(text: str) -> bool:
        matcher, ids = compiler.compile(grammar).matcher(), _ids(harmony, text)
        try:
            consumed = matcher._consume(ids)
        except GrammarError:
            return False
        return consumed == len(ids) and matcher.matcher.is_accepting()

    call = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    assert accepts(call)
    assert accepts("<|channel|>analysis<|message|>Checking.<|end|><|start|>assistant" + call)
    assert not accepts(call.replace("city", "town"))  # outside the schema
    assert not accepts("<|channel|>final<|message|>Sunny.")  # no call


@pytest.fixture(scope="module")
def gpt_oss_server(tmp_path_factory):
    """`verispec serve` of a tiny gpt-oss with a harmony vocabulary and gpt-oss's own chat template."""
    from pathlib import Path

    from architectures import make_model
    from serving import ServerProcess

    folder = tmp_path_factory.mktemp("gpt-oss-harmony")
    make_model("gpt-oss", vocab_size=272, max_position_embeddings=4096).save_pretrained(folder, safe_serialization=True)
    hf = byte_tokenizer()
    hf.add_special_tokens({"additional_special_tokens": SPECIALS})
    templates = Path(__file__).parent / "fixtures" / "templates"
    hf.chat_template = (templates / "openai-gpt-oss-120b.jinja").read_text()
    hf.save_pretrained(folder)
    proc = ServerProcess("--model", str(folder), "--speculative-model", "none", "--served-model-name", "gpt-oss")
    yield proc
    proc.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_comes_back_as_a_tool_call_through_the_server(gpt_oss_server, harmony, stream):
    """tool_choice required on a random model: the grammar makes it write a harmony call (its reasoning channel
    biased away, so that the call comes within max_tokens); the answer is a tool call of get_weather whose arguments
    are the JSON the model wrote, streamed or not."""
    import httpx

    channel = harmony.raw.token_to_id("<|channel|>")
    body = {"model": "gpt-oss", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            "tool_choice": "required", "max_tokens": 60, "logit_bias": {str(channel): -100},
            "stream": stream}  # fmt: skip
    with httpx.Client(base_url=gpt_oss_server.url, timeout=120) as client:
        if not stream:
            answer = client.post("/v1/chat/completions", json=body).json()
            calls = answer["choices"][0]["message"]["tool_calls"]
            name, arguments = calls[0]["function"]["name"], calls[0]["function"]["arguments"]
        else:
            name, arguments = None, ""
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    import json

                    for choice in json.loads(line[6:])["choices"]:
                        for piece in choice["delta"].get("tool_calls", []):
                            name = piece["function"].get("name") or name
                            arguments += piece["function"].get("arguments", "")
    assert name == "get_weather" and arguments.startswith("{")


def test_what_harmony_answers_cannot_honour_yet_is_a_400_naming_the_field(gpt_oss_server):
    import httpx

    base = {"model": "gpt-oss", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for extra, param in (({"stop": ["x"]}, "stop"), ({"response_format": {"type": "json_object"}}, "response_format")):
        answer = httpx.post(gpt_oss_server.url + "/v1/chat/completions", json=base | extra, timeout=60)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
