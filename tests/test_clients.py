"""What real clients send, answered: every request Codex CLI, openai-agents, pydantic-ai, LangChain and LlamaIndex sent
to an OpenAI-compatible server (recorded as they sent them: tests/fixtures/clients/, record.py there) replayed
through `verispec serve` with the bundled pair. None gets a 4xx or 5xx; a streamed one ends with its completed
event (or [DONE]); a Responses request's usage counts cached tokens, and the second step of a Codex run (its first
step's prompt and more) is served mostly from the prefix cache. Then `codex exec` itself, end to end, where npm can
install it.

Answers are cut short (max_output_tokens / max_tokens 24): what is tested is that every request is taken and answered
in its protocol, not what the model says. Codex CLI's requests (prompts of 8,000-10,000 tokens: 160 s of prefill on 2
cores for its default model's) are replayed with the slow set (`pytest -m slow`), which .ci/run runs after the
default one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from stream_readers import STREAMED, WHOLE, llamaindex

from real_models import require_bundled
from serving import ServerProcess

pytestmark = pytest.mark.real
FIXTURES = Path(__file__).parent / "fixtures" / "clients"
MODEL = "verispec-test"
RECORDED = [
    json.loads(line)
    for path in sorted(FIXTURES.glob("*.jsonl"))
    for line in path.read_text().splitlines()
    if line.strip()
]
# Codex CLI's turns carry prompts of about 8,000 tokens (its instructions and tools): a minute or more each on two
# cores, so they run with the slow set (pytest -m slow; .ci/run runs it after the default set)
SLOW_CLIENTS = {"codex"}


def _param(record: dict):
    marks = pytest.mark.slow if record["client"] in SLOW_CLIENTS else ()
    return pytest.param(record, id=f"{record['client']}-{record['scenario']}-{record['step']}", marks=marks)


CODEX_VERSION = "0.171.0"


@pytest.fixture(scope="module")
def server():
    require_bundled()
    proc = ServerProcess("--served-model-name", MODEL, "--max-num-seqs", "2")
    yield proc
    proc.stop()


def _replayed(record: dict) -> dict:
    body = {**record["body"], "model": MODEL}  # Codex's default model is its own name: a user sets `model`
    if record["path"].endswith("/responses"):
        body["max_output_tokens"] = 24
    else:
        body["max_tokens"] = 24
        body.pop("max_completion_tokens", None)
    return body


def _send(server: ServerProcess, record: dict) -> tuple[int, list[dict], dict]:
    """(status, the stream's events or [the body], the headers) of one recorded request sent again."""
    headers = {
        "Content-Type": "application/json",
        **{k: v for k, v in record["headers"].items() if k.lower() not in ("content-type", "accept-encoding")},
    }
    body = _replayed(record)
    with httpx.stream("POST", server.url + record["path"], json=body, headers=headers, timeout=600) as reply:
        text = reply.read().decode()
    if not body.get("stream") or reply.status_code != 200:
        return reply.status_code, [json.loads(text)], dict(reply.headers)
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    if record["path"].endswith("/chat/completions"):
        assert text.rstrip().endswith("data: [DONE]")
    return reply.status_code, events, dict(reply.headers)


@pytest.mark.parametrize("record", [_param(record) for record in RECORDED])
def test_every_recorded_client_request_is_answered(server, record):
    status, events, headers = _send(server, record)
    assert status == 200, events
    if record["path"].endswith("/responses"):
        final = events[-1]["response"] if record["body"].get("stream") else events[0]
        assert final["status"] in ("completed", "incomplete") and final["output"]
        assert "cached_tokens" in final["usage"]["input_tokens_details"]
        if any(tool.get("type") == "web_search" for tool in record["body"].get("tools") or []):
            assert "web_search" in headers.get("x-verispec-tools-left-out", "")
    else:
        assert all("error" not in event for event in events)


@pytest.mark.slow
def test_a_codex_runs_second_step_is_served_from_the_prefix_cache(server):
    """Codex resends the whole conversation each step: the second step's prompt holds the first's, whose blocks
    (prompt and the answer written) are reused."""
    steps = [r for r in RECORDED if r["client"] == "codex" and r["scenario"] == "exec_ls"]
    first, second = (_send(server, step)[1][-1]["response"]["usage"] for step in steps)
    assert second["input_tokens_details"]["cached_tokens"] >= 0.9 * first["input_tokens"]


def _codex() -> str | None:
    """A Codex CLI binary: $CODEX_BIN, one on PATH, or one npm installs into the test cache (None without npm)."""
    for candidate in (os.environ.get("CODEX_BIN"), shutil.which("codex")):
        if candidate and Path(candidate).exists():
            return candidate
    npm = shutil.which("npm")
    if npm is None:
        return None
    home = Path(os.environ.get("VERISPEC_TEST_CACHE", Path.home() / ".cache" / "verispec-tests")) / "codex"
    binary = home / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        home.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([npm, "install", "--prefix", str(home), f"@openai/codex@{CODEX_VERSION}"],
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if done.returncode != 0:
            return None
    return str(binary)


@pytest.mark.slow
def test_codex_exec_completes_a_turn_against_verispec_serve(tmp_path):
    """`codex exec` with only the provider set (and its model: the served name) completes a turn: every request it
    sends is answered (a 4xx would end the turn with `turn.failed`). Its stream's idle timeout is cut to 15 s and its
    retries to none, below its first request's prefill (about 8,000 tokens: 35-45 s on two cores): the server's
    keep-alive events carry the turn through (without them Codex gave up on a silent stream and sent it again)."""
    codex = _codex()
    if codex is None:
        pytest.skip("no Codex CLI and no npm to install it")
    require_bundled()
    server = ServerProcess("--served-model-name", MODEL)  # its own: nothing of Codex's prompt prefilled before
    try:
        _codex_turn(codex, server, tmp_path)
    finally:
        server.stop()


def _codex_turn(codex: str, server: ServerProcess, tmp_path: Path) -> None:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "verispec"\n\n[model_providers.verispec]\nname = "verispec"\n'
        f'base_url = "{server.url}/v1"\nwire_api = "responses"\n'
        "stream_idle_timeout_ms = 15000\nstream_max_retries = 0\n"
    )
    env = {**os.environ, "CODEX_HOME": str(home), "OPENAI_API_KEY": "unused"}
    done = subprocess.run(
        [codex, "exec", "--json", "--skip-git-repo-check", "How many files are in this directory? Use a command."],
        cwd=work, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [event.get("type") for event in events]
    assert "turn.completed" in kinds and "turn.failed" not in kinds, (done.stdout[-3000:], done.stderr[-3000:])
    assert "idle timeout" not in done.stderr + done.stdout  # its stream never went silent for 15 s


# ---- every call form, read by each client's own reader ------------------------------------------------------------
LLAMAINDEX = next(r for r in RECORDED if r["client"].startswith("llama-index") and r["scenario"] == "function_agent")
WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ADD_CALL = '{"name": "add", "arguments": {"a": 2, "b": 2}}'
CALL_FORMS = {  # every form the server reads as a call under auto (docs/tools.md), written after LlamaIndex's request
    "template tags": f"<tool_call>\n{WEATHER_CALL}\n</tool_call>",
    "fenced": f"I will check.\n```json\n{WEATHER_CALL}\n```",
    "bare": WEATHER_CALL,
    "doubled braces": "{" + WEATHER_CALL + "}",
    "tools tags as text": f"<tools>\n{WEATHER_CALL}\n</tools>",
    "a tag named after the tool": '<add>\n{"a": 2, "b": 2}\n</add>',
    "two in one fenced list": f"```json\n[{WEATHER_CALL}, {ADD_CALL}]\n```",
    "two in template tags": f"<tool_call>\n{WEATHER_CALL}\n</tool_call>\n<tool_call>\n{ADD_CALL}\n</tool_call>",
}
EXPECTED = {"a tag named after the tool": [("add", {"a": 2, "b": 2})],
            "two in one fenced list": [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 2})],
            "two in template tags": [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 2})]}  # fmt: skip


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from verispec.models import bundled
    from verispec.models.tokenizer import Tokenizer

    require_bundled()
    return Tokenizer.from_gguf(Path(bundled.bundled_path("draft")))


def _answered(tokenizer, body: dict, text: str) -> tuple[list[dict], dict]:
    """(the stream's chunks, the whole answer) the server sends for `body` when its model writes `text` (its
    special tokens as tokens): the server's own chat_chunks and chat_completion_body, over a sink that replays the
    tokens."""
    import asyncio

    from verispec.decoding.stats import GenerationStats
    from verispec.engine.requests import FinishEvent, GenerationOutput, StreamChunk
    from verispec.server.protocol import ChatCompletionRequest
    from verispec.server.responses import Job, chat_chunks, chat_completion_body
    from verispec.server.tools import detect, tool_request

    ids = tokenizer.raw.encode(text, add_special_tokens=False).ids
    output = GenerationOutput(tokenizer.decode(ids), ids, "stop", GenerationStats())

    class Replay:
        async def events(self, keep_alive: bool = False):
            for token in ids:
                yield 0, StreamChunk(text="", token_id=token)
            yield 0, FinishEvent(output, 0.0)

    tools = tool_request(ChatCompletionRequest.model_validate(body), detect(tokenizer.chat_template))
    job = Job("chatcmpl-1", MODEL, [None], Replay(), stream=True, include_usage=False, tokenizer=tokenizer,
              tools=tools)  # fmt: skip

    async def collect() -> list[dict]:
        return [chunk if isinstance(chunk, dict) else chunk.model_dump() async for chunk in chat_chunks(job)]

    chunks = json.loads(json.dumps(asyncio.run(collect())))  # as the wire carries them
    return chunks, json.loads(json.dumps(chat_completion_body(job, [output], 0.0).model_dump()))


FORM_CASES = [(form, "auto") for form in CALL_FORMS] + [(form, "required") for form in CALL_FORMS if "template" in form]


@pytest.mark.parametrize(("form", "choice"), FORM_CASES)
def test_every_call_form_reaches_every_client_whole_streamed_and_not(qwen_tokenizer, form, choice):
    """LlamaIndex's recorded FunctionAgent request (streamed, auto), answered in each call form: every client's own
    reader (LlamaIndex's, which reads only a chunk's first tool_calls entry, written as its code reads) receives
    each call's name and whole arguments; a chunk carries at most one entry; the call's name comes before its
    arguments. Under required only the template's tags are a call (the grammar allows no other form)."""
    body = {**LLAMAINDEX["body"], "tool_choice": choice}
    chunks, whole = _answered(qwen_tokenizer, body, CALL_FORMS[form])
    expected = EXPECTED.get(form, [("get_weather", {"city": "Paris"})])
    for chunk in chunks:
        for delta in (choice_["delta"] for choice_ in chunk["choices"]):
            assert len(delta.get("tool_calls") or []) <= 1, chunk
    for reader, read in STREAMED.items():
        calls = read(chunks)
        assert [(name, json.loads(arguments)) for name, arguments in calls] == expected, (reader, calls)
    for reader, read in WHOLE.items():
        calls = read(whole)
        assert [(name, json.loads(arguments)) for name, arguments in calls] == expected, (reader, calls)
    assert whole["choices"][0]["finish_reason"] == chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_llamaindex_function_agent_gets_the_arguments_the_model_writes(server):
    """LlamaIndex's recorded FunctionAgent request replayed (greedy, room for a call): the bundled model answers it
    with calls written as fenced JSON, held back until complete; LlamaIndex's reading of the stream gets each call's
    arguments, the same as the answer sent whole."""
    body = {**LLAMAINDEX["body"], "model": MODEL, "temperature": 0, "max_tokens": 160}
    whole = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=600).json()
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in whole["choices"][0]["message"]["tool_calls"] or []]  # fmt: skip
    assert calls, whole  # the model calls (else this test shows nothing)
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=600) as reply:
        chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    assert [(name, json.loads(arguments)) for name, arguments in llamaindex(chunks)] == calls
