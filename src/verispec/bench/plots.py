"""PNG plots of a bench (matplotlib, Agg backend): speedup vs k beside the ideal, acceptance by draft
position, and where the time goes."""

from __future__ import annotations

from pathlib import Path

from .runner import BenchResult
from .summary import MethodSummary, ideal_speedup

Plot = tuple[str, str]  # (title, file name)


def write_plots(result: BenchResult, rows: list[MethodSummary], folder: Path) -> tuple[list[Plot], str]:
    """Writes the PNGs into `folder`; returns them and a note ('' when all went well)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install matplotlib)"
    drafts = [row for row in rows if row.kind != "peer" and row.k > 0 and row.alpha is not None]
    plots = []
    if drafts:
        plots.append(_speedup_vs_k(plt, drafts, rows, folder))
        plots.append(_acceptance_by_position(plt, drafts, folder))
    plots.append(_time_breakdown(plt, rows, folder))
    return plots, ""


def pooled_alpha(drafts: list[MethodSummary]) -> float:
    tested = sum(row.accepted + row.rejected for row in drafts)
    return sum(row.accepted for row in drafts) / tested if tested else 0.0


def _speedup_vs_k(plt, drafts: list[MethodSummary], rows: list[MethodSummary], folder: Path) -> Plot:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = [row.k for row in drafts]
    ax.plot(ks, [row.speedup for row in drafts], "o-", label="measured")
    if drafts[0].c is not None:
        alpha, c = pooled_alpha(drafts), drafts[0].c
        curve = range(1, max(ks) + 3)
        ax.plot(
            curve, [ideal_speedup(alpha, k, c) for k in curve], "--", label=f"ideal E/(kc+1), α={alpha:.2f}, c={c:.3f}"
        )
        measured_verify = [row for row in drafts if row.ideal_speedup_measured_verify is not None]
        ax.plot([r.k for r in measured_verify], [r.ideal_speedup_measured_verify for r in measured_verify], "s:",
                label="ideal with measured T(k+1)/T(1), per-k α")  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=1, label="plain decoding")
    peers = [row for row in rows if row.kind == "peer" and row.speedup is not None]
    for i, row in enumerate(peers):
        ax.axhline(row.speedup, color=f"C{i + 3}", linestyle="-.", linewidth=1, label=row.method)
    ax.set(xlabel="k (tokens drafted per target pass)", ylabel="speedup over plain", title="Speedup vs k")
    ax.set_xticks(range(1, max(ks) + 3))
    ax.legend(fontsize=8)
    return _save(plt, fig, folder=folder, name="speedup_vs_k.png", title="Speedup vs k, beside the ideal")


def _acceptance_by_position(plt, drafts: list[MethodSummary], folder: Path) -> Plot:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in drafts:
        positions = range(1, len(row.acceptance_by_position) + 1)
        ax.plot(positions, row.acceptance_by_position, "o-", label=row.method)
    alpha = pooled_alpha(drafts)
    longest = range(1, max(row.k for row in drafts) + 1)
    ax.plot(longest, [alpha**i for i in longest], "k--", label=f"α^i, α={alpha:.2f}")
    ax.set(xlabel="draft position i", ylabel="P(draft token i accepted)", ylim=(0, 1.02))
    ax.set_xticks(longest)
    ax.set_title("Acceptance by draft position")
    ax.legend(fontsize=8)
    return _save(plt, fig, folder=folder, name="acceptance_by_position.png", title="Acceptance by draft position")


def _time_breakdown(plt, rows: list[MethodSummary], folder: Path) -> Plot:
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 2), layout="constrained")
    names = [row.method for row in rows]
    left = [0.0] * len(rows)
    for part in ("prefill", "draft", "target", "other"):
        widths = [_ms_per_token(row, getattr(row, f"time_{part}")) for row in rows]
        ax.barh(names, widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    unsplit = [_ms_per_token(row, row.wall_s) if row.time_target is None else 0.0 for row in rows]
    if any(unsplit):
        ax.barh(names, unsplit, left=left, label="total (not split)", color="lightgrey")
    ax.invert_yaxis()
    ax.set(xlabel="ms per new token", title="Where the time goes")
    fig.legend(loc="outside lower center", ncols=5, fontsize=8)
    return _save(plt, fig, folder=folder, name="time_breakdown.png", title="Where the time goes")


def _ms_per_token(row: MethodSummary, seconds: float | None) -> float:
    return seconds * 1e3 / row.new_tokens if seconds is not None and row.new_tokens else 0.0


def _save(plt, fig, folder: Path, name: str, title: str) -> Plot:
    if not fig.get_layout_engine():
        fig.tight_layout()
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return title, name
