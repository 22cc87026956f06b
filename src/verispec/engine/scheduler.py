"""The engine: one loop of speculative decoding with continuous batching. `verispec serve` runs it in a
thread of its own for every request; `generate` and `bench` (SpeculativeGenerator) run its steps in the
calling thread for a batch of one. Each step, for all running sequences at once:

    admit waiting requests into free slots while the KV cache has room for their prompts, the tenant running the
        fewest sequences first (admission.py; budget.py); the rest of a sequence's blocks are taken as it writes,
        and where none is left the youngest sequence is preempted: it gives its blocks back and resumes later
    drop cancelled requests (their slots are free from this step on)
    prefill one chunk of one admitted prompt (what earlier prefills registered is taken instead: prefixes.py; the
        draft catches up when it drafts)
    decide how many tokens this step drafts (policy.DraftPolicy: k = 0..k_max, what pays at this batch size)
    draft k tokens for every sequence that may draft         methods.py: the method's proposer (drafting.py)
    cut each draft at the first token its grammar rejects   decoding/grammar.py (structured output)
    run the target ONCE over [pending, d1..dk] for all rows  models/passes.py: end to end on the native stack
    per sequence: adjust each row (logit_bias, penalties: decoding/adjustments.py) and mask it (its grammar), accept
        by acceptance.verify_*, roll its cache back to the accepted length, take logprobs if asked
    emit the accepted tokens one by one through its StopChecker; finished sequences leave

Requests join and leave between steps. A row's result does not depend on the other rows (see
models/passes.py), so a greedy request gets the same text whatever else runs beside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

import torch

from ..decoding.acceptance import verify_batch
from ..decoding.adjustments import LogitAdjustments
from ..decoding.grammar import GrammarCompiler, GrammarMatcher, start_with_grammar_stack
from ..decoding.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, token_logprobs
from ..decoding.noise import KeyedNoise
from ..decoding.sampling import keyed_draw
from ..decoding.stats import GenerationStats, proposer_name
from ..decoding.stopping import StopChecker, check_stop
from ..errors import InvalidParameterError, PromptTooLongError, VerispecError
from ..kernels.native import argmax_rows
from ..models.assistant import AssistantModel
from ..models.draft_head import draft_ids
from ..models.kv_cache import BLOCK_SIZE, CacheFullError, KVCache
from ..models.loading import LoadedModel
from ..models.model import Transformer
from ..models.mtp import mtp_config
from ..models.passes import pass_logits
from ..models.recurrent_state import RecurrentState
from .admission import WaitingQueue, fairness_victim
from .budget import cache_blocks
from .draft_model import CATCH_UP_WIDTH, BatchedDrafter, draft_cut_for, draft_view
from .drafting import DraftJob, LookupPricing, Proposal
from .methods import Setup, get_method, resolve_method
from .metrics import Metrics
from .policy import POLICIES, DraftPolicy, PolicySettings, StepCost, estimated_alpha
from .prefill_pacing import PrefillPacer
from .prefixes import PrefixBlocks, Prompt
from .proposer import Proposer
from .requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput, StreamChunk
from .suffix import DEFAULT_INDEX_TOKENS

log = logging.getLogger("verispec.server")


class QueueFullError(VerispecError):
    """All sequence slots are busy and the waiting queue is full."""


class SchedulerStoppedError(VerispecError):
    """The scheduler no longer accepts requests (shutting down)."""


DEFAULT_SLOT_TOKENS = 4096  # what the default KV budget holds per slot (less where the context is shorter)


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8  # sequences decoded together (cache slots)
    max_queue: int = 64  # requests waiting for a slot
    max_model_len: int | None = 4096  # prompt + generated tokens per sequence; None: the models' trained context
    num_speculative_tokens: int = 4
    draft_policy: str = "auto"  # auto | always | never (see policy.py)
    # a method of methods.py by name; None: its default with a draft model, plain decoding without one
    speculative_method: str | None = None
    draft_vocab: int | None = None  # the draft proposes only the first N ids and stop tokens (models/draft_head.py)
    prefill_chunk: int = 128  # prompt tokens prefilled per step, so running requests wait one chunk, not a prompt
    # the draft model reads at most this many of a prompt's last tokens (after its first DRAFT_SINK); 0: all of it
    draft_window: int = 0
    suffix_cache_tokens: int = DEFAULT_INDEX_TOKENS  # earlier requests' tokens the suffix drafter keeps
    # lookups may propose token trees, verified in one pass (suffix drafting; requests without penalties, on a
    # target that takes trees: Transformer.takes_trees). Off by default: measured not to pay (docs/repetition.md)
    token_trees: bool = False
    # register the blocks decoding fills, so that a next turn holding the answer prefills only what is new
    # (prefixes.py; on a row-invariant target)
    answer_reuse: bool = True
    # bytes the target's and the draft model's KV caches may take together (budget.py); None: DEFAULT_SLOT_TOKENS
    # per slot (or one whole context, if more), at most half the memory available at start
    kv_cache_memory: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_queue < 0 or (self.max_model_len is not None and self.max_model_len < 2):
            raise InvalidParameterError("need max_num_seqs >= 1, max_queue >= 0 and max_model_len >= 2")
        if self.prefill_chunk < 1:
            raise InvalidParameterError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.num_speculative_tokens < 1:
            raise InvalidParameterError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.speculative_method is not None:
            get_method(self.speculative_method)  # the registry as it is now: a method may be added at run time
        if self.draft_policy not in POLICIES:
            raise InvalidParameterError(f"draft_policy must be one of {', '.join(POLICIES)}, got {self.draft_policy!r}")
        if self.suffix_cache_tokens < 0:
            raise InvalidParameterError(f"suffix_cache_tokens must be >= 0, got {self.suffix_cache_tokens}")
        if self.draft_window < 0:
            raise InvalidParameterError(f"draft_window must be >= 0 (0 = the whole context), got {self.draft_window}")
        if self.draft_vocab is not None and self.draft_vocab < 0:
            raise InvalidParameterError(f"draft_vocab must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise InvalidParameterError(f"kv_cache_memory must be >= 1 byte, got {self.kv_cache_memory}")


@dataclass
class Sequence:
    request: EngineRequest
    slot: int
    tokens: list[int]  # prompt + generated; the target cache holds all but the last
    stopper: StopChecker
    stats: GenerationStats
    noise: KeyedNoise  # what a sampled token at each position is drawn with (decoding/noise.py)
    adjustments: LogitAdjustments
    grammar: GrammarMatcher | None  # the structured-output constraint's state after the emitted tokens
    admitted: float
    last_emit: float | None = None
    queue_seconds: float = 0.0
    prefilled: int = 0  # tokens of `context` (all but the last) in the target cache
    context: list[int] | None = None  # what its prefill reads: the prompt, or after a preemption all of `tokens`
    logprobs: list[TokenLogprob] | None = None  # the emitted tokens', when the request asks for them
    draft_cut: int = 0  # where the draft model's view of the context resumes after its sink (proposers.draft_cut_for)

    @property
    def draft_tokens(self) -> list[int] | None:
        """What the draft model reads of the context (None: all of it)."""
        return draft_view(self.tokens, self.draft_cut) if self.draft_cut else None

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prefill_ids) - 1

    @property
    def prefill_ids(self) -> list[int]:
        return self.request.prompt_ids if self.context is None else self.context


@dataclass
class Verdict:
    """What a verification pass decided for one sequence."""

    accepted: int  # drafted tokens kept
    next_token: int  # the target's own token after them
    logprobs: list[TokenLogprob] | None  # of the accepted tokens and the next one, when asked for
    path: list[int] | None = None  # a token tree's accepted tokens (a chain's are its first `accepted`)


class Scheduler:
    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None,
        config: SchedulerConfig | None = None,
        metrics: Metrics | None = None,
    ):
        self.config = config or SchedulerConfig()
        if isinstance(target.model, AssistantModel):
            raise InvalidParameterError(
                f"{target.name} is a Gemma 4 assistant, a drafter: give it as the speculative model of its Gemma 4 "
                "target with --speculative-method assistant"
            )
        self.target = target
        self.tokenizer = target.tokenizer
        self.metrics = metrics or Metrics()
        # the method (methods.py; None: plain decoding); a draft model it does not use is not used
        self.method = resolve_method(self.config.speculative_method, draft is not None)
        if self.method is None or not self.method.uses_draft_model:
            draft = None
        limits = [target.model.config.max_position_embeddings]
        if self.config.max_model_len is not None:
            limits.append(self.config.max_model_len)
        if draft is not None:
            self._check_assistant(draft)
            self.tokenizer.check_compatible(draft.tokenizer)
            limits.append(draft.model.config.max_position_embeddings)
            if draft.model.config.hybrid:
                raise InvalidParameterError(
                    "a draft model with linear-attention layers (Qwen3.5) is not supported: its cache is forked and "
                    "rolled back to any length, which a recurrent state is not; draft with the target's own MTP layer "
                    "(--speculative-method mtp), lookups (suffix, ngram), or a draft model without such layers"
                )
        self.max_model_len = min(limits)
        vocabs = [target.model.config.vocab_size] + ([draft.model.config.vocab_size] if draft is not None else [])
        self.vocab_size = min(vocabs)  # token ids both models can embed
        self._allocate_caches(target, draft)
        self.grammars = GrammarCompiler(self.tokenizer, target.model.config.vocab_size)  # for EngineRequest.grammar
        mode = self.config.draft_policy if self.proposer is not None else "never"
        self.policy = DraftPolicy(PolicySettings(k_max=self.config.num_speculative_tokens, mode=mode))
        self.running: dict[int, Sequence] = {}
        self.free_slots = list(range(self.config.max_num_seqs))
        # requests, and sequences preempted to give their blocks back, per tenant (admission.py)
        self.waiting: WaitingQueue[EngineRequest | Sequence] = WaitingQueue()
        self.waiting_for_blocks = False  # the next waiting request does not fit the KV cache now
        self._first: tuple[EngineRequest | Sequence, Prompt] | None = None  # the next one's prompt, as keys
        self.active: dict[str, EngineRequest] = {}  # waiting or running, by request id
        self.cond = threading.Condition()
        self.preempted_in_step = False  # a sequence was preempted in this step (its costs are not the policy's)
        self.thread: threading.Thread | None = None
        self.stopping = False

    def _check_assistant(self, draft: LoadedModel) -> None:
        """A drafter that reads its target (Gemma 4's assistant) drafts by the method made for it, and only it does."""
        reads_target = isinstance(draft.model, AssistantModel)
        if reads_target != self.method.draft_reads_target:
            wanted = "is a Gemma 4 assistant: draft with it by" if reads_target else "is not a Gemma 4 assistant, which"
            needs = "" if reads_target else " needs"
            raise InvalidParameterError(f"the speculative model {wanted}{needs} --speculative-method assistant")

    def _allocate_caches(self, target: LoadedModel, draft: LoadedModel | None) -> None:
        """The caches of both models, paged (models/kv_cache.py) in as many blocks each as the budget pays for
        (budget.py). A sequence may hold up to max_model_len positions and the room padded rows take past its last
        real one (verify rows are k+1 wide, draft catch-up rows up to CATCH_UP_WIDTH); where the budget holds fewer
        for one sequence, the context is cut to what it holds."""
        k, slots = self.config.num_speculative_tokens, self.config.max_num_seqs
        # the most tokens a sequence's proposal holds: what its verify rows and its cache reserve room for
        self.widest = self.method.widest(k) if self.method is not None else k
        drafting = draft is not None
        block_bytes = KVCache.block_bytes(target.model.config, target.model.cache_dtype)
        if drafting:
            block_bytes += KVCache.block_bytes(draft.model.config, draft.model.cache_dtype)
        if self.method is not None and self.method.target_drafts:  # the MTP layer's one layer of keys and values
            block_bytes += KVCache.block_bytes(mtp_config(target.model.config), target.model.cache_dtype)
        # the default budget: each slot's DEFAULT_SLOT_TOKENS, and at least one whole context (blocks are taken as
        # written, so one long request may use what many short ones would)
        wanted = max(slots * _blocks(min(self.max_model_len, DEFAULT_SLOT_TOKENS) + self.widest + 1),
                     _blocks(self.max_model_len + self.widest + 1))  # fmt: skip
        num_blocks = cache_blocks(self._block_budget(target), wanted, block_bytes, target.model.device)
        held = num_blocks * BLOCK_SIZE - self.widest - 1  # the longest context one sequence can have
        self.context_cut = held < self.max_model_len  # the budget, not the models or max_model_len, sets it
        if held < 2:
            budget = num_blocks * block_bytes if self.config.kv_cache_memory is None else self.config.kv_cache_memory
            raise InvalidParameterError(
                f"a KV cache budget of {budget} bytes holds {num_blocks} blocks of {BLOCK_SIZE} "
                f"tokens ({block_bytes} bytes each, both models): too few for a sequence; give at least "
                f"{-(-(self.widest + 3) // BLOCK_SIZE) * block_bytes} bytes"
            )
        if self.context_cut:
            log.warning("the KV cache budget holds %d tokens: the context is cut from %d to %d tokens",
                        num_blocks * BLOCK_SIZE, self.max_model_len, held)  # fmt: skip
            self.max_model_len = held
        self.cache = target.model.new_cache(slots, self.max_model_len + self.widest + 1, num_blocks)
        # prefill reuse (prefixes.py): to the token where the target's passes are row-invariant (the native stack);
        # none on a hybrid model (a block's keys without the recurrent state at its end are of no use)
        invariant = target.model.fused_blocks is not None
        self.prefixes = PrefixBlocks(
            self.cache, None if invariant else self.config.prefill_chunk, answers=self.config.answer_reuse,
            reuse=not target.model.config.hybrid,
        )  # fmt: skip
        # blocks taken as they are written, a sequence preempted where none is left: where a prefill of its tokens
        # writes the bits decoding wrote (row-invariant passes), so that a resumed sequence goes on exactly; else
        # each request reserves its whole length when admitted
        self.on_demand = invariant
        # how prefill shares the loop with others' decoding; its chunks cut anywhere where passes are row-invariant
        self.pacer = PrefillPacer(self.config.prefill_chunk, resizable=invariant and not target.model.config.hybrid)
        model = None
        if drafting and self.method.draft_reads_target:  # no cache of its own: it reads the target's
            self.proposer = self._build_proposer(target, None, num_blocks, assistant=draft.model)
            return
        if drafting:
            vocab = target.model.config.vocab_size
            draft_len = self.max_model_len + max(k, CATCH_UP_WIDTH) + 1
            ids = draft_ids(self.config.draft_vocab, draft.model.config.vocab_size, self.tokenizer.stop_token_ids)
            model = BatchedDrafter(
                draft.model, vocab, num_slots=slots, max_len=draft_len, head_ids=ids, num_blocks=num_blocks
            )
        self.proposer = self._build_proposer(target, model, num_blocks)

    def _build_proposer(
        self, target: LoadedModel, model: BatchedDrafter | None, num_blocks: int, assistant: Transformer | None = None
    ) -> Proposer | None:
        """The method's proposer (None: plain decoding), over the draft model `model` where it uses one, or the
        `assistant` that reads the target."""
        target.model.hidden_sink = None  # an earlier engine's drafter on the same model reads no more
        if self.method is None:
            return None
        setup = Setup(
            model=model,
            slots=self.config.max_num_seqs,
            suffix_cache_tokens=self.config.suffix_cache_tokens,
            target=target.model,
            max_len=self.max_model_len + self.widest + 1,
            num_blocks=num_blocks,
            draft_vocab=self.config.draft_vocab,
            stop_ids=frozenset(self.tokenizer.stop_token_ids),
            assistant=assistant,
            cache=self.cache,
        )
        return self.method.build(setup)

    def _block_budget(self, target: LoadedModel) -> int | None:
        """What --kv-cache-memory leaves for the KV blocks (None: the default budget): a hybrid model's recurrent
        state is taken first, for every slot at every length a verify pass keeps (models/recurrent_state.py)."""
        budget, config = self.config.kv_cache_memory, target.model.config
        if budget is None or not config.hybrid:
            return budget
        # a verify pass's rows' states in one of two tensors per slot and layer, and a prefill's last state
        states = self.config.max_num_seqs * (2 * (self.widest + 1) + 1) * RecurrentState.slot_bytes(config)
        if budget <= states:
            raise InvalidParameterError(
                f"a KV cache budget of {budget} bytes does not hold the linear-attention state: {states} bytes for "
                f"{self.config.max_num_seqs} sequences at up to {2 * (self.widest + 1) + 1} lengths each"
            )
        return budget - states

    # ---- any thread ---------------------------------------------------------------------------------
    def kv_cache_bytes(self) -> tuple[int, int]:
        """The most the target's and the draft model's KV caches may take (they take it as blocks are used)."""
        model = self.proposer.drafter if self.proposer is not None else None  # lookups alone keep no cache
        return self.cache.nbytes(), model.cache.nbytes() if model is not None else 0

    def _context(self) -> str:
        held = " (what the KV cache budget holds)" if self.context_cut else ""
        return f"the context of {self.max_model_len}{held}"

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """A prompt both models can read that leaves room for a new token; raises InvalidParameterError or
        PromptTooLongError (the one check of `generate` and `serve`)."""
        if not prompt_ids:
            raise InvalidParameterError("the prompt encodes to no tokens")
        if len(prompt_ids) >= self.max_model_len:  # first: a million ids are refused without reading them
            held = " (what the KV cache budget holds)" if self.context_cut else ""
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {self.max_model_len}{held} "
                "(prompt + at least 1 new token)"
            )
        if not 0 <= min(prompt_ids) <= max(prompt_ids) < self.vocab_size:
            raise InvalidParameterError(f"prompt token ids must be in [0, {self.vocab_size})")

    def submit(self, request: EngineRequest) -> None:
        self.submit_all([request])

    def submit_all(self, requests: list[EngineRequest]) -> None:
        """Queue all of `requests` (a request's n choices) or, when they do not all fit, none."""
        for request in requests:
            self._check(request)
        with self.cond:
            if self.stopping:
                raise SchedulerStoppedError("the server is shutting down")
            if len(self.active) + len(requests) > self.config.max_num_seqs + self.config.max_queue:
                raise QueueFullError(
                    f"{self.config.max_num_seqs} requests running and {self.config.max_queue} waiting; retry later"
                )
            for request in requests:
                self.active[request.request_id] = request
                self.waiting.append(request, request.owner, request.arrival)
            self._update_gauges()
            self.cond.notify()

    def _check(self, request: EngineRequest) -> None:
        if request.max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be >= 1, got {request.max_tokens}")
        check_stop(request.stop)
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidParameterError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {request.logprobs}")
        logits_width = self.target.model.config.vocab_size
        if any(token >= logits_width for token in request.params.logit_bias):
            raise InvalidParameterError(f"logit_bias token ids must be in [0, {logits_width})")
        total = len(request.prompt_ids) + request.max_tokens
        if total > self.max_model_len:
            raise PromptTooLongError(f"prompt + max_tokens = {total} tokens exceeds {self._context()}")

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client went away); a waiting one leaves at once, a running one before the next step."""
        with self.cond:
            request = self.active.get(request_id)
            if request is None:
                return
            request.cancelled = True
            waiting = next((item for item in self.waiting if _request_of(item) is request), None)
            if waiting is not None:
                self.waiting.remove(waiting)
                del self.active[request_id]
                self.metrics.record_finish("cancelled", time.perf_counter() - request.arrival)
                self._update_gauges()
            self.cond.notify()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="verispec-scheduler", daemon=True)
        start_with_grammar_stack(self.thread)  # it steps grammar matchers, whose library recurses

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still waiting or running get an error event."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join(timeout)
        self._fail_all("the server is shutting down")

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # ---- the scheduler thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and not self.waiting and not self.running:
                    self.cond.wait(timeout=1.0)
                if self.stopping:
                    return
            try:
                self.step()
            except Exception:
                log.exception("scheduler step failed; failing the running requests")
                self._fail_all("internal error in the scheduler (see the server log)")

    def forget_history(self) -> None:
        """Forget what earlier requests wrote (the suffix drafter's index); prefilled prompts stay reusable."""
        if self.proposer is not None:
            self.proposer.forget(history=True, prompts=False)

    def forget_prompts(self) -> None:
        """Reuse no prompt prefilled before, the target's or the draft model's: the next request is prefilled as
        a fresh engine would (the bench's rule, docs/bench.md). Only while nothing runs."""
        self.prefixes.forget()
        if self.proposer is not None:
            self.proposer.forget(history=False, prompts=True)

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        """Run steps in the calling thread until nothing is waiting or running (for tests and tools)."""
        for _ in range(max_steps):
            if not self.step():
                return
        raise RuntimeError(f"still busy after {max_steps} steps")

    def step(self) -> bool:
        """Admit, then one round for every running sequence. False when there was nothing to do."""
        self._drop_cancelled()  # first: a cancelled sequence gives its slot back rather than being preempted
        self._admit()
        self.preempted_in_step = False
        if not self.running:
            return False
        self._prefill_chunk()
        seqs = [seq for seq in self.running.values() if not seq.prefilling]
        if not seqs:
            return True
        limits = [self._draft_length(seq) for seq in seqs]
        records = [self._model_record(seq) for seq in seqs]
        ks = self._choose_ks(seqs, limits, records)
        begin = time.perf_counter()
        proposals = self._propose(seqs, ks, limits, records)
        masks = self._constrain(seqs, proposals)
        if self.on_demand:
            self._make_room(seqs, proposals)
        drafted = time.perf_counter()
        verdicts = self._verify(seqs, proposals, masks)
        verified = time.perf_counter()
        self.pacer.decoded(verified - begin)
        self._record_step(
            len(seqs), ks, proposals=proposals, draft_seconds=drafted - begin, verify_seconds=verified - drafted
        )
        for seq, proposal, verdict in zip(seqs, proposals, verdicts, strict=True):
            if verdict is None:  # the sequence failed this step (and has left)
                continue
            seq.stats.time_draft += drafted - begin
            seq.stats.time_target += verified - drafted
            self._guarded(seq, partial(self._advance, seq, proposal, verdict))
        with self.cond:
            self._update_gauges()
        return True

    def _choose_ks(self, seqs: list[Sequence], limits: list[int], records: list[tuple[int, int]]) -> list[int]:
        """Each sequence's k this step: the policy's one k for the batch (DraftPolicy.choose_k), within each
        sequence's limit."""
        eligible = [i for i, limit in enumerate(limits) if limit]
        # k governs the draft model: its own acceptance, not the lookups' (copied text is accepted far more often)
        acceptance = [self.policy.acceptance(*records[i]) for i in eligible]
        lags = [self.proposer.lag(seqs[i].slot, seqs[i].tokens, seqs[i].draft_tokens) for i in eligible]
        evidence = self.policy.settings.evidence_tokens
        young = [(n, self._tokens_left(seqs[i])) for i, lag in zip(eligible, lags, strict=True)
                 if lag and (n := len(seqs[i].stopper.token_ids)) < evidence]  # fmt: skip
        # the tokens still to come: the lookups' expected share of them, which the draft model must read before
        # it drafts again, and the rest, which it would draft
        left = [(self._expected_left(seqs[i]), self._coverage(seqs[i])) for i in eligible]
        # a burst is starting: a prompt still prefills, or waits for a free slot (over HTTP a burst's later
        # requests arrive while the first prefills, after this step's admission)
        with self.cond:
            joining = len(seqs) < len(self.running) or bool(
                self.waiting and self.free_slots and not self.waiting_for_blocks
            )
        resting = self.policy.exploring.resting
        k = self.policy.choose_k(
            len(seqs), acceptance, [limits[i] for i in eligible], lag_tokens=sum(lags), joining=joining,
            remaining_tokens=sum(tokens * (1 - share) for tokens, share in left),
            covered_tokens=sum(tokens * share for tokens, share in left), young=young,
        )  # fmt: skip
        if self.policy.exploring.resting != resting and self.proposer.drafter is not None:
            self._log_rest(len(seqs))
        return [min(k, limit) for limit in limits]

    def _log_rest(self, batch: int) -> None:
        """One line when the draft model starts or stops resting, with what decided it."""
        policy = self.policy
        plain, drafting = policy.seconds(batch, 0, 0), policy.seconds(batch, batch, 1)
        log.info(
            "draft model %s at %d sequences: acceptance %.2f (server-wide), step %s s plain, %s s drafting 1; "
            "%d trials so far",
            "resting" if policy.exploring.resting else "drafting again", batch, policy.acceptance(0, 0),
            f"{plain:.4f}" if plain is not None else "?", f"{drafting:.4f}" if drafting is not None else "?",
            policy.exploring.trials,
        )  # fmt: skip

    def _record_step(
        self, batch: int, ks: list[int], proposals: list[Proposal | None], draft_seconds: float, verify_seconds: float
    ) -> None:
        """The step's costs, for the policy's prices and the metrics."""
        spent = self.proposer.spent if any(ks) else None
        caught_up = (spent.catch_up_seconds, spent.catch_up_tokens) if spent is not None else (0.0, 0)
        drafting = sum(1 for k in ks if k)
        widest = max((p.tokens.shape[0] for p in proposals if p is not None), default=0)
        # a longer lookup's verify pass is not what the policy's k costs, nor one a preemption took rows out of
        if widest <= max(ks) and not self.preempted_in_step:
            self._record_costs(
                StepCost(batch=batch, drafting=drafting, k=max(ks), draft_seconds=draft_seconds,
                         verify_seconds=verify_seconds, catch_up_seconds=caught_up[0], catch_up_tokens=caught_up[1],
                         modelled=spent is not None and spent.modelled)
            )  # fmt: skip
        log.debug(
            "step: %d sequences, k = %d for %d, draft %.3f s (catch-up %.3f s, %d tokens), verify %.3f s",
            batch, max(ks), drafting, draft_seconds, *caught_up, verify_seconds,
        )  # fmt: skip

    def _guarded(self, seq: Sequence, work, *args):
        """`work(*args)` for one sequence (a call of more arguments: a partial); if it raises, that sequence
        alone fails (its client gets the error) and None is returned: one request's bad row (a grammar past the
        library's limits, a NaN) never fails the requests beside it."""
        try:
            return work(*args)
        except Exception as exc:
            self._fail_sequence(seq, exc)
            return None

    def _fail_sequence(self, seq: Sequence, exc: Exception) -> None:
        if seq.slot not in self.running or self.running[seq.slot] is not seq:
            return  # already gone
        if isinstance(exc, InvalidParameterError):
            log.info("request %s failed: %s", seq.request.request_id, exc)
            event = ErrorEvent(str(exc), exc)
        else:
            log.exception("request %s failed in the scheduler; the others go on", seq.request.request_id)
            event = ErrorEvent("internal error in the scheduler (see the server log)")
        self._release(seq, "error")
        seq.request.sink(event)

    def _record_costs(self, cost: StepCost) -> None:
        self.policy.record(cost)
        self.metrics.record_step(cost, self.policy)

    def _admit(self) -> None:
        """Admit waiting requests (and preempted sequences) while a slot is free and the KV cache has room, the tenant
        running the fewest sequences first (admission.py). A request reserves the blocks its prompt and its first
        step's rows need, less those it shares with earlier prompts (without on-demand blocks: its whole length); the
        rest it takes as it writes (_make_room), and admission leaves a block per running sequence for that. Where the
        next one does not fit it waits, and those behind it, unless its tenant runs at least two sequences fewer
        than another: then that tenant's youngest sequence is preempted to make room."""
        while True:
            with self.cond:
                self.waiting_for_blocks = False
                found = self.waiting.first(self._running_per_owner())
                if found is None:
                    self._first = None
                    return
            item, tenant = found
            prompt = self._prompt_of(item)
            shared = self.prefixes.shared_run(prompt)
            reserve = self._blocks_needed(item) - len(shared)
            idle = sum(1 for block in shared if not self.cache.pool.refs[block])  # taking them leaves fewer
            headroom = len(self.running) if self.on_demand else 0
            fits = reserve + idle + headroom <= self.cache.pool.available()
            if not (self.free_slots and fits):
                if self._preempt_for(tenant):
                    continue
                self.waiting_for_blocks = bool(self.free_slots)
                return
            with self.cond:
                if not self.waiting.remove(item):  # cancelled meanwhile
                    continue
                slot = self.free_slots.pop(0)
            self._place(item, slot, prompt=prompt, shared=shared, reserve=reserve)

    def _place(
        self, item: EngineRequest | Sequence, slot: int, prompt: Prompt, shared: list[int], reserve: int
    ) -> None:
        request = _request_of(item)
        try:
            if isinstance(item, Sequence):
                self._resume(item, slot, prompt=prompt, shared=shared, reserve=reserve)
            else:
                self._start_sequence(item, slot, prompt=prompt, shared=shared, reserve=reserve)
        except Exception:  # this request alone fails; the running ones go on
            log.exception("could not start request %s", request.request_id)
            self._free(request, slot, "error")
            request.sink(ErrorEvent("internal error starting the request (see the server log)"))

    def _prompt_of(self, item: EngineRequest | Sequence) -> Prompt:
        """The next waiting item's context as the prefix cache keys it (kept while it stays the next)."""
        if self._first is None or self._first[0] is not item:
            request = _request_of(item)
            tokens = list(item.tokens) if isinstance(item, Sequence) else request.prompt_ids  # a copy: tokens grow
            self._first = (item, self.prefixes.prompt(tokens, request.partition))
        return self._first[1]

    def _running_per_owner(self) -> Counter[tuple[str, str]]:
        """Sequences running per (tenant, member) (admission.py)."""
        return Counter(seq.request.owner for seq in self.running.values())

    def _blocks_needed(self, item: EngineRequest | Sequence) -> int:
        """The target cache's blocks a request reserves when admitted: its context and its first step's padded rows;
        without on-demand blocks, its prompt, max_tokens and the padded rows past them."""
        if isinstance(item, Sequence):
            positions = len(item.tokens) + self.widest + 1
        else:
            positions = len(item.prompt_ids) + self.widest + 1 + (0 if self.on_demand else item.max_tokens)
        return self.cache.blocks_for(min(positions, self.cache.max_len))

    def _preempt_for(self, tenant: str) -> bool:
        """Preempt the youngest sequence of the tenant running the most, where `tenant` (whose request is next) runs
        at least two fewer (admission.fairness_victim); False where none is."""
        if not self.on_demand:
            return False
        victim = fairness_victim(tenant, self._running_per_owner())
        if victim is None:
            return False
        self._preempt(max((seq for seq in self.running.values() if seq.request.tenant == victim),
                          key=lambda seq: seq.admitted))  # fmt: skip
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Take a running sequence out to give its blocks back. What it decoded stays registered (prefixes.py) and its
        state is kept (tokens, stop checker, grammar, noise, statistics); it waits first of its tenant's to be admitted
        again, then prefills its whole context, taking whatever of it is still registered. Its output does not
        change: on a row-invariant model a prefill writes the bits its decoding wrote."""
        self.preempted_in_step = True
        if seq.request.cancelled:  # its client left: it ends here
            self._release(seq, "cancelled")
            return
        self.prefixes.decoded(seq.slot, seq.tokens)
        self.cache.release(seq.slot)
        self.prefixes.finish(seq.slot)
        self.metrics.preemptions.inc()
        log.info("request %s preempted to free KV blocks (resumes later)", seq.request.request_id)
        with self.cond:
            self.running.pop(seq.slot, None)
            self.free_slots.append(seq.slot)
            self.waiting.appendleft(seq, seq.request.owner, seq.request.arrival)
            self._update_gauges()

    def _start_sequence(
        self, request: EngineRequest, slot: int, prompt: Prompt, shared: list[int], reserve: int
    ) -> None:
        now = time.perf_counter()
        seq = Sequence(
            request=request,
            slot=slot,
            tokens=list(request.prompt_ids),
            stopper=StopChecker(self.tokenizer, request.max_tokens, request.stop, request.ignore_eos),
            stats=GenerationStats(prompt_tokens=len(prompt.tokens)),
            noise=request.params.noise(self.target.model.config.vocab_size),
            adjustments=LogitAdjustments(request.params, self.target.model.config.vocab_size),
            grammar=request.grammar.matcher() if request.grammar is not None else None,
            admitted=now,
            queue_seconds=now - request.arrival,
            logprobs=[] if request.logprobs is not None else None,
            draft_cut=draft_cut_for(len(prompt.tokens), self.config.draft_window),
        )
        self.running[slot] = seq
        self.metrics.prompt_tokens.inc(len(prompt.tokens))
        seq.prefilled = self.prefixes.admit(slot, prompt, shared, reserve)
        if self.proposer is not None:
            self.proposer.admit(slot, request.partition)
        self._count_reused(seq, seq.prefilled)

    def _resume(self, seq: Sequence, slot: int, prompt: Prompt, shared: list[int], reserve: int) -> None:
        seq.slot, seq.context = slot, prompt.tokens
        self.running[slot] = seq
        seq.prefilled = self.prefixes.admit(slot, prompt, shared, reserve)
        if self.proposer is not None:
            self.proposer.admit(slot, seq.request.partition)

    def _make_room(self, seqs: list[Sequence], proposals: list[Proposal | None]) -> None:
        """Blocks for every sequence's rows of this step (its pending token and drafts), taken before the pass; where
        the pool has none left, the youngest running sequence is preempted (its proposal dropped), the sequence
        itself where it is the youngest."""
        for i, seq in enumerate(seqs):
            if proposals[i] is None:
                continue
            end = min(len(seq.tokens) + proposals[i].tokens.shape[0], self.cache.max_len)
            while True:
                try:
                    self.cache.ensure(seq.slot, end)
                    break
                except CacheFullError:
                    victim = max(self.running.values(), key=lambda other: other.admitted)
                    if victim in seqs:
                        proposals[seqs.index(victim)] = None
                    self._preempt(victim)
                    if victim is seq:
                        break

    def _prefill_chunk(self) -> None:
        """The next chunk of the prompt with the fewest tokens left to prefill (a short request is not held behind
        long ones; the earliest admitted on a tie); before it, and for every other prompt still prefilling, what
        other prefills registered meanwhile is taken (prefixes.py). While another owner decodes, the chunk may wait or
        be cut short (prefill_pacing.py), only where that changes no bit: a request's cache (and its greedy output)
        does not depend on its neighbours."""
        prefilling = [seq for seq in self.running.values() if seq.prefilling]
        for seq in prefilling:
            end = self.prefixes.reuse(seq.slot, seq.prefilled)
            self._count_reused(seq, end - seq.prefilled)
            seq.prefilled = end
        left = [seq for seq in prefilling if seq.prefilling]
        if left:
            seq = min(left, key=lambda seq: (len(seq.prefill_ids) - seq.prefilled, seq.admitted))
            contended = self._contended(seq)
            if not self.pacer.waits(contended):
                self._guarded(seq, self._compute_chunk, seq, contended)

    def _contended(self, seq: Sequence) -> bool:
        """Whether a sequence of another owner than `seq`'s (tenant and member) is decoding (prefill_pacing.py)."""
        return any(other.request.owner != seq.request.owner for other in self.running.values() if not other.prefilling)

    def _count_reused(self, seq: Sequence, tokens: int) -> None:
        """Prompt tokens taken from the prefix cache (a resumed sequence's own context is not its prompt)."""
        if seq.context is None:
            seq.stats.cached_tokens += tokens
            self.metrics.prefill_reused_tokens.inc(tokens)

    def _compute_chunk(self, seq: Sequence, contended: bool) -> None:
        begin = time.perf_counter()
        end = min(seq.prefilled + self.pacer.tokens(contended), len(seq.prefill_ids) - 1)
        chunk = seq.prefill_ids[seq.prefilled : end]
        ids = torch.tensor([chunk], dtype=torch.long, device=self.target.model.device)
        self.target.model(ids, self.cache, [seq.slot], num_logits=1, invariant=False)
        self.prefixes.computed(seq.slot, seq.prefilled, end)
        seq.prefilled = end
        seconds = time.perf_counter() - begin
        seq.stats.time_prefill += seconds
        self.policy.record_prefill(seconds, len(chunk))
        self.pacer.prefilled(seconds, len(chunk), contended)

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.running.values() if s.request.cancelled]:
            self._release(seq, "cancelled")

    def _draft_length(self, seq: Sequence) -> int:
        if self.proposer is None or not seq.request.speculative:
            return 0
        return max(0, min(self.config.num_speculative_tokens, self._tokens_left(seq) - 1))

    def _widest(self, seq: Sequence) -> int:
        """The most tokens the sequence's proposal may hold this step: the method's widest (what its cache reserves
        room for), within the tokens it may still generate."""
        return max(0, min(self.widest, self._tokens_left(seq) - 1))

    def _coverage(self, seq: Sequence) -> float:
        """The share of the sequence's tokens still to come that its lookups are expected to give."""
        return self.policy.lookup_coverage(seq.stats.accepted_by_lookup, seq.stats.new_tokens)

    def _expected_left(self, seq: Sequence) -> float:
        """The tokens the sequence is expected to write still, from earlier answers (DraftPolicy.expected_left)."""
        return self.policy.expected_left(len(seq.stopper.token_ids), self._tokens_left(seq))

    def _tokens_left(self, seq: Sequence) -> int:
        """The most tokens the sequence may still generate (max_tokens, or the context, whichever ends first)."""
        return min(self.max_model_len - len(seq.tokens) + 1, seq.request.max_tokens - len(seq.stopper.token_ids))

    @staticmethod
    def _model_record(seq: Sequence) -> tuple[int, int]:
        """The sequence's accepted drafts and rejections of the draft model's rounds (its lookups' taken out)."""
        model = seq.stats.by_proposer()["model"]
        return model.accepted, model.rejected

    def _propose(
        self, seqs: list[Sequence], ks: list[int], limits: list[int], records: list[tuple[int, int]]
    ) -> list[Proposal | None]:
        """Each sequence's proposal (empty where k = 0, but for a proposer's lookups, which cost nothing to draft
        and are priced by the rows they add: the policy's k governs the draft model only; None where the sequence
        failed). A batched propose that raises is run again job by job, so only the job that raises fails (the
        drafter's slots stay consistent: what each holds is recorded only after its forward); a proposal wider than
        its job allows fails its own sequence (its rows would overrun the room reserved for it)."""
        looks_up = self.proposer is not None and self.proposer.looks_up and self.policy.settings.mode != "never"
        jobs = [
            (i, self._job(seq, k, records[i]))
            for i, (seq, k, limit) in enumerate(zip(seqs, ks, limits, strict=True))
            if k or (looks_up and limit)
        ]
        proposals: list[Proposal | None] = [Proposal(torch.empty(0, dtype=torch.long))] * len(seqs)
        if not jobs:
            return proposals
        if looks_up:
            self._price_lookups(seqs, ks, jobs)
        try:
            for (i, _), proposal in zip(jobs, self.proposer.propose([job for _, job in jobs]), strict=True):
                proposals[i] = proposal
        except Exception:
            log.debug("a batched propose raised; proposing job by job", exc_info=True)
            for i, job in jobs:
                result = self._guarded(seqs[i], self.proposer.propose, [job])
                proposals[i] = result[0] if result is not None else None
        for i, job in jobs:
            if proposals[i] is not None and self._guarded(seqs[i], _check_width, job, proposals[i]) is None:
                proposals[i] = None
        return proposals

    def _job(self, seq: Sequence, k: int, record: tuple[int, int]) -> DraftJob:
        return DraftJob(
            slot=seq.slot, tokens=seq.tokens, k=k, most=self._widest(seq), params=seq.request.params,
            noise=seq.noise, adjustments=seq.adjustments, grammar=seq.grammar, model_tokens=seq.draft_tokens,
            key=seq.request.request_id,
            pricing=LookupPricing(
                alpha=estimated_alpha(seq.stats.accepted_by_lookup, seq.stats.rejected_by_lookup),
                model_alpha=estimated_alpha(*record), tree=self._takes_trees(seq),
            ),
        )  # fmt: skip

    def _price_lookups(self, seqs: list[Sequence], ks: list[int], jobs: list[tuple[int, DraftJob]]) -> None:
        """What the policy prices each job's lookup by: the draft model's price for it, and what rows cost."""
        prices = self._model_prices(seqs, ks)
        # a lookup widens the pass that the others' rows make (the draft model's k + 1, or a plain step's 1)
        # priced as if the pass were padded even where pass_logits lays its rows end to end: priced alone beside
        # the others' rows, several sequences' lookups together made passes wider than paid (docs/results-log.md)
        row_cost = self.policy.row_cost(len(seqs), max(ks) + 1)
        for i, job in jobs:
            job.pricing = replace(job.pricing, model_price=prices[i], row_cost=row_cost, batch=len(seqs))

    def _model_prices(self, seqs: list[Sequence], ks: list[int]) -> list[float]:
        """Per sequence, what the draft model's k drafts would add to this step (DraftPolicy.model_price), for
        the suffix drafter's choice between a lookup and the model."""
        model = self.proposer.drafter
        drafting = sum(1 for k in ks if k)
        if model is None or not drafting:
            return [0.0] * len(seqs)
        return [
            self.policy.model_price(len(seqs), drafting, k, model.lag(seq.slot, seq.tokens, seq.draft_tokens))
            if k
            else 0.0
            for seq, k in zip(seqs, ks, strict=True)
        ]

    def _constrain(self, seqs: list[Sequence], proposals: list[Proposal | None]) -> list[torch.Tensor | None]:
        """Per sequence with a grammar: cut its proposal at the first token the grammar rejects (a lookup's
        tokens are not masked), and the masks [k + 1, V] of the states the verification rows stand at."""
        masks: list[torch.Tensor | None] = []
        for i, (seq, proposal) in enumerate(zip(seqs, proposals, strict=True)):
            if seq.grammar is None or proposal is None:
                masks.append(None)
                continue
            if proposal.parents is not None:
                masks.append(self._constrain_tree(seqs, proposals, i))
                continue
            found = self._guarded(seq, seq.grammar.masks, proposal.tokens.tolist())
            if found is None:
                proposals[i] = None
                masks.append(None)
                continue
            allowed, valid = found
            if valid < proposal.tokens.shape[0]:
                # a cut draft is still its proposer's (its counts, and the per-proposer alphas drafting reads)
                proposals[i] = replace(proposal, tokens=proposal.tokens[:valid])
            masks.append(allowed)
        return masks

    def _constrain_tree(self, seqs: list[Sequence], proposals: list[Proposal | None], i: int) -> torch.Tensor | None:
        """A token tree's masks, its nodes the grammar rejects (and their subtrees) dropped and the rest renumbered
        (a tree cut stays its proposer's); None, and no proposal, when the sequence failed."""
        proposal = proposals[i]
        found = self._guarded(seqs[i], seqs[i].grammar.tree_masks, proposal.tokens.tolist(), proposal.parents)
        if found is None:
            proposals[i] = None
            return None
        allowed, kept = found
        if len(kept) < proposal.tokens.shape[0]:
            number = {node: j for j, node in enumerate(kept)}
            parents = [-1 if proposal.parents[node] < 0 else number[proposal.parents[node]] for node in kept]
            proposals[i] = replace(proposal, tokens=proposal.tokens[kept], parents=parents)
        return allowed

    def _verify(
        self, seqs: list[Sequence], proposals: list[Proposal | None], masks: list[torch.Tensor | None]
    ) -> list[Verdict | None]:
        """One target pass over [pending, drafts] of every sequence still running; the target's own token at every
        row of every sequence, found for the whole batch at once (_choices); each sequence's verdict from them
        (acceptance.verify_batch); each cache rolled back to what was accepted. None for a sequence that failed."""
        live = [i for i, proposal in enumerate(proposals) if proposal is not None]
        verdicts: list[Verdict | None] = [None] * len(seqs)
        if not live:
            return verdicts
        rows, parents = [], []
        for i in live:
            pending = seqs[i].tokens[self.cache.lengths[seqs[i].slot] :]
            rows.append(pending + proposals[i].tokens.tolist())
            tree = proposals[i].parents
            # a tree's root is the last pending token: node j's row is len(pending) + j
            root = len(pending) - 1
            parents.append(
                None if tree is None else [-1] * len(pending) + [root + 1 + p if p >= 0 else root for p in tree]
            )
        slots = [seqs[i].slot for i in live]
        begin = time.perf_counter()
        logits, ends = pass_logits(self.target.model, self.cache, rows=rows, slots=slots, parents=parents)
        # the pass's rows as computed (padding included where there is any): what lookups are priced by
        self.policy.record_pass(logits.shape[0], time.perf_counter() - begin)
        # each sequence's verification rows: the last k + 1 of its row
        spans = {i: (end - proposals[i].tokens.shape[0] - 1, end) for i, end in zip(live, ends, strict=True)}
        raws = {i: logits[start:end] for i, (start, end) in spans.items()}
        choices = self._choices(seqs, proposals, masks=masks, logits=logits, spans=spans, live=live, raws=raws)
        decided = [i for i in live if choices.get(i) is not None]
        drafts = [proposals[i].tokens.tolist() for i in decided]
        judged = verify_batch(drafts, [proposals[i].parents for i in decided], [choices[i] for i in decided])
        for i, draft, verdict in zip(decided, drafts, judged, strict=True):
            verdicts[i] = self._guarded(seqs[i], partial(self._settle, seqs[i], draft, raws[i], verdict))
        return verdicts

    def _choices(
        self, seqs: list[Sequence], proposals: list[Proposal | None], masks: list[torch.Tensor | None],
        logits: torch.Tensor, spans: dict[int, tuple[int, int]], live: list[int], raws: dict[int, torch.Tensor],
    ) -> dict[int, list[int] | None]:  # fmt: skip
        """The target's own token at each verification row of each live sequence (None for one that failed): the
        argmax (greedy) or the keyed draw (sampled) of the row's logits after the request's logit_bias and
        penalties and its grammar's mask. Greedy rows left as the target wrote them (the common case) take one
        argmax over the whole pass; a sampled row's draw is one vectorized race over the vocabulary (stacking all
        rows' races into one tensor measured slower: it copies every row's distribution and noise)."""
        plain = {i for i in live if self._unadjusted_greedy(seqs[i], masks[i])}
        choices: dict[int, list[int] | None] = {}
        if plain:
            flat = argmax_rows(logits).tolist()
            for i in plain:
                choices[i] = flat[spans[i][0] : spans[i][1]]
        for i in live:
            if i in choices:
                continue
            adjusted = self._guarded(seqs[i], partial(self._adjusted, seqs[i], proposals[i], raws[i], masks[i]))
            if adjusted is None:
                choices[i] = None
            elif seqs[i].request.params.greedy:
                choices[i] = argmax_rows(adjusted).tolist()
            else:
                choices[i] = self._drawn(seqs[i], proposals[i], adjusted)
        return choices

    @staticmethod
    def _unadjusted_greedy(seq: Sequence, mask: torch.Tensor | None) -> bool:
        return seq.request.params.greedy and mask is None and not seq.adjustments.active

    @staticmethod
    def _adjusted(seq: Sequence, proposal: Proposal, raw: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The rows adjusted by the request's logit_bias and penalties (a chain's row by row over its drafted
        tokens; a tree is drafted only without penalties, which would count each row's own path), then masked by
        its grammar (a tree's each row by its path's: _constrain_tree)."""
        drafted = proposal.tokens.tolist() if proposal.parents is None else None
        logits = seq.adjustments.apply(raw, drafted) if drafted is not None else seq.adjustments.apply(raw)
        return logits if mask is None else logits.masked_fill(~mask, float("-inf"))

    @staticmethod
    def _drawn(seq: Sequence, proposal: Proposal, logits: torch.Tensor) -> list[int]:
        """A sampled sequence's token at each row: the keyed draw (decoding/noise.py) from the row's logits
        (raced alone, so its bits are those of a plain step's single row) with the noise of the position the row
        predicts (the next one, plus its node's depth in a tree), as plain decoding draws there."""
        params, next_position = seq.request.params, len(seq.tokens)
        if proposal.parents is None:
            positions = list(range(next_position, next_position + logits.shape[0]))
        else:
            positions = [next_position]
            for parent in proposal.parents:
                positions.append(positions[parent + 1] + 1)
        rows = zip(logits, positions, strict=True)
        return [keyed_draw(row, params, seq.noise, position) for row, position in rows]

    def _settle(
        self, seq: Sequence, draft: list[int], raw: torch.Tensor, judged: tuple[int, int, list[int] | None]
    ) -> Verdict:
        """The consequences of verify_batch's verdict `judged` (drafted tokens accepted, the target's next token, a
        tree's accepted path of rows or None): the cache rolled back to the accepted tokens (a tree keeps its accepted
        path where a chain's would lie), and the logprobs of the emitted tokens when asked for."""
        accepted, next_token, path = judged
        if path is None:
            self.cache.set_length(seq.slot, len(seq.tokens) + accepted)
            tokens, rows = draft[:accepted], list(range(accepted + 1))
        else:
            self.cache.keep_path(seq.slot, len(seq.tokens) - 1, [0, *path])
            tokens, rows = [draft[row - 1] for row in path], [0, *path]
        logprobs = None
        if seq.request.logprobs is not None:
            logprobs = token_logprobs(raw[rows], [*tokens, next_token], seq.request.logprobs)
        return Verdict(accepted, next_token, logprobs, None if path is None else tokens)

    def _takes_trees(self, seq: Sequence) -> bool:
        return self.config.token_trees and not seq.adjustments.penalises and self.target.model.takes_trees

    def _advance(self, seq: Sequence, proposal: Proposal, verdict: Verdict) -> None:
        # a tree counts as its deepest path: the positions it offered (its other branches are not tokens it
        # could have added), so acceptance per position reads as a chain's
        k, accepted = proposal.height, verdict.accepted
        seq.stats.record_round(k, accepted, proposal.looked_up)
        seq.stats.time_catch_up += proposal.catch_up_seconds
        self.metrics.record_round(k, accepted, proposer_name(proposal.looked_up))
        self.policy.record_round(k, accepted, proposal.looked_up)
        drafted = proposal.tokens[:accepted].tolist() if verdict.path is None else verdict.path
        emitted = [*drafted, verdict.next_token]
        if seq.grammar is not None:
            seq.grammar.advance([t for t in emitted if not seq.stopper.is_stop_token(t)])
        seq.noise.forget_before(len(seq.tokens) + len(emitted))  # these positions are decided
        for i, token in enumerate(emitted):
            seq.tokens.append(token)
            seq.adjustments.record(token)
            is_stop_token = seq.stopper.is_stop_token(token)
            logprob = None
            if seq.logprobs is not None and not is_stop_token:
                logprob = verdict.logprobs[i]
                logprob.text_offset = len(seq.stopper.text)
                seq.logprobs.append(logprob)
            piece = seq.stopper.add(token)
            seq.stats.new_tokens += not is_stop_token
            if not is_stop_token:
                self._record_token_time(seq)
            if piece or not is_stop_token:
                seq.request.sink(StreamChunk(piece, None if is_stop_token else token, logprob=logprob))
            if seq.stopper.finished:
                self._finish(seq)
                return
        self.prefixes.decoded(seq.slot, seq.tokens)

    def _record_token_time(self, seq: Sequence) -> None:
        now = time.perf_counter()
        if seq.last_emit is None:
            self.metrics.ttft.observe(now - seq.request.arrival)
        else:
            self.metrics.itl.observe(now - seq.last_emit)
        seq.last_emit = now
        self.metrics.generation_tokens.inc()

    def _finish(self, seq: Sequence) -> None:
        seq.stats.time_total = time.perf_counter() - seq.admitted
        seq.stats.time_grammar = seq.grammar.seconds if seq.grammar is not None else 0.0
        stopper = seq.stopper
        reason = stopper.finish_reason or "length"
        output = GenerationOutput(
            stopper.text,
            list(stopper.token_ids),
            finish_reason=reason,
            stats=seq.stats,
            prompt_ids=seq.request.prompt_ids,
            logprobs=seq.logprobs,
        )
        self.policy.record_answer(len(stopper.token_ids), stopped=reason != "length")
        if self.proposer is not None:  # what it wrote, for the requests to come
            self.proposer.finished(seq.slot, seq.tokens[len(seq.request.prompt_ids) :], seq.request.partition)
        self.prefixes.decoded(seq.slot, seq.tokens)
        seq.request.sink(FinishEvent(output, seq.queue_seconds))
        self._release(seq, reason)

    def _release(self, seq: Sequence, reason: str) -> None:
        self._free(seq.request, seq.slot, reason)

    def _free(self, request: EngineRequest, slot: int, reason: str) -> None:
        """The request leaves (running or just admitted); its slot is free from the next step on."""
        self.cache.release(slot)  # what its prompt registered stays, for the requests to come
        self.prefixes.finish(slot)
        with self.cond:
            self.running.pop(slot, None)
            self.free_slots.append(slot)
            self.active.pop(request.request_id, None)
            self.metrics.record_finish(reason, time.perf_counter() - request.arrival)
            self._update_gauges()

    def _fail_all(self, message: str) -> None:
        """Every waiting and running request ends with `message` (the loop failed, or the server stops)."""
        with self.cond:
            waiting = [_request_of(item) for item in self.waiting]
            self.waiting.clear()
            running = list(self.running.values())
        for request in waiting:
            with self.cond:
                self.active.pop(request.request_id, None)
            self.metrics.record_finish("error", time.perf_counter() - request.arrival)
        for seq in running:
            self._free(seq.request, seq.slot, "error")
        for request in [*waiting, *(seq.request for seq in running)]:
            request.sink(ErrorEvent(message))
        with self.cond:
            self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.set_queue(len(self.running), len(self.waiting))
        pool = self.cache.pool
        self.metrics.kv_cache_usage.set((pool.in_use() + pool.reserved) / pool.num_blocks)


def _check_width(job: DraftJob, proposal: Proposal) -> bool:
    """A proposal holds at most the tokens its job allows (DraftJob.widest): the room the engine reserved."""
    if proposal.tokens.shape[0] > job.widest:
        raise RuntimeError(
            f"the proposer drafted {proposal.tokens.shape[0]} tokens where at most {job.widest} were reserved "
            "(its method's `widest` in engine/methods.py is too small)"
        )
    return True


def _request_of(item: EngineRequest | Sequence) -> EngineRequest:
    return item.request if isinstance(item, Sequence) else item


def _blocks(positions: int) -> int:
    return -(-positions // BLOCK_SIZE)
