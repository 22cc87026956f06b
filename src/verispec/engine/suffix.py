"""Suffix drafting (SuffixDecoding, Oliaro et al. 2025): drafts that cost nothing, looked up in text the engine
has already seen — the request's own prompt and output so far, and the outputs of earlier requests.

    SuffixIndex           earlier requests' outputs, a suffix trie per partition, bounded in tokens and
                          partitions, fairly between tenants
    SuffixLookups         per sequence: the longest suffix of its context found in its own trie or in the index;
                          when found with enough confidence, the most frequent continuation, as long as the match
                          warrants; else the draft model (when there is one), else nothing

How long a lookup draft is follows the match: min(LOOKUP_MAX, FACTOR x match length) tokens, cut where the
continuation's frequency (the product of each step's count over its parent's) falls below MIN_SCORE. A long match
is text being copied (an edit returning a function, a quoted answer, a repeated tool call): drafting far ahead pays,
since a target pass over 16 rows costs far less than 16 steps. A lookup draft is a point mass: exact under the
acceptance rule whatever it proposes.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import torch

from ..decoding.acceptance import expected_tokens_per_round
from ..defaults import DEFAULT_SUFFIX_CACHE_TOKENS
from ..kernels.stack import TREE_ROWS
from ..kernels.suffix import SuffixTrie
from .drafting import DraftJob, Proposal
from .requests import is_private

LOOKUP_MAX = TREE_ROWS - 1  # tokens a lookup drafts at most: its verify rows (the pending token's too) a tree's
MATCH_MAX = 16  # the longest suffix a lookup matches: longer ones rarely predict better
# the trie's depth: a match and the longest lookup after it; its nodes (and memory) grow with depth x tokens
DEPTH = MATCH_MAX + LOOKUP_MAX + 1
FACTOR = 2.0  # a lookup drafts up to FACTOR x the matched length
MIN_SCORE = 0.1  # ... while the continuation's estimated chance stays above this
MIN_MATCH = 2  # shorter matches are left to the draft model (when there is one)
DEFAULT_INDEX_TOKENS = DEFAULT_SUFFIX_CACHE_TOKENS  # tokens of earlier requests kept (--suffix-cache-tokens)


DEFAULT_INDEX_PARTITIONS = 256  # partitions whose outputs are kept (each trie costs under 1 KB empty)
TRIAL_SHARE = 8  # partitions no request has come back to hold at most 1/TRIAL_SHARE of the index's tokens
REMEMBERED_VISITS = 4096  # partitions whose visits are counted (their names only), least recently seen forgotten


@dataclass
class _Partition:
    trie: SuffixTrie
    sequences: deque[list[int]]  # oldest first
    tokens: int = 0
    returned: bool = False  # a second request of this partition finished: what it holds is read


class SuffixIndex:
    """Earlier sequences, one trie per partition (a tenant: requests of one partition draft only from each other's
    outputs, engine/requests.py), bounded in tokens (`max_tokens` in all) and in partitions (`max_partitions`).

    Fair between tenants: a partition of which a single request has been admitted so far (one request's output, a
    tenant's first, or a partition made per request, such as a new cache_salt each time; counted as requests finish)
    is "on trial"; trial
    partitions hold at most max_tokens // TRIAL_SHARE tokens together and are the first to go, least recently used
    first, whole. Past that, the partition holding the most tokens gives up its oldest sequence. So a flood of
    one-off partitions churns the trial share alone, a tenant's second request keeps its partition, and the
    history a tenant comes back to stays. A trie is rebuilt once most of its nodes are dead. Touched only by the
    engine's thread."""

    def __init__(
        self, max_tokens: int = DEFAULT_INDEX_TOKENS, depth: int = DEPTH, max_partitions: int = DEFAULT_INDEX_PARTITIONS
    ):
        self.max_tokens, self.depth, self.max_partitions = max_tokens, depth, max(1, max_partitions)
        self.partitions: OrderedDict[str, _Partition] = OrderedDict()  # least recently used first
        self.visits: OrderedDict[str, int] = OrderedDict()  # requests finished per partition
        self.tokens = 0
        self.trial_tokens = 0
        self._empty = SuffixTrie(depth)  # what a partition without sequences looks up in

    def trie(self, partition: str = "") -> SuffixTrie:
        held = self.partitions.get(partition)
        return self._empty if held is None else held.trie

    def add(self, tokens: list[int], partition: str = "") -> None:
        """A request of `partition` finished, writing `tokens`: from the partition's second, what it holds is a
        tenant's."""
        self.visits[partition] = self.visits.pop(partition, 0) + 1
        if len(self.visits) > REMEMBERED_VISITS:
            self.visits.popitem(last=False)
        if not tokens or not self.max_tokens:
            return
        held = self.partitions.get(partition)
        if held is None:
            held = self.partitions[partition] = _Partition(SuffixTrie(self.depth), deque())
        if not held.returned and self.visits[partition] > 1:
            held.returned = True
            self.trial_tokens -= held.tokens
        self.partitions.move_to_end(partition)
        tokens = tokens[-(self.max_tokens if held.returned else self._trial_limit()) :]
        held.trie.add(tokens)
        held.sequences.append(tokens)
        self._count(held, len(tokens))
        self._bound()
        if held.trie.nodes > 4 * max(held.trie.live, 1024):  # mostly dead nodes: start over from what is kept
            held.trie = SuffixTrie(self.depth)
            for sequence in held.sequences:
                held.trie.add(sequence)

    def _trial_limit(self) -> int:
        return max(1, self.max_tokens // TRIAL_SHARE)

    def _count(self, held: _Partition, tokens: int) -> None:
        held.tokens += tokens
        self.tokens += tokens
        if not held.returned:
            self.trial_tokens += tokens

    def _bound(self) -> None:
        """Remove sequences until the index is within its bounds: trial partitions first (least recently used
        first, whole), then the oldest sequence of the partition holding the most tokens (or, over the count of
        partitions, the least recently used one)."""
        while (
            len(self.partitions) > self.max_partitions
            or self.trial_tokens > self._trial_limit()
            or self.tokens > self.max_tokens
        ):
            trial = next((name for name, held in self.partitions.items() if not held.returned), None)
            if trial is not None:
                self._drop(trial)
            elif len(self.partitions) > self.max_partitions:
                self._drop(next(iter(self.partitions)))
            else:
                self._remove_oldest(max(self.partitions, key=lambda name: self.partitions[name].tokens))

    def _drop(self, partition: str) -> None:
        held = self.partitions.pop(partition)
        self._count(held, -held.tokens)

    def _remove_oldest(self, partition: str) -> None:
        held = self.partitions[partition]
        if len(held.sequences) == 1:
            self._drop(partition)
            return
        oldest = held.sequences.popleft()
        held.trie.add(oldest, -1)
        self._count(held, -len(oldest))


@dataclass
class _Followed:
    """One sequence's own trie, fed with its tokens as they come."""

    key: str
    trie: SuffixTrie
    fed: int = 0


@dataclass(frozen=True)
class Lookup:
    tokens: list[int]
    match: int  # the matched suffix's length
    expected: float = 0.0  # the tokens of it expected to be accepted: the sum of each node's score x alpha^depth
    parents: list[int] | None = None  # a token tree's (Proposal.parents); None for a chain
    chances: tuple[float, ...] = ()  # a chain's: each token's chance of being accepted with those before it


LOOKUP_MARGIN = 0.05  # a priced lookup drafts only if it yields this much more per second than not drafting


def priced(lookup: Lookup, cost, batch: int = 1) -> Lookup | None:
    """The lookup cut to the length that yields the most tokens per second of verification (`cost(n)`: the pass
    with n drafted rows over the pass without them, DraftPolicy.row_cost), or None when no length beats not
    drafting by LOOKUP_MARGIN. The pass yields a token per sequence of its `batch`, plus the accepted drafts: the
    first n chances' sum. Token trees are not cut (they use the rows a pass has left)."""
    if cost is None or lookup.parents is not None or not lookup.chances:
        return lookup
    best, best_rate, expected = 0, 1.0, 0.0
    for n, chance in enumerate(lookup.chances, 1):
        expected += chance
        factor = cost(n)
        if factor is None:  # unmeasured widths: as long as measured ones say
            if n == 1:  # no wider pass measured yet: this lookup drafts unpriced, and its pass gets measured
                return lookup
            break
        if (1 + expected / batch) / factor > best_rate:
            best, best_rate = n, (1 + expected / batch) / factor
    if best == 0 or best_rate < 1 + LOOKUP_MARGIN:
        return None
    return Lookup(
        lookup.tokens[:best],
        lookup.match,
        expected=sum(lookup.chances[:best]),
        parents=None,
        chances=lookup.chances[:best],
    )


def best_lookup(
    tries: list[SuffixTrie], context: list[int], most: int, alpha: float = 1.0, tree: bool = False
) -> Lookup | None:
    """The draft of the longest match among `tries` (the first trie wins a tie), or None below MIN_MATCH.

    Its j-th token is kept while its frequency score times alpha^j stays above MIN_SCORE: in text the sequence
    does not copy (a summary of its prompt), matches are short-lived and a long draft would widen every verify
    pass for nothing; in text it copies, alpha stays near 1 and the draft runs to its length.

    With `tree`, the rows a pass of `most` + 1 has left after the chain hold branches off it (_with_branches):
    where the text forked, the verify pass also tries the other continuations."""
    best: tuple[int, SuffixTrie, int] | None = None
    for trie in tries:
        node, length = trie.match(context, MATCH_MAX)
        if length >= MIN_MATCH and (best is None or length > best[2]):
            best = (node, trie, length)
    if best is None or most < 1:
        return None
    node, trie, length = best
    budget = min(most, LOOKUP_MAX, math.ceil(FACTOR * length))
    found = trie.candidates(node, budget, MIN_SCORE, chain=True)
    chances = [score * alpha ** (j + 1) for j, score in enumerate(found.scores)]
    kept = next((j for j, chance in enumerate(chances) if chance < MIN_SCORE), len(chances))
    if not kept:
        return None
    chain = Lookup(found.tokens[:kept], length, sum(chances[:kept]), chances=tuple(chances[:kept]))
    room = min(most, LOOKUP_MAX) - kept
    if not tree or room <= 0:
        return chain
    alternatives = trie.candidates(node, kept + room, MIN_SCORE, chain=False)
    return _with_branches(
        chain, alternatives.tokens, parents=alternatives.parents, scores=alternatives.scores, alpha=alpha, room=room
    )


def _with_branches(
    chain: Lookup, tokens: list[int], parents: list[int], scores: list[float], alpha: float, room: int
) -> Lookup:
    """The chain, then up to `room` more nodes off it: the likeliest other continuations (a tree's candidates,
    best first), each kept while its score x alpha^depth stays above MIN_SCORE. The chain keeps its whole length:
    branches only use rows a 16-row pass has left (a tree that split the chain's budget measured slower)."""
    out_tokens, out_parents, expected = list(chain.tokens), list(range(-1, len(chain.tokens) - 1)), chain.expected
    on_chain: dict[int, int] = {}  # candidate -> its chain position
    added: dict[int, int] = {}  # candidate -> its node among the branches
    depths: dict[int, int] = {}
    for i, (token, parent, score) in enumerate(zip(tokens, parents, scores, strict=True)):
        if parent >= 0 and parent not in on_chain and parent not in added:
            continue
        depths[i] = 1 if parent < 0 else depths[parent] + 1
        position = 0 if parent < 0 else on_chain.get(parent, -1) + 1
        if (parent < 0 or parent in on_chain) and position < len(chain.tokens) and token == chain.tokens[position]:
            on_chain[i] = position
            continue
        chance = score * alpha ** depths[i]
        if room == 0 or chance < MIN_SCORE:
            continue
        added[i] = len(out_tokens)
        out_tokens.append(token)
        out_parents.append(-1 if parent < 0 else on_chain[parent] if parent in on_chain else added[parent])
        expected += chance
        room -= 1
    if len(out_tokens) == len(chain.tokens):
        return chain
    return Lookup(out_tokens, chain.match, expected, out_parents)


def model_expects(job: DraftJob) -> float:
    """The tokens of the draft model's k drafts expected to be accepted, at the sequence's alpha for them."""
    return expected_tokens_per_round(job.pricing.model_alpha, job.k) - 1


def lookup_pays(lookup: Lookup, job: DraftJob) -> bool:
    """A lookup drafts unless the draft model yields more tokens per second: a round yields its accepted drafts
    plus the target's own token, and the model's round costs its drafting and catch-up (model_price, in verify
    passes) on top of the verify pass both pay."""
    return (1 + lookup.expected) * (1 + job.pricing.model_price) >= 1 + model_expects(job)


class SuffixLookups:
    """Lookups (Lookups, proposer.py) in each sequence's own trie, in the tries of the other running sequences of its
    partition (a response helps its neighbours while it is written: parallel requests of one agent draft from each
    other) and in the index of earlier requests' outputs of its partition; each cut to what pays on this machine
    (priced) and left to the draft model where that yields more (lookup_pays)."""

    always = True  # priced by the rows they add, they draft whatever the draft model's k

    def __init__(self, index: SuffixIndex, num_slots: int):
        self.index = index
        self.followed: list[_Followed | None] = [None] * num_slots
        self.partitions = [""] * num_slots  # each slot's request's partition (admit)

    def find(self, jobs: list[DraftJob], model: bool) -> list[Proposal | None]:
        for job in jobs:  # every running sequence's trie up to date first: each is read by its neighbours
            self._followed(job.slot, job.key, job.tokens)
        found = [self._lookup(job.slot, job.tokens, job.widest, alpha=job.pricing.alpha, tree=job.pricing.tree)
                 for job in jobs]  # fmt: skip
        found = [
            lookup if lookup is None else priced(lookup, job.pricing.row_cost, job.pricing.batch)
            for job, lookup in zip(jobs, found, strict=True)
        ]
        if model:  # a lookup the draft model would beat is left to it
            found = [None if lookup is None or not lookup_pays(lookup, job) else lookup
                     for job, lookup in zip(jobs, found, strict=True)]  # fmt: skip
        return [None if lookup is None else _proposal(lookup) for lookup in found]

    def drafts(self, slot: int, tokens: list[int]) -> bool:
        return self._lookup(slot, tokens, 1) is not None

    def admit(self, slot: int, partition: str) -> None:
        """A new request in `slot`, of `partition`: it looks up in that partition's outputs only."""
        self.partitions[slot] = partition
        self.followed[slot] = None

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        """A request ended: its output joins the index of earlier requests, in its partition (a private one,
        which no later request can read, PRIVATE in engine/requests.py, keeps nothing)."""
        if not is_private(partition):
            self.index.add(output, partition)
        self.followed[slot] = None

    def forget(self) -> None:
        """Drop the index of earlier requests (a bench's warm-up must not leave answers behind)."""
        self.index = SuffixIndex(self.index.max_tokens, self.index.depth, self.index.max_partitions)

    def _lookup(self, slot: int, tokens: list[int], most: int, alpha: float = 1.0, tree: bool = False) -> Lookup | None:
        partition = self.partitions[slot]
        own = self.followed[slot]
        neighbours = [f.trie for other, f in enumerate(self.followed)
                      if f is not None and other != slot and self.partitions[other] == partition]  # fmt: skip
        tries = ([own.trie] if own is not None else []) + neighbours + [self.index.trie(partition)]
        return best_lookup(tries, tokens, most=most, alpha=alpha, tree=tree)

    def _followed(self, slot: int, key: str | None, tokens: list[int]) -> _Followed:
        """The slot's own trie, fed up to all but the last of `tokens` (the last has no continuation yet); a new
        request in the slot starts a new one."""
        followed = self.followed[slot]
        if followed is None or followed.key != key or followed.fed > len(tokens):
            followed = self.followed[slot] = _Followed(key, SuffixTrie(DEPTH))
        followed.trie.extend(tokens[followed.fed :])
        followed.fed = len(tokens)
        return followed


def _proposal(lookup: Lookup) -> Proposal:
    tokens = torch.tensor(lookup.tokens, dtype=torch.long)
    chain = lookup.parents is None or lookup.parents == list(range(-1, len(lookup.tokens) - 1))
    return Proposal(tokens, looked_up=True, parents=None if chain else lookup.parents)
