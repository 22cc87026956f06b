"""The Proposer interface (what drafts for the engine), Lookups (drafts found in text already seen) and
LookupThenModel, the one way lookups and a draft model are combined. The methods by name are in methods.py; what a
proposer is asked and answers in drafting.py; the draft model in draft_model.py; lookups in prompt_lookup.py and
suffix.py.

A proposer drafts for many sequences at once (a batch of one is the single-sequence case). The engine asks it:

    propose(jobs)            each job's drafted tokens (a point mass each: the acceptance rule checks every one
                             against the target's own token at its position, so no proposer can change the output);
                             at most job.most tokens (the engine reserved room for no more: a wider proposal fails
                             its own request)
    admit(slot, partition)   a new request holds `slot`; what the proposer kept for another partition is not its
    lag(slot, tokens)        tokens the draft model must catch up on before it drafts for this sequence
    finished(slot, output, partition)   a request ended: its output, for proposers that draft from earlier ones
    forget(history, prompts) drop what earlier requests wrote, or read (a bench meets each prompt fresh)
    spent                    what the last propose spent on the draft model: catch-up seconds and tokens, and
                             whether the model ran (the draft policy prices the model and lookups apart)
    looks_up                 whether it drafts lookups, which the engine asks for even when the draft model's k
                             is 0 (they cost nothing to draft, and are priced by the rows they add to the pass)
    drafter                  its draft model (a BatchedDrafter), or None
    reads_hidden             (optional) it reads the target's hidden states: the engine has the target serve every
                             pass's final hidden states to its observe_hidden(slots, starts, hidden [batch, seq, H])

Rolling back is implicit: at each propose a proposer compares what it holds for a slot with the sequence's tokens
and keeps the common prefix, so rejected drafts are forgotten without being told.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .draft_model import BatchedDrafter
from .drafting import DraftCost, DraftJob, Proposal


class Proposer(Protocol):
    looks_up: bool
    drafter: BatchedDrafter | None
    spent: DraftCost

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]: ...

    def admit(self, slot: int, partition: str) -> None: ...

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int: ...

    def finished(self, slot: int, output: list[int], partition: str) -> None: ...

    def forget(self, history: bool = True, prompts: bool = True) -> None: ...


class Lookups(Protocol):
    """Drafts found in text already seen (the context, earlier outputs): free to draft, no probabilities."""

    # drafts even in steps where the draft model's k is 0 (it prices its own rows), else only beside the model
    always: bool

    def find(self, jobs: list[DraftJob], model: bool) -> list[Proposal | None]:
        """Each job's lookup, or None where it has none (or, `model`: where the draft model would do better)."""
        ...

    def drafts(self, slot: int, tokens: list[int]) -> bool:
        """Whether a lookup would draft for the sequence (then its draft model needs no catch-up)."""
        ...

    def admit(self, slot: int, partition: str) -> None: ...

    def finished(self, slot: int, output: list[int], partition: str) -> None: ...

    def forget(self) -> None: ...


class LookupThenModel:
    """Lookups first; the jobs they leave to the draft model (when there is one, and it may draft: k > 0) go to it in
    one batched propose, and the proposals are put back in the jobs' order."""

    def __init__(self, lookups: Lookups, drafter: BatchedDrafter | None):
        self.lookups, self.drafter = lookups, drafter
        self.looks_up = lookups.always
        self.spent = DraftCost()

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        found = self.lookups.find(jobs, self.drafter is not None)
        rest = [job for job, proposal in zip(jobs, found, strict=True) if proposal is None and job.k and self.drafter]
        modelled = iter(self.drafter.propose(rest) if rest else [])
        self.spent = self.drafter.spent if rest else DraftCost()
        empty = Proposal(torch.empty(0, dtype=torch.long), looked_up=True)
        return [
            proposal if proposal is not None else next(modelled) if job.k and self.drafter is not None else empty
            for job, proposal in zip(jobs, found, strict=True)
        ]

    def admit(self, slot: int, partition: str) -> None:
        self.lookups.admit(slot, partition)
        if self.drafter is not None:
            self.drafter.admit(slot, partition)

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        if self.drafter is None or self.lookups.drafts(slot, tokens):
            return 0
        return self.drafter.lag(slot, tokens, model_tokens)

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        self.lookups.finished(slot, output, partition)

    def forget(self, history: bool = True, prompts: bool = True) -> None:
        if history:
            self.lookups.forget()
        if prompts and self.drafter is not None:
            self.drafter.forget(history=False, prompts=True)
