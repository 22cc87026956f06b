"""Where a target step goes at long context: T(1), T(4) and the attention inside them, and the prefill split.

    python benchmarks/context_steps.py [--repeats 9] [--isas avx2,avx512] [--contexts 512,2048,4000]

The bundled target on the native kernels (2 threads), a context of the standard library's own sources. Each
kernel path named in --isas runs in the same process, interleaved repetition by repetition, so that machine drift
hits them alike (a path switches the products too: compare the attention columns across paths, the step columns
only within one). Steps roll the cache back to the context each time, as `verispec bench` times its costs;
prefill runs once per path on a fresh cache.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import torch

from verispec.kernels import native
from verispec.kernels.stack import NativeStack
from verispec.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--isas", default=native.best_isa(), help="comma-separated kernel paths (native.ISAS)")
    parser.add_argument("--contexts", default="512,2048,4000")
    parser.add_argument("--no-prefill", action="store_true")
    args = parser.parse_args()
    loaded = load_model("target", quantization="gguf", progress=False)
    model, tokenizer = loaded.model, loaded.tokenizer
    sources = sorted(pathlib.Path(statistics.__file__).parent.glob("*.py"))[:60]
    ids = tokenizer.encode("".join(path.read_text() for path in sources))
    isas = args.isas.split(",")
    try:
        for length in (int(n) for n in args.contexts.split(",")):
            steps(model, ids[:length], isas, args.repeats)
            if not args.no_prefill:
                prefill(model, ids[:length], isas)
    finally:
        native.set_isa(native.best_isa())


def steps(model, context: list[int], isas: list[str], repeats: int) -> None:
    cache = model.new_cache(num_slots=1, max_len=len(context) + 8)
    model(torch.tensor([context]), cache, [0], num_logits=1)
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {(isa, n): [] for isa in isas for n in (1, 4)}
    for _ in range(repeats):
        for isa in isas:
            native.set_isa(isa)
            for n in (1, 4):
                cache.set_length(0, len(context))
                NativeStack.timing()
                begin = time.perf_counter()
                model(torch.tensor([context[:n]]), cache, [0], num_logits=n)
                samples[isa, n].append((time.perf_counter() - begin, NativeStack.timing()[3]))
    for isa in isas:
        line = f"context {len(context):5} {isa:6}:"
        for n in (1, 4):
            step = statistics.median(s for s, _ in samples[isa, n])
            attention = statistics.median(a for _, a in samples[isa, n])
            line += f"  T({n}) {step * 1e3:5.1f} ms, attention {attention * 1e3:5.2f} ms = {attention / step:5.1%};"
        print(line, flush=True)


def prefill(model, context: list[int], isas: list[str]) -> None:
    for isa in isas:
        native.set_isa(isa)
        cache = model.new_cache(num_slots=1, max_len=len(context))
        NativeStack.timing()
        begin = time.perf_counter()
        model(torch.tensor([context]), cache, [0], num_logits=1, invariant=False)
        seconds = time.perf_counter() - begin
        _, products, _, attention = NativeStack.timing()
        print(f"context {len(context):5} {isa:6}:  prefill {seconds:5.2f} s = {len(context) / seconds:4.0f} tokens/s"
              f" (products {products:5.2f} s, attention {attention:5.2f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
