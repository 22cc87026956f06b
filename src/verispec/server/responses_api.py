"""OpenAI's Responses API (`/v1/responses`): a request is turned into the chat request it means and runs through the
same engine and tool calling as /v1/chat/completions; its answer is a Response object, or its stream of typed events;
with `store` (the default) the response is kept (responses_store.py) for `previous_response_id`, `GET`, `DELETE` and
`input_items`.

What a request becomes (`plan`): `instructions` a system message; input items, after the stored conversation of
`previous_response_id`, chat messages in order (a call joining the assistant message before it; reasoning items
skipped: verispec's models do not read them; `item_reference`s found in the store); tools flattened: function tools
as they are, a `namespace`'s tools under their own names, a `custom` tool a function of one string `input` (its regex
format enforced as that string's pattern; a Lark grammar shown in its description, not enforced: a grammar over the
JSON-escaped text is not what the library checks), `local_shell` a function of its action; hosted tools
(`web_search`, `file_search`, ...), which the server cannot run, left out of what the model sees and named in the
`X-Verispec-Tools-Left-Out` header. Every refusal names the Responses field at fault (`input.3.arguments`,
`text.format`, `max_output_tokens`), never the chat field it became. `truncation: "auto"` drops the oldest turns until
the prompt fits.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..decoding.grammar import GrammarError, check_regex
from ..engine.requests import ErrorEvent, FinishEvent, GenerationOutput
from .cut_json import closed_object
from .events import KEEP_ALIVE
from .harmony import HarmonyStream, read_answer
from .protocol import ApiError, ChatCompletionRequest
from .responses import Job, event_error, usage
from .responses_protocol import (
    AdditionalToolsItem,
    CustomTool,
    FunctionTool,
    HostedTool,
    ItemReference,
    LocalShellTool,
    NamedToolChoice,
    NamespaceTool,
    ResponsesRequest,
    UnknownItem,
    whole_input,
)
from .tools import ToolStream, answer_calls, parse_calls

LEFT_OUT_HEADER = "X-Verispec-Tools-Left-Out"  # the hosted tools a request named that the model was not shown
LOCAL_SHELL = "local_shell"
LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "the command and its arguments"},
        "working_directory": {"type": "string"},
        "timeout_ms": {"type": "integer"},
    },
    "required": ["command"],
    "additionalProperties": False,
}


class ResponseObject(BaseModel):
    """A Response as `response_object` builds it (the published schema's view: its main fields)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None


@dataclass
class Plan:
    """A Responses request as the chat request it means, and what answering it in Responses terms needs."""

    body: ResponsesRequest
    chat: ChatCompletionRequest
    items: list[dict]  # the conversation's input items: the stored ones of previous_response_id, then this request's
    new_items: list[dict]  # this request's input items (with ids), as stored
    kinds: dict[str, str]  # tool name -> function | custom | local_shell
    left_out: list[str]  # hosted tools not offered
    origins: list[str] = field(default_factory=list)  # per chat message: the Responses field it came from
    call_origins: dict[tuple[int, int], str] = field(default_factory=dict)  # (message, call) -> its item
    tool_origins: list[str] = field(default_factory=list)  # per chat tool: the Responses field it came from
    dropped_turns: int = 0  # turns truncation dropped

    def in_responses_terms(self, error: ApiError) -> ApiError:
        """The error with its param named as the Responses API names it."""
        error.param = _responses_param(error.param, self)
        return error


def plan(body: ResponsesRequest, earlier: list[dict], find_item: Callable[[str], dict | None]) -> Plan:
    """The chat request `body` means after the conversation `earlier` (previous_response_id's); raises ApiError
    naming the Responses field it cannot take."""
    if body.background:
        raise ApiError(400, "background responses are not supported: send the request and wait for its answer",
                       param="background", code="unsupported_parameter")  # fmt: skip
    new_items, extra_tools = _input_items(body, find_item)
    tools, kinds, left_out, tool_origins = _tools([*(body.tools or []), *extra_tools])
    items = [*earlier, *new_items]
    messages, origins, call_origins = _messages(body, items, len(earlier))
    made = Plan(
        body,
        None,
        items=items,
        new_items=new_items,
        kinds=kinds,
        left_out=left_out,
        origins=origins,
        call_origins=call_origins,
        tool_origins=tool_origins,
    )  # type: ignore[arg-type]
    made.chat = _chat(made, messages, tools)
    return made


def truncated(made: Plan) -> Plan | None:
    """`made` with its oldest turn dropped (truncation "auto": from the first message after the system ones to the
    next user message, so no call is left without its result), or None when nothing is left to drop."""
    messages = made.chat.messages
    first = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), None)
    if first is None:
        return None
    end = next((i for i in range(first + 1, len(messages)) if messages[i].role == "user"), None)
    if end is None:
        return None
    chat = made.chat.model_copy(update={"messages": messages[:first] + messages[end:]})
    origins = made.origins[:first] + made.origins[end:]
    calls = {(i - (end - first) if i >= end else i, j): where for (i, j), where in made.call_origins.items()
             if not first <= i < end}  # fmt: skip
    return Plan(made.body, chat, items=made.items, new_items=made.new_items, kinds=made.kinds, left_out=made.left_out,
                origins=origins, call_origins=calls, tool_origins=made.tool_origins,
                dropped_turns=made.dropped_turns + 1)  # fmt: skip


# ---- input ------------------------------------------------------------------------------------------------------
def _input_items(body: ResponsesRequest, find_item: Callable[[str], dict | None]) -> tuple[list[dict], list]:
    """This request's items as kept (references resolved, ids given where missing) and the tools its
    additional_tools items add."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input, "id": _id("msg")}], []
    items, tools = [], []
    for i, item in enumerate(body.input):
        if isinstance(item, AdditionalToolsItem):
            tools += _typed_tools(item.tools, f"input.{i}.tools")
        elif isinstance(item, ItemReference):
            found = find_item(item.id)
            if found is None:
                raise ApiError(404, f"no stored item with id '{item.id[:64]}'", param=f"input.{i}.id",
                               code="not_found")  # fmt: skip
            items.append(found)
        elif isinstance(item, UnknownItem):
            raise ApiError(400, f"input items of type {item.type[:40]!r} are not supported", param=f"input.{i}.type",
                           code="unsupported_parameter")  # fmt: skip
        else:
            kept = item.model_dump(exclude_none=True, by_alias=True)
            kept.setdefault("id", _id("item"))
            items.append(kept)
    return items, tools


def _typed_tools(raw: list[dict], param: str) -> list:
    from pydantic import TypeAdapter

    from .responses_protocol import Tool

    try:
        return TypeAdapter(list[Tool]).validate_python(raw, strict=True)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in error["loc"][:2])
        raise ApiError(422, f"invalid request: {param}.{where}: {error['msg']}", param=f"{param}.{where}",
                       code="invalid_value") from None  # fmt: skip


def _messages(body: ResponsesRequest, items: list[dict], earlier: int) -> tuple[list[dict], list[str], dict]:
    """The chat messages of `instructions` and `items` (the first `earlier` of them previous_response_id's), each
    message's Responses field, and each history call's."""
    messages, origins, calls = [], [], {}
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    for index, item in enumerate(items):
        where = "previous_response_id" if index < earlier else f"input.{_input_index(body, index - earlier)}"
        _add_item(messages, origins, calls=calls, item=item, where=where)
    return messages, origins, calls


def _chat(made: Plan, messages: list[dict], tools: list[dict]) -> ChatCompletionRequest:
    body = made.body
    chat = {
        "model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "parallel_tool_calls": body.parallel_tool_calls,
        "user": body.user, "seed": body.seed, "speculative": body.speculative, "cache_salt": body.cache_salt,
    }  # fmt: skip
    if tools:
        chat["tools"] = tools
    if body.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(body.tool_choice)
    if body.text is not None and body.text.format is not None and (fmt := _response_format(body)) is not None:
        chat["response_format"] = fmt
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = _responses_param(".".join(str(p) for p in error["loc"]), made)
        raise ApiError(422, f"invalid request: {param}: {error['msg']}", param=param, code="invalid_value") from None


def _input_index(body: ResponsesRequest, kept_index: int) -> int:
    """The position in `input` of the `kept_index`-th kept item (additional_tools items are not kept)."""
    if isinstance(body.input, str):
        return 0
    positions = [i for i, item in enumerate(body.input) if not isinstance(item, AdditionalToolsItem)]
    return positions[kept_index] if kept_index < len(positions) else kept_index


def _add_item(messages: list[dict], origins: list[str], calls: dict, item: dict, where: str) -> None:
    """One input item as chat messages (appended), each with the field it came from."""
    kind = item.get("type", "message")
    if kind == "message":
        messages.append({"role": item["role"], "content": _text(item.get("content"), f"{where}.content")})
        origins.append(where)
    elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
        _add_call(messages, origins, calls=calls, call=_history_call(item), where=where)
    elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, f"{where}.output")
        call_id = item.get("call_id") or item.get("id")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        origins.append(where)
    elif kind != "reasoning":  # a model's own reasoning: nothing verispec's models read
        raise ApiError(400, f"input items of type {str(kind)[:40]!r} are not supported", param=f"{where}.type",
                       code="unsupported_parameter")  # fmt: skip


def _history_call(item: dict) -> dict:
    """An earlier call as a chat tool call: a custom tool's input and a shell action as the function's arguments; a
    call cut by max_output_tokens (status incomplete) with its arguments closed as far as they were written (the
    model is shown the call it began, and its result may follow)."""
    kind = item["type"]
    if kind == "custom_tool_call":
        arguments = json.dumps({"input": item["input"]}, ensure_ascii=False)
    elif kind == "local_shell_call":
        action = {k: v for k, v in item["action"].items() if k != "type"}
        return {"id": item["call_id"], "type": "function",
                "function": {"name": LOCAL_SHELL, "arguments": json.dumps(action, ensure_ascii=False)}}  # fmt: skip
    else:
        arguments = item.get("arguments", "")
        if item.get("status") == "incomplete":
            arguments = json.dumps(closed_object(arguments), ensure_ascii=False)
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": arguments}}


def _add_call(messages: list[dict], origins: list[str], calls: dict, call: dict, where: str) -> None:
    """A call joins the assistant message before it (its text, or its other calls): the turn the model wrote."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        origins.append(where)
    calls[len(messages) - 1, len(messages[-1]["tool_calls"]) - 1] = where


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    parts = content or []
    for j, part in enumerate(parts):
        if "text" not in part:
            raise ApiError(400, f"content parts of type {str(part.get('type'))[:32]!r} are not supported: text is",
                           param=f"{param}.{j}.type", code="unsupported_parameter")  # fmt: skip
    return "".join(part["text"] for part in parts)


# ---- tools ------------------------------------------------------------------------------------------------------
def _tools(tools: list) -> tuple[list[dict], dict[str, str], list[str], list[str]]:
    """(chat tools, name -> kind, hosted tools left out, each chat tool's Responses field)."""
    chat, kinds, left_out, origins = [], {}, [], []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        members = [(tool, where)]
        if isinstance(tool, NamespaceTool):
            members = [(member, f"{where}.tools.{j}") for j, member in enumerate(tool.tools)]
        for member, origin in members:
            if isinstance(member, HostedTool):
                left_out.append(member.type)
                continue
            if isinstance(member, CustomTool):
                _check_format(member, origin)
            function, kind = _as_function(member)
            chat.append({"type": "function", "function": function})
            kinds[function["name"]] = kind
            origins.append(origin)
    return chat, kinds, left_out, origins


def _as_function(tool: FunctionTool | CustomTool | LocalShellTool) -> tuple[dict, str]:
    if isinstance(tool, FunctionTool):
        return tool.model_dump(exclude_none=True, exclude={"type"}), "function"
    if isinstance(tool, LocalShellTool):
        description = "Run a command on the user's machine: the command and its arguments as a list."
        return {"name": LOCAL_SHELL, "description": description, "parameters": LOCAL_SHELL_PARAMETERS}, LOCAL_SHELL
    text: dict[str, Any] = {"type": "string", "description": "the tool's input, free-form text"}
    description = tool.description or ""
    if tool.format is not None and tool.format.type == "grammar" and tool.format.definition:
        if tool.format.syntax == "regex":  # the whole input (a JSON schema's pattern is searched for anywhere)
            text["pattern"] = whole_input(tool.format.definition)
        else:
            description += f"\n\nThe input follows this Lark grammar:\n{tool.format.definition}"
    parameters = {"type": "object", "properties": {"input": text}, "required": ["input"], "additionalProperties": False}
    return {"name": tool.name, "description": description, "parameters": parameters}, "custom"


def _check_format(tool: CustomTool, where: str) -> None:
    """A regex format is a regex as its input's pattern (decoding/grammar.py: MAX_REGEX_BYTES)."""
    if tool.format is not None and tool.format.syntax == "regex" and tool.format.definition:
        try:
            check_regex(
                whole_input(tool.format.definition), "a custom tool's regex format, with its anchors ^(?:...)$,"
            )
        except GrammarError as exc:
            raise ApiError(400, str(exc), param=f"{where}.format.definition", code="invalid_value") from None


def _chat_tool_choice(choice: Any) -> str | dict:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    message = f"tool_choice {str(choice.type)[:40]!r} names a tool the server cannot run (none, auto, required, or " \
        "a function or custom tool)"  # fmt: skip
    raise ApiError(400, message, param="tool_choice", code="unsupported_parameter")


def _response_format(body: ResponsesRequest) -> dict | None:
    fmt = body.text.format
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise ApiError(400, "a json_schema format needs its schema", param="text.format.schema", code="invalid_value")
    return {"type": "json_schema",
            "json_schema": {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}  # fmt: skip


def _responses_param(param: str | None, made: Plan) -> str | None:
    """A chat request's field as the Responses request named it."""
    if param is None:
        return None
    head, _, rest = param.partition(".")
    renamed = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
               "response_format": "text.format", "messages": "input", "prompt": "input"}  # fmt: skip
    if head == "messages" and rest:
        index, _, inner = rest.partition(".")
        if index.isdigit() and int(index) < len(made.origins):
            return _message_field(made, int(index), inner)
    if head == "tools" and rest:
        index, _, inner = rest.partition(".")
        if index.isdigit() and int(index) < len(made.tool_origins):
            origin = made.tool_origins[int(index)]
            return origin + ("." + inner.removeprefix("function.") if inner and inner != "function" else "")
    return renamed.get(head, head) + (f".{rest}" if rest and head not in renamed else "")


def _message_field(made: Plan, index: int, inner: str) -> str:
    origin = made.origins[index]
    parts = inner.split(".")
    if parts[0] == "tool_calls" and len(parts) > 1 and parts[1].isdigit():
        call = made.call_origins.get((index, int(parts[1])), origin)
        return call + (".arguments" if "arguments" in parts else "")
    if parts[0] == "tool_call_id":
        return f"{origin}.call_id"
    if parts[0] == "content":
        return f"{origin}.content"
    return origin


# ---- the answer -------------------------------------------------------------------------------------------------
def output_items(job: Job, output: GenerationOutput, kinds: dict[str, str]) -> list[dict]:
    """The answer's output items: a message with its text, then each call (function_call, custom_tool_call,
    local_shell_call by the kind of the tool it names)."""
    if job.harmony:
        return _harmony_items(job, output, kinds)
    content, calls = output.text, []
    if job.tools is not None and job.tools.choice != "none":
        text = job.tokenizer.decode(output.token_ids, keep_special=True)
        found, parsed = parse_calls(job.tools, text, cut=output.finish_reason == "length")
        if parsed or found != text:
            content, calls = found or "", answer_calls(job.tools, parsed)
    items = [_message_item(_id("msg"), content, "completed")] if content or not calls else []
    status = "incomplete" if output.finish_reason == "length" else "completed"
    items += [
        _call_item(call.id, call.function.name, arguments=call.function.arguments, kinds=kinds, status=status)
        for call in calls
    ]
    return items


def _harmony_items(job: Job, output: GenerationOutput, kinds: dict[str, str]) -> list[dict]:
    """A harmony answer's items (harmony.py): its reasoning, messages and calls in the order written, the items a
    stream of it tells (the same emitter, its events left unsent)."""
    stream, emitter = HarmonyStream(job.tokenizer, job.tools), _Emitter(kinds)
    for token in output.token_ids:
        emitter.news(*stream.feed(token))
    emitter.news(*stream.finish(cut=output.finish_reason == "length"))
    emitter.close("incomplete" if output.finish_reason == "length" else "completed")
    return emitter.items


def _reasoning_item(item_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(item_id: str, text: str, status: str) -> dict:
    parts = [{"type": "output_text", "text": text, "annotations": []}] if text is not None else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def _call_item(call_id: str, name: str, arguments: str, kinds: dict[str, str], status: str) -> dict:
    """A call's output item; a cut call's (status incomplete) custom input or shell action read from its arguments
    as far as they were written."""
    kind = kinds.get(name, "function")
    if kind == "custom":
        value = closed_object(arguments) if status == "incomplete" else _arguments(arguments)
        text = value.get("input") if isinstance(value, dict) and isinstance(value.get("input"), str) else None
        text = text if text is not None else "" if status == "incomplete" else arguments
        return {"type": "custom_tool_call", "id": _id("ctc"), "call_id": call_id, "name": name, "input": text,
                "status": status}  # fmt: skip
    if kind == LOCAL_SHELL:
        value = closed_object(arguments) if status == "incomplete" else _arguments(arguments)
        action = {"type": "exec", "command": [], **(value if isinstance(value, dict) else {})}
        return {"type": "local_shell_call", "id": _id("lsc"), "call_id": call_id, "action": action, "status": status}
    return {"type": "function_call", "id": _id("fc"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}  # fmt: skip


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(made: Plan, job: Job, output: GenerationOutput | None, items: list[dict], status: str) -> dict:
    """A Response object (OpenAI's shape) in `status` (in_progress, completed, incomplete)."""
    body = made.body
    text = body.text.model_dump(exclude_none=True, by_alias=True) if body.text is not None else {}
    text.setdefault("format", {"type": "text"})
    response = {
        "id": job.id, "object": "response", "created_at": int(time.time()), "status": status, "model": job.model,
        "output": items, "error": None, "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": body.previous_response_id,
        "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": body.top_p, "tool_choice": _echo(body.tool_choice) or "auto",
        "tools": [tool.model_dump(exclude_none=True, by_alias=True) for tool in body.tools or []],
        "text": text, "truncation": body.truncation, "user": body.user, "usage": None,
        "reasoning": body.reasoning.model_dump(exclude_none=True) if body.reasoning else {"effort": None},
    }  # fmt: skip
    if output is not None:
        used = usage([output])
        response["usage"] = {
            "input_tokens": used.prompt_tokens, "input_tokens_details": {"cached_tokens": output.stats.cached_tokens},
            "output_tokens": used.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": _reasoning_tokens(job, output)},
            "total_tokens": used.total_tokens,
        }  # fmt: skip
        if output.finish_reason == "length":
            response["status"], response["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    return response


def _reasoning_tokens(job: Job, output: GenerationOutput) -> int:
    """The answer's tokens of reasoning (a harmony answer's analysis bodies), 0 for others."""
    return read_answer(job.tokenizer, output.token_ids).reader.reasoning_tokens if job.harmony else 0


def _echo(choice: Any) -> Any:
    return choice.model_dump(exclude_none=True) if hasattr(choice, "model_dump") else choice


def response_body(made: Plan, job: Job, output: GenerationOutput) -> dict:
    return response_object(made, job, output=output, items=output_items(job, output, made.kinds), status="completed")


async def response_events(
    made: Plan, job: Job, done: Callable[[dict], None] = lambda response: None
) -> AsyncIterator[tuple[str, dict]]:
    """The Responses stream: (event type, data) from response.created to response.completed (or .incomplete), with
    each output item added, its text or arguments in deltas, and done; `done(response)` is told the final one."""
    emitter = _Emitter(made.kinds)
    yield emitter.event(
        "response.created", response=response_object(made, job, output=None, items=[], status="in_progress")
    )
    in_progress = response_object(made, job, output=None, items=[], status="in_progress")
    yield emitter.event("response.in_progress", response=in_progress)
    calling = job.tools is not None and job.tools.choice != "none"
    stream = ToolStream(job.tools, job.tokenizer) if calling else None
    if job.harmony:
        stream = HarmonyStream(job.tokenizer, job.tools)
    async for _, event in job.sink.events(keep_alive=True):
        if event is KEEP_ALIVE:  # an event, not a comment: Codex CLI's idle timer counts events alone
            yield emitter.event("response.in_progress", response=in_progress)
            continue
        if isinstance(event, ErrorEvent):
            error = event_error(event, job)
            yield "error", {"type": "error", "code": error.code, "message": error.message, "param": error.param}
            return
        if isinstance(event, FinishEvent):
            cut = event.output.finish_reason == "length"
            if stream is not None:
                for item in emitter.news(*stream.finish(cut=cut)):
                    yield item
            for item in emitter.close("incomplete" if cut else "completed"):
                yield item
            final = response_object(made, job, output=event.output, items=emitter.items, status="completed")
            await asyncio.to_thread(done, final)  # the store writes off the event loop
            yield emitter.event(f"response.{final['status']}", response=final)
            return
        if stream is not None:
            if event.token_id is not None:
                for item in emitter.news(*stream.feed(event.token_id)):
                    yield item
        elif event.text:
            for item in emitter.news(event.text, []):
                yield item


class _Emitter:
    """The output items of a streamed response as they grow, and the events that tell them. Function calls stream
    their arguments; a custom tool's or shell call (whose fields are read out of the arguments) is told whole when
    the answer ends."""

    def __init__(self, kinds: dict[str, str]):
        self.kinds = kinds
        self.items: list[dict] = []
        self.sequence = 0
        self.message: dict | None = None  # the message item being written
        self.reasoning: dict | None = None  # the reasoning item being written (a harmony answer's)
        self.calls: dict[int, dict] = {}  # call index -> its function_call item
        self.held: dict[int, list] = {}  # call index -> [call id, name, arguments] of a custom or shell call

    def event(self, kind: str, **data) -> tuple[str, dict]:
        self.sequence += 1
        return kind, {"type": kind, "sequence_number": self.sequence, **data}

    def news(self, *news) -> list[tuple[str, dict]]:
        """The events of a stream's news: (content, call pieces), or a harmony stream's (reasoning, content, pieces)."""
        *reasoning, content, pieces = news
        out = self._reasoning(reasoning[0]) if reasoning and reasoning[0] else []
        out += self._content(content) if content else []
        for piece in pieces:
            if piece.index in self.held:
                self.held[piece.index][2] += piece.function.arguments
                continue
            if piece.index not in self.calls:
                out += self._close_reasoning() + self._close_message()
                if self.kinds.get(piece.function.name, "function") != "function":
                    item = _call_item(
                        piece.id, piece.function.name, arguments="", kinds=self.kinds, status="in_progress"
                    )
                    self.held[piece.index] = [item, piece.function.name, piece.function.arguments]
                    out.append(self._added(item))  # its place among the items; its fields when it is complete
                    continue
                item = _call_item(piece.id, piece.function.name, arguments="", kinds=self.kinds, status="in_progress")
                self.calls[piece.index] = item
                out.append(self._added(item))
            item = self.calls[piece.index]
            if piece.function.arguments:
                item["arguments"] += piece.function.arguments
                out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self._index(item), delta=piece.function.arguments))  # fmt: skip
        return out

    def _reasoning(self, text: str) -> list[tuple[str, dict]]:
        """Reasoning text: into the reasoning item being written (a new one after other items)."""
        out = []
        if self.reasoning is None or self.items[-1] is not self.reasoning:
            out += self._close_reasoning() + self._close_message()
            self.reasoning = _reasoning_item(_id("rs"), "")
            out.append(self._added(self.reasoning))
        self.reasoning["content"][0]["text"] += text
        out.append(self.event("response.reasoning_text.delta", item_id=self.reasoning["id"],
                              output_index=self._index(self.reasoning), content_index=0, delta=text))  # fmt: skip
        return out

    def _close_reasoning(self) -> list[tuple[str, dict]]:
        item, self.reasoning = self.reasoning, None
        if item is None:
            return []
        index = self._index(item)
        return [
            self.event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=item["content"][0]["text"]),
            self.event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def _content(self, content: str) -> list[tuple[str, dict]]:
        out = self._close_reasoning()
        if self.message is None or self.message["status"] == "completed":  # text after a call: a message of its own
            self.message = _message_item(_id("msg"), "", "in_progress")
            out.append(self._added(self.message))
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self.event("response.content_part.added", item_id=self.message["id"],
                                  output_index=self._index(self.message), content_index=0, part=part))  # fmt: skip
        self.message["content"][0]["text"] += content
        out.append(self.event("response.output_text.delta", item_id=self.message["id"],
                              output_index=self._index(self.message), content_index=0, delta=content))  # fmt: skip
        return out

    def close(self, status: str) -> list[tuple[str, dict]]:
        out = self._close_reasoning() + self._close_message()
        for item in self.calls.values():
            if item["status"] == "in_progress":
                item["status"] = status
                out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=self._index(item), arguments=item["arguments"]))  # fmt: skip
                out.append(self.event("response.output_item.done", output_index=self._index(item), item=item))
        for item, name, arguments in self.held.values():
            made = _call_item(item["call_id"], name, arguments=arguments, kinds=self.kinds, status=status)
            item.update({k: v for k, v in made.items() if k != "id"})
            if item["type"] == "custom_tool_call":
                out.append(self.event("response.custom_tool_call_input.done", item_id=item["id"],
                                      output_index=self._index(item), input=item["input"]))  # fmt: skip
            out.append(self.event("response.output_item.done", output_index=self._index(item), item=item))
        return out

    def _added(self, item: dict) -> tuple[str, dict]:
        self.items.append(item)
        return self.event(
            "response.output_item.added", output_index=self._index(item), item=json.loads(json.dumps(item))
        )

    def _close_message(self) -> list[tuple[str, dict]]:
        message = self.message
        if message is None or message["status"] == "completed":
            return []
        message["status"] = "completed"
        index, text = self._index(message), message["content"][0]["text"]
        return [
            self.event("response.output_text.done", item_id=message["id"], output_index=index, content_index=0,
                       text=text),
            self.event("response.content_part.done", item_id=message["id"], output_index=index, content_index=0,
                       part=message["content"][0]),
            self.event("response.output_item.done", output_index=index, item=message),
        ]  # fmt: skip

    def _index(self, item: dict) -> int:
        return next(i for i, candidate in enumerate(self.items) if candidate is item)
