"""The acceptance rule, as pure functions: a drafted token is kept while it equals the target's own token at its
row of the verify pass, then the target's token is emitted.

The target's own token is its argmax under greedy decoding (`verify_greedy`), else its draw from the filtered
distribution p at the row's position with noise keyed by the request's seed and that position (`verify_chain`
with decoding/noise.py's KeyedNoise.choose). Every emitted token is then the one plain decoding emits at its
position: the output is the target's own (greedy), follows p exactly (sampled), and equals plain decoding's text
for a seed, whatever was drafted. A draft model that draws with the same noise from its own q proposes the
target's token nearly as often as Leviathan et al.'s rejection rule (min(1, p/q)) would accept it
(docs/decisions.md#sampling).

A token tree (several lookups after one context, `verify_tree`) is verified by walking it: at each node take the
target's own token; follow the child drafted with that token, else emit it and stop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def verify_greedy(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    argmax: Callable[[torch.Tensor], torch.Tensor] = lambda x: x.argmax(-1),
) -> tuple[int, int]:
    """(number accepted, next token) for greedy decoding; target_logits has k+1 rows. `argmax` takes each row's
    argmax with torch's rule (first maximum, first NaN): the engine passes the native library's faster scan."""
    choices = argmax(target_logits)
    k = draft_tokens.shape[0]
    mismatches = (choices[:k] != draft_tokens).nonzero()
    n = int(mismatches[0]) if mismatches.numel() else k
    return n, int(choices[n])


def verify_chain(tokens: list[int], choose: Callable[[int], int]) -> tuple[int, int]:
    """(number accepted, next token) of a chain of drafted tokens checked against the target's own token at each
    row of the verify pass (`choose(row)`, row 0 after the context): accept while they are equal, then emit the
    target's. Rows past the first mismatch are never asked for. With `choose` the target's keyed sample at each
    row's position (decoding/noise.py), every emitted token is the one plain decoding draws there."""
    for row, token in enumerate(tokens):
        chosen = choose(row)
        if chosen != token:
            return row, chosen
    return len(tokens), choose(len(tokens))


def smoothed_acceptance(accepted: float, rejected: float, prior: float, weight: float) -> float:
    """A sequence's chance that a drafted token is accepted after `accepted` accepted drafts and `rejected`
    rejections (rounds that ended on one), starting from `prior` counted as `weight` drafts."""
    return (accepted + weight * prior) / (accepted + rejected + weight)


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens a round of k drafts yields on average when each is accepted with chance alpha (Leviathan et al.
    2023): E = (1 - alpha^(k+1)) / (1 - alpha); k + 1 when every draft is accepted."""
    if alpha >= 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def verify_tree(tokens: list[int], parents: list[int], choose: Callable[[int], int]) -> tuple[list[int], int]:
    """(the accepted path, next token) of a token tree of point masses: node i drafts tokens[i] after node
    parents[i] (-1: after the context). `choose(row)` is the target's own token at a row of the verify pass
    (row 0: after the context, row i + 1: after node i). The path lists the accepted nodes' rows, root to leaf."""
    children: dict[int, dict[int, int]] = {}
    for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        children.setdefault(parent + 1, {}).setdefault(token, i + 1)  # a repeated sibling is never followed
    path, row = [], 0
    while True:
        token = choose(row)
        child = children.get(row, {}).get(token)
        if child is None:
            return path, token
        path.append(child)
        row = child


def verify_batch(drafts: list[list[int]], parents: list[list[int] | None], choices: list[list[int]]):
    """Every sequence's verdict of one verify pass, from the target's own token at each of its rows (`choices`,
    computed for the whole batch at once): a chain's (accepted count, next token, None), a tree's (accepted
    count, next token, the accepted path's rows). The same as verify_chain / verify_tree one sequence at a time."""
    verdicts = []
    for tokens, tree, chosen in zip(drafts, parents, choices, strict=True):
        if tree is None:
            accepted, token = verify_chain(tokens, chosen.__getitem__)
            verdicts.append((accepted, token, None))
        else:
            path, token = verify_tree(tokens, tree, chosen.__getitem__)
            verdicts.append((len(path), token, path))
    return verdicts
