"""A drafter with a checkpoint of its own, added as docs/architecture.md ("Adding a drafter") says: one module and one
`register`, no edit to the engine or the loader.

ToyHead drafts a sequence's next token from the target's final hidden state at the position before its last token,
through a linear head of its own (the kind of head Medusa and EAGLE train), read from a safetensors file given as
--speculative-model. It reads the target's hidden states (`reads_hidden`: the engine has the target serve them),
keeps no cache, and drafts one token a step; what it proposes is a point mass, so the output is the target's
whatever the head says."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from verispec.engine.drafting import DraftCost, DraftJob, Proposal
from verispec.engine.methods import DraftModelUse, Method, register
from verispec.errors import InvalidParameterError

NAME = "toy-head"


def load_head(path: str, target) -> torch.Tensor:
    """The head's matrix [vocabulary, hidden] from its checkpoint, checked against the target it drafts for."""
    weight = load_file(path)["head.weight"]
    if weight.shape[1] != target.model.config.hidden_size:
        raise InvalidParameterError(
            f"this head reads hidden states of {weight.shape[1]} values; the target's have "
            f"{target.model.config.hidden_size}"
        )
    return weight


class ToyHead:
    looks_up = False
    drafter = None  # no draft model: the policy prices it by the steps it times
    reads_hidden = True

    def __init__(self, weight: torch.Tensor, slots: int):
        self.weight = weight
        self.latest: list[tuple[int, torch.Tensor] | None] = [None] * slots  # per slot: its latest pass's rows
        self.spent = DraftCost()

    def observe_hidden(self, slots: list[int], starts: list[int], hidden: torch.Tensor) -> None:
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            self.latest[slot] = (start, hidden[row])

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        return [Proposal(torch.tensor(self._draft(job), dtype=torch.long)) for job in jobs]

    def _draft(self, job: DraftJob) -> list[int]:
        latest, position = self.latest[job.slot], len(job.tokens) - 2
        if not job.k or latest is None or not latest[0] <= position < latest[0] + latest[1].shape[0]:
            return []
        return [int((self.weight @ latest[1][position - latest[0]].float()).argmax())]

    def admit(self, slot: int, partition: str) -> None:
        self.latest[slot] = None

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        return 0

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        self.latest[slot] = None

    def forget(self, history: bool = True, prompts: bool = True) -> None:
        """Nothing is kept across requests."""


register(
    Method(
        name=NAME,
        summary="a linear head over the target's hidden states, from its own checkpoint (an example)",
        build=lambda setup: ToyHead(setup.draft, setup.slots),
        draft_model=DraftModelUse.NEEDED,
        check=lambda target, head: None,  # load_head checked it against the target
        cache_bytes=lambda target, head: 0,  # no cache of its own
        limits=lambda target, head: (None, head.shape[0]),  # no context bound; it drafts ids below its rows
        load_draft=load_head,
    )
)
