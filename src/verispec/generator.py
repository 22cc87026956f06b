"""The speculative decoding loop.

    prefill the target with the prompt (all but its last token); the drafter prefills itself
    while not done:
        draft k tokens (and their probabilities q)          drafter.propose
        run the target once over [pending, d1..dk]          k+1 positions -> p1..p(k+1)
        accept d1..dn by min(1, p/q), then one more token     acceptance.verify_*
        roll the target cache back to the accepted length   a length, not a copy
        emit the accepted tokens through the stop rules     StopChecker
        drafter.observe(n)

With no drafter the same loop is plain decoding: k = 0, one target pass per token.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .acceptance import verify_greedy, verify_sampled
from .adaptive import AdaptiveK
from .draft_head import draft_ids
from .drafters import DraftModelDrafter, HybridDrafter, NgramDrafter, Proposal
from .errors import InvalidParameterError, PromptTooLongError
from .loading import LoadedModel, load_model
from .quantize import default_draft_quantization
from .sampling import SamplingParams, probs_from_logits
from .stats import GenerationStats
from .stopping import StopChecker

DEFAULT_MAX_SEQ_LEN = 4096
DEFAULT_DRAFT_VOCAB = 65536  # a restricted draft head (draft_head.py); the CLI default, off in the API
# draft: a draft model; ngram: prompt lookup (no model); hybrid: prompt lookup where the context repeats
# itself, the draft model elsewhere
SPECULATIVE_METHODS = ("draft", "ngram", "hybrid")


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens or the context is full)
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)


@dataclass
class StreamChunk:
    text: str  # newly safe text, possibly empty (held back for a possible stop string)
    token_id: int | None  # the token this chunk comes from; None for a final flush
    output: GenerationOutput | None = None  # set on the last chunk only


class SpeculativeGenerator:
    """Target + optional draft. `draft=None` gives plain decoding through the very same loop."""

    def __init__(
        self,
        target: str | os.PathLike | LoadedModel = "target",
        draft: str | os.PathLike | LoadedModel | None = "draft",
        num_speculative_tokens: int = 4,
        dtype: str | torch.dtype = "float32",
        device: str | None = "cpu",
        max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
        progress: bool = True,
        quantization: str = "none",
        draft_quantization: str | None = None,
        speculative_method: str = "draft",
        adaptive: bool = True,
        draft_vocab: int | None = None,
    ):
        if speculative_method not in SPECULATIVE_METHODS:
            raise InvalidParameterError(
                f"unknown speculative method '{speculative_method}' (choose from {', '.join(SPECULATIVE_METHODS)})"
            )
        if speculative_method == "ngram":
            draft = None
        if speculative_method == "hybrid" and draft is None:
            raise InvalidParameterError("the hybrid speculative method needs a draft model")
        if (draft is not None or speculative_method == "ngram") and num_speculative_tokens < 1:
            raise InvalidParameterError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if draft_vocab is not None and draft_vocab < 0:
            raise InvalidParameterError(f"draft_vocab must be >= 0 (0 = the whole vocabulary), got {draft_vocab}")
        if max_seq_len < 2:
            raise InvalidParameterError(f"max_seq_len must be >= 2, got {max_seq_len}")
        self.target = (
            target if isinstance(target, LoadedModel) else load_model(target, dtype, device, progress, quantization)
        )
        self.tokenizer = self.target.tokenizer
        self.max_seq_len = min(max_seq_len, self.target.model.config.max_position_embeddings)
        speculates = draft is not None or speculative_method == "ngram"
        self.num_speculative_tokens = num_speculative_tokens if speculates else 0
        self.draft: LoadedModel | None = None
        if draft is not None:
            if draft_quantization is None:
                draft_quantization = default_draft_quantization(quantization)
            self.draft = (
                draft
                if isinstance(draft, LoadedModel)
                else load_model(draft, dtype, device, progress, draft_quantization)
            )
            self.tokenizer.check_compatible(self.draft.tokenizer)
            self.max_seq_len = min(self.max_seq_len, self.draft.model.config.max_position_embeddings)
        self.drafter = self._make_drafter(speculative_method, draft_vocab)
        # num_speculative_tokens is the most drafted per round; adaptive picks 0..that from measured costs
        self.adaptive = AdaptiveK(self.num_speculative_tokens) if adaptive and self.num_speculative_tokens else None
        self.target_cache = self.target.model.new_cache(num_slots=1, max_len=self.max_seq_len)

    def _make_drafter(
        self, method: str, draft_vocab: int | None
    ) -> DraftModelDrafter | NgramDrafter | HybridDrafter | None:
        if method == "ngram":
            return NgramDrafter()
        if self.draft is None:
            return None
        head_ids = draft_ids(draft_vocab, self.draft.model.config.vocab_size, self.tokenizer.stop_token_ids)
        model = DraftModelDrafter(self.draft.model, self.target.model.config.vocab_size, self.max_seq_len, head_ids)
        return HybridDrafter(model, NgramDrafter(min_ngram=HybridDrafter.MIN_MATCH)) if method == "hybrid" else model

    # ---- public API -------------------------------------------------------------------------------
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
    ) -> Iterator[StreamChunk]:
        """Yields one chunk per generated token; the last chunk carries the whole GenerationOutput.

        `prompt` is raw text, token ids, or chat messages ([{"role": ..., "content": ...}]) rendered
        with the model's chat template. `ignore_eos`: generate through end-of-sequence tokens up to
        max_tokens or a stop string (llama.cpp's --ignore-eos, vLLM's ignore_eos), for benchmarks.
        """
        params = SamplingParams(temperature, top_k, top_p, seed)
        if max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be >= 1, got {max_tokens}")
        prompt_ids = self.encode_prompt(prompt)
        return self._run(prompt_ids, params, StopChecker(self.tokenizer, max_tokens, stop, ignore_eos))

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
        if not ids:
            raise InvalidParameterError("prompt encodes to no tokens")
        if len(ids) + 1 > self.max_seq_len:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens; the context holds {self.max_seq_len} (prompt + at least 1 new)"
            )
        vocab = self.target.model.config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidParameterError(f"prompt token ids must be in [0, {vocab})")
        return ids

    # ---- the loop ---------------------------------------------------------------------------------
    def _run(self, prompt_ids: list[int], params: SamplingParams, stopper: StopChecker) -> Iterator[StreamChunk]:
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        rng = params.make_generator()
        tokens = list(prompt_ids)
        start = time.perf_counter()
        self._prefill(tokens, stats)
        drafter_ready = self.drafter is None
        while not stopper.finished:
            room = self.max_seq_len - len(tokens)
            if room < 0:
                yield StreamChunk(stopper.finish("length"), None)
                break
            k = min(self.num_speculative_tokens, room, stopper.max_tokens - len(stopper.token_ids) - 1)
            if self.adaptive is not None:
                k = min(k, self.adaptive.choose())
            if k > 0 and not drafter_ready:
                drafter_ready = self._prefill_drafter(prompt_ids, stats)
            proposal, draft_seconds = self._propose(tokens, k, params, rng, stats)
            (accepted, next_token), target_seconds = self._verify(tokens, proposal, params, rng, stats)
            drafted = proposal.tokens.shape[0]
            stats.record_round(drafted, accepted)
            if self.adaptive is not None:
                self.adaptive.record(drafted, accepted, draft_seconds, target_seconds)
            if self.drafter is not None:
                self.drafter.observe(accepted)
            for token in [*proposal.tokens[:accepted].tolist(), next_token]:
                tokens.append(token)
                is_stop_token = stopper.is_stop_token(token)
                piece = stopper.add(token)
                stats.new_tokens += not is_stop_token
                if piece or not is_stop_token:
                    yield StreamChunk(piece, None if is_stop_token else token)
                if stopper.finished:
                    break
            if not drafter_ready and not stopper.finished:  # after the first token has streamed
                drafter_ready = self._prefill_drafter(prompt_ids, stats)
        stats.time_total = time.perf_counter() - start
        text = stopper.text
        output = GenerationOutput(text, list(stopper.token_ids), stopper.finish_reason or "length", stats, prompt_ids)
        yield StreamChunk("", None, output)

    def _prefill(self, tokens: list[int], stats: GenerationStats) -> None:
        """The target's prefill. The drafter's comes after the first token (with adaptive k the first round is
        a plain step, so the first token streams without waiting for the draft model)."""
        begin = time.perf_counter()
        self.target_cache.set_length(0, 0)
        if len(tokens) > 1:
            self._target_forward(tokens[:-1], num_logits=1, invariant=False)
        stats.time_prefill = time.perf_counter() - begin

    def _prefill_drafter(self, prompt_ids: list[int], stats: GenerationStats) -> bool:
        begin = time.perf_counter()
        self.drafter.reset(prompt_ids)
        stats.time_prefill += time.perf_counter() - begin
        return True

    def _propose(self, tokens, k, params, rng, stats) -> tuple[Proposal, float]:
        if k <= 0 or self.drafter is None:
            return Proposal(torch.empty(0, dtype=torch.long), None), 0.0
        begin = time.perf_counter()
        proposal = self.drafter.propose(tokens, k, params, rng)
        seconds = time.perf_counter() - begin
        stats.time_draft += seconds
        return proposal, seconds

    def _verify(self, tokens, proposal: Proposal, params, rng, stats) -> tuple[tuple[int, int], float]:
        begin = time.perf_counter()
        pending = tokens[self.target_cache.lengths[0] :]
        k = proposal.tokens.shape[0]
        logits = self._target_forward(pending + proposal.tokens.tolist(), num_logits=k + 1)
        if params.greedy:
            accepted, next_token = verify_greedy(proposal.tokens, logits)
        else:
            accepted, next_token = verify_sampled(
                proposal.tokens, proposal.probs, probs_from_logits(logits, params), rng
            )
        self.target_cache.set_length(0, len(tokens) + accepted)
        seconds = time.perf_counter() - begin
        stats.time_target += seconds
        return (accepted, next_token), seconds

    def _target_forward(self, ids: list[int], num_logits: int, invariant: bool = True) -> torch.Tensor:
        model = self.target.model
        batch = torch.tensor([ids], dtype=torch.long, device=model.device)
        return model(batch, self.target_cache, [0], num_logits=num_logits, invariant=invariant)[0].cpu()
