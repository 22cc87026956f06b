"""How long `verispec generate` takes to print its first token on a warm cache, and where that time goes: the
interpreter and imports, loading both models (mapping the prepared files, the tokenizer), and the first pass.

    python benchmarks/startup.py                 # 7 runs of each; medians
    python benchmarks/startup.py --runs 11
    python benchmarks/startup.py --src /tmp/before/src   # another checkout's code (its native library built)

Each run is a fresh process, as a user's is; the model files are prepared (the first run of `verispec generate`
does that) and in the page cache. The first token is the first byte the command writes to stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PROMPT = "def add(a, b):"
COMMAND = [sys.executable, "-m", "verispec", "generate", PROMPT, "--max-tokens", "4"]
PHASES = """
import time
begin = time.perf_counter()
import verispec.generator
from verispec.models.loading import load_pair
imported = time.perf_counter()
target, draft = load_pair("target", "draft", "float32", "cpu", progress=False, quantization="gguf")
loaded = time.perf_counter()
generator = verispec.SpeculativeGenerator(target, draft, progress=False)
built = time.perf_counter()
generator.generate("def add(a, b):", max_tokens=1)
first = time.perf_counter()
print(imported - begin, loaded - imported, built - loaded, first - built)
"""


ENV = dict(os.environ)


def first_token_seconds() -> float:
    begin = time.perf_counter()
    process = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
    process.stdout.read(1)
    seconds = time.perf_counter() - begin
    process.wait()
    return seconds


def interpreter_seconds() -> float:
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - begin


def phases() -> list[float]:
    out = subprocess.run([sys.executable, "-c", PHASES], capture_output=True, text=True, check=True, env=ENV).stdout
    return [float(value) for value in out.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--src", help="run the code of this src/ folder instead of the installed one")
    args = parser.parse_args()
    if args.src:
        ENV["PYTHONPATH"] = args.src
    first_token_seconds()  # warms the page cache (and prepares the files on a first run)
    firsts = [first_token_seconds() for _ in range(args.runs)]
    interpreter = statistics.median(interpreter_seconds() for _ in range(args.runs))
    parts = [phases() for _ in range(args.runs)]
    names = ("imports (verispec.generator, PyTorch)", "loading both models", "the engine (caches, policy)",
             "the first token (prefill and one step)")  # fmt: skip
    print(f"first token of `verispec generate`: median {statistics.median(firsts):.2f} s "
          f"(min {min(firsts):.2f}, max {max(firsts):.2f}, {args.runs} runs)")  # fmt: skip
    print(f"  the interpreter alone: {interpreter:.2f} s")
    for i, name in enumerate(names):
        print(f"  {name}: {statistics.median(p[i] for p in parts):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
