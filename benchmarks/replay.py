"""Recorded client runs replayed through `verispec serve`, as the clients sent them, with speculation on and off and
with answers kept in the prefix cache or not (`--answer-reuse`): time to the first event and in all, per step.

    python benchmarks/replay.py codex [--max-output-tokens 256]
    python benchmarks/replay.py agent-runs [--sessions 6] [--max-tokens 512]

codex       the recorded Codex CLI run (tests/fixtures/clients/codex.jsonl, scenario exec_ls: its first request and the
            next one, which resends the conversation with a tool result), streamed as Codex streams it.
agent-runs  the recorded coding-agent runs (src/verispec/bench/data/agent_runs.jsonl): each session's steps in order,
            each session under a cache_salt of its own (a session shares with itself only, as a fresh server would
            meet it); greedy, so every earlier answer in a step's history is what this model wrote.

Each configuration gets a fresh server (the bundled pair, its defaults plus the configuration's flags); every
request is sent once. Prints, per configuration and step, the median seconds to the first event and in all, the
tokens per second with prefill counted, and cached tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx
from served import ServedProcess

ROOT = Path(__file__).resolve().parents[1]
MODEL = "replay"
CONFIGS = {
    "speculative": [],
    "plain": ["--speculative-model", "none"],
    "speculative-no-answer-reuse": ["--no-answer-reuse"],
    "plain-no-answer-reuse": ["--speculative-model", "none", "--no-answer-reuse"],
}
OUTPUT_EVENTS = re.compile(r'"response\.output_item\.added"|"content": "[^"]|"tool_calls": \[')  # shown first


class Server(ServedProcess):
    def __init__(self, flags: list[str]) -> None:
        super().__init__(["--served-model-name", MODEL, *flags])

    def send(self, path: str, body: dict, headers: dict | None = None) -> dict:
        """{first: seconds to the first output event (an item added, a chunk with content or calls; for a
        reply not streamed, its end), total: seconds; tokens; cached; answer} of one request."""
        begin, first = time.perf_counter(), None
        with httpx.stream("POST", self.url + path, json=body, headers=headers or {}, timeout=3600) as reply:
            lines = []
            for line in reply.iter_lines():
                if first is None and line.startswith("data: ") and OUTPUT_EVENTS.search(line):
                    first = time.perf_counter() - begin
                lines.append(line)
        total = time.perf_counter() - begin
        if reply.status_code != 200:
            raise SystemExit(f"{path}: {reply.status_code} {' '.join(lines)[:500]}")
        usage = _usage(lines, body.get("stream", False))
        return {"first": first or total, "total": total, **usage}


def _usage(lines: list[str], streamed: bool) -> dict:
    """Tokens written, prompt tokens cached, and the answer (its text and calls, without ids) of one reply."""
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")] if streamed else [
        json.loads("".join(lines))]  # fmt: skip
    for event in reversed(events):
        usage = (event.get("response") or {}).get("usage") or event.get("usage")
        if usage:
            if "input_tokens" in usage:
                answer = [{k: v for k, v in item.items() if k not in ("id", "call_id")}
                          for item in event["response"]["output"]]  # fmt: skip
                return {"tokens": usage["output_tokens"], "cached": usage["input_tokens_details"]["cached_tokens"],
                        "answer": json.dumps(answer)}  # fmt: skip
            details = usage.get("prompt_tokens_details") or {}
            message = dict(event["choices"][0]["message"])
            message["tool_calls"] = [call["function"] for call in message.get("tool_calls") or []]
            return {"tokens": usage["completion_tokens"], "cached": details.get("cached_tokens", 0),
                    "answer": json.dumps(message)}  # fmt: skip
    return {"tokens": 0, "cached": 0, "answer": ""}


def codex_requests(args: argparse.Namespace) -> list[list[tuple[str, str, dict, dict]]]:
    path = ROOT / "tests" / "fixtures" / "clients" / "codex.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    run = []
    for record in records:
        if record["scenario"] == "exec_ls":
            body = {**record["body"], "model": MODEL, "max_output_tokens": args.max_output_tokens, "temperature": 0}
            headers = {k: v for k, v in record["headers"].items() if k.lower() not in ("content-type",)}
            run.append((f"step {record['step']}", record["path"], body, headers))
    return [run]


def agent_run_requests(args: argparse.Namespace) -> list[list[tuple[str, str, dict, dict]]]:
    path = ROOT / "src" / "verispec" / "bench" / "data" / "agent_runs.jsonl"
    sessions: dict[str, list] = {}
    for line in path.read_text().splitlines():
        step = json.loads(line)
        sessions.setdefault(step["session"], []).append(step)
    runs = []
    for steps in list(sessions.values())[: args.sessions]:
        salt = uuid.uuid4().hex
        runs.append([
            (f"step {i + 1}", "/v1/chat/completions",
             {**step["request"], "model": MODEL, "max_tokens": args.max_tokens, "temperature": 0, "cache_salt": salt},
             {})
            for i, step in enumerate(steps)
        ])  # fmt: skip
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("codex", "agent-runs"))
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    args = parser.parse_args()
    runs = codex_requests(args) if args.workload == "codex" else agent_run_requests(args)
    results: dict[str, dict[str, list[dict]]] = {}
    for name in args.configs.split(","):
        server = Server(CONFIGS[name])
        try:
            for run in runs:
                for step, path, body, headers in run:
                    result = server.send(path, body, headers)
                    results.setdefault(name, {}).setdefault(step, []).append(result)
                    print(
                        f"{name:30} {step:8} first {result['first']:6.2f} s, total {result['total']:6.2f} s, "
                        f"{result['tokens']} tokens, {result['cached']} cached",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            server.stop()
    print("| configuration | step | median s to first output | median s in all | tok/s (prefill counted) | cached |")
    print("|---|---|---|---|---|---|")
    for name, steps in results.items():
        every = [row for step_rows in steps.values() for row in step_rows]
        for step, rows in [*steps.items(), ("all", every)]:
            rate = sum(row["tokens"] for row in rows) / sum(row["total"] for row in rows)
            print(f"| {name} | {step} | {statistics.median(r['first'] for r in rows):.2f} | "
                  f"{statistics.median(r['total'] for r in rows):.2f} | {rate:.1f} | "
                  f"{sum(r['cached'] for r in rows)} |")  # fmt: skip
    _identical(results)
    return 0


def _identical(results: dict[str, dict[str, list[dict]]]) -> None:
    """How many answers each configuration gave equal to plain decoding's (greedy: all of them, where exact)."""
    reference = results.get("plain")
    if reference is None:
        return
    expected = [row["answer"] for rows in reference.values() for row in rows]
    for name, steps in results.items():
        got = [row["answer"] for rows in steps.values() for row in rows]
        same = sum(a == b for a, b in zip(got, expected, strict=False))
        print(f"{name}: {same} of {len(expected)} answers identical to plain decoding's")


if __name__ == "__main__":
    sys.exit(main())
