"""The acceptance rule of Leviathan et al. / Chen et al. (2023), as a pure function.

Given k drafted tokens d_i with the draft's distributions q_i and the target's distributions
p_1..p_{k+1} (one target pass over [last, d_1..d_k]), accept d_i with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit a token from norm(max(0, p_i - q_i));
if all k pass emit a bonus token from p_{k+1}. The emitted tokens then follow p exactly.

A drafter without probabilities (n-gram lookup) is a point mass: q_i(d_i) = 1.
Greedy decoding is the one-hot case: accept while d_i equals argmax p_i, then emit that argmax.

A token tree of point masses (several lookups after one context, `verify_tree`) is verified by walking it: at each
node take the target's own token (its argmax, or a sample from p at that node); follow the child drafted with that
token, else emit it and stop. Every emitted token is then the target's own choice at its position, so the output
is the target's (greedy) or follows p exactly (sampled), whatever the tree holds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .sampling import sample


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


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """(number accepted, next token) by the rejection rule; target_probs has k+1 rows."""
    k = draft_tokens.shape[0]
    rows = torch.arange(k)
    p = target_probs[rows, draft_tokens]
    q = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones(k)
    u = torch.rand(k, generator=generator)
    rejected = (u * q >= p).nonzero()  # u < p/q accepts; p >= q always accepts since u < 1
    if not rejected.numel():
        return k, int(sample(target_probs[k], generator))
    n = int(rejected[0])
    if draft_probs is not None:
        residual = (target_probs[n] - draft_probs[n]).clamp_min(0)
    else:
        residual = target_probs[n].clone()
        residual[draft_tokens[n]] = 0
    if residual.sum() <= 0:  # only reachable through float round-off
        residual = target_probs[n]
    return n, int(sample(residual / residual.sum(), generator))


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
