"""FastAPI routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

Every client mistake is answered with a 4xx and OpenAI's error body; a 500 means a bug in verispec.
With an API key set, every /v1/ route and /metrics need `Authorization: Bearer <key>` (401 otherwise); /health
stays open for load balancers.
A handler encodes and checks the request, hands it to the scheduler thread, and reads its events from an
asyncio queue; if the client goes away (mid-stream or while waiting) the request is cancelled at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..decoding.grammar import Grammar, GrammarSpec
from ..decoding.sampling import SamplingParams
from ..decoding.stopping import check_stop
from ..engine.requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput
from ..engine.scheduler import QueueFullError, Scheduler, SchedulerStoppedError
from ..errors import InvalidParameterError, ModelLoadError, PromptTooLongError
from .events import KEEP_ALIVE_SECONDS, AsyncSink
from .grammars import ClientGoneError, GrammarWorkers
from .guard import Guard, key_index
from .harmony import is_harmony
from .limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_GRAMMAR_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    PARSE_ON_LOOP_BYTES,
)
from .openapi import openapi_schema
from .partitions import partition_of, store_scope, tenant_of
from .protocol import MAX_MESSAGES, ApiError, ChatCompletionRequest, CompletionRequest, ModelList, model_list, new_id
from .responses import (
    SSE_COMMENT,
    Job,
    chat_chunks,
    chat_completion_body,
    completion_body,
    completion_chunks,
    event_error,
)
from .responses_api import LEFT_OUT_HEADER, Plan, plan, response_body, response_events, truncated
from .responses_protocol import ResponsesRequest
from .responses_store import ResponseStore, StoredResponse
from .tools import ToolFormat, ToolRequest, detect, marker_bias, template_messages, tool_grammar, tool_request

log = logging.getLogger("verispec.server")
RequestT = TypeVar("RequestT", CompletionRequest, ChatCompletionRequest)
T = TypeVar("T")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DISCONNECT_POLL_SECONDS = 0.5
RETRY_AFTER_SECONDS = 1  # a full queue: a slot frees as soon as any running request ends


@dataclass
class ServerState:
    scheduler: Scheduler
    model_name: str
    draining: bool = False  # set on SIGTERM: new requests get 503 while running ones finish
    api_keys: tuple[str, ...] = ()  # when set, /v1/ routes need one of them as a bearer token
    metrics_key: str | None = None  # /metrics needs it (else, with one API key, that key; with several, closed)
    cache_sharing: str = "key"  # which requests share earlier outputs and prefilled prompts (partitions.py)
    allowed_hosts: frozenset[str] | None = None  # names the Host (and any Origin) header may carry; None: any
    started: int = field(default_factory=lambda: int(time.time()))
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # seconds a request body may take to arrive (408 beyond)
    grammar_timeout: float = DEFAULT_GRAMMAR_TIMEOUT  # seconds a new grammar may take to compile (--grammar-timeout)
    grammar_processes: int = 1  # worker processes checking new grammars (--grammar-workers)
    parse_special: bool = False  # message contents may spell control tokens (--parse-special: the old behaviour)
    keep_alive: float = KEEP_ALIVE_SECONDS  # the longest a stream stays silent (events.py)
    _grammar_workers: GrammarWorkers | None = None
    _tokens_per_message: int | None = None
    tool_format: ToolFormat | None = None  # how the model writes tool calls (tools.py), from its chat template
    harmony: bool = False  # the model writes gpt-oss's harmony messages (harmony.py): chat answers are read as such
    responses: ResponseStore = field(default_factory=ResponseStore)  # stored responses (responses_store.py)
    drafter: dict | None = None  # what drafts (engine/default_drafter.py: Drafter.as_dict), shown in /v1/models

    def __post_init__(self) -> None:
        self.tool_format = detect(self.scheduler.tokenizer.chat_template)
        self.harmony = is_harmony(self.scheduler.tokenizer)

    def most_messages(self) -> int:
        """The most messages a chat request may hold: each takes at least the chat template's markers of an empty
        message (measured once; 1 where the template cannot tell), and they must fit the context."""
        if self._tokens_per_message is None:
            self._tokens_per_message = 1
            with contextlib.suppress(Exception):
                empty = [{"role": role, "content": ""} for role in ("user", "assistant", "user")]
                one, three = (len(self.scheduler.tokenizer.encode_chat(empty[:n])) for n in (1, 3))
                self._tokens_per_message = max(1, (three - one) // 2)
        return self.scheduler.max_model_len // self._tokens_per_message

    def grammar_workers(self) -> GrammarWorkers:
        if self._grammar_workers is None:
            compiler = self.scheduler.grammars
            self._grammar_workers = GrammarWorkers(compiler, self.grammar_processes, self.grammar_timeout)
        return self._grammar_workers


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if not state.scheduler.alive:
            state.scheduler.start()
        yield
        state.scheduler.stop()
        if state._grammar_workers is not None:
            state._grammar_workers.close()

    app = FastAPI(title="verispec", lifespan=lifespan)
    app.state.verispec = state
    _add_error_handlers(app, state)
    app.add_middleware(
        Guard, api_keys=state.api_keys, allowed_hosts=state.allowed_hosts,
        refused=lambda label: state.scheduler.metrics.rejected.labels(code=label).inc(), metrics_key=state.metrics_key,
    )  # fmt: skip
    app.openapi = lambda: openapi_schema(app)
    _add_info_routes(app, state)
    _add_generation_routes(app, state)
    _add_responses_routes(app, state)
    return app


# ---- errors -----------------------------------------------------------------------------------------------
def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        if exc.status < 499:  # refused requests; a client that left is counted as a cancelled request
            state.scheduler.metrics.rejected.labels(code=exc.code or exc.type).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def query_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        """A route's query or path parameter of the wrong type (the POST bodies are parsed by _parse)."""
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p not in ("query", "path", "body")) or None
        error = ApiError(422, f"invalid request: {param or 'request'}: {first['msg']}", param=param,
                         code="invalid_value")  # fmt: skip
        return JSONResponse(error.body(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else f"http_{exc.status_code}"
        body = ApiError(exc.status_code, str(exc.detail), code=code).body()
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)  # 405 keeps its Allow

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        error = ApiError(500, f"internal server error ({type(exc).__name__})", type="server_error", code="internal")
        return JSONResponse(error.body(), status_code=500)


def _validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid" and "recursion limit" in errors[0]["msg"]:
        message = f"the JSON body nests deeper than the server reads ({MAX_JSON_DEPTH} levels)"
        return ApiError(400, message, code="json_too_deep")
    if errors and errors[0]["type"] == "json_invalid":
        return ApiError(400, f"malformed JSON body: {errors[0]['msg']}", code="invalid_json")
    parts = [f"{_location(e['loc']) or 'body'}: {e['msg']}" for e in errors[:3]]
    param = _location(errors[0]["loc"]) if errors else None
    return ApiError(422, "invalid request: " + "; ".join(parts), param=param or None, code="invalid_value")


def _location(loc: tuple) -> str:
    """'messages.0.content' from pydantic's location, without the union-member tags ('list[int]',
    'constrained-str')."""
    return ".".join(str(p) for p in loc if isinstance(p, int) or not _UNION_TAG.search(str(p)))


_UNION_TAG = re.compile(r"\[|^(str|int|constrained-.*)$")


# ---- info -------------------------------------------------------------------------------------------------
def _add_info_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if not state.scheduler.alive:
            error = ApiError(503, "the scheduler is not running", type="server_error", code="unavailable")
            return JSONResponse(error.body(), status_code=503)
        return JSONResponse({"status": "draining" if state.draining else "ok"})

    @app.get("/v1/models")
    async def models() -> ModelList:
        return model_list(state)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(state.scheduler.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ---- generation -------------------------------------------------------------------------------------------
def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        _check_request(state, body)  # before any work: encoding, compiling a grammar
        prompt_ids = await _off_loop(_encode_completion_prompt, state, body)
        grammar, grammar_param = await _grammar(state, body, request)
        job = _submit(
            state, body, prompt_ids=prompt_ids, default_max=COMPLETION_DEFAULT_MAX_TOKENS, requested=body.max_tokens,
            prompt_param="prompt", grammar=grammar, grammar_param=grammar_param, authorization=_authorization(request),
        )  # fmt: skip
        if job.stream:
            return _sse(state, job, completion_chunks(job))
        outputs, queue_seconds = await _result(request, state, job)
        return JSONResponse(completion_body(job, outputs, queue_seconds).model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        job = await _start_chat(state, body, request)
        if job.stream:
            return _sse(state, job, chat_chunks(job))
        outputs, queue_seconds = await _result(request, state, job)
        return JSONResponse(chat_completion_body(job, outputs, queue_seconds).model_dump())


def _add_responses_routes(app: FastAPI, state: ServerState) -> None:
    """The Responses API: a request runs as the chat request it means (responses_api.py); with `store` (the default)
    its response is kept, for previous_response_id and the GET, DELETE and input_items routes, within its scope."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await _parse(request, ResponsesRequest)
        scope = _store_scope(state, request)
        earlier = []
        if body.previous_response_id is not None:
            stored = await _off_loop(state.responses.get, scope, body.previous_response_id)
            if stored is None:
                message = f"no stored response with id '{body.previous_response_id[:64]}' (unknown, expired or deleted)"
                raise ApiError(404, message, param="previous_response_id", code="not_found")
            earlier = stored.conversation
        made = plan(body, earlier, lambda item_id: state.responses.item(scope, item_id))
        made, job = await _start_responses(state, made, request)
        headers = {LEFT_OUT_HEADER: ", ".join(made.left_out)} if made.left_out else None

        def keep(response: dict) -> None:
            if body.store:
                conversation = [*made.items, *response["output"]]
                state.responses.put(scope, StoredResponse(response["id"], response, made.new_items, conversation))

        if body.stream:
            return _sse(state, job, response_events(made, job, keep), typed=True, headers=headers)
        outputs, _ = await _result(request, state, job)
        answer = response_body(made, job, outputs[0])
        await _off_loop(keep, answer)
        return JSONResponse(answer, headers=headers)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> JSONResponse:
        stored = await _stored(state, request, response_id)
        return JSONResponse(stored.response)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> JSONResponse:
        if not await _off_loop(state.responses.delete, _store_scope(state, request), response_id):
            raise _no_response(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(
        response_id: str, request: Request, limit: int = 20, order: str = "desc", after: str | None = None
    ) -> JSONResponse:
        if not 1 <= limit <= 100:
            raise ApiError(400, f"limit must be in [1, 100], got {limit}", param="limit", code="invalid_value")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be asc or desc", param="order", code="invalid_value")
        stored = await _stored(state, request, response_id)
        return JSONResponse(_page(stored.conversation[: len(stored.conversation) - len(stored.response["output"])],
                                  limit, order, after))  # fmt: skip


def _page(items: list[dict], limit: int, order: str, after: str | None) -> dict:
    ordered = items[::-1] if order == "desc" else list(items)
    if after is not None:
        ids = [item.get("id") for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None, "has_more": len(ordered) > limit}  # fmt: skip


async def _stored(state: ServerState, request: Request, response_id: str) -> StoredResponse:
    stored = await _off_loop(state.responses.get, _store_scope(state, request), response_id)
    if stored is None:
        raise _no_response(response_id)
    return stored


def _no_response(response_id: str) -> ApiError:
    return ApiError(404, f"no stored response with id '{response_id[:64]}' (unknown, expired or deleted)",
                    param="response_id", code="not_found")  # fmt: skip


def _store_scope(state: ServerState, request: Request) -> str:
    key = key_index(state.api_keys, _authorization(request)) if state.api_keys else None
    return store_scope(state.cache_sharing, key)


async def _start_responses(state: ServerState, made: Plan, request: Request) -> tuple[Plan, Job]:
    """The plan's chat request started; with truncation "auto", a prompt longer than the context drops its oldest
    turns until it fits. Refusals name the Responses field."""
    while True:
        try:
            return made, await _start_chat(state, made.chat, request, "resp")
        except ApiError as exc:
            if exc.code == "context_length_exceeded" and made.body.truncation == "auto":
                shorter = truncated(made)
                if shorter is not None:
                    made = shorter
                    continue
            raise made.in_responses_terms(exc) from None


async def _start_chat(state: ServerState, body: ChatCompletionRequest, request: Request, kind: str = "chatcmpl") -> Job:
    """A chat request checked, rendered (with its tools), constrained and queued; raises ApiError."""
    _check_request(state, body)
    if state.harmony and body.stop_list():  # the engine matches stop strings in the text, reasoning included
        message = "stop strings for a model that answers in harmony channels (gpt-oss) are not supported yet"
        raise ApiError(400, message, param="stop", code="unsupported_parameter")
    tools = tool_request(body, state.tool_format)
    messages = template_messages(body)
    prompt_ids = await _off_loop(_encode_chat, state, messages, tools)
    room = state.scheduler.max_model_len - len(prompt_ids)
    requested = body.max_completion_tokens or body.max_tokens
    grammar, grammar_param = await _grammar(state, body, request, tools)
    return _submit(
        state, body, prompt_ids=prompt_ids, default_max=room, requested=requested, prompt_param="messages",
        grammar=grammar, grammar_param=grammar_param,
        authorization=_authorization(request), tools=tools, kind=kind,
    )  # fmt: skip


async def _parse(request: Request, model: type[RequestT]) -> RequestT:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        # a web page can send text/plain or typeless bodies to a loopback server without asking (no CORS
        # preflight); a JSON body it cannot, so refusing the others keeps pages from driving the server
        message = f"the body must be JSON sent as Content-Type: application/json (got {media_type or 'none'})"
        raise ApiError(415, message, code="unsupported_media_type")
    state: ServerState = request.app.state.verispec
    raw = await _body(request, state.max_body_bytes, state.body_timeout)
    if model is ChatCompletionRequest and raw.count(b'"role"') > MAX_MESSAGES:
        # counted in the bytes (a key's quotes cannot occur unescaped inside a JSON string): parsing 120,000 empty
        # messages holds the GIL for a tenth of a second, and the engine's thread waits for it
        message = f"a conversation holds at most {MAX_MESSAGES} messages"
        raise ApiError(400, message, param="messages", code="context_length_exceeded")
    try:
        if len(raw) > PARSE_ON_LOOP_BYTES:  # megabytes of JSON take tens of milliseconds: not on the event loop,
            async with _LARGE_BODIES:  # and one at a time: each holds the GIL the scheduler's thread needs
                return await asyncio.to_thread(model.model_validate_json, raw)
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise _validation_error(exc) from None


_LARGE_BODIES = asyncio.Semaphore(1)


async def _body(request: Request, limit: int, timeout: float) -> bytes:
    """The request's body; 413 as soon as it is known to exceed `limit` bytes (by its Content-Length, or while it
    streams in), 408 when it takes longer than `timeout` seconds, 499 (unlogged) when the client leaves first."""
    too_large = ApiError(
        413, f"the request body exceeds {limit} bytes (the server's --max-body-bytes)", code="body_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        message = f"the request body took longer than {timeout:g} s to arrive (the server's --body-timeout)"
        raise ApiError(408, message, code="body_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise ApiError(499, "client closed the request", code="client_closed") from None
    return b"".join(chunks)


async def _off_loop(function: Callable[..., T], *args) -> T:
    """Tokenizing a long prompt takes a long time for a server (a 5 MB prompt: seconds): a worker thread runs it
    while the event loop keeps answering /health and streaming."""
    return await asyncio.to_thread(function, *args)


def _encode_completion_prompt(state: ServerState, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(400, "one prompt per request is supported", param="prompt", code="unsupported_parameter")
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt", code="invalid_value")
    if isinstance(prompt, list):
        return list(prompt)
    _refuse_untokenizable(state, len(prompt), "prompt")
    return state.scheduler.tokenizer.encode(prompt)


def _refuse_untokenizable(state: ServerState, characters: int, param: str) -> None:
    """A text longer than the context times the longest token cannot fit: refused without spending seconds on
    tokenizing it (a 5 MB prompt took 6 s)."""
    context = state.scheduler.max_model_len
    if characters > context * state.scheduler.tokenizer.longest_token_bytes:
        message = f"the prompt has {characters} characters: more tokens than this model's context of {context} holds"
        raise ApiError(400, message, param=param, code="context_length_exceeded")


def _authorization(request: Request) -> bytes:
    return request.headers.get("authorization", "").encode("latin-1")


def _encode_chat(state: ServerState, messages: list[dict], tools: ToolRequest | None) -> list[int]:
    """The messages (tools.template_messages) rendered by the model's chat template with the request's tools."""
    _refuse_untokenizable(state, sum(len(m["content"]) for m in messages), "messages")
    try:
        template_tools = tools.template_tools if tools is not None else None
        return state.scheduler.tokenizer.encode_chat(messages, parse_special=state.parse_special, tools=template_tools)
    except ModelLoadError:
        message = "this model has no chat template; send a raw prompt to /v1/completions"
        raise ApiError(400, message, param="messages", code="no_chat_template") from None
    except InvalidParameterError as exc:
        raise ApiError(400, str(exc), param="messages", code="invalid_value") from None


async def _grammar(
    state: ServerState,
    body: CompletionRequest | ChatCompletionRequest,
    request: Request,
    tools: ToolRequest | None = None,
) -> tuple[Grammar | None, str | None]:
    """The request's grammar (structured output, or its tool calls': tools.py) and the field that asked for it,
    checked in a worker process and compiled off the event loop (server/grammars.py); 400 naming the field for a
    bad one, or one over the limits; 499 when the client leaves meanwhile."""
    constraints = body.constraints()
    if constraints and state.harmony and isinstance(body, ChatCompletionRequest):
        message = "structured output for a model that answers in harmony channels (gpt-oss) is not supported yet"
        raise ApiError(400, message, param=constraints[0][0], code="unsupported_parameter")
    if tools is not None and tools.choice != "none":
        answer = _structured_answer(constraints)
        calls = tool_grammar(tools, state.scheduler.tokenizer, answer if tools.choice == "auto" else None)
        constraints = [("functions" if tools.legacy else "tools", "grammar", calls)] if calls is not None else []
    if not constraints:
        return None, None
    param = constraints[0][0]
    if len(constraints) > 1:
        message = "ask for one structured-output constraint (response_format, structured_outputs or guided_*)"
        raise ApiError(400, message, param=param, code="invalid_value")
    try:
        # the limits on what reaches the library are checked here, off the event loop (a schema is parsed)
        spec = await asyncio.to_thread(GrammarSpec, *constraints[0][1:])
        return await state.grammar_workers().compile(spec, request.is_disconnected), param
    except InvalidParameterError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None
    except ClientGoneError:
        raise ApiError(499, "client closed the request", code="client_closed") from None


def _structured_answer(constraints: list[tuple[str, str, str]]) -> str | None:
    """The JSON schema (text; "" for any object) a structured answer asked for beside tools must follow, or None; with
    tools, structured output is a JSON schema or json_object (the grammar is "a call or the schema's object")."""
    if not constraints:
        return None
    param, kind, value = constraints[0]
    if len(constraints) > 1 or kind not in ("json_schema", "json_object"):
        message = "beside tools, structured output is one JSON schema or json_object (a call or that object)"
        raise ApiError(400, message, param=param, code="invalid_value")
    return value if kind == "json_schema" else ""


def _submit(
    state: ServerState,
    body: CompletionRequest | ChatCompletionRequest,
    prompt_ids: list[int],
    default_max: int,
    requested: int | None,
    prompt_param: str,
    *,
    grammar: Grammar | None = None,
    grammar_param: str | None = None,
    authorization: bytes = b"",
    tools: ToolRequest | None = None,
    kind: str | None = None,
) -> Job:
    """Check the request against the limits, then queue it (in its partition: partitions.py); raises ApiError."""
    max_tokens = _max_tokens(state, prompt_ids, default_max=default_max, requested=requested, prompt_param=prompt_param)
    temperature = 1.0 if body.temperature is None else body.temperature
    try:
        params = SamplingParams(
            temperature=temperature, top_k=max(body.top_k, 0), top_p=body.top_p, seed=body.seed,
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
            logit_bias=body.bias() | (marker_bias(tools, state.scheduler.tokenizer) if tools is not None else {}),
        )  # fmt: skip
    except InvalidParameterError as exc:
        raise ApiError(400, str(exc), param=_field_named(str(exc)), code="invalid_value") from None
    job_id = new_id(kind or ("chatcmpl" if prompt_param == "messages" else "cmpl"))
    key = key_index(state.api_keys, authorization) if state.api_keys else None
    partition = partition_of(state.cache_sharing, key, user=body.user, salt=body.cache_salt, request_id=job_id)
    tenant = tenant_of(key)
    count = body.sequences()
    sink = AsyncSink(count, keep_alive=state.keep_alive)
    logprobs = body.top_logprobs_asked()
    ranking = count > body.n  # best_of ranks the sequences by their logprobs
    requests = [
        EngineRequest(
            request_id=job_id if count == 1 else f"{job_id}-{i}", prompt_ids=prompt_ids,
            params=_choice_params(params, i), max_tokens=max_tokens,
            sink=sink.choice(i), stop=body.stop_list(), speculative=body.speculative, ignore_eos=body.ignore_eos,
            logprobs=0 if ranking and logprobs is None else logprobs, grammar=grammar, partition=partition,
            tenant=tenant, member=body.user or "",
        )
        for i in range(count)
    ]  # fmt: skip
    try:
        state.scheduler.submit_all(requests)
    except QueueFullError as exc:
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        raise ApiError(429, str(exc), type="rate_limit_error", code="queue_full", headers=headers) from None
    except SchedulerStoppedError as exc:
        raise ApiError(503, str(exc), type="server_error", code="shutting_down") from None
    except InvalidParameterError as exc:
        raise ApiError(400, str(exc), param=_field_named(str(exc)), code="invalid_value") from None
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Job(
        job_id, state.model_name, requests=requests, sink=sink, stream=body.stream, include_usage=include_usage,
        tokenizer=state.scheduler.tokenizer,
        choices=body.n, logprobs=logprobs is not None, grammar_param=grammar_param, tools=tools,
        harmony=state.harmony and kind is not None,
    )  # fmt: skip


SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "stop",
)  # fmt: skip


def _field_named(message: str) -> str | None:
    """The request field an engine message is about (they begin with its name: "seed must be ...")."""
    first = message.split(" ", 1)[0]
    return first if first in SAMPLING_FIELDS else None


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice i of a seeded request draws from seed + i: the choices differ, and each is reproducible (the
    same request gives the same n answers; choice 0 is what n = 1 gives)."""
    if params.seed is None or index == 0:
        return params
    try:
        return dataclasses.replace(params, seed=params.seed + index)
    except InvalidParameterError as exc:
        raise ApiError(400, f"choice {index}: {exc}", param="seed", code="invalid_value") from None


def _check_request(state: ServerState, body: CompletionRequest | ChatCompletionRequest) -> None:
    if state.draining:
        raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
    if body.model not in (None, state.model_name):
        named = body.model if len(body.model) <= 200 else body.model[:200] + "..."  # never echo megabytes
        raise ApiError(400, f"the model `{named}` does not exist", param="model", code="model_not_found")
    if problem := body.unsupported():
        raise ApiError(400, problem[1], param=problem[0], code="unsupported_parameter")
    try:
        check_stop(body.stop_list())
    except InvalidParameterError as exc:
        raise ApiError(400, str(exc), param="stop", code="invalid_value") from None
    if isinstance(body, ChatCompletionRequest) and len(body.messages) > state.most_messages():
        message = f"{len(body.messages)} messages cannot fit this model's context of {state.scheduler.max_model_len}"
        raise ApiError(400, message, param="messages", code="context_length_exceeded")
    room = state.scheduler.config.max_num_seqs + state.scheduler.config.max_queue
    if body.sequences() > room:
        param = "n" if body.sequences() == body.n else "best_of"
        message = f"{param} = {body.sequences()} needs as many slots and queue places; this server has {room}"
        raise ApiError(400, message, param=param, code="invalid_value")


def _max_tokens(
    state: ServerState, prompt_ids: list[int], default_max: int, requested: int | None, prompt_param: str
) -> int:
    """The request's max_tokens (default when absent); 400 when prompt + max_tokens overflow the context."""
    context = state.scheduler.max_model_len
    max_tokens = requested or max(1, min(default_max, context - len(prompt_ids)))
    try:  # the prompt alone leaves no room: it is the prompt's fault, whatever max_tokens
        state.scheduler.check_prompt(prompt_ids)
    except PromptTooLongError as exc:
        raise ApiError(400, str(exc), param=prompt_param, code="context_length_exceeded") from None
    except InvalidParameterError as exc:
        raise ApiError(400, str(exc), param=prompt_param, code="invalid_value") from None
    if len(prompt_ids) + max_tokens > context:
        held = " (what the server's KV cache budget holds)" if state.scheduler.context_cut else ""
        message = (
            f"this model's maximum context length is {context} tokens{held}; the request needs "
            f"{len(prompt_ids) + max_tokens} ({len(prompt_ids)} in the prompt, {max_tokens} for the completion)"
        )
        param = "max_tokens" if requested else prompt_param
        raise ApiError(400, message, param=param, code="context_length_exceeded")
    return max_tokens


async def _result(http_request: Request, state: ServerState, job: Job) -> tuple[list[GenerationOutput], float]:
    """Wait for every choice's output (in choice order) and the longest queue time; cancels the request if the
    client disconnects meanwhile."""
    loop = asyncio.get_running_loop()
    next_check = loop.time() + DISCONNECT_POLL_SECONDS
    outputs: dict[int, GenerationOutput] = {}
    queue_seconds = 0.0
    try:
        while len(outputs) < len(job.requests):
            with contextlib.suppress(TimeoutError):
                index, event = await asyncio.wait_for(job.sink.queue.get(), max(0.0, next_check - loop.time()))
                if isinstance(event, FinishEvent):
                    outputs[index] = event.output
                    queue_seconds = max(queue_seconds, event.queue_seconds)
                if isinstance(event, ErrorEvent):
                    raise event_error(event, job)
            if loop.time() >= next_check:
                if await http_request.is_disconnected():
                    raise ApiError(499, "client closed the request", code="client_closed")
                next_check = loop.time() + DISCONNECT_POLL_SECONDS
        return [outputs[i] for i in range(len(job.requests))], queue_seconds
    finally:
        _cancel(state, job)


def _cancel(state: ServerState, job: Job) -> None:
    for request in job.requests:
        state.scheduler.cancel(request.request_id)


def _sse(
    state: ServerState, job: Job, chunks: AsyncIterator, typed: bool = False, headers: dict[str, str] | None = None
) -> StreamingResponse:
    """Server-sent events: chunks as `data:` lines ending with [DONE] (chat and completions), or, `typed`, (event
    type, data) pairs as `event:` and `data:` lines (the Responses API)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                if typed:
                    kind, data = chunk
                    yield f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
                    continue
                if chunk is SSE_COMMENT:
                    yield f"{SSE_COMMENT}\n\n"
                    continue
                data = chunk if isinstance(chunk, dict) else chunk.model_dump()
                yield f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
            if not typed:
                yield "data: [DONE]\n\n"
        finally:  # also on cancellation when the client disconnects
            _cancel(state, job)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
