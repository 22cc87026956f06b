"""Tool calling in /v1/chat/completions, as OpenAI defines it: the model's own chat template renders the tools and
the conversation's calls and results (as transformers' `apply_chat_template(tools=...)` does), a grammar keeps every
call the model writes within its function's schema, and the output is parsed back into `tool_calls`, in the format
the template teaches the model.

Formats, told by the chat template (`detect`; a model whose template shows none refuses tool requests):

    hermes       <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, a block per call (Qwen2.5, Qwen3,
                 Hermes)
    llama3_json  an answer that is one JSON object {"name": ..., "parameters": {...}}, after <|python_tag|> or not
                 (Llama 3.1-3.3)
    mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral v0.3, Mistral Nemo)
    mistral_args [TOOL_CALLS]name[ARGS]{...}, a pair per call (Mistral Small 3.2, Devstral, Ministral 3)
    harmony      <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>, one call
                 a turn, after its reasoning (gpt-oss: read by harmony.py, not here)

What the grammar is, by tool_choice (`tool_grammar`):

    none      no grammar; the call's opening marker, where it is one token, is never sampled (a logit bias)
    auto      any text; once the model opens a call, the call within the schema of one of the functions
    required  one call or more from the first token (one with parallel_tool_calls false), within the schemas
    named     one call of that function from the first token

Arguments are sent as the JSON text the model wrote (streamed in pieces as it writes them).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from functools import cached_property

from ..decoding.detokenizer import IncrementalText
from ..decoding.grammar import JSON_WHITESPACE
from ..json_text import JsonTextError, parse_json
from ..models.tokenizer import Tokenizer
from .call_forms import Declared, LooseStream, find_calls
from .call_schema import read_json, validates
from .protocol import (
    ApiError,
    ChatCompletionRequest,
    DeltaFunction,
    DeltaToolCall,
    FunctionDefinition,
    ToolCall,
    ToolCallFunction,
)

TEXT = "TEXT: /(.|\\n)*/"  # any text, as a lexeme (a special token ends it)
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    opening: str  # the marker that opens a call (hermes, llama3_json) or the list of calls (mistral)
    closing: str = ""  # the marker that closes each call (hermes)
    arguments_key: str = "arguments"
    listed: bool = False  # the calls are one JSON list after the opening marker (mistral)
    bare: bool = False  # a call may come without its marker: an answer that begins with "{" (llama3_json)
    named: str = ""  # the marker between a call's name, written bare, and its arguments (mistral_args)
    short_ids: bool = False  # call ids of 9 letters and digits, what its templates take back (mistral)


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")
LLAMA3_JSON = ToolFormat("llama3_json", "<|python_tag|>", arguments_key="parameters", bare=True)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", listed=True, short_ids=True)
MISTRAL_ARGS = ToolFormat("mistral_args", "[TOOL_CALLS]", named="[ARGS]", short_ids=True)
HARMONY = ToolFormat("harmony", " to=functions.")
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS, HARMONY)}
XML_ARGUMENTS = ("<function=", "<arg_key>", "<parameter=", "<tool_calls>")  # formats verispec does not parse


def detect(chat_template: str | None) -> ToolFormat | None:
    """The tool-call format a chat template teaches, or None when it shows no tools verispec can parse."""
    if not chat_template or "tools" not in chat_template:
        return None
    if any(xml in chat_template for xml in XML_ARGUMENTS):  # Qwen3-Coder's, GLM's, Nemotron's, Apriel's calls
        return None
    if "<|channel|>" in chat_template and "to=" in chat_template and "functions." in chat_template:
        return HARMONY
    if "<tool_call>" in chat_template and _writes_json(chat_template):
        return HERMES
    if "[TOOL_CALLS]" in chat_template:
        return MISTRAL_ARGS if "[ARGS]" in chat_template else MISTRAL
    if ("<|python_tag|>" in chat_template or "ipython" in chat_template) and _writes_json(chat_template, "parameters"):
        return LLAMA3_JSON
    return None


def _writes_json(template: str, arguments: str = "arguments") -> bool:
    """Whether a template shows calls as JSON objects with a name and arguments (its quotes perhaps escaped)."""
    return all(re.search(rf'\\?"{key}\\?"', template) for key in ("name", arguments))


# ---- the request ------------------------------------------------------------------------------------------------
@dataclass
class ToolRequest:
    """A chat request's tools as the engine and the answer need them."""

    format: ToolFormat
    functions: list[FunctionDefinition]
    choice: str  # none | auto | required | named
    named: str | None  # the function tool_choice names
    parallel: bool
    legacy: bool  # asked with `functions`: answered with `function_call`
    ids: dict[tuple[int, int], str] = field(default_factory=dict)  # (choice, call) -> its id

    @property
    def loose(self) -> bool:
        """Whether calls written without the template's markers are read too (call_forms.py): under auto, for the
        Hermes format, whose models (Qwen2.5) often write a fenced or bare JSON call instead."""
        return self.choice == "auto" and self.format.name == HERMES.name

    @cached_property
    def declared(self) -> Declared:
        return Declared({f.name: f.parameters for f in self.functions}, self.parallel)

    def stands(self, name: str, arguments: str) -> bool:
        """Whether a complete call in the template's format stands as a call: always under required or a named
        function (the grammar held it from the first token); under auto only where it names a declared tool and its
        arguments are JSON read strictly and valid against that tool's schema (call_schema.py), else it is text."""
        if self.choice != "auto":
            return True
        if name not in self.declared.schemas:
            return False
        try:
            value = read_json(arguments)
        except ValueError:
            return False
        return isinstance(value, dict) and validates(value, self.declared.schemas[name] or NO_ARGUMENTS)

    @property
    def template_tools(self) -> list[dict]:
        """The tools as chat templates read them (transformers' form: OpenAI's tool objects)."""
        return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in self.functions]

    def call_id(self, index: int, choice: int = 0) -> str:
        """The id of call number `index` of answer `choice` (the same in a stream and in its final form)."""
        if (choice, index) not in self.ids:
            token = uuid.uuid4().hex
            self.ids[choice, index] = token[:9] if self.format.short_ids else f"call_{token[:24]}"
        return self.ids[choice, index]


def tool_request(body: ChatCompletionRequest, fmt: ToolFormat | None) -> ToolRequest | None:
    """The request's tools (`tools`, or the legacy `functions`), checked; None when it has none. Raises ApiError
    naming the field for what is wrong: tools on a model without a tool-call format, a tool_choice naming no tool,
    both forms at once."""
    if body.functions is not None and body.tools is not None:
        raise ApiError(400, "send tools or the legacy functions, not both", param="functions", code="invalid_value")
    if body.function_call not in (None, "none") and not body.functions:
        raise ApiError(400, "function_call needs functions", param="function_call", code="invalid_value")
    if fmt is None:
        _refuse_calls_in_history(body)
    legacy = body.functions is not None
    functions = list(body.functions or []) if legacy else [tool.function for tool in body.tools or []]
    choice = body.function_call if legacy else body.tool_choice
    param = "function_call" if legacy else "tool_choice"
    if not functions:
        if choice not in (None, "none"):
            raise ApiError(
                400, f"{param} needs {'functions' if legacy else 'tools'}", param=param, code="invalid_value"
            )
        return None
    if fmt is None:
        message = "this model's chat template shows no tool-call format verispec can parse (docs/tools.md)"
        raise ApiError(400, message, param="functions" if legacy else "tools", code="unsupported_parameter")
    names = [f.name for f in functions]
    if len(set(names)) < len(names):
        raise ApiError(400, "two tools have one name", param="functions" if legacy else "tools", code="invalid_value")
    named = None if isinstance(choice, str) or choice is None else (choice.name if legacy else choice.function.name)
    if named is not None and named not in names:
        raise ApiError(400, f"{param} names '{named[:64]}', which is not among the tools", param=param,
                       code="invalid_value")  # fmt: skip
    kind = "named" if named is not None else choice or "auto"
    return ToolRequest(fmt, functions, choice=kind, named=named, parallel=body.parallel_tool_calls, legacy=legacy)


def _refuse_calls_in_history(body: ChatCompletionRequest) -> None:
    """A model without a tool-call format cannot render a conversation holding calls or their results."""
    for i, message in enumerate(body.messages):
        if message.role in ("tool", "function") or message.tool_calls or message.function_call:
            text = "this model's chat template shows no tool-call format: it cannot render tool calls"
            raise ApiError(400, text, param=f"messages.{i}", code="unsupported_parameter")


def template_messages(body: ChatCompletionRequest) -> list[dict]:
    """The conversation as chat templates read it: OpenAI's "developer" is "system", an assistant's tool calls
    carry their arguments as objects (transformers' form), a legacy function result is a tool message. Raises
    ApiError naming the field for a call whose arguments are not a JSON object (or nest too deep), or a tool result
    that answers no earlier call (as OpenAI does: its tool_call_id must be the id of a call before it)."""
    out, call_ids = [], set()
    for i, message in enumerate(body.messages):
        role = {"developer": "system", "function": "tool"}.get(message.role, message.role)
        entry: dict = {"role": role, "content": message.text()}
        calls = [(call, f"messages.{i}.tool_calls.{j}") for j, call in enumerate(message.tool_calls or [])]
        if message.function_call is not None:
            calls.append((message.function_call, f"messages.{i}.function_call"))
        if calls:
            entry["tool_calls"] = [_template_call(call, param) for call, param in calls]
            call_ids |= {call.id for call, _ in calls if getattr(call, "id", None)}
        if message.role == "tool":
            _check_answers_a_call(message.tool_call_id, call_ids, f"messages.{i}.tool_call_id")
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        out.append(entry)
    return out


def _check_answers_a_call(call_id: str | None, call_ids: set[str], param: str) -> None:
    if not call_id:
        raise ApiError(400, "a tool message needs the tool_call_id of the call it answers", param=param,
                       code="invalid_value")  # fmt: skip
    if call_id not in call_ids:
        message = f"tool_call_id '{call_id[:64]}' answers no tool call of an earlier assistant message"
        raise ApiError(400, message, param=param, code="invalid_value")


def _template_call(call, param: str) -> dict:
    function = call.function if hasattr(call, "function") else call
    where = ".function.arguments" if hasattr(call, "function") else ".arguments"
    try:
        arguments = parse_json(function.arguments, "a tool call's arguments") if function.arguments.strip() else {}
    except JsonTextError as exc:
        raise ApiError(400, str(exc), param=f"{param}{where}", code="invalid_value") from None
    if not isinstance(arguments, dict):
        raise ApiError(400, "a tool call's arguments must be a JSON object", param=f"{param}{where}",
                       code="invalid_value")  # fmt: skip
    entry = {"type": "function", "function": {"name": function.name, "arguments": arguments}}
    if getattr(call, "id", None):
        entry["id"] = call.id
    return entry


def request_prompt(body: dict, tokenizer: Tokenizer) -> tuple[list[int], str | None]:
    """A chat request's prompt ids and tool grammar as the server makes them (the bench replays recorded requests);
    raises ApiError for what the server would refuse."""
    chat = ChatCompletionRequest.model_validate(body)
    tools = tool_request(chat, detect(tokenizer.chat_template))
    ids = tokenizer.encode_chat(template_messages(chat), tools=tools.template_tools if tools is not None else None)
    return ids, tool_grammar(tools, tokenizer) if tools is not None else None


# ---- the grammar ------------------------------------------------------------------------------------------------
def tool_grammar(request: ToolRequest, tokenizer: Tokenizer, answer: str | None = None) -> str | None:
    """The Lark grammar (llguidance's) that keeps the answer's calls within the functions' schemas, or None for
    tool_choice none. `answer`: the JSON schema (text; "" for any object) a structured answer follows: under auto the
    answer is then that JSON or calls, nothing else (one grammar: "a call or the schema's object")."""
    if request.choice == "none":
        return None
    if request.format is HARMONY:
        return _harmony_grammar(request, tokenizer)
    fmt = request.format
    functions = [f for f in request.functions if request.named in (None, f.name)]
    opening = _marker(fmt.opening, tokenizer)
    rules = ["%llguidance {}", TEXT, f"call: %json {json.dumps(_call_schema(fmt, functions))}"]
    if answer is not None:
        rules.append(f"answer: %json {_answer_schema(answer)}")
    if fmt.named:  # mistral_args: [TOOL_CALLS]name[ARGS]{arguments}, a pair per call
        named = _marker(fmt.named, tokenizer)
        pairs = [f"{opening} {json.dumps(f.name)} {named} %json {json.dumps(_arguments_schema(f))}" for f in functions]
        rules[2] = "call: " + " | ".join(pairs)
        calls, after_text = ("call+" if request.parallel else "call"), "TEXT {calls}?"
    elif fmt.listed:  # mistral: [TOOL_CALLS] [call, call, ...]
        listed = 'WS "[" WS call WS ("," WS call WS)* "]"' if request.parallel else 'WS "[" WS call WS "]"'
        rules += [f"calls: {opening} {listed}", "WS: /[ \\t\\n]*/"]
        calls, after_text = "calls", "TEXT {calls}?"
    elif fmt.bare:  # llama3_json: one JSON object, after the marker or not
        rules.append(f"tagged: {opening} call")
        calls, after_text = "(call | tagged)", "TEXT | {calls}"
    else:  # hermes: a block per call
        closing = _marker(fmt.closing, tokenizer)
        # one line break between blocks, or one after the last (a run of blanks kept a model from ever stopping)
        rules.append(f'block: {opening} "\\n" call "\\n" {closing}')
        more = ' ("\\n" block)*' if request.parallel else ""
        calls, after_text = f'block{more} "\\n"?', f"TEXT (block{more} TEXT)?"
    if request.choice != "auto":
        rules.append(f"start: {calls}")
    elif answer is not None:
        rules.append(f"start: answer | {calls}")
    else:
        rules.append("start: " + after_text.format(calls=calls))
    return "\n".join(rules) + "\n"


def _harmony_grammar(request: ToolRequest, tokenizer: Tokenizer) -> str | None:
    """gpt-oss's calls: under auto none (its own channels decide; harmony.py reads the calls it writes); required or
    named, its reasoning (or none) then one call of a function within its schema, as its template renders calls:
    ` to=functions.NAME<|channel|>commentary json<|message|>{...}` after the prompt's or a new `<|start|>assistant`."""
    if request.choice == "auto":
        return None
    start, channel, message, end = (
        _marker(t, tokenizer) for t in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
    )
    functions = [f for f in request.functions if request.named in (None, f.name)]
    header = f'{channel} "commentary json" {message}'
    calls = [
        f'" to=functions." {json.dumps(f.name)} {header} %json {json.dumps(_arguments_schema(f))}' for f in functions
    ]
    rules = ["%llguidance {}", TEXT, "call: " + " | ".join(calls)]
    rules.append(f'reasoning: {channel} "analysis" {message} TEXT {end} {start} "assistant"')
    rules.append("start: reasoning? call")
    return "\n".join(rules) + "\n"


def _answer_schema(answer: str) -> str:
    """A structured answer's schema as the grammar embeds it, with the whitespace the JSON grammars use."""
    schema = parse_json(answer, "the response format's schema") if answer else {"type": "object"}
    if isinstance(schema, dict) and "x-guidance" not in schema:
        schema = {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}, **schema}
    return json.dumps(schema)


def _marker(text: str, tokenizer: Tokenizer) -> str:
    """A marker in the grammar: its token where it is one (`<[id]>`: llguidance reads added tokens as special,
    never spelled by text), else its text."""
    token = tokenizer.raw.token_to_id(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def _call_schema(fmt: ToolFormat, functions: list[FunctionDefinition]) -> dict:
    """One call's JSON schema: {"name": <a function's>, <arguments key>: <its parameters>}, name first."""
    alternatives = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, fmt.arguments_key: _embedded(f)},
            "required": ["name", fmt.arguments_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    return {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}, **schema}


def _embedded(function: FunctionDefinition) -> dict:
    """A function's parameters as a call's schema embeds them: where they refer to their own places (`$ref:
    "#/$defs/User"`, as pydantic writes them), with an `$id` of their own, so that the references resolve against
    them as they do when the parameters are the whole schema (response_format), not against the call's schema."""
    parameters = function.parameters or NO_ARGUMENTS
    if "$id" in parameters or "$ref" not in json.dumps(parameters):
        return parameters
    return {"$id": f"urn:verispec:tools:{function.name}", **parameters}


def _arguments_schema(function: FunctionDefinition) -> dict:
    return {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}, **(function.parameters or NO_ARGUMENTS)}


def marker_bias(request: ToolRequest, tokenizer: Tokenizer) -> dict[int, float]:
    """tool_choice none: the opening marker's token (where it is one) never sampled."""
    token = tokenizer.raw.token_to_id(request.format.opening)
    return {token: -100.0} if request.choice == "none" and token is not None else {}


# ---- the answer -------------------------------------------------------------------------------------------------
@dataclass
class ParsedCall:
    name: str
    arguments: str  # the JSON text the model wrote


def parse_calls(request: ToolRequest | ToolFormat, text: str, cut: bool = False) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a finished answer, read with its special tokens: calls in the template's format, and, for
    a request that takes them (ToolRequest.loose), calls written in the loose forms call_forms.py reads. Under auto a
    call stands only where it is valid (Standing: the first that is not, and the text after it, are content). A call
    cut by max_tokens (`cut`) stays a call, its arguments as far as they were written (one whose name was not
    complete is left out): its markup is never content. Other calls that do not parse are content, as written."""
    fmt = request if isinstance(request, ToolFormat) else request.format
    scanner = CallScanner(fmt)
    scanner.update(text, final=True)
    standing = Standing(request)
    calls = standing.update(scanner, final=True, cut=cut)
    if standing.ended is None and scanner.broken and not (cut and scanner.opened):
        return text, []
    content = scanner.content
    if isinstance(request, ToolRequest) and request.loose and scanner.content:
        loose = find_calls(scanner.content, request.declared)
        if loose is not None:
            content = loose[0] or ""
            calls = [ParsedCall(c.name, c.arguments) for c in loose[1]] + calls
    after = text[standing.ended :] if standing.ended is not None else ""
    return (content + after).strip() or None, calls


class Standing:
    """The calls of a growing answer's scan that stand, in order, and where its text turns back into content
    (`ended`; None while it does not). Under required or a named function every call with its name, as far as it is
    written (the grammar holds it from the first token). Under auto a call stands once it is complete and valid
    (ToolRequest.stands), a cut one at the answer's end as written; the first that does not stand ends the calls:
    from its opening marker on, the answer is content."""

    def __init__(self, request: ToolRequest | ToolFormat):
        self.judged = isinstance(request, ToolRequest) and request.choice == "auto"
        self.request = request
        self.calls: list[ParsedCall] = []  # those judged to stand
        self.ended: int | None = None

    def update(self, scanner: CallScanner, final: bool = False, cut: bool = False) -> list[ParsedCall]:
        if not self.judged:
            return [ParsedCall(c.name, c.arguments) for c in scanner.calls if c.name]
        while self.ended is None and len(self.calls) < len(scanner.calls):
            call = scanner.calls[len(self.calls)]
            if not call.done:
                cut_short = final and cut and call.name
                return self.calls + [ParsedCall(call.name, call.arguments)] if cut_short else list(self.calls)
            if not self.request.stands(call.name, call.arguments):  # type: ignore[union-attr]
                self.ended = call.start
                break
            self.calls.append(ParsedCall(call.name, call.arguments))
        return list(self.calls)


@dataclass
class _Call:
    name: str
    start: int  # where its text begins: its opening marker, or its first character
    arguments: str = ""
    done: bool = False


class CallScanner:
    """Reads a growing answer (its text with special tokens) into content and calls, as far as it is known: the
    content before the first call's marker (a marker's possible beginning held back), then each call's name as soon
    as it is complete and its arguments as far as they are written."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.content = ""  # content so far (what may still become a marker held back)
        self.calls: list[_Call] = []
        self.broken = False  # the calls' text does not parse
        self._region: int | None = None  # where the calls begin in the text
        self._at = 0  # how far the calls' region has been read into calls

    @property
    def opened(self) -> bool:
        """Whether the answer opened a call (its marker, or a bare call's first brace)."""
        return self._region is not None

    def update(self, text: str, final: bool = False) -> None:
        if self._region is None:
            self._find_region(text, final)
        if self._region is not None and not self.broken:
            self._read_calls(text, final)

    def _find_region(self, text: str, final: bool) -> None:
        fmt, blank = self.fmt, len(text) - len(text.lstrip())
        at = text.find(fmt.opening)
        if fmt.bare and text[blank : blank + 1] == "{":  # an answer that is a JSON object: a call without its marker
            self.content, self._region = text[:blank], blank
        elif at >= 0:
            self.content, self._region = text[:at], at + len(fmt.opening)
        else:
            held = 0 if final else _partial(text, fmt.opening)
            if fmt.bare and not final and blank == len(text):
                held = len(text)  # nothing yet tells content from a call
            if text.endswith("\ufffd") and not final:
                held = max(held, 1)
            self.content = text[: len(text) - held]
            return
        self._at = self._region

    def _read_calls(self, text: str, final: bool) -> None:
        region = self._clean(text)
        while True:
            if self.calls and not self.calls[-1].done:
                if not self._read_arguments(region, final):
                    return
                continue
            start = _skip(region, self._at)
            if start >= len(region):
                return
            if self.fmt.named:
                if not self._read_name(region, start, final, self._start(text, start)):
                    return
                continue
            if region[start] != "{":  # the end of the calls; text after a call is not one (and not sent)
                self.broken = self.broken or not self.calls
                return
            match = _NAME.match(region, start)
            if match is None:
                self.broken = final or self.broken or not _could_become_name(region[start:])
                return
            self.calls.append(_Call(json.loads(f'"{match.group(1)}"'), self._start(text, start)))
            self._at = match.end()

    def _read_name(self, region: str, start: int, final: bool, begins: int) -> bool:
        """A bare name and the marker after it (mistral_args); True when read."""
        end = region.find(self.fmt.named, start)
        if end < 0:
            written = region[start:]
            written = written[: len(written) - _partial(written, self.fmt.named)]
            self.broken = self.broken or final or not re.fullmatch(r"[A-Za-z0-9_.-]{0,64}", written)
            return False
        name = region[start:end].strip()
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            self.broken = True
            return False
        self.calls.append(_Call(name, begins))
        self._at = end + len(self.fmt.named)
        return True

    def _read_arguments(self, region: str, final: bool) -> bool:
        """Reads the current call's arguments; True when the call is complete."""
        call = self.calls[-1]
        if self.fmt.named:
            start = _skip(region, self._at)
        else:
            match = _ARGUMENTS[self.fmt.arguments_key].match(region, self._at)
            if match is None:
                self.broken = final or self.broken or len(region) - self._at > 64
                return False
            start = match.end()
        try:
            _, end = _DECODER.raw_decode(region, start)
        except ValueError:  # not written to its end yet: all of it so far is arguments
            tail = region[start:].rstrip() if final else region[start:]
            call.arguments = tail[:-1] if tail.endswith("\ufffd") else tail
            self.broken = self.broken or final
            return False
        closing = re.compile(r"\s*" if self.fmt.named else r"\s*\}").match(region, end)
        if closing is None:
            self.broken = final or self.broken or bool(region[end:].strip())
            return False
        call.arguments, call.done = region[start:end], True
        self._at = closing.end()
        return True

    def _start(self, text: str, first: int) -> int:
        """Where a call whose first character is at `first` begins: at its own opening marker, where one stands
        between the previous call's end and it (else at `first`)."""
        marker = text.rfind(self.fmt.opening, max(0, self._at - len(self.fmt.opening)), first)
        return marker if marker >= 0 else first

    def _clean(self, text: str) -> str:
        """The text with the markers in the calls' region blanked (their lengths kept)."""
        head, calls = text[: self._region], text[self._region :]
        for marker in (self.fmt.opening, self.fmt.closing):  # mistral_args' [ARGS] is read as it is
            if marker:
                calls = calls.replace(marker, " " * len(marker))
        return head + calls


_DECODER = json.JSONDecoder()
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS = {key: re.compile(rf'\s*,\s*"{key}"\s*:\s*') for key in ("arguments", "parameters")}


def _skip(region: str, at: int) -> int:
    """Past blanks and the separators between calls (a list's "[" and ",", a ";")."""
    while at < len(region) and region[at] in " \t\r\n[,;":
        at += 1
    return at


def _could_become_name(text: str) -> bool:
    return bool(re.fullmatch(r'\{\s*("(n(a(m(e("\s*(:\s*("((?:[^"\\]|\\.)*)?)?)?)?)?)?)?)?)?', text))


def _partial(text: str, marker: str) -> int:
    """The longest n < len(marker) such that `text` ends with marker[:n]."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ToolStream:
    """One choice's answer as OpenAI's stream of deltas: content pieces, then each call's id, type and name, then
    its arguments. It reads the answer's tokens with their special tokens (the markers); for a request that takes
    loose calls, the content before any marker is read for them too (call_forms.LooseStream: held back where a call
    may begin, a call sent whole once it is complete). Under required or a named function a call's arguments are
    sent in pieces as they are written; under auto a call is sent once it is complete and stands (Standing), and the
    text from a call that does not stand on is sent as content."""

    def __init__(self, request: ToolRequest, tokenizer: Tokenizer, choice: int = 0):
        self.request, self.choice = request, choice
        self.text = IncrementalText(tokenizer, keep_special=True)
        self.scanner = CallScanner(request.format)
        self.standing = Standing(request)
        self.loose = LooseStream(request.declared) if request.loose else None
        self.loose_calls: list[ParsedCall] = []
        self.sent_content = 0
        self.sent_after = 0  # characters of the text sent as content after the calls ended
        self.sent: list[int] = []  # per call: characters of its arguments sent

    def feed(self, token: int) -> tuple[str, list[DeltaToolCall]]:
        """The new content and call pieces after one more token."""
        self.scanner.update(self.text.add(token))
        return self._news()

    def finish(self, cut: bool = False) -> tuple[str, list[DeltaToolCall]]:
        """What the end of the answer releases (content held back for a marker or a loose call). A call cut by
        max_tokens (`cut`) stays a call; another that does not parse is sent as content where nothing of it was
        sent as a call."""
        self.scanner.update(self.text.text, final=True)
        self.standing.update(self.scanner, final=True, cut=cut)
        if self.standing.ended is None and self.scanner.broken and not (cut and self.scanner.opened):
            content = self.text.text[self.sent_content :] if not self.sent else ""
            self.sent_content = len(self.text.text)
            return content, []
        return self._news(final=True, cut=cut)

    @property
    def calls(self) -> int:
        return len(self.sent)

    def _news(self, final: bool = False, cut: bool = False) -> tuple[str, list[DeltaToolCall]]:
        if self.loose is not None:
            content, found = self.loose.update(self.scanner.content, final or self.scanner.opened)
            self.loose_calls += [ParsedCall(c.name, c.arguments) for c in found]
            self.sent_content = self.loose.sent
        else:
            content = self.scanner.content[self.sent_content :] if not self.sent else ""
            self.sent_content += len(content)
        pieces = self._pieces(self.loose_calls + self.standing.update(self.scanner, final, cut))
        if self.standing.ended is not None and (final or not pieces):  # after the calls sent in this step
            text = self.text.text
            start = max(self.standing.ended, self.sent_after)
            end = len(text) - (1 if text.endswith("\ufffd") and not final else 0)
            content += text[start:end]
            self.sent_after = max(start, end)
        return content, pieces

    def _pieces(self, calls: list[ParsedCall]) -> list[DeltaToolCall]:
        """The deltas of calls sent so far and grown: a new call's id, type and name, then its new arguments."""
        pieces = []
        for index, call in enumerate(calls):
            if index == len(self.sent):
                self.sent.append(0)
                function = DeltaFunction(name=call.name, arguments="")
                call_id = self.request.call_id(index, self.choice)
                pieces.append(DeltaToolCall(index=index, id=call_id, type="function", function=function))
            new = call.arguments[self.sent[index] :]
            if new:
                self.sent[index] = len(call.arguments)
                pieces.append(DeltaToolCall(index=index, function=DeltaFunction(arguments=new)))
        return pieces


def answer_calls(request: ToolRequest, calls: list[ParsedCall], choice: int = 0) -> list[ToolCall]:
    return [
        ToolCall(id=request.call_id(i, choice), function=ToolCallFunction(name=c.name, arguments=c.arguments))
        for i, c in enumerate(calls)
    ]
