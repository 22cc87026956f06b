"""`generate` and `stream`: one request at a time through the engine (engine/scheduler.py), in the calling
thread. The loop, the proposers and the draft-length rule are the server's own; this module only turns a
prompt into an engine request and the engine's events into StreamChunks.

With no draft model (and not the n-gram method) the engine decodes plainly: one target pass per token.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import torch

from .decoding.grammar import GrammarSpec
from .decoding.sampling import SamplingParams
from .defaults import DEFAULT_DRAFT_WINDOW, DEFAULT_MAX_SEQ_LEN
from .engine.budget import parse_memory
from .engine.default_drafter import DEFAULT_DRAFTER, load_with_drafter
from .engine.methods import resolve_method
from .engine.metrics import Unrecorded
from .engine.requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput, StreamChunk
from .engine.scheduler import Scheduler, SchedulerConfig
from .errors import InvalidParameterError, VerispecError
from .models.loading import LoadedModel

__all__ = ["GenerationOutput", "SpeculativeGenerator", "StreamChunk"]


class SpeculativeGenerator:
    """Target + optional draft. `draft=None` gives plain decoding through the very same loop; "auto" (the default)
    the drafter chosen for the target (engine/default_drafter.py)."""

    def __init__(
        self,
        target: str | os.PathLike | LoadedModel = "target",
        draft: str | os.PathLike | LoadedModel | None = DEFAULT_DRAFTER,
        *,
        num_speculative_tokens: int = 4,
        dtype: str | torch.dtype = "float32",
        device: str | None = "cpu",
        max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
        progress: bool = True,
        quantization: str = "none",
        draft_quantization: str | None = None,
        speculative_method: str | None = None,
        adaptive: bool = True,
        draft_vocab: int | None = None,
        draft_window: int = DEFAULT_DRAFT_WINDOW,
        token_trees: bool = False,
        kv_cache_memory: int | str | None = None,
        revision: str | None = None,
        pass_shape: str = "auto",
        compile_passes: bool = False,
    ):
        """`target`, `draft`: a model loaded, or a source (a path, a bundled name, a Hugging Face repo id, an Ollama
        name, an LM Studio key: models/names.py). `speculative_method`: a name of engine/methods.py; None: the chosen
        drafter's with draft "auto", its default (suffix) with a draft model, plain decoding without one.
        `adaptive`: the engine's draft policy picks k = 0..num_speculative_tokens per step from measured costs
        (engine/policy.py); False drafts num_speculative_tokens every step. `draft_window`: the draft model reads a
        long prompt's first tokens and its last `draft_window` only (0: all of it). `kv_cache_memory`:
        bytes (or "4GiB") the KV caches may take (engine/budget.py; None: the whole context, at most half the memory
        available). `revision`: the target's on the Hugging Face hub, where it is named by repo id. `token_trees`,
        `pass_shape`, `compile_passes`: SchedulerConfig's (token trees from lookups; models/pass_shape.py)."""
        method = resolve_method(speculative_method, draft is not None)  # engine/methods.py: the one verdict
        if method is None or not method.uses_draft_model:
            draft = None
        speculates = method is not None
        if speculates and num_speculative_tokens < 1:
            raise InvalidParameterError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if max_seq_len < 2:
            raise InvalidParameterError(f"max_seq_len must be >= 2, got {max_seq_len}")
        config = SchedulerConfig(  # before loading: its mistakes are reported before seconds of loading
            max_num_seqs=1, max_queue=0, max_model_len=max_seq_len,
            num_speculative_tokens=max(1, num_speculative_tokens),
            draft_policy=("auto" if adaptive else "always") if speculates else "never",
            speculative_method=None if method is None else method.name,
            method_options={} if draft_vocab is None else {"draft_vocab": draft_vocab}, draft_window=draft_window,
            prefill_chunk=max_seq_len,  # one request: its whole prompt in one pass
            token_trees=token_trees, pass_shape=pass_shape, compile_passes=compile_passes,
            kv_cache_memory=None if kv_cache_memory is None else parse_memory(kv_cache_memory),
        )  # fmt: skip
        loaded = load_with_drafter(
            speculative_method, target, draft, dtype=dtype, device=device, progress=progress,
            quantization=quantization, draft_quantization=draft_quantization, revision=revision,
        )  # fmt: skip
        self.target, self.draft, self.drafter = loaded.target, loaded.draft, loaded.drafter
        config.speculative_method = loaded.method.name if loaded.method is not None else None
        self.tokenizer = self.target.tokenizer
        self.num_speculative_tokens = num_speculative_tokens if speculates else 0
        self.engine = Scheduler(self.target, self.draft, config, Unrecorded())  # no /metrics to publish
        self.max_seq_len = self.engine.max_model_len
        self._ids = itertools.count()

    @property
    def speculates(self) -> bool:
        return self.engine.proposer is not None

    # ---- public API -------------------------------------------------------------------------------
    def forget_history(self) -> None:
        """Forget earlier requests' outputs (suffix drafting drafts from them): the next request meets the
        engine as a fresh one would, but for prompts it has prefilled."""
        self.engine.forget_history()

    def forget_prompts(self) -> None:
        """Reuse no prompt prefilled before: the next request is prefilled as by a fresh engine."""
        self.engine.forget_prompts()

    def generate(self, prompt: str | list[int] | list[dict], max_tokens: int = 128, **options) -> GenerationOutput:
        for chunk in self.stream(prompt, max_tokens, **options):
            if chunk.output is not None:
                return chunk.output
        raise AssertionError("stream ended without an output")

    def stream(
        self,
        prompt: str | list[int] | list[dict],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict[int, float] | None = None,
        logprobs: int | None = None,
        grammar: GrammarSpec | None = None,
    ) -> Iterator[StreamChunk]:
        """Yields one chunk per generated token; the last chunk carries the whole GenerationOutput.

        `prompt` is raw text, token ids, or chat messages ([{"role": ..., "content": ...}]) rendered
        with the model's chat template. `ignore_eos`: generate through end-of-sequence tokens up to
        max_tokens or a stop string (llama.cpp's --ignore-eos, vLLM's ignore_eos), for benchmarks.
        Generation stops at max_tokens or when the context is full (finish reason "length").
        `presence_penalty`, `frequency_penalty` and `logit_bias` adjust the logits as OpenAI's API does
        (decoding/adjustments.py); `logprobs=N` gives every token its logprob and its N most likely alternatives
        (decoding/logprobs.py), in each chunk and in the output. `grammar` (a GrammarSpec: a JSON schema, any JSON
        object, a regex, a Lark/GBNF grammar or a choice) keeps every token within it (decoding/grammar.py).
        """
        params = SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            logit_bias=dict(logit_bias or {}),
        )
        if max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be >= 1, got {max_tokens}")
        prompt_ids = self.encode_prompt(prompt)
        events: list = []
        room = self.max_seq_len - len(prompt_ids)  # a full context ends the request with "length"
        request = EngineRequest(
            request_id=f"generate-{next(self._ids)}", prompt_ids=prompt_ids, params=params,
            max_tokens=min(max_tokens, room), sink=events.append,
            stop=stop or [], ignore_eos=ignore_eos, logprobs=logprobs,
            grammar=self.engine.grammars.compile(grammar) if grammar is not None else None,
        )  # fmt: skip
        return self._run(request, events)

    def encode_prompt(self, prompt: str | list[int] | list[dict]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidParameterError("prompt is empty")
            ids = self.tokenizer.encode(prompt)
        elif prompt and all(isinstance(m, dict) for m in prompt):
            ids = self.tokenizer.encode_chat(prompt)
        elif prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise InvalidParameterError("prompt must be a non-empty string, token id list, or list of messages")
        self.engine.check_prompt(ids)
        return ids

    # ---- driving the engine -----------------------------------------------------------------------
    def _run(self, request: EngineRequest, events: list) -> Iterator[StreamChunk]:
        self._abandon_unfinished()  # a stream left unread must not hold the engine's only slot
        self.engine.submit(request)
        finished = False
        try:
            while not finished:
                if not self.engine.step():
                    raise AssertionError("the engine went idle before the request finished")
                for event in events:
                    if isinstance(event, StreamChunk):
                        yield event
                    elif isinstance(event, FinishEvent):
                        finished = True
                        yield StreamChunk("", None, event.output)
                    elif isinstance(event, ErrorEvent):
                        finished = True
                        raise event.error if isinstance(event.error, VerispecError) else VerispecError(event.message)
                events.clear()
        finally:
            if not finished:  # the caller stopped reading (or a step raised): free the slot
                self.engine.cancel(request.request_id)
                self._abandon_unfinished()

    def _abandon_unfinished(self) -> None:
        for request_id in list(self.engine.active):
            self.engine.cancel(request_id)
        while self.engine.running:
            self.engine.step()
