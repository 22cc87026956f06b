"""Make the README's results section: one `verispec bench` run at the checked-out commit, its table written between
the README's results markers with the machine, the date and the commit (a tree with uncommitted changes is named as
such). Nothing in that section is written by hand.

    python benchmarks/readme_results.py              # the bench (about 15 min on 2 cores), then the README
    python benchmarks/readme_results.py --from DIR   # the README from a finished run's results.json

The peers need llama.cpp's own binaries (`../shared/tools/llamacpp-native build`); without them the table has
verispec's rows alone and says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- results: made by `python benchmarks/readme_results.py` -->", "<!-- results end -->"
BENCH = [
    "--dataset", "humaneval", "--num-prompts", "10", "--max-tokens", "128", "--k", "3", "--ignore-eos",
    "--methods", "plain,draft,auto-suffix,suffix-only", "--no-plots",
]  # fmt: skip
PEERS = ["--peers", "llamacpp-native"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, help="a finished run's folder (its results.json)")
    args = parser.parse_args()
    folder = args.source or _run_bench()
    results = json.loads((folder / "results.json").read_text())
    section = render(results, machine=_machine(), commit=_commit(), day=datetime.date.today().isoformat())
    write_section(README, section)
    print(section)
    return 0


def _run_bench() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="readme-results-"))
    peers = PEERS if _llamacpp_built() else []
    subprocess.run([sys.executable, "-m", "verispec", "bench", *BENCH, *peers, "--output", str(folder)], check=True)
    return folder


def _llamacpp_built() -> bool:
    from verispec.bench.llamacpp_native import check_available  # where `llamacpp-native build` puts them
    from verispec.bench.peer_tools import PeerUnavailableError

    try:
        check_available()
    except PeerUnavailableError:
        return False
    return True


def render(results: dict, machine: str, commit: str, day: str) -> str:
    """The README's results section from a bench's results.json."""
    rows = results["summary"]
    plain = next(row for row in rows if row["method"] == "plain")
    intro = (
        f"{day}, {machine}, 2 threads, verispec at {commit}: the bundled pair on the native kernels"
        + (" beside llama.cpp's own programs (the same prompts, the same run)" if len(rows) > 4 else "")
        + ", greedy, the first 10 HumanEval prompts, 128 new tokens each:"
    )
    lines = [
        BEGIN,
        *textwrap.wrap(intro, 118),
        "",
        f"    verispec bench {' '.join(BENCH)}" + (f" {' '.join(PEERS)}" if len(rows) > 4 else ""),
        "",
        "| engine, method | tok/s (median) | vs verispec plain | outputs equal to the engine's own plain |",
        "|---|---|---|---|",
    ]
    for row in rows:
        compared = row.get("compared_to_plain")
        equal = f"{row['identical_to_plain']}/{compared}" if compared else "—"
        if compared and row["method"] != "plain" and row["method"].endswith("-plain"):
            equal += " (to verispec's plain: another engine's rounding)"
        ratio = row["tokens_per_s_median"] / plain["tokens_per_s_median"]
        lines.append(f"| {_label(row['method'])} | {row['tokens_per_s_median']:.2f} | {ratio:.2f}x | {equal} |")
    peers = [row["tokens_per_s_median"] for row in rows if row["method"].startswith("llama.cpp")]
    default = next((row for row in rows if row["method"].startswith("auto-suffix")), None)
    if peers and default is not None:
        best = max(peers)
        ours, theirs = default["tokens_per_s_median"] / best, plain["tokens_per_s_median"] / best
        said = f"verispec's default is {ours:.2f}x llama.cpp's best setting here, its plain decoding {theirs:.2f}x."
        lines += ["", said]
    lines += ["", END]
    return "\n".join(lines)


def _label(method: str) -> str:
    if method.startswith(("llama.cpp", "hf")):
        return method
    return f"verispec {method}" + (" (the default)" if method.startswith("auto-suffix") else "")


def write_section(readme: Path, section: str) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme} has no results markers ({BEGIN} ... {END})")
    readme.write_text(pattern.sub(lambda _: section, text))


def _machine() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    name, family, model = (field.get(key, "?").strip() for key in ("Model name", "CPU family", "Model"))
    flags = field.get("Flags", "")
    isa = "AVX-512" + (" VNNI" if "avx512_vnni" in flags else "") if "avx512f" in flags else "AVX2"
    return f"{name} (family {family}, model {model}, {isa})"


def _commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True, cwd=ROOT)
    return commit.strip() + (" with uncommitted changes to src/" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
