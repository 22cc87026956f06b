"""Drafting with an EAGLE-3 head (models/eagle3.py, read by models/eagle3_checkpoint.py): the `eagle3` method.

The head reads the target's features: the residual streams entering three of its layers (`hidden_layers`: the
engine has the target serve them, Transformer.serve_hidden), fused by the head's fc as each pass hands them over and
kept per slot and position until the head reads them. At each propose a sequence of n tokens (the last, the target's
own, not yet verified) has the target's features of positions 0 .. n - 2 from passes where those tokens were final
(prefill chunks, then verify passes: a rejected draft's position is recomputed by the next pass before it is read; a
token tree's accepted nodes are found by the tokens that followed, as KVCache.keep_path keeps them). The head catches
up on positions [held, n - 1) with (tokens[i + 1], g[i]), its last row drafting the token after the target's own;
further drafts read the head's own output in place of g, at the positions after. Its cache holds the positions it
read from `first` on (a prompt start reused from the prefix cache was never computed by this target, so the head
starts after it); the drafted rows past `held` are guesses, forgotten at the next propose.

A sequence drafts a chain (each draft the head's pick: draft_model.pick_draft) or, where its job allows trees and no
grammar or logit adjustment shapes its drafts, a dynamic tree (eagle3_tree.py) cut to what the verify pass's rows cost
(the job's LookupPricing.row_cost). Drafts are point masses to the acceptance rule like any proposer's, so the output
is the target's whatever the head proposes.

On the native stack the head's matrices run on the native kernels in Q4_0 (requantized once; the head only proposes,
so the coarser rounding changes which tokens it proposes, never the output): an 8B target's head then reads about a
twentieth of what the target's pass reads. Beside a PyTorch target it runs as stored, in float32.
"""

from __future__ import annotations

import time

import torch

from ..models.eagle3 import Eagle3Head, visible_chain
from ..models.model import Transformer
from .draft_model import pick_draft, plain_greedy
from .drafting import DraftCost, DraftJob, Proposal
from .eagle3_tree import DraftTree, top_candidates
from .hidden_proposer import CATCH_UP_ROWS, HiddenStateProposer, own_cache
from .setup import Setup

TREE_NODES = 15  # the most nodes a tree holds: a verify pass's tree is at most 16 rows from its root (TREE_ROWS)
TREE_WIDTH = 4  # nodes expanded per depth, and continuations kept per node
MAX_DEPTH = 15


def eagle3_drafter(setup: Setup, coarse: bool | None = None) -> Eagle3Drafter:
    """The `eagle3` method's proposer: the head given as --speculative-model (setup.draft), its matrices on the
    native kernels in Q4_0 where the target runs on the native stack (`coarse`: that choice forced)."""
    target, head = setup.target.model, setup.draft
    if coarse is None:
        coarse = target.fused_blocks is not None
    if coarse:
        head.on_the_kernels()
    expansion = MAX_DEPTH * TREE_WIDTH + CATCH_UP_ROWS
    return Eagle3Drafter(target, head, **own_cache(setup, expansion))


class Eagle3Drafter(HiddenStateProposer):
    def __init__(self, target: Transformer, head: Eagle3Head, *, slots: int, max_len: int,
                 num_blocks: int | None = None):  # fmt: skip
        self.target, self.head = target, head
        self.hidden_layers = head.spec.layers_of(target.config.num_layers)
        self.vocab = target.config.vocab_size
        self.cache = head.new_cache(slots, max_len, num_blocks)
        self.fused: list[dict[int, torch.Tensor]] = [{} for _ in range(slots)]  # per slot: position -> g
        self.first = [0] * slots  # per slot: the position its cache starts at (stored at 0)
        self.held = [0] * slots  # per slot: positions up to which the head has read the target (final ones)
        self.proposed: list[tuple[int, list[int], list[int]] | None] = [None] * slots  # a tree awaiting its pass
        self.unresolved: list[tuple | None] = [None] * slots  # a verified tree's nodes' g, awaiting its tokens
        self.spent = DraftCost()

    # ---- what the target hands over ------------------------------------------------------------------------------
    def observe_hidden(self, slots: list[int], starts: list[int], hidden: torch.Tensor) -> None:
        """Every pass's features, fused (g), kept by position until read; a token tree's nodes apart, until the
        tokens that followed say which were accepted."""
        with torch.inference_mode():
            fused = self.head.fuse(hidden)
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            rows = fused[row]
            proposed = self.proposed[slot]
            if proposed is not None and start <= proposed[0] < start + rows.shape[0]:
                root, tokens, _ = proposed
                nodes = rows[root - start + 1 : root - start + 1 + len(tokens)]
                self.unresolved[slot] = (proposed, nodes) if nodes.shape[0] == len(tokens) else None
                self.proposed[slot] = None
                rows = rows[: root - start + 1]
            kept = self.fused[slot]
            for t in range(rows.shape[0]):
                kept[start + t] = rows[t]

    def _resolve(self, slot: int, tokens: list[int]) -> None:
        """A verified tree's accepted nodes' g at their positions, found by walking it along the tokens that
        followed its root (the first child drafted with each, as verify_tree follows it)."""
        if self.unresolved[slot] is None:
            return
        (root, drafted, parents), nodes = self.unresolved[slot]
        self.unresolved[slot] = None
        node = -1
        for depth, token in enumerate(tokens[root + 1 :]):
            child = next((j for j, p in enumerate(parents) if p == node and drafted[j] == token), None)
            if child is None:
                return
            self.fused[slot][root + 1 + depth] = nodes[child]
            node = child

    # ---- the engine's questions ---------------------------------------------------------------------------------
    def admit(self, slot: int, partition: str) -> None:
        self.cache.release(slot)
        self.fused[slot].clear()
        self.first[slot] = self.held[slot] = 0
        self.proposed[slot] = self.unresolved[slot] = None

    # ---- drafting -----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        for job in jobs:
            self._resolve(job.slot, job.tokens)
            self.proposed[job.slot] = None
        ready = [job for job in jobs if job.k and self._readable(job)]
        drafted: dict[int, tuple[list[int], list[int] | None]] = {job.slot: ([], None) for job in jobs}
        if ready:
            last = self._catch_up(ready)
            trees = {job.slot: self._grow(job, row) for job, row in zip(ready, last, strict=True)}
            self._expand(ready, trees)
            for job in ready:
                drafted[job.slot] = self._cut(job, trees[job.slot])
        return [self._proposal(job, *drafted[job.slot]) for job in jobs]

    def _proposal(self, job: DraftJob, tokens: list[int], parents: list[int] | None) -> Proposal:
        if parents is not None:  # its verify pass hands over the nodes' features: kept apart until resolved
            self.proposed[job.slot] = (len(job.tokens) - 1, tokens, parents)
        return Proposal(torch.tensor(tokens, dtype=torch.long), parents=parents)

    def _readable(self, job: DraftJob) -> bool:
        """Whether the target's features of every position from `held` to the last before the sequence's newest token
        are kept; where some are missing (a prompt start taken from the prefix cache, a tree cut by its grammar) the
        head starts over after the last gap. False where there is nothing new to read."""
        slot, end = job.slot, len(job.tokens) - 1
        kept, start = self.fused[slot], end
        while start > self.held[slot] and start - 1 in kept:
            start -= 1
        if start == end:
            return False
        if start > self.held[slot]:  # a gap: the head reads from after it
            self.cache.release(slot)
            self.first[slot] = self.held[slot] = start
            for position in [p for p in kept if p < start]:
                del kept[position]
        return True

    def _catch_up(self, jobs: list[DraftJob]) -> torch.Tensor:
        """Read what each sequence's target passes gave since the last propose; returns each job's last output
        [jobs, hidden] (the row that drafts first). A long catch-up (a prompt) is fed alone first, FEED_ROWS rows a
        pass, so that no other job is padded to it."""
        begin = time.perf_counter()
        for job in jobs:  # the drafted guesses of the last propose are forgotten
            slot = job.slot
            self.cache.set_length(slot, min(self.held[slot] - self.first[slot], self.cache.lengths[slot]))
        caught_up = self._feed_long_catch_ups(jobs)
        last = self._feed(jobs, [len(job.tokens) - 1 for job in jobs])
        if caught_up:  # the context the head lacked (a prompt), beyond a step's accepted tokens
            self.spent.catch_up_seconds, self.spent.catch_up_tokens = time.perf_counter() - begin, caught_up
        return last

    def _feed(self, jobs: list[DraftJob], ends: list[int]) -> torch.Tensor:
        """The head over each job's positions [held, end) (the token at i + 1, g at i), in one padded pass; returns
        each job's last output [jobs, hidden]. What is read is forgotten only once the head has run on it."""
        rows, fused, starts = [], [], []
        for job, end in zip(jobs, ends, strict=True):
            slot, held = job.slot, self.held[job.slot]
            rows.append(job.tokens[held + 1 : end + 1])
            fused.append(torch.stack([self.fused[slot][i] for i in range(held, end)]))
            starts.append(held - self.first[slot])
        width = max(len(row) for row in rows)
        tokens = torch.tensor([row + [0] * (width - len(row)) for row in rows], device=self.head.fc_device)
        g = torch.stack([torch.cat([f, f[-1:].expand(width - len(f), -1)]) for f in fused])
        positions = torch.tensor([[self.held[job.slot] + t for t in range(width)] for job in jobs])
        out = self.head(
            self.head.embeddings(tokens, self.target), g, cache=self.cache, slots=[job.slot for job in jobs],
            starts=starts, positions=positions, visible=visible_chain(starts, [len(row) for row in rows], width),
        )  # fmt: skip
        for job, end in zip(jobs, ends, strict=True):
            slot = job.slot
            for i in range(self.held[slot], end):
                del self.fused[slot][i]
            self.held[slot] = end
            self.cache.set_length(slot, end - self.first[slot])  # padded rows forgotten
        return torch.stack([out[i, len(row) - 1] for i, row in enumerate(rows)])

    # ---- chains and trees ---------------------------------------------------------------------------------------
    def _wide(self, job: DraftJob) -> bool:
        """Whether the job's draft may be a tree: its pass takes trees, and no grammar or logit adjustment shapes
        its drafts (their masks follow one path)."""
        return job.pricing.tree and job.grammar is None and (job.adjustments is None or not job.adjustments.active)

    def _grow(self, job: DraftJob, last: torch.Tensor) -> DraftTree:
        """The job's tree (width 1: a chain) with the root's children, from the head's last catch-up output."""
        wide = self._wide(job)
        tree = DraftTree(width=TREE_WIDTH if wide else 1, children=TREE_WIDTH if wide else 1, outputs={-1: last})
        self._children(job, tree, -1, self.head.logits(last[None], self.target)[0])
        return tree

    def _children(self, job: DraftJob, tree: DraftTree, parent: int, logits: torch.Tensor) -> None:
        """Node `parent`'s children from the head's logits after it: the chain's pick, or the likeliest few."""
        path = [tree.nodes[i].token for i in tree.ancestors(parent)] if parent >= 0 else []
        if tree.width == 1:
            if plain_greedy(job) and self.head.lm_head is not None:
                choice = int(self.head.d2t[int(logits.argmax())])
            else:
                choice = pick_draft(self.head.to_target_vocab(logits, self.vocab), job, path)
            if choice is not None:
                tree.add(parent, [(choice, 0.0)])
            return
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if self.head.lm_head is not None:  # over the draft vocabulary, then its rows' target ids
            values, rows = torch.topk(logprobs, min(tree.children, logprobs.shape[-1]))
            candidates = [(int(self.head.d2t[int(r)]), float(v)) for r, v in zip(rows, values, strict=True)]
        else:
            candidates = top_candidates(logprobs, tree.children)
        if not plain_greedy(job):  # the keyed draw, the draft the target's own draw most often equals, first
            full = self.head.to_target_vocab(logprobs, self.vocab)
            choice = pick_draft(full, job, path)
            candidates = [(choice, float(full[choice]))] + [c for c in candidates if c[0] != choice]
        tree.add(parent, candidates)

    def _expand(self, jobs: list[DraftJob], trees: dict[int, DraftTree]) -> None:
        """Depth after depth, one head pass over every job's frontier (its best nodes of the depth before, up to its
        k): each node's row reads its token and its parent's output, at the position after its parent's, and sees
        the context and its ancestors' rows; its children from the head's logits after it."""
        stored = {job.slot: 0 for job in jobs}  # rows each job's expansions have put past its context
        for depth in range(1, min(MAX_DEPTH, max(job.k for job in jobs))):
            rows = {job.slot: trees[job.slot].frontier(depth) for job in jobs if job.k > depth}
            rows = {slot: nodes for slot, nodes in rows.items() if nodes}
            if not rows:
                return
            active = [job for job in jobs if job.slot in rows]
            outputs = self._expansion_pass(active, trees, rows, stored)
            for job, out in zip(active, outputs, strict=True):
                tree = trees[job.slot]
                logits = self.head.logits(out[: len(rows[job.slot])], self.target)
                for node, row, logit in zip(rows[job.slot], out, logits, strict=False):
                    tree.outputs[node] = row
                    self._children(job, tree, node, logit)

    def _expansion_pass(self, jobs: list[DraftJob], trees: dict[int, DraftTree], rows: dict[int, list[int]],
                        stored: dict[int, int]) -> torch.Tensor:  # fmt: skip
        """One head pass over the nodes `rows` of each job, padded to the most; returns the outputs [jobs, rows,
        hidden]. Node rows are stored after the job's context and its expansions so far."""
        width = max(len(nodes) for nodes in rows.values())
        tokens, hidden, positions, starts = [], [], [], []
        for job in jobs:
            tree, nodes, base = trees[job.slot], rows[job.slot], self.held[job.slot] - self.first[job.slot]
            padded = nodes + nodes[-1:] * (width - len(nodes))
            tokens.append([tree.nodes[i].token for i in padded])
            hidden.append(torch.stack([tree.outputs[tree.nodes[i].parent] for i in padded]))
            positions.append([self.held[job.slot] + tree.nodes[i].depth - 1 for i in padded])
            starts.append(base + stored[job.slot])
            for j, node in enumerate(nodes):
                tree.nodes[node].storage = base + stored[job.slot] + j
        span = max(starts) + width
        visible = torch.zeros(len(jobs), 1, width, span, dtype=torch.bool)
        for b, job in enumerate(jobs):
            tree, base = trees[job.slot], self.held[job.slot] - self.first[job.slot]
            visible[b, 0, :, :base] = True
            for j in range(width):
                if j >= len(rows[job.slot]):
                    visible[b, 0, j] = False
                    visible[b, 0, j, starts[b] + j] = True
                    continue
                for node in tree.ancestors(rows[job.slot][j]):
                    visible[b, 0, j, tree.nodes[node].storage] = True
            stored[job.slot] += len(rows[job.slot])
        ids = torch.tensor(tokens, device=self.head.fc_device)
        return self.head(self.head.embeddings(ids, self.target), torch.stack(hidden), cache=self.cache,
                         slots=[job.slot for job in jobs], starts=starts, positions=torch.tensor(positions),
                         visible=visible)  # fmt: skip

    def _cut(self, job: DraftJob, tree: DraftTree) -> tuple[list[int], list[int] | None]:
        """The job's proposal: a chain's tokens, or the tree cut to what its verify pass's rows pay for (a tree that
        came out a chain proposed as one)."""
        if tree.width == 1:
            return [node.token for node in tree.nodes], None
        tokens, parents = tree.chosen(min(job.widest, TREE_NODES), job.pricing.row_cost)
        if parents == list(range(-1, len(parents) - 1)):
            return tokens, None
        return tokens, parents
