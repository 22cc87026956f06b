"""What a pass costs on each kernel path of this CPU, beside llama.cpp's passes on the same file.

For each path (`VERISPEC_KERNELS` = avx512, avx2, scalar: those this CPU runs, each in a process of its own) on the
bundled pair's native kernels: T(n) for a pass over n = 1, 2, 4, 8, 16 new tokens after a 128-token context, as
T(n)/T(1); the prefill rate over that context; c (one draft step / T(1)); and where T(1) and T(4) go (the matrix
products, attention, the rest: the native stack's own counters). Then llama.cpp's `llama-bench` pp1..pp16 on the
target file (tokens/s, as T(n)/T(1) and as verispec's tokens/s over it), where its binaries are built.

    python benchmarks/pass_costs.py [--repeats 9] [--paths avx512,avx2]     (add scalar: about 5 minutes more)

Times are medians of interleaved repeats (bench/costs.py); the scalar path is slow (a 128-token prefill takes
about a minute), so it runs one. Each path's rows are printed as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WIDTHS = (1, 2, 4, 8, 16)
CONTEXT = 128


def measure_path(repeats: int) -> dict:
    """This process's path (VERISPEC_KERNELS as set): T(n), prefill, c and the split of T(1) and T(4)."""
    import verispec
    from verispec.bench.costs import _draft_step_timer, _prefill_timer, _step_timer
    from verispec.kernels import native
    from verispec.kernels.stack import NativeStack

    target = verispec.load_model("target", quantization="gguf", progress=False).model
    draft = verispec.load_model("draft", quantization="gguf", progress=False).model
    context = (list(range(1000, 1000 + CONTEXT)) * 2)[:CONTEXT]
    timers = {f"T{n}": _step_timer(target, context, n) for n in WIDTHS}
    timers["draft"] = _draft_step_timer(draft, context, None)
    timers["prefill"] = _prefill_timer(target, context)
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, timer in timers.items():
            samples[name].append(timer())
    median = {name: statistics.median(values) for name, values in samples.items()}
    split = {}
    for n in (1, 4):
        NativeStack.timing()  # restart the counters
        steps = [timers[f"T{n}"]() for _ in range(repeats)]
        _, products, head, attention = (t / repeats for t in NativeStack.timing())
        step = statistics.mean(steps)
        split[n] = {"products": (products + head) / step, "attention": attention / step}
    return {
        "path": native.isa(),
        "T": {n: median[f"T{n}"] for n in WIDTHS},
        "prefill_tokens_per_s": CONTEXT / median["prefill"],
        "c": median["draft"] / median["T1"],
        "split": split,
    }


def llama_bench() -> dict[int, float] | None:
    """llama-bench's pp1..pp16 tokens/s on the bundled target, or None where its binaries are not built."""
    from verispec.bench.llamacpp_native import binaries
    from verispec.bench.peer_tools import PeerUnavailableError
    from verispec.models.bundled import bundled_path

    try:
        program = binaries() / "llama-bench"
    except PeerUnavailableError:
        return None
    sizes = ",".join(str(n) for n in WIDTHS)
    out = subprocess.run(
        [str(program), "-m", str(bundled_path("target")), "-t", "2", "-p", sizes, "-n", "0", "-r", "5", "-o", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {row["n_prompt"]: row["avg_ts"] for row in json.loads(out.stdout)}


def print_path(run: dict) -> None:
    """A path's two table rows: its ratios and splits, then its tokens/s at each width."""
    t = {int(n): s for n, s in run["T"].items()}
    ratios = " | ".join(f"{t[n] / t[1]:.2f}" for n in WIDTHS[1:])
    split = {int(n): s for n, s in run["split"].items()}
    shares = [f"{split[n]['products']:.0%}, {split[n]['attention']:.0%}" for n in (1, 4)]
    print(f"| {run['path']} | {t[1] * 1e3:.1f} | {ratios} | {run['prefill_tokens_per_s']:.0f} | {run['c']:.2f} | "
          f"{shares[0]} | {shares[1]} |")  # fmt: skip
    print(
        f"|  tokens/s | {1 / t[1]:.1f} | " + " | ".join(f"{n / t[n]:.1f}" for n in WIDTHS[1:]) + " | | | | |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--paths", default="avx512,avx2")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: this path only
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_path(args.repeats)))
        return
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    header = " | ".join(f"T({n})/T(1)" for n in WIDTHS[1:])
    print(f"| path | T(1) ms | {header} | prefill tok/s | c | T(1): products, attention | T(4): products, attention |")
    print("|---" * (6 + len(WIDTHS) - 1) + "|", flush=True)
    for path in args.paths.split(","):
        if path == "avx512" and "avx512_vnni" not in flags:
            continue
        repeats = 1 if path == "scalar" else args.repeats
        env = {**os.environ, "VERISPEC_KERNELS": path}
        child = [sys.executable, __file__, "--one", "--repeats", str(repeats)]
        done = subprocess.run(child, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"{path}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        print_path(json.loads(done.stdout.strip().splitlines()[-1]))
    peer = llama_bench()
    if peer:
        blanks = " | | | | |"
        print(f"| llama.cpp pp tok/s | {peer[1]:.1f} | " + " | ".join(f"{peer[n]:.1f}" for n in WIDTHS[1:]) + blanks)
        ratios = " | ".join(f"{n / peer[n] * peer[1]:.2f}" for n in WIDTHS[1:])
        print("| llama.cpp T(n)/T(1) | | " + ratios + blanks)


if __name__ == "__main__":
    main()
