"""A step's drafting: how many tokens the draft model drafts for each sequence (the policy's one k for the batch,
within each sequence's limit), the jobs the method's proposer is asked (lookups priced by what their rows cost), its
proposals, and what the step cost (for the policy's prices and the metrics). Which method drafts is the proposer's
business: nothing here knows one by its name."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import torch

from .drafting import DraftJob, LookupPricing, Proposal
from .metrics import Metrics
from .policy import DraftPolicy, StepCost, estimated_alpha
from .proposer import Proposer
from .sequence import Sequence, Slots

log = logging.getLogger("verispec.server")


class DraftRound:
    def __init__(self, proposer: Proposer | None, policy: DraftPolicy, metrics: Metrics, slots: Slots, *,
                 k: int, widest: int, context: int, trees: bool, guarded: Callable[..., object],
                 joining: Callable[[], bool]):  # fmt: skip
        """`k`: the draft model's most tokens a step; `widest`: the most a proposal holds; `context`: the longest
        context; `trees`: proposals may be token trees (the target takes them, the configuration asks for them);
        `joining()`: a prompt waits for a slot (a burst is starting)."""
        self.proposer, self.policy, self.metrics, self.slots = proposer, policy, metrics, slots
        self.k, self.widest, self.context, self.trees = k, widest, context, trees
        self.guarded, self.joining = guarded, joining

    # ---- how many tokens --------------------------------------------------------------------------------------
    def limits(self, seqs: list[Sequence]) -> list[int]:
        """The most tokens the draft model may draft for each sequence this step (0: it may not draft)."""
        if self.proposer is None:
            return [0] * len(seqs)
        return [max(0, min(self.k, self.tokens_left(seq) - 1)) if seq.request.speculative else 0 for seq in seqs]

    def choose_ks(self, seqs: list[Sequence], limits: list[int], records: list[tuple[int, int]]) -> list[int]:
        """Each sequence's k this step: the policy's one k for the batch (DraftPolicy.choose_k), within each
        sequence's limit."""
        eligible = [i for i, limit in enumerate(limits) if limit]
        # k governs the draft model: its own acceptance, not the lookups' (copied text is accepted far more often)
        acceptance = [self.policy.acceptance(*records[i]) for i in eligible]
        lags = [self.proposer.lag(seqs[i].slot, seqs[i].tokens, seqs[i].draft_tokens) for i in eligible]
        evidence = self.policy.settings.evidence_tokens
        young = [(n, self.tokens_left(seqs[i])) for i, lag in zip(eligible, lags, strict=True)
                 if lag and (n := len(seqs[i].stopper.token_ids)) < evidence]  # fmt: skip
        # the tokens still to come: the lookups' expected share of them, which the draft model must read before
        # it drafts again, and the rest, which it would draft
        left = [(self._expected_left(seqs[i]), self._coverage(seqs[i])) for i in eligible]
        # a burst is starting: a prompt still prefills, or waits for a free slot (over HTTP a burst's later
        # requests arrive while the first prefills, after this step's admission)
        joining = len(seqs) < len(self.slots.running) or self.joining()
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

    def _widest(self, seq: Sequence) -> int:
        """The most tokens the sequence's proposal may hold this step: the method's widest (what its cache reserves
        room for), within the tokens it may still generate."""
        return max(0, min(self.widest, self.tokens_left(seq) - 1))

    def _coverage(self, seq: Sequence) -> float:
        """The share of the sequence's tokens still to come that its lookups are expected to give."""
        return self.policy.lookup_coverage(seq.stats.accepted_by_lookup, seq.stats.new_tokens)

    def _expected_left(self, seq: Sequence) -> float:
        """The tokens the sequence is expected to write still, from earlier answers (DraftPolicy.expected_left)."""
        return self.policy.expected_left(len(seq.stopper.token_ids), self.tokens_left(seq))

    def tokens_left(self, seq: Sequence) -> int:
        """The most tokens the sequence may still generate (max_tokens, or the context, whichever ends first)."""
        return min(self.context - len(seq.tokens) + 1, seq.request.max_tokens - len(seq.stopper.token_ids))

    @staticmethod
    def model_record(seq: Sequence) -> tuple[int, int]:
        """The sequence's accepted drafts and rejections of the draft model's rounds (its lookups' taken out)."""
        model = seq.stats.by_proposer()["model"]
        return model.accepted, model.rejected

    # ---- the proposals ----------------------------------------------------------------------------------------
    def propose(
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
        if looks_up or self.trees:  # what rows cost: a lookup's, or a tree's, size is priced by it
            self._price_lookups(seqs, ks, jobs)
        try:
            for (i, _), proposal in zip(jobs, self.proposer.propose([job for _, job in jobs]), strict=True):
                proposals[i] = proposal
        except Exception:
            log.debug("a batched propose raised; proposing job by job", exc_info=True)
            for i, job in jobs:
                result = self.guarded(seqs[i], self.proposer.propose, [job])
                proposals[i] = result[0] if result is not None else None
        for i, job in jobs:
            if proposals[i] is not None and self.guarded(seqs[i], _check_width, job, proposals[i]) is None:
                proposals[i] = None
        return proposals

    def _job(self, seq: Sequence, k: int, record: tuple[int, int]) -> DraftJob:
        return DraftJob(
            slot=seq.slot, tokens=seq.tokens, k=k, most=self._widest(seq), params=seq.request.params,
            noise=seq.noise, adjustments=seq.adjustments, grammar=seq.grammar, model_tokens=seq.draft_tokens,
            key=seq.request.request_id,
            pricing=LookupPricing(
                alpha=estimated_alpha(seq.stats.accepted_by_lookup, seq.stats.rejected_by_lookup),
                model_alpha=estimated_alpha(*record), tree=self.takes_trees(seq),
            ),
        )  # fmt: skip

    def takes_trees(self, seq: Sequence) -> bool:
        return self.trees and not seq.adjustments.penalises

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
        a proposer's choice between a lookup and the model."""
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

    # ---- what it cost -----------------------------------------------------------------------------------------
    def record_step(self, batch: int, ks: list[int], proposals: list[Proposal | None], *, draft_seconds: float,
                    verify_seconds: float, preempted: bool) -> None:  # fmt: skip
        """The step's costs, for the policy's prices and the metrics (`preempted`: a preemption took rows out)."""
        spent = self.proposer.spent if any(ks) else None
        caught_up = (spent.catch_up_seconds, spent.catch_up_tokens) if spent is not None else (0.0, 0)
        drafting = sum(1 for k in ks if k)
        # a longer lookup's verify pass is not what the policy's k costs, nor one a preemption took rows out of (a
        # token tree its drafter grew k deep is: the rows it chose at that k)
        longer = any(p is not None and p.looked_up and p.tokens.shape[0] > max(ks) for p in proposals)
        if not longer and not preempted:
            cost = StepCost(batch=batch, drafting=drafting, k=max(ks), draft_seconds=draft_seconds,
                            verify_seconds=verify_seconds, catch_up_seconds=caught_up[0],
                            catch_up_tokens=caught_up[1], modelled=spent is not None and spent.modelled)  # fmt: skip
            self.record_costs(cost)
        log.debug(
            "step: %d sequences, k = %d for %d, draft %.3f s (catch-up %.3f s, %d tokens), verify %.3f s",
            batch, max(ks), drafting, draft_seconds, *caught_up, verify_seconds,
        )  # fmt: skip

    def record_costs(self, cost: StepCost) -> None:
        self.policy.record(cost)
        self.metrics.record_step(cost, self.policy)


def _check_width(job: DraftJob, proposal: Proposal) -> bool:
    """A proposal holds at most the tokens its job allows (DraftJob.widest): the room the engine reserved."""
    if proposal.tokens.shape[0] > job.widest:
        raise RuntimeError(
            f"the proposer drafted {proposal.tokens.shape[0]} tokens where at most {job.widest} were reserved "
            "(its method's `widest` in engine/methods.py is too small)"
        )
    return True
