"""A stream that waits says it is alive: while a long prompt prefills (or waits in the queue), every stream sends
something at least every keep-alive interval, so a client whose idle timeout is shorter than the prefill reads its
answer to the end instead of reconnecting (Codex CLI gave up on an 8,661-token first turn after 300 s of silence and
sent it again). Chat and completions streams send SSE comments, which every SSE reader skips; the Responses stream
sends `response.in_progress` events, which Codex CLI's idle timer counts (it counts events, not bytes).

In process on the tiny pair behind a real HTTP server (uvicorn on loopback), with a prefill slowed to 2.4 s and a
keep-alive interval of 0.2 s; the clients' read timeout is 1 s. Without keep-alives each of these times out."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn

from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.server.app import ServerState, create_app
from verispec.testing import tiny_loaded, tiny_pair, tool_tokenizer

from serving import free_port

CHUNK_SECONDS = 0.4  # each prefill chunk of the slowed server


def prompt(word: str) -> str:
    """A four-letter word 20 times: 100 tokens of the tiny byte-level tokenizer, six chunks of 16, 2.4 s of prefill (a
    word of its own per test: the server reuses a prefilled prompt's blocks)."""
    return f"{word} " * 20


READ_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server(one_thread) -> Iterator[str]:
    target, draft = tiny_pair()
    tokenizer = tool_tokenizer()
    target, draft = tiny_loaded(target.model, tokenizer), tiny_loaded(draft.model, tokenizer, "tiny-draft")
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=2, max_model_len=512, prefill_chunk=16))
    compute = scheduler.prefill.compute_chunk

    def slow_chunk(seq, contended):  # a long prompt on a loaded machine
        time.sleep(CHUNK_SECONDS)
        compute(seq, contended)

    scheduler.prefill.compute_chunk = slow_chunk
    app = create_app(ServerState(scheduler, "tiny", keep_alive=0.2))
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(10)


def _client(url: str) -> openai.OpenAI:
    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT)
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=timeout, max_retries=0)


def test_a_chat_stream_outlives_a_prefill_longer_than_the_clients_idle_timeout(server):
    stream = _client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt("chat")}], max_tokens=4, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_a_completions_stream_sends_sse_comments_while_it_waits(server):
    body = {"model": "tiny", "prompt": prompt("text"), "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=httpx.Timeout(30.0, read=1.0)) as reply:
        lines = list(reply.iter_lines())
    assert ": keep-alive" in lines  # an SSE comment, skipped by every reader
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_responses_stream_repeats_in_progress_while_it_waits(server):
    body = {"model": "tiny", "input": prompt("type"), "max_output_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server + "/v1/responses", json=body, timeout=httpx.Timeout(30.0, read=1.0)) as reply:
        kinds = [line[7:] for line in reply.iter_lines() if line.startswith("event: ")]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.count("response.in_progress") >= 3  # 2.4 s of prefill at 0.2 s: several
    assert kinds[-1] in ("response.completed", "response.incomplete")  # the answer ends, whole or cut
    # the official client reads the stream to its end with the same idle timeout
    client = _client(server)
    events = list(client.responses.create(model="tiny", input=prompt("sdks"), max_output_tokens=4, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    numbers = [event.sequence_number for event in events]
    assert numbers == sorted(set(numbers))  # each event its own number, in order
