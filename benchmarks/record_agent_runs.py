"""Record real agent runs for the `agent-runs` bench dataset: a coding agent with four tools over the Python
standard library's sources (list a directory, read a file, search for a name, edit a file) carries out small edits
through a running `verispec serve`, and every step's request (the conversation the server saw, its tools and tool
choice) is written as one JSON line.

    verispec serve --port 8000 &                       # the bundled pair (greedy: the runs are reproducible)
    python benchmarks/record_agent_runs.py --url http://127.0.0.1:8000 \\
        --output src/verispec/bench/data/agent_runs.jsonl

The harness works as coding agents' harnesses do:
- tool_choice "required" for the first `--tool-steps` steps (the bundled 1.5B model answers "auto" with a bare
  JSON object, not a call), then a last user turn asks for the answer, with tool_choice "none";
- edits go to an overlay, never to the installed library: a later read shows the edited file;
- a call identical to an earlier one is not run again: its result says so (small models repeat themselves);
- tool results are capped (60 lines a read, 12 search hits, 40 lines of code) so that a run fits a 4,096-token
  context.
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
    "You are a coding agent. The Python standard library's source tree is your working directory: paths are "
    "relative to it, like 'heapq.py' or 'json/decoder.py'. Find a function and its code with search, read "
    "more of a file with read_file (start and end line numbers). Then change it with edit_file: old_text "
    "is the whole function copied exactly from the file (without line numbers), new_text is the whole new "
    "function. Do not repeat a call."
)
FINAL = "Now reply to me: say what you changed, in which file, and show the new code."
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
        "description": "Find where a function or class is defined, e.g. 'heappush': its file, line and code",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
    {"type": "function", "function": {
        "name": "edit_file",
        "description": "Replace text in a file: old_text must be copied exactly from the file (without line numbers)",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
            "required": ["path", "old_text", "new_text"]}}},
]  # fmt: skip
TASKS = [
    "Add type hints to heapq.heappush and heapq.heappop.",
    "Add type hints to bisect.insort_left.",
    "Add type hints to colorsys.rgb_to_hls.",
    "Add type hints to shlex.quote.",
    "Add type hints to textwrap.dedent.",
    "Add type hints to calendar.isleap and calendar.leapdays.",
    "Add type hints to glob.has_magic.",
    "Add type hints to fnmatch.fnmatchcase.",
    "Add type hints to html.escape.",
    "Add type hints to shutil.copyfileobj.",
    "Add type hints to base64.b64encode.",
    "Add type hints to statistics.median.",
]


class Workspace:
    """The agent's view of the standard library: reads see its edits, which never reach the disk."""

    def __init__(self) -> None:
        self.edited: dict[Path, str] = {}

    def _path(self, path: str) -> Path | None:
        target = (STDLIB / path.lstrip("/")).resolve()
        return target if target.is_relative_to(STDLIB.resolve()) and target.exists() else None

    def _text(self, target: Path) -> str:
        return self.edited.get(target) or target.read_text(encoding="utf-8", errors="replace")

    def list_dir(self, path: str) -> str:
        target = self._path(path or ".")
        if target is None or not target.is_dir():
            return f"error: no directory {path!r}"
        entries = sorted(p.name + "/" * p.is_dir() for p in target.iterdir() if not p.name.startswith("__pyc"))
        return "\n".join(entries[:80]) + ("\n..." if len(entries) > 80 else "")

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        target = self._path(path)
        if target is None or not target.is_file():
            return f"error: no file {path!r}"
        lines = self._text(target).splitlines()
        start = max(1, start)
        end = min(len(lines), end or start + 59, start + 59)
        return "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, end + 1))

    def search(self, name: str) -> str:
        """Where `name` is defined (up to 12 hits), and the first definition's code, as code-search tools show."""
        pattern = re.compile(rf"^\s*(def|class)\s+{re.escape(name.split('.')[-1])}\b")
        hits: list[tuple[Path, int, str]] = []
        for path in sorted(STDLIB.glob("*.py")) + sorted(STDLIB.glob("*/*.py")):
            if "test" in path.parts[-2] or path.name.startswith("test"):
                continue
            for number, line in enumerate(self._text(path).splitlines(), 1):
                if pattern.match(line) and len(hits) < 12:
                    hits.append((path, number, line.strip()))
        if not hits:
            return f"no definition of {name!r}"
        listing = "\n".join(f"{path.relative_to(STDLIB)}:{number}: {line}" for path, number, line in hits)
        return listing + "\n\n" + self._definition(*hits[0][:2])

    def _definition(self, path: Path, number: int) -> str:
        lines = self._text(path).splitlines()
        indent = len(lines[number - 1]) - len(lines[number - 1].lstrip())
        end = number
        while end < len(lines) and end - number < 40:
            line = lines[end]
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            end += 1
        body = "\n".join(lines[number - 1 : end]).rstrip()
        return f"{path.relative_to(STDLIB)}, lines {number}-{end}:\n```python\n{body}\n```"

    def edit_file(self, path: str, old_text: str, new_text: str) -> str:
        target = self._path(path)
        if target is None or not target.is_file():
            return f"error: no file {path!r}"
        text = self._text(target)
        count = text.count(old_text) if old_text else 0
        if count != 1:
            return f"error: old_text occurs {count} times in {path}; copy it exactly (without line numbers)"
        self.edited[target] = text.replace(old_text, new_text)
        first = text[: text.index(old_text)].count("\n") + 1
        return f"ok: replaced lines {first}-{first + old_text.count(chr(10))} of {path}"

    def call(self, name: str, arguments: dict) -> str:
        try:
            return getattr(self, name)(**arguments)
        except TypeError as exc:
            return f"error: {exc}"


def run(url: str, task: str, tool_steps: int, max_tokens: int) -> list[dict]:
    """One agent run; returns every step's request body."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    workspace, seen, steps = Workspace(), set(), []
    for step in range(tool_steps + 1):
        final = step == tool_steps
        if final:
            messages.append({"role": "user", "content": FINAL})
        body = {"messages": list(messages), "tools": TOOLS, "tool_choice": "none" if final else "required",
                "temperature": 0, "max_tokens": max_tokens}  # fmt: skip
        steps.append(json.loads(json.dumps(body)))
        try:
            reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()
        except httpx.HTTPError as exc:
            raise SystemExit(f"cannot reach the server at {url}: {exc}") from None
        if "choices" not in reply:
            raise SystemExit(f"the server refused step {step}: {reply}")
        message = reply["choices"][0]["message"]
        if final or not message.get("tool_calls"):
            break
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]})
        for call in message["tool_calls"]:
            key = (call["function"]["name"], call["function"]["arguments"])
            if key in seen:
                result = "error: this exact call was made before; its result is above. Take the next step."
            else:
                seen.add(key)
                result = workspace.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--tool-steps", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--tasks", type=int, default=len(TASKS), help="record the first N tasks")
    args = parser.parse_args()
    with args.output.open("w", encoding="utf-8") as out:
        for number, task in enumerate(TASKS[: args.tasks]):
            steps = run(args.url, task, args.tool_steps, args.max_tokens)
            for step, body in enumerate(steps):
                out.write(json.dumps({"id": f"agent-{number:02d}-step-{step}", "session": f"agent-{number:02d}",
                                      "request": body}, ensure_ascii=False) + "\n")  # fmt: skip
            print(f"task {number}: {len(steps)} steps", flush=True)


if __name__ == "__main__":
    main()
