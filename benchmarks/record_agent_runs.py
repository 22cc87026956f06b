"""Record real agent runs for the `agent-runs` bench dataset: an agent with three tools over the Python standard
library's sources (list a directory, read a file, search for a name) answers questions about it, through a running
`verispec serve`, and every step's request (the conversation the server saw, its tools and tool choice) is written
as one JSON line.

    verispec serve --port 8000 &                       # the bundled pair (greedy: the runs are reproducible)
    python benchmarks/record_agent_runs.py --url http://127.0.0.1:8000 \\
        --output src/verispec/bench/data/agent_runs.jsonl

The agent calls tools for its first `--tool-steps` steps (tool_choice "required": the bundled 1.5B model answers
"auto" with a JSON code block, not a call) and answers on the next (tool_choice "auto"). Tool results are capped
(a file at 60 lines a read, 12 search hits) so that a run fits a 4,096-token context.
"""

from __future__ import annotations

import argparse
import json
import re
import sysconfig
from pathlib import Path

import httpx

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SYSTEM = (
    "You are a code-reading agent. The Python standard library's source tree is your working directory: paths are "
    "relative to it, like 'heapq.py' or 'json/decoder.py'. Find where things are defined with search, read the "
    "lines around them with read_file (start and end line numbers), then answer briefly, naming the functions and "
    "files involved. Do not read the same lines twice."
)
TOOLS = [
    {"type": "function", "function": {
        "name": "list_dir", "description": "List the files and folders of a directory, e.g. 'json' or '.'",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read lines of a file (at most 60 at a time, numbered)",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "start": {"type": "integer", "minimum": 1}, "end": {"type": "integer"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Find where a function or class is defined, e.g. 'heappush': its file and line number",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
]  # fmt: skip
TASKS = [
    "Which class does json.loads use to decode a string? Look at json/__init__.py.",
    "Which function of textwrap wraps a paragraph into a list of lines, and what does it call?",
    "How does heapq.heappush keep the heap in order? Read its code.",
    "What does shlex.split do with comments by default? Read its source.",
    "How is bisect.insort_left implemented?",
    "How does statistics.median handle an even number of values?",
    "Where does the calendar module get the names of the weekdays?",
    "How does fractions.Fraction reduce a fraction to lowest terms?",
    "What does difflib.SequenceMatcher.ratio return, and how is it computed?",
    "How does tempfile choose the directory for temporary files?",
    "Which class of configparser parses INI files, and which comment prefixes does it accept by default?",
    "Which helper does base64.b64encode call to do its work?",
]


def _safe(path: str) -> Path | None:
    target = (STDLIB / path.lstrip("/")).resolve()
    return target if target.is_relative_to(STDLIB.resolve()) and target.exists() else None


def list_dir(path: str) -> str:
    target = _safe(path or ".")
    if target is None or not target.is_dir():
        return f"error: no directory {path!r}"
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir() if not p.name.startswith("__pyc"))
    return "\n".join(entries[:80]) + ("\n..." if len(entries) > 80 else "")


def read_file(path: str, start: int = 1, end: int | None = None) -> str:
    target = _safe(path)
    if target is None or not target.is_file():
        return f"error: no file {path!r}"
    lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
    start = max(1, start)
    end = min(len(lines), end or start + 59, start + 59)
    return "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, end + 1))


def search(name: str) -> str:
    pattern = re.compile(rf"^\s*(def|class)\s+{re.escape(name.split('.')[-1])}\b")
    hits = []
    for path in sorted(STDLIB.glob("*.py")) + sorted(STDLIB.glob("*/*.py")):
        if "test" in path.parts[-2] or path.name.startswith("test"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.match(line):
                hits.append(f"{path.relative_to(STDLIB)}:{number}: {line.strip()}")
                if len(hits) == 12:
                    return "\n".join(hits)
    return "\n".join(hits) or f"no definition of {name!r}"


FUNCTIONS = {"list_dir": list_dir, "read_file": read_file, "search": search}


def run(url: str, task: str, tool_steps: int, max_tokens: int) -> list[dict]:
    """One agent run; returns every step's request body."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    steps = []
    for step in range(tool_steps + 1):
        body = {"messages": list(messages), "tools": TOOLS, "tool_choice": "required" if step < tool_steps else "auto",
                "temperature": 0, "max_tokens": max_tokens}  # fmt: skip
        steps.append(json.loads(json.dumps(body)))
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()
        message = reply["choices"][0]["message"]
        if not message.get("tool_calls"):
            break
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]})
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            try:
                result = FUNCTIONS[call["function"]["name"]](**arguments)
            except TypeError as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--tool-steps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    with args.output.open("w", encoding="utf-8") as out:
        for number, task in enumerate(TASKS):
            steps = run(args.url, task, args.tool_steps, args.max_tokens)
            for step, body in enumerate(steps):
                out.write(json.dumps({"id": f"agent-{number:02d}-step-{step}", "session": f"agent-{number:02d}",
                                      "request": body}, ensure_ascii=False) + "\n")  # fmt: skip
            print(f"task {number}: {len(steps)} steps", flush=True)


if __name__ == "__main__":
    main()
