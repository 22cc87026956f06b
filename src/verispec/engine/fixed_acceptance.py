"""A drafter of fixed acceptance: it drafts the target's own continuation, known beforehand, a set share of positions
wrong, so that speculative speed can be measured at a chosen acceptance on random weights (which draft nothing useful)
and tests reach every path of a verify pass (accepted, rejected mid-pass, token trees).

The acceptance it gives: the token drafted for position n is wrong where frac(n x 0.618...) >= `acceptance` (a
low-discrepancy sequence: over any stretch of positions the share wrong is 1 - acceptance, spread evenly), so a chain
of k drafts is cut at its first such position and each drafted token is right with probability `acceptance`, the
alpha of the speculative decoding papers. With `tree`, every
wrong node gets a sibling holding the right token, verified in the same pass (a token tree whose second branch is
taken). It knows only the continuations it is given: a sequence it has none for drafts nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .drafting import DraftCost, DraftJob, Proposal
from .methods import DraftModelUse, Method, register, unregister

ORACLE = "fixed-acceptance"
GOLDEN = (5**0.5 - 1) / 2  # its multiples modulo 1 spread more evenly than any other step's


class FixedAcceptance:
    looks_up, drafter = False, None

    def __init__(self, truths: list[list[int]], acceptance: float, tree: bool = False):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance {acceptance}: a share, 0 to 1")
        self.truths, self.acceptance, self.tree = truths, acceptance, tree
        self.spent = DraftCost()

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        return [self._draft(job) for job in jobs]

    def _draft(self, job: DraftJob) -> Proposal:
        n = len(job.tokens)
        truth = next((t for t in self.truths if t[:n] == job.tokens), [])[n : n + job.k]
        wrong = [((n + i) * GOLDEN) % 1.0 >= self.acceptance for i in range(len(truth))]
        chain = [(t - 1 if t else 1) if bad else t for t, bad in zip(truth, wrong, strict=True)]
        if not self.tree:
            return Proposal(torch.tensor(chain, dtype=torch.long))
        parents = list(range(-1, len(chain) - 1))
        for i in (i for i, bad in enumerate(wrong) if bad):
            if len(chain) >= job.widest:
                break
            chain.append(truth[i])  # the right token beside the wrong one: the branch verification takes
            parents.append(i - 1)
        return Proposal(torch.tensor(chain, dtype=torch.long), parents=parents if len(parents) > len(truth) else None)

    def admit(self, slot: int, partition: str) -> None: ...

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        return 0

    def finished(self, slot: int, output: list[int], partition: str) -> None: ...

    def forget(self, history: bool = True, prompts: bool = True) -> None: ...


@contextmanager
def fixed_acceptance(truths: list[list[int]], acceptance: float, tree: bool = False) -> Iterator[str]:
    """The method ORACLE registered while the block runs (its name yielded): drafts of `truths` (each prompt's whole
    sequence as plain decoding wrote it), each right with probability `acceptance`; `tree` as FixedAcceptance's. A
    tree holds up to twice k tokens."""
    register(Method(name=ORACLE, summary="drafts a known continuation at a fixed acceptance (benchmarks, tests)",
                    build=lambda setup: FixedAcceptance(truths, acceptance, tree), draft_model=DraftModelUse.UNUSED,
                    widest=lambda k: 2 * k if tree else k, trees=tree))  # fmt: skip
    try:
        yield ORACLE
    finally:
        unregister(ORACLE)
