"""Per-generation statistics, named as vLLM and Spec-Bench name them.

Every drafted token is counted once, when the target verifies it, under the proposer that drafted it: `lookup`
(a lookup in the context or in earlier outputs: the `*_by_lookup` fields) or `model` (the draft model: the rest).
So per-proposer counts add up to the totals by construction, and `by_proposer` derives them, with no second tally.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PROPOSERS = ("model", "lookup")  # the names of the two sources of drafts (stats line, bench report, /metrics)
POSITIONS_SHOWN = 16  # draft positions the stats line lists (a lookup drafts at most 15; k is rarely above 8)


def proposer_name(looked_up: bool) -> str:
    return "lookup" if looked_up else "model"


@dataclass(frozen=True)
class ProposerCounts:
    """One proposer's drafts: tokens drafted, accepted, and rounds that ended on one of its rejected tokens."""

    drafted: int
    accepted: int
    rejected: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float | None:
        """accepted / (accepted + rejected): the chance one of its drafted tokens is accepted (None: none tested)."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else None


def split_by_proposer(total: ProposerCounts, lookup: ProposerCounts) -> dict[str, ProposerCounts]:
    """The totals and the lookups' share of them as counts per proposer: the model drafted the rest."""
    model = ProposerCounts(
        total.drafted - lookup.drafted, total.accepted - lookup.accepted, total.rejected - lookup.rejected
    )
    return {"model": model, "lookup": lookup}


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's, those whose keys and values came from the prefix cache
    new_tokens: int = 0
    target_passes: int = 0  # decode passes of the target (prefill not counted): plain decoding has one per token
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0  # rounds that ended on a rejected draft token; alpha = accepted / (accepted + rejected)
    drafted_by_lookup: int = 0  # of `drafted`, the tokens a lookup in the context proposed (the rest: the model)
    accepted_by_lookup: int = 0
    rejected_by_lookup: int = 0  # lookup rounds that ended on a rejected token (a lookup's alpha, as `rejected`)
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_target: float = 0.0
    time_total: float = 0.0
    time_grammar: float = 0.0  # computing grammar masks (structured output), inside the times above
    time_catch_up: float = 0.0  # the draft model catching up on the context before drafting, inside time_draft

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """New tokens per target pass (1.0 for plain decoding)."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total else 0.0

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_prefill - self.time_draft - self.time_target)

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)]

    def by_proposer(self) -> dict[str, ProposerCounts]:
        """Drafted / accepted / rejected per proposer (PROPOSERS); each count sums to its total."""
        return split_by_proposer(
            ProposerCounts(self.drafted, self.accepted, self.rejected),
            ProposerCounts(self.drafted_by_lookup, self.accepted_by_lookup, self.rejected_by_lookup),
        )

    def record_round(self, drafted: int, accepted: int, looked_up: bool = False) -> None:
        """One verified round: `drafted` tokens, all from one proposer (`looked_up`: a lookup, else the draft
        model), of which the first `accepted` were kept. Position j (1-based) counts the rounds that drafted at
        least j tokens, and those that kept at least j: so along a chain both are non-increasing in j."""
        self.target_passes += 1
        self.drafted += drafted
        self.accepted += accepted
        if looked_up:
            self.drafted_by_lookup += drafted
            self.accepted_by_lookup += accepted
            self.rejected_by_lookup += accepted < drafted
        self.rejected += accepted < drafted
        missing = drafted - len(self.drafted_by_position)
        if missing > 0:
            self.drafted_by_position += [0] * missing
            self.accepted_by_position += [0] * missing
        for i in range(drafted):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < accepted

    @classmethod
    def merged(cls, parts: list[GenerationStats]) -> GenerationStats:
        """One request's n choices as one: counts add up, times are the longest choice's."""
        total = cls()
        for part in parts:
            for name in (
                "prompt_tokens",
                "new_tokens",
                "target_passes",
                "drafted",
                "accepted",
                "rejected",
                "drafted_by_lookup",
                "accepted_by_lookup",
                "rejected_by_lookup",
            ):
                setattr(total, name, getattr(total, name) + getattr(part, name))
            for name in ("drafted_by_position", "accepted_by_position"):
                mine, theirs = getattr(total, name), getattr(part, name)
                mine += [0] * (len(theirs) - len(mine))
                for i, count in enumerate(theirs):
                    mine[i] += count
            for name in ("time_prefill", "time_draft", "time_target", "time_total", "time_grammar", "time_catch_up"):
                setattr(total, name, max(getattr(total, name), getattr(part, name)))
        total.prompt_tokens = max((part.prompt_tokens for part in parts), default=0)  # one prompt, shared
        return total

    def to_dict(self) -> dict:
        data = asdict(self)
        for name in ("acceptance_rate", "mean_accepted_length", "tokens_per_second", "time_other"):
            data[name] = getattr(self, name)
        return data

    def summary(self) -> str:
        """One line; with drafts, each proposer that drafted: `model 412/468 (88.0%)`, accepted / drafted."""
        line = (
            f"{self.new_tokens} new tokens in {self.time_total:.2f} s ({self.tokens_per_second:.2f} tok/s) | "
            f"target passes {self.target_passes} | drafted {self.drafted} | accepted {self.accepted} | "
            f"acceptance {self.acceptance_rate:.1%} | mean accepted length {self.mean_accepted_length:.2f}"
        )
        return line + (f" | accepted by {self.proposers_summary()}" if self.drafted else "")

    def proposers_summary(self) -> str:
        """`model 412/468 (88.0%) · lookup 120/169 (71.0%)`: accepted / drafted of each proposer that drafted."""
        parts = [
            f"{name} {counts.accepted}/{counts.drafted} ({counts.acceptance_rate:.1%})"
            for name, counts in self.by_proposer().items()
            if counts.drafted
        ]
        return " · ".join(parts)

    def positions_summary(self) -> str:
        """Acceptance at draft positions 1, 2, ... (the first POSITIONS_SHOWN): `95% 88% 80% 71%`."""
        rates = self.acceptance_by_position[:POSITIONS_SHOWN]
        more = " …" if len(self.acceptance_by_position) > POSITIONS_SHOWN else ""
        return " ".join(f"{rate:.0%}" for rate in rates) + more
