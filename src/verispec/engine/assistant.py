"""Drafting with Gemma 4's assistant (models/assistant.py): the `assistant` method.

The assistant reads the target's final hidden state at the position before a sequence's last token and attends to the
target's own keys and values, so it has nothing to catch up on and no cache of its own: the target hands every pass's
hidden states over (it `reads_hidden`: the engine has the target serve them, Transformer.serve_hidden); this keeps
each slot's latest pass, whose rows hold the position before the last token (a verify pass's accepted rows, a decode
step's row, a prefill's last row). At each propose a
sequence of n tokens, whose target cache holds n - 1 positions, drafts its first token from (tokens[n - 1], hidden at
n - 2) and each further one from the draft before it and the assistant's own output, at the same position.

Drafts are point masses to the acceptance rule like any proposer's: greedy drafts are the assistant's argmax, sampled
ones its draw with the sequence's keyed noise (draft_model.pick_draft), so the output is the target's whatever the
assistant proposes.
"""

from __future__ import annotations

import torch

from ..errors import InvalidParameterError
from ..models.assistant import AssistantModel
from ..models.gguf_native import linears_on_the_kernels
from ..models.kv_cache import KVCache
from ..models.model import Transformer
from .draft_model import pick_draft, plain_greedy
from .drafting import DraftCost, DraftJob, Proposal


class AssistantDrafter:
    looks_up = False
    drafter = None  # no draft model with a cache: the draft policy prices this proposer by the steps it times
    reads_hidden = True  # every target pass's final hidden states (observe_hidden)

    def __init__(self, target: Transformer, assistant: AssistantModel, cache: KVCache):
        """`cache`: the target's (the assistant attends to its keys and values)."""
        if not isinstance(assistant, AssistantModel):
            raise InvalidParameterError(
                "the assistant speculative method needs a Gemma 4 assistant checkpoint (model_type gemma4_assistant) "
                "as --speculative-model"
            )
        if target.config.hybrid or target.fused_blocks is not None:
            raise InvalidParameterError("the assistant speculative method needs a Gemma 4 target on PyTorch")
        try:
            assistant.bind(target)
        except ValueError as exc:
            raise InvalidParameterError(f"this assistant does not fit this target: {exc}") from None
        self.target, self.model, self.cache = target, assistant, cache
        if type(target.lm_head).__name__ == "NativeLinear":  # a target on the native kernels: its drafter there too
            linears_on_the_kernels(assistant)
            assistant.native_head()
        # per slot: (the first position of its latest pass, that pass's final hidden states [rows, hidden])
        self.latest: list[tuple[int, torch.Tensor] | None] = [None] * cache.num_slots
        self.spent = DraftCost()

    def observe_hidden(self, slots: list[int], starts: list[int], hidden: torch.Tensor) -> None:
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            self.latest[slot] = (start, hidden[row])

    def admit(self, slot: int, partition: str) -> None:
        self.latest[slot] = None

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        return 0  # it reads the target's cache: nothing to catch up on

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        self.latest[slot] = None

    def forget(self, history: bool = True, prompts: bool = True) -> None:
        """Nothing is kept across requests."""

    @torch.inference_mode()
    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        drafted: dict[int, list[int]] = {job.slot: [] for job in jobs}
        ready = [(job, state) for job in jobs if job.k and (state := self._before_last(job)) is not None]
        if ready:
            self._chain([job for job, _ in ready], drafted, torch.stack([state for _, state in ready]))
        return [Proposal(torch.tensor(drafted[job.slot], dtype=torch.long)) for job in jobs]

    def _before_last(self, job: DraftJob) -> torch.Tensor | None:
        """The target's hidden state at the position before the job's last token, or None where its latest pass did
        not make it or its cache does not end there."""
        latest, position = self.latest[job.slot], len(job.tokens) - 2
        if latest is None or self.cache.lengths[job.slot] != position + 1:
            return None
        start, rows = latest
        return rows[position - start] if start <= position < start + rows.shape[0] else None

    def _chain(self, jobs: list[DraftJob], drafted: dict[int, list[int]], hidden: torch.Tensor) -> None:
        """Each job's drafts, one assistant step for all of them at a time, while a job wants more and has some."""
        active, tokens = list(range(len(jobs))), [job.tokens[-1] for job in jobs]
        for step in range(max(job.k for job in jobs)):
            slots = [jobs[i].slot for i in active]
            chosen = [tokens[i] for i in active]
            logits, out = self.model.step(self.target, chosen, hidden[active], cache=self.cache, slots=slots)
            hidden = hidden.clone()
            hidden[active] = out.to(hidden.dtype)
            for i, row in zip(active, logits, strict=True):
                job = jobs[i]
                choice = int(row.argmax()) if plain_greedy(job) else pick_draft(row, job, drafted[job.slot])
                if choice is not None:
                    drafted[job.slot].append(choice)
                    tokens[i] = choice
            active = [i for i in active if jobs[i].k > step + 1 and len(drafted[jobs[i].slot]) == step + 1]
            if not active:
                return
