"""How the agent clients read a chat completion's tool calls, each with its own code where it is installed: a stream
of chunks (as `data:` lines carry them) and a whole answer, read into (name, arguments) per call.

LlamaIndex cannot be installed beside openai 3.3 (llama-index-llms-openai 0.8.3 pins openai<3, and would downgrade
it), so its reading is written here as its code reads: `update_tool_calls` in llama-index-llms-openai
(llama_index/llms/openai/utils.py, run-llama/llama_index), which `OpenAI.stream_chat` / `astream_chat` apply to
each chunk's `delta.tool_calls`, takes the chunk's FIRST entry only: an entry whose index differs from the last
call's starts a new call, one of the same index adds its name, id and arguments to it. FunctionAgent (streaming
by default) then parses each call's arguments as the tool's keyword arguments."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

Calls = list[tuple[str, str]]  # (name, arguments as JSON text) per call


def llamaindex(chunks: list[dict]) -> Calls:
    calls: list[dict] = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            entries = choice["delta"].get("tool_calls")
            if not entries:
                continue
            entry, function = entries[0], entries[0].get("function") or {}  # the first entry, and no other
            if not calls or calls[-1]["index"] != entry["index"]:
                calls.append({"index": entry["index"], "name": function.get("name") or "",
                              "arguments": function.get("arguments") or ""})  # fmt: skip
            else:
                calls[-1]["name"] += function.get("name") or ""
                calls[-1]["arguments"] += function.get("arguments") or ""
    return [(call["name"], call["arguments"]) for call in calls]


def openai_client(chunks: list[dict]) -> Calls:
    """The openai package's own accumulator (what `client.chat.completions.stream` builds its answer with)."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    message = state.get_final_completion().choices[0].message
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or []]


def langchain(chunks: list[dict]) -> Calls:
    """langchain-openai's conversion of each delta (ChatOpenAI streaming), the message chunks added up."""
    from langchain_core.messages import AIMessageChunk
    from langchain_openai.chat_models.base import _convert_delta_to_message_chunk

    message = AIMessageChunk(content="")
    for chunk in chunks:
        for choice in chunk["choices"]:
            message += _convert_delta_to_message_chunk(choice["delta"], AIMessageChunk)
    return _langchain_calls(message)


def _langchain_calls(message) -> Calls:
    invalid = [("invalid", str(call)) for call in message.invalid_tool_calls]
    return [(call["name"], json.dumps(call["args"])) for call in message.tool_calls] + invalid


class _Chunks:
    """An async stream of the chunks, as the openai package's AsyncStream gives them."""

    def __init__(self, chunks: list[dict]):
        from openai.types.chat import ChatCompletionChunk

        self.chunks = [ChatCompletionChunk.model_validate(chunk) for chunk in chunks]

    async def _each(self):
        for chunk in self.chunks:
            yield chunk

    def __aiter__(self):
        return self._each()

    async def close(self) -> None:
        pass


def openai_agents(chunks: list[dict]) -> Calls:
    """openai-agents' chat completions stream handler (OpenAIChatCompletionsModel, streamed)."""
    from agents.models.chatcmpl_stream_handler import ChatCmplStreamHandler
    from openai.types.responses import Response

    async def read() -> Calls:
        response = Response(
            id="resp", created_at=time.time(), model="m", object="response", output=[], tool_choice="auto",
            top_p=None, temperature=None, tools=[], parallel_tool_calls=True,
        )  # fmt: skip
        final = None
        async for event in ChatCmplStreamHandler.handle_stream(response, _Chunks(chunks)):
            final = event.response if event.type == "response.completed" else final
        return [(item.name, item.arguments) for item in final.output if item.type == "function_call"]

    return asyncio.run(read())


def _pydantic_ai_model():
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("m", provider=OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="unused"))


def _pydantic_ai_calls(response) -> Calls:
    from pydantic_ai.messages import ToolCallPart

    parts = [part for part in response.parts if isinstance(part, ToolCallPart)]
    return [(part.tool_name, part.args if isinstance(part.args, str) else json.dumps(part.args)) for part in parts]


def pydantic_ai(chunks: list[dict]) -> Calls:
    """pydantic-ai's OpenAIChatModel stream (Agent.run_stream)."""
    from pydantic_ai.models import ModelRequestParameters

    async def read() -> Calls:
        streamed = await _pydantic_ai_model()._process_streamed_response(_Chunks(chunks), ModelRequestParameters())
        async for _ in streamed:
            pass
        return _pydantic_ai_calls(streamed.get())

    return asyncio.run(read())


STREAMED: dict[str, Callable[[list[dict]], Calls]] = {
    "llamaindex": llamaindex, "openai": openai_client, "langchain": langchain, "openai-agents": openai_agents,
    "pydantic-ai": pydantic_ai,
}  # fmt: skip


# ---- whole answers -------------------------------------------------------------------------------------------------
def _message(body: dict):
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(body).choices[0].message


def whole_openai(body: dict) -> Calls:
    return [(call.function.name, call.function.arguments) for call in _message(body).tool_calls or []]


def whole_langchain(body: dict) -> Calls:
    from langchain_openai.chat_models.base import _convert_dict_to_message

    return _langchain_calls(_convert_dict_to_message(body["choices"][0]["message"]))


def whole_openai_agents(body: dict) -> Calls:
    from agents.models.chatcmpl_converter import Converter

    items = Converter.message_to_output_items(_message(body))
    return [(item.name, item.arguments) for item in items if item.type == "function_call"]


def whole_pydantic_ai(body: dict) -> Calls:
    from openai.types.chat import ChatCompletion

    return _pydantic_ai_calls(_pydantic_ai_model()._process_response(ChatCompletion.model_validate(body)))


WHOLE: dict[str, Callable[[dict], Calls]] = {
    "openai": whole_openai, "langchain": whole_langchain, "openai-agents": whole_openai_agents,
    "pydantic-ai": whole_pydantic_ai,
}  # fmt: skip
