"""Writes a bench result: results.json (everything), report.md (one row per method) and the plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..decoding.stats import POSITIONS_SHOWN
from .peers import peer_settings
from .plots import write_plots
from .runner import BenchResult, Run
from .summary import MethodSummary, by_proposer, summarize

FORMAT = "verispec-bench/1"
DASH = "—"


def write_outputs(result: BenchResult, folder: Path) -> list[MethodSummary]:
    folder.mkdir(parents=True, exist_ok=True)
    rows = summarize(result)
    (folder / "results.json").write_text(json.dumps(results_dict(result, rows), indent=1) + "\n")
    plots, plot_note = write_plots(result, rows, folder) if result.config.plots else ([], "plots off (--no-plots)")
    (folder / "report.md").write_text(report_markdown(result, rows, plots, plot_note))
    return rows


def results_dict(result: BenchResult, rows: list[MethodSummary]) -> dict:
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result.config).items()}
    return {
        "format": FORMAT,
        "command": result.config.command,
        "started": result.started,
        "duration_s": result.duration_s,
        "interrupted": result.interrupted,
        "config": config,
        "environment": result.environment,
        "models": result.models,
        "peers": {name: text for name, text in peer_settings().items() if _has_method(result, name)},
        "costs": result.costs.to_dict() if result.costs else None,
        "llamacpp_pass_s": {str(n): s for n, s in result.peer_passes.items()} if result.peer_passes else None,
        "prompts": [{"index": p.index, "id": p.id, "prompt_tokens": len(p.token_ids)} for p in result.prompts],
        "skipped_prompts": result.skipped_prompts,
        "summary": [asdict(row) for row in rows],
        "runs": [_run_dict(run) for run in result.runs],
    }


def _has_method(result: BenchResult, name: str) -> bool:
    return any(c["name"] == name for c in result.contenders)


def _run_dict(run: Run) -> dict:
    return {**asdict(run), "tokens_per_second": run.tokens_per_second}


# ---- report.md --------------------------------------------------------------------------------------
MAIN_COLUMNS = (
    "method", "k", "prompts", "new tokens", "tok/s median", "tok/s total", "speedup", "acceptance",
    "tokens/pass", "α", "c", "T(k+1)/T(1)", "ideal", "ideal, measured verify", "efficiency", "= plain",
)  # fmt: skip
PROPOSER_COLUMNS = ("method", "proposer", "drafted", "share of drafted", "accepted", "acceptance", "α")
TIME_COLUMNS = (
    "method", "prefill", "draft", "draft's catch-up (within)", "target", "other", "total", "grammar (within)",
    "drafted by lookup", "peak RSS MiB",
)  # fmt: skip


def report_markdown(result: BenchResult, rows: list[MethodSummary], plots: list[tuple[str, str]], note: str) -> str:
    parts = [_header(result), _table(MAIN_COLUMNS, [_main_cells(row, result) for row in rows])]
    parts += ["## Where the time goes (ms per new token, summed over prompts)", _table(TIME_COLUMNS, _time_rows(rows))]
    parts += _draft_sections(rows)
    parts += [_legend(result)]
    if plots or note:
        parts += ["## Plots", *(f"![{title}]({name})" for title, name in plots), note]
    return "\n\n".join(part for part in parts if part) + "\n"


def _header(result: BenchResult) -> str:
    config, env = result.config, result.environment
    lines = [f"# verispec bench, {result.started}", "", f"    {config.command}" if config.command else ""]
    models = ", ".join(f"{role} `{m['name']}` ({_count(m['parameters'])} params)" for role, m in result.models.items())
    sampling = (
        "greedy" if config.greedy else f"temperature {config.temperature}, top-p {config.top_p}, top-k {config.top_k}"
    )
    lines += [
        f"- machine: {env.get('processor')}, {env.get('cpu_count')} CPUs, {env.get('torch_threads')} torch threads, "
        f"torch {env.get('torch')}, {config.dtype} on {config.device}",
        f"- models: {models}",
        f"- prompts: {len(result.prompts)} from `{config.dataset}`{' (chat)' if config.chat else ''}, "
        f"up to {config.max_tokens} new tokens, {sampling}; methods interleaved prompt by prompt after a warm-up",
    ]
    if result.costs:
        lines.append(f"- {_costs_line(result)}")
    if result.peer_passes and 1 in result.peer_passes:
        one = result.peer_passes[1]
        ratios = ", ".join(f"T({n})/T(1) {s / one:.2f}" for n, s in result.peer_passes.items() if 1 < n <= 16)
        line = f"- llama.cpp's passes (llama-bench, same threads): T(1) {one * 1e3:.2f} ms, {ratios}"
        if 128 in result.peer_passes:
            line += f"; prefill (128 tokens) {128 / result.peer_passes[128]:.1f} tokens/s"
        lines.append(line)
    if result.skipped_prompts:
        lines.append(f"- skipped {len(result.skipped_prompts)} prompts too long for the context")
    lines += [f"- note: {note}" for note in config.notes]
    if result.interrupted:
        lines.append(f"- **interrupted**: {len(result.runs)} runs finished; the rows cover those only")
    return "\n".join(lines)


def _costs_line(result: BenchResult) -> str:
    costs = result.costs
    text = f"measured step costs (median of {costs.repeats}, {costs.context_tokens}-token context): "
    text += f"target {costs.target_step_s * 1e3:.2f} ms"
    if costs.c is not None:
        text += f", draft {costs.draft_step_s * 1e3:.2f} ms, c = {costs.c:.3f}"
    ratios = ", ".join(f"k={k}: {costs.verify_ratio(k):.2f}" for k in costs.target_verify_s)
    text += f"; T(k+1)/T(1) {ratios}" if ratios else ""
    if costs.pass_s:
        text += "; " + ", ".join(f"T({n})/T(1) {t / costs.target_step_s:.2f}" for n, t in costs.pass_s.items())
    if costs.prefill_tokens_per_s is not None:
        text += f"; prefill {costs.prefill_tokens_per_s:.1f} tokens/s"
    if costs.native:
        parts = [f"machine read bandwidth {costs.native['read_gb_per_s']:.1f} GB/s"]
        for name in ("target", "draft"):
            if name in costs.native:
                n = costs.native[name]
                parts.append(
                    f"{name} reads {n['weight_bytes'] / 1e6:.0f} MB per step = {n['gb_per_s']:.1f} GB/s, "
                    f"{n['products_share']:.0%} of the step in products, {n['other_share']:.0%} elsewhere"
                )
        text += "; native kernels: " + "; ".join(parts)
    return text


def _main_cells(row: MethodSummary, result: BenchResult) -> list[str]:
    return [
        row.method, str(row.k) if row.k else DASH, str(row.prompts), str(row.new_tokens),
        f"{row.tokens_per_s_median:.2f}", f"{row.tokens_per_s_total:.2f}", _num(row.speedup, "{:.2f}x"),
        _num(row.acceptance_rate, "{:.1%}"), _num(row.mean_accepted_length, "{:.2f}"), _num(row.alpha, "{:.3f}"),
        _num(row.c, "{:.3f}"), _num(row.verify_ratio, "{:.2f}"), _num(row.ideal_speedup, "{:.2f}x"),
        _num(row.ideal_speedup_measured_verify, "{:.2f}x"), _num(row.efficiency, "{:.0%}"), _identical(row, result),
    ]  # fmt: skip


def _identical(row: MethodSummary, result: BenchResult) -> str:
    if row.compared_to_plain is None:
        return DASH
    if not result.config.greedy and row.kind != "peer":
        return "n/a (sampled)"
    return f"{row.identical_to_plain}/{row.compared_to_plain}"


def _time_rows(rows: list[MethodSummary]) -> list[list[str]]:
    table = []
    for row in rows:
        per_token = 1e3 / row.new_tokens if row.new_tokens else 0.0
        parts = [row.time_prefill, row.time_draft, row.time_catch_up, row.time_target, row.time_other, row.wall_s,
                 row.time_grammar]  # fmt: skip
        cells = [_num(None if t is None else t * per_token, "{:.1f}") for t in parts]
        lookup = (
            f"{row.drafted_by_lookup / row.drafted:.0%}" if row.drafted and row.drafted_by_lookup is not None else "—"
        )
        table.append([row.method, *cells, lookup, f"{row.peak_rss_bytes / 2**20:.0f}"])
    return table


def _draft_sections(rows: list[MethodSummary]) -> list[str]:
    """The drafts of each method that drafted, per proposer and per draft position (none: no sections)."""
    drafting = [row for row in rows if row.drafted]
    if not drafting:
        return []
    proposers = [cells for row in drafting for cells in _proposer_rows(row)]
    widest = max(_last_drafted(row) for row in drafting)
    positions = [str(j) for j in range(1, min(widest, POSITIONS_SHOWN) + 1)]
    return [
        "## Drafts by proposer (model: the draft model; lookup: a lookup in the context or in earlier outputs)",
        _table(PROPOSER_COLUMNS, proposers),
        "## Acceptance by draft position (accepted / drafted of the tokens drafted j-th in their round)",
        _table(("method", *positions), [[row.method, *_position_cells(row, len(positions))] for row in drafting]),
    ]


def _proposer_rows(row: MethodSummary) -> list[list[str]]:
    counts = by_proposer(row) or {}
    return [
        [
            row.method,
            name,
            str(c.drafted),
            f"{c.drafted / row.drafted:.0%}",
            str(c.accepted),
            f"{c.acceptance_rate:.1%}",
            _num(c.alpha, "{:.3f}"),
        ]  # fmt: skip
        for name, c in counts.items()
        if c.drafted
    ]


def _last_drafted(row: MethodSummary) -> int:
    """The deepest position the row drafted at (its position lists run to at least k, zeros past its drafts)."""
    return max((j for j, count in enumerate(row.drafted_by_position, start=1) if count), default=0)


def _position_cells(row: MethodSummary, width: int) -> list[str]:
    counts = list(zip(row.accepted_by_position, row.drafted_by_position, strict=True))[:width]
    cells = [f"{a / d:.0%}" if d else DASH for a, d in counts]
    return cells + [DASH] * (width - len(cells))


def _legend(result: BenchResult) -> str:
    return "\n".join(
        [
            "Columns: tok/s = new tokens / wall time (median of the prompts, and all tokens / all time); "
            "speedup = tok/s total ÷ plain's on the same prompts; acceptance = accepted / drafted; "
            "tokens/pass = new tokens / target passes; α = accepted / (accepted + rejected), the chance one drafted "
            "token is accepted; c = draft step / target step; ideal = E / (k·c + 1) with "
            "E = (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023); 'ideal, measured verify' puts the measured "
            "T(k+1)/T(1) in place of the 1; efficiency = speedup / ideal; = plain: prompts whose output token ids "
            "equal plain decoding's (a peer's speculative method: its own plain decoding's, when that ran).",
            *(f"Peer {name}: {text}." for name, text in peer_settings().items() if _has_method(result, name)),
        ]
    )


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _num(value: float | None, fmt: str) -> str:
    return DASH if value is None else fmt.format(value)


def _table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])
