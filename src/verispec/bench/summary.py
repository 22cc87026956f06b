"""One summary row per method, from the runs, with the Leviathan et al. ideal beside the measurement.

speedup     = (tokens / wall time of the method) / (same for plain), on the prompts both finished
α           = accepted / (accepted + rejected): the chance one drafted token is accepted
E           = (1 − α^(k+1)) / (1 − α): expected tokens per target pass
ideal       = E / (k·c + 1), c = draft step / target step (measured)
efficiency  = speedup / ideal
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..decoding.acceptance import expected_tokens_per_round
from ..decoding.stats import ProposerCounts, split_by_proposer
from .config import BASELINE
from .costs import Costs
from .runner import BenchResult, Run


def ideal_speedup(alpha: float, k: int, c: float, verify_ratio: float = 1.0) -> float:
    """E / (k·c + T(k+1)/T(1)); with the default verify_ratio of 1 this is Leviathan et al.'s Theorem 3.8."""
    return expected_tokens_per_round(alpha, k) / (k * c + verify_ratio)


@dataclass
class MethodSummary:
    method: str
    kind: str
    k: int
    prompts: int
    new_tokens: int
    wall_s: float
    tokens_per_s_total: float
    tokens_per_s_median: float
    speedup: float | None
    target_passes: int
    mean_accepted_length: float | None  # None for a peer that does not report its passes
    drafted: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    acceptance_rate: float | None = None
    alpha: float | None = None
    acceptance_by_position: list[float] = field(default_factory=list)
    c: float | None = None
    verify_ratio: float | None = None
    ideal_speedup: float | None = None
    ideal_speedup_measured_verify: float | None = None
    efficiency: float | None = None
    identical_to_plain: int | None = None
    compared_to_plain: int | None = None
    time_prefill: float | None = None
    time_draft: float | None = None
    time_target: float | None = None
    time_other: float | None = None
    time_grammar: float | None = None  # grammar masks (structured output), inside draft, target and other
    time_catch_up: float | None = None  # the draft model catching up on the context, inside draft
    drafted_by_lookup: int | None = None  # of drafted, what lookups in the context proposed
    accepted_by_lookup: int | None = None  # of accepted, the looked-up tokens
    rejected_by_lookup: int | None = None  # of rejected, the rounds a lookup drafted
    drafted_by_position: list[int] = field(default_factory=list)  # tokens drafted j-th in their round, j = 1, 2, ...
    accepted_by_position: list[int] = field(default_factory=list)  # ... and accepted
    peak_rss_bytes: int = 0


def summarize(result: BenchResult) -> list[MethodSummary]:
    by_method: dict[str, list[Run]] = {c["name"]: [] for c in result.contenders}
    for run in result.runs:
        by_method[run.method].append(run)
    baseline = {run.prompt: run for run in by_method.get(BASELINE, [])}
    rows = []
    for contender in result.contenders:
        runs = by_method[contender["name"]]
        if runs:
            rows.append(_summarize_method(contender, runs, baseline, result.costs))
    return rows


def _summarize_method(contender: dict, runs: list[Run], baseline: dict[int, Run], costs: Costs | None):
    new_tokens, wall = sum(r.new_tokens for r in runs), sum(r.wall_s for r in runs)
    passes = sum(r.target_passes for r in runs)
    row = MethodSummary(
        method=contender["name"], kind=contender["kind"], k=contender["k"], prompts=len(runs),
        new_tokens=new_tokens, wall_s=wall, tokens_per_s_total=_rate(runs),
        tokens_per_s_median=statistics.median(r.tokens_per_second for r in runs),
        speedup=_speedup(runs, baseline), target_passes=passes,
        mean_accepted_length=new_tokens / passes if passes else None,
        peak_rss_bytes=max(r.peak_rss_bytes for r in runs),
    )  # fmt: skip
    _add_times(row, runs)
    _add_acceptance(row, runs)
    drafts_with_model = row.method.startswith("draft")  # the ideal needs k drafts per pass at measured cost c
    if row.alpha is not None and costs is not None and costs.c is not None and row.k > 0 and drafts_with_model:
        _add_ideal(row, costs)
    compared = [r.identical_to_plain for r in runs if r.identical_to_plain is not None]
    if row.method != BASELINE:
        row.identical_to_plain, row.compared_to_plain = sum(compared), len(compared)
    return row


def _rate(runs: list[Run]) -> float:
    wall = sum(r.wall_s for r in runs)
    return sum(r.new_tokens for r in runs) / wall if wall > 0 else 0.0


def _speedup(runs: list[Run], baseline: dict[int, Run]) -> float | None:
    """Rate ratio over the prompts that this method and plain both finished."""
    paired = [r for r in runs if r.prompt in baseline]
    if not paired:
        return None
    plain_rate = _rate([baseline[r.prompt] for r in paired])
    return _rate(paired) / plain_rate if plain_rate > 0 else None


def _add_times(row: MethodSummary, runs: list[Run]) -> None:
    if all(r.time_target is not None for r in runs):
        row.time_prefill = sum(r.time_prefill for r in runs)
        row.time_draft = sum(r.time_draft for r in runs)
        row.time_target = sum(r.time_target for r in runs)
        row.time_other = sum(r.time_other for r in runs)
        row.time_grammar = sum(r.time_grammar or 0.0 for r in runs)
        row.time_catch_up = sum(r.time_catch_up or 0.0 for r in runs)


def _add_acceptance(row: MethodSummary, runs: list[Run]) -> None:
    if row.k == 0 or any(r.drafted is None or r.rejected is None for r in runs):
        return
    row.drafted, row.accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
    row.drafted_by_lookup = sum(r.drafted_by_lookup or 0 for r in runs)
    row.accepted_by_lookup = sum(r.accepted_by_lookup or 0 for r in runs)
    row.rejected_by_lookup = sum(r.rejected_by_lookup or 0 for r in runs)
    row.rejected = sum(r.rejected for r in runs)
    row.acceptance_rate = row.accepted / row.drafted if row.drafted else 0.0
    tested = row.accepted + row.rejected
    row.alpha = row.accepted / tested if tested else None
    widest = max([row.k, *(len(r.drafted_by_position or []) for r in runs)])  # a lookup may draft past k
    drafted, accepted = [0] * widest, [0] * widest
    for r in runs:
        for i, (d, a) in enumerate(zip(r.drafted_by_position, r.accepted_by_position, strict=True)):
            drafted[i], accepted[i] = drafted[i] + d, accepted[i] + a
    row.drafted_by_position, row.accepted_by_position = drafted, accepted
    row.acceptance_by_position = [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]


def by_proposer(row: MethodSummary) -> dict[str, ProposerCounts] | None:
    """The row's drafted / accepted / rejected per proposer (decoding/stats.py: PROPOSERS); None without counts."""
    if row.drafted is None or row.accepted is None or row.rejected is None:
        return None
    lookup = ProposerCounts(row.drafted_by_lookup or 0, row.accepted_by_lookup or 0, row.rejected_by_lookup or 0)
    return split_by_proposer(ProposerCounts(row.drafted, row.accepted, row.rejected), lookup)


def _add_ideal(row: MethodSummary, costs: Costs) -> None:
    row.c, row.verify_ratio = costs.c, costs.verify_ratio(row.k)
    row.ideal_speedup = ideal_speedup(row.alpha, row.k, row.c)
    if row.verify_ratio is not None:
        row.ideal_speedup_measured_verify = ideal_speedup(row.alpha, row.k, row.c, row.verify_ratio)
    if row.speedup is not None:
        row.efficiency = row.speedup / row.ideal_speedup
