"""How the bundled model writes tool calls under `tool_choice: "auto"`, and what the server reads back: every request
of a recorded set run greedily through the engine with the server's own prompt and grammar (server/tools.py
`request_prompt`), each answer classified by the form it is written in, and parsed as the server parses it.

The recorded set: the steps of the recorded agent runs (src/verispec/bench/data/agent_runs.jsonl, tool_choice set to
auto), the first chat request each client of tests/fixtures/clients/ sent, and control questions that need no tool
(asked with the same tools: a call there is a false one).

    python benchmarks/tool_call_forms.py [--max-tokens 128] [--limit N] [--json out.json]

Prints a table: per form, how many answers were written in it and how many of those came back as calls.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "tests" / "fixtures" / "clients"
CONTROLS = [
    "Write a haiku about the sea.",
    "What is the difference between a list and a tuple in Python?",
    "Explain what a race condition is, in two sentences.",
    "Translate 'good morning' into French.",
    "Show me a Python function that reverses a string.",
    "Give me a JSON object describing a cat with a name and an age.",
]


def requests() -> list[tuple[str, str, dict]]:
    """(kind, id, chat request body): agent steps, client requests, controls."""
    found = []
    for line in (ROOT / "src/verispec/bench/data/agent_runs.jsonl").read_text().splitlines():
        step = json.loads(line)
        found.append(("agent step", step["id"], {**step["request"], "tool_choice": "auto"}))
    tools = found[0][2]["tools"] if found else []
    for path in sorted(CLIENTS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["path"].endswith("/chat/completions") and record["step"] == 1:
                body = {k: record["body"][k] for k in ("messages", "tools", "tool_choice") if k in record["body"]}
                if body.get("tools"):
                    found.append(("client", f"{record['client']}:{record['scenario']}", body))
    for i, question in enumerate(CONTROLS):
        messages = [{"role": "user", "content": question}]
        found.append(("control", f"control-{i}", {"messages": messages, "tools": tools, "tool_choice": "auto"}))
    return found


FORMS = [  # the first that fits names an answer's form
    ("hermes tags", re.compile(r"<tool_call>")),
    ("fenced JSON", re.compile(r"```[a-z_]*\s*\n\s*[\[{]", re.I)),
    ("<tools> tags", re.compile(r"<tools>")),
    ("doubled braces", re.compile(r"^\s*\{\{")),
    ("bare JSON", re.compile(r"^\s*[\[{]")),
]


REASONS = ("cut by max_tokens", "not JSON", "no declared tool named", "arguments do not conform")


def why_not(text: str, declared, finish_reason: str) -> str:
    """Why an answer written in a JSON form holds no call."""
    from verispec.server.call_forms import fences
    from verispec.server.call_schema import validates

    if finish_reason == "length":
        return REASONS[0]
    bodies = [fence.body(text) for fence in fences(text) if fence.closed] or [text.strip().strip("{}") and text]
    for body in bodies:
        body = body.strip()
        body = body[1:-1] if body.startswith("{{") and body.endswith("}}") else body
        try:
            value = json.loads(body)
        except ValueError:
            continue
        for call in value if isinstance(value, list) else [value]:
            if not isinstance(call, dict) or call.get("name") not in declared.schemas:
                return REASONS[2]
            if not validates(call.get("arguments", call.get("parameters")), declared.schemas[call["name"]] or {}):
                return REASONS[3]
    return REASONS[1]


def form_of(text: str) -> str:
    return next((name for name, pattern in FORMS if pattern.search(text)), "prose")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="at most this many requests of each kind")
    parser.add_argument("--json", type=Path, default=None, help="write every answer and its verdict here")
    args = parser.parse_args()

    from verispec.decoding.sampling import SamplingParams
    from verispec.engine.requests import EngineRequest
    from verispec.engine.scheduler import Scheduler, SchedulerConfig
    from verispec.models.loading import load_pair
    from verispec.server.protocol import ChatCompletionRequest
    from verispec.server.tools import detect, parse_calls, request_prompt, tool_request

    target, draft = load_pair("target", "draft", "float32", "cpu", quantization="gguf", progress=False)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=8192, speculative_method="suffix")
    scheduler = Scheduler(target, draft, config)
    tokenizer, fmt = target.tokenizer, detect(target.tokenizer.chat_template)
    taken: Counter = Counter()
    table: Counter = Counter()
    records = []
    for kind, name, body in requests():
        if args.limit is not None and taken[kind] >= args.limit:
            continue
        taken[kind] += 1
        ids, grammar_text = request_prompt(body, tokenizer)
        grammar = None if grammar_text is None else _compile(scheduler, grammar_text)
        done: list = []
        sink = _finished_into(done)
        begin = time.perf_counter()
        scheduler.submit(
            EngineRequest(
                request_id=name,
                prompt_ids=ids,
                params=SamplingParams(),
                max_tokens=args.max_tokens,
                sink=sink,
                grammar=grammar,
            )
        )
        scheduler.run_until_idle()
        output = done[0].output
        text = tokenizer.decode(output.token_ids, keep_special=True)
        tools = tool_request(ChatCompletionRequest.model_validate(body), fmt)
        _, calls = parse_calls(tools, text, cut=output.finish_reason == "length")
        form = form_of(text)
        why = "" if calls or form == "prose" else why_not(text, tools.declared, output.finish_reason)
        table[kind, form, "answers"] += 1
        table[kind, form, "calls"] += bool(calls)
        table[kind, form, why] += bool(why)
        records.append({"kind": kind, "id": name, "form": form, "calls": [c.name for c in calls], "text": text,
                        "why_not": why, "seconds": round(time.perf_counter() - begin, 2)})  # fmt: skip
        print(f"{kind:10} {name:40} {form:14} calls={[c.name for c in calls]}", file=sys.stderr, flush=True)
    print("| requests | form written | answers | read back as calls | not a call: " + " / ".join(REASONS) + " |")
    print("|---|---|---|---|---|")
    for kind in ("agent step", "client", "control"):
        for form in [name for name, _ in FORMS] + ["prose"]:
            if table[kind, form, "answers"]:
                reasons = " / ".join(str(table[kind, form, reason]) for reason in REASONS)
                counts = f"{table[kind, form, 'answers']} | {table[kind, form, 'calls']}"
                print(f"| {kind} | {form} | {counts} | {reasons} |")
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1, ensure_ascii=False))
    return 0


def _finished_into(done: list):
    from verispec.engine.requests import FinishEvent

    return lambda event: done.append(event) if isinstance(event, FinishEvent) else None


def _compile(scheduler, grammar: str):
    from verispec.decoding.grammar import GrammarSpec

    return scheduler.grammars.compile(GrammarSpec("grammar", grammar))


if __name__ == "__main__":
    sys.exit(main())
