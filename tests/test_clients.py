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
