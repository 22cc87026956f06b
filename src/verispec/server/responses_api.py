"""OpenAI's Responses API (`POST /v1/responses`), stateless: a request is turned into the chat request it means
(instructions, input items, function tools, text format) and runs through the same engine and tool calling as
/v1/chat/completions; its answer is a Response object, or its stream of typed events.

What it takes: `input` as text or items (messages with text content, `function_call` and `function_call_output`
items; `reasoning` items are skipped), `instructions`, function `tools` (flat, as the Responses API writes them),
`tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`, `text.format` (text, json_object,
json_schema), `stream`, and `user`, `metadata`, `store` (accepted; verispec keeps no responses). What it refuses:
`previous_response_id` (send the whole conversation as input), tools other than functions, non-text input.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine.requests import ErrorEvent, FinishEvent, GenerationOutput
from .protocol import ApiError, ChatCompletionRequest, _Strict
from .responses import Job, event_error, usage
from .tools import ToolStream, answer_calls, parse_calls


class ResponsesRequest(_Strict):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None  # accepted: verispec keeps no responses whatever it says
    previous_response_id: str | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, Any] | None = None
    seed: int | None = None  # extension, as in chat completions
    speculative: bool = True  # extension, as in chat completions


class ResponseObject(BaseModel):
    """A Response as `response_object` builds it (the published schema's view: its main fields)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request a Responses request means; raises ApiError naming the field it cannot take."""
    if body.previous_response_id is not None:
        message = "verispec keeps no responses: send the whole conversation as input (previous_response_id)"
        raise ApiError(400, message, param="previous_response_id", code="unsupported_parameter")
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += _messages(body.input)
    chat = {
        "model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "parallel_tool_calls": body.parallel_tool_calls,
        "user": body.user, "seed": body.seed, "speculative": body.speculative,
    }  # fmt: skip
    if body.tools:
        chat["tools"] = [_chat_tool(tool, i) for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(body.tool_choice)
    if body.text and (response_format := _response_format(body.text)) is not None:
        chat["response_format"] = response_format
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ApiError(400, f"invalid request: {where}: {error['msg']}", param="input", code="invalid_value") from None


def _messages(items: str | list[dict[str, Any]]) -> list[dict]:
    """Chat messages from `input`: a text is one user message; items in order, a function call joining the
    assistant message before it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"a message's role cannot be {str(role)[:32]!r}", param=f"input.{i}.role",
                               code="invalid_value")  # fmt: skip
            messages.append({"role": role, "content": _text(item.get("content"), f"input.{i}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"input.{i}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind != "reasoning":  # a model's own reasoning items: nothing verispec's models read
            raise ApiError(400, f"input items of type {str(kind)[:32]!r} are not supported", param=f"input.{i}",
                           code="unsupported_parameter")  # fmt: skip
    return messages


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        kinds = {p.get("type") for p in content}
        if kinds <= {"input_text", "output_text", "text"}:
            return "".join(str(p.get("text", "")) for p in content)
    raise ApiError(400, "content must be text (input_text or output_text parts)", param=param,
                   code="unsupported_parameter")  # fmt: skip


def _chat_tool(tool: dict[str, Any], index: int) -> dict:
    if tool.get("type") != "function":
        message = f"tools of type {str(tool.get('type'))[:32]!r} are not supported: function tools are"
        raise ApiError(400, message, param=f"tools.{index}.type", code="unsupported_parameter")
    fields = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fields}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ApiError(400, "tool_choice must be none, auto, required or a function", param="tool_choice",
                   code="invalid_value")  # fmt: skip


def _response_format(text: dict[str, Any]) -> dict | None:
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {
                "name": fmt.get("name", "response"),
                "schema": fmt.get("schema"),
                "strict": fmt.get("strict"),
            },
        }
    raise ApiError(400, f"text.format type {str(kind)[:32]!r} is not supported", param="text.format",
                   code="invalid_value")  # fmt: skip


# ---- the answer -------------------------------------------------------------------------------------------------
def _items(job: Job, output: GenerationOutput) -> list[dict]:
    """The answer's output items: a message with its text, then each function call."""
    content, calls = output.text, []
    if job.tools is not None and job.tools.choice != "none":
        found, parsed = parse_calls(job.tools.format, job.tokenizer.decode(output.token_ids, keep_special=True))
        if parsed:
            content, calls = found or "", answer_calls(job.tools, parsed)
    items = [_message_item(_id("msg"), content, "completed")] if content or not calls else []
    items += [
        _call_item(_id("fc"), call.id, call.function.name, call.function.arguments, "completed") for call in calls
    ]
    return items


def _message_item(item_id: str, text: str, status: str) -> dict:
    parts = [{"type": "output_text", "text": text, "annotations": []}] if text is not None else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(
    body: ResponsesRequest, job: Job, output: GenerationOutput | None, items: list[dict], status: str
) -> dict:
    """A Response object (OpenAI's shape) in `status` (in_progress, completed, incomplete)."""
    response = {
        "id": job.id, "object": "response", "created_at": int(time.time()), "status": status, "model": job.model,
        "output": items, "error": None, "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": None, "store": False,
        "temperature": 1.0 if body.temperature is None else body.temperature, "top_p": body.top_p,
        "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
        "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled", "user": body.user,
        "usage": None,
    }  # fmt: skip
    if output is not None:
        used = usage([output])
        response["usage"] = {
            "input_tokens": used.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": used.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": used.total_tokens,
        }  # fmt: skip
        if output.finish_reason == "length":
            response["status"], response["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    return response


def response_body(body: ResponsesRequest, job: Job, output: GenerationOutput) -> dict:
    return response_object(body, job, output, _items(job, output), "completed")


async def response_events(body: ResponsesRequest, job: Job) -> AsyncIterator[tuple[str, dict]]:
    """The Responses stream: (event type, data) from response.created to response.completed (or .incomplete), with
    each output item added, its text or arguments in deltas, and done."""
    emitter = _Emitter(body, job)
    yield emitter.event("response.created", response=response_object(body, job, None, [], "in_progress"))
    yield emitter.event("response.in_progress", response=response_object(body, job, None, [], "in_progress"))
    calling = job.tools is not None and job.tools.choice != "none"
    stream = ToolStream(job.tools, job.tokenizer) if calling else None
    async for _, event in job.sink.events():
        if isinstance(event, ErrorEvent):
            error = event_error(event, job)
            yield "error", {"type": "error", "code": error.code, "message": error.message, "param": error.param}
            return
        if isinstance(event, FinishEvent):
            if stream is not None:
                for item in emitter.news(*stream.finish()):
                    yield item
            for item in emitter.close():
                yield item
            done = response_object(body, job, event.output, emitter.items, "completed")
            yield emitter.event(f"response.{done['status']}", response=done)
            return
        if stream is not None:
            if event.token_id is not None:
                for item in emitter.news(*stream.feed(event.token_id)):
                    yield item
        elif event.text:
            for item in emitter.news(event.text, []):
                yield item


class _Emitter:
    """The output items of a streamed response as they grow, and the events that tell them."""

    def __init__(self, body: ResponsesRequest, job: Job):
        self.items: list[dict] = []
        self.sequence = 0
        self.message: dict | None = None  # the message item being written
        self.calls: dict[int, dict] = {}  # call index -> its item

    def event(self, kind: str, **data) -> tuple[str, dict]:
        self.sequence += 1
        return kind, {"type": kind, "sequence_number": self.sequence, **data}

    def news(self, content: str, pieces: list) -> list[tuple[str, dict]]:
        out = []
        if content:
            if self.message is None:
                self.message = _message_item(_id("msg"), "", "in_progress")
                out.append(self._added(self.message))
                part = {"type": "output_text", "text": "", "annotations": []}
                out.append(self.event("response.content_part.added", item_id=self.message["id"],
                                      output_index=self._index(self.message), content_index=0, part=part))  # fmt: skip
            self.message["content"][0]["text"] += content
            out.append(self.event("response.output_text.delta", item_id=self.message["id"],
                                  output_index=self._index(self.message), content_index=0, delta=content))  # fmt: skip
        for piece in pieces:
            if piece.index not in self.calls:
                out += self._close_message()
                item = _call_item(_id("fc"), piece.id, piece.function.name, "", "in_progress")
                self.calls[piece.index] = item
                out.append(self._added(item))
            item = self.calls[piece.index]
            if piece.function.arguments:
                item["arguments"] += piece.function.arguments
                out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self._index(item), delta=piece.function.arguments))  # fmt: skip
        return out

    def close(self) -> list[tuple[str, dict]]:
        out = self._close_message()
        for item in self.calls.values():
            if item["status"] != "completed":
                item["status"] = "completed"
                out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=self._index(item), arguments=item["arguments"]))  # fmt: skip
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
