"""Request and response bodies in OpenAI's shapes (pydantic), plus the OpenAI-style error.

Requests are validated strictly (JSON types as OpenAI documents them: no "5" for 5; null means the
default, as in OpenAI's API); unknown fields are ignored, but known features verispec does not implement
(tools, response formats, ...) are refused with a 400 rather than silently dropped.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from ..decoding.grammar import check_schema
from ..decoding.logprobs import MAX_TOP_LOGPROBS
from ..decoding.sampling import BIAS_RANGE, PENALTY_RANGE
from ..decoding.stats import GenerationStats
from ..decoding.stopping import MAX_STOP_LENGTH, MAX_STOP_STRINGS
from ..json_text import parse_json


class ApiError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error's body (OpenAI's shape); a stream that fails sends it as its last event."""

    error: ErrorDetail


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)  # NaN: "finite number", not "<= 2"

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


_GUIDED = {"json_schema": "json", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def _text(value: Any) -> str:
    """A constraint's value as GrammarSpec takes it: text as it is, a schema or a list of choices as JSON."""
    return "" if value is True else value if isinstance(value, str) else json.dumps(value)


TOKEN_ID_KEY = re.compile(r"^[0-9]{1,18}$")  # a logit_bias key


def schema_text(value: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
    """A JSON schema sent as an object or as its JSON text: the text must hold an object (a 4xx naming the field
    otherwise, never the grammar library's or a handler's error)."""
    if isinstance(value, str) and not isinstance(parse_json(value, "the schema's text"), dict):
        raise ValueError("a JSON schema must be an object (or its JSON text)")
    return value


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)

    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None  # verispec always keeps the output within the schema
    description: str | None = None


class ResponseFormat(_Strict):
    """OpenAI's response_format: text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(default=None, validate_default=True)

    @field_validator("json_schema")
    @classmethod
    def _schema_for_its_type(cls, value: JsonSchemaFormat | None, info: ValidationInfo) -> JsonSchemaFormat | None:
        if value is None and info.data.get("type") == "json_schema":
            raise ValueError("type json_schema needs a json_schema object with its schema")
        return value


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` extension: exactly one constraint."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")  # a JSON schema (object or its text)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark, or GBNF as llama.cpp and xgrammar write it
    json_object: bool | None = None

    _schema_text = field_validator("json_")(schema_text)

    @model_validator(mode="after")
    def _names_a_constraint(self) -> StructuredOutputs:
        if all(value is None for value in (self.json_, self.regex, self.choice, self.grammar)) and not self.json_object:
            raise ValueError("structured_outputs names no constraint (json, regex, choice, grammar or json_object)")
        return self


class _GenerationRequest(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)  # None: OpenAI's default, 1
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)  # extension (vLLM's); 0 or -1: off
    seed: int | None = None
    # at most MAX_STOP_STRINGS of at most MAX_STOP_LENGTH characters: 400 beyond (decoding/stopping.py check_stop)
    stop: str | list[str] | None = Field(
        default=None, json_schema_extra={"maxItems": MAX_STOP_STRINGS, "maxLength": MAX_STOP_LENGTH}
    )
    n: int = Field(default=1, ge=1)  # choices; at most the server's slots + queue places (checked there)
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: bool = True  # extension: false decodes this request without drafting
    ignore_eos: bool = False  # extension (vLLM's): end tokens are ordinary tokens; generate max_tokens
    presence_penalty: float = Field(default=0.0, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    frequency_penalty: float = Field(default=0.0, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    # token id (as a JSON key: a string of digits) -> added logit
    logit_bias: dict[str, Annotated[float, Field(ge=BIAS_RANGE[0], le=BIAS_RANGE[1])]] | None = Field(
        default=None, json_schema_extra={"propertyNames": {"pattern": TOKEN_ID_KEY.pattern}}
    )
    user: str | None = Field(default=None, max_length=256)
    # vLLM's: only requests with the same salt share earlier outputs and prefilled prompts (server/partitions.py)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    # structured output: OpenAI's response_format, vLLM's structured_outputs, and vLLM's older guided_* names
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # tool calling is a chat feature (ChatCompletionRequest); a completion asking for it is refused, not ignored
    tools: Any = None
    functions: Any = None
    tool_choice: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a requested feature verispec lacks."""
        for name in ("tools", "functions", "tool_choice", "function_call", "parallel_tool_calls"):
            if getattr(self, name) not in (None, []):
                return name, "tool and function calling are for /v1/chat/completions"
        return None

    def constraints(self) -> list[tuple[str, str, str]]:
        """Every structured-output constraint asked for, as (param, grammar kind, value)."""
        found = []
        if self.response_format is not None and self.response_format.type == "json_object":
            found.append(("response_format", "json_object", ""))
        if self.response_format is not None and self.response_format.json_schema is not None:
            found.append(("response_format", "json_schema", json.dumps(self.response_format.json_schema.schema_)))
        if (outputs := self.structured_outputs) is not None:
            asked = {"json_schema": outputs.json_, "regex": outputs.regex, "choice": outputs.choice,
                     "grammar": outputs.grammar, "json_object": outputs.json_object or None}  # fmt: skip
            found += [("structured_outputs", kind, _text(value)) for kind, value in asked.items() if value is not None]
        guided = {"json_schema": self.guided_json, "regex": self.guided_regex, "choice": self.guided_choice,
                  "grammar": self.guided_grammar}  # fmt: skip
        found += [
            (f"guided_{_GUIDED[kind]}", kind, _text(value)) for kind, value in guided.items() if value is not None
        ]
        return found

    _schema_text = field_validator("guided_json")(schema_text)

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not TOKEN_ID_KEY.fullmatch(key):  # "²" is a digit to str.isdigit, and int() refuses 4,300 digits
                raise ValueError(f"keys must be token ids (1 to 18 ASCII digits), got {key[:40]!r}")
        return value

    def bias(self) -> dict[int, float]:
        return {int(token): bias for token, bias in (self.logit_bias or {}).items()}

    def top_logprobs_asked(self) -> int | None:
        """None: no logprobs; N: each token's logprob and its N most likely alternatives."""
        raise NotImplementedError

    def sequences(self) -> int:
        """How many sequences the request generates."""
        return self.n

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


NonEmptyText = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]


class CompletionRequest(_GenerationRequest):
    prompt: (
        NonEmptyText
        | TokenIds
        | Annotated[list[NonEmptyText], Field(min_length=1)]
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(default=None, ge=1)  # sequences generated; the n of highest mean logprob returned
    suffix: str | None = None

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def sequences(self) -> int:
        return self.best_of or self.n

    @field_validator("best_of")
    @classmethod
    def _at_least_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < info.data.get("n", 1):
            raise ValueError("best_of must be >= n")
        if value is not None and value > info.data.get("n", 1) and info.data.get("stream"):
            raise ValueError("best_of > n cannot be streamed (the best are known only at the end)")
        return value

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: str


MAX_TOOLS = 128  # OpenAI's limit on a request's tools
FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class FunctionDefinition(_Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object; None: no arguments
    strict: bool | None = None  # verispec always keeps the arguments within the schema

    @field_validator("parameters")
    @classmethod
    def _an_object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A call's arguments are a JSON object (OpenAI's rule, and what a conversation sends back): a schema of
        anything else would have the model write arguments the next request must refuse."""
        kind = (value or {}).get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and kind == ["object"]):
            raise ValueError(f"a function's parameters must be the JSON schema of an object (type 'object'), "
                             f"not of type {json.dumps(kind)[:40]}")  # fmt: skip
        return value

    @field_validator("parameters")
    @classmethod
    def _within_the_schema_limits(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A tool's schema joins the grammar its calls are held to: a JSON schema's limits (decoding/grammar.py)
        apply to it, refused here naming the tool rather than in the grammar made of every tool."""
        if value is not None:
            check_schema(value)
        return value


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallRequest(_Strict):
    """An assistant message's tool call in a conversation's history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # function: the legacy tool role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallRequest] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None  # the legacy form of one tool call

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


MAX_MESSAGES = 4096  # a conversation's messages (each costs tokens of its own: the context admits fewer still)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: list[FunctionDefinition] | None = Field(default=None, max_length=MAX_TOOLS)  # the legacy tools
    function_call: Literal["none", "auto"] | NamedFunction | None = None  # the legacy tool_choice

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> tuple[str, str] | None:
        return None  # tools are checked against the model's tool-call format (server/tools.py)


# ---- responses ----------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache (engine/prefixes.py)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class VerispecStats(BaseModel):
    """Per-request speculative decoding statistics (names as in vLLM and Spec-Bench)."""

    drafted: int
    accepted: int
    acceptance_rate: float
    mean_accepted_length: float
    target_passes: int
    acceptance_by_position: list[float]
    drafted_by_proposer: dict[str, int]  # "model" (the draft model), "lookup": they add up to drafted
    accepted_by_proposer: dict[str, int]  # ... and to accepted
    queue_seconds: float
    total_seconds: float

    @classmethod
    def from_stats(cls, stats: GenerationStats, queue_seconds: float) -> VerispecStats:
        return cls(
            drafted=stats.drafted,
            accepted=stats.accepted,
            acceptance_rate=stats.acceptance_rate,
            mean_accepted_length=stats.mean_accepted_length,
            target_passes=stats.target_passes,
            acceptance_by_position=stats.acceptance_by_position,
            drafted_by_proposer={name: counts.drafted for name, counts in stats.by_proposer().items()},
            accepted_by_proposer={name: counts.accepted for name, counts in stats.by_proposer().items()},
            queue_seconds=queue_seconds,
            total_seconds=stats.time_total,
        )


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]  # the sampled token and the N most likely
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobEntry]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    verispec: VerispecStats | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None  # a reasoning model's reasoning (gpt-oss's analysis channel), as vLLM names it
    tool_calls: list[ToolCall] | None = None
    function_call: ToolCallFunction | None = None  # answers to the legacy `functions`

    @model_serializer(mode="wrap")
    def _without_absent_calls(self, handler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None or k == "content"}


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    verispec: VerispecStats


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str = ""


class DeltaToolCall(BaseModel):
    """A piece of a streamed tool call: its first carries the id, type and name, the next ones its arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction

    @model_serializer(mode="wrap")
    def _present_fields(self, handler) -> dict:
        out = {k: v for k, v in handler(self).items() if v is not None}
        out["function"] = {k: v for k, v in out["function"].items() if v is not None}
        return out


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    function_call: DeltaFunction | None = None  # the legacy `functions`' form

    @model_serializer(mode="wrap")
    def _present_fields(self, handler) -> dict:  # OpenAI omits absent delta fields rather than sending null
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    verispec: VerispecStats | None = None


class DrafterCard(BaseModel):
    """What drafts for a served model (verispec's field of a model card): the method (None: plain decoding), the
    draft model or checkpoint it reads (None: none), and why it was chosen."""

    method: str | None
    model: str | None = None
    why: str = ""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "verispec"
    max_model_len: int
    drafter: DrafterCard | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def model_list(state) -> ModelList:
    """/v1/models of a server (app.py's ServerState): the model it serves, its context and its drafter."""
    card = ModelCard(id=state.model_name, created=state.started, max_model_len=state.scheduler.max_model_len,
                     drafter=state.drafter)  # fmt: skip
    return ModelList(data=[card])


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
