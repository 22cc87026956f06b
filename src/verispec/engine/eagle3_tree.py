"""A dynamic draft tree (EAGLE-2, Li et al. 2024: "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees"), grown from a drafter's distributions and cut to what this machine's verify pass pays for.

Each node is a drafted token with its score: the sum of the drafter's log-probabilities along its path, whose
exponential approximates the chance that the target accepts the whole path (a well-trained head's confidence is
calibrated: EAGLE-2's observation). Growing: the root's children are the drafter's `children` likeliest tokens after
the context; at each further depth the `width` best-scored nodes of the depth before are expanded (one drafter pass
over all of them), each giving its `children` likeliest continuations. A chain is the tree of width 1 whose one child
per node is the drafter's own pick (its argmax, or its keyed draw: draft_model.pick_draft).

Cutting (`chosen`): the nodes in order of score (a child never scores above its parent, so every prefix of that
order is a tree), the first n of them where (1 + their summed path probabilities) / cost(n) is largest: the expected
tokens a round yields over what the verify pass with n drafted rows costs relative to one without (the policy's
measured passes, DraftPolicy.row_cost). Where wider passes cost nearly nothing (a memory-bound machine) that keeps
the whole tree; where each row costs (compute-bound products) it keeps little more than the likeliest path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Node:
    token: int
    parent: int  # the parent node's index, -1: the context
    depth: int  # 1: right after the context
    score: float  # summed log-probabilities along its path
    storage: int = -1  # where the drafter's cache holds the row that read it (once expanded), else -1


@dataclass
class DraftTree:
    width: int  # nodes expanded per depth
    children: int  # continuations kept per expanded node
    nodes: list[Node] = field(default_factory=list)
    # per expanded node (-1: the context's last row): the drafter's output after reading it
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)

    def add(self, parent: int, candidates: list[tuple[int, float]]) -> None:
        """Children of node `parent` (-1: the context): (token, log-probability) pairs, the likeliest first."""
        base = self.nodes[parent] if parent >= 0 else None
        depth, score = (base.depth + 1, base.score) if base is not None else (1, 0.0)
        for token, logprob in candidates[: self.children]:
            self.nodes.append(Node(token=token, parent=parent, depth=depth, score=score + logprob))

    def frontier(self, depth: int) -> list[int]:
        """The nodes of `depth` to expand: its `width` best-scored."""
        at = [i for i, node in enumerate(self.nodes) if node.depth == depth]
        return sorted(at, key=lambda i: -self.nodes[i].score)[: self.width]

    def ancestors(self, index: int) -> list[int]:
        """The nodes on the path to `index` (itself included), root first."""
        path = []
        while index >= 0:
            path.append(index)
            index = self.nodes[index].parent
        return path[::-1]

    def chosen(self, most: int, cost: Callable[[int], float | None] | None) -> tuple[list[int], list[int]]:
        """(tokens, parents) of the best tree of at most `most` nodes (parents first, -1: the context), cut where the
        expected tokens per cost of the pass is largest; `cost` None (or unmeasured): the `most` best."""
        order = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, self.nodes[i].depth, i))[:most]
        keep, best, total = len(order), 0.0, 1.0
        if cost is not None:
            keep = 0
            best = 1.0 / max(cost(0) or 1.0, 1e-9)
            for n, i in enumerate(order, 1):
                total += float(torch.tensor(self.nodes[i].score).exp())
                price = cost(n)
                if price is None:  # a width not measured yet: take it, so that it gets measured
                    keep = len(order)
                    break
                if total / price > best:
                    best, keep = total / price, n
        picked = sorted(order[:keep])  # creation order: parents before children
        number = {node: j for j, node in enumerate(picked)}
        return ([self.nodes[i].token for i in picked],
                [number[self.nodes[i].parent] if self.nodes[i].parent >= 0 else -1 for i in picked])  # fmt: skip


def top_candidates(logprobs: torch.Tensor, count: int, first: int | None = None) -> list[tuple[int, float]]:
    """The `count` likeliest (token, log-probability) of one row over the target's vocabulary, `first` (a pick that
    must be among them: a sampled draft's keyed draw) put first."""
    values, tokens = torch.topk(logprobs, min(count, logprobs.shape[-1]))
    pairs = [(int(t), float(v)) for t, v in zip(tokens, values, strict=True) if v > float("-inf")]
    if first is not None:
        pairs = [(first, float(logprobs[first]))] + [pair for pair in pairs if pair[0] != first]
    return pairs[:count]
