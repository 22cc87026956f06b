"""The Responses API's request body (`POST /v1/responses`) as pydantic models: every field typed, so that a wrong JSON
type anywhere is a 4xx naming the field (`input.3.content.0.text`), never a handler's AttributeError.

What it holds, as OpenAI documents it and as clients send it (tests/fixtures/clients/: Codex CLI, openai-agents,
pydantic-ai, LangChain): `input` as text or items (messages, function and custom tool calls and their outputs,
local shell calls, reasoning items, item references, Codex's `additional_tools`), `instructions`, `tools` (function,
namespace, custom, local_shell, and hosted tools the server cannot run), `tool_choice`, `text` (its format and
verbosity), `store`, `previous_response_id`, `truncation`, `reasoning`, `include`, and fields accepted without effect
(`prompt_cache_key`, `service_tier`, `client_metadata`, ...: unknown fields are ignored, as in the other routes).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from .protocol import FUNCTION_NAME, MAX_TOOLS, FunctionDefinition, _Strict

MAX_METADATA_PAIRS = 16  # OpenAI's limits on `metadata`
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
MAX_LARK_DEFINITION = 64 * 1024  # a custom tool's Lark grammar: shown to the model in the tool's description


# ---- input items ------------------------------------------------------------------------------------------------
class TextContent(_Strict):
    type: Literal["input_text", "output_text", "text", "summary_text", "reasoning_text"]
    text: str


class OtherContent(_Strict):
    """A part that is not text (an image, a file, audio, a refusal): refused where it is used, naming it."""

    type: str


ContentPart = TextContent | OtherContent  # a text part where its type says so (strict: the first that fits)
Content = str | list[ContentPart]


class _Item(_Strict):
    id: str | None = None
    status: str | None = None


class _CallItem(_Item):
    call_id: str = Field(min_length=1)


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content


class FunctionCallItem(_CallItem):
    type: Literal["function_call"]
    name: str
    arguments: str


class FunctionCallOutputItem(_CallItem):
    type: Literal["function_call_output"]
    output: Content


class CustomToolCallItem(_CallItem):
    type: Literal["custom_tool_call"]
    name: str
    input: str


class CustomToolCallOutputItem(_CallItem):
    type: Literal["custom_tool_call_output"]
    output: Content


class ShellAction(_Strict):
    type: Literal["exec"] = "exec"
    command: list[str]
    timeout_ms: int | None = None
    working_directory: str | None = None
    env: dict[str, str] | None = None
    user: str | None = None


class LocalShellCallItem(_CallItem):
    type: Literal["local_shell_call"]
    action: ShellAction


class LocalShellCallOutputItem(_Item):
    type: Literal["local_shell_call_output"]
    output: str
    call_id: str | None = None


class ReasoningItem(_Strict):
    """A reasoning item a client sends back (Codex does): verispec's models do not read it."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ContentPart] | None = None
    content: list[ContentPart] | None = None
    encrypted_content: str | None = None


class ItemReference(_Strict):
    """An earlier item by its id, found in the stored responses of the same scope."""

    type: Literal["item_reference"]
    id: str


class AdditionalToolsItem(_Strict):
    """Codex's way of adding tools from inside `input` (an item of role developer holding tools)."""

    type: Literal["additional_tools"]
    tools: list[dict[str, Any]] = Field(max_length=MAX_TOOLS)
    role: str | None = None
    id: str | None = None


class UnknownItem(_Strict):
    """An item of a type verispec does not take (hosted tools' calls, images, ...): refused, naming it."""

    type: str


_ITEMS = {
    "message": MessageItem, "function_call": FunctionCallItem, "function_call_output": FunctionCallOutputItem,
    "custom_tool_call": CustomToolCallItem, "custom_tool_call_output": CustomToolCallOutputItem,
    "local_shell_call": LocalShellCallItem, "local_shell_call_output": LocalShellCallOutputItem,
    "reasoning": ReasoningItem, "item_reference": ItemReference, "additional_tools": AdditionalToolsItem,
}  # fmt: skip


def _item_kind(value: Any) -> str:
    if not isinstance(value, dict):
        return "message"  # the message model says what is wrong with it
    kind = value.get("type", "message" if "role" in value else None)
    return kind if isinstance(kind, str) and kind in _ITEMS else "unknown"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[LocalShellCallItem, Tag("local_shell_call")]
    | Annotated[LocalShellCallOutputItem, Tag("local_shell_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")]
    | Annotated[AdditionalToolsItem, Tag("additional_tools")]
    | Annotated[UnknownItem, Tag("unknown")],
    Discriminator(_item_kind),
]


# ---- tools -----------------------------------------------------------------------------------------------------
class FunctionTool(FunctionDefinition):
    type: Literal["function"]


class CustomFormat(_Strict):
    """A custom tool's input: free text, or text a grammar (Lark) or a regular expression accepts."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None

    @field_validator("definition")
    @classmethod
    def _bounded(cls, value: str | None) -> str | None:
        """A regex format is bounded as a regex where the tool is read (responses_api.py: naming the tool's field)."""
        if value is not None and len(value) > MAX_LARK_DEFINITION:
            raise ValueError(f"a custom tool's grammar holds at most {MAX_LARK_DEFINITION:,} characters")
        return value


def whole_input(regex: str) -> str:
    """A custom tool's regex as the pattern of its input (a JSON schema's pattern is searched for anywhere)."""
    return f"^(?:{regex})$"


class CustomTool(_Strict):
    type: Literal["custom"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    format: CustomFormat | None = None


class LocalShellTool(_Strict):
    type: Literal["local_shell"]


class NamespaceTool(_Strict):
    """Tools grouped under a name (Codex's sub-agent tools): its function and custom tools are offered as they are,
    under their own names, which is what a client sends back."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]] = Field(max_length=MAX_TOOLS)


HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "code_interpreter",
    "image_generation", "computer_use", "computer_use_preview", "mcp", "tool_search",
})  # fmt: skip  # tools OpenAI runs in its cloud: the server cannot, and leaves them out of what the model sees


class HostedTool(_Strict):
    type: str

    @field_validator("type")
    @classmethod
    def _hosted(cls, value: str) -> str:
        if value not in HOSTED_TOOLS:
            raise ValueError(f"tools of type {value[:40]!r} are not known (function, custom, namespace, local_shell, "
                             "or a hosted tool, which is left out)")  # fmt: skip
        return value


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) and kind in ("function", "custom", "local_shell", "namespace") else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[LocalShellTool, Tag("local_shell")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind),
]


class NamedToolChoice(_Strict):
    type: Literal["function", "custom"]
    name: str


class HostedToolChoice(_Strict):
    """A tool_choice naming a hosted tool (or `allowed_tools`, `mcp`): refused where the server cannot honour it."""

    type: str


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | HostedToolChoice


# ---- text and the rest ----------------------------------------------------------------------------------------------
class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


MAX_REASONING_FIELD = 256  # `reasoning`'s words ("low", "auto", Codex's "all_turns"): echoed and stored, never read


class ReasoningConfig(_Strict):
    """Accepted, without effect: verispec's models do not reason in a separate channel."""

    effort: str | None = Field(default=None, max_length=MAX_REASONING_FIELD)
    summary: str | None = Field(default=None, max_length=MAX_REASONING_FIELD)
    generate_summary: str | None = Field(default=None, max_length=MAX_REASONING_FIELD)
    context: str | None = Field(default=None, max_length=MAX_REASONING_FIELD)


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True  # OpenAI's default: the response is kept (responses_store.py)
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    truncation: Literal["auto", "disabled"] = "disabled"
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = Field(default=None, max_length=32)
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, Annotated[str, Field(max_length=MAX_METADATA_VALUE)]] | None = None
    background: bool = False
    seed: int | None = None  # extension, as in chat completions
    speculative: bool = True  # extension, as in chat completions
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # extension (vLLM's)

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (len(value) > MAX_METADATA_PAIRS or any(len(k) > MAX_METADATA_KEY for k in value)):
            raise ValueError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs, keys of at most {MAX_METADATA_KEY}")
        return value
