"""The recorded agent runs (`verispec bench --dataset agent-runs`) and the harness that records them
(benchmarks/record_agent_runs.py): each run is a session whose conversation only grows, every recorded call is
valid by its tool's schema, and each step renders with the server's own prompt and tool grammar."""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest

from verispec.bench.datasets import AGENT_RUNS, load_requests

from real_models import require_bundled

RECORDER = Path(__file__).parents[1] / "benchmarks" / "record_agent_runs.py"


@pytest.fixture(scope="module")
def recorder():
    spec = importlib.util.spec_from_file_location("record_agent_runs", RECORDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sessions() -> dict[str, list[dict]]:
    runs = defaultdict(list)
    for request in load_requests(AGENT_RUNS):
        runs[request.session].append(request.chat)
    return dict(runs)


def test_each_run_is_a_session_whose_conversation_only_grows(sessions):
    assert len(sessions) == 12
    for steps in sessions.values():
        assert [step["tool_choice"] for step in steps] == ["required"] * (len(steps) - 1) + ["none"]
        for before, after in zip(steps, steps[1:], strict=False):
            # a step sees every message of the step before it, then that step's answer and the tools' results
            assert after["messages"][: len(before["messages"])] == before["messages"]
            assert len(after["messages"]) > len(before["messages"])


def test_every_recorded_call_is_valid_by_its_tools_schema(sessions, recorder):
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in recorder.TOOLS}
    calls = [
        call
        for steps in sessions.values()
        for message in steps[-1]["messages"]
        for call in message.get("tool_calls") or []
    ]
    assert len(calls) >= 60
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])


def test_every_step_renders_with_the_servers_prompt_and_tool_grammar(sessions):
    require_bundled()
    from verispec.models.bundled import bundled_path
    from verispec.models.tokenizer import Tokenizer
    from verispec.server.tools import request_prompt

    tokenizer = Tokenizer.from_gguf(bundled_path("target"))
    for steps in sessions.values():
        lengths = []
        for step in steps:
            ids, grammar = request_prompt(step, tokenizer)
            assert (grammar is None) == (step["tool_choice"] == "none")
            lengths.append(len(ids))
        assert lengths == sorted(lengths)  # the prompt grows with the conversation
        assert lengths[-1] + 512 <= 4096  # each run fits the bench's default context with its answers


def test_the_workspace_keeps_edits_off_the_disk_and_shows_them_to_later_reads(recorder):
    workspace = recorder.Workspace()
    path = recorder.STDLIB / "colorsys.py"
    on_disk = path.read_text(encoding="utf-8")
    found = workspace.search("rgb_to_hls")
    assert found.startswith("colorsys.py:") and "```python\ndef rgb_to_hls(r, g, b):" in found
    assert workspace.edit_file("colorsys.py", "def rgb_to_hls(r, g, b):", "def rgb_to_hls(r: float, g, b):").startswith(
        "ok: replaced lines"
    )
    line = int(found.split(":")[1])
    assert workspace.read_file("colorsys.py", line, line) == f"{line}: def rgb_to_hls(r: float, g, b):"
    assert path.read_text(encoding="utf-8") == on_disk
    # text that is not in the file (or is there twice) is refused, naming how often it occurs
    assert workspace.edit_file("colorsys.py", "def rgb_to_hls(r, g, b):", "x").startswith("error: old_text occurs 0")
    assert workspace.read_file("../etc/passwd").startswith("error: no file")
    assert workspace.call("read_file", {"path": "colorsys.py", "line": 3}).startswith("error:")
