"""The draft model as a proposer (BatchedDrafter: the `draft` method alone, and the model half of the others), and
what it reads of a long context (draft_view)."""

from __future__ import annotations

from functools import cached_property, partial

import torch

from ..decoding.sampling import keyed_draw
from ..kernels.greedy import MAX_ROWS as GREEDY_MAX_ROWS
from ..kernels.greedy import GreedySteps
from ..models.draft_head import DraftHead
from ..models.greedy_steps import DeviceGreedySteps
from ..models.kv_cache import CacheFullError
from ..models.model import Transformer
from ..models.passes import padded_forward
from .clock import settled
from .drafting import DraftCost, DraftJob, Proposal, common_prefix

CATCH_UP_WIDTH = 4  # longer draft catch-ups (after drafting was suspended) run alone first
DRAFT_SINK = 4  # the first tokens of a context, which a bounded draft context always keeps (attention sinks)


def draft_cut_for(prompt_length: int, window: int) -> int:
    """Where a sequence's bounded draft context resumes after its first DRAFT_SINK tokens: the last `window`
    prompt tokens are kept (0: no cut, the draft reads the whole context; also for window 0 and short prompts).
    Fixed when the sequence starts, so that its view only grows as it generates."""
    if not window or prompt_length <= DRAFT_SINK + window:
        return 0
    return prompt_length - window


def draft_view(tokens: list[int], cut: int) -> list[int]:
    """What the draft model reads of a context (StreamingLLM's layout): the first DRAFT_SINK tokens, then
    everything from `cut` on, at consecutive positions. The draft only proposes: what it reads can change which
    tokens it proposes, never which are emitted."""
    return tokens if not cut else tokens[:DRAFT_SINK] + tokens[cut:]


class BatchedDrafter:
    """A draft model with one cache slot per sequence; `propose` drafts k tokens for many sequences together.

    Per sequence: argmax when greedy, else a draw from the filtered draft distribution q with the sequence's keyed
    noise at the drafted token's position (decoding/noise.py: the draw the target's own will most often equal);
    both after the request's logit adjustments (decoding/adjustments.py) and within its grammar
    (decoding/grammar.py: a sequence whose grammar allows none of the draft head's tokens drafts fewer).

    A slot needs no prefill: `propose` feeds whatever the slot lacks, keeping the longest prefix it already
    holds, or forking a longer one another slot holds (KVCache.fork: its blocks shared, copy-free; so a new
    request reuses a previous one's shared prefix, n choices of one prompt catch up once, and a sequence whose
    drafting was suspended catches up only when drafting resumes; a draft's keys need not match any other
    computation bit for bit). Feeds too long to batch run alone first; their time is kept in `spent` so the draft
    policy can tell steady-state drafting cost from catching up. It is a Proposer (proposer.py) on its own: the
    `draft` method.

    Its cache is paged like the target's, in `num_blocks` blocks, and is best effort: a slot keeps its blocks
    after its request (for the next one), and where a job needs blocks and none is free, the slots not drafting
    in this propose give theirs back, least recently used first; a job that still lacks room drafts nothing this
    step. Drafts only propose, so room changes how fast a request runs, never what it emits.
    """

    looks_up = False

    def __init__(
        self,
        model: Transformer,
        target_vocab_size: int,
        num_slots: int,
        max_len: int,
        head_ids: torch.Tensor | None,
        num_blocks: int | None = None,
    ):
        """head_ids: draft only these token ids (a restricted head, see models/draft_head.py); None: all.
        num_blocks: the cache's blocks (None: every slot's max_len)."""
        self.model = model
        self.target_vocab_size, self.head_ids = target_vocab_size, head_ids
        self.cache = model.new_cache(num_slots, max_len, num_blocks)
        self.fed: list[list[int]] = [[] for _ in range(num_slots)]  # tokens held in each slot, in order
        self.partitions = [""] * num_slots  # whose tokens each slot holds: only its partition reuses them
        self.used = [0] * num_slots  # the propose each slot last drafted in (the least recently used give way)
        self.proposes = 0
        self.spent = DraftCost()  # the last propose's long feeds

    def admit(self, slot: int, partition: str) -> None:
        """A new request in `slot`, of `partition` (a tenant: engine/requests.py): what the slot holds of another
        partition's is forgotten, and it copies only from slots of its own partition."""
        if self.partitions[slot] != partition:
            self.partitions[slot] = partition
            self.fed[slot].clear()
            self.cache.release(slot)

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        """How many tokens `propose` would feed the slot alone, before drafting for `tokens` (read as
        `model_tokens` when given, DraftJob.model_tokens): what it lacks beyond the CATCH_UP_WIDTH that ride in
        the batched pass (a slot may hold an earlier request's tokens, or rejected drafts: only the common prefix
        counts; another slot's longer one is copied)."""
        tokens = tokens if model_tokens is None else model_tokens
        return max(0, len(tokens) - self._held(slot, tokens)[1] - CATCH_UP_WIDTH)

    def _held(self, slot: int, tokens: list[int]) -> tuple[int, int]:
        """(the slot holding the longest prefix of `tokens`, its length): `slot` itself unless another holds
        more than a batched pass would feed (n choices of one prompt share its catch-up)."""
        limit = len(tokens) - 1
        best = (slot, common_prefix(self.fed[slot], tokens, limit))
        if limit - best[1] > CATCH_UP_WIDTH:
            for other, fed in enumerate(self.fed):
                if other == slot or self.partitions[other] != self.partitions[slot]:
                    continue
                if (held := common_prefix(fed, tokens, limit)) > best[1]:
                    best = (other, held)
        return best

    @cached_property
    def head(self) -> DraftHead:
        """The draft's output head (restricted to `head_ids`: its rows requantized, a tenth of a second for the
        bundled draft), made when the model first drafts: a first token, decoded plainly, does not wait for it."""
        return DraftHead(self.model, self.target_vocab_size, self.head_ids)

    @cached_property
    def greedy_steps(self) -> GreedySteps | DeviceGreedySteps:
        """Greedy drafting in one call per propose: one native call where the model runs natively end to end, else
        its passes with each step's tokens chosen on its device (one trip to the host)."""
        head = self.model.lm_head if self.head.module is None else self.head.module
        if not GreedySteps.supports(self.model, head):
            return DeviceGreedySteps(self.model, self.head)
        rows = head.out_features if self.head.ids is not None else min(head.out_features, self.target_vocab_size)
        return GreedySteps(self.model, head, self.head.ids, rows)

    @property
    def drafter(self) -> BatchedDrafter:
        return self

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        """Nothing: the model drafts from each sequence's own context."""

    def forget(self, history: bool = True, prompts: bool = True) -> None:
        """`prompts`: hold no context, so that the next request catches up as on a fresh engine."""
        if prompts:
            for slot, fed in enumerate(self.fed):
                fed.clear()
                self.cache.release(slot)

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        self.proposes += 1
        todo, caught_up = self._prepare(jobs)
        roomy = [i for i, missing in enumerate(todo) if missing is not None]
        drafted = iter(self._propose([jobs[i] for i in roomy], [todo[i] for i in roomy]) if roomy else [])
        proposals = []
        for missing, seconds in zip(todo, caught_up, strict=True):
            proposal = next(drafted) if missing is not None else Proposal(torch.empty(0, dtype=torch.long))
            proposal.catch_up_seconds = seconds
            proposals.append(proposal)
        return proposals

    def _propose(self, jobs: list[DraftJob], todo: list[list[int]]) -> list[Proposal]:
        if self._greedy_in_one_call(jobs, todo):
            return self._propose_greedy(jobs, todo)
        logits = self._catch_up(jobs, todo)
        drafted: list[list[int]] = [[] for _ in jobs]
        ended: set[int] = set()  # jobs whose grammar leaves the draft nothing to propose
        for step in range(max(job.k for job in jobs)):
            active = [i for i, job in enumerate(jobs) if job.k > step and i not in ended]
            for i in active:
                choice = self._choose(logits[i], jobs[i], drafted[i])
                if choice is None:
                    ended.add(i)
                    continue
                drafted[i].append(choice)
            feeding = [i for i in active if jobs[i].k > step + 1 and i not in ended]
            if feeding:
                rows = [[drafted[i][-1]] for i in feeding]
                outputs = padded_forward(
                    self.model, self.cache, rows=rows, slots=[jobs[i].slot for i in feeding], draft_head=self.head
                )
                for i, out in zip(feeding, outputs, strict=True):
                    self.fed[jobs[i].slot].append(drafted[i][-1])
                    logits[i] = out[-1]
        return [Proposal(torch.tensor(tokens, dtype=torch.long)) for tokens in drafted]

    def _greedy_in_one_call(self, jobs: list[DraftJob], todo: list[list[int]]) -> bool:
        """Whether this propose can run as one native call: greedy jobs only, and room in every slot for the
        longest draft's steps (a shorter draft is fed as far; near the end of its context it may have no room)."""
        if self.greedy_steps is None or not all(plain_greedy(job) for job in jobs):
            return False
        steps = max(job.k for job in jobs)
        room = all(
            self.cache.lengths[job.slot] + len(missing) + steps - 1 <= self.cache.max_len
            for job, missing in zip(jobs, todo, strict=True)
        )
        return room and sum(len(missing) for missing in todo) <= GREEDY_MAX_ROWS

    def _propose_greedy(self, jobs: list[DraftJob], todo: list[list[int]]) -> list[Proposal]:
        """The whole greedy draft in one native call: the catch-up pass, then the longest draft's steps (a
        shorter draft keeps its first k tokens; the tokens fed past them stay in its slot, recorded as held)."""
        drafted = self.greedy_steps(self.cache, [job.slot for job in jobs], todo, max(job.k for job in jobs))
        proposals = []
        for job, missing, tokens in zip(jobs, todo, drafted, strict=True):
            self.fed[job.slot] += missing + tokens[:-1]
            proposals.append(Proposal(torch.tensor(tokens[: job.k], dtype=torch.long)))
        return proposals

    def _prepare(self, jobs: list[DraftJob]) -> tuple[list[list[int] | None], list[float]]:
        """Ready each job's slot: keep the prefix it holds (or fork a longer one another slot holds), make room for
        what this propose writes, feed a long lag alone; returns the tokens each slot still lacks (at least the last
        one, at most CATCH_UP_WIDTH; None for a job without room) and the seconds each job's lag took."""
        todo, seconds = [], []
        busy = {job.slot for job in jobs}
        for job in jobs:
            self.used[job.slot] = self.proposes
            fed, tokens = self.fed[job.slot], job.model_view
            source, held = self._held(job.slot, tokens)
            keep = held if source == job.slot else common_prefix(fed, tokens, limit=len(tokens) - 1)
            self.cache.set_length(job.slot, keep)
            del fed[keep:]
            if held > keep:  # another slot holds more of these tokens: its blocks are shared
                if self._room(partial(self.cache.fork, source, job.slot, held), busy | {source}):
                    fed += tokens[keep:held]
                    keep = held
                else:
                    self.cache.set_length(job.slot, keep)
            end = min(len(tokens) + max(job.k, CATCH_UP_WIDTH) + 1, self.cache.max_len)  # what this propose writes
            if not self._room(partial(self.cache.ensure, job.slot, end), busy):
                todo.append(None)
                seconds.append(0.0)
                continue
            missing, took = tokens[keep:], 0.0
            if len(missing) > CATCH_UP_WIDTH:
                begin = settled(self.model.device)
                self._feed_alone(job.slot, missing[:-CATCH_UP_WIDTH])
                took = settled(self.model.device) - begin
                self.spent.catch_up_seconds += took
                self.spent.catch_up_tokens += len(missing) - CATCH_UP_WIDTH
                missing = missing[-CATCH_UP_WIDTH:]
            todo.append(missing)
            seconds.append(took)
        return todo, seconds

    def _room(self, make, busy: set[int]) -> bool:
        """Run `make` (something that takes blocks); where the cache has none left, the slots not in `busy` give
        theirs back, least recently used first, until it runs; False where it never does."""
        idle = sorted((slot for slot in range(self.cache.num_slots) if slot not in busy), key=self.used.__getitem__)
        while True:
            try:
                make()
                return True
            except CacheFullError:
                while idle and not self.cache.blocks[idle[0]]:
                    idle.pop(0)
                if not idle:
                    return False
                slot = idle.pop(0)
                self.cache.release(slot)
                self.fed[slot].clear()

    def _catch_up(self, jobs: list[DraftJob], todo: list[list[int]]) -> list[torch.Tensor]:
        """Feed each slot the tokens it lacks (`todo`); returns the logits after each."""
        outputs = padded_forward(
            self.model, self.cache, rows=todo, slots=[job.slot for job in jobs], draft_head=self.head
        )
        for job, missing in zip(jobs, todo, strict=True):
            self.fed[job.slot] += missing
        return [out[-1] for out in outputs]

    def _feed_alone(self, slot: int, tokens: list[int]) -> None:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.model.device)
        self.model(ids, self.cache, [slot], num_logits=1, invariant=False, head=self.head.module)
        self.fed[slot] += tokens

    def _choose(self, logits: torch.Tensor, job: DraftJob, drafted: list[int]) -> int | None:
        """The next draft token from the head's logits; None when the grammar allows none of the draft's tokens."""
        if plain_greedy(job):
            return self.head.argmax(logits)
        return pick_draft(self.head.over_vocab(logits), job, drafted)


def pick_draft(logits: torch.Tensor, job: DraftJob, drafted: list[int]) -> int | None:
    """The next draft token from a drafter's logits over the target's vocabulary, after the job's logit adjustments
    and within its grammar (None where the grammar allows none): the argmax when greedy, else the draw of the
    sequence's keyed noise at the drafted token's position (the draw the target's own will most often equal)."""
    if job.adjustments is not None:
        logits = job.adjustments.apply(logits[None], drafted)[0]
    if job.grammar is not None:
        logits = logits.masked_fill(~job.grammar.mask_after(drafted), float("-inf"))
        if torch.isneginf(logits).all():
            return None
    if job.params.greedy:
        return int(logits.argmax())
    return keyed_draw(logits, job.params, job.noise, len(job.tokens) + len(drafted))


def plain_greedy(job: DraftJob) -> bool:
    """Greedy with nothing that changes the draft's logits (no active logit adjustments, no grammar)."""
    return job.params.greedy and (job.adjustments is None or not job.adjustments.active) and job.grammar is None
