"""Workloads whose answers repeat text the model has already seen: what suffix drafting is for.

    code-edit    a HumanEval function (its prompt and canonical solution) and a small change to make, the whole
                 function back: the answer copies most of its prompt
    multi-turn   a first answer (the canonical solution, as the assistant's turn), then a follow-up that asks to
                 revise or extend it: the second answer quotes the first
    agent-loop   a scripted sequence of requests that each produce a JSON tool call (structured output on): the same
                 shapes request after request, so earlier requests' outputs predict the next one's

Each is a list of (id, chat messages, JSON schema or None), in the order a client would send them.
"""

from __future__ import annotations

EDITS = (
    "Add type hints to every parameter, local variable and the return value",
    "Rename the function's first parameter to `values`, everywhere it is used",
    "Add a check at the start that returns early on an empty input",
    "Add a short comment above each loop explaining what it does",
)
FOLLOW_UPS = (
    "Now rewrite it so it never uses an explicit index variable; keep the same behaviour",
    "Add input validation: raise TypeError with a clear message when an argument has the wrong type",
    "Make it handle very large inputs efficiently, and explain the change in a comment",
    "Add three doctest examples to its docstring that cover edge cases",
)
AGENT_SCHEMA = {
    "type": "object",
    "properties": {
        "thought": {"type": "string", "maxLength": 120},
        "tool": {"type": "string", "enum": ["read_file", "list_functions", "run_tests", "write_file", "search"]},
        "arguments": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
            "required": ["path"],
        },
    },
    "required": ["thought", "tool", "arguments"],
}
AGENT_SYSTEM = (
    "You are a coding agent working in a Python repository. Each turn, reply with exactly one JSON tool call: "
    '{"thought": "...", "tool": "...", "arguments": {"path": "...", "query": "..."}}. Tools: read_file, '
    "list_functions, run_tests, write_file, search."
)
AGENT_MODULES = ("statistics", "fractions", "textwrap", "shlex", "calendar", "heapq", "bisect", "difflib",
                 "configparser", "tempfile")  # fmt: skip
AGENT_TASKS = (
    "Find where `{module}` computes its main result and list the functions involved",
    "Check whether `{module}` has tests for empty inputs",
)


def _functions(rows: list[dict]) -> list[str]:
    return [row["prompt"] + row["canonical_solution"] for row in rows]


def code_edits(rows: list[dict]) -> list[tuple[str, list[dict], None]]:
    requests = []
    for i, (row, function) in enumerate(zip(rows, _functions(rows), strict=True)):
        edit = EDITS[i % len(EDITS)]
        content = f"```python\n{function.rstrip()}\n```\n\n{edit}. Reply with the whole function in one code block."
        requests.append((f"code-edit-{row['task_id']}", [{"role": "user", "content": content}], None))
    return requests


def multi_turn(rows: list[dict]) -> list[tuple[str, list[dict], None]]:
    requests = []
    for i, (row, function) in enumerate(zip(rows, _functions(rows), strict=True)):
        first = f"Write the Python function `{row['entry_point']}` described here:\n\n{row['prompt'].rstrip()}"
        answer = f"```python\n{function.rstrip()}\n```"
        follow_up = f"{FOLLOW_UPS[i % len(FOLLOW_UPS)]}. Reply with the whole function in one code block."
        messages = [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
                    {"role": "user", "content": follow_up}]  # fmt: skip
        requests.append((f"multi-turn-{row['task_id']}", messages, None))
    return requests


def agent_loop(count: int = 20) -> list[tuple[str, list[dict], dict]]:
    """`count` requests of one scripted session: each asks for the next tool call on another module and task."""
    requests = []
    for i in range(count):
        module = AGENT_MODULES[i % len(AGENT_MODULES)]
        task = AGENT_TASKS[(i // len(AGENT_MODULES)) % len(AGENT_TASKS)].format(module=module)
        messages = [{"role": "system", "content": AGENT_SYSTEM},
                    {"role": "user", "content": f"Task {i + 1}: {task}. The module is Lib/{module}.py."}]  # fmt: skip
        requests.append((f"agent-loop-{i + 1:02d}", messages, AGENT_SCHEMA))
    return requests
