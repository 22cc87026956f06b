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

The rooms, each a module read alone: who runs and waits (sequence.py: Slots), admission, preemption and room for a
step's rows (admitter.py, admission.py), the caches and the method's proposer sized together (caches.py), chunked
prefill (prefill.py, prefill_pacing.py), the step's drafting (draft_round.py, policy.py), the one verification site
(verification.py), emitting what it decided (emission.py). This module wires them and runs the loop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..decoding.grammar import GrammarCompiler, start_with_grammar_stack
from ..decoding.logprobs import MAX_TOP_LOGPROBS
from ..decoding.stopping import check_stop
from ..errors import InvalidParameterError, PromptTooLongError, VerispecError
from ..models.loading import LoadedModel
from ..models.model import Transformer
from ..models.pass_shape import parse_pass_shape, uncovered, use_pass_shape
from .admitter import Admitter
from .caches import CacheSizes, allocate
from .clock import settled
from .draft_round import DraftRound
from .emission import Emitter
from .methods import check_method_options, get_method, resolve_method
from .metrics import Metrics
from .policy import POLICIES, DraftPolicy, PolicySettings
from .prefill import Prefiller
from .prefill_pacing import PrefillPacer
from .proposer import Proposer
from .requests import EngineRequest, ErrorEvent
from .sequence import Sequence, Slots, request_of
from .verification import Verifier

log = logging.getLogger("verispec.server")


class QueueFullError(VerispecError):
    """All sequence slots are busy and the waiting queue is full."""


class SchedulerStoppedError(VerispecError):
    """The scheduler no longer accepts requests (shutting down)."""


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8  # sequences decoded together (cache slots)
    max_queue: int = 64  # requests waiting for a slot
    max_model_len: int | None = 4096  # prompt + generated tokens per sequence; None: the models' trained context
    num_speculative_tokens: int = 4
    draft_policy: str = "auto"  # auto | always | never (see policy.py)
    # a method of methods.py by name; None: its default with a draft model, plain decoding without one
    speculative_method: str | None = None
    # the methods' options by name (methods.py: MethodOption: draft_vocab and each method's own); the method
    # that runs reads its own, each not given taking its default
    method_options: dict[str, Any] = field(default_factory=dict)
    prefill_chunk: int = 128  # prompt tokens prefilled per step, so running requests wait one chunk, not a prompt
    # the draft model reads at most this many of a prompt's last tokens (after its first DRAFT_SINK); 0: all of it
    draft_window: int = 0
    # lookups may propose token trees, verified in one pass (a method whose lookups can: Method.trees; requests
    # without penalties, on a target that takes trees: Transformer.takes_trees). Off by default: measured not to pay
    # (docs/repetition.md)
    token_trees: bool = False
    # register the blocks decoding fills, so that a next turn holding the answer prefills only what is new
    # (prefixes.py; on a row-invariant target)
    answer_reuse: bool = True
    # bytes the target's and the draft model's KV caches may take together (budget.py); None: DEFAULT_SLOT_TOKENS
    # per slot (or one whole context, if more), at most half the memory available at start
    kv_cache_memory: int | None = None
    # every pass of the target (and of a draft model) at one padded shape, "GROUPSxWIDTH" (models/pass_shape.py: a
    # row's bits whatever the pass); "auto": 8x8 on CUDA, none on a CPU (whose native kernels are row-invariant)
    pass_shape: str = "auto"
    # each shaped pass compiled by torch.compile (fewer, fused kernels; needs a pass shape; models/pass_shape.py)
    compile_passes: bool = False

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
        check_method_options(self.method_options)
        parse_pass_shape(self.pass_shape, "cpu")  # its form, before loading
        if self.compile_passes and self.pass_shape == "off":
            raise InvalidParameterError("compiled passes (--compile-passes) need a pass shape, not off")
        if self.draft_window < 0:
            raise InvalidParameterError(f"draft_window must be >= 0 (0 = the whole context), got {self.draft_window}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise InvalidParameterError(f"kv_cache_memory must be >= 1 byte, got {self.kv_cache_memory}")


class Scheduler:
    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None,
        config: SchedulerConfig | None = None,
        metrics: Metrics | None = None,
    ):
        self.config = config or SchedulerConfig()
        made_for = getattr(target.model, "drafter_method", None)
        if made_for is not None:
            raise InvalidParameterError(
                f"{target.name} is a drafter that reads its target: give it as the speculative model of its target "
                f"with --speculative-method {made_for}"
            )
        self.target = target
        self.tokenizer = target.tokenizer
        self.metrics = metrics or Metrics()
        # the method (methods.py; None: plain decoding); a draft model it does not use is not used
        self.method = resolve_method(self.config.speculative_method, draft is not None)
        if self.method is None or not self.method.uses_draft_model:
            draft = None
        limits, vocabs = [target.model.config.max_position_embeddings], [target.model.config.vocab_size]
        if self.config.max_model_len is not None:
            limits.append(self.config.max_model_len)
        if self.method is not None:
            self.method.check(target, draft)
            positions, vocab = self.method.limits(target, draft)  # what its drafter reads and embeds
            limits += [positions] if positions is not None else []
            vocabs += [vocab] if vocab is not None else []
        self.vocab_size = min(vocabs)  # token ids every model can embed
        self._build(target, draft, min(limits))

    def _shape_passes(self, target: LoadedModel, draft: LoadedModel | None) -> None:
        """The pass shape on the target (refused by name where asked for and not covered) and on a draft model on
        PyTorch (for its CUDA graphs: a draft's bits need not match anything); CUDA graphs unless
        VERISPEC_CUDA_GRAPHS=0; compiled passes where the config says (refused without a shape)."""
        text, compiled = self.config.pass_shape, self.config.compile_passes
        graphs = os.environ.get("VERISPEC_CUDA_GRAPHS", "1") != "0"
        shape = use_pass_shape(target.model, parse_pass_shape(text, target.model.device), asked=text != "auto",
                               graphs=graphs, compiled=compiled)  # fmt: skip
        draft_model = getattr(draft, "model", None)  # a method's drafter may be a checkpoint of its own
        if isinstance(draft_model, Transformer):
            compiled = compiled and shape is not None and uncovered(draft_model) is None
            use_pass_shape(draft_model, shape, graphs=graphs, compiled=compiled)

    def _build(self, target: LoadedModel, draft: LoadedModel | None, context: int) -> None:
        """The caches and the proposer (caches.py), then the rooms that share them."""
        config = self.config
        self._shape_passes(target, draft)
        sizes = CacheSizes(slots=config.max_num_seqs, k=config.num_speculative_tokens, context=context,
                           prefill_chunk=config.prefill_chunk, answer_reuse=config.answer_reuse,
                           kv_cache_memory=config.kv_cache_memory)  # fmt: skip
        made = allocate(target, draft, self.method, sizes=sizes, options=config.method_options)
        self.cache, self.prefixes, self.proposer, self.widest = made.cache, made.prefixes, made.proposer, made.widest
        self.max_model_len, self.context_cut, self.on_demand = made.context, made.context_cut, made.on_demand
        # a drafter that reads the target's hidden states says so, and which (the final ones, or the inputs of the
        # layers it names); the target serves them to it (and no earlier engine's drafter on the same model any more)
        reads = getattr(self.proposer, "reads_hidden", False)
        target.model.serve_hidden(self.proposer.observe_hidden if reads else None,
                                  layers=getattr(self.proposer, "hidden_layers", None) if reads else None)  # fmt: skip
        self.grammars = GrammarCompiler(self.tokenizer, target.model.config.vocab_size)  # for EngineRequest.grammar
        mode = config.draft_policy if self.proposer is not None else "never"
        self.policy = DraftPolicy(PolicySettings(k_max=config.num_speculative_tokens, mode=mode))
        self.slots = Slots(config.max_num_seqs)
        self.emitter = Emitter(
            self.slots, self.cache, self.prefixes, self.proposer, policy=self.policy, metrics=self.metrics
        )
        self.admitter = Admitter(
            self.slots, self.cache, self.prefixes, self.proposer, tokenizer=self.tokenizer,
            vocab_size=target.model.config.vocab_size, widest=self.widest, on_demand=self.on_demand,
            draft_window=config.draft_window, metrics=self.metrics, free=self.emitter.free,
        )  # fmt: skip
        # how prefill shares the loop with others' decoding; its chunks cut anywhere where passes are row-invariant
        self.pacer = PrefillPacer(config.prefill_chunk, resizable=self.on_demand and not target.model.config.hybrid)
        self.prefill = Prefiller(
            self.slots, self.prefixes, self.pacer, target.model, cache=self.cache, policy=self.policy,
            count_reused=self.admitter.count_reused, guarded=self._guarded,
        )  # fmt: skip
        self.drafting = DraftRound(
            self.proposer, self.policy, self.metrics, self.slots, k=config.num_speculative_tokens, widest=self.widest,
            context=self.max_model_len, trees=config.token_trees and target.model.takes_trees,
            guarded=self._guarded, joining=self._waiting_for_a_slot,
        )  # fmt: skip
        self.verifier = Verifier(target.model, self.cache, self.policy, self._guarded)
        self.thread: threading.Thread | None = None
        self.stopping = False

    # the policy, the proposer and the metrics, which the rooms share: replaced in all of them at once (a warm-up
    # starts the policy and the metrics anew; a test may hand the engine a proposer of its own)
    @property
    def policy(self) -> DraftPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: DraftPolicy) -> None:
        self._share("policy", policy, ("emitter", "prefill", "drafting", "verifier"))

    @property
    def proposer(self) -> Proposer | None:
        return self._proposer

    @proposer.setter
    def proposer(self, proposer: Proposer | None) -> None:
        self._share("proposer", proposer, ("emitter", "admitter", "drafting"))

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: Metrics) -> None:
        self._share("metrics", metrics, ("emitter", "admitter", "drafting"))

    def _share(self, name: str, value: object, rooms: tuple[str, ...]) -> None:
        setattr(self, "_" + name, value)
        for room in rooms:
            if hasattr(self, room):  # (not yet while the rooms are being built)
                setattr(getattr(self, room), name, value)

    # the slots, as the front ends and the tests read them
    @property
    def running(self) -> dict[int, Sequence]:
        return self.slots.running

    @property
    def waiting(self):
        return self.slots.waiting

    @property
    def active(self) -> dict[str, EngineRequest]:
        return self.slots.active

    @property
    def free_slots(self) -> list[int]:
        return self.slots.free

    @property
    def cond(self) -> threading.Condition:
        return self.slots.cond

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
            self.emitter.update_gauges()
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
            waiting = next((item for item in self.waiting if request_of(item) is request), None)
            if waiting is not None:
                self.waiting.remove(waiting)
                del self.active[request_id]
                self.metrics.record_finish("cancelled", time.perf_counter() - request.arrival)
                self.emitter.update_gauges()
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
        self.emitter.fail_all("the server is shutting down")

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
                self.emitter.fail_all("internal error in the scheduler (see the server log)")

    def forget_history(self) -> None:
        """Forget what earlier requests wrote (a lookup proposer's index); prefilled prompts stay reusable."""
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
        for seq in [s for s in self.running.values() if s.request.cancelled]:  # first: gives its slot back
            self.emitter.release(seq, "cancelled")
        self.admitter.preempted_in_step = False
        self.admitter.admit()
        if not self.running:
            return False
        self.prefill.step()
        seqs = [seq for seq in self.running.values() if not seq.prefilling]
        if not seqs:
            return True
        limits = self.drafting.limits(seqs)
        records = [self.drafting.model_record(seq) for seq in seqs]
        ks = self.drafting.choose_ks(seqs, limits, records)
        device = self.target.model.device
        begin = settled(device)
        proposals = self.drafting.propose(seqs, ks, limits, records)
        masks = self.verifier.constrain(seqs, proposals)
        if self.on_demand:
            self.admitter.make_room(seqs, proposals)
        drafted = settled(device)
        verdicts = self.verifier.verify(seqs, proposals, masks)
        verified = settled(device)
        self.pacer.decoded(verified - begin)
        self.drafting.record_step(
            len(seqs),
            ks,
            proposals,
            draft_seconds=drafted - begin,
            verify_seconds=verified - drafted,
            preempted=self.admitter.preempted_in_step,
        )
        for seq, proposal, verdict in zip(seqs, proposals, verdicts, strict=True):
            if verdict is None:  # the sequence failed this step (and has left)
                continue
            seq.stats.time_draft += drafted - begin
            seq.stats.time_target += verified - drafted
            self._guarded(seq, partial(self.emitter.advance, seq, proposal, verdict))
        with self.cond:
            self.emitter.update_gauges()
        return True

    def _waiting_for_a_slot(self) -> bool:
        """A request waits that a free slot would take (a burst's later requests arrive while the first prefills)."""
        with self.cond:
            return bool(self.waiting and self.free_slots and not self.admitter.waiting_for_blocks)

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
        self.emitter.release(seq, "error")
        seq.request.sink(event)
