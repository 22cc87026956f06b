"""A draft model of another vocabulary (its tokenizer is not the target's): the text is the common language.

The sequence's tokens are spelled as text and cut into the draft's tokens; the draft drafts in its own tokens; the
text it drafted is cut into the target's tokens, which are proposed. The draft model itself is a BatchedDrafter over
its own ids, so its cache is kept in its own tokens: at each propose the draft's tokens of the new text are compared
with what its slot holds, and only the common prefix is kept (after a partial acceptance: the draft's tokens of the
accepted text, those of rejected text rolled back).

Rules:
- Every drafted token is a point mass checked against the target's own token at its row (the verifier's one rule),
  so any translation, good or bad, leaves the output plain decoding's. The translation is only about acceptance.
- The draft always drafts its argmax, for sampled requests too: its distribution is over other tokens at other
  positions, so it cannot race the target's keyed noise (docs/decisions.md, "A draft of another vocabulary").
- Text is cut where a tokenizer would cut it inside a longer text (the boundaries): a piece of text following
  other text is encoded with the text before it (a lookbehind) and the tokens of the lookbehind dropped, so that a
  SentencePiece vocabulary adds no space prefix mid-text and a byte-level one merges across the boundary as it
  would. Where no token boundary falls at the lookbehind's end, the piece is encoded alone.
- The last drafted word may be partial: the draft drafts one token more than the text it proposes, and only the
  target's tokens that end before that last draft token starts are proposed (a token that ends with the drafted text
  could be longer in the target's cut of the text that follows).
- A context whose text ends inside a UTF-8 character (a token holding part of one) is not drafted for until it
  ends on a whole character.
- The draft's context is re-cut only from the last place where both cuts have a boundary (an anchor) before the
  text's end, so a step re-encodes a few tokens, not the whole context.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..decoding.sampling import SamplingParams
from .draft_model import CATCH_UP_WIDTH, DRAFT_SINK, BatchedDrafter
from .drafting import DraftCost, DraftJob, Proposal, common_prefix

if TYPE_CHECKING:
    from ..models.kv_cache import KVCache
    from ..models.tokenizer import Tokenizer

GREEDY = SamplingParams()  # the draft's own choice: its argmax (module docstring)
LOOKBEHIND = 2  # tokens of text before a piece encoded with it (the boundary's context)
REACH = 8  # target tokens a re-cut reaches back, at most, for a place where a word starts


class Spelling:
    """The bytes each token of a tokenizer stands for inside a text: a byte-level token through GPT-2's byte
    alphabet (Tokenizer.token_bytes), a SentencePiece token with its '▁' a space and its byte tokens (<0x0A>) their
    byte, an added token its text."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = type(tokenizer.raw.decoder).__name__ == "ByteLevel"
        self.added = frozenset(tokenizer.raw.get_added_tokens_decoder())
        self._bytes: dict[int, bytes] = {}

    def of(self, token: int) -> bytes:
        found = self._bytes.get(token)
        if found is None:
            found = self._bytes[token] = self._spell(token)
        return found

    def _spell(self, token: int) -> bytes:
        if self.byte_level or token in self.added:
            return self.tokenizer.token_bytes(token)
        piece = self.tokenizer.raw.id_to_token(token) or ""
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("\u2581", " ").encode()

    def text(self, tokens: list[int]) -> bytes:
        return b"".join(self.of(token) for token in tokens)

    def ends(self, tokens: list[int], start: int = 0) -> list[int]:
        """Each token's end, in bytes from `start`."""
        ends, at = [], start
        for token in tokens:
            at += len(self.of(token))
            ends.append(at)
        return ends


class Cutter:
    """Cuts text into one tokenizer's tokens as it would cut it inside a longer text."""

    def __init__(self, tokenizer: Tokenizer):
        self.raw, self.spelling = tokenizer.raw, Spelling(tokenizer)
        self.bos = self.raw.encode("", add_special_tokens=True).ids  # what the tokenizer puts before a text
        probe = self.spelling.text(self._encode("a"))  # and the space prefix it adds to one (SentencePiece's)
        self.lead = probe[:-1] if probe.endswith(b"a") else b""

    def leading(self, tokens: list[int]) -> int:
        """The bytes of a sequence's start, spelled from `tokens`, that this tokenizer put before its text: its BOS
        where the sequence starts with it, and the space prefix where the text starts with one."""
        skip = len(self.bos) if tokens[: len(self.bos)] == self.bos else 0
        spelled = self.spelling.text(tokens[skip : skip + 1])
        lead = len(self.lead) if self.lead and spelled.startswith(self.lead) else 0
        return len(self.spelling.text(tokens[:skip])) + lead

    def _encode(self, text: str) -> list[int]:
        return self.raw.encode(text, add_special_tokens=False).ids  # an added token's text is that token

    def first(self, text: str) -> list[int]:
        """The tokens of a text that starts a sequence (a SentencePiece space prefix included, as there)."""
        return self.bos + self._encode(text)

    def after(self, before: str, text: str) -> list[int] | None:
        """The tokens of `text` where it follows `before` (a lookbehind, possibly empty); None where they cannot
        be told (the text encoded alone does not spell itself)."""
        wanted = text.encode()
        if before:
            ids = self._encode(before + text)
            tail = 0
            for cut in range(len(ids) - 1, -1, -1):  # the tokens that spell exactly `text`, from the end
                tail += len(self.spelling.of(ids[cut]))
                if tail >= len(wanted):
                    if tail == len(wanted) and self.spelling.text(ids[cut:]) == wanted:
                        return ids[cut:]
                    break
        ids = self._encode(text)
        spelled = self.spelling.text(ids)
        if spelled == wanted:
            return ids
        if ids and spelled.endswith(wanted) and self.spelling.of(ids[0]) == spelled[: len(spelled) - len(wanted)]:
            return ids[1:]  # a space prefix token of its own
        return None


def decoded(data: bytes) -> str | None:
    """`data` as text; None where it is not whole UTF-8 characters."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def lookbehind(spelling: Spelling, tokens: list[int]) -> str:
    """The text of the last LOOKBEHIND tokens (fewer where they start inside a character; '' at none)."""
    for count in range(min(LOOKBEHIND, len(tokens)), 0, -1):
        text = decoded(spelling.text(tokens[-count:]))
        if text is not None:
            return text
    return ""


@dataclass
class SlotText:
    """One slot's context in both vocabularies: `source` (the target's tokens as last translated) spells the same text
    as `tokens` (the draft's); `anchors` are the (source, draft) token counts where both cuts have a boundary."""

    source: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    anchors: list[tuple[int, int, bool]] = field(default_factory=list)  # ... and whether a word starts there
    cut: int = 0  # where the draft's window resumes after its sink (0: no cut)
    view: list[int] = field(default_factory=list)  # what the draft model was last given

    def reuse(self, context: list[int]) -> tuple[int, int]:
        """The anchor to re-cut from: the last one within the common prefix with `context` and before the end of the
        text translated last (text that follows may merge with its last tokens) where a word starts, or failing that
        the last one REACH target tokens before (two cuts may agree inside a word that more text cuts otherwise);
        (0, 0) at none."""
        same = common_prefix(self.source, context, len(context))
        limit = same if same < len(self.source) else same - 1
        index = bisect_right(self.anchors, (limit, math.inf, True)) - 1
        while index > 0 and not self.anchors[index][2] and self.anchors[index][0] > limit - REACH:
            index -= 1
        return self.anchors[index][:2] if index >= 0 else (0, 0)


class Translation:
    """Text between the target's tokens and the draft's, both ways (module docstring)."""

    def __init__(self, target: Tokenizer, draft: Tokenizer):
        self.to_draft, self.to_target = Cutter(draft), Cutter(target)
        self.draft_stops = frozenset(draft.stop_token_ids)
        self.counts = [0, 0]  # target and draft tokens of the texts translated (their ratio sizes a draft)

    @property
    def ratio(self) -> float:
        """Draft tokens per target token, over the texts translated so far (1 before any)."""
        return self.counts[1] / self.counts[0] if self.counts[0] else 1.0

    def draft_count(self, k: int) -> int:
        """Draft tokens drafted for k target tokens: their text's share, and one more (the last word may be partial)."""
        return min(math.ceil(k * self.ratio), 2 * k) + 1

    def update(self, text: SlotText, context: list[int]) -> bool:
        """Bring `text` to the target's tokens `context`: the draft's tokens re-cut from the last safe anchor; False
        (nothing changed) where the text ends inside a character or cannot be cut."""
        source, tokens = self.to_target.spelling, self.to_draft.spelling
        start, held = text.reuse(context)
        skip = self.to_target.leading(context) if start == 0 else 0  # the target's BOS and space prefix: not text
        piece = decoded(source.text(context[start:])[skip:])
        if piece is None:
            return False
        if start == 0:
            cut: list[int] | None = self.to_draft.first(piece)
            shift = len(tokens.text(cut)) - len(piece.encode())  # what the draft's tokenizer put before the text
        else:
            cut = self.to_draft.after(lookbehind(source, context[:start]), piece)
            shift = 0
        if cut is None:
            return False
        self.counts[0] += len(context) - start
        self.counts[1] += len(cut)
        if start == 0:
            text.anchors, held = [(0, 0, True)], 0
        if held < text.cut + DRAFT_SINK:  # re-cut before the window's start: the window is chosen again
            text.cut = 0
        text.anchors = text.anchors[: bisect_right(text.anchors, (start, math.inf, True))]
        text.anchors += _anchors(source, context[start:], tokens, cut, shifts=(skip, shift), at=(start, held))
        text.source, text.tokens = list(context), text.tokens[:held] + cut
        return True

    def back(self, context: list[int], drafted: list[int], most: int) -> list[int]:
        """The target's tokens of the text the draft drafted after `context` (the target's tokens): those that end
        before the last drafted token starts (all, where a stop token ends the draft), at most `most`."""
        stop = next((i for i, token in enumerate(drafted) if token in self.draft_stops), None)
        spelling = self.to_draft.spelling
        if stop is not None:
            drafted, settled = drafted[: stop + 1], None
        else:
            settled = len(spelling.text(drafted[:-1]))  # the text decided with a drafted token after it
        data = spelling.text(drafted)
        while data and decoded(data) is None:  # a drafted character cut short at the end
            data = data[:-1]
        piece = decoded(data)
        if not piece:
            return []
        tokens = self.to_target.after(lookbehind(self.to_target.spelling, context), piece)
        if tokens is None:
            return []
        if settled is not None:
            tokens = tokens[: bisect_right(self.to_target.spelling.ends(tokens), settled)]
        return tokens[:most]


class OtherVocabularyDrafter:
    """A draft model of another vocabulary as a proposer (module docstring): the BatchedDrafter `model` drafts in its
    own tokens, `translation` carries the texts both ways. Its cache, lag and costs are the draft model's."""

    looks_up = False

    def __init__(self, model: BatchedDrafter, translation: Translation):
        self.model, self.translation = model, translation
        self.texts = [SlotText() for _ in range(model.cache.num_slots)]
        self.partitions = [""] * model.cache.num_slots
        self.spent = DraftCost()

    @property
    def drafter(self) -> OtherVocabularyDrafter:
        return self

    @property
    def cache(self) -> KVCache:
        return self.model.cache

    def admit(self, slot: int, partition: str) -> None:
        if self.partitions[slot] != partition:
            self.partitions[slot] = partition
            self.texts[slot] = SlotText()
        self.model.admit(slot, partition)

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        """Nothing: the model drafts from each sequence's own context."""

    def forget(self, history: bool = True, prompts: bool = True) -> None:
        if prompts:
            self.texts = [SlotText() for _ in self.texts]
        self.model.forget(history=history, prompts=prompts)

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        """The draft's tokens `propose` would feed the slot alone: those of its last view it does not hold, and the
        target's tokens not yet translated at the measured ratio, past the CATCH_UP_WIDTH that ride in the pass."""
        context = tokens if model_tokens is None else model_tokens
        text = self.texts[slot]
        untranslated = len(context) - common_prefix(text.source, context, len(context))
        unheld = len(text.view) - common_prefix(self.model.fed[slot], text.view, len(text.view))
        return max(0, unheld + round(untranslated * self.translation.ratio) - CATCH_UP_WIDTH)

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        asked: list[tuple[int, DraftJob]] = []
        for index, job in enumerate(jobs):
            view = self._view(job)
            if view is not None:
                k = self.translation.draft_count(job.k)
                asked.append((index, DraftJob(slot=job.slot, tokens=view, k=k, params=GREEDY, noise=job.noise)))
        proposals = [Proposal(torch.empty(0, dtype=torch.long)) for _ in jobs]
        self.spent = DraftCost()
        if not asked:
            return proposals
        drafted = self.model.propose([draft_job for _, draft_job in asked])
        self.spent = self.model.spent
        for (index, _), proposal in zip(asked, drafted, strict=True):
            job = jobs[index]
            tokens = self.translation.back(job.model_view, proposal.tokens.tolist(), most=job.k)
            proposals[index] = Proposal(torch.tensor(tokens, dtype=torch.long))
            proposals[index].catch_up_seconds = proposal.catch_up_seconds
        return proposals

    def _view(self, job: DraftJob) -> list[int] | None:
        """The draft's tokens of the job's context (windowed to what its cache holds), or None where its text ends
        inside a character."""
        text = self.texts[job.slot]
        if not self.translation.update(text, job.model_view):
            return None
        room = self.model.cache.max_len - self.translation.draft_count(job.k) - CATCH_UP_WIDTH - 1
        if len(text.tokens) - text.cut + (DRAFT_SINK if text.cut else 0) > room:
            text.cut = len(text.tokens) - room // 2  # cut again (the draft reads its sink, then the later half)
        text.view = text.tokens[:DRAFT_SINK] + text.tokens[text.cut :] if text.cut else text.tokens
        return text.view


def _anchors(source: Spelling, context: list[int], draft: Spelling, cut: list[int], *, shifts: tuple[int, int],
             at: tuple[int, int]) -> list[tuple[int, int, bool]]:  # fmt: skip
    """The anchors past `at` of a piece of text: where a token of `context` (the target's) and one of `cut` (the
    draft's) end at the same byte of the text, on a whole character (`shifts`: the bytes each tokenizer put before
    the text, at a sequence's start); each with whether a word starts there (a space or a line break follows
    something else: every pre-tokenizer cuts there)."""
    data = source.text(context)[shifts[0] :]
    ends = {end: i + 1 for i, end in enumerate(draft.ends(cut, start=-shifts[1]))}
    found = []
    for i, end in enumerate(source.ends(context, start=-shifts[0])):
        j = ends.get(end)
        if j is not None and end > 0 and (end == len(data) or data[end] & 0xC0 != 0x80):
            word = end < len(data) and data[end] in b" \n" and data[end - 1] not in b" \n\t\r"
            found.append((at[0] + i + 1, at[1] + j, word))
    return found
